// EmulatedDeviceTier: an anonymous private mapping stands in for device
// memory, and one copy-engine thread plays the DMA engine. Jobs run strictly
// in submission order, so a load submitted after a store of the same host
// slot sees the stored bytes, as on one CUDA stream.
//
// Decisions the header leaves open:
// - A job with no blocks is valid: it completes in order like any other job
//   (a fence: its completion means every earlier job has finished).
// - Arena pages are faulted in on first touch, not at Create: a worker may
//   size its pool generously and pay only for what it uses.
// - The caller keeps each job's host memory alive and untouched until its
//   completion is returned, or until the tier is destroyed (the destructor
//   runs every queued job first).
#include "tierkv/device_tier.h"

#include <sys/mman.h>

#include <cassert>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "src/mutex.h"

namespace tierkv {
namespace {

constexpr size_t kArenaAlignment = 4096;
// Large enough that transparent huge pages can pay off (fewer TLB misses).
constexpr size_t kHugePageBytes = size_t{2} << 20;

std::string ErrnoText(int err) {
  return std::error_code(err, std::generic_category()).message();
}

}  // namespace

struct EmulatedDeviceTier::Impl {
  Impl(std::byte* arena, size_t arena_bytes, int32_t num_blocks,
       size_t block_bytes, bool owns_arena)
      : arena(arena),
        arena_bytes(arena_bytes),
        num_blocks(num_blocks),
        block_bytes(block_bytes),
        owns_arena(owns_arena) {}

  // Stops the copy engine once the queue is empty, then frees the arena.
  ~Impl() {
    if (engine.joinable()) {
      {
        MutexLock lock(&mu);
        stopping = true;
      }
      work_cv.NotifyOne();
      engine.join();
    }
    if (owns_arena) munmap(arena, arena_bytes);
  }

  std::byte* BlockAddress(BlockId id) const {
    return arena + static_cast<size_t>(id) * block_bytes;
  }

  Status Validate(const CopyJob& job) const;
  void RunCopyEngine() TIERKV_EXCLUDES(mu);
  void Execute(const CopyJob& job) const;
  std::vector<CopyCompletion> TakeCompletedLocked() TIERKV_REQUIRES(mu);

  // Immutable after Create; read by any thread without the lock.
  std::byte* const arena;
  const size_t arena_bytes;
  const int32_t num_blocks;
  const size_t block_bytes;
  const bool owns_arena;  // False: the engine's memory (CreateOver).

  mutable Mutex mu;
  CondVar work_cv;  // Signals queue non-empty or stopping.
  CondVar done_cv;  // Signals completed non-empty.
  std::deque<CopyJob> queue TIERKV_GUARDED_BY(mu);
  std::vector<CopyCompletion> completed TIERKV_GUARDED_BY(mu);
  size_t in_flight TIERKV_GUARDED_BY(mu) = 0;
  bool stopping TIERKV_GUARDED_BY(mu) = false;

  // Started last in Create, joined first in ~Impl.
  std::thread engine;
};

Status EmulatedDeviceTier::Impl::Validate(const CopyJob& job) const {
  // Built only on the error path: Submit is on the hot path.
  auto where = [&job] {
    return "copy job (tag " + std::to_string(job.tag) + ")";
  };
  if (job.device_blocks.size() != job.host_blocks.size()) {
    return Status::InvalidArgument(
        where() + " has " + std::to_string(job.device_blocks.size()) +
        " device blocks but " + std::to_string(job.host_blocks.size()) +
        " host blocks");
  }
  for (size_t i = 0; i < job.device_blocks.size(); ++i) {
    const BlockId id = job.device_blocks[i];
    if (id < 0 || id >= num_blocks) {
      return Status::InvalidArgument(where() + ": device block " +
                                     std::to_string(id) + " at index " +
                                     std::to_string(i) + " is outside [0, " +
                                     std::to_string(num_blocks) + ")");
    }
    if (job.host_blocks[i] == nullptr) {
      return Status::InvalidArgument(where() + ": host block at index " +
                                     std::to_string(i) + " is null");
    }
  }
  return Status::Ok();
}

void EmulatedDeviceTier::Impl::RunCopyEngine() {
  for (;;) {
    CopyJob job;
    {
      MutexLock lock(&mu);
      while (!stopping && queue.empty()) work_cv.Wait(&mu);
      if (queue.empty()) return;  // Stopping, and every job has run.
      job = std::move(queue.front());
      queue.pop_front();
    }
    Execute(job);  // Without the lock: Submit and Poll stay responsive.
    {
      MutexLock lock(&mu);
      completed.push_back(CopyCompletion{job.tag, Status::Ok()});
    }
    done_cv.NotifyAll();
  }
}

void EmulatedDeviceTier::Impl::Execute(const CopyJob& job) const {
  const bool store = job.direction == CopyDirection::kDeviceToHost;
  for (size_t i = 0; i < job.device_blocks.size(); ++i) {
    std::byte* device = BlockAddress(job.device_blocks[i]);
    std::byte* host = job.host_blocks[i];
    if (store) {
      std::memcpy(host, device, block_bytes);
    } else {
      std::memcpy(device, host, block_bytes);
    }
  }
}

std::vector<CopyCompletion> EmulatedDeviceTier::Impl::TakeCompletedLocked() {
  std::vector<CopyCompletion> out;
  out.swap(completed);
  in_flight -= out.size();
  return out;
}

StatusOr<std::unique_ptr<EmulatedDeviceTier>> EmulatedDeviceTier::Create(
    int32_t num_blocks, size_t block_bytes) {
  if (num_blocks < 1) {
    return Status::InvalidArgument(
        "device tier needs at least one block, got " +
        std::to_string(num_blocks));
  }
  if (block_bytes == 0) {
    return Status::InvalidArgument("device tier block_bytes must be > 0");
  }
  const std::string shape = std::to_string(num_blocks) + " blocks x " +
                            std::to_string(block_bytes) + " bytes";
  const size_t max = std::numeric_limits<size_t>::max();
  const size_t count = static_cast<size_t>(num_blocks);
  if (block_bytes > (max - (kArenaAlignment - 1)) / count) {
    return Status::ResourceExhausted("device arena of " + shape +
                                     " does not fit in the address space");
  }
  const size_t bytes =
      (count * block_bytes + kArenaAlignment - 1) & ~(kArenaAlignment - 1);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    return Status::ResourceExhausted("cannot map device arena of " + shape +
                                     " (" + std::to_string(bytes) +
                                     " bytes): " + ErrnoText(err));
  }
  if (bytes >= kHugePageBytes) {
    // Best effort: without huge pages the arena still works, just with more
    // TLB misses on large copies.
    (void)madvise(mem, bytes, MADV_HUGEPAGE);
  }
  return Start(std::make_unique<Impl>(static_cast<std::byte*>(mem), bytes,
                                      num_blocks, block_bytes,
                                      /*owns_arena=*/true));
}

StatusOr<std::unique_ptr<EmulatedDeviceTier>> EmulatedDeviceTier::CreateOver(
    std::span<std::byte> memory, int32_t num_blocks, size_t block_bytes) {
  if (num_blocks < 1 || block_bytes == 0 ||
      memory.size() / block_bytes < static_cast<size_t>(num_blocks)) {
    return Status::InvalidArgument(
        "device tier over " + std::to_string(memory.size()) +
        " bytes cannot hold " + std::to_string(num_blocks) + " blocks of " +
        std::to_string(block_bytes) + " bytes");
  }
  return Start(std::make_unique<Impl>(memory.data(), memory.size(), num_blocks,
                                      block_bytes,
                                      /*owns_arena=*/false));
}

StatusOr<std::unique_ptr<EmulatedDeviceTier>> EmulatedDeviceTier::Start(
    std::unique_ptr<Impl> impl) {
  try {
    impl->engine = std::thread([raw = impl.get()] { raw->RunCopyEngine(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(
        std::string("cannot start the device copy engine thread: ") + e.what());
  }
  return std::unique_ptr<EmulatedDeviceTier>(
      new EmulatedDeviceTier(std::move(impl)));
}

EmulatedDeviceTier::EmulatedDeviceTier(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

EmulatedDeviceTier::~EmulatedDeviceTier() = default;

int32_t EmulatedDeviceTier::num_blocks() const { return impl_->num_blocks; }

size_t EmulatedDeviceTier::block_bytes() const { return impl_->block_bytes; }

std::span<std::byte> EmulatedDeviceTier::block(BlockId id) {
  assert(id >= 0 && id < impl_->num_blocks);
  return {impl_->BlockAddress(id), impl_->block_bytes};
}

Status EmulatedDeviceTier::Submit(CopyJob job) {
  TIERKV_RETURN_IF_ERROR(impl_->Validate(job));
  {
    MutexLock lock(&impl_->mu);
    impl_->queue.push_back(std::move(job));
    ++impl_->in_flight;
  }
  impl_->work_cv.NotifyOne();
  return Status::Ok();
}

std::vector<CopyCompletion> EmulatedDeviceTier::PollCompleted() {
  MutexLock lock(&impl_->mu);
  return impl_->TakeCompletedLocked();
}

std::vector<CopyCompletion> EmulatedDeviceTier::WaitCompleted(
    std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  const Clock::time_point now = Clock::now();
  // now + timeout would overflow for "wait forever" timeouts such as
  // milliseconds::max(); those wait without a deadline.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::time_point::max() - now);
  if (timeout >= room) {
    while (s.completed.empty()) s.done_cv.Wait(&s.mu);
  } else {
    const Clock::time_point deadline = now + timeout;
    while (s.completed.empty()) {
      if (!s.done_cv.WaitUntil(&s.mu, deadline)) break;  // Timed out.
    }
  }
  return s.TakeCompletedLocked();
}

size_t EmulatedDeviceTier::in_flight() const {
  MutexLock lock(&impl_->mu);
  return impl_->in_flight;
}

}  // namespace tierkv
