#include "ipc/channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace tierkv::ipc {
namespace {

constexpr uint64_t kChannelMagic = 0x314C4E4843564B54ull;  // "TKVCHNL1"
constexpr uint32_t kChannelVersion = 1;
constexpr size_t kBuffersOffset = 4096;
// How long a waiting side spins before it sleeps on the futex: long enough
// to cover a typical request's service time, short enough that an idle side
// costs nothing.
constexpr auto kSpin = std::chrono::microseconds(50);

static_assert(std::atomic<uint32_t>::is_always_lock_free);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::milliseconds timeout) {
  timespec ts{};
  ts.tv_sec = timeout.count() / 1000;
  ts.tv_nsec = (timeout.count() % 1000) * 1000000;
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX,
          nullptr, nullptr, 0);
}

// Waits until *seq differs from `seen`. Spins for kSpin, then sleeps on the
// futex with `waiting` raised so the writer knows to wake it. Returns false
// when `keep_waiting` says to give up after a timed-out sleep.
// The spin yields the CPU on every turn: when both sides share one CPU (a
// busy host), a pause-only spin would keep the other side from running and
// cost a whole spin per message; a yield hands it the CPU at once, and costs
// little when the other side runs elsewhere.
template <typename KeepWaiting>
bool WaitForChange(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* waiting,
                   uint32_t seen, std::chrono::milliseconds poll,
                   KeepWaiting keep_waiting) {
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (uint32_t i = 0;; ++i) {
    if (seq->load(std::memory_order_acquire) != seen) return true;
    sched_yield();
    if ((i & 7) == 7 && std::chrono::steady_clock::now() > spin_until) break;
  }
  for (;;) {
    waiting->store(1, std::memory_order_seq_cst);
    if (seq->load(std::memory_order_seq_cst) == seen) {
      FutexWait(seq, seen, poll);
    }
    waiting->store(0, std::memory_order_relaxed);
    if (seq->load(std::memory_order_acquire) != seen) return true;
    if (!keep_waiting()) return false;
  }
}

// Publishes a new sequence value and wakes the reader if it sleeps. The
// seq_cst store and load pair with WaitForChange's, so a wake-up is never
// lost.
void Publish(std::atomic<uint32_t>* seq, std::atomic<uint32_t>* waiting,
             uint32_t value) {
  seq->store(value, std::memory_order_seq_cst);
  if (waiting->load(std::memory_order_seq_cst) != 0) FutexWake(seq);
}

}  // namespace

struct ControlChannel::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  // Written by the worker.
  alignas(64) std::atomic<uint32_t> request_seq;
  uint32_t request_len;
  std::atomic<uint32_t> response_waiting;  // The worker sleeps.
  // Written by tierkvd.
  alignas(64) std::atomic<uint32_t> response_seq;
  uint32_t response_len;
  std::atomic<uint32_t> request_waiting;  // tierkvd sleeps.
};
ControlChannel::ControlChannel(ShmSegment segment, uint32_t capacity)
    : segment_(std::move(segment)), capacity_(capacity) {
  static_assert(sizeof(Header) <= kBuffersOffset);
}

ControlChannel::Header* ControlChannel::header() const {
  return reinterpret_cast<Header*>(segment_.data());
}
std::byte* ControlChannel::request_buffer() const {
  return segment_.data() + kBuffersOffset;
}
std::byte* ControlChannel::response_buffer() const {
  return segment_.data() + kBuffersOffset + capacity_;
}
uint32_t ControlChannel::capacity() const { return capacity_; }

StatusOr<ControlChannel> ControlChannel::Create(uint32_t capacity,
                                                const std::string& label) {
  if (capacity < 4096) {
    return Status::InvalidArgument("control channel capacity below 4 KiB");
  }
  TIERKV_ASSIGN_OR_RETURN(
      ShmSegment segment,
      ShmSegment::CreateSealed(
          kBuffersOffset + 2 * static_cast<size_t>(capacity), label));
  // Taken now, so that a machine out of memory refuses the registration
  // (ResourceExhausted) instead of SIGBUS in tierkvd or the worker.
  TIERKV_RETURN_IF_ERROR(segment.Reserve(0, segment.size()));
  auto* h = new (segment.data()) Header{};
  h->version = kChannelVersion;
  h->capacity = capacity;
  __atomic_store_n(&h->magic, kChannelMagic, __ATOMIC_RELEASE);
  return ControlChannel(std::move(segment), capacity);
}

StatusOr<ControlChannel> ControlChannel::Open(int segment_fd) {
  TIERKV_ASSIGN_OR_RETURN(ShmSegment segment,
                          ShmSegment::MapSealed(segment_fd, /*writable=*/true));
  if (segment.size() < kBuffersOffset) {
    return Status::FailedPrecondition(
        "the segment passed is not a tierkv control channel");
  }
  const auto* h = reinterpret_cast<const Header*>(segment.data());
  // Read once: the other process may write the header meanwhile, and a
  // plain read could be read again after the check.
  const uint32_t capacity = __atomic_load_n(&h->capacity, __ATOMIC_RELAXED);
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != kChannelMagic ||
      h->version != kChannelVersion ||
      segment.size() < kBuffersOffset + 2 * static_cast<size_t>(capacity)) {
    return Status::FailedPrecondition(
        "the segment passed is not a tierkv control channel of version " +
        std::to_string(kChannelVersion));
  }
  return ControlChannel(std::move(segment), capacity);
}

Status ControlChannel::Call(std::span<const std::byte> request,
                            std::vector<std::byte>* response,
                            const std::function<bool()>& alive,
                            std::chrono::steady_clock::time_point deadline,
                            std::chrono::milliseconds poll) {
  TIERKV_RETURN_IF_ERROR(Post(request));
  return AwaitResponse(response, alive, deadline, poll);
}

Status ControlChannel::Post(std::span<const std::byte> request) {
  Header* h = header();
  if (request.size() > capacity_) {
    return Status::InvalidArgument(
        "message of " + std::to_string(request.size()) +
        " bytes exceeds the control channel's " + std::to_string(capacity_));
  }
  std::memcpy(request_buffer(), request.data(), request.size());
  h->request_len = static_cast<uint32_t>(request.size());
  response_seq_seen_ = h->response_seq.load(std::memory_order_acquire);
  Publish(&h->request_seq, &h->request_waiting,
          h->request_seq.load(std::memory_order_relaxed) + 1);
  return Status::Ok();
}

Status ControlChannel::AwaitResponse(
    std::vector<std::byte>* response, const std::function<bool()>& alive,
    std::chrono::steady_clock::time_point deadline,
    std::chrono::milliseconds poll) {
  Header* h = header();
  bool late = false;
  const auto keep_waiting = [&] {
    if (std::chrono::steady_clock::now() >= deadline) {
      late = true;
      return false;
    }
    return alive();
  };
  // A deadline closer than one poll sleeps only until the deadline.
  const auto now = std::chrono::steady_clock::now();
  if (deadline - now < poll) {
    poll = std::max(
        std::chrono::milliseconds(1),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
  }
  if (!WaitForChange(&h->response_seq, &h->response_waiting, response_seq_seen_,
                     poll, keep_waiting)) {
    return late ? Status::DeadlineExceeded("tierkvd did not answer in time")
                : Status::Unavailable("tierkvd went away during a call");
  }
  const uint32_t len = __atomic_load_n(&h->response_len, __ATOMIC_RELAXED);
  if (len > capacity_) {
    return Status::DataLoss("response length " + std::to_string(len) +
                            " exceeds the channel");
  }
  response->assign(response_buffer(), response_buffer() + len);
  return Status::Ok();
}

bool ControlChannel::Receive(std::vector<std::byte>* request,
                             const std::atomic<bool>& stop,
                             std::chrono::milliseconds poll) {
  Header* h = header();
  const bool got = WaitForChange(
      &h->request_seq, &h->request_waiting, last_request_seq_, poll,
      [&stop] { return !stop.load(std::memory_order_relaxed); });
  if (!got || stop.load(std::memory_order_relaxed)) return false;
  last_request_seq_ = h->request_seq.load(std::memory_order_acquire);
  // Read once (the worker may change it): checked, then used.
  const uint32_t len = __atomic_load_n(&h->request_len, __ATOMIC_RELAXED);
  if (len > capacity_) {
    request->clear();
  } else {
    request->assign(request_buffer(), request_buffer() + len);
  }
  return true;
}

Status ControlChannel::Respond(std::span<const std::byte> response) {
  Header* h = header();
  if (response.size() > capacity_) {
    return Status::InvalidArgument(
        "response of " + std::to_string(response.size()) +
        " bytes exceeds the control channel's " + std::to_string(capacity_));
  }
  std::memcpy(response_buffer(), response.data(), response.size());
  h->response_len = static_cast<uint32_t>(response.size());
  Publish(&h->response_seq, &h->response_waiting,
          h->response_seq.load(std::memory_order_relaxed) + 1);
  return Status::Ok();
}

void ControlChannel::WakeReceiver() {
  // A wake alone is lost on a receiver between its last check and its
  // futex sleep; a changed sequence word is not. Receive then sees the stop
  // flag and serves nothing.
  Header* h = header();
  h->request_seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(&h->request_seq);
}

}  // namespace tierkv::ipc
