// Child processes and tierkvd calls for the demos (demo_process.h).
#include "tools/demo/demo_process.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <variant>

#include "ipc/socket_call.h"

namespace tierkv::demo {

StatusOr<std::unique_ptr<Child>> Child::Spawn(std::vector<std::string> argv,
                                              bool capture) {
  int fds[2] = {-1, -1};
  if (capture && pipe2(fds, O_CLOEXEC) != 0) {
    return Status::Internal(std::string("pipe2: ") + std::strerror(errno));
  }
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // Never outlive the demo.
    const int out = capture ? fds[1] : open("/dev/null", O_WRONLY);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(args[0], args.data());
    const char msg[] = "tierkv-demo: cannot execute the program\n";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    _exit(127);
  }
  if (capture) close(fds[1]);
  return std::unique_ptr<Child>(new Child(pid, fds[0]));
}

Child::~Child() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    Wait();
  }
  if (fd_ >= 0) close(fd_);
}

void Child::CloseOutput() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::optional<int> Child::Reap(int flags) {
  if (reaped_) return code_;
  int status = 0;
  pid_t got;
  while ((got = waitpid(pid_, &status, flags)) < 0 && errno == EINTR) {
  }
  if (got != pid_) return std::nullopt;
  reaped_ = true;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return code_;
}

int Child::Wait() { return Reap(0).value_or(128 + SIGKILL); }

std::optional<int> Child::Poll() { return Reap(WNOHANG); }

std::string SelfPath() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "tierkv-demo";
  return std::string(buf, static_cast<size_t>(n));
}

std::string LastLines(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > static_cast<size_t>(lines)
                      ? all.size() - static_cast<size_t>(lines)
                      : 0;
       i < all.size(); ++i) {
    out += "  " + all[i] + "\n";
  }
  return out;
}

StatusOr<std::string> MakeTempDir() {
  std::string pattern = "/tmp/tierkv-demo.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return Status::Internal(std::string("mkdtemp: ") + std::strerror(errno));
  }
  return pattern;
}

Status MakeWorkDir(const std::string& given, DirRemover* dir) {
  dir->dir = given;
  dir->remove = false;
  if (given.empty()) {
    TIERKV_ASSIGN_OR_RETURN(dir->dir, MakeTempDir());
    dir->remove = true;
  }
  std::error_code error;
  std::filesystem::create_directories(dir->dir, error);
  if (error) {
    return Status::InvalidArgument("--work-dir " + dir->dir + ": " +
                                   error.message());
  }
  return Status::Ok();
}

DirRemover::~DirRemover() {
  std::error_code ignored;
  if (remove) std::filesystem::remove_all(dir, ignored);
}

StatusOr<std::unique_ptr<Child>> StartTierkvd(std::vector<std::string> argv,
                                              const std::string& socket,
                                              const std::string& log,
                                              std::chrono::seconds timeout) {
  const std::string program = argv[0];
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Child> daemon,
                          Child::Spawn(std::move(argv), /*capture=*/false));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!FetchStats(socket).ok()) {
    if (std::optional<int> code = daemon->Poll(); code.has_value()) {
      return Status::Unavailable("tierkvd (" + program + ") exited with " +
                                 std::to_string(*code) + " before serving:\n" +
                                 LastLines(log, 10));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Unavailable("tierkvd did not answer on " + socket +
                                 " within " + std::to_string(timeout.count()) +
                                 " s:\n" + LastLines(log, 10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return daemon;
}

Status StopTierkvd(Child& daemon, const std::string& log) {
  kill(daemon.pid(), SIGTERM);
  if (int code = daemon.Wait(); code != 0) {
    return Status::Internal("tierkvd exited with " + std::to_string(code) +
                            " on SIGTERM:\n" + LastLines(log, 10));
  }
  return Status::Ok();
}

StatusOr<CoordinatorStats> FetchStats(const std::string& socket) {
  TIERKV_ASSIGN_OR_RETURN(ipc::Message reply,
                          ipc::SocketCall(socket, ipc::StatsRequest{}));
  TIERKV_RETURN_IF_ERROR(ipc::StatusOf(reply));
  const auto* stats = std::get_if<ipc::StatsReply>(&reply);
  if (stats == nullptr) return Status::Internal("unexpected reply to stats");
  return stats->stats;
}

StatusOr<HeldKeys> FetchHeldKeys(const std::string& socket) {
  TIERKV_ASSIGN_OR_RETURN(ipc::Message reply,
                          ipc::SocketCall(socket, ipc::HeldKeysRequest{}));
  TIERKV_RETURN_IF_ERROR(ipc::StatusOf(reply));
  const auto* held = std::get_if<ipc::HeldKeysReply>(&reply);
  if (held == nullptr) return Status::Internal("unexpected reply to held");
  return held->keys;
}

Status ClearTiers(const std::string& socket) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::Message reply,
      ipc::SocketCall(socket, ipc::ClearRequest{.tiers = TierSelection::kAll}));
  return ipc::StatusOf(reply);
}

}  // namespace tierkv::demo
