// What the demos' parent processes share: child processes (tierkvd, the
// workers) and the calls that wait for a tierkvd to serve and ask it for
// its stats and held keys. Not for use outside tools/demo.
#ifndef TIERKV_TOOLS_DEMO_DEMO_PROCESS_H_
#define TIERKV_TOOLS_DEMO_DEMO_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/coordinator_types.h"
#include "tierkv/stats.h"
#include "tierkv/status.h"

namespace tierkv::demo {

// A child process; killed (SIGKILL) and reaped on destruction if still
// running. stdout and stderr go to a pipe (`capture`, read from fd()) or to
// /dev/null. It gets SIGTERM when the demo dies.
class Child {
 public:
  static StatusOr<std::unique_ptr<Child>> Spawn(std::vector<std::string> argv,
                                                bool capture);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  int fd() const { return fd_; }  // -1 when not captured or closed.
  void CloseOutput();
  // Exit code, or 128 + signal.
  int Wait();
  // Like Wait, without blocking: nullopt while it runs.
  std::optional<int> Poll();

 private:
  Child(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  std::optional<int> Reap(int flags);

  pid_t pid_;
  int fd_;
  bool reaped_ = false;
  int code_ = 0;
};

// This program's path (/proc/self/exe).
std::string SelfPath();
// The last `lines` lines of a file, each indented by two spaces.
std::string LastLines(const std::string& path, int lines);

// A fresh directory under /tmp (mkdtemp).
StatusOr<std::string> MakeTempDir();
// Removes `dir` with everything in it on destruction, when `remove`.
struct DirRemover {
  std::string dir;
  bool remove = false;
  ~DirRemover();
};
// Makes `given` (kept at the end), or a fresh directory under /tmp when it
// is empty (removed at the end), and points `dir` at it.
Status MakeWorkDir(const std::string& given, DirRemover* dir);

// Starts tierkvd (argv[0] is its path) and returns once it answers on
// `socket`; Unavailable, with the end of its log, when it exits first or
// does not answer within `timeout`.
StatusOr<std::unique_ptr<Child>> StartTierkvd(
    std::vector<std::string> argv, const std::string& socket,
    const std::string& log,
    std::chrono::seconds timeout = std::chrono::seconds(20));
// SIGTERM, then waits; Internal with the end of the log when tierkvd did
// not exit 0.
Status StopTierkvd(Child& daemon, const std::string& log);

StatusOr<CoordinatorStats> FetchStats(const std::string& socket);
StatusOr<HeldKeys> FetchHeldKeys(const std::string& socket);
// tierkv-admin clear --tier all: every tier's unpinned blocks dropped (the
// remote tier's values this tierkvd wrote deleted).
Status ClearTiers(const std::string& socket);

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_DEMO_PROCESS_H_
