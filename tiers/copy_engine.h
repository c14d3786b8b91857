// CopyEngine: the job queue and copy thread behind the device tiers whose
// "device" memory is host memory (EmulatedDeviceTier, RegisteredDeviceTier).
// One thread plays the DMA engine: it runs jobs strictly in submission order,
// as one CUDA stream would, so a load submitted after a store of the same
// host slot sees the stored bytes, and a job with no blocks is a fence. A
// caller about to wait for its copies may run queued jobs itself
// (RunQueued) while the thread is idle; one job runs at a time either way,
// so the order holds. The
// tier supplies how one job's bytes move (the executor); the engine owns
// queueing, completion and the drain on destruction.
// Thread-safety: Submit, Poll, Wait and in_flight may be called from any
// thread. Internal to tiers/; never installed.
#ifndef TIERKV_TIERS_COPY_ENGINE_H_
#define TIERKV_TIERS_COPY_ENGINE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "src/mutex.h"
#include "tierkv/device_tier.h"
#include "tierkv/status.h"

namespace tierkv {

// OK, or InvalidArgument saying what is wrong with `job` for a tier of
// `num_blocks` device blocks: lists of different lengths, a device block
// outside [0, num_blocks), a null host pointer. What DeviceTier::Submit
// refuses before anything is queued.
Status ValidateCopyJob(const CopyJob& job, int32_t num_blocks);

class CopyEngine {
 public:
  // Moves one job's bytes; runs on the copy thread, one job at a time. It
  // cannot fail: the tier validated the job at Submit.
  using Executor = std::function<void(const CopyJob&)>;

  // Starts the copy thread; ResourceExhausted when it cannot be started.
  static StatusOr<std::unique_ptr<CopyEngine>> Start(Executor execute);
  // Runs every job still queued, then stops the thread; the executor's
  // memory must still be valid.
  ~CopyEngine();

  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Queues a job the caller has validated; with `wake` false the thread is
  // not woken for it (DeviceTier::SubmitForWaiter): a RunQueued caller,
  // Kick, Wait, a later Submit or the destructor gets it run.
  void Submit(CopyJob job, bool wake = true) TIERKV_EXCLUDES(mu_);
  // Wakes the thread for jobs queued without waking it.
  void Kick();
  // DeviceTier::PollCompleted, WaitCompleted and in_flight.
  std::vector<CopyCompletion> Poll() TIERKV_EXCLUDES(mu_);
  std::vector<CopyCompletion> Wait(std::chrono::milliseconds timeout)
      TIERKV_EXCLUDES(mu_);
  size_t in_flight() const TIERKV_EXCLUDES(mu_);
  // DeviceTier::RunQueuedCopies: runs queued jobs on the calling thread
  // while no job is running, each completed as the thread completes it but
  // without the notify callback (the caller polls for them); returns how
  // many ran.
  size_t RunQueued() TIERKV_EXCLUDES(mu_);
  // DeviceTier::SetCompletionNotify.
  void SetNotify(std::function<void()> notify) TIERKV_EXCLUDES(notify_mu_);

 private:
  explicit CopyEngine(Executor execute);
  void Run() TIERKV_EXCLUDES(mu_);
  // Runs `job` (taken from the queue with running_ set) without the lock,
  // then completes it, clears running_ and, with `notify`, calls notify_.
  void Execute(const CopyJob& job, bool notify) TIERKV_EXCLUDES(mu_);
  std::vector<CopyCompletion> TakeCompletedLocked() TIERKV_REQUIRES(mu_);

  const Executor execute_;

  mutable Mutex mu_;
  CondVar work_cv_;  // Signals queue_ non-empty or stopping_.
  CondVar done_cv_;  // Signals completed_ non-empty.
  std::deque<CopyJob> queue_ TIERKV_GUARDED_BY(mu_);
  std::vector<CopyCompletion> completed_ TIERKV_GUARDED_BY(mu_);
  size_t in_flight_ TIERKV_GUARDED_BY(mu_) = 0;
  // A job is being executed (by the thread or a RunQueued caller).
  bool running_ TIERKV_GUARDED_BY(mu_) = false;
  bool stopping_ TIERKV_GUARDED_BY(mu_) = false;
  // Held while the callback runs, so SetNotify(nullptr) returns only once
  // no call of the old one is running.
  Mutex notify_mu_;
  std::function<void()> notify_ TIERKV_GUARDED_BY(notify_mu_);

  // Started last in Start, joined first in the destructor.
  std::thread thread_;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_COPY_ENGINE_H_
