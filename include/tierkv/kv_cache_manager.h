// KVCacheManager: automatic prefix caching over an engine's main KV pool
// (vLLM v1's KVCacheManager, vllm/v1/core/kv_cache_manager.py; on decode,
// nano-vllm's BlockManager.can_append / may_append; README.md lists the
// documents tierkv follows).
// Maps requests to the blocks they hold, finds the longest cached prefix of
// a new request, allocates and keys blocks, and frees a request's blocks in
// reverse so its most specific (tail) blocks are evicted first.
// Not thread-safe; owned by the engine's scheduler thread.
//
// A request's life: GetComputedBlocks -> AllocateSlots (prefill, possibly in
// several calls) -> [AppendToken on the Request, then CanAppend/MayAppend per
// decode step]* -> Free.
//
// Blocks an external load fills (a tierkv load event, from host or disk) are
// not prefix hits before their bytes exist: AllocateSlots with
// num_external_tokens > 0 keys none of the request's blocks until
// CompleteExternalLoad says how much of the load landed (vLLM's
// delay_cache_blocks). Blocks of a failed or cut load are never keyed; they
// are reported for the engine to recompute (vLLM's
// get_block_ids_with_load_errors).
//
// As in nano-vllm, MayAppend runs before the step that computes the appended
// token's KV, and keys a block the moment that token fills it. A token that
// ends the request (sampled, never computed) must not be passed to
// MayAppend, or its block would be keyed without its KV.
#ifndef TIERKV_INCLUDE_TIERKV_KV_CACHE_MANAGER_H_
#define TIERKV_INCLUDE_TIERKV_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/request.h"
#include "tierkv/status.h"

namespace tierkv {

struct KVCacheManagerOptions {
  BlockPoolOptions pool;
  bool enable_caching = true;  // Default: true.
};

struct PrefixCacheStats {
  // Every GetComputedBlocks call counts, as in vLLM, including a lookup
  // repeated after a refused allocation.
  uint64_t queries = 0;       // GetComputedBlocks calls.
  uint64_t query_tokens = 0;  // Prompt tokens looked up.
  uint64_t hits = 0;          // Lookups that hit at least one block.
  uint64_t hit_tokens = 0;    // Tokens served from the cache.
  uint64_t evictions = 0;     // Cached blocks dropped for reuse.
};

// What CompleteExternalLoad found.
struct ExternalLoadResult {
  // Tokens of the request whose KV now exists: the engine computes from
  // here. Less than the load's end when the load failed or was cut.
  int32_t num_computed_tokens = 0;
  // Blocks the load should have filled and did not, in order; they hold no
  // valid KV and no key until the engine recomputes them.
  std::vector<BlockId> failed_blocks;
};

// The cached prefix of a request: blocks in order and the tokens they cover.
struct ComputedBlocks {
  std::vector<BlockId> blocks;
  int32_t num_tokens = 0;
};

class BlockPool;

class KVCacheManager {
 public:
  static StatusOr<KVCacheManager> Create(const KVCacheManagerOptions& options);
  KVCacheManager(KVCacheManager&&) noexcept;
  KVCacheManager& operator=(KVCacheManager&&) noexcept;
  ~KVCacheManager();

  // Longest run of leading full blocks that are cached, stopping at the first
  // miss and covering at most num_tokens - 1 tokens (the last token is always
  // computed, so the engine has logits to sample from). Changes nothing but
  // the stats; the blocks are taken by AllocateSlots. A request keyed for
  // another block size never hits.
  ComputedBlocks GetComputedBlocks(const Request& request);

  // Gives the request slots for `num_new_tokens` more tokens. As in vLLM,
  // blocks are keyed here, before their KV exists: the engine must fill
  // every block this keys (the forward pass of the same step) before it
  // looks anything up again, even when it aborts the request meanwhile. On
  // the first
  // call for a request, `computed` (from GetComputedBlocks, with no pool
  // change in between) is touched and becomes the request's first blocks.
  // New blocks come from the head of the free queue; every block that is
  // full of known tokens gets its key. Returns the new block ids;
  // ResourceExhausted, with nothing changed, when too few blocks are free;
  // InvalidArgument for a request that could never fit the pool or was keyed
  // for another block size.
  //
  // num_external_tokens: the first of the new tokens whose KV an external
  // load brings (tierkv's AllocateResult::load) instead of the engine's
  // forward pass. The load must start at a block boundary. Until
  // CompleteExternalLoad, no block of the request is keyed, so no other
  // request hits a block whose bytes are still on their way. Default: 0.
  StatusOr<std::vector<BlockId>> AllocateSlots(
      const Request& request, int32_t num_new_tokens,
      const ComputedBlocks& computed = {}, int32_t num_external_tokens = 0);

  // The external load of AllocateSlots finished: its first
  // `num_loaded_tokens` tokens got their KV (0 when the copy failed or the
  // load was lost with tierkvd; a whole-block count for a load whose last
  // block is partial counts as all of it). Keys the request's blocks up to
  // the first block that did not load. The request's tokens with slots
  // become num_computed_tokens (its blocks stay held): the engine schedules
  // the rest, the failed blocks' tokens included, with AllocateSlots, which
  // needs no new block for them and keys them as it keys any computed
  // block. NotFound for an unknown request, FailedPrecondition when it has
  // no load outstanding, InvalidArgument for more tokens than the load had.
  StatusOr<ExternalLoadResult> CompleteExternalLoad(const Request& request,
                                                    int32_t num_loaded_tokens);
  // Whether the request waits for an external load.
  bool IsLoading(RequestId id) const;

  // nano-vllm's decode path, called after each Request::AppendToken.
  // CanAppend: enough blocks are free for the tokens the request's blocks do
  // not cover yet (nano-vllm's len % block_size == 1 case, made exact for
  // requests that were given slots ahead).
  // MayAppend: allocates that block, or keys the last block when the new
  // token filled it. FailedPrecondition while an external load is
  // outstanding, or while tokens before the new one have no slots (after
  // a load that fell short: AllocateSlots them first).
  bool CanAppend(const Request& request) const;
  Status MayAppend(const Request& request);

  // Drops the key of a free cached block (an operator's evict); false when
  // the block is in use or holds no key.
  bool EvictCachedBlock(BlockId id);

  // Transfer pins (the touch of vLLM's SimpleCPUOffloadConnector that
  // protects a block in transfer): a block being
  // copied to or from another tier holds one more reference, so it is
  // neither evicted nor reused until UnpinBlocks, whatever the request does.
  // REQUIRES: valid, non-null block ids; each UnpinBlocks matches a pin.
  void PinBlocks(std::span<const BlockId> ids);
  void UnpinBlocks(std::span<const BlockId> ids);

  // Releases the request's blocks in reverse order. NotFound if unknown.
  Status Free(RequestId id);
  // Remap targets for position-independent chunks (ChunkKvStore): `n` blocks
  // from the head of the free queue, held by no request and never keyed, so
  // what a remap writes into them (chunk KV computed under chunk-isolated
  // attention, not a causal prefix) is never served as a prefix hit.
  // ResourceExhausted, with nothing changed, when fewer than n are free.
  StatusOr<std::vector<BlockId>> AllocateRemapBlocks(int32_t n);
  // cleanup_remapped_blocks of position-independent caching, when the request
  // finishes: the blocks go back to the free queue, last first, still unkeyed.
  // REQUIRES: blocks from AllocateRemapBlocks, each released once.
  void ReleaseRemappedBlocks(std::span<const BlockId> blocks);

  // The request's blocks in order; empty if the request is unknown.
  std::span<const BlockId> blocks(RequestId id) const;
  size_t num_requests() const;
  int32_t num_blocks() const;       // The null block included.
  int32_t num_free_blocks() const;  // In the free queue, cached or not.
  PrefixCacheStats stats() const;

 private:
  struct RequestState;
  struct State;
  // The pool itself, for tierkv's own checks (src/kv_cache_manager_internal.h).
  friend const BlockPool& PoolOf(const KVCacheManager& manager);

  explicit KVCacheManager(std::unique_ptr<State> state);

  // Blocks still missing so that `held` blocks cover `num_tokens` tokens.
  int64_t BlocksShort(int64_t num_tokens, size_t held) const;
  Status CheckBlockSize(const Request& request) const;
  Status CheckComputedStillCached(const Request& request,
                                  const ComputedBlocks& computed) const;
  // Keys the request's blocks that are full of known tokens.
  Status CacheFullBlocks(const Request& request, RequestState* state);

  std::unique_ptr<State> s_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_KV_CACHE_MANAGER_H_
