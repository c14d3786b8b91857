// The reference model's prefills through tierkv's caches, for tests,
// benchmarks and the demo (tierkv_reference): prefix caching over a
// KVCacheManager (seed 002), and chunked prompts over a ChunkKvStore
// (seed 000, CacheBlend of seed 001), whose chunks the model computes
// through ReferenceChunkCompute. Free functions; the caches they are given
// are not thread-safe.
#ifndef TIERKV_TESTING_CACHED_PREFILL_H_
#define TIERKV_TESTING_CACHED_PREFILL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/attention_spans.h"
#include "src/cache_blend.h"
#include "testing/paged_kv_cache.h"
#include "testing/reference_model.h"
#include "tierkv/block_key.h"
#include "tierkv/chunk_kv_store.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/kv_layout.h"
#include "tierkv/request.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

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

// The chunk pool's compute function (ChunkKvStoreOptions::compute) for
// `model`: a prefill of the chunk alone (full causal attention within it,
// no logits) at the virtual positions, writing its K/V into the pool's
// blocks. The model must outlive the function.
ChunkComputeFn ReferenceChunkCompute(const ReferenceModel& model);

struct ReferenceChunkStoreOptions {
  int32_t num_blocks = 0;     // Chunk pool size, null block included.
  int32_t block_size = 16;    // Default: 16.
  DType dtype = DType::kF32;  // Storage. Default: fp32.
  int64_t virtual_start = 0;  // Where every chunk is computed. Default: 0.
  KeyNamespace key_namespace = {};  // Default: model "", tenant "".
  std::string variant = {};         // ChunkKvStoreOptions::variant.
};

// A chunk pool for `model`: its KV layout (model.config().CacheLayout) and
// RoPE, chunks computed by ReferenceChunkCompute(model). The model must
// outlive the store.
StatusOr<ChunkKvStore> CreateChunkKvStore(
    const ReferenceModel& model, const ReferenceChunkStoreOptions& options);

// The memory of `store`'s pool as a PagedKvCache, a view the store must
// outlive: what the pool's blocks hold, slot by slot.
StatusOr<PagedKvCache> ChunkPoolView(ChunkKvStore* store);

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

#endif  // TIERKV_TESTING_CACHED_PREFILL_H_
