// LowerTier: the tier below the host DRAM slots (the disk tier), as the
// coordinator drives it. The coordinator decides what moves and when; a
// LowerTier moves one block between a host slot and its own storage, off the
// caller's thread. tierkvd's implementation is SlotDisk (tiers/slot_disk.h)
// over DiskTier (tiers/disk_tier.h).
// Thread-safety: every method may be called from any thread; `done`
// callbacks run on the tier's own threads.
#ifndef TIERKV_SRC_LOWER_TIER_H_
#define TIERKV_SRC_LOWER_TIER_H_

#include <cstdint>
#include <functional>
#include <span>

#include "src/block_key.h"
#include "src/free_block_queue.h"
#include "src/status.h"

namespace tierkv {

struct DiskTierStats {
  uint64_t capacity_bytes = 0;  // The bound on `bytes`.
  uint64_t bytes = 0;           // Value bytes held (being written + stored).
  uint64_t keys = 0;            // Stored keys.
  uint64_t puts = 0;            // Values written.
  uint64_t put_failures = 0;    // Puts that failed (not superseded ones).
  uint64_t gets = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;     // Not stored, or stored for other tokens.
  uint64_t evictions = 0;  // Keys evicted for capacity.
  // Values that failed verification on Get; each was deleted.
  uint64_t checksum_failures = 0;
  // Gets whose token ids differ from the stored block's (a key collision,
  // accidental or crafted): a miss, the stored block is kept.
  uint64_t token_mismatches = 0;
  // Values the last open dropped: malformed, failed checksum, or written
  // for another layout or model (another StoreFingerprint).
  // layout_mismatches counts the last kind only.
  uint64_t dropped_on_open = 0;
  uint64_t layout_mismatches = 0;
  // Payload and stored bytes of the values written: their ratio is the
  // compression ratio the tier achieves.
  uint64_t payload_bytes_written = 0;
  uint64_t stored_bytes_written = 0;
  uint64_t file_bytes = 0;  // Bytes of the files that hold live data.
};

class LowerTier {
 public:
  using Done = std::function<void(Status)>;

  virtual ~LowerTier() = default;

  // Whether the tier holds `key` for exactly these token ids. Never waits
  // on I/O: a lookup calls it for every block past the host hits.
  virtual bool Contains(const BlockKey& key,
                        std::span<const TokenId> tokens) const = 0;
  // Copies host slot `slot` (the block of `key` and `tokens`) into the
  // tier and returns at once. The caller keeps the slot pinned and
  // unchanged until `done` runs; OK means Contains(key, tokens) is true.
  virtual void Spill(const BlockKey& key, std::span<const TokenId> tokens,
                     BlockId slot, Done done) = 0;
  // Copies the block of `key` and `tokens` into host slot `slot` and
  // returns at once. The caller keeps the slot pinned and unkeyed until
  // `done` runs. Non-OK (the value is gone, or failed verification): the
  // slot holds garbage and must not be served.
  virtual void Promote(const BlockKey& key, std::span<const TokenId> tokens,
                       BlockId slot, Done done) = 0;
  // Forgets the block of `key` (for any token ids) at once: Contains turns
  // false. A promotion already reading it fails (its slot is never served),
  // it is never served torn. Returns whether the tier held it.
  virtual bool Remove(const BlockKey& key) = 0;
  // Forgets every block the tier holds, as Remove; returns how many. Blocks
  // still being written (spills in flight) are kept.
  virtual uint64_t RemoveAll() = 0;
  virtual DiskTierStats stats() const = 0;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_LOWER_TIER_H_
