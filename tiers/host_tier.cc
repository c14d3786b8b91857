#include "tiers/host_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace tierkv {
namespace {

constexpr uint64_t kHostTierMagic = 0x31524549544B5654ull;  // "TVKTIER1"
constexpr uint32_t kHostTierVersion = 1;
constexpr size_t kSlotAlignment = 4096;
constexpr size_t kFingerprintBytes = 256;

// The first page of the segment; slots start at kSlotAlignment.
struct HostTierHeader {
  uint64_t magic;
  uint32_t version;
  int32_t num_slots;
  uint64_t slot_bytes;
  int32_t creator_pid;
  char layout_fingerprint[kFingerprintBytes];
};
static_assert(sizeof(HostTierHeader) <= kSlotAlignment);

}  // namespace

HostTier::HostTier(ShmSegment segment, int32_t num_slots, size_t slot_bytes,
                   std::byte* slots)
    : segment_(std::move(segment)),
      num_slots_(num_slots),
      slot_bytes_(slot_bytes),
      slots_(slots) {}

int32_t HostTier::SlotsFor(size_t capacity_bytes, size_t slot_bytes) {
  if (slot_bytes == 0) return 0;
  const size_t n = capacity_bytes / slot_bytes;
  return static_cast<int32_t>(std::min<size_t>(n, INT32_MAX));
}

StatusOr<std::unique_ptr<HostTier>> HostTier::Create(
    const HostTierOptions& options) {
  if (options.num_slots < 2) {
    return Status::InvalidArgument(
        "host tier needs at least 2 slots (slot 0 is the null block), got " +
        std::to_string(options.num_slots));
  }
  if (options.slot_bytes == 0) {
    return Status::InvalidArgument("host tier slot size is 0 bytes");
  }
  if (options.layout_fingerprint.size() >= kFingerprintBytes) {
    return Status::InvalidArgument("layout fingerprint too long");
  }
  const size_t slot_bytes = options.slot_bytes;
  if (static_cast<size_t>(options.num_slots) >
      (SIZE_MAX - kSlotAlignment) / slot_bytes) {
    return Status::InvalidArgument("host tier size overflows");
  }
  const size_t bytes = kSlotAlignment + slot_bytes * options.num_slots;
  StatusOr<ShmSegment> segment = options.shared
                                     ? ShmSegment::CreateSealed(bytes, "host")
                                     : ShmSegment::CreateAnonymous(bytes);
  if (!segment.ok()) return segment.status();
  auto* header = reinterpret_cast<HostTierHeader*>(segment->data());
  std::memset(header, 0, sizeof(*header));
  header->version = kHostTierVersion;
  header->num_slots = options.num_slots;
  header->slot_bytes = slot_bytes;
  header->creator_pid = static_cast<int32_t>(getpid());
  std::memcpy(header->layout_fingerprint, options.layout_fingerprint.data(),
              options.layout_fingerprint.size());
  // Magic last: an attacher that sees it sees a complete header.
  __atomic_store_n(&header->magic, kHostTierMagic, __ATOMIC_RELEASE);
  std::byte* slots = segment->data() + kSlotAlignment;
  return std::unique_ptr<HostTier>(
      new HostTier(std::move(*segment), options.num_slots, slot_bytes, slots));
}

StatusOr<std::unique_ptr<HostTier>> HostTier::Attach(
    int segment_fd, const std::string& layout_fingerprint, size_t slot_bytes,
    int32_t num_slots) {
  TIERKV_ASSIGN_OR_RETURN(ShmSegment segment,
                          ShmSegment::MapSealed(segment_fd, /*writable=*/true));
  if (segment.size() < kSlotAlignment) {
    return Status::FailedPrecondition(
        "the host segment is too small to be a host tier");
  }
  const auto* header = reinterpret_cast<const HostTierHeader*>(segment.data());
  if (__atomic_load_n(&header->magic, __ATOMIC_ACQUIRE) != kHostTierMagic ||
      header->version != kHostTierVersion) {
    return Status::FailedPrecondition(
        "the host segment is not a tierkv host tier of format version " +
        std::to_string(kHostTierVersion));
  }
  const std::string fingerprint(
      header->layout_fingerprint,
      strnlen(header->layout_fingerprint, kFingerprintBytes));
  if (fingerprint != layout_fingerprint) {
    return Status::FailedPrecondition(
        "the host tier holds the store (layout, model) " + fingerprint +
        ", this worker uses " + layout_fingerprint);
  }
  if (header->slot_bytes != slot_bytes || header->num_slots != num_slots ||
      segment.size() < kSlotAlignment + slot_bytes * num_slots) {
    return Status::FailedPrecondition(
        "the host tier has " + std::to_string(header->num_slots) +
        " slots of " + std::to_string(header->slot_bytes) +
        " bytes; expected " + std::to_string(num_slots) + " of " +
        std::to_string(slot_bytes));
  }
  std::byte* slots = segment.data() + kSlotAlignment;
  return std::unique_ptr<HostTier>(
      new HostTier(std::move(segment), num_slots, slot_bytes, slots));
}

StatusOr<StoreLock> StoreLock::Acquire(const std::string& path) {
  // Not through a symbolic link, and not truncated before it is known to be
  // this user's own regular file: someone else's lock file is refused, not
  // clobbered.
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        "cannot open lock file " + path + ": " + std::strerror(err) +
        (err == ELOOP ? " (it is a symbolic link; remove it)" : "");
    return err == EACCES || err == ELOOP ? Status::PermissionDenied(msg)
                                         : Status::Unavailable(msg);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return Status::PermissionDenied(
        "lock file " + path + " is not a regular file of uid " +
        std::to_string(geteuid()) +
        " (another user made it?); remove it, or put the socket in a "
        "directory only this user can write");
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    const std::string pid = n > 0 ? std::string(buf, strnlen(buf, n)) : "?";
    return Status::FailedPrecondition(
        "store is served by a live tierkvd (pid " + pid + ", lock " + path +
        ")");
  }
  const std::string pid = std::to_string(getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                   static_cast<ssize_t>(pid.size())) {
    // The pid is only for the message above; the lock itself is held.
  }
  return StoreLock(fd);
}

StoreLock::StoreLock(StoreLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

StoreLock::~StoreLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace tierkv
