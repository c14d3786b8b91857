// ShmSegment: one named POSIX shared-memory segment (Boost.Interprocess),
// mapped read-write, or an anonymous private mapping for embedded mode. The
// creator owns the name and removes it when destroyed; openers only unmap.
// Not thread-safe to move or destroy while others use the mapping; the
// mapped bytes themselves carry whatever synchronisation their users define.
#ifndef TIERKV_TIERS_SHM_SEGMENT_H_
#define TIERKV_TIERS_SHM_SEGMENT_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "tierkv/status.h"

namespace tierkv {

struct ShmCreateOptions {
  std::string name;  // "/tierkv.<store>.host": one leading slash, no others.
  size_t bytes = 0;  // Required, > 0.
  // Permission bits applied exactly (umask does not narrow them).
  // Default: 0600, the creating user only.
  mode_t mode = 0600;
  // When set, the segment's group; give mode group bits (e.g. 0660) too.
  std::optional<gid_t> group;
};

class ShmSegment {
 public:
  // Creates a new segment, replacing one of the same name, with its memory
  // reserved (see Reserve): ResourceExhausted when /dev/shm has no room,
  // never SIGBUS later. REQUIRES: the
  // caller made sure any existing segment of that name was left by a
  // process that is gone. Destroyed, it removes the name only while the
  // name is still this segment's.
  static StatusOr<ShmSegment> Create(const ShmCreateOptions& options);
  // Maps an existing segment. NotFound when it does not exist,
  // PermissionDenied when this user may not open it, FailedPrecondition
  // when the name is not a regular file of some bytes (a FIFO there never
  // blocks the open). Names in /dev/shm are anyone's to take: check
  // file_owner() before trusting what is read.
  static StatusOr<ShmSegment> Open(const std::string& name);
  // Maps an existing segment read-only (PROT_READ): a write through data()
  // faults. Errors as Open.
  static StatusOr<ShmSegment> OpenReadOnly(const std::string& name);
  // Private anonymous memory (embedded mode: no name, nothing to clean up).
  static StatusOr<ShmSegment> CreateAnonymous(size_t bytes);
  // A nameless shared segment (memfd) of exactly `bytes`, sealed so that no
  // process holding it can shrink or grow it (F_SEAL_SHRINK, F_SEAL_GROW,
  // F_SEAL_SEAL): a mapping of it never faults with SIGBUS. It has no name
  // in any directory; others reach it only through fd(), passed over a Unix
  // socket (SCM_RIGHTS). `label` names it in /proc/<pid>/fd. Its memory is
  // not reserved: callers Reserve what they will touch.
  static StatusOr<ShmSegment> CreateSealed(size_t bytes,
                                           const std::string& label);
  // Maps a segment received as `fd` (taking ownership of it; it is closed
  // once mapped). FailedPrecondition unless it is a memfd sealed against
  // shrinking and growing, so a sender cannot truncate it under us later.
  static StatusOr<ShmSegment> MapSealed(int fd, bool writable);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();  // Unmaps; the owner also removes the name.

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }  // Empty if anonymous.
  bool owner() const { return owner_; }
  // Of a segment Open or OpenReadOnly mapped: the uid that owned its file
  // when opened. (uid_t)-1 for every other kind.
  uid_t file_owner() const;
  // The sealed segment's file descriptor (CreateSealed), to pass to another
  // process; -1 for every other kind. Owned by the segment.
  int fd() const;

  // Takes the memory of bytes [offset, offset + bytes) of a sealed segment
  // now (fallocate), so that touching them later cannot fault with SIGBUS
  // for want of memory: a segment is only sized when made, and its pages
  // are otherwise taken on first touch. ResourceExhausted with the numbers
  // when the memory is not there (what was taken by this call is given
  // back). A no-op for other kinds (anonymous memory is the process's own;
  // Create reserves a named segment whole).
  Status Reserve(size_t offset, size_t bytes) const;

  // Removes a segment by name; true if one existed.
  static bool Remove(const std::string& name);

 private:
  struct Impl;  // Boost.Interprocess objects; shm_segment.cc.
  explicit ShmSegment(std::unique_ptr<Impl> impl);
  // A segment over `impl`'s mapping (or anonymous memory).
  static ShmSegment FromImpl(std::unique_ptr<Impl> impl,
                             const std::string& name, bool owner);
  static StatusOr<ShmSegment> OpenMapping(const std::string& name,
                                          bool writable);

  std::unique_ptr<Impl> impl_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
};

// A name is valid for shm_open when it is "/" then 1..200 characters from
// [A-Za-z0-9._-]. InvalidArgument with the reason otherwise.
Status ValidateShmName(const std::string& name);

}  // namespace tierkv

#endif  // TIERKV_TIERS_SHM_SEGMENT_H_
