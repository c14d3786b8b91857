// Mutex, MutexLock and CondVar: std::timed_mutex with Clang's thread-safety
// annotations, so that a member declared TIERKV_GUARDED_BY(mu_) is checked
// at compile time (-Wthread-safety, in the Clang build that CI runs) to be
// touched only with mu_ held, and a function declared TIERKV_REQUIRES(mu_)
// to be called only with it held. Other compilers ignore the annotations.
// libstdc++'s own mutexes carry none, so every lock that guards annotated
// state is one of these.
#ifndef TIERKV_SRC_MUTEX_H_
#define TIERKV_SRC_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TIERKV_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define TIERKV_THREAD_ANNOTATION_(x)
#endif

#define TIERKV_CAPABILITY(x) TIERKV_THREAD_ANNOTATION_(capability(x))
#define TIERKV_SCOPED_CAPABILITY TIERKV_THREAD_ANNOTATION_(scoped_lockable)
#define TIERKV_GUARDED_BY(x) TIERKV_THREAD_ANNOTATION_(guarded_by(x))
#define TIERKV_PT_GUARDED_BY(x) TIERKV_THREAD_ANNOTATION_(pt_guarded_by(x))
#define TIERKV_REQUIRES(...) \
  TIERKV_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define TIERKV_EXCLUDES(...) \
  TIERKV_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define TIERKV_ACQUIRE(...) \
  TIERKV_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define TIERKV_RELEASE(...) \
  TIERKV_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TIERKV_TRY_ACQUIRE(...) \
  TIERKV_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TIERKV_RETURN_CAPABILITY(x) TIERKV_THREAD_ANNOTATION_(lock_returned(x))
#define TIERKV_NO_THREAD_SAFETY_ANALYSIS \
  TIERKV_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace tierkv {

class TIERKV_CAPABILITY("mutex") Mutex {
 public:
  void Lock() TIERKV_ACQUIRE() { mu_.lock(); }
  void Unlock() TIERKV_RELEASE() { mu_.unlock(); }
  // False when the mutex was not free within `timeout`.
  bool TryLockFor(std::chrono::milliseconds timeout) TIERKV_TRY_ACQUIRE(true) {
    return mu_.try_lock_for(timeout);
  }
  // BasicLockable, for CondVar's std::condition_variable_any (which the
  // analysis does not follow: the mutex is held again when wait returns).
  void lock() TIERKV_ACQUIRE() { mu_.lock(); }
  void unlock() TIERKV_RELEASE() { mu_.unlock(); }

 private:
  std::timed_mutex mu_;
};

// Holds a Mutex for its scope.
class TIERKV_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TIERKV_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() TIERKV_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// A condition variable for Mutex (std::condition_variable_any underneath).
// Wait and WaitUntil release *mu while they block and hold it again when
// they return. Callers loop on their condition themselves,
//   while (queue_.empty()) cv_.Wait(&mu_);
// so that the analysis checks the condition's reads under mu, which a
// predicate lambda would hide from it.
class CondVar {
 public:
  void Wait(Mutex* mu) TIERKV_REQUIRES(mu) { cv_.wait(*mu); }
  // False once `deadline` has passed (the condition may hold by then: check
  // it again). A deadline, not a timeout, so that a loop that wakes early
  // does not wait longer in all.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu,
                 const std::chrono::time_point<Clock, Duration>& deadline)
      TIERKV_REQUIRES(mu) {
    return cv_.wait_until(*mu, deadline) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_MUTEX_H_
