// CacheBlend selection (seed 001, LMCache's LMCBlender.process_qkv): which
// reused tokens to recompute. At the check layer, the freshly computed K of
// each reused token is compared with its cached (remapped) K; the tokens whose
// K deviates most are recomputed in the later layers, the rest keep their
// cached KV. Pure functions over caller-owned values; thread-safe.
//
// Differences from LMCache, on purpose:
//  - the ratio is a share of the reused tokens, not of the whole prompt:
//    tokens that were never cached (the question) are always computed, as in
//    the CacheBlend paper, so they are not candidates;
//  - ties in deviation go to the lower token index (torch.topk leaves them
//    unspecified), so a selection is reproducible;
//  - one check layer (LMCache reads only recomp_ratios[0] and, in its
//    examples, LMCACHE_BLEND_CHECK_LAYERS=1).
#ifndef TIERKV_SRC_CACHE_BLEND_H_
#define TIERKV_SRC_CACHE_BLEND_H_

#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/status.h"

namespace tierkv {

struct BlendOptions {
  // Share of the reused tokens recomputed after the check layer, in [0, 1].
  // Default: 0.15 (LMCACHE_BLEND_RECOMPUTE_RATIOS in seed 001's example).
  double recompute_ratio = 0.15;
  // The layer whose fresh K is compared with the cached K. Every layer
  // before it is recomputed for every token (it produces the check layer's
  // input). Default: 1 (LMCACHE_BLEND_CHECK_LAYERS=1).
  int32_t check_layer = 1;

  // OK, or InvalidArgument naming the bad field, for a model with
  // `num_layers` layers.
  Status Validate(int32_t num_layers) const;
};

// How many of `num_tokens` reused tokens a ratio recomputes:
// floor(ratio * num_tokens), with a 1e-6 token slack so that a decimal ratio
// such as 0.29 of 100 gives 29 and not 28 (0.29 * 100 is 28.999... in
// double). InvalidArgument for a ratio outside [0, 1] (or NaN) or a negative
// count.
StatusOr<int64_t> RecomputeCount(double ratio, int64_t num_tokens);

// Per token, the squared L2 distance between fresh and cached K over all of
// the token's elements (every KV head), summed in double in element order.
// Both spans hold tokens x token_width values. InvalidArgument when the sizes
// disagree or are not a multiple of token_width >= 1.
StatusOr<std::vector<double>> KeyDeviations(std::span<const float> fresh,
                                            std::span<const float> cached,
                                            int64_t token_width);

// Indices, ascending, of the RecomputeCount(ratio, deviations.size()) tokens
// with the largest deviation; equal deviations go to the lower index.
// InvalidArgument for a bad ratio or a NaN deviation (a NaN K is a bug
// upstream, not a token to rank).
StatusOr<std::vector<int64_t>> SelectRecomputeTokens(
    std::span<const double> deviations, double ratio);

}  // namespace tierkv

#endif  // TIERKV_SRC_CACHE_BLEND_H_
