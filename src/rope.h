// Rotary position embedding (RoPE) as inference engines apply it to K: the
// inverse frequencies of a RopeConfig (tierkv/rope_config.h: the variants,
// NeoX rotate-half, GPT-J interleaved, partial rotary dims, and the frequency
// scalings, linear, NTK, llama3) and the rotation of one head. Pure
// functions; safe to use from any thread.
#ifndef TIERKV_SRC_ROPE_H_
#define TIERKV_SRC_ROPE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/rope_config.h"
#include "tierkv/status.h"

namespace tierkv {

// The rotary_dim / 2 inverse frequencies w_i, computed in double, scaling
// applied; pair i at position p turns by p * w_i.
// REQUIRES: config.Validate().ok().
std::vector<double> InverseFrequencies(const RopeConfig& config);

// Rotates one head vector `head` (head_dim elements) to absolute `position`,
// in double, rounding each element to float once. `inv_freq` is
// InverseFrequencies(config). A reference implementation for tests and
// reference models, not a fast path.
Status ApplyRope(const RopeConfig& config, std::span<const double> inv_freq,
                 int64_t position, std::span<float> head);

}  // namespace tierkv

#endif  // TIERKV_SRC_ROPE_H_
