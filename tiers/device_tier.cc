// EmulatedDeviceTier: an anonymous private mapping stands in for device
// memory, and the CopyEngine's thread plays the DMA engine (jobs strictly in
// submission order, an empty job a fence: tiers/copy_engine.h).
//
// Decisions the header leaves open:
// - Arena pages are faulted in on first touch, not at Create: a worker may
//   size its pool generously and pay only for what it uses.
// - The caller keeps each job's host memory alive and untouched until its
//   completion is returned, or until the tier is destroyed (the destructor
//   runs every queued job first).
#include "tierkv/device_tier.h"

#include <sys/mman.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "tiers/copy_engine.h"

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

  // Drains and stops the copy engine before the arena goes.
  ~Impl() {
    engine.reset();
    if (owns_arena) munmap(arena, arena_bytes);
  }

  std::byte* BlockAddress(BlockId id) const {
    return arena + static_cast<size_t>(id) * block_bytes;
  }

  void Execute(const CopyJob& job) const;

  // Immutable after Create; read by any thread.
  std::byte* const arena;
  const size_t arena_bytes;
  const int32_t num_blocks;
  const size_t block_bytes;
  const bool owns_arena;  // False: the engine's memory (CreateOver).

  // Set last in Start, reset first in ~Impl.
  std::unique_ptr<CopyEngine> engine;
};

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
  auto execute = [raw = impl.get()](const CopyJob& job) { raw->Execute(job); };
  TIERKV_ASSIGN_OR_RETURN(impl->engine, CopyEngine::Start(std::move(execute)));
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
  TIERKV_RETURN_IF_ERROR(ValidateCopyJob(job, impl_->num_blocks));
  impl_->engine->Submit(std::move(job));
  return Status::Ok();
}

std::vector<CopyCompletion> EmulatedDeviceTier::PollCompleted() {
  return impl_->engine->Poll();
}

std::vector<CopyCompletion> EmulatedDeviceTier::WaitCompleted(
    std::chrono::milliseconds timeout) {
  return impl_->engine->Wait(timeout);
}

size_t EmulatedDeviceTier::in_flight() const {
  return impl_->engine->in_flight();
}

bool EmulatedDeviceTier::SetCompletionNotify(std::function<void()> notify) {
  impl_->engine->SetNotify(std::move(notify));
  return true;
}

size_t EmulatedDeviceTier::RunQueuedCopies() {
  return impl_->engine->RunQueued();
}

Status EmulatedDeviceTier::SubmitForWaiter(CopyJob job) {
  TIERKV_RETURN_IF_ERROR(ValidateCopyJob(job, impl_->num_blocks));
  impl_->engine->Submit(std::move(job), /*wake=*/false);
  return Status::Ok();
}

void EmulatedDeviceTier::KickQueuedCopies() { impl_->engine->Kick(); }

}  // namespace tierkv
