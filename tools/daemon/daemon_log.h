// DaemonLog: where tierkvd's log lines go, stderr or a file, installed as
// spdlog's default logger. A file can be reopened at the same path, so that
// logrotate can rename it and SIGHUP tierkvd into a fresh one.
// Thread-safety: Reopen may race log lines from any thread (the file sink is
// swapped under the logger's sink mutex); Open is not thread-safe.
#ifndef TIERKV_TOOLS_DAEMON_DAEMON_LOG_H_
#define TIERKV_TOOLS_DAEMON_DAEMON_LOG_H_

#include <spdlog/sinks/dist_sink.h>

#include <memory>
#include <mutex>
#include <string>

#include "tierkv/status.h"

namespace tierkv::daemon {

class DaemonLog {
 public:
  // Replaces spdlog's default logger. Empty `path`: stderr. Otherwise log
  // lines are appended to `path` and flushed one by one;
  // FailedPrecondition naming the path when it cannot be opened.
  static StatusOr<std::unique_ptr<DaemonLog>> Open(const std::string& path);
  ~DaemonLog();

  // Closes the file and opens `path` again, creating it if it was moved
  // away. On failure the old file stays in use and FailedPrecondition says
  // why. FailedPrecondition too when logging to stderr.
  Status Reopen();

  bool has_file() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  explicit DaemonLog(std::string path);

  std::string path_;
  // Holds the one file sink while logging to a file; null for stderr.
  std::shared_ptr<spdlog::sinks::dist_sink_mt> file_;
};

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_DAEMON_LOG_H_
