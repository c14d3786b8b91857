#include "tiers/host_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

HostTier::HostTier(const HostTierOptions& options, ShmSegment first)
    : options_(options),
      num_slots_(options.num_slots),
      slot_bytes_(options.slot_bytes),
      segments_(new std::optional<ShmSegment>[options.max_segments]),
      bases_(new std::atomic<std::byte*>[options.max_segments]) {
  for (uint32_t i = 0; i < options.max_segments; ++i) bases_[i] = nullptr;
  bases_[0] = first.data() + kSlotAlignment;
  segments_[0].emplace(std::move(first));
  if (options.max_segments > 1) {
    owner_.reset(new std::atomic<uint32_t>[options.num_slots]);
    for (int32_t i = 0; i < options.num_slots; ++i) owner_[i] = 0;
  }
}

HostTier::~HostTier() = default;

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
  if (options.max_segments < 1 ||
      (!options.shared && options.max_segments != 1)) {
    return Status::InvalidArgument(
        "a host tier has 1 segment, or up to max_segments shared ones");
  }
  if (static_cast<size_t>(options.num_slots) >
      (SIZE_MAX - kSlotAlignment) / options.slot_bytes) {
    return Status::InvalidArgument("host tier size overflows");
  }
  TIERKV_ASSIGN_OR_RETURN(ShmSegment first, MakeSegment(options, 0));
  return std::unique_ptr<HostTier>(new HostTier(options, std::move(first)));
}

StatusOr<ShmSegment> HostTier::MakeSegment(const HostTierOptions& options,
                                           uint32_t segment) {
  const size_t bytes = kSlotAlignment + options.slot_bytes * options.num_slots;
  StatusOr<ShmSegment> made =
      options.shared
          ? ShmSegment::CreateSealed(bytes, "host." + std::to_string(segment))
          : ShmSegment::CreateAnonymous(bytes);
  if (!made.ok()) return made.status();
  TIERKV_RETURN_IF_ERROR(segment == 0
                             ? ReserveWhole(options, *made)
                             : Reserve(options, *made, 0, kSlotAlignment));
  auto* header = reinterpret_cast<HostTierHeader*>(made->data());
  std::memset(header, 0, sizeof(*header));
  header->version = kHostTierVersion;
  header->num_slots = options.num_slots;
  header->slot_bytes = options.slot_bytes;
  header->creator_pid = static_cast<int32_t>(getpid());
  std::memcpy(header->layout_fingerprint, options.layout_fingerprint.data(),
              options.layout_fingerprint.size());
  // Magic last: an attacher that sees it sees a complete header.
  __atomic_store_n(&header->magic, kHostTierMagic, __ATOMIC_RELEASE);
  return made;
}

Status HostTier::Reserve(const HostTierOptions& options,
                         const ShmSegment& segment, size_t offset,
                         size_t bytes) {
  if (!options.shared) return Status::Ok();  // The process's own memory.
  return options.reserve ? options.reserve(segment, offset, bytes)
                         : segment.Reserve(offset, bytes);
}

Status HostTier::ReserveWhole(const HostTierOptions& options,
                              const ShmSegment& segment) {
  // Chunks of 64 MiB: a stop asked for during start-up waits for one at
  // most (tens of milliseconds).
  constexpr size_t kChunk = size_t{64} << 20;
  for (size_t offset = 0; offset < segment.size(); offset += kChunk) {
    if (options.cancelled && options.cancelled()) {
      return Status::Unavailable(
          "host tier: reserving memory cancelled (tierkvd is stopping)");
    }
    const size_t bytes = std::min(kChunk, segment.size() - offset);
    if (Status s = Reserve(options, segment, offset, bytes); !s.ok()) {
      return Status::ResourceExhausted(
          "host tier: reserved " + std::to_string(offset >> 20) + " of " +
          std::to_string(segment.size() >> 20) + " MiB, then: " + s.message() +
          "; lower --host-capacity");
    }
  }
  return Status::Ok();
}

Status HostTier::EnsureSegment(uint32_t segment) {
  if (segment >= options_.max_segments) {
    return Status::InvalidArgument(
        "host segment " + std::to_string(segment) + " past the " +
        std::to_string(options_.max_segments) + " this tier may have");
  }
  if (segments_[segment].has_value()) return Status::Ok();
  return MakeAndInstall(segment);
}

Status HostTier::MakeAndInstall(uint32_t segment) {
  TIERKV_ASSIGN_OR_RETURN(ShmSegment made, MakeSegment(options_, segment));
  bases_[segment].store(made.data() + kSlotAlignment,
                        std::memory_order_release);
  // A segment it replaces goes: no slot points into it (ResetSegment).
  segments_[segment].emplace(std::move(made));
  return Status::Ok();
}

Status HostTier::ResetSegment(uint32_t segment) {
  if (owner_ == nullptr || segment == 0 || segment >= options_.max_segments) {
    return Status::InvalidArgument("host segment " + std::to_string(segment) +
                                   " cannot be reset");
  }
  // Never made (its tenant's first worker was refused before): it is made
  // new when a worker needs it.
  if (!segments_[segment].has_value()) return Status::Ok();
  for (int32_t id = 0; id < num_slots_; ++id) {
    if (owner_[id].load(std::memory_order_relaxed) == segment) {
      return Status::FailedPrecondition("host slot " + std::to_string(id) +
                                        " is still in segment " +
                                        std::to_string(segment));
    }
  }
  return MakeAndInstall(segment);
}

int HostTier::segment_fd(uint32_t segment) const {
  if (segment >= options_.max_segments || !segments_[segment].has_value()) {
    return -1;
  }
  return segments_[segment]->fd();
}

Status HostTier::AssignSlot(BlockId id, uint32_t segment) {
  if (owner_ == nullptr) return Status::Ok();
  const uint32_t previous = owner_[id].load(std::memory_order_relaxed);
  if (previous == segment) return Status::Ok();
  const size_t begin = kSlotAlignment + static_cast<size_t>(id) * slot_bytes_;
  // Taken in the new segment before it is given back in the old one, so a
  // failure leaves the slot as it was.
  TIERKV_RETURN_IF_ERROR(
      Reserve(options_, *segments_[segment], begin, slot_bytes_));
  owner_[id].store(segment, std::memory_order_relaxed);
  // The previous segment's whole pages of the slot go back to the kernel
  // (its partial pages at either end stay: a neighbour may use them). A
  // worker of that tenant that touches them again gets zeroes, charged to
  // its own memory.
  Punch(segment_fd(previous), begin, begin + slot_bytes_);
  return Status::Ok();
}

void HostTier::Trim(uint32_t segment) {
  const int fd = segment_fd(segment);
  if (owner_ == nullptr || fd < 0) return;
  // Runs of slots assigned elsewhere, one punch each (the pages between
  // two such slots go too).
  for (int32_t id = 0; id < num_slots_;) {
    if (owner_[id].load(std::memory_order_relaxed) == segment) {
      ++id;
      continue;
    }
    int32_t end = id + 1;
    while (end < num_slots_ &&
           owner_[end].load(std::memory_order_relaxed) != segment) {
      ++end;
    }
    Punch(fd, kSlotAlignment + static_cast<size_t>(id) * slot_bytes_,
          kSlotAlignment + static_cast<size_t>(end) * slot_bytes_);
    id = end;
  }
}

void HostTier::Punch(int fd, size_t begin, size_t end) {
  if (fd < 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t first = (begin + page - 1) / page * page;
  const size_t last = end / page * page;
  if (last > first) {
    (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(first),
                    static_cast<off_t>(last - first));
  }
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
  HostTierOptions options;
  options.shared = true;
  options.num_slots = num_slots;
  options.slot_bytes = slot_bytes;
  options.layout_fingerprint = fingerprint;
  return std::unique_ptr<HostTier>(new HostTier(options, std::move(segment)));
}

StatusOr<StoreLock> StoreLock::Acquire(const std::string& path) {
  // A holder removes its file before it unlocks it (Release): a file this
  // process locked that the path no longer names was released meanwhile,
  // so it opens the path again. Bounded: each round needs another tierkvd
  // to have taken and released the name in between.
  for (int attempt = 0;; ++attempt) {
    // Not through a symbolic link, and not truncated before it is known to
    // be this user's own regular file: someone else's lock file is
    // refused, not clobbered.
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
      return Status::AlreadyExists("store is served by a live tierkvd (pid " +
                                   pid + ", lock " + path + ")");
    }
    struct stat now {};
    if (stat(path.c_str(), &now) != 0 || now.st_dev != st.st_dev ||
        now.st_ino != st.st_ino) {
      close(fd);
      if (attempt < 100) continue;
      return Status::Unavailable("lock file " + path +
                                 " keeps being replaced; is another tierkvd "
                                 "starting and stopping in a loop?");
    }
    const std::string pid = std::to_string(getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                     static_cast<ssize_t>(pid.size())) {
      // The pid is only for the message above; the lock itself is held.
    }
    return StoreLock(fd, path);
  }
}

StoreLock::StoreLock(StoreLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

StoreLock::~StoreLock() { Release(); }

void StoreLock::Release() {
  if (fd_ < 0) return;
  // Removed while locked: whoever opened the file meanwhile finds, once it
  // holds the lock, that the path no longer names it (Acquire). Not when
  // the path names another file by now (this one was removed by hand).
  struct stat mine {
  }, named{};
  if (fstat(fd_, &mine) == 0 && stat(path_.c_str(), &named) == 0 &&
      mine.st_dev == named.st_dev && mine.st_ino == named.st_ino) {
    unlink(path_.c_str());
  }
  close(fd_);
  fd_ = -1;
}

}  // namespace tierkv
