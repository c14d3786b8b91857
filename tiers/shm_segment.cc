#include "tiers/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <utility>

namespace tierkv {

namespace bip = boost::interprocess;

struct ShmSegment::Impl {
  Impl() = default;
  // Maps all of `shm` with `mode`; throws as Boost does (callers catch).
  Impl(bip::shared_memory_object& shm, bip::mode_t mode) : region(shm, mode) {}

  bip::mapped_region region;
  // Mapped with mmap directly (anonymous and sealed segments).
  void* anonymous = nullptr;
  size_t anonymous_bytes = 0;
  int sealed_fd = -1;  // CreateSealed's memfd; -1 otherwise.
  // Create's segment as the file system knows it: the destructor removes
  // the name only while it still names this segment.
  dev_t device = 0;
  ino_t inode = 0;
  // Open's segment: the uid that owned the name when it was opened.
  uid_t uid = static_cast<uid_t>(-1);

  ~Impl() {
    if (anonymous != nullptr) munmap(anonymous, anonymous_bytes);
    if (sealed_fd >= 0) close(sealed_fd);
  }
};

namespace {

Status FromInterprocess(const bip::interprocess_exception& e,
                        const std::string& what, const std::string& name) {
  const std::string msg = what + " shared memory '" + name + "': " + e.what();
  switch (e.get_error_code()) {
    case bip::not_found_error:
      return Status::NotFound(msg);
    case bip::security_error:
      return Status::PermissionDenied(msg);
    case bip::out_of_space_error:
    case bip::out_of_memory_error:
      return Status::ResourceExhausted(msg);
    default:
      return Status::Unavailable(msg);
  }
}

Status ReserveError(int err, size_t bytes, const std::string& what) {
  const std::string msg = "cannot reserve " + std::to_string(bytes) +
                          " bytes of " + what + ": " + std::strerror(err);
  return err == ENOSPC || err == ENOMEM || err == EFBIG
             ? Status::ResourceExhausted(msg)
             : Status::Unavailable(msg);
}

}  // namespace

Status ValidateShmName(const std::string& name) {
  if (name.size() < 2 || name.size() > 201 || name[0] != '/') {
    return Status::InvalidArgument("shared memory name '" + name +
                                   "' must be '/' and 1..200 characters");
  }
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::InvalidArgument("shared memory name '" + name +
                                     "' may only use [A-Za-z0-9._-]");
    }
  }
  return Status::Ok();
}

ShmSegment::ShmSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : impl_(std::move(other.impl_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)),
      owner_(std::exchange(other.owner_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    ShmSegment old(std::move(*this));
    impl_ = std::move(other.impl_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  const std::pair<dev_t, ino_t> created =
      impl_ != nullptr ? std::pair(impl_->device, impl_->inode)
                       : std::pair<dev_t, ino_t>(0, 0);
  impl_.reset();  // Unmap before the name goes.
  if (!owner_ || name_.empty()) return;
  // Not another's segment that took the name since (this one's was
  // removed by hand, and another process created it again).
  struct stat st {};
  if (stat(("/dev/shm" + name_).c_str(), &st) == 0 &&
      std::pair(st.st_dev, st.st_ino) == created) {
    Remove(name_);
  }
}

bool ShmSegment::Remove(const std::string& name) {
  return bip::shared_memory_object::remove(name.c_str() + 1);
}

ShmSegment ShmSegment::FromImpl(std::unique_ptr<Impl> impl,
                                const std::string& name, bool owner) {
  ShmSegment segment(std::move(impl));
  const Impl& i = *segment.impl_;
  segment.data_ = static_cast<std::byte*>(
      i.anonymous != nullptr ? i.anonymous : i.region.get_address());
  segment.size_ =
      i.anonymous != nullptr ? i.anonymous_bytes : i.region.get_size();
  segment.name_ = name;
  segment.owner_ = owner;
  return segment;
}

StatusOr<ShmSegment> ShmSegment::Create(const ShmCreateOptions& options) {
  TIERKV_RETURN_IF_ERROR(ValidateShmName(options.name));
  if (options.bytes == 0) {
    return Status::InvalidArgument("shared memory segment of 0 bytes");
  }
  Remove(options.name);  // Stale: the caller made sure its creator is gone.
  try {
    bip::permissions perm;
    perm.set_permissions(static_cast<int>(options.mode));
    // Boost names segments without the leading slash (it adds one).
    bip::shared_memory_object shm(bip::create_only, options.name.c_str() + 1,
                                  bip::read_write, perm);
    if (options.group.has_value() &&
        fchown(shm.get_mapping_handle().handle, static_cast<uid_t>(-1),
               *options.group) != 0) {
      const int err = errno;
      bip::shared_memory_object::remove(options.name.c_str() + 1);
      return Status::PermissionDenied(
          "cannot give shared memory '" + options.name + "' to group " +
          std::to_string(*options.group) + ": " + std::strerror(err));
    }
    shm.truncate(static_cast<bip::offset_t>(options.bytes));
    // Taken now: a /dev/shm too small for the segment is an error here,
    // not SIGBUS at the first write past its room.
    if (const int err = posix_fallocate(shm.get_mapping_handle().handle, 0,
                                        static_cast<off_t>(options.bytes));
        err != 0) {
      bip::shared_memory_object::remove(options.name.c_str() + 1);
      return ReserveError(err, options.bytes,
                          "shared memory '" + options.name + "' in /dev/shm");
    }
    auto impl = std::make_unique<Impl>(shm, bip::read_write);
    struct stat st {};
    if (fstat(shm.get_mapping_handle().handle, &st) == 0) {
      impl->device = st.st_dev;
      impl->inode = st.st_ino;
    }
    return FromImpl(std::move(impl), options.name, /*owner=*/true);
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(options.name.c_str() + 1);
    return FromInterprocess(e, "cannot create", options.name);
  }
}

StatusOr<ShmSegment> ShmSegment::Open(const std::string& name) {
  return OpenMapping(name, /*writable=*/true);
}

StatusOr<ShmSegment> ShmSegment::OpenReadOnly(const std::string& name) {
  return OpenMapping(name, /*writable=*/false);
}

StatusOr<ShmSegment> ShmSegment::OpenMapping(const std::string& name,
                                             bool writable) {
  TIERKV_RETURN_IF_ERROR(ValidateShmName(name));
  // /dev/shm is anyone's to write names in: a FIFO there must not block
  // the open, and only a regular file is mapped.
  const int fd = shm_open(
      name.c_str(),
      (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        "cannot open shared memory '" + name + "': " + std::strerror(err);
    if (err == ENOENT) return Status::NotFound(msg);
    if (err == EACCES || err == EPERM) return Status::PermissionDenied(msg);
    return Status::Unavailable(msg);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::FailedPrecondition("shared memory '" + name +
                                      "' is not a regular file");
  }
  if (st.st_size <= 0) {
    close(fd);
    return Status::FailedPrecondition("shared memory '" + name + "' is empty");
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                 MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return Status::ResourceExhausted("cannot map shared memory '" + name +
                                     "': " + std::strerror(err));
  }
  auto impl = std::make_unique<Impl>();
  impl->anonymous = p;
  impl->anonymous_bytes = bytes;
  impl->device = st.st_dev;
  impl->inode = st.st_ino;
  impl->uid = st.st_uid;
  return FromImpl(std::move(impl), name, /*owner=*/false);
}

uid_t ShmSegment::file_owner() const {
  return impl_ != nullptr ? impl_->uid : static_cast<uid_t>(-1);
}

StatusOr<ShmSegment> ShmSegment::CreateAnonymous(size_t bytes) {
  if (bytes == 0) {
    return Status::InvalidArgument("anonymous segment of 0 bytes");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Status::ResourceExhausted("cannot map " + std::to_string(bytes) +
                                     " bytes: " + std::strerror(errno));
  }
  auto impl = std::make_unique<Impl>();
  impl->anonymous = p;
  impl->anonymous_bytes = bytes;
  return FromImpl(std::move(impl), "", /*owner=*/false);
}

int ShmSegment::fd() const { return impl_ != nullptr ? impl_->sealed_fd : -1; }

Status ShmSegment::Reserve(size_t offset, size_t bytes) const {
  const int fd = this->fd();
  if (fd < 0 || bytes == 0) return Status::Ok();
  if (offset > size_ || bytes > size_ - offset) {
    return Status::OutOfRange("reserving bytes " + std::to_string(offset) +
                              ".." + std::to_string(offset + bytes) + " of a " +
                              std::to_string(size_) + "-byte segment");
  }
  // tmpfs allocates the pages (charged to this process's memory cgroup) or
  // fails whole, giving back what it took.
  if (fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(bytes)) !=
      0) {
    return ReserveError(errno, bytes, "shared memory");
  }
  return Status::Ok();
}

StatusOr<ShmSegment> ShmSegment::CreateSealed(size_t bytes,
                                              const std::string& label) {
  if (bytes == 0) {
    return Status::InvalidArgument("shared memory segment of 0 bytes");
  }
  auto fail = [&](const std::string& what, int fd) {
    const int err = errno;
    if (fd >= 0) close(fd);
    const std::string msg = what + " for " + std::to_string(bytes) +
                            "-byte segment '" + label +
                            "': " + std::strerror(err);
    return err == ENOMEM || err == ENOSPC || err == EMFILE || err == ENFILE
               ? Status::ResourceExhausted(msg)
               : Status::Unavailable(msg);
  };
  const int fd = memfd_create(("tierkv." + label).c_str(),
                              MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail("memfd_create", -1);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail("ftruncate", fd);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("sealing", fd);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", fd);
  auto impl = std::make_unique<Impl>();
  impl->anonymous = p;
  impl->anonymous_bytes = bytes;
  impl->sealed_fd = fd;
  return FromImpl(std::move(impl), "", /*owner=*/false);
}

StatusOr<ShmSegment> ShmSegment::MapSealed(int fd, bool writable) {
  if (fd < 0) return Status::InvalidArgument("no segment was passed");
  auto refuse = [fd](Status s) {
    close(fd);
    return s;
  };
  const int seals = fcntl(fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    return refuse(Status::FailedPrecondition(
        "the segment passed is not a memfd sealed against resizing"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    return refuse(Status::FailedPrecondition("the segment passed is empty"));
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return refuse(
        Status::ResourceExhausted("cannot map " + std::to_string(bytes) +
                                  "-byte segment: " + std::strerror(errno)));
  }
  close(fd);
  auto impl = std::make_unique<Impl>();
  impl->anonymous = p;
  impl->anonymous_bytes = bytes;
  return FromImpl(std::move(impl), "", /*owner=*/false);
}

}  // namespace tierkv
