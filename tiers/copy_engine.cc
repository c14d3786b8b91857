#include "tiers/copy_engine.h"

#include <string>
#include <system_error>
#include <utility>

namespace tierkv {

Status ValidateCopyJob(const CopyJob& job, int32_t num_blocks) {
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

StatusOr<std::unique_ptr<CopyEngine>> CopyEngine::Start(Executor execute) {
  std::unique_ptr<CopyEngine> engine(new CopyEngine(std::move(execute)));
  try {
    engine->thread_ = std::thread([raw = engine.get()] { raw->Run(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(
        std::string("cannot start the device copy engine thread: ") + e.what());
  }
  return engine;
}

CopyEngine::CopyEngine(Executor execute) : execute_(std::move(execute)) {}

CopyEngine::~CopyEngine() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.NotifyOne();
  thread_.join();
}

void CopyEngine::Run() {
  for (;;) {
    CopyJob job;
    {
      MutexLock lock(&mu_);
      // A job a RunQueued caller runs is waited for, even when stopping.
      while (running_ || (queue_.empty() && !stopping_)) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping, and every job has run.
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    Execute(job, /*notify=*/true);
  }
}

void CopyEngine::Execute(const CopyJob& job, bool notify) {
  execute_(job);  // Without the lock: Submit and Poll stay responsive.
  bool more = false;
  {
    MutexLock lock(&mu_);
    running_ = false;
    completed_.push_back(CopyCompletion{job.tag, Status::Ok()});
    more = !queue_.empty() || stopping_;
  }
  done_cv_.NotifyAll();
  // The thread may be waiting for a caller's job to end.
  if (more) work_cv_.NotifyOne();
  if (!notify) return;
  MutexLock lock(&notify_mu_);
  if (notify_) notify_();
}

size_t CopyEngine::RunQueued() {
  size_t ran = 0;
  for (;;) {
    CopyJob job;
    {
      MutexLock lock(&mu_);
      if (running_ || queue_.empty()) return ran;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    Execute(job, /*notify=*/false);  // The caller polls for it.
    ++ran;
  }
}

void CopyEngine::SetNotify(std::function<void()> notify) {
  MutexLock lock(&notify_mu_);
  notify_ = std::move(notify);
}

void CopyEngine::Submit(CopyJob job, bool wake) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(job));
    ++in_flight_;
  }
  if (wake) work_cv_.NotifyOne();
}

void CopyEngine::Kick() { work_cv_.NotifyOne(); }

std::vector<CopyCompletion> CopyEngine::TakeCompletedLocked() {
  std::vector<CopyCompletion> out;
  out.swap(completed_);
  in_flight_ -= out.size();
  return out;
}

std::vector<CopyCompletion> CopyEngine::Poll() {
  MutexLock lock(&mu_);
  return TakeCompletedLocked();
}

std::vector<CopyCompletion> CopyEngine::Wait(
    std::chrono::milliseconds timeout) {
  Kick();  // Jobs queued without waking the thread are waited for too.
  using Clock = std::chrono::steady_clock;
  MutexLock lock(&mu_);
  const Clock::time_point now = Clock::now();
  // now + timeout would overflow for "wait forever" timeouts such as
  // milliseconds::max(); those wait without a deadline.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::time_point::max() - now);
  if (timeout >= room) {
    while (completed_.empty()) done_cv_.Wait(&mu_);
  } else {
    const Clock::time_point deadline = now + timeout;
    while (completed_.empty()) {
      if (!done_cv_.WaitUntil(&mu_, deadline)) break;  // Timed out.
    }
  }
  return TakeCompletedLocked();
}

size_t CopyEngine::in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace tierkv
