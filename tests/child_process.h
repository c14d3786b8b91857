// ChildProcess: a program run as a child for multi-process tests and
// benchmarks (tierkvd, workers, tierkv-admin, redis-server). Its stdout and
// stderr go to a pipe that a thread drains into output(), so it never
// blocks on a full pipe. Not thread-safe, apart from output() and
// WaitForOutput, which may race the draining thread.
#ifndef TIERKV_TESTS_CHILD_PROCESS_H_
#define TIERKV_TESTS_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tierkv/status.h"

namespace tierkv {

class ChildProcess {
 public:
  // argv[0] is the program's path.
  static StatusOr<std::unique_ptr<ChildProcess>> Spawn(
      std::vector<std::string> argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      return Status::Internal(std::string("pipe2: ") + std::strerror(errno));
    }
    // Built before fork: the child of a threaded process must not allocate.
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      close(fds[0]);
      close(fds[1]);
      return Status::Internal(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // Never outlive a crashed parent.
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      execv(args[0], args.data());
      // Said in the output, so a test shows why the program never ran
      // (write only: the child of a threaded process must not allocate).
      constexpr char kFailed[] = "exec failed: ";
      (void)!write(STDERR_FILENO, kFailed, sizeof(kFailed) - 1);
      (void)!write(STDERR_FILENO, args[0], std::strlen(args[0]));
      (void)!write(STDERR_FILENO, "\n", 1);
      _exit(127);
    }
    close(fds[1]);
    return std::unique_ptr<ChildProcess>(new ChildProcess(pid, fds[0]));
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // A child still running is killed (SIGKILL) and reaped.
  ~ChildProcess() {
    Signal(SIGKILL);
    Wait();
  }

  // Waits until the output contains `text`; false on exit or timeout.
  bool WaitForOutput(const std::string& text,
                     std::chrono::seconds timeout = std::chrono::seconds(20)) {
    return WaitFor(
        [&](const std::string& out) {
          return out.find(text) != std::string::npos;
        },
        timeout);
  }
  // Waits until `done(output)` holds; false on exit or timeout.
  bool WaitFor(const std::function<bool(const std::string&)>& done,
               std::chrono::seconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, timeout, [&] { return done(output_) || eof_; });
    return done(output_);
  }
  // Reaps the child: its exit code, or 128 + the signal that ended it.
  int Wait() {
    if (!reaped_) {
      int status = 0;
      waitpid(pid_, &status, 0);
      reaped_ = true;
      exit_code_ =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (reader_.joinable()) reader_.join();
    return exit_code_;
  }
  // Never signals a reaped pid (the kernel may have reused it).
  void Signal(int sig) {
    if (!reaped_) kill(pid_, sig);
  }
  // SIGSTOP, returning once the child is stopped (not merely signalled).
  void Freeze() {
    if (reaped_) return;
    kill(pid_, SIGSTOP);
    int status = 0;
    while (waitpid(pid_, &status, WUNTRACED) == pid_) {
      if (WIFSTOPPED(status)) return;
      if (WIFEXITED(status) || WIFSIGNALED(status)) {
        reaped_ = true;
        exit_code_ =
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return;
      }
    }
  }
  // SIGCONT, returning once the child runs again.
  void Thaw() {
    if (reaped_) return;
    kill(pid_, SIGCONT);
    int status = 0;
    while (waitpid(pid_, &status, WCONTINUED) == pid_ &&
           !WIFCONTINUED(status)) {
    }
  }
  // SIGTERM, then reaps it. Idempotent.
  void Stop() {
    Signal(SIGTERM);
    Wait();
  }
  std::string output() {
    std::lock_guard<std::mutex> guard(mu_);
    return output_;
  }
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, int fd) : pid_(pid) {
    reader_ = std::thread([this, fd] {
      char buf[4096];
      for (;;) {
        const ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        std::lock_guard<std::mutex> guard(mu_);
        output_.append(buf, static_cast<size_t>(n));
        changed_.notify_all();
      }
      close(fd);
      std::lock_guard<std::mutex> guard(mu_);
      eof_ = true;
      changed_.notify_all();
    });
  }

  pid_t pid_;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::string output_;  // GUARDED_BY(mu_)
  bool eof_ = false;    // GUARDED_BY(mu_)
};

}  // namespace tierkv

#endif  // TIERKV_TESTS_CHILD_PROCESS_H_
