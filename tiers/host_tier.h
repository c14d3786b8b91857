// HostTier: host DRAM slots for KV blocks, one block per fixed-size slot, in
// a shared-memory segment that tierkvd creates and every worker maps. The
// segment is a sealed memfd (ShmSegment::CreateSealed): it has no name a
// worker or another user could open, truncate or pre-create; workers get it
// from tierkvd over the Unix socket. The slots' metadata (keys, ref counts,
// LRU) lives in the coordinator's BlockPool, not here: this class is only
// the memory and its header.
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
  // True: a sealed memfd that workers map (tierkvd). False: private memory
  // (embedded mode). Default: false.
  bool shared = false;
  int32_t num_slots = 0;  // Including the null slot 0. Required, >= 2.
  size_t slot_bytes = 0;  // One KV block (KvLayout::BlockBytes()). Required.
  // StoreFingerprint(layout, model): written to the header; checked on
  // Attach.
  std::string layout_fingerprint;
};

class HostTier {
 public:
  // Creates the slots.
  static StatusOr<std::unique_ptr<HostTier>> Create(
      const HostTierOptions& options);
  // Maps tierkvd's segment, received as `segment_fd` (taken over: closed in
  // every case). FailedPrecondition when it is not sealed, the header is not
  // a tierkv host tier of this format version, or its layout fingerprint or
  // slot size differ from what the worker expects.
  static StatusOr<std::unique_ptr<HostTier>> Attach(
      int segment_fd, const std::string& layout_fingerprint, size_t slot_bytes,
      int32_t num_slots);

  int32_t num_slots() const { return num_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity_bytes() const { return slot_bytes_ * num_slots_; }
  // The shared segment's fd, for passing to a worker; -1 for private memory.
  int segment_fd() const { return segment_.fd(); }
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
  // PermissionDenied when `path` is a symbolic link or another user's file
  // (never followed or truncated).
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
