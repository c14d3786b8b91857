// ChunkSource: the tiers under a worker's device chunk pool (its pool of
// position-independent chunks, separate from the engine's main pool).
// tierkvd's host DRAM and disk tier index chunk blocks by their chunk keys,
// so a chunk one worker computed is fetched by every other worker instead
// of being computed again. ClientChunkSource (tierkv/client_chunk_source.h)
// reaches them through a worker client; ChunkKvStore
// (tierkv/chunk_kv_store.h) fetches from its tier on a pool miss and
// publishes each chunk it computes at once, as tierkv stores prefix blocks
// eagerly (vLLM's SimpleCPUOffloadConnector), so that evicting a chunk from the
// pool loses nothing the tiers below can still hold. Implementations need not
// be thread-safe: the pool's owner drives them.
#ifndef TIERKV_INCLUDE_TIERKV_CHUNK_SOURCE_H_
#define TIERKV_INCLUDE_TIERKV_CHUNK_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/kv_layout.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

class ChunkSource {
 public:
  // Gives `n` pool blocks to copy a fetched chunk into; the caller of Fetch
  // owns them whatever Fetch returns.
  using AllocateBlocks =
      std::function<StatusOr<std::vector<BlockId>>(int32_t n)>;

  virtual ~ChunkSource() = default;

  // The layout of the blocks the tiers hold: a pool of another layout
  // (ChunkKvStore::SetTier) is refused, as its bytes would be read as this
  // one's.
  virtual const KvLayout& layout() const = 0;
  // `virtual_start` is the RoPE position the chunk's KV is computed at
  // (ChunkKvStoreOptions::virtual_start), and `variant` a fingerprint of
  // what else the KV depends on (ChunkVariant: the RoPE config, the
  // engine's variant): part of what the tiers key it by, so a chunk
  // computed at another position or otherwise is a miss.
  //
  // When the tiers hold every block of `chunk`: calls `allocate` once, for
  // one pool block per chunk block, and copies the chunk into them; true
  // once the copy is done. False on a miss (`allocate` not called) or when
  // a block could not be read (e.g. it was corrupt on disk): the blocks'
  // contents are then undefined. An error when the tiers cannot be reached
  // or `allocate` fails. DeadlineExceeded when a copy into the blocks may
  // still be running (a wedged device tier): the caller must never reuse
  // them.
  virtual StatusOr<bool> Fetch(std::span<const TokenId> chunk,
                               int64_t virtual_start, const BlockKey& variant,
                               const AllocateBlocks& allocate) = 0;

  // Copies the chunk's blocks (one per chunk block, in order) down and
  // returns when the copy is done, so the blocks may be reused at once.
  // Blocks the tiers hold already are not copied again. DeadlineExceeded
  // when a copy out of the blocks may still be running: the caller must
  // never write them again.
  virtual Status Publish(std::span<const TokenId> chunk, int64_t virtual_start,
                         const BlockKey& variant,
                         std::span<const BlockId> blocks) = 0;

  // The caller will not publish `chunk`, which it fetched and missed (its
  // compute failed or found no room, or the engine gave the miss up,
  // ChunkKvStore::Abandon): when that miss made this worker the
  // one to compute it (single flight), that role ends now, so that other
  // workers waiting for its publish stop waiting and compute it
  // themselves. An error when the tiers cannot be reached. Default: OK,
  // nothing to end.
  virtual Status Abandon(std::span<const TokenId> chunk, int64_t virtual_start,
                         const BlockKey& variant) {
    (void)chunk;
    (void)virtual_start;
    (void)variant;
    return Status::Ok();
  }

  // Whether the tier copies into and out of `memory`, the pool's KV memory
  // of `num_blocks` blocks (ChunkKvStore::memory()): FailedPrecondition,
  // naming what differs, when it would copy elsewhere. Fetches would then
  // key blocks nothing was copied into, and publishes would give every
  // worker those blocks' bytes under the chunk's keys. Default: OK.
  virtual Status CheckPool(std::span<const std::byte> memory,
                           int32_t num_blocks) const {
    (void)memory;
    (void)num_blocks;
    return Status::Ok();
  }
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_CHUNK_SOURCE_H_
