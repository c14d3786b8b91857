// HostTier: host DRAM slots for KV blocks, one block per fixed-size slot, in
// shared-memory segments that tierkvd creates, one per tenant, each mapped
// by that tenant's workers only. A segment is a sealed memfd
// (ShmSegment::CreateSealed): it has no name a worker or another user could
// open, truncate or pre-create; workers get theirs from tierkvd over the
// Unix socket. The slots' metadata (keys, ref counts,
// LRU) lives in the coordinator's BlockPool, not here: this class is only
// the memory and its header.
// Thread-safety: the segments change (EnsureSegment, AssignSlot, Trim,
// ResetSegment) only under the coordinator's lock; slot() reads the
// segments' bases and each slot's segment, atomics, without it. Slot bytes
// are written only by the party an event names (a worker executing a store
// into a slot that the coordinator has pinned for it), so no lock guards
// them.
#ifndef TIERKV_TIERS_HOST_TIER_H_
#define TIERKV_TIERS_HOST_TIER_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "src/free_block_queue.h"
#include "tierkv/status.h"
#include "tiers/shm_segment.h"

namespace tierkv {

struct HostTierOptions {
  // True: sealed memfds that workers map (tierkvd). False: private memory
  // (embedded mode). Default: false.
  bool shared = false;
  // With shared: the most segments EnsureSegment may make, one per tenant
  // (CoordinatorOptions::max_tenants). Each is num_slots slots of virtual
  // memory; a slot's bytes live in one segment at a time (AssignSlot), so
  // tierkvd's own writes keep at most num_slots slots resident in all.
  // Default: 1.
  uint32_t max_segments = 1;
  int32_t num_slots = 0;  // Including the null slot 0. Required, >= 2.
  size_t slot_bytes = 0;  // One KV block (KvLayout::BlockBytes()). Required.
  // StoreFingerprint(layout, model): written to the header; checked on
  // Attach.
  std::string layout_fingerprint;
  // With shared: checked between chunks while Create reserves segment 0's
  // memory (which takes a while for many GiB); once it says true, Create
  // gives up with Unavailable. Default: never.
  std::function<bool()> cancelled = {};
  // With shared: takes the memory of a range of a segment
  // (ShmSegment::Reserve), so that no one faults with SIGBUS touching it
  // later. A test seam: tests make it fail. Default: ShmSegment::Reserve.
  std::function<Status(const ShmSegment& segment, size_t offset, size_t bytes)>
      reserve = {};
};

class HostTier {
 public:
  // Creates the slots, in segment 0. A shared tier reserves segment 0's
  // memory whole (ResourceExhausted when it is not there), so that no slot
  // ever faults for want of it; later segments take a slot's memory as
  // AssignSlot moves it there.
  static StatusOr<std::unique_ptr<HostTier>> Create(
      const HostTierOptions& options);
  // Maps tierkvd's segment, received as `segment_fd` (taken over: closed in
  // every case). FailedPrecondition when it is not sealed, the header is not
  // a tierkv host tier of this format version, or its layout fingerprint or
  // slot size differ from what the worker expects.
  static StatusOr<std::unique_ptr<HostTier>> Attach(
      int segment_fd, const std::string& layout_fingerprint, size_t slot_bytes,
      int32_t num_slots);
  ~HostTier();

  int32_t num_slots() const { return num_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity_bytes() const { return slot_bytes_ * num_slots_; }

  // tierkvd: makes segment `segment` unless it exists (a shared tier's
  // tenants after the first). InvalidArgument past max_segments or for a
  // private tier; ResourceExhausted when memory runs out. Not concurrent
  // with itself (the coordinator's lock); concurrent with slot().
  Status EnsureSegment(uint32_t segment);
  // A made segment's fd, for passing to a worker; -1 for private memory or
  // a segment not made.
  int segment_fd(uint32_t segment = 0) const;
  // Moves slot `id` to `segment` (made): its memory there is reserved,
  // slot(id) points there from now on, and the memory the slot held in its
  // previous segment is given back (its whole pages). ResourceExhausted
  // when the memory cannot be reserved: the slot stays where it was and
  // must not be handed out (touching it in `segment` could fault with
  // SIGBUS). REQUIRES: nothing reads or writes the slot (it is being
  // allocated); called under the coordinator's lock, which orders it
  // before the slot's later users.
  Status AssignSlot(BlockId id, uint32_t segment);
  // Gives back the memory of every slot not assigned to `segment` in that
  // segment: what its tenant's workers wrote outside their own blocks.
  // Called when a tenant's last worker detaches, under the coordinator's
  // lock (which orders it with AssignSlot). O(num_slots).
  void Trim(uint32_t segment);
  // Replaces segment `segment` (not 0) with new memory, a new memfd whose
  // fd segment_fd gives from now on: a process that still maps the old one
  // shares nothing with the tier any more. OK for a segment never made.
  // FailedPrecondition while a slot is assigned to it; ResourceExhausted
  // when memory runs out (the old one stays). Called under the coordinator's
  // lock, when no worker maps the segment through tierkvd and nothing reads or
  // writes it.
  Status ResetSegment(uint32_t segment);
  // The slot's bytes, in the segment it was last assigned to (segment 0
  // for a tier with one). REQUIRES: 0 <= id < num_slots().
  std::byte* slot(BlockId id) const {
    const uint32_t segment =
        owner_ != nullptr ? owner_[id].load(std::memory_order_relaxed) : 0;
    return bases_[segment].load(std::memory_order_acquire) +
           static_cast<size_t>(id) * slot_bytes_;
  }

  // Slots that fit in `capacity_bytes` (the null slot included).
  static int32_t SlotsFor(size_t capacity_bytes, size_t slot_bytes);

 private:
  HostTier(const HostTierOptions& options, ShmSegment first);
  // A segment of the tier's size with its header written; segment 0 of a
  // shared tier has all of its memory reserved, the others their header.
  static StatusOr<ShmSegment> MakeSegment(const HostTierOptions& options,
                                          uint32_t segment);
  // Makes segment `segment` (MakeSegment) and puts it in place of any
  // there; slot() points into it from now on.
  Status MakeAndInstall(uint32_t segment);
  // Reserves [offset, offset + bytes) of `segment` (options.reserve).
  static Status Reserve(const HostTierOptions& options,
                        const ShmSegment& segment, size_t offset, size_t bytes);
  // Reserves all of `segment` in chunks, checking options.cancelled
  // between them.
  static Status ReserveWhole(const HostTierOptions& options,
                             const ShmSegment& segment);
  // Punches the whole pages of byte range [begin, end) of segment `fd`.
  static void Punch(int fd, size_t begin, size_t end);

  HostTierOptions options_;
  int32_t num_slots_;
  size_t slot_bytes_;
  // options_.max_segments of each; a segment not made yet is empty / null.
  std::unique_ptr<std::optional<ShmSegment>[]> segments_;
  std::unique_ptr<std::atomic<std::byte*>[]> bases_;  // Slot 0 of each.
  // Each slot's segment; null with one segment.
  std::unique_ptr<std::atomic<uint32_t>[]> owner_;
};

// StoreLock: an exclusive flock(2) on a lock file ("<socket>.lock", the
// store's), held by the tierkvd serving a store for its whole life. The
// kernel drops it when the process dies, so a segment or socket left behind
// by a dead daemon is recognisably stale (and its lock file is taken over),
// while a live daemon's is never clobbered. Released, the file is removed
// while still locked; Acquire locks only a file that its path still names
// once locked, so a file removed under a waiting Acquire is never taken.
// Not thread-safe; owned by the server.
class StoreLock {
 public:
  // AlreadyExists naming the holder's pid when a live process holds it.
  // PermissionDenied when `path` is a symbolic link or another user's file
  // (never followed or truncated).
  static StatusOr<StoreLock> Acquire(const std::string& path);
  StoreLock(StoreLock&& other) noexcept;
  StoreLock& operator=(StoreLock&& other) noexcept;
  ~StoreLock();  // Release().

  // Removes the lock file, then unlocks it. Idempotent.
  void Release();

 private:
  StoreLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_HOST_TIER_H_
