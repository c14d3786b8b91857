// Watchdog: keeps systemd's service watchdog (WatchdogSec=) fed. Its own
// thread runs a liveness check every period and pets ("WATCHDOG=1") only
// when the check passes, so a daemon that stops making progress (a wedged
// coordinator, a stuck listener) goes quiet and systemd restarts it.
// Thread-safety: Start and the destructor from one thread; the check and
// the pet run on the watchdog's thread.
#ifndef TIERKV_TOOLS_DAEMON_WATCHDOG_H_
#define TIERKV_TOOLS_DAEMON_WATCHDOG_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "src/mutex.h"
#include "tierkv/status.h"

namespace tierkv::daemon {

class Watchdog {
 public:
  using Check = std::function<Status()>;
  using Pet = std::function<void()>;

  // The interval systemd wants pets within: WATCHDOG_USEC, when
  // WATCHDOG_PID names this process or is unset (sd_watchdog_enabled).
  // nullopt when no watchdog is asked for.
  static std::optional<std::chrono::microseconds> SystemdInterval();
  // Pets systemd's notify socket: sd_notify "WATCHDOG=1".
  static void PetSystemd();

  // Runs check() at once and then every `period`, and pet() after each
  // check that passes. A failing check is logged when it starts failing,
  // and again when it passes once more.
  static std::unique_ptr<Watchdog> Start(std::chrono::microseconds period,
                                         Check check, Pet pet);
  ~Watchdog();  // Stops; no check or pet runs after it returns.

 private:
  Watchdog(std::chrono::microseconds period, Check check, Pet pet);
  void Run() TIERKV_EXCLUDES(mu_);

  const std::chrono::microseconds period_;
  const Check check_;
  const Pet pet_;
  Mutex mu_;
  CondVar wake_;  // Signals stop_.
  bool stop_ TIERKV_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_WATCHDOG_H_
