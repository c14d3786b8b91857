// tierkvd as a service: the real daemon tells a stand-in for systemd's
// notify socket when it serves and when it stops, reopens its log file and
// re-reads its log level on SIGHUP, reads --config, and bounds how long a
// stop may take (StopWithin).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/child_process.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tools/daemon/daemon.h"
#include "tools/daemon/daemon_log.h"
#include "tools/daemon/watchdog.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

int MillisecondsUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

// A Unix datagram socket in place of systemd's notify socket (tierkvd finds
// it in NOTIFY_SOCKET). Messages come with the sender's pid, as systemd
// sees them.
class NotifySocket {
 public:
  struct Message {
    std::string text;
    pid_t sender = 0;
  };

  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    EXPECT_LT(path.size(), sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    const int on = 1;
    EXPECT_EQ(setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)), 0);
  }
  ~NotifySocket() { close(fd_); }

  // The next message; nullopt if none arrives within `timeout`.
  std::optional<Message> Receive(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) {
      return std::nullopt;
    }
    char buf[4096];
    iovec iov{buf, sizeof(buf)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd_, &msg, 0);
    if (n < 0) return std::nullopt;
    Message m{std::string(buf, static_cast<size_t>(n))};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred{};
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        m.sender = cred.pid;
      }
    }
    return m;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos;
       at = text.find(part, at + 1)) {
    ++n;
  }
  return n;
}

// Waits until the file at `path` satisfies `done`, woken by inotify events
// in its folder; false after `timeout`.
bool WaitForFile(const std::string& path,
                 const std::function<bool(const std::string&)>& done,
                 std::chrono::seconds timeout = std::chrono::seconds(20)) {
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return false;
  const std::string folder = std::filesystem::path(path).parent_path();
  // Watching before the first look: no change can slip in between.
  inotify_add_watch(fd, folder.c_str(),
                    IN_CREATE | IN_MODIFY | IN_MOVED_TO | IN_CLOSE_WRITE);
  const auto deadline = Clock::now() + timeout;
  bool ok = done(ReadFile(path));
  while (!ok && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, MillisecondsUntil(deadline));
    char events[4096];
    while (read(fd, events, sizeof(events)) > 0) {
    }
    ok = done(ReadFile(path));
  }
  close(fd);
  return ok;
}

bool WaitForFileText(const std::string& path, const std::string& text) {
  return WaitForFile(path, [&](const std::string& content) {
    return content.find(text) != std::string::npos;
  });
}

class TierkvdOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = "o" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    socket_ = dir_ + "/tierkvd.sock";
    notify_ = std::make_unique<NotifySocket>(dir_ + "/notify.sock");
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);
      daemon_->Wait();
      daemon_.reset();
    }
    RemoveStoreSegments(store_);
    notify_.reset();
  }

  // tierkvd with NOTIFY_SOCKET set, as systemd runs a Type=notify service,
  // and the variables in `env`. env(1) execs tierkvd in its own place, so
  // the child's pid is tierkvd's.
  std::unique_ptr<ChildProcess> Spawn(
      const std::vector<std::string>& flags,
      const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "NOTIFY_SOCKET=" + notify_->path()};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(TIERKVD_PATH);
    argv.insert(argv.end(), flags.begin(), flags.end());
    return SpawnArgv(std::move(argv));
  }
  // As systemd runs a unit with WatchdogSec=: also WATCHDOG_USEC, and
  // WATCHDOG_PID naming tierkvd itself (the shell's $$: exec keeps the pid
  // through env to tierkvd).
  std::unique_ptr<ChildProcess> SpawnUnderWatchdog(
      const std::string& usec, const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {
        "/bin/sh",
        "-c",
        "WATCHDOG_PID=$$; export WATCHDOG_PID; exec \"$@\"",
        "sh",
        "/usr/bin/env",
        "NOTIFY_SOCKET=" + notify_->path(),
        "WATCHDOG_USEC=" + usec,
        TIERKVD_PATH};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return SpawnArgv(std::move(argv));
  }
  static std::unique_ptr<ChildProcess> SpawnArgv(
      std::vector<std::string> argv) {
    auto child = ChildProcess::Spawn(std::move(argv));
    EXPECT_THAT(child, IsOk());
    return std::move(child).value();
  }
  std::vector<std::string> Flags(std::vector<std::string> extra = {}) const {
    std::vector<std::string> flags = {
        "--store",    store_, "--socket",   socket_, "--layers",        "2",
        "--kv-heads", "2",    "--head-dim", "64",    "--host-capacity", "1M"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }
  // Starts tierkvd and waits for its READY=1.
  void StartDaemon(const std::vector<std::string>& flags) {
    daemon_ = Spawn(flags);
    AwaitReady();
  }
  // Waits for daemon_'s READY=1; keeps the start-up's timeout extensions
  // (EXTEND_TIMEOUT_USEC) that came before it in extends_.
  void AwaitReady() {
    extends_.clear();
    while (true) {
      auto message = notify_->Receive(std::chrono::seconds(20));
      ASSERT_TRUE(message.has_value()) << daemon_->output();
      if (message->text.find("EXTEND_TIMEOUT_USEC=") != std::string::npos) {
        extends_.push_back(*message);
        continue;
      }
      ASSERT_THAT(message->text, HasSubstr("READY=1")) << daemon_->output();
      ready_ = *message;
      return;
    }
  }
  std::unique_ptr<Client> Attach() {
    ClientOptions options;
    options.socket_path = socket_;
    options.layout = TestLayout();
    options.num_device_blocks = 16;
    options.name = "ops";
    auto client = Client::Open(options);
    EXPECT_THAT(client, IsOk());
    return client.ok() ? std::move(*client) : nullptr;
  }

  const TempDir scratch_{"tierkvd_ops_test"};
  const std::string dir_ = scratch_.path();
  std::string store_, socket_;
  std::unique_ptr<NotifySocket> notify_;
  std::unique_ptr<ChildProcess> daemon_;
  NotifySocket::Message ready_;
  std::vector<NotifySocket::Message> extends_;
};

// Start-up tells systemd to wait longer as it works (reserving the host
// tier, rebuilding the disk index), so a large store is not killed by
// TimeoutStartSec; from the main pid, before READY=1.
TEST_F(TierkvdOpsTest, StartExtendsSystemdsTimeoutWhileItWorks) {
  StartDaemon(Flags({"--disk-dir", dir_ + "/disk", "--disk-capacity", "256M"}));
  ASSERT_FALSE(extends_.empty()) << daemon_->output();
  for (const NotifySocket::Message& extend : extends_) {
    EXPECT_THAT(extend.text, HasSubstr("EXTEND_TIMEOUT_USEC=10000000"));
    EXPECT_EQ(extend.sender, daemon_->pid());
  }
}

TEST_F(TierkvdOpsTest, NotifiesReadyWhenServingAndStoppingOnSigterm) {
  StartDaemon(Flags());
  EXPECT_THAT(ready_.text,
              HasSubstr("STATUS=serving store '" + store_ + "' on " + socket_));
  // From the main pid itself: systemd's default NotifyAccess=main takes it.
  EXPECT_EQ(ready_.sender, daemon_->pid());
  // READY=1 came once the socket listens: a worker attaches at once.
  std::unique_ptr<Client> client = Attach();
  ASSERT_NE(client, nullptr);

  daemon_->Signal(SIGTERM);
  auto stopping = notify_->Receive(std::chrono::seconds(20));
  ASSERT_TRUE(stopping.has_value()) << daemon_->output();
  EXPECT_THAT(stopping->text, HasSubstr("STOPPING=1"));
  EXPECT_EQ(stopping->sender, daemon_->pid());
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
  EXPECT_THAT(daemon_->output(), HasSubstr("stopped serving store"));
}

TEST_F(TierkvdOpsTest, SighupReopensTheLogFileAtItsPath) {
  const std::string log = dir_ + "/tierkvd.log";
  const std::string rotated = log + ".1";
  StartDaemon(Flags({"--log-file", log}));
  EXPECT_THAT(ReadFile(log), HasSubstr("tierkvd serving store"));

  // What logrotate does: move the file away, then SIGHUP.
  ASSERT_EQ(std::rename(log.c_str(), rotated.c_str()), 0);
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitForFileText(log, "reopened log file " + log))
      << daemon_->output();
  // Reopening a file that was not moved appends to it.
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitForFile(log, [](const std::string& text) {
    return Count(text, "reopened log file") == 2;
  })) << ReadFile(log);

  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(), 0) << daemon_->output();
  const std::string before = ReadFile(rotated);
  const std::string after = ReadFile(log);
  EXPECT_THAT(before, HasSubstr("tierkvd serving store"));
  EXPECT_THAT(before, HasSubstr("received SIGHUP; reopening log file"));
  EXPECT_THAT(before, Not(HasSubstr("stopping")));
  EXPECT_THAT(after, Not(HasSubstr("tierkvd serving store")));
  EXPECT_THAT(after, HasSubstr("received Terminated, stopping"));
  EXPECT_THAT(after, HasSubstr("stopped serving store"));
  // Nothing went to stderr.
  EXPECT_THAT(daemon_->output(), Not(HasSubstr("serving store")));
}

TEST_F(TierkvdOpsTest, SighupWithoutALogFileSaysSoAndKeepsServing) {
  StartDaemon(Flags());
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(daemon_->WaitForOutput("no log file to reopen"))
      << daemon_->output();
  EXPECT_NE(Attach(), nullptr);
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
}

TEST_F(TierkvdOpsTest, SighupRereadsTheLogLevelFromTheConfig) {
  const std::string config = dir_ + "/tierkvd.conf";
  const std::string log = dir_ + "/tierkvd.log";
  std::ofstream(config) << "log-level = info\n";
  StartDaemon(Flags({"--config", config, "--log-file", log}));
  auto admin_stats = [&] {
    auto admin =
        ChildProcess::Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
    EXPECT_THAT(admin, IsOk());
    if (!admin.ok()) return -1;
    const int code = (*admin)->Wait();
    EXPECT_THAT((*admin)->output(), HasSubstr("workers: 0"));
    return code;
  };
  // At info, tierkvd does not log the admin's requests.
  ASSERT_EQ(admin_stats(), 0);

  std::ofstream(config) << "# more detail\nlog-level = debug\n";
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitForFileText(log, "log level info -> debug")) << ReadFile(log);
  ASSERT_EQ(admin_stats(), 0);
  ASSERT_TRUE(WaitForFileText(log, "Stats on the socket")) << ReadFile(log);
  EXPECT_EQ(Count(ReadFile(log), "Stats on the socket"), 1u);

  // A setting SIGHUP cannot apply is named, not silently ignored.
  std::ofstream(config) << "log-level = debug\nmax-workers = 8\n";
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitForFileText(
      log, config + " changes max-workers since tierkvd started; only "
                    "log-level applies on SIGHUP"))
      << ReadFile(log);

  // A file that no longer parses: named with its line, the level stays.
  std::ofstream(config) << "log-level = debug\nlog-level at last\n";
  daemon_->Signal(SIGHUP);
  ASSERT_TRUE(WaitForFileText(log, config + ":2: expected 'key = value'"))
      << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("; keeping log level debug"));
  ASSERT_EQ(admin_stats(), 0);  // Still serving, still at debug.
  ASSERT_TRUE(WaitForFile(log, [](const std::string& text) {
    return Count(text, "Stats on the socket") == 2;
  })) << ReadFile(log);

  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
}

TEST_F(TierkvdOpsTest, ALogFileThatCannotBeOpenedStopsTheStart) {
  const std::string plain = dir_ + "/plain";
  std::ofstream(plain) << "a file, not a folder\n";
  auto daemon = Spawn(Flags({"--log-file", plain + "/tierkvd.log"}));
  EXPECT_EQ(daemon->Wait(), 2);  // A bad flag's value.
  EXPECT_THAT(daemon->output(),
              HasSubstr("cannot open log file " + plain + "/tierkvd.log"));
  // It never served.
  EXPECT_FALSE(notify_->Receive(std::chrono::milliseconds(0)).has_value());
  EXPECT_FALSE(std::filesystem::exists(socket_));
}

TEST_F(TierkvdOpsTest, ConfigFileConfiguresTheDaemonAndFlagsOverrideIt) {
  const std::string config = dir_ + "/tierkvd.conf";
  std::ofstream(config) << "# a store of 64 host slots of 16 KiB\n"
                        << "store = " << store_ << "\n"
                        << "socket = " << socket_ << "\n"
                        << "layers = 2\nkv-heads = 2\nhead-dim = 64\n"
                        << "dtype = bf16\nhost-capacity = 1M\n";
  StartDaemon({"--config", config, "--host-capacity", "512K"});
  EXPECT_THAT(ready_.text, HasSubstr(socket_));
  std::unique_ptr<Client> client = Attach();
  ASSERT_NE(client, nullptr);
  // 512 KiB of 16 KiB slots, less the null slot; the file's 1M gives 63.
  EXPECT_EQ(client->Stats().value().host.capacity_slots, 31);
}

TEST_F(TierkvdOpsTest, ABadConfigFileIsRefusedWithItsLine) {
  const std::string config = dir_ + "/tierkvd.conf";
  std::ofstream(config) << "layers = 2\nkv-heads = 2\nhead-dim = 64\n"
                        << "host-capacity = lots\n";
  auto daemon = Spawn({"--config", config});
  EXPECT_EQ(daemon->Wait(), 2);
  EXPECT_THAT(daemon->output(),
              HasSubstr(config + ":4: host-capacity: 'lots' is not a size"));
}

TEST_F(TierkvdOpsTest, FeedsTheSystemdWatchdogWhileServing) {
  daemon_ = SpawnUnderWatchdog("200000", Flags());
  AwaitReady();
  EXPECT_EQ(ready_.sender, daemon_->pid());  // WATCHDOG_PID named it.
  // Every 100 ms, half the interval: several within a second or so.
  for (int i = 0; i < 3; ++i) {
    auto pet = notify_->Receive(std::chrono::seconds(2));
    ASSERT_TRUE(pet.has_value()) << "pet " << i << "\n" << daemon_->output();
    EXPECT_EQ(pet->text, "WATCHDOG=1");
    EXPECT_EQ(pet->sender, daemon_->pid());
  }
  EXPECT_THAT(daemon_->output(),
              HasSubstr("systemd watchdog every 200 ms: notifying every "
                        "100 ms"));

  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(), 0) << daemon_->output();
  // Exited: everything it sent is queued. The pets stopped before STOPPING.
  std::vector<std::string> rest;
  while (auto m = notify_->Receive(std::chrono::milliseconds(0))) {
    rest.push_back(m->text);
  }
  ASSERT_FALSE(rest.empty());
  EXPECT_THAT(rest.back(), HasSubstr("STOPPING=1"));
  for (size_t i = 0; i + 1 < rest.size(); ++i) EXPECT_EQ(rest[i], "WATCHDOG=1");
}

TEST_F(TierkvdOpsTest, AWatchdogForAnotherProcessIsNotFed) {
  // systemd's variables, but for pid 1: an inherited environment.
  daemon_ = Spawn(Flags(), {"WATCHDOG_USEC=100000", "WATCHDOG_PID=1"});
  AwaitReady();
  daemon_->Signal(SIGTERM);
  ASSERT_EQ(daemon_->Wait(), 0) << daemon_->output();
  // A watchdog pets at once when it starts; none did.
  std::vector<std::string> rest;
  while (auto m = notify_->Receive(std::chrono::milliseconds(0))) {
    rest.push_back(m->text);
  }
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_THAT(rest[0], HasSubstr("STOPPING=1"));
  EXPECT_THAT(daemon_->output(), Not(HasSubstr("watchdog")));
}

// The watchdog in-process: it pets while its check passes, and only then.
TEST(TierkvdWatchdogTest, PetsOnlyWhileTheCheckPasses) {
  std::mutex mu;
  std::condition_variable changed;
  bool healthy = true;             // GUARDED_BY(mu)
  int pets = 0;                    // GUARDED_BY(mu)
  int failed_checks = 0;           // GUARDED_BY(mu)
  int pets_at_first_failure = -1;  // GUARDED_BY(mu)
  auto check = [&] {
    std::lock_guard<std::mutex> lock(mu);
    changed.notify_all();
    if (healthy) return Status::Ok();
    // The pet after the last passing check has run: pets never overlap.
    if (failed_checks++ == 0) pets_at_first_failure = pets;
    return Status::Unavailable("the coordinator's mutex was not free");
  };
  auto pet = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++pets;
    changed.notify_all();
  };
  auto wait_for = [&](const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(20), done);
  };
  auto watchdog =
      daemon::Watchdog::Start(std::chrono::milliseconds(1), check, pet);
  ASSERT_TRUE(wait_for([&] { return pets >= 3; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    healthy = false;
  }
  ASSERT_TRUE(wait_for([&] { return failed_checks >= 5; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(pets, pets_at_first_failure);  // Silent while failing.
    healthy = true;
  }
  ASSERT_TRUE(wait_for([&] { return pets > pets_at_first_failure; }));
  watchdog.reset();
}

// --mode governs what tierkvd creates on disk too, whatever the umask of
// the shell that started it.
TEST_F(TierkvdOpsTest, DiskFilesAndLogFileFollowTheMode) {
  for (const auto& [mode, file_mode, dir_mode] :
       {std::tuple{"0600", 0600, 0700}, std::tuple{"0640", 0640, 0750}}) {
    SCOPED_TRACE(mode);
    const std::string disk = dir_ + "/disk" + mode;
    const std::string log = dir_ + "/tierkvd" + mode + ".log";
    StartDaemon(Flags({"--mode", mode, "--disk-dir", disk, "--log-file", log}));
    daemon_->Signal(SIGTERM);
    ASSERT_EQ(daemon_->Wait(), 0) << daemon_->output();
    daemon_.reset();
    auto stopping = notify_->Receive(std::chrono::seconds(20));
    ASSERT_TRUE(stopping.has_value());
    ASSERT_THAT(stopping->text, HasSubstr("STOPPING=1"));
    namespace fs = std::filesystem;
    auto bits = [](const fs::path& p) {
      return static_cast<int>(fs::status(p).permissions() & fs::perms::all);
    };
    EXPECT_EQ(bits(log), file_mode);
    EXPECT_EQ(bits(disk), dir_mode);
    int files = 0;
    for (const fs::directory_entry& entry :
         fs::recursive_directory_iterator(disk)) {
      EXPECT_EQ(bits(entry.path()), entry.is_directory() ? dir_mode : file_mode)
          << entry.path();
      ++files;
    }
    EXPECT_GT(files, 0);
  }
}

TEST_F(TierkvdOpsTest, ADiskDirWithoutItsParentNamesTheParent) {
  auto daemon = Spawn(Flags({"--disk-dir", dir_ + "/no/such/disk"}));
  EXPECT_NE(daemon->Wait(), 0);
  EXPECT_THAT(daemon->output(), HasSubstr("--disk-dir " + dir_ +
                                          "/no/such/disk: its parent "
                                          "directory " +
                                          dir_ +
                                          "/no/such does not exist; "
                                          "create it first"));
}

TEST(StopWithinTest, ReturnsOnceStopHasReturned) {
  bool stopped = false;
  daemon::StopWithin(std::chrono::seconds(30), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stopped = true;
  });
  EXPECT_TRUE(stopped);
}

TEST(StopWithinDeathTest, AStopThatHangsEndsTheProcessWithStatus1) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        alarm(60);  // A StopWithin that fails to exit fails, not hangs.
        auto log = daemon::DaemonLog::Open("");  // Log lines on stderr.
        daemon::StopWithin(std::chrono::seconds(1), [] {
          for (;;) pause();
        });
      },
      ::testing::ExitedWithCode(1), "did not stop within 1 s");
}

}  // namespace
}  // namespace tierkv
