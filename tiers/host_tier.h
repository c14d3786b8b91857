// HostTier: host DRAM slots for KV blocks, one block per fixed-size slot, in
// a shared-memory segment that tierkvd creates and every worker maps. The
// slots' metadata (keys, ref counts, LRU) lives in the coordinator's
// BlockPool, not here: this class is only the memory and its header.
// Thread-safety: immutable after Create/Attach; slot bytes are written only
// by the party an event names (a worker executing a store into a slot that
// the coordinator has pinned for it), so no lock guards them.
#ifndef TIERKV_TIERS_HOST_TIER_H_
#define TIERKV_TIERS_HOST_TIER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "src/free_block_queue.h"
#include "tierkv/status.h"
#include "tiers/shm_segment.h"

namespace tierkv {

struct HostTierOptions {
  // Segment name ("/tierkv.<store>.host"); empty for private memory
  // (embedded mode). Default: empty.
  std::string segment_name;
  int32_t num_slots = 0;  // Including the null slot 0. Required, >= 2.
  size_t slot_bytes = 0;  // One KV block (KvLayout::BlockBytes()). Required.
  // StoreFingerprint(layout, model): written to the header; checked on
  // Attach.
  std::string layout_fingerprint;
  mode_t mode = 0600;          // Default: owner only.
  std::optional<gid_t> group;  // Default: the creator's group.
};

class HostTier {
 public:
  // Creates the slots. For a named segment, REQUIRES: the store lock is held
  // (StoreLock), so an existing segment of that name is stale and replaced.
  static StatusOr<std::unique_ptr<HostTier>> Create(
      const HostTierOptions& options);
  // Maps tierkvd's segment. FailedPrecondition when the header is not a
  // tierkv host tier of this format version, or its layout fingerprint or
  // slot size differ from what the worker expects.
  static StatusOr<std::unique_ptr<HostTier>> Attach(
      const std::string& segment_name, const std::string& layout_fingerprint,
      size_t slot_bytes, int32_t num_slots);

  int32_t num_slots() const { return num_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity_bytes() const { return slot_bytes_ * num_slots_; }
  const std::string& segment_name() const { return segment_.name(); }
  // REQUIRES: 0 <= id < num_slots().
  std::byte* slot(BlockId id) const {
    return slots_ + static_cast<size_t>(id) * slot_bytes_;
  }

  // Slots that fit in `capacity_bytes` (the null slot included).
  static int32_t SlotsFor(size_t capacity_bytes, size_t slot_bytes);

 private:
  HostTier(ShmSegment segment, int32_t num_slots, size_t slot_bytes,
           std::byte* slots);

  ShmSegment segment_;
  int32_t num_slots_;
  size_t slot_bytes_;
  std::byte* slots_;
};

// StoreLock: an exclusive flock(2) on "<socket>.lock", held by the tierkvd
// serving a store for its whole life. The kernel drops it when the process
// dies, so a segment or socket left behind by a dead daemon is recognisably
// stale, while a live daemon's is never clobbered.
class StoreLock {
 public:
  // FailedPrecondition naming the holder's pid when a live process holds it.
  static StatusOr<StoreLock> Acquire(const std::string& path);
  StoreLock(StoreLock&& other) noexcept;
  StoreLock& operator=(StoreLock&& other) noexcept;
  ~StoreLock();

 private:
  explicit StoreLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_HOST_TIER_H_
