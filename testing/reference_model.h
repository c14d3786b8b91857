// A small Llama-style decoder in fp32, for tests, benchmarks and the demo
// only (tierkv_reference, never installed): it produces real KV and proves
// that reused KV gives the logits it should (prefix hits, remapped chunks,
// CacheBlend; testing/cached_prefill.h runs it through tierkv's caches). Not
// a fast path. ReferenceModel is immutable after Create and Prefill is
// const, but a Prefill writes into the caller's PagedKvCache, so concurrent
// calls need distinct caches.
//
// Weights: seeded random ones (Create), or a trained llama2.c checkpoint
// (LoadLlama2c; testing/real_model.h finds TinyStories' stories15M).
//
// Model: token embedding; per layer RMSNorm -> grouped-query attention with
// RoPE (src/rope.h ApplyRope, NeoX by default) -> residual, RMSNorm -> SwiGLU
// MLP -> residual; final RMSNorm and LM head. Weights come from a seeded
// std::mt19937_64 through a hand-written uniform distribution, so they are
// the same with any standard library.
//
// Determinism: every value is computed one token at a time with fixed loop
// orders (each sum runs in one fixed order, vectorised only across
// independent outputs), no threads. So the same inputs give bit-identical
// outputs, and a token's K, V and logits do not depend on which other tokens
// are computed in the same call: a prefix hit reproduces a full prefill bit
// for bit. (Bit-identity is within one build on one machine: other compiler
// flags, e.g. FMA contraction, or another libm may move the last bits.)
// Attention always reads K and V back from the cache, in its storage dtype,
// exactly as an engine does; for bf16/fp16 storage the K and V a query sees are
// the rounded ones in every mode.
#ifndef TIERKV_TESTING_REFERENCE_MODEL_H_
#define TIERKV_TESTING_REFERENCE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/attention_spans.h"
#include "src/cache_blend.h"
#include "src/rope.h"
#include "testing/paged_kv_cache.h"
#include "tierkv/kv_layout.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

struct ReferenceModelConfig {
  int32_t vocab_size = 256;                 // Default: 256.
  int32_t hidden_size = 64;                 // Default: 64.
  int32_t num_layers = 2;                   // Default: 2.
  int32_t num_heads = 4;                    // Query heads. Default: 4.
  int32_t num_kv_heads = 2;                 // Divides num_heads. Default: 2.
  int32_t head_dim = 16;                    // Even. Default: 16.
  int32_t ffn_size = 128;                   // SwiGLU inner size. Default: 128.
  double rope_theta = 10000;                // Default: 10000.
  RopeStyle rope_style = RopeStyle::kNeoX;  // Default: NeoX rotate-half.
  uint64_t seed = 1;                        // Weights. Default: 1.
  // Positions the model was trained for; a prefill at a position past it is
  // InvalidArgument. Default: 0, no limit.
  int32_t context_length = 0;

  // OK, or InvalidArgument naming the bad field.
  Status Validate() const;
  // Full rotary dims, rope_theta, rope_style, no scaling.
  RopeConfig Rope() const;
  // The model's KV cache as a store serves it.
  KvLayout CacheLayout(int32_t block_size, DType dtype) const;
};

// One prefill of one sequence. Token i sits at cache slot slots[i] and RoPE
// position positions[i] (or start_position + i).
struct PrefillInput {
  std::span<const TokenId> tokens = {};  // Required: the whole sequence.
  std::span<const int64_t> slots =
      {};                      // Required: one distinct slot per token.
  int64_t start_position = 0;  // When `positions` is empty. Default: 0.
  std::span<const int64_t> positions = {};  // Per token. Default: none.
  // Who attends to whom (BuildAttentionSpans: exactly one span per query).
  // Default: empty, full causal attention.
  std::span<const AttentionSpan> spans = {};
  // Tokens whose KV is already in their slots (a prefix hit, remapped
  // chunks): sorted, disjoint, non-empty ranges. They are not computed
  // (except as CacheBlend decides). Default: none.
  std::span<const TokenRange> cached = {};
  // CacheBlend over the cached tokens (seed 001). Default: off.
  std::optional<BlendOptions> blend = std::nullopt;
  // Logits of the last num_logits tokens, which must not be cached.
  // Default: 1 (what an engine samples from).
  int32_t num_logits = 1;
  bool return_kv = false;  // Fill PrefillOutput::layers. Default: false.
};

// K and V that one layer computed, in fp32 before storage rounding.
struct LayerKv {
  std::vector<int64_t> tokens;     // Sequence indices, ascending.
  std::vector<float> k;            // tokens x kv width, after RoPE.
  std::vector<float> k_unrotated;  // tokens x kv width, before RoPE.
  std::vector<float> v;            // tokens x kv width.
};

struct PrefillOutput {
  std::vector<float> logits;        // num_logits x vocab, in token order.
  int64_t computed_tokens = 0;      // Tokens through the last layer.
  std::vector<int64_t> recomputed;  // CacheBlend: cached tokens picked.
  std::vector<LayerKv> layers;      // Per layer, when return_kv.
};

class ReferenceModel {
 public:
  // A model with seeded random weights.
  static StatusOr<ReferenceModel> Create(const ReferenceModelConfig& config);

  // A model with the trained weights of a llama2.c checkpoint
  // (github.com/karpathy/llama2.c, the legacy `model.bin` export): seven
  // int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
  // seq_len; a negative vocab_size means an LM head of its own), then fp32
  // tensors, each [out][in] and all layers of one kind together: token
  // embedding, attention RMSNorm, wq, wk, wv, wo, FFN RMSNorm, w1 (gate),
  // w2 (down), w3 (up), final RMSNorm, two RoPE tables (skipped), and the
  // LM head when it is not the embedding. The format has no magic number, so
  // the file must be exactly the size its header implies. RoPE GPT-J style
  // (adjacent pairs), theta 10000, context seq_len. NotFound if the file
  // cannot be opened; InvalidArgument naming what is wrong otherwise.
  static StatusOr<ReferenceModel> LoadLlama2c(const std::string& path);

  const ReferenceModelConfig& config() const { return config_; }
  const std::vector<double>& inverse_frequencies() const { return inv_freq_; }

  // Runs the tokens that are not cached through every layer and writes
  // their K/V (storage dtype) into `cache`; cached tokens are read from it.
  // With `blend`, every token is computed in the layers before the check
  // layer; at the check layer the cached tokens whose fresh K deviates most
  // from the cached K (SelectRecomputeTokens) join the uncached ones, and
  // only those go on. InvalidArgument for a malformed input (sizes, token
  // ids, slots, positions, spans, ranges, a cache of another shape).
  StatusOr<PrefillOutput> Prefill(const PrefillInput& input,
                                  PagedKvCache* cache) const;

 private:
  struct LayerWeights {
    std::vector<float> attn_norm, wq, wk, wv, wo;  // w*: [in][out].
    std::vector<float> mlp_norm, w_gate, w_up, w_down;
  };
  struct Weights {
    std::vector<float> embedding;  // [vocab][hidden].
    std::vector<LayerWeights> layers;
    std::vector<float> final_norm;
    std::vector<float> lm_head;  // [hidden][vocab].
  };
  class Forward;  // One Prefill call; reference_forward.cc.

  ReferenceModel(const ReferenceModelConfig& config, Weights weights);
  static Weights RandomWeights(const ReferenceModelConfig& config);

  ReferenceModelConfig config_;
  RopeConfig rope_;
  std::vector<double> inv_freq_;
  Weights weights_;
};

}  // namespace tierkv

#endif  // TIERKV_TESTING_REFERENCE_MODEL_H_
