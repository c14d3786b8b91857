// A small Llama-style decoder in fp32 and the chunk cache around it, for
// tests, benchmarks and the demo only: it proves that reused KV gives the
// logits it should (prefix hits, remapped chunks, CacheBlend). Not a fast
// path. ReferenceModel is immutable after Create and Prefill is const, but a
// Prefill writes into the caller's PagedKvCache, so concurrent calls need
// distinct caches. PagedKvCache and ChunkKvStore are not thread-safe.
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
#ifndef TIERKV_SRC_REFERENCE_MODEL_H_
#define TIERKV_SRC_REFERENCE_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "src/attention_spans.h"
#include "src/block_pool.h"
#include "src/cache_blend.h"
#include "src/rope.h"
#include "src/rope_remap.h"
#include "tierkv/block_key.h"
#include "tierkv/chunk_source.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/kv_layout.h"
#include "tierkv/request.h"
#include "tierkv/status.h"

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

  // OK, or InvalidArgument naming the bad field.
  Status Validate() const;
  // Full rotary dims, rope_theta, rope_style, no scaling.
  RopeConfig Rope() const;
  // The model's KV cache as a store serves it.
  KvLayout CacheLayout(int32_t block_size, DType dtype) const;
};

// KV memory for the reference model: num_blocks blocks laid out per KvLayout,
// the same bytes a tier stores and RopeRemap reads and writes. A slot is
// block * block_size + offset. Not thread-safe.
class PagedKvCache {
 public:
  // Zero-filled. InvalidArgument for an invalid layout or num_blocks < 1.
  static StatusOr<PagedKvCache> Create(const KvLayout& layout,
                                       int64_t num_blocks);

  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return num_blocks_ * layout_.block_size; }
  std::byte* base() { return bytes_.data(); }
  const std::byte* base() const { return bytes_.data(); }
  const std::byte* block(int64_t id) const {
    return bytes_.data() + static_cast<size_t>(id) * layout_.BlockBytes();
  }
  // One token's K or V of one layer (num_kv_heads * head_dim elements).
  // REQUIRES: slot, layer in range.
  const std::byte* token(int64_t slot, int32_t layer, KvPlane plane) const;

  // Stores `values` rounded to the storage dtype (to nearest even), or loads
  // them widened to fp32. REQUIRES: indices in range, a full token's values.
  void Write(int64_t slot, int32_t layer, KvPlane plane,
             std::span<const float> values);
  void Read(int64_t slot, int32_t layer, KvPlane plane,
            std::span<float> out) const;

 private:
  PagedKvCache(const KvLayout& layout, int64_t num_blocks);
  std::byte* mutable_token(int64_t slot, int32_t layer, KvPlane plane);

  KvLayout layout_;
  int64_t num_blocks_;
  std::vector<std::byte> bytes_;
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
  static StatusOr<ReferenceModel> Create(const ReferenceModelConfig& config);

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
  class Forward;  // One Prefill call; reference_model.cc.

  ReferenceModel(const ReferenceModelConfig& config, Weights weights);
  static Weights RandomWeights(const ReferenceModelConfig& config);

  ReferenceModelConfig config_;
  RopeConfig rope_;
  std::vector<double> inv_freq_;
  Weights weights_;
};

// ---------------------------------------------------------------------------
// Prefix caching (seed 002) with the reference model.

// Looks up `request`'s cached prefix in `manager` (full blocks, never the
// last token), takes its blocks and new ones, and computes the rest with
// full causal attention; `pool_cache` is the memory of the manager's pool
// (one block per pool block). The request keeps its blocks; the caller
// frees it. *hit_tokens (if not null) gets the tokens served from cache.
StatusOr<PrefillOutput> PrefixCachedPrefill(const ReferenceModel& model,
                                            KVCacheManager* manager,
                                            const Request& request,
                                            PagedKvCache* pool_cache,
                                            int32_t num_logits,
                                            int32_t* hit_tokens = nullptr);

// ---------------------------------------------------------------------------
// Position-independent chunks (seed 000) with the reference model.

// A chunked prompt with its separators dropped (seed 000 §2.4), in
// assembled-sequence coordinates.
struct AssembledPrompt {
  std::vector<TokenId> tokens;
  std::vector<LayoutSegment> layout;
  std::vector<AttentionSpan> spans;  // Chunk-isolated attention.
  std::vector<TokenRange> chunks;    // System prompt, then documents.
  TokenRange question;
};

// SplitPrompt + AssembledLayout + BuildAttentionSpans, with their errors.
StatusOr<AssembledPrompt> AssemblePrompt(std::span<const TokenId> prompt,
                                         std::span<const TokenId> separator);

struct ChunkKvStoreOptions {
  int32_t num_blocks = 0;     // Chunk pool size, null block included.
  int32_t block_size = 16;    // Default: 16.
  DType dtype = DType::kF32;  // Storage. Default: fp32.
  int64_t virtual_start = 0;  // Where every chunk is computed. Default: 0.
  KeyNamespace key_namespace = {};  // Default: model "", tenant "".
};

// What a ChunkKvStore served, and how.
struct ChunkStoreStats {
  uint64_t pool_hits = 0;    // Chunks found in the pool.
  uint64_t tier_hits = 0;    // Chunks fetched from the tier below.
  uint64_t computed = 0;     // Chunks computed (ComputeAndInsert).
  uint64_t published = 0;    // Computed chunks copied to the tier below.
  uint64_t tier_errors = 0;  // Fetches or publishes that failed.
  // Chunks the tier below held but that were not fetched: every pool block
  // was pinned. Not a tier error; the caller computes nothing into a full
  // pool either (ComputeAndInsert is ResourceExhausted).
  uint64_t pool_full = 0;
  uint64_t evictions = 0;  // Cached pool blocks dropped for reuse.
};

// A chunk pool: chunks keyed by content (KeyHasher::ChunkKeys), their KV
// computed in isolation at virtual positions [virtual_start, +n), in blocks
// managed by a BlockPool (LRU eviction, token check on every hit). With a
// ChunkSource below (SetTier), a pool miss is fetched from the tier before it
// is computed, and every computed chunk is published to it. A tier that
// fails is counted (stats().tier_errors, last_tier_error()) and worked
// around: the chunk is computed, never served half-copied. The model must
// outlive the store. Not thread-safe.
class ChunkKvStore {
 public:
  static StatusOr<ChunkKvStore> Create(const ReferenceModel& model,
                                       const ChunkKvStoreOptions& options);

  // The tier below the pool, or null for none (the default). Not owned; it
  // copies into and out of memory().
  void SetTier(ChunkSource* tier) { tier_ = tier; }
  // The pool's KV memory: num_blocks blocks of layout().BlockBytes(), at a
  // fixed address for the store's life (a device tier is built over it).
  std::byte* memory() { return cache_.base(); }

  // The chunk's blocks, pinned, when every one of them is in the pool or
  // the tier below; empty on a miss.
  std::vector<BlockId> Acquire(std::span<const TokenId> chunk);
  // Computes `chunk` in isolation at the virtual positions into new blocks,
  // keys them and publishes them to the tier; returns them pinned.
  // ResourceExhausted when the pool has too few free blocks.
  StatusOr<std::vector<BlockId>> ComputeAndInsert(
      std::span<const TokenId> chunk);
  // Unpins blocks from Acquire or ComputeAndInsert.
  void Release(std::span<const BlockId> blocks);
  // Whether every block of `chunk` is cached.
  bool Contains(std::span<const TokenId> chunk) const;
  // Copies a chunk's KV (num_tokens tokens in `blocks`) into `dst` at
  // `dst_slots`, K re-rotated from the virtual positions to real_start + i.
  Status Place(std::span<const BlockId> blocks, int32_t num_tokens,
               std::span<const int64_t> dst_slots, int64_t real_start,
               PagedKvCache* dst) const;

  int64_t virtual_start() const { return virtual_start_; }
  const KvLayout& layout() const { return cache_.layout(); }
  const BlockPool& pool() const { return pool_; }
  const PagedKvCache& cache() const { return cache_; }
  ChunkStoreStats stats() const;
  // Why the tier last failed; OK when it never did.
  const Status& last_tier_error() const { return last_tier_error_; }

 private:
  ChunkKvStore(const ReferenceModel& model, const ChunkKvStoreOptions& options,
               BlockPool pool, PagedKvCache cache, RopeRemap remap);

  std::vector<BlockId> FetchFromTier(std::span<const TokenId> chunk,
                                     std::span<const BlockKey> keys);
  void CountTierError(Status status);

  const ReferenceModel* model_;
  KeyHasher hasher_;
  int64_t virtual_start_;
  BlockPool pool_;
  PagedKvCache cache_;
  RopeRemap remap_;
  ChunkSource* tier_ = nullptr;
  ChunkStoreStats stats_;
  Status last_tier_error_;
};

struct ChunkedPrefillOptions {
  // Off: seed 000, chunk-isolated attention; only the question is computed.
  // On: seed 001, CacheBlend toward full causal attention.
  std::optional<BlendOptions> blend = std::nullopt;
  int32_t num_logits = 1;  // Of the question's last tokens. Default: 1.
  bool return_kv = false;  // Default: false.
};

struct ChunkedPrefillResult {
  PrefillOutput output;
  AssembledPrompt prompt;
  int32_t chunk_hits = 0;
  int32_t chunk_misses = 0;
  // Into a main pool: the blocks holding the assembled sequence, in order
  // (slot i of the sequence is main_blocks[i / block_size]). Release them
  // with KVCacheManager::ReleaseRemappedBlocks when the request finishes.
  std::vector<BlockId> main_blocks;
};

// One chunked request end to end (seed 000 §2.4): split the prompt, fetch
// every chunk from `store` or compute and store it, place the chunks at
// their real positions in `dst` (slots 0..n-1 of the assembled sequence;
// dst needs ceil(n / block_size) blocks), then prefill the question.
StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, PagedKvCache* dst);

// The engine's main KV pool: a KVCacheManager and the memory of its pool
// (one block of `memory` per pool block).
struct MainKvPool {
  KVCacheManager* manager = nullptr;
  PagedKvCache* memory = nullptr;
};

// As above, into blocks of the engine's main pool (seed 000's
// remap_and_copy): the assembled sequence gets AllocateRemapBlocks blocks,
// chunks are remapped into them and the question computed there. They are
// in result.main_blocks, unkeyed; the caller releases them when the request
// finishes (cleanup_remapped_blocks). On an error nothing stays allocated.
StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, MainKvPool main);

}  // namespace tierkv

#endif  // TIERKV_SRC_REFERENCE_MODEL_H_
