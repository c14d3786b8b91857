// LowerTier: the tiers below the host DRAM slots (disk, remote, or both), as
// the coordinator drives them. The coordinator decides what moves and when; a
// LowerTier moves one block between a host slot and its own storage, off the
// caller's thread. TieredStore's implementations (tiers/tiered_store.cc)
// move blocks between host slots and DiskTier values (tiers/disk_tier.h),
// and stack the disk tier over a remote tier (tiers/remote_tier.h).
// Thread-safety: every method may be called from any thread; `done`
// callbacks run on the tier's own threads.
#ifndef TIERKV_SRC_LOWER_TIER_H_
#define TIERKV_SRC_LOWER_TIER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "src/cache_event_sink.h"
#include "tierkv/block_key.h"
#include "tierkv/stats.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

// What Remove or RemoveAll found, by medium: the disk tier's blocks, and the
// keys the remote tier knew (the blocks this store wrote and those its scans
// found). A block both hold counts once in each.
struct LowerRemoval {
  uint64_t disk = 0;
  uint64_t remote = 0;
  LowerRemoval& operator+=(const LowerRemoval& other) {
    disk += other.disk;
    remote += other.remote;
    return *this;
  }
  friend bool operator==(const LowerRemoval&, const LowerRemoval&) = default;
};

class LowerTier {
 public:
  using Done = std::function<void(Status)>;
  // A promotion's result: OK with XXH3-64 of the bytes it wrote into the
  // slot, or why it failed.
  using PromoteDone = std::function<void(StatusOr<uint64_t>)>;

  virtual ~LowerTier() = default;

  // Whether the tier holds `key` for exactly these token ids. Never waits
  // on I/O: a lookup calls it for every block past the host hits.
  virtual bool Contains(const BlockKey& key,
                        std::span<const TokenId> tokens) const = 0;
  // Whether a Spill of the block would copy it nowhere new, so a host slot
  // may drop it without one. A tier that stacks a local tier over a shared
  // one (a disk tier over a remote tier) answers for the local one: a block
  // read from the shared tier is kept locally once the host evicts it.
  // Default: Contains.
  virtual bool Covers(const BlockKey& key,
                      std::span<const TokenId> tokens) const {
    return Contains(key, tokens);
  }
  // Copies host slot `slot` (the block of `key` and `tokens`) into the
  // tier and returns at once. The caller keeps the slot pinned and
  // unchanged until `done` runs; OK means Contains(key, tokens) is true.
  // With a `checksum` (XXH3-64 of the slot's bytes when they were stored),
  // bytes that no longer hash to it are not kept: `done` gets DataLoss
  // and the tier does not hold the block.
  virtual void Spill(const BlockKey& key, std::span<const TokenId> tokens,
                     BlockId slot, std::optional<uint64_t> checksum,
                     Done done) = 0;
  // The host dropped its copy of a block this tier holds (evicted its
  // slot, or let it go as covered here). A tier ordered by use may count
  // the block as recent: its copy is now the one closest to the engine.
  // Not a use (an adaptive policy does not count it as a reuse). Never
  // waits on I/O. Default: nothing.
  virtual void HostDropped(const BlockKey& key) { (void)key; }
  // Before the host drops its copy: whether the tier Contains (or, the
  // second, Covers) the block, and when it does, HostDropped, in one step,
  // so that the tier cannot evict the block between the check and the
  // renewal (the host's oldest blocks tend to be the tier's oldest too,
  // written behind as they were). Default: the check, then HostDropped.
  virtual bool ContainsThenRenew(const BlockKey& key,
                                 std::span<const TokenId> tokens) {
    if (!Contains(key, tokens)) return false;
    HostDropped(key);
    return true;
  }
  virtual bool CoversThenRenew(const BlockKey& key,
                               std::span<const TokenId> tokens) {
    if (!Covers(key, tokens)) return false;
    HostDropped(key);
    return true;
  }
  // Copies a block that a tier above this one gave up (a disk tier's
  // eviction), handed over as its verified bytes rather than a host slot,
  // and returns at once; OK in `done` means Contains(key, tokens) is true.
  // Default: Unimplemented, for a tier that only takes host slots.
  virtual void Demote(const BlockKey& key, std::span<const TokenId> tokens,
                      std::vector<std::byte> payload, Done done) {
    (void)key;
    (void)tokens;
    (void)payload;
    done(Status::Unimplemented("this tier takes blocks from host slots only"));
  }
  // Copies the block of `key` and `tokens` into host slot `slot` and
  // returns at once. The caller keeps the slot pinned and unkeyed until
  // `done` runs. Non-OK (the value is gone, or failed verification): the
  // slot holds garbage and must not be served.
  virtual void Promote(const BlockKey& key, std::span<const TokenId> tokens,
                       BlockId slot, PromoteDone done) = 0;
  // Forgets the block of `key` (for any token ids) at once: Contains turns
  // false. A promotion already reading it fails (its slot is never served),
  // it is never served torn. Returns which media held it (1 each).
  virtual LowerRemoval Remove(const BlockKey& key) = 0;
  // Undoes a spill of `key` an operator discarded (the coordinator calls it
  // once the spill has finished): removes what a spill of this process may
  // have written, as Remove does, but a shared tier leaves a block that
  // only another machine wrote. Default: Remove.
  virtual LowerRemoval RemoveSpilled(const BlockKey& key) {
    return Remove(key);
  }
  // Forgets every block the tier holds, as Remove; returns how many each
  // medium held. Blocks still being written (spills in flight) are kept.
  virtual LowerRemoval RemoveAll() = 0;
  // The keys the tier holds (stored, not being written), at most `max` of
  // them, and how many it holds in all.
  virtual std::vector<BlockKey> StoredKeys(size_t max,
                                           uint64_t* total) const = 0;
  // StoredKeys of one medium: kStorage, the disk tier's; kRemote, the
  // remote tier's (those this process wrote), for a tier that is or
  // includes one. Default: every stored key under kStorage.
  virtual std::vector<BlockKey> KeysOn(CacheMedium medium, size_t max,
                                       uint64_t* total) const {
    if (medium == CacheMedium::kStorage) return StoredKeys(max, total);
    *total = 0;
    return {};
  }
  virtual DiskTierStats stats() const = 0;
  // The disk tier's stats, when the tier is or includes a disk tier.
  // Default: stats().
  virtual std::optional<DiskTierStats> disk_stats() const { return stats(); }
  // The remote tier's stats, when the tier is or includes a remote tier.
  // Default: none.
  virtual std::optional<RemoteTierStats> remote_stats() const {
    return std::nullopt;
  }
  // Returns once every Spill and Promote called before has run its `done`
  // (a tier whose callbacks wait on nothing but its own I/O). Default: at
  // once.
  virtual void WaitQueued() {}
};

}  // namespace tierkv

#endif  // TIERKV_SRC_LOWER_TIER_H_
