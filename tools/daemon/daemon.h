// RunDaemon: tierkvd's life once its flags are parsed. It logs (DaemonLog),
// runs the Server and, with --metrics-listen, its HTTP metrics endpoint
// (MetricsHttpServer), tells systemd (sd_notify) when it serves and when it
// stops, feeds systemd's watchdog while the server makes progress
// (Watchdog), and handles signals: SIGTERM and SIGINT stop it within
// --stop-timeout, SIGHUP reopens the log file and re-reads log-level from
// --config. Not thread-safe: call once, from main, before any other thread
// starts, since it blocks those signals for the whole process.
#ifndef TIERKV_TOOLS_DAEMON_DAEMON_H_
#define TIERKV_TOOLS_DAEMON_DAEMON_H_

#include <sys/types.h>

#include <chrono>
#include <functional>

#include "tools/daemon/daemon_flags.h"
#include "tools/daemon/exit_status.h"

namespace tierkv::daemon {

// Runs tierkvd until SIGTERM or SIGINT and returns its exit status
// (ExitStatus). Those signals are honoured from the start: during start-up
// they make its long steps give up (ServerOptions::cancelled), and then it
// exits with kExitStopped.
int RunDaemon(const DaemonCommand& command);

// The umask that keeps what tierkvd creates (the disk tier's directory and
// files, the log file) within `mode` (--mode): 0600 gives files 0600 and
// directories 0700; 0660 gives 0660 and 0770.
mode_t UmaskFor(mode_t mode);

// Runs stop() and returns when it does. If stop() has not returned after
// `timeout`, logs an error and ends the process with _exit(1): a stop that
// hangs must not outlast the service manager's patience silently.
// Thread-safe.
void StopWithin(std::chrono::seconds timeout,
                const std::function<void()>& stop);

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_DAEMON_H_
