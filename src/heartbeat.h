// Heartbeat: when a thread last went round its loop, for a check that
// tells a stuck thread from a busy one (tierkvd's CheckProgress, which its
// systemd watchdog calls). Beat and Age may be called from any thread.
#ifndef TIERKV_SRC_HEARTBEAT_H_
#define TIERKV_SRC_HEARTBEAT_H_

#include <atomic>
#include <chrono>

namespace tierkv {

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;

  Heartbeat() { Beat(); }
  void Beat() {
    last_.store(Clock::now().time_since_epoch().count(),
                std::memory_order_relaxed);
  }
  Clock::duration Age() const {
    return Clock::now() - Clock::time_point(Clock::duration(
                              last_.load(std::memory_order_relaxed)));
  }

 private:
  std::atomic<Clock::rep> last_;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_HEARTBEAT_H_
