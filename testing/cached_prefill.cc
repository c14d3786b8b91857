#include "testing/cached_prefill.h"

#include <numeric>
#include <string>
#include <utility>

#include "src/chunk_parser.h"
#include "src/kv_cache_manager_internal.h"
#include "src/rope_remap.h"
#include "testing/reference_model_internal.h"

namespace tierkv {
namespace {

using reference_internal::Invalid;

}  // namespace

// ---------------------------------------------------------------------------
// Prefix caching.

StatusOr<PrefillOutput> PrefixCachedPrefill(const ReferenceModel& model,
                                            KVCacheManager* manager,
                                            const Request& request,
                                            PagedKvCache* pool_cache,
                                            int32_t num_logits,
                                            int32_t* hit_tokens) {
  const BlockPool& pool = PoolOf(*manager);
  if (pool_cache->num_blocks() < pool.num_blocks() ||
      pool_cache->layout().block_size != pool.block_size()) {
    return Invalid("the pool's KV cache must have one block per pool block");
  }
  const ComputedBlocks computed = manager->GetComputedBlocks(request);
  TIERKV_RETURN_IF_ERROR(
      manager
          ->AllocateSlots(request, request.num_tokens() - computed.num_tokens,
                          computed)
          .status());
  std::span<const BlockId> blocks = manager->blocks(request.id());
  TIERKV_ASSIGN_OR_RETURN(
      std::vector<int64_t> slots,
      SlotMappingForBlocks(blocks, pool.block_size(), 0, request.num_tokens()));
  std::vector<TokenRange> cached;
  if (computed.num_tokens > 0) cached.push_back({0, computed.num_tokens});
  if (hit_tokens != nullptr) *hit_tokens = computed.num_tokens;
  PrefillInput in{.tokens = request.tokens(),
                  .slots = slots,
                  .cached = cached,
                  .num_logits = num_logits};
  return model.Prefill(in, pool_cache);
}

// ---------------------------------------------------------------------------
// Chunks.

StatusOr<AssembledPrompt> AssemblePrompt(std::span<const TokenId> prompt,
                                         std::span<const TokenId> separator) {
  TIERKV_ASSIGN_OR_RETURN(PromptSplit split, SplitPrompt(prompt, separator));
  AssembledPrompt out;
  out.layout = AssembledLayout(split);
  TIERKV_ASSIGN_OR_RETURN(out.spans, BuildAttentionSpans(out.layout));
  for (const PromptSegment& segment : split.segments()) {
    const auto begin = static_cast<int64_t>(out.tokens.size());
    std::span<const TokenId> tokens = SegmentTokens(prompt, segment);
    out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
    const TokenRange range{begin, static_cast<int64_t>(out.tokens.size())};
    if (segment.kind == SegmentKind::kQuestion) {
      out.question = range;
    } else {
      out.chunks.push_back(range);
    }
  }
  return out;
}

ChunkComputeFn ReferenceChunkCompute(const ReferenceModel& model) {
  return [&model](const ChunkComputeArgs& args) -> Status {
    TIERKV_ASSIGN_OR_RETURN(PagedKvCache pool,
                            PagedKvCache::CreateOver(args.layout, args.memory));
    PrefillInput in{.tokens = args.chunk,
                    .slots = args.slots,
                    .start_position = args.virtual_start,
                    .num_logits = 0};
    return model.Prefill(in, &pool).status();
  };
}

StatusOr<ChunkKvStore> CreateChunkKvStore(
    const ReferenceModel& model, const ReferenceChunkStoreOptions& options) {
  return ChunkKvStore::Create(
      {.layout = model.config().CacheLayout(options.block_size, options.dtype),
       .rope = model.config().Rope(),
       .num_blocks = options.num_blocks,
       .virtual_start = options.virtual_start,
       .key_namespace = options.key_namespace,
       .variant = options.variant,
       .compute = ReferenceChunkCompute(model)});
}

StatusOr<PagedKvCache> ChunkPoolView(ChunkKvStore* store) {
  const KvLayout& layout = store->layout();
  return PagedKvCache::CreateOver(
      layout, {store->memory(),
               static_cast<size_t>(store->num_blocks()) * layout.BlockBytes()});
}

namespace {

// Copies a chunk's blocks into `dst`, re-rotated to real_start + i.
Status PlaceInto(const ChunkKvStore& store, std::span<const BlockId> blocks,
                 int32_t num_tokens, std::span<const int64_t> dst_slots,
                 int64_t real_start, PagedKvCache* dst) {
  if (dst->layout() != store.layout()) {
    return Status::InvalidArgument("chunk store: destination layout " +
                                   dst->layout().ToString() +
                                   " != " + store.layout().ToString());
  }
  return store.Place(blocks, num_tokens, dst_slots, real_start, dst->memory());
}

// Fetches or computes one chunk and places it at its range of `dst`.
Status PlaceChunk(ChunkKvStore* store, std::span<const TokenId> tokens,
                  const TokenRange& range, std::span<const int64_t> slots,
                  PagedKvCache* dst, ChunkedPrefillResult* result) {
  std::span<const TokenId> chunk = std::span(tokens).subspan(
      static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
  std::vector<BlockId> blocks = store->Acquire(chunk);
  if (blocks.empty()) {
    ++result->chunk_misses;
    TIERKV_ASSIGN_OR_RETURN(blocks, store->ComputeAndInsert(chunk));
  } else {
    ++result->chunk_hits;
  }
  Status status = PlaceInto(*store, blocks, static_cast<int32_t>(range.size()),
                            slots.subspan(static_cast<size_t>(range.begin),
                                          static_cast<size_t>(range.size())),
                            range.begin, dst);
  Status released = store->Release(blocks);
  return !status.ok() ? status : released;
}

// Places every chunk of result->prompt at `slots` of `dst`, then prefills
// the question there.
Status PrefillAssembled(const ReferenceModel& model, ChunkKvStore* store,
                        std::span<const int64_t> slots,
                        const ChunkedPrefillOptions& options, PagedKvCache* dst,
                        ChunkedPrefillResult* result) {
  const AssembledPrompt& p = result->prompt;
  for (const TokenRange& range : p.chunks) {
    TIERKV_RETURN_IF_ERROR(
        PlaceChunk(store, p.tokens, range, slots, dst, result));
  }
  const std::vector<TokenRange> cached = {{0, p.question.begin}};
  PrefillInput in{.tokens = p.tokens,
                  .slots = slots,
                  .cached = cached,
                  .blend = options.blend,
                  .num_logits = options.num_logits,
                  .return_kv = options.return_kv};
  // CacheBlend recomputes toward full causal attention; seed 000 keeps the
  // chunks isolated.
  if (!options.blend.has_value()) in.spans = p.spans;
  TIERKV_ASSIGN_OR_RETURN(result->output, model.Prefill(in, dst));
  return Status::Ok();
}

}  // namespace

StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, PagedKvCache* dst) {
  ChunkedPrefillResult result;
  TIERKV_ASSIGN_OR_RETURN(result.prompt, AssemblePrompt(prompt, separator));
  const auto n = static_cast<int64_t>(result.prompt.tokens.size());
  if (dst->num_slots() < n) {
    return Status::InvalidArgument("chunked prefill: " + std::to_string(n) +
                                   " tokens do not fit the destination");
  }
  std::vector<int64_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  TIERKV_RETURN_IF_ERROR(
      PrefillAssembled(model, store, slots, options, dst, &result));
  return result;
}

StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, MainKvPool main) {
  if (main.manager == nullptr || main.memory == nullptr ||
      main.memory->num_blocks() < PoolOf(*main.manager).num_blocks() ||
      main.memory->layout().block_size != PoolOf(*main.manager).block_size()) {
    return Status::InvalidArgument(
        "chunked prefill: the main pool's memory must hold one block of its "
        "block size per pool block");
  }
  ChunkedPrefillResult result;
  TIERKV_ASSIGN_OR_RETURN(result.prompt, AssemblePrompt(prompt, separator));
  const int32_t bs = main.memory->layout().block_size;
  const auto n = static_cast<int32_t>(result.prompt.tokens.size());
  TIERKV_ASSIGN_OR_RETURN(result.main_blocks,
                          main.manager->AllocateRemapBlocks((n + bs - 1) / bs));
  StatusOr<std::vector<int64_t>> slots =
      SlotMappingForBlocks(result.main_blocks, bs, 0, n);
  Status status = slots.status();
  if (status.ok()) {
    status =
        PrefillAssembled(model, store, *slots, options, main.memory, &result);
  }
  if (!status.ok()) {
    main.manager->ReleaseRemappedBlocks(result.main_blocks);
    return status;
  }
  return result;
}

}  // namespace tierkv
