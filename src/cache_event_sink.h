// CacheEventSink: what a tier tells an observer about the blocks it holds,
// in the terms of vLLM's KV cache events (BlockStored, BlockRemoved,
// AllBlocksCleared), so that a cache-aware router can follow tierkv. The
// coordinator reports its host tier (CacheMedium::kCpu); the disk tier
// reports itself (kStorage), and so does the remote tier (kRemote: the
// blocks this tierkvd wrote to the shared Redis Cluster). Per medium the
// calls come in the order the tier's index changed, so replaying them
// rebuilds the index exactly.
// Thread-safety: implementations must be thread-safe. Calls come from the
// coordinator's owner thread, the disk tier's I/O threads, and the remote
// tier's I/O and scan threads and its Remove / RemoveAll callers, with
// those components' locks held: an implementation must never block (queue
// and return) and never call back into a tier.
#ifndef TIERKV_SRC_CACHE_EVENT_SINK_H_
#define TIERKV_SRC_CACHE_EVENT_SINK_H_

#include <cstdint>
#include <optional>
#include <span>

#include "tierkv/block_key.h"
#include "tierkv/types.h"

namespace tierkv {

// Where a block is held, named as vLLM names a medium.
enum class CacheMedium : uint8_t {
  kCpu = 1,      // The host tier's shared-memory slots.
  kStorage = 2,  // The disk tier.
  // The remote tier on a Redis Cluster that several tierkvds share: a
  // block one of them reports there can be loaded through any of them (of
  // the same model, layout and remote tenant).
  kRemote = 3,
};
// "CPU", "DISK", "REMOTE": names routers know (Dynamo's KV router takes
// any other medium for device memory).
const char* CacheMediumName(CacheMedium medium);

// One block a tier now serves.
struct StoredBlockEvent {
  CacheMedium medium = CacheMedium::kCpu;
  BlockKey key;
  // The previous block's key in the request that stored it; none for a
  // request's first block, or where the tier does not know it (the disk
  // and remote tiers keep no parents).
  std::optional<BlockKey> parent;
  std::span<const TokenId> tokens;  // Valid during the call only.
  int32_t block_size = 0;           // Tokens per full block of the layout.
  std::optional<uint64_t> lora_id;  // The request's LoRA, if any.
};

class CacheEventSink {
 public:
  virtual ~CacheEventSink() = default;
  // `block.key` became servable from `block.medium`.
  virtual void BlockStored(const StoredBlockEvent& block) = 0;
  // `key` is no longer held by `medium` (evicted, dropped, cleared, failed
  // verification).
  virtual void BlockRemoved(CacheMedium medium, const BlockKey& key) = 0;
  // Every tier is empty: what came before no longer holds.
  virtual void AllBlocksCleared() = 0;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_CACHE_EVENT_SINK_H_
