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
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "tierkv/kv_layout.h"
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
  // Asks the tier to call `notify` each time a job completes (on the tier's
  // own thread, after the completion can be polled), so that a caller can
  // sleep on its completions and on other events at once: Client::
  // WaitEvents waits on an eventfd that `notify` writes and on tierkvd's
  // readiness signal. `notify` must be quick and must not call the tier.
  // Replaces the earlier callback; null removes it, and once that call
  // returns the old callback is not running and will not run again. Returns
  // false when the tier cannot notify (the default): callers then wait with
  // WaitCompleted.
  virtual bool SetCompletionNotify(std::function<void()> notify) {
    (void)notify;
    return false;
  }
  // Runs jobs still queued on the calling thread, in submission order,
  // while the tier's own engine is idle; returns how many ran. For a
  // caller about to sleep until its copies complete (Client::WaitEvents):
  // the bytes move at once instead of after a thread hand-off and back.
  // They complete as any job does (PollCompleted returns them) except that
  // the SetCompletionNotify callback is not called for them: the caller
  // polls. The default runs none (a DMA engine cannot be helped).
  virtual size_t RunQueuedCopies() { return 0; }
  // Submit for a caller that waits for the job at once: the tier's engine
  // is not woken for it, so the caller's RunQueuedCopies runs it without
  // another thread taking it first. The caller must then call
  // RunQueuedCopies or KickQueuedCopies (a later Submit, WaitCompleted and
  // the destructor run it too). The default is Submit.
  virtual Status SubmitForWaiter(CopyJob job) { return Submit(std::move(job)); }
  // Wakes the tier's engine for jobs SubmitForWaiter left queued.
  virtual void KickQueuedCopies() {}
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
  bool SetCompletionNotify(std::function<void()> notify) override;
  size_t RunQueuedCopies() override;
  Status SubmitForWaiter(CopyJob job) override;
  void KickQueuedCopies() override;

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

// The KV memory of one attention layer in an engine's device pool, as the
// engine allocated it: for device block b, its K plane starts at
// key + b * block_stride and its V plane at value + b * block_stride; within
// a block, token t's heads start at t * token_stride, heads and head_dim
// densely packed (num_heads * head_dim elements). Covers vLLM's paged layout
// ([2, num_blocks, block_size, heads, head_dim] per layer: key = &t[0],
// value = &t[1], block_stride = block_size * heads * head_dim elements),
// FlashInfer's ([num_blocks, 2, ...]), a cross-layer pool
// ([num_blocks, layers, 2, block_size, heads, head_dim], one block of every
// layer contiguous) and a host pool with the token dimension outside the
// layer one (token_stride = layers * heads * head_dim elements).
struct LayerMemory {
  std::byte* key = nullptr;
  std::byte* value = nullptr;
  size_t block_stride = 0;  // Bytes between consecutive device blocks.
  // Bytes between consecutive tokens of a block. Default (0): the heads of
  // one token, densely packed (num_heads * head_dim elements).
  size_t token_stride = 0;
};

struct RegisteredDeviceOptions {
  // The model's whole KV layout, every KV head: the host slots' geometry
  // (block_bytes() == layout.BlockBytes()). Required.
  KvLayout layout;
  int32_t num_blocks = 0;  // Device blocks, [0, num_blocks). Required.
  // One per layer (layout.num_layers), in layer order. Required.
  std::vector<LayerMemory> layers = {};
  // The KV heads this memory holds: [first_head, first_head + num_heads) of
  // layout.num_kv_heads, the shard of one tensor-parallel rank. Its copies
  // read and write only those heads of each host block, so the ranks of a
  // group together fill one host block, the same bytes a single worker with
  // every head stores. Default: every head (num_heads 0 means every head
  // from first_head on).
  int32_t first_head = 0;
  int32_t num_heads = 0;
};

// A device tier over memory the engine registered (RegisteredDeviceOptions):
// its copies scatter and gather the K and V planes of each layer between the
// engine's blocks and the host slots, one run of this shard's heads per token
// and plane. On a machine without a GPU the memory is host memory (a numpy
// array or a torch CPU tensor, for instance) and a copy thread runs the jobs
// in submission order with memcpy; a CUDA backend implements the same
// interface over cudaMemcpyAsync on the engine's streams. The memory must
// outlive the tier; the destructor drains queued jobs.
class RegisteredDeviceTier final : public DeviceTier {
 public:
  // InvalidArgument naming the field for an invalid layout, num_blocks < 1,
  // a layer count other than layout.num_layers, a null base pointer, a
  // head range outside the layout, or strides too small to hold what they
  // step over (blocks that would overlap).
  static StatusOr<std::unique_ptr<RegisteredDeviceTier>> Create(
      RegisteredDeviceOptions options);
  ~RegisteredDeviceTier() override;

  int32_t num_blocks() const override;
  size_t block_bytes() const override;  // layout.BlockBytes(), the host's.
  Status Submit(CopyJob job) override;
  std::vector<CopyCompletion> PollCompleted() override;
  std::vector<CopyCompletion> WaitCompleted(
      std::chrono::milliseconds timeout) override;
  size_t in_flight() const override;
  bool SetCompletionNotify(std::function<void()> notify) override;
  size_t RunQueuedCopies() override;
  Status SubmitForWaiter(CopyJob job) override;
  void KickQueuedCopies() override;

  // The options as given, with num_heads and each layer's token_stride
  // resolved (never 0).
  const RegisteredDeviceOptions& options() const;
  // Bytes one block moves between this memory and a host slot: the shard's
  // share of block_bytes().
  size_t shard_bytes() const;

 private:
  struct Impl;
  explicit RegisteredDeviceTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_DEVICE_TIER_H_
