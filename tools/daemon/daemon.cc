#include "tools/daemon/daemon.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "ipc/server.h"
#include "src/mutex.h"
#include "tools/admin/admin.h"
#include "tools/daemon/daemon_log.h"
#include "tools/daemon/kv_events.h"
#include "tools/daemon/metrics_http.h"
#include "tools/daemon/watchdog.h"

namespace tierkv::daemon {
namespace {

// SIGHUP: reopen the log file (logrotate has moved it away).
void ReopenLog(DaemonLog& log) {
  if (!log.has_file()) {
    spdlog::info("received SIGHUP; logging to stderr, no log file to reopen");
    return;
  }
  spdlog::info("received SIGHUP; reopening log file {}", log.path());
  if (Status s = log.Reopen(); !s.ok()) {
    spdlog::error("{}; still logging to the file opened before", s.message());
    return;
  }
  spdlog::info("reopened log file {}", log.path());
}

// SIGHUP: take log-level from the --config file again, and say which other
// changes in it wait for a restart. `*level` is the one in force; a file
// that no longer parses leaves it so.
void ApplyConfigLogLevel(const DaemonCommand& command, std::string* level) {
  if (command.config_path.empty()) return;
  StatusOr<ConfigReread> reread = RereadConfig(command);
  if (!reread.ok()) {
    spdlog::error("{}; keeping log level {}", reread.status().message(),
                  *level);
    return;
  }
  if (!reread->needs_restart.empty()) {
    std::string keys;
    for (const std::string& key : reread->needs_restart) {
      keys += (keys.empty() ? "" : ", ") + key;
    }
    spdlog::warn(
        "{} changes {} since tierkvd started; only log-level applies on "
        "SIGHUP, the rest when tierkvd restarts (still using the values it "
        "started with)",
        command.config_path, keys);
  }
  const std::string* fresh = &reread->log_level;
  if (*fresh == *level) {
    spdlog::info("log level stays {}{}", *level,
                 command.log_level_on_command_line
                     ? " (--log-level on the command line wins over " +
                           command.config_path + ")"
                     : "");
    return;
  }
  const spdlog::level::level_enum before = spdlog::get_level();
  const spdlog::level::level_enum after = spdlog::level::from_str(*fresh);
  // Logged under the more verbose of the two levels, so that it shows
  // whenever either would show it.
  if (after < before) spdlog::set_level(after);
  spdlog::info("log level {} -> {}", *level, *fresh);
  if (after >= before) spdlog::set_level(after);
  *level = *fresh;
}

// Under systemd's WatchdogSec=: pets at half the interval while the server
// makes progress (Server::CheckProgress). Null without a watchdog.
std::unique_ptr<Watchdog> StartWatchdog(const ipc::Server& server) {
  const std::optional<std::chrono::microseconds> interval =
      Watchdog::SystemdInterval();
  if (!interval.has_value()) return nullptr;
  const auto period = *interval / 2;
  // A check that waits longer than half a period would delay the pet.
  const auto patience = std::max(
      std::chrono::duration_cast<std::chrono::milliseconds>(period / 2),
      std::chrono::milliseconds(1));
  spdlog::info(
      "systemd watchdog every {} ms: notifying every {} ms while tierkvd "
      "makes progress",
      std::chrono::duration_cast<std::chrono::milliseconds>(*interval).count(),
      std::chrono::duration_cast<std::chrono::milliseconds>(period).count());
  return Watchdog::Start(
      period, [&server, patience] { return server.CheckProgress(patience); },
      &Watchdog::PetSystemd);
}

}  // namespace

mode_t UmaskFor(mode_t mode) {
  // Directories get search permission wherever the mode lets read.
  const mode_t allowed = (mode | ((mode & 0444) >> 2)) & 0777;
  return 0777 & ~allowed;
}

void StopWithin(std::chrono::seconds timeout,
                const std::function<void()>& stop) {
  // A struct: the analysis takes TIERKV_GUARDED_BY on members only.
  struct {
    Mutex mu;
    CondVar stopped;  // Signals done.
    bool done TIERKV_GUARDED_BY(mu) = false;
  } state;
  std::thread watchdog([&state, timeout] {
    MutexLock lock(&state.mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!state.done) {
      if (!state.stopped.WaitUntil(&state.mu, deadline)) break;
    }
    if (!state.done) {
      spdlog::error("did not stop within {} s; exiting without cleanup",
                    timeout.count());
      spdlog::default_logger()->flush();
      _exit(1);
    }
  });
  stop();
  {
    MutexLock lock(&state.mu);
    state.done = true;
  }
  state.stopped.NotifyOne();
  watchdog.join();
}

namespace {

// The thread that takes SIGTERM, SIGINT and SIGHUP (blocked in every other
// thread) for tierkvd's whole life, start-up included: SIGHUP reopens the
// log file and re-reads the log level; SIGTERM or SIGINT ask tierkvd to
// stop (stop_requested(), which Server::Start's long steps check) and end
// the thread. A stop asked for during start-up must be honoured within
// --stop-timeout too: past it, the process exits with kExitInternal.
class SignalThread {
 public:
  SignalThread(const DaemonCommand& command, DaemonLog& log,
               const sigset_t& signals)
      : command_(command), log_(log), signals_(signals) {
    thread_ = std::thread([this] { Run(); });
  }
  // Ends the thread (whether or not a stop was asked for).
  ~SignalThread() {
    ending_.store(true);
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

  bool stop_requested() const { return stop_requested_.load(); }
  // Start-up is over (Server::Start returned): a stop asked for is the
  // main thread's to carry out now.
  void StartupOver() {
    MutexLock lock(&mu_);
    startup_over_ = true;
    changed_.NotifyAll();
  }
  // Returns once a stop is asked for.
  void WaitForStop() {
    MutexLock lock(&mu_);
    while (!stop_asked_) changed_.Wait(&mu_);
  }

 private:
  void Run() {
    std::string log_level = command_.log_level;
    for (;;) {
      int signal_number = 0;
      sigwait(&signals_, &signal_number);
      if (ending_.load()) return;
      if (signal_number == SIGHUP) {
        ReopenLog(log_);  // First: what follows goes to the fresh file.
        ApplyConfigLogLevel(command_, &log_level);
        continue;
      }
      spdlog::info("received {}, stopping", strsignal(signal_number));
      stop_requested_.store(true);
      MutexLock lock(&mu_);
      stop_asked_ = true;
      changed_.NotifyAll();
      const auto deadline =
          std::chrono::steady_clock::now() + command_.stop_timeout;
      while (!startup_over_ && !ending_.load()) {
        if (!changed_.WaitUntil(&mu_, deadline)) break;
      }
      if (!startup_over_ && !ending_.load()) {
        spdlog::error(
            "start-up did not stop within {} s (--stop-timeout); exiting "
            "without cleanup",
            command_.stop_timeout.count());
        spdlog::default_logger()->flush();
        _exit(kExitInternal);
      }
      return;
    }
  }

  const DaemonCommand& command_;
  DaemonLog& log_;
  const sigset_t signals_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> ending_{false};
  Mutex mu_;
  CondVar changed_;
  bool stop_asked_ TIERKV_GUARDED_BY(mu_) = false;
  bool startup_over_ TIERKV_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The publisher --kv-events-endpoint asks for (null without one), its
// first batch an AllBlocksCleared: a router that follows a restarted
// tierkvd forgets what the last run held, and learns what it holds now
// from the events that follow (the disk tier's blocks, as it opens).
StatusOr<std::unique_ptr<KvEventPublisher>> StartKvEvents(
    const KvEventsFlags& flags) {
  if (flags.endpoint.empty()) return std::unique_ptr<KvEventPublisher>();
  TIERKV_ASSIGN_OR_RETURN(KvEventHashFormat hashes,
                          ParseKvEventHashFormat(flags.hash_format));
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<KvEventPublisher> publisher,
                          KvEventPublisher::CreateUnstarted(
                              {.endpoint = flags.endpoint,
                               .replay_endpoint = flags.replay_endpoint,
                               .topic = flags.topic,
                               .buffer_steps = flags.buffer_steps,
                               .max_queue_events = flags.max_queue_events,
                               .hash_format = hashes,
                               .ipc_group = flags.group}));
  publisher->AllBlocksCleared();
  return publisher;
}

}  // namespace

// While start-up makes progress, systemd is told every kExtendEvery to
// wait kExtendBy more (EXTEND_TIMEOUT_USEC).
using Clock = std::chrono::steady_clock;
constexpr Clock::duration kExtendEvery = std::chrono::seconds(1);
constexpr Clock::duration kExtendBy = std::chrono::seconds(10);

int RunDaemon(const DaemonCommand& command) {
  // Blocked before any thread starts, so only the signal thread takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  umask(UmaskFor(command.server.mode));
  spdlog::set_level(spdlog::level::from_str(command.log_level));
  auto log = DaemonLog::Open(command.log_file);
  if (!log.ok()) {
    std::cerr << "tierkvd: --log-file: " << log.status().message() << "\n";
    return log.status().code() == StatusCode::kPermissionDenied
               ? kExitPermission
               : kExitUsage;
  }
  SignalThread signal_thread(command, **log, signals);
  ipc::ServerOptions options = command.server;
  // Before the server: the disk tier reports the blocks it finds while it
  // opens, and the publisher must outlive every tier that reports to it.
  StatusOr<std::unique_ptr<KvEventPublisher>> kv_events =
      StartKvEvents(command.kv_events);
  if (!kv_events.ok()) {
    spdlog::error("cannot start: {}", kv_events.status().message());
    return ExitStatusFor(kv_events.status());
  }
  options.cache_events = kv_events->get();
  if (KvEventPublisher* publisher = kv_events->get(); publisher != nullptr) {
    // Its sockets once the store is this tierkvd's (Server::Start).
    options.locked = [publisher, &flags = command.kv_events] {
      TIERKV_RETURN_IF_ERROR(publisher->Start());
      spdlog::info("kv events: publishing on {}{}", flags.endpoint,
                   flags.replay_endpoint.empty()
                       ? std::string()
                       : ", replay on " + flags.replay_endpoint);
      return Status::Ok();
    };
  }
  // Called between units of start-up work (64 MiB of host memory reserved,
  // a record of the disk index read): besides looking for a stop, it keeps
  // extending systemd's start timeout while the start makes progress, so a
  // large host tier or disk index is not killed by TimeoutStartSec, and a
  // start that hangs still is.
  options.cancelled = [&signal_thread,
                       extended =
                           std::optional<Clock::time_point>()]() mutable {
    if (signal_thread.stop_requested()) return true;
    const Clock::time_point now = Clock::now();
    if (!extended.has_value() || now - *extended >= kExtendEvery) {
      extended = now;
      sd_notifyf(
          0, "EXTEND_TIMEOUT_USEC=%lld\nSTATUS=starting",
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::microseconds>(kExtendBy)
                  .count()));
    }
    return signal_thread.stop_requested();
  };
  auto server = ipc::Server::Start(options);
  signal_thread.StartupOver();
  if (!server.ok()) {
    // A step that saw the stop gives up with Unavailable; any other error
    // keeps its own exit status even if a signal came meanwhile.
    if (signal_thread.stop_requested() &&
        server.status().code() == StatusCode::kUnavailable) {
      spdlog::info("stopped while starting: {}", server.status().message());
      return kExitStopped;
    }
    spdlog::error("cannot start: {}", server.status().ToString());
    sd_notifyf(0, "STATUS=cannot start: %s",
               server.status().ToString().c_str());
    return ExitStatusFor(server.status());
  }
  std::unique_ptr<MetricsHttpServer> metrics;
  if (command.metrics_listen.has_value()) {
    ipc::Server* raw = server->get();
    auto started = MetricsHttpServer::Start(
        {.host = command.metrics_listen->host,
         .port = command.metrics_listen->port,
         .render = [raw, events = kv_events->get()] {
           const CoordinatorStats stats = raw->stats();
           std::string text = admin::FormatMetrics(stats);
           if (events != nullptr) {
             text += FormatKvEventMetrics(events->stats(),
                                          admin::MetricBaseLabels(stats));
           }
           return text;
         }});
    if (!started.ok()) {
      spdlog::error("cannot start: {}", started.status().message());
      sd_notifyf(0, "STATUS=cannot start: %s",
                 started.status().ToString().c_str());
      return ExitStatusFor(started.status());
    }
    metrics = std::move(*started);
    spdlog::info("metrics: serving http://{}/metrics", metrics->address());
  }
  std::unique_ptr<Watchdog> watchdog;
  if (!signal_thread.stop_requested()) {
    sd_notifyf(0, "READY=1\nSTATUS=serving store '%s' on %s",
               command.server.store.c_str(), (*server)->socket_path().c_str());
    watchdog = StartWatchdog(**server);
    signal_thread.WaitForStop();
  }
  watchdog.reset();  // A stopping server makes no progress to check.
  metrics.reset();
  sd_notify(0, "STOPPING=1\nSTATUS=stopping");
  // Most of the time goes to spilling the host tier; the rest is left for
  // the flush and the teardown.
  const auto spill_time = std::chrono::duration_cast<std::chrono::milliseconds>(
                              command.stop_timeout) *
                          3 / 4;
  Status stopped;
  StopWithin(command.stop_timeout,
             [&] { stopped = (*server)->Stop(spill_time); });
  if (*kv_events != nullptr) {
    // What the stop dropped from host goes out before the sockets close.
    (void)(*kv_events)->Flush(std::chrono::seconds(1));
    const KvEventPublisherStats s = (*kv_events)->stats();
    spdlog::info("kv events: {} published in {} batches, {} dropped",
                 s.events_queued, s.batches_published, s.events_dropped);
  }
  if (!stopped.ok()) {
    spdlog::error(
        "stopped, but the host tier is not all on disk and durable: {}; a "
        "restart may miss those blocks",
        stopped.ToString());
    return kExitStopIncomplete;
  }
  return kExitStopped;
}

}  // namespace tierkv::daemon
