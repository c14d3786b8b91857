#include "tools/daemon/watchdog.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>

namespace tierkv::daemon {

std::optional<std::chrono::microseconds> Watchdog::SystemdInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) {
    return std::nullopt;
  }
  return std::chrono::microseconds(usec);
}

void Watchdog::PetSystemd() { sd_notify(0, "WATCHDOG=1"); }

std::unique_ptr<Watchdog> Watchdog::Start(std::chrono::microseconds period,
                                          Check check, Pet pet) {
  std::unique_ptr<Watchdog> watchdog(
      new Watchdog(period, std::move(check), std::move(pet)));
  watchdog->thread_ = std::thread([w = watchdog.get()] { w->Run(); });
  return watchdog;
}

Watchdog::Watchdog(std::chrono::microseconds period, Check check, Pet pet)
    : period_(period), check_(std::move(check)), pet_(std::move(pet)) {}

Watchdog::~Watchdog() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.NotifyOne();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Run() {
  bool failing = false;
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    if (Status alive = check_(); alive.ok()) {
      if (failing) spdlog::warn("watchdog: making progress again");
      failing = false;
      pet_();
    } else if (!failing) {
      failing = true;
      spdlog::error(
          "watchdog: {}; not notifying systemd, which restarts tierkvd "
          "unless this clears",
          alive.message());
    }
    // After a long check (or a suspended machine), the next one runs at once
    // rather than several in a row to catch up.
    next = std::max(next + period_, std::chrono::steady_clock::now());
    MutexLock lock(&mu_);
    while (!stop_) {
      if (!wake_.WaitUntil(&mu_, next)) break;  // Time for the next check.
    }
    if (stop_) return;
  }
}

}  // namespace tierkv::daemon
