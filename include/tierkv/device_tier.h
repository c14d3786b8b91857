// DeviceTier: the worker's device memory (the engine's main KV pool) as seen
// by tierkv's copy path, behind one interface so that a CUDA backend can sit
// where the emulated one does today. Copies between device blocks and host
// tier slots are submitted as jobs and complete asynchronously, one
// completion per job (a job is one load or store event).
// Thread-safety: Submit, PollCompleted and WaitCompleted may be called from
// any thread; the copy engine runs on its own thread(s).
#ifndef TIERKV_INCLUDE_TIERKV_DEVICE_TIER_H_
#define TIERKV_INCLUDE_TIERKV_DEVICE_TIER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

enum class CopyDirection : uint8_t {
  kDeviceToHost,  // A store event: device block -> host slot.
  kHostToDevice,  // A load event: host slot -> device block.
};

// One event's copies: device_blocks[i] <-> host_blocks[i], block_bytes each.
struct CopyJob {
  uint64_t tag = 0;  // The caller's reference, handed back on completion.
  CopyDirection direction = CopyDirection::kDeviceToHost;
  std::vector<BlockId> device_blocks = {};
  std::vector<std::byte*> host_blocks = {};  // Same length as device_blocks.
};

struct CopyCompletion {
  uint64_t tag = 0;
  Status status;  // OK, or why the copy did not happen.
};

class DeviceTier {
 public:
  virtual ~DeviceTier() = default;

  virtual int32_t num_blocks() const = 0;
  virtual size_t block_bytes() const = 0;

  // Queues a job and returns at once. InvalidArgument (nothing queued) when
  // the lists differ in length, a device block is out of range or a host
  // pointer is null. A job with no blocks is allowed: it completes in order
  // like any other, a fence. Host memory must stay valid until the job's
  // completion is returned.
  virtual Status Submit(CopyJob job) = 0;
  // Jobs finished since the last call, in completion order; never blocks.
  virtual std::vector<CopyCompletion> PollCompleted() = 0;
  // Waits until at least one job has finished or `timeout` passes, then
  // returns what finished (possibly nothing on timeout).
  virtual std::vector<CopyCompletion> WaitCompleted(
      std::chrono::milliseconds timeout) = 0;
  // Jobs submitted whose completion has not been returned yet.
  virtual size_t in_flight() const = 0;
};

// Emulated device: a private, page-aligned arena in the worker's memory (or
// memory the engine owns, CreateOver) and a copy engine thread that executes
// jobs in submission order with memcpy. The destructor drains queued jobs.
class EmulatedDeviceTier final : public DeviceTier {
 public:
  // InvalidArgument for num_blocks < 1 or block_bytes == 0;
  // ResourceExhausted when the arena cannot be allocated.
  static StatusOr<std::unique_ptr<EmulatedDeviceTier>> Create(
      int32_t num_blocks, size_t block_bytes);
  // Over memory the engine owns (e.g. the KV its model reads and writes):
  // block i is memory[i * block_bytes, +block_bytes). The memory must
  // outlive the tier. InvalidArgument when it is too small.
  static StatusOr<std::unique_ptr<EmulatedDeviceTier>> CreateOver(
      std::span<std::byte> memory, int32_t num_blocks, size_t block_bytes);
  ~EmulatedDeviceTier() override;

  int32_t num_blocks() const override;
  size_t block_bytes() const override;
  Status Submit(CopyJob job) override;
  std::vector<CopyCompletion> PollCompleted() override;
  std::vector<CopyCompletion> WaitCompleted(
      std::chrono::milliseconds timeout) override;
  size_t in_flight() const override;

  // The memory of one device block. On a real GPU this is device memory the
  // engine's kernels write; here the engine (and tests) write it directly.
  // REQUIRES: 0 <= id < num_blocks().
  std::span<std::byte> block(BlockId id);

 private:
  struct Impl;
  explicit EmulatedDeviceTier(std::unique_ptr<Impl> impl);
  // Starts the copy engine thread.
  static StatusOr<std::unique_ptr<EmulatedDeviceTier>> Start(
      std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_DEVICE_TIER_H_
