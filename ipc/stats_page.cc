#include "ipc/stats_page.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <span>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/unix_socket.h"

namespace tierkv::ipc {

namespace {

using Word = std::atomic<uint64_t>;
static_assert(Word::is_always_lock_free,
              "a read-only mapping needs plain 64-bit atomic loads");

constexpr uint64_t kPageMagic = 0x3150534D564B54ULL;  // "TKVMSP1"
constexpr uint32_t kPageVersion = 1;
constexpr size_t kSocketPathBytes = 112;  // sockaddr_un's sun_path, padded.

// At offset 0 of the segment. Written by StatsPageWriter only.
struct PageHeader {
  // kPageMagic, stored (release) once every other constant field is set.
  Word magic;
  std::atomic<uint32_t> version;
  std::atomic<int32_t> pid;
  Word capacity_bytes;  // Of the payload that follows the header.
  Word interval_ms;
  // Odd while a snapshot is being written; +2 per snapshot; 0: none yet.
  Word sequence;
  Word frame_bytes;                    // The encoded StatsReply frame's length.
  Word published_unix_ns;              // When the snapshot was taken.
  char socket_path[kSocketPathBytes];  // NUL-terminated; constant.
};
constexpr size_t kHeaderBytes = 256;  // The payload starts here.
static_assert(sizeof(PageHeader) <= kHeaderBytes);

// Upper bound of one encoded StatsReply with `workers` workers: the fixed
// part (tiers, latency histograms) is well under 4 KiB; each worker is
// its id, pid, uid, three 32-bit counts, two 64-bit gauges and a name of at
// most kMaxString bytes (with its 4-byte length).
size_t PayloadCapacity(uint32_t workers) {
  constexpr size_t kFixed = 4096;
  constexpr size_t kPerWorker = sizeof(WorkerId) + 5 * sizeof(uint32_t) +
                                2 * sizeof(uint64_t) + 4 + kMaxString;
  const size_t bytes = kFixed + size_t{workers} * kPerWorker;
  return (bytes + 7) / 8 * 8;
}

PageHeader* HeaderOf(std::byte* data) {
  return std::launder(reinterpret_cast<PageHeader*>(data));
}
const PageHeader* HeaderOf(const std::byte* data) {
  return std::launder(reinterpret_cast<const PageHeader*>(data));
}
Word* WordsOf(std::byte* data) {
  return std::launder(reinterpret_cast<Word*>(data + kHeaderBytes));
}
const Word* WordsOf(const std::byte* data) {
  return std::launder(reinterpret_cast<const Word*>(data + kHeaderBytes));
}

}  // namespace

std::string StatsPageName(const std::string& store) {
  return "/tierkv." + store + ".stats";
}

StatusOr<StatsPageWriter> StatsPageWriter::Create(
    const StatsPageOptions& options) {
  if (options.socket_path.size() >= kSocketPathBytes) {
    return Status::InvalidArgument("socket path too long for the stats page: " +
                                   options.socket_path);
  }
  // Another user's name is never taken over, live or not (root could):
  // that user's tierkv-admin would read this tierkvd's stats as its own.
  struct stat held {};
  if (lstat(("/dev/shm" + options.name).c_str(), &held) == 0 &&
      held.st_uid != geteuid()) {
    return Status::FailedPrecondition(
        "'" + options.name + "' in /dev/shm belongs to uid " +
        std::to_string(held.st_uid) + "; it is left alone");
  }
  // The store lock guards the socket's directory, not /dev/shm: another
  // tierkvd of the same store name, elsewhere, may be publishing here.
  if (StatusOr<StatsPageReader> live = StatsPageReader::Open(options.name);
      live.ok()) {
    StatusOr<StatsPageSnapshot> snapshot = live->Read();
    if (snapshot.ok() &&
        StatsPageIsFresh(*snapshot, std::chrono::system_clock::now())) {
      return Status::FailedPrecondition(
          "'" + options.name + "' is the page of the live tierkvd pid " +
          std::to_string(snapshot->pid) + " on " + snapshot->socket_path +
          " (another store of the same name)");
    }
  }
  const size_t capacity = PayloadCapacity(options.max_workers);
  TIERKV_ASSIGN_OR_RETURN(
      ShmSegment segment,
      ShmSegment::Create({.name = options.name,
                          .bytes = kHeaderBytes + capacity,
                          // Others may read; only this process writes.
                          .mode = static_cast<mode_t>(options.mode & 0444),
                          .group = options.group}));
  // The segment is fresh and zero-filled: construct the atomics in place.
  std::byte* data = segment.data();
  auto* header = new (data) PageHeader{};
  new (data + kHeaderBytes) Word[capacity / sizeof(uint64_t)]{};
  header->version.store(kPageVersion, std::memory_order_relaxed);
  header->pid.store(getpid(), std::memory_order_relaxed);
  header->capacity_bytes.store(capacity, std::memory_order_relaxed);
  header->interval_ms.store(static_cast<uint64_t>(options.interval.count()),
                            std::memory_order_relaxed);
  std::memcpy(header->socket_path, options.socket_path.c_str(),
              options.socket_path.size() + 1);
  header->magic.store(kPageMagic, std::memory_order_release);
  return StatsPageWriter(std::move(segment));
}

Status StatsPageWriter::Publish(const CoordinatorStats& stats,
                                std::chrono::system_clock::time_point now) {
  const std::vector<std::byte> frame = Encode(StatsReply{stats});
  PageHeader* header = HeaderOf(segment_.data());
  const size_t capacity =
      header->capacity_bytes.load(std::memory_order_relaxed);
  if (frame.size() > capacity) {
    return Status::ResourceExhausted(
        "stats snapshot of " + std::to_string(frame.size()) +
        " bytes exceeds the stats page's " + std::to_string(capacity));
  }
  Word* words = WordsOf(segment_.data());
  const uint64_t sequence = header->sequence.load(std::memory_order_relaxed);
  header->sequence.store(sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t offset = 0; offset < frame.size(); offset += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, frame.data() + offset,
                std::min(sizeof(word), frame.size() - offset));
    words[offset / sizeof(uint64_t)].store(word, std::memory_order_relaxed);
  }
  header->frame_bytes.store(frame.size(), std::memory_order_relaxed);
  header->published_unix_ns.store(
      static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(
              now.time_since_epoch())
              .count()),
      std::memory_order_relaxed);
  header->sequence.store(sequence + 2, std::memory_order_release);
  ++published_;
  return Status::Ok();
}

StatusOr<StatsPageReader> StatsPageReader::Open(
    const std::string& name, const std::string& socket_path) {
  TIERKV_ASSIGN_OR_RETURN(ShmSegment segment, ShmSegment::OpenReadOnly(name));
  const std::string not_a_page =
      "shared memory '" + name + "' is not a stats page of this tierkv";
  // Checked before a byte of it is read: another user's file could be
  // anything, and shrink under the mapping (SIGBUS).
  const uid_t owner = segment.file_owner();
  struct stat sock {};
  const bool trusted =
      owner == geteuid() || owner == 0 ||
      (!socket_path.empty() && stat(socket_path.c_str(), &sock) == 0 &&
       sock.st_uid == owner &&
       CheckDaemonUser(owner, socket_path, std::nullopt).ok());
  if (!trusted) {
    return Status::FailedPrecondition(
        "stats page '" + name + "' belongs to uid " + std::to_string(owner) +
        (socket_path.empty() ? ", not this user"
                             : ", not the tierkvd on " + socket_path));
  }
  if (segment.size() < kHeaderBytes) {
    return Status::FailedPrecondition(not_a_page + " (too small)");
  }
  const PageHeader* header = HeaderOf(segment.data());
  if (header->magic.load(std::memory_order_acquire) != kPageMagic) {
    // Also what a reader sees in the instant between creation and magic.
    return Status::FailedPrecondition(not_a_page + " (bad magic)");
  }
  const uint32_t version = header->version.load(std::memory_order_relaxed);
  if (version != kPageVersion) {
    return Status::FailedPrecondition(not_a_page + " (page version " +
                                      std::to_string(version) + ", expected " +
                                      std::to_string(kPageVersion) + ")");
  }
  const uint64_t capacity =
      header->capacity_bytes.load(std::memory_order_relaxed);
  if (capacity % sizeof(uint64_t) != 0 ||
      capacity > segment.size() - kHeaderBytes) {
    return Status::FailedPrecondition(not_a_page + " (bad capacity)");
  }
  return StatsPageReader(std::move(segment));
}

StatusOr<StatsPageSnapshot> StatsPageReader::Read(
    std::chrono::milliseconds patience) const {
  // A snapshot takes the writer microseconds, so the first tries only
  // yield; past them the publisher was descheduled mid-write (a loaded
  // machine, a stop), and the reader sleeps between tries until `patience`
  // is spent. A count of tries alone spans a few milliseconds on an idle
  // core: less than one time slice of a preempted publisher.
  constexpr int kYields = 64;
  constexpr auto kNap = std::chrono::microseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + patience;
  const std::byte* data = segment_.data();
  const PageHeader* header = HeaderOf(data);
  const Word* words = WordsOf(data);
  const uint64_t capacity =
      header->capacity_bytes.load(std::memory_order_relaxed);
  std::vector<uint64_t> copy;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      if (attempt < kYields) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kNap);
      }
    }
    const uint64_t before = header->sequence.load(std::memory_order_acquire);
    if (before == 0) {
      return Status::Unavailable("tierkvd has not published stats yet");
    }
    if (before % 2 != 0) continue;  // Being written.
    const uint64_t bytes = header->frame_bytes.load(std::memory_order_relaxed);
    if (bytes > capacity) continue;  // Torn; the sequence check would fail.
    copy.resize((bytes + 7) / 8);
    for (size_t i = 0; i < copy.size(); ++i) {
      copy[i] = words[i].load(std::memory_order_relaxed);
    }
    const uint64_t published_ns =
        header->published_unix_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header->sequence.load(std::memory_order_relaxed) != before) continue;

    StatusOr<Message> message = Decode(std::span<const std::byte>(
        reinterpret_cast<const std::byte*>(copy.data()), bytes));
    if (!message.ok()) {
      return Status::DataLoss("stats page does not decode: " +
                              message.status().message());
    }
    auto* reply = std::get_if<StatsReply>(&*message);
    if (reply == nullptr) {
      return Status::DataLoss("stats page holds a " +
                              std::string(MessageTypeName(TypeOf(*message))) +
                              ", not stats");
    }
    StatsPageSnapshot out;
    out.stats = std::move(reply->stats);
    out.published_at = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(published_ns)));
    out.interval = std::chrono::milliseconds(
        header->interval_ms.load(std::memory_order_relaxed));
    out.pid = header->pid.load(std::memory_order_relaxed);
    out.socket_path.assign(
        header->socket_path,
        strnlen(header->socket_path, sizeof(header->socket_path)));
    return out;
  }
  return Status::Unavailable("the stats page was mid-update" +
                             (patience.count() == 0
                                  ? std::string(" at the one try")
                                  : " throughout " +
                                        std::to_string(patience.count()) +
                                        " ms of tries") +
                             " (its tierkvd may be stopped or stuck)");
}

bool StatsPageIsFresh(const StatsPageSnapshot& snapshot,
                      std::chrono::system_clock::time_point now) {
  // EPERM: alive, run by another user.
  if (snapshot.pid <= 0 || (kill(snapshot.pid, 0) != 0 && errno != EPERM)) {
    return false;
  }
  const auto limit = std::max<std::chrono::system_clock::duration>(
      std::chrono::seconds(3), 10 * snapshot.interval);
  return now - snapshot.published_at <= limit;
}

}  // namespace tierkv::ipc
