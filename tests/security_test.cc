// Hostile local peers against a real tierkvd: a worker that tries to resize
// the memory tierkvd maps, a fake daemon of another user, lock files planted
// by another user, group members (supplementary groups included) and who may
// give operator orders. Tests that need a second user make one with
// useradd (they need root, and say so when skipped).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "ipc/server.h"
#include "ipc/stats_page.h"
#include "src/printable.h"
#include "tests/tierkvd_fixture.h"
#include "tiers/host_tier.h"
#include "tiers/shm_segment.h"

namespace tierkv {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- Sealed segments --------------------------------------------------------

class SealedTest : public TierkvdFixture {};

TEST_F(SealedTest, AWorkerCannotResizeTheSegmentsItIsGiven) {
  StartDaemonWithDisk(16);
  std::unique_ptr<RawWorker> hostile = RawAttach("hostile");
  ASSERT_NE(hostile, nullptr);
  for (const int fd : {hostile->host.get(), hostile->channel.get()}) {
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    errno = 0;
    EXPECT_NE(ftruncate(fd, 0), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(ftruncate(fd, st.st_size / 2), 0);
    EXPECT_NE(ftruncate(fd, st.st_size * 2), 0);
    EXPECT_NE(fallocate(fd, 0, st.st_size, 4096), 0);
    // Nor can it add a seal of its own (F_SEAL_SEAL).
    EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_GT(st.st_size, 0);
  }
  // tierkvd keeps serving, spills included: workers store more blocks than
  // the host tier holds and read them back (those the disk kept: a block
  // evicted before its spill finished is a miss), none of them wrong.
  auto fill = ManyWorker("fill", 3, 40);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  hostile.reset();  // Detached: SettledStats waits for the observer alone.
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const CoordinatorStats settled = SettledStats(*observer);
  EXPECT_GT(settled.host.spills, 0u);
  auto verify = ManyWorker("verify", 3, 40);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  EXPECT_THAT(verify->output(), HasSubstr("wrong 0"));
  EXPECT_THAT(verify->output(), Not(HasSubstr(" hit 0 ")));
}

TEST(SealedSegmentTest, AnUnsealedOrResizableSegmentIsRefused) {
  const int unsealed = memfd_create("tierkv-test", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 1 << 16), 0);
  StatusOr<ShmSegment> refused = ShmSegment::MapSealed(unsealed, true);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();

  // Sealed against growing only: it could still be shrunk under a reader.
  const int half = memfd_create("tierkv-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(half, 0);
  ASSERT_EQ(ftruncate(half, 1 << 16), 0);
  ASSERT_EQ(fcntl(half, F_ADD_SEALS, F_SEAL_GROW), 0);
  EXPECT_EQ(ShmSegment::MapSealed(half, true).status().code(),
            StatusCode::kFailedPrecondition);

  StatusOr<ShmSegment> made = ShmSegment::CreateSealed(1 << 16, "test");
  ASSERT_THAT(made, IsOk());
  StatusOr<ShmSegment> mapped = ShmSegment::MapSealed(dup(made->fd()), true);
  ASSERT_THAT(mapped, IsOk());
  EXPECT_EQ(mapped->size(), size_t{1} << 16);
  made->data()[100] = std::byte{7};
  EXPECT_EQ(mapped->data()[100], std::byte{7});
}

// --- Names ------------------------------------------------------------------

TEST(PrintableNameTest, ControlBytesAreEscapedLongNamesCut) {
  EXPECT_EQ(PrintableName("engine-0"), "engine-0");
  EXPECT_EQ(PrintableName("a\nb\x1b[31mc"), "a\\x0ab\\x1b[31mc");
  EXPECT_EQ(PrintableName(PrintableName("a\nb")), PrintableName("a\nb"));
  EXPECT_EQ(PrintableName(std::string("\xff\0", 2)), "\\xff\\x00");
  const std::string cut = PrintableName(std::string(500, 'x'));
  EXPECT_EQ(cut.size(), kMaxPrintableName);
  EXPECT_TRUE(cut.ends_with("..."));
}

class NamesTest : public TierkvdFixture {};

// A worker name with a newline and an escape sequence can neither forge a
// log line nor reach the operator's terminal.
TEST_F(NamesTest, AWorkersNameCannotForgeLogLinesOrReachTheTerminal) {
  StartDaemon();
  std::unique_ptr<RawWorker> evil =
      RawAttach("x\n[info] worker 9 attached: pid 1\x1b[2J");
  ASSERT_NE(evil, nullptr);
  EXPECT_TRUE(daemon_->WaitForOutput("x\\x0a[info] worker 9"))
      << daemon_->output();
  EXPECT_EQ(daemon_->output().find('\x1b'), std::string::npos);
  EXPECT_EQ(daemon_->output().find("\n[info] worker 9"), std::string::npos);
  auto workers = Spawn(
      // Over the socket: the stats page may not show the worker yet.
      {TIERKV_ADMIN_PATH, "workers", "--socket", socket_, "--store", store_,
       "--source", "socket"});
  EXPECT_EQ(workers->Wait(), 0) << workers->output();
  EXPECT_EQ(workers->output().find('\x1b'), std::string::npos);
  EXPECT_THAT(workers->output(), HasSubstr("x\\x0a"));
}

// --- Tenant isolation -------------------------------------------------------

class TenantIsolationSegmentsTest : public TierkvdFixture {
 protected:
  std::unique_ptr<ChildProcess> TenantWorker(const std::string& tenant,
                                             const std::string& mode, int seed,
                                             int requests) {
    return Spawn({TEST_WORKER_PATH, "--model", "", "--tenant", tenant, mode,
                  socket_, std::to_string(seed), std::to_string(requests)});
  }
  static ino_t Inode(int fd) {
    struct stat st {};
    EXPECT_EQ(fstat(fd, &st), 0);
    return st.st_ino;
  }
};

TEST_F(TenantIsolationSegmentsTest, EachTenantMapsASegmentOfItsOwn) {
  StartDaemon();
  std::unique_ptr<RawWorker> a1 = RawAttach("a1", "tenant-a");
  std::unique_ptr<RawWorker> a2 = RawAttach("a2", "tenant-a");
  std::unique_ptr<RawWorker> b = RawAttach("b", "tenant-b");
  ASSERT_TRUE(a1 && a2 && b);
  EXPECT_EQ(Inode(a1->host.get()), Inode(a2->host.get()));
  EXPECT_NE(Inode(a1->host.get()), Inode(b->host.get()));
  // Each channel is its worker's alone.
  EXPECT_NE(Inode(a1->channel.get()), Inode(a2->channel.get()));
}

// A worker of tenant A writes 0xAA over every slot it can map while tenant
// B's blocks sit in host memory and spill to disk: B reads back every byte
// it stored, and nothing of B's was found changed.
TEST_F(TenantIsolationSegmentsTest, AnotherTenantsWorkerCannotTouchItsBlocks) {
  StartDaemonWithDisk(16);
  auto fill = TenantWorker("tenant-b", "fill", 11, 12);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();

  std::unique_ptr<RawWorker> hostile = RawAttach("hostile", "tenant-a");
  ASSERT_NE(hostile, nullptr);
  StatusOr<ShmSegment> mapping =
      ShmSegment::MapSealed(hostile->host.release(), /*writable=*/true);
  ASSERT_THAT(mapping, IsOk());
  std::memset(mapping->data(), 0xAA, mapping->size());
  hostile.reset();

  // More of B's blocks than the host holds: B's first ones spill to disk.
  auto more = TenantWorker("tenant-b", "fill", 12, 24);
  ASSERT_EQ(more->Wait(), 0) << more->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const CoordinatorStats settled = SettledStats(*observer);
  EXPECT_GT(settled.host.spills, 0u);
  EXPECT_EQ(settled.host.corrupt_slots_dropped, 0u);
  for (const auto& [seed, requests] : {std::pair{11, 12}, std::pair{12, 24}}) {
    auto verify = TenantWorker("tenant-b", "verify", seed, requests);
    ASSERT_EQ(verify->Wait(), 0) << verify->output();
    EXPECT_THAT(verify->output(), HasSubstr("wrong 0"));
    EXPECT_THAT(verify->output(), Not(HasSubstr(" hit 0 ")));
  }
  EXPECT_EQ(observer->Stats().value().host.corrupt_slots_dropped, 0u);
}

TEST_F(TenantIsolationSegmentsTest, TenantsPastTheCapAreRefused) {
  StartDaemon("1M", {"--max-tenants", "2"});
  std::unique_ptr<RawWorker> a = RawAttach("a", "tenant-a");
  std::unique_ptr<RawWorker> b = RawAttach("b", "tenant-b");
  ASSERT_TRUE(a && b);
  ClientOptions options = ClientOptionsFor("c");
  options.tenant = "tenant-c";
  StatusOr<std::unique_ptr<Client>> c = Client::Open(options);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted)
      << c.status().ToString();
  EXPECT_THAT(c.status().message(), HasSubstr("max_tenants"));
  // A known tenant still attaches.
  options.tenant = "tenant-a";
  EXPECT_THAT(Client::Open(options), IsOk());
  // Once tenant B's worker has gone (tierkvd sees its socket close), C
  // takes B's segment, with new memory.
  b.reset();
  options.tenant = "tenant-c";
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    c = Client::Open(options);
    if (c.ok() || std::chrono::steady_clock::now() > deadline) break;
    ASSERT_EQ(c.status().code(), StatusCode::kResourceExhausted)
        << c.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ((*c)->Stats().value().host.tenants_reclaimed, 1u);
}

// Bytes of memory a segment holds now.
int64_t Resident(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return static_cast<int64_t>(st.st_blocks) * 512;
}

// A slot that moves to another tenant's segment gives its pages in the old
// one back: a worker of the old tenant reads zeroes there, not the block it
// once held, and the old segment's memory shrinks by the slot.
TEST(TenantIsolationHostTierTest, AMovedSlotGivesBackItsPagesInTheOldSegment) {
  constexpr size_t kSlotBytes = 4 * 4096;
  StatusOr<std::unique_ptr<HostTier>> host =
      HostTier::Create({.shared = true,
                        .max_segments = 2,
                        .num_slots = 4,
                        .slot_bytes = kSlotBytes,
                        .layout_fingerprint = "test"});
  ASSERT_THAT(host, IsOk());
  HostTier& tier = **host;
  ASSERT_THAT(tier.EnsureSegment(1), IsOk());
  EXPECT_EQ(tier.EnsureSegment(2).code(), StatusCode::kInvalidArgument);
  StatusOr<ShmSegment> first =
      ShmSegment::MapSealed(dup(tier.segment_fd(0)), /*writable=*/false);
  ASSERT_THAT(first, IsOk());
  const size_t slot2 = 4096 + 2 * kSlotBytes;  // After the header page.

  std::memset(tier.slot(2), 0x5A, kSlotBytes);
  std::memset(tier.slot(3), 0x3C, kSlotBytes);
  EXPECT_EQ(first->data()[slot2], std::byte{0x5A});
  const int64_t before = Resident(tier.segment_fd(0));
  ASSERT_THAT(tier.AssignSlot(2, 1), IsOk());
  EXPECT_EQ(Resident(tier.segment_fd(0)),
            before - static_cast<int64_t>(kSlotBytes));
  EXPECT_EQ(tier.slot(2)[0], std::byte{0});  // Fresh memory in segment 1.
  for (size_t i = 0; i < kSlotBytes; ++i) {
    ASSERT_EQ(first->data()[slot2 + i], std::byte{0}) << i;
  }
  // Its neighbour in segment 0 is untouched.
  EXPECT_EQ(first->data()[slot2 + kSlotBytes], std::byte{0x3C});
  std::memset(tier.slot(2), 0x77, kSlotBytes);
  EXPECT_EQ(first->data()[slot2], std::byte{0});
}

// A tenant's worker writes over its whole segment, slots of other tenants
// included; once the tenant's last worker is gone, Trim gives back all
// but the tenant's own slots.
TEST(TenantIsolationHostTierTest, TrimKeepsOnlyTheTenantsOwnSlots) {
  constexpr size_t kSlotBytes = 2 * 4096;
  constexpr int32_t kSlots = 16;
  StatusOr<std::unique_ptr<HostTier>> host =
      HostTier::Create({.shared = true,
                        .max_segments = 2,
                        .num_slots = kSlots,
                        .slot_bytes = kSlotBytes,
                        .layout_fingerprint = "test"});
  ASSERT_THAT(host, IsOk());
  HostTier& tier = **host;
  ASSERT_THAT(tier.EnsureSegment(1), IsOk());
  ASSERT_THAT(tier.AssignSlot(5, 1), IsOk());
  ASSERT_THAT(tier.AssignSlot(6, 1), IsOk());
  StatusOr<ShmSegment> worker =
      ShmSegment::MapSealed(dup(tier.segment_fd(1)), /*writable=*/true);
  ASSERT_THAT(worker, IsOk());
  std::memset(worker->data() + 4096, 0xAA, kSlotBytes * (kSlots - 1));
  const int64_t everything = Resident(tier.segment_fd(1));
  EXPECT_GE(everything, static_cast<int64_t>(kSlotBytes * (kSlots - 1)));

  tier.Trim(1);
  // The header page, slots 5 and 6.
  EXPECT_EQ(Resident(tier.segment_fd(1)),
            static_cast<int64_t>(4096 + 2 * kSlotBytes));
  EXPECT_EQ(tier.slot(5)[0], std::byte{0xAA});
  EXPECT_EQ(tier.slot(6)[kSlotBytes - 1], std::byte{0xAA});
  const size_t slot4 = 4096 + 4 * kSlotBytes;
  EXPECT_EQ(worker->data()[slot4], std::byte{0});
}

// --- Who is on the other end -------------------------------------------------

constexpr uid_t kNobody = 65534;

class PeerCheckTest : public TierkvdFixture {};

TEST_F(PeerCheckTest, TheDefaultSocketIsNeverInTmp) {
  const char* saved = std::getenv("XDG_RUNTIME_DIR");
  const std::string restore = saved != nullptr ? saved : "";
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(ipc::DefaultSocketPath("s"), "/run/tierkv/tierkv-s.sock");
  setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  EXPECT_EQ(ipc::DefaultSocketPath("s"), "/run/user/1000/tierkv-s.sock");
  if (saved != nullptr) {
    setenv("XDG_RUNTIME_DIR", restore.c_str(), 1);
  } else {
    unsetenv("XDG_RUNTIME_DIR");
  }
}

// A fake daemon: a child process that listens on `path` as nobody, then
// reports how many bytes its first connection sent before closing.
class FakeDaemon {
 public:
  explicit FakeDaemon(const std::string& path) {
    int ready[2], report[2];
    if (pipe(ready) != 0 || pipe(report) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
      const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
          listen(fd, 4) != 0) {
        _exit(3);
      }
      chmod(path.c_str(), 0666);
      if (write(ready[1], "r", 1) != 1) _exit(4);
      const int conn = accept(fd, nullptr, nullptr);
      int64_t received = 0;
      char buf[4096];
      for (ssize_t n; (n = read(conn, buf, sizeof(buf))) > 0;) {
        received += n;
        close(conn);  // Enough to know something was sent.
        break;
      }
      if (write(report[1], &received, sizeof(received)) != sizeof(received)) {
        _exit(5);
      }
      _exit(0);
    }
    close(ready[1]);
    close(report[1]);
    char c;
    listening_ = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    report_ = report[0];
  }
  ~FakeDaemon() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    close(report_);
  }
  bool listening() const { return listening_; }
  // Bytes the client sent it (after the client has given up).
  int64_t Received() {
    int64_t received = -1;
    if (read(report_, &received, sizeof(received)) != sizeof(received)) {
      return -1;
    }
    return received;
  }

 private:
  pid_t pid_ = -1;
  int report_ = -1;
  bool listening_ = false;
};

class PeerCheckFakeDaemonTest : public PeerCheckTest {
 protected:
  void SetUp() override {
    PeerCheckTest::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "needs root to listen as nobody";
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  }
  // A directory `mode`, of `owner`, made under dir_.
  std::string Dir(const std::string& name, mode_t mode, uid_t owner) {
    const std::string path = dir_ + "/" + name;
    EXPECT_EQ(mkdir(path.c_str(), mode), 0);
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    EXPECT_EQ(chown(path.c_str(), owner, owner), 0);
    return path;
  }
  StatusOr<std::unique_ptr<Client>> Open(const std::string& path) {
    ClientOptions options = ClientOptionsFor("test");
    options.socket_path = path;
    options.call_timeout = std::chrono::seconds(5);
    return Client::Open(options);
  }
};

// In a directory anyone may write (as /tmp is), anyone could be listening:
// the client refuses it before sending a byte.
TEST_F(PeerCheckFakeDaemonTest,
       AClientSendsNothingToAnotherUserInASharedDirectory) {
  const std::string path = Dir("shared", 01777, 0) + "/tierkv-default.sock";
  FakeDaemon fake(path);
  ASSERT_TRUE(fake.listening());
  StatusOr<std::unique_ptr<Client>> client = Open(path);
  EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied)
      << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("runs as uid 65534"));
  EXPECT_EQ(fake.Received(), 0);
}

// The user's own directory, but inside one others may write (not sticky):
// they could have renamed it away and put theirs in its place.
TEST_F(PeerCheckFakeDaemonTest, AnOwnDirectoryUnderAWritableOneIsNotTrusted) {
  const std::string open = Dir("open", 0777, 0);
  ASSERT_EQ(mkdir((open + "/run").c_str(), 0755), 0);
  ASSERT_EQ(chown((open + "/run").c_str(), kNobody, kNobody), 0);
  const std::string path = open + "/run/tierkv-default.sock";
  FakeDaemon fake(path);
  ASSERT_TRUE(fake.listening());
  EXPECT_EQ(Open(path).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(fake.Received(), 0);
}

// A directory only that user (and root, above it) could have made, as
// /run/tierkv under the systemd unit: the listener is trusted as tierkvd.
TEST_F(PeerCheckFakeDaemonTest, TheOwnerOfAPrivateDirectoryIsTrusted) {
  const std::string path = Dir("run", 0755, kNobody) + "/tierkv-default.sock";
  FakeDaemon fake(path);
  ASSERT_TRUE(fake.listening());
  StatusOr<std::unique_ptr<Client>> client = Open(path);
  EXPECT_NE(client.status().code(), StatusCode::kPermissionDenied)
      << client.status().ToString();
  EXPECT_GT(fake.Received(), 0);  // The registration went out.
}

// Another user takes the stats page's name in /dev/shm and publishes
// forged stats there: tierkvd starts without a page, and tierkv-admin
// reads the real stats over the socket, never the forged ones.
TEST_F(PeerCheckTest, AForgedStatsPageIsNeverRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to publish as nobody";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t forger = fork();
  ASSERT_GE(forger, 0);
  if (forger == 0) {
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
    StatusOr<ipc::StatsPageWriter> page = ipc::StatsPageWriter::Create(
        {.name = ipc::StatsPageName(store_),
         .socket_path = socket_,
         .max_workers = 4,
         .mode = 0644,
         .group = std::nullopt,
         .interval = std::chrono::milliseconds(100)});
    if (!page.ok()) _exit(3);
    CoordinatorStats forged;
    forged.host.capacity_slots = 4242;
    if (write(ready[1], "r", 1) != 1) _exit(4);
    for (;;) {  // Fresh until killed.
      (void)page->Publish(forged, std::chrono::system_clock::now());
      usleep(50'000);
    }
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);

  StartDaemon();
  EXPECT_TRUE(daemon_->WaitForOutput("stats page:")) << daemon_->output();
  auto stats = Spawn(
      {TIERKV_ADMIN_PATH, "stats", "--store", store_, "--socket", socket_});
  EXPECT_EQ(stats->Wait(), 0) << stats->output();
  EXPECT_THAT(stats->output(), Not(HasSubstr("4242")));
  EXPECT_THAT(stats->output(), HasSubstr("source: tierkvd's socket"));
  auto page_only = Spawn({TIERKV_ADMIN_PATH, "stats", "--store", store_,
                          "--socket", socket_, "--source", "page"});
  EXPECT_NE(page_only->Wait(), 0);
  EXPECT_THAT(page_only->output(), HasSubstr("belongs to uid 65534"));
  kill(forger, SIGKILL);
  waitpid(forger, nullptr, 0);
  ShmSegment::Remove(ipc::StatsPageName(store_));
}

// A socket named like the store's lock file: still two locks, not one.
TEST_F(PeerCheckTest, ASocketNamedLikeTheStoreLockStarts) {
  socket_ = dir_ + "/tierkv-" + store_;
  StartDaemon();
  std::unique_ptr<Client> c = Attach();
  EXPECT_NE(c, nullptr);
}

TEST_F(PeerCheckTest, ASymlinkedLockFileIsRefusedAndItsTargetKept) {
  const std::string victim = dir_ + "/precious";
  std::ofstream(victim) << "keep me";
  ASSERT_EQ(
      symlink(victim.c_str(), ipc::StoreLockPath(store_, socket_).c_str()), 0);
  auto daemon = Spawn(DaemonArgs("1M"));
  EXPECT_NE(daemon->Wait(), 0);
  EXPECT_THAT(daemon->output(), HasSubstr("symbolic link"));
  EXPECT_EQ(ReadFile(victim), "keep me");
}

TEST_F(PeerCheckTest, AnotherUsersLockFileIsRefusedUntouched) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a file to nobody";
  const std::string lock = socket_ + ".lock";
  std::ofstream(lock) << "12345";
  ASSERT_EQ(chown(lock.c_str(), kNobody, kNobody), 0);
  auto daemon = Spawn(DaemonArgs("1M"));
  EXPECT_NE(daemon->Wait(), 0);
  EXPECT_THAT(daemon->output(), HasSubstr("not a regular file of uid"));
  EXPECT_EQ(ReadFile(lock), "12345");
}

// --- Groups and operator rights ---------------------------------------------

// A group, a user with it as a supplementary group only (its primary group
// is its own) and a user outside it, made once per machine.
struct TestUsers {
  static constexpr char kGroup[] = "tierkv-test-g";
  static constexpr char kMember[] = "tierkv-test-m";
  static constexpr char kOutsider[] = "tierkv-test-o";

  // Skips the test (with the reason) when users cannot be made here.
  static bool Ensure(std::string* why) {
    if (geteuid() != 0) {
      *why = "needs root to add users";
      return false;
    }
    if (access("/usr/sbin/useradd", X_OK) != 0 ||
        access("/usr/bin/setpriv", X_OK) != 0) {
      *why = "needs useradd and setpriv";
      return false;
    }
    // Test processes run side by side: one adds the users at a time.
    const int lock = open("/run/lock/tierkv-test-users.lock",
                          O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) != 0) {
      *why = "cannot lock /run/lock/tierkv-test-users.lock";
      return false;
    }
    auto run = [](const std::string& command) {
      return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
    };
    bool ok = true;
    if (getgrnam(kGroup) == nullptr) {
      ok &= run(std::string("groupadd --system ") + kGroup);
    }
    if (getpwnam(kMember) == nullptr) {
      ok &= run(std::string("useradd --system --no-create-home --user-group "
                            "--shell /usr/sbin/nologin --groups ") +
                kGroup + " " + kMember);
    }
    if (getpwnam(kOutsider) == nullptr) {
      ok &= run(std::string("useradd --system --no-create-home --user-group "
                            "--shell /usr/sbin/nologin ") +
                kOutsider);
    }
    close(lock);
    if (!ok || getgrnam(kGroup) == nullptr || getpwnam(kMember) == nullptr ||
        getpwnam(kOutsider) == nullptr) {
      *why = "groupadd or useradd failed";
      return false;
    }
    return true;
  }

  // argv that runs `command` as `user`, with its groups from /etc/group.
  static std::vector<std::string> As(const std::string& user,
                                     std::vector<std::string> command) {
    const passwd* pw = getpwnam(user.c_str());
    std::vector<std::string> argv = {
        "/usr/bin/setpriv", "--reuid=" + std::to_string(pw->pw_uid),
        "--regid=" + std::to_string(pw->pw_gid), "--init-groups", "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }
};

class SupplementaryGroupTest : public TierkvdFixture {
 protected:
  void SetUp() override {
    TierkvdFixture::SetUp();
    std::string why;
    if (!TestUsers::Ensure(&why)) GTEST_SKIP() << why;
    // The other users reach the socket through the scratch directory.
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  }
};

TEST_F(SupplementaryGroupTest, AMemberByItsSupplementaryGroupAttaches) {
  const group* g = getgrnam(TestUsers::kGroup);
  const passwd* member = getpwnam(TestUsers::kMember);
  ASSERT_NE(member->pw_gid, g->gr_gid) << "the group must be supplementary";
  // The kernel lets the member connect (the socket is 0660, group kGroup)
  // by its supplementary group; tierkvd must admit it by that group too,
  // not only by its primary one.
  StartDaemon("1M", {"--group", TestUsers::kGroup, "--mode", "0660"});
  auto in = Spawn(TestUsers::As(
      TestUsers::kMember, {TEST_WORKER_PATH, "store", socket_, "5", "3"}));
  EXPECT_EQ(in->Wait(), 0) << in->output();
  EXPECT_THAT(in->output(), HasSubstr("checksum"));
  EXPECT_TRUE(daemon_->WaitForOutput("pid " + std::to_string(in->pid()) +
                                     ", 'store-5'"))
      << daemon_->output();

  auto out = Spawn(TestUsers::As(
      TestUsers::kOutsider, {TEST_WORKER_PATH, "store", socket_, "5", "3"}));
  EXPECT_NE(out->Wait(), 0);
  EXPECT_THAT(out->output(), HasSubstr("Permission denied"));
}

// The events carry every tenant's token ids: --group (engine users) does
// not reach the ipc:// event sockets; --kv-events-group (routers) does,
// with the socket's mode, and others still do not.
TEST_F(SupplementaryGroupTest, IpcKvEventSocketsAreGivenOnlyTheEventsGroup) {
  const std::string events = dir_ + "/events.sock";
  const std::string replay = dir_ + "/replay.sock";
  const std::vector<std::string> publish = {"--group",
                                            TestUsers::kGroup,
                                            "--mode",
                                            "0660",
                                            "--kv-events-endpoint",
                                            "ipc://" + events,
                                            "--kv-events-replay-endpoint",
                                            "ipc://" + replay};
  const gid_t gid = getgrnam(TestUsers::kGroup)->gr_gid;
  // Whether `user` may connect to `path`, as the kernel decides.
  const auto connects = [](const std::string& user, const std::string& path) {
    auto c = Spawn(TestUsers::As(
        user, {"/usr/bin/python3", "-c",
               "import socket,sys; s=socket.socket(socket.AF_UNIX); "
               "s.connect(sys.argv[1]); print('connected')",
               path}));
    const int rc = c->Wait();
    EXPECT_THAT(c->output(),
                AnyOf(HasSubstr("connected"), HasSubstr("Permission denied")));
    return rc == 0;
  };
  StartDaemon("1M", publish);
  for (const std::string& path : {events, replay}) {
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_NE(st.st_gid, gid) << path;
    EXPECT_FALSE(connects(TestUsers::kMember, path)) << path;
  }
  StopDaemon();

  std::vector<std::string> routers = publish;
  routers.insert(routers.end(), {"--kv-events-group", TestUsers::kGroup});
  StartDaemon("1M", routers);
  for (const std::string& path : {events, replay}) {
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_gid, gid) << path;
    // The umask of --mode 0660: the group reads and writes, others nothing.
    EXPECT_EQ(st.st_mode & 0067, 0060u) << path;
    EXPECT_TRUE(connects(TestUsers::kMember, path)) << path;
    EXPECT_FALSE(connects(TestUsers::kOutsider, path)) << path;
  }
}

// --kv-events-group needs socket files to give: not a tcp endpoint, nor an
// abstract ipc name.
TEST_F(TierkvdFixture, KvEventsGroupNeedsIpcSocketFiles) {
  for (const std::string& endpoint :
       {std::string("tcp://127.0.0.1:1"), std::string("ipc://@tierkv-ev")}) {
    std::vector<std::string> args = DaemonArgs("1M");
    args.insert(args.end(), {"--mode", "0660", "--kv-events-endpoint", endpoint,
                             "--kv-events-group", "root"});
    auto daemon = Spawn(args);
    EXPECT_NE(daemon->Wait(), 0) << endpoint;
    EXPECT_THAT(daemon->output(), HasSubstr("not an ipc:// socket file"))
        << endpoint;
  }
}

// A tenant is a name a worker claims: another user's worker that claims
// tierkvd's user's tenant is put in a tenant of its own and sees none of
// its blocks.
TEST_F(SupplementaryGroupTest, AnotherUserCannotJoinATenantByItsName) {
  StartDaemon("1M", {"--group", TestUsers::kGroup, "--mode", "0660"});
  auto own = Spawn({TEST_WORKER_PATH, "--model", "", "--tenant", "acme", "fill",
                    socket_, "21", "4"});
  ASSERT_EQ(own->Wait(), 0) << own->output();
  auto theirs = Spawn(TestUsers::As(
      TestUsers::kMember, {TEST_WORKER_PATH, "--model", "", "--tenant", "acme",
                           "verify", socket_, "21", "4"}));
  ASSERT_EQ(theirs->Wait(), 0) << theirs->output();
  EXPECT_THAT(theirs->output(), HasSubstr(" hit 0 "));
  const uid_t member = getpwnam(TestUsers::kMember)->pw_uid;
  EXPECT_TRUE(
      daemon_->WaitForOutput("tenant 'uid" + std::to_string(member) + "/acme'"))
      << daemon_->output();
  // tierkvd's own user still finds its blocks.
  auto again = Spawn({TEST_WORKER_PATH, "--model", "", "--tenant", "acme",
                      "verify", socket_, "21", "4"});
  ASSERT_EQ(again->Wait(), 0) << again->output();
  EXPECT_THAT(again->output(), HasSubstr("wrong 0"));
  EXPECT_THAT(again->output(), Not(HasSubstr(" hit 0 ")));
}

// tierkvd's user can give the socket only to a group it is in: another
// is refused before anything is reserved or bound (exit 5), not after,
// with the socket left behind, as a failure systemd would restart forever.
TEST_F(SupplementaryGroupTest, AGroupTierkvdsUserIsNotInIsRefusedAtOnce) {
  std::vector<std::string> args = DaemonArgs("1M");
  args.insert(args.end(), {"--group", TestUsers::kGroup, "--mode", "0660"});
  auto daemon = Spawn(TestUsers::As(TestUsers::kOutsider, args));
  EXPECT_EQ(daemon->Wait(), 5) << daemon->output();
  EXPECT_THAT(daemon->output(), HasSubstr("not in that group"));
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
}

// With no thread left to serve a worker (RLIMIT_NPROC, the unit's
// TasksMax), its registration is refused; tierkvd serves on, and attaches
// the next worker once threads can start again.
TEST_F(SupplementaryGroupTest, AWorkerNoThreadCanServeIsRefused) {
  // tierkvd runs as another user, whose threads alone the limit counts.
  const passwd* outsider = getpwnam(TestUsers::kOutsider);
  ASSERT_EQ(chown(dir_.c_str(), outsider->pw_uid, outsider->pw_gid), 0);
  daemon_ = Spawn(TestUsers::As(TestUsers::kOutsider, DaemonArgs("1M")));
  ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  // Set as tierkvd's user (the same user may lower and raise its soft
  // limit; another would need CAP_SYS_RESOURCE).
  const auto nproc = [&](const std::string& soft) {
    auto set = Spawn(TestUsers::As(
        TestUsers::kOutsider,
        {"/usr/bin/prlimit", "--pid", std::to_string(daemon_->pid()),
         "--nproc=" + soft + ":"}));
    return set->Wait() == 0 ? std::string() : set->output();
  };
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NPROC, &before), 0);  // tierkvd inherited it.
  ASSERT_EQ(nproc("1"), "");
  auto refused = Spawn({TEST_WORKER_PATH, "store", socket_, "5", "3"});
  EXPECT_NE(refused->Wait(), 0) << refused->output();
  EXPECT_THAT(refused->output(), HasSubstr("session thread"));
  ASSERT_EQ(
      nproc(before.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                             : std::to_string(before.rlim_cur)),
      "");
  auto served = Spawn({TEST_WORKER_PATH, "store", socket_, "5", "3"});
  EXPECT_EQ(served->Wait(), 0) << served->output();
  EXPECT_THAT(served->output(), HasSubstr("checksum"));
}

// A log file tierkvd's user may not write is a refused permission (exit 5,
// as README's table says), not a usage error.
TEST_F(SupplementaryGroupTest, ALogFileItMayNotWriteIsAPermissionRefused) {
  std::vector<std::string> args = DaemonArgs("1M");
  args.insert(args.end(), {"--log-file", dir_ + "/tierkvd.log"});  // Root's.
  auto daemon = Spawn(TestUsers::As(TestUsers::kOutsider, args));
  EXPECT_EQ(daemon->Wait(), 5) << daemon->output();
  EXPECT_THAT(daemon->output(), HasSubstr("Permission denied"));
}

TEST_F(SupplementaryGroupTest, AGroupWithAModeThatGivesItNothingIsRefused) {
  auto daemon = Spawn([&] {
    auto args = DaemonArgs("1M");
    args.insert(args.end(), {"--group", TestUsers::kGroup, "--mode", "0600"});
    return args;
  }());
  EXPECT_NE(daemon->Wait(), 0);
  EXPECT_THAT(daemon->output(), HasSubstr("--group lets a group attach"));
  EXPECT_THAT(daemon->output(), HasSubstr("0660"));
}

class OperatorRightsTest : public SupplementaryGroupTest {
 protected:
  std::unique_ptr<ChildProcess> Admin(const std::string& user,
                                      std::vector<std::string> args) {
    std::vector<std::string> command = {TIERKV_ADMIN_PATH};
    command.insert(command.end(), args.begin(), args.end());
    command.insert(command.end(), {"--socket", socket_});
    return Spawn(user.empty() ? command : TestUsers::As(user, command));
  }
  // Whether `user` reads `name` among the workers on the stats page within
  // a few snapshots (a worker just attached may not be published yet).
  bool PageShows(const std::string& user, const std::string& name) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      auto page =
          Admin(user, {"workers", "--store", store_, "--source", "page"});
      if (page->Wait() == 0 && page->output().find(name) != std::string::npos) {
        return true;
      }
    }
    return false;
  }
};

TEST_F(OperatorRightsTest, AWorkerGroupMemberReadsStatsButCannotClear) {
  StartDaemon("1M", {"--group", TestUsers::kGroup, "--mode", "0660"});
  auto stats = Admin(TestUsers::kMember, {"stats"});
  EXPECT_EQ(stats->Wait(), 0) << stats->output();
  auto clear = Admin(TestUsers::kMember, {"clear", "--tier", "host"});
  EXPECT_NE(clear->Wait(), 0);
  EXPECT_THAT(clear->output(), HasSubstr("not clear or evict"));
  auto evict =
      Admin(TestUsers::kMember, {"evict", "0123456789abcdef0123456789abcdef"});
  EXPECT_NE(evict->Wait(), 0);
  EXPECT_THAT(evict->output(), HasSubstr("not clear or evict"));
  EXPECT_TRUE(daemon_->WaitForOutput("refused: not an operator"));
  // Nor list every tenant's keys.
  auto held = Admin(TestUsers::kMember, {"held"});
  EXPECT_NE(held->Wait(), 0);
  EXPECT_THAT(held->output(), HasSubstr("not list every tenant's keys"));
  EXPECT_TRUE(daemon_->WaitForOutput("held refused: not an operator"));
  // tierkvd's own user may.
  auto own = Admin("", {"clear", "--tier", "host"});
  EXPECT_EQ(own->Wait(), 0) << own->output();
}

TEST_F(OperatorRightsTest, TheAdminGroupMayClear) {
  StartDaemon("1M",
              {"--group", TestUsers::kGroup, "--mode", "0660", "--admin-group",
               TestUsers::kGroup, "--stats-interval-ms", "20"});
  auto clear = Admin(TestUsers::kMember, {"clear", "--tier", "host"});
  EXPECT_EQ(clear->Wait(), 0) << clear->output();
  // And sees every user's workers, on the stats page too.
  std::unique_ptr<Client> owner = Attach("owner-engine");
  ASSERT_NE(owner, nullptr);
  EXPECT_TRUE(PageShows(TestUsers::kMember, "owner-engine"));
  auto socket = Admin(TestUsers::kMember,
                      {"workers", "--store", store_, "--source", "socket"});
  ASSERT_EQ(socket->Wait(), 0) << socket->output();
  EXPECT_THAT(socket->output(), HasSubstr("owner-engine"));
}

// Another user's workers' names, pids and requests are theirs: a member of
// --group sees its own workers only, over the socket or its worker channel,
// and may not read the stats page, which lists every worker.
TEST_F(OperatorRightsTest, AWorkerGroupMemberSeesOnlyItsOwnWorkers) {
  StartDaemon("1M", {"--group", TestUsers::kGroup, "--mode", "0660",
                     "--stats-interval-ms", "20"});
  std::unique_ptr<Client> owner = Attach("owner-engine");
  ASSERT_NE(owner, nullptr);
  // tierkvd's own user sees every worker, on the socket and the page.
  auto own = Admin("", {"workers", "--store", store_, "--source", "socket"});
  ASSERT_EQ(own->Wait(), 0) << own->output();
  EXPECT_THAT(own->output(), HasSubstr("owner-engine"));
  EXPECT_TRUE(PageShows("", "owner-engine"));
  struct stat page {};
  ASSERT_EQ(stat(("/dev/shm" + ipc::StatsPageName(store_)).c_str(), &page), 0);
  EXPECT_EQ(page.st_mode & 0777, 0400u);
  for (const char* source : {"auto", "socket"}) {
    auto theirs = Admin(TestUsers::kMember,
                        {"workers", "--store", store_, "--source", source});
    ASSERT_EQ(theirs->Wait(), 0) << theirs->output();
    EXPECT_THAT(theirs->output(), Not(HasSubstr("owner-engine"))) << source;
  }
  auto page_only = Admin(TestUsers::kMember,
                         {"workers", "--store", store_, "--source", "page"});
  EXPECT_NE(page_only->Wait(), 0) << page_only->output();
  // Nor the owner's events in flight (a store not completed yet).
  std::vector<TokenId> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 7000u);
  const std::vector<BlockId> device = {1};
  ASSERT_THAT(owner->Lookup(1, tokens), IsOk());
  ASSERT_THAT(owner->Allocate(1, device, 0), IsOk());
  ASSERT_EQ(owner->Commit(1, 16, device).value().stores.size(), 1u);
  auto own_events = Admin("", {"events"});
  ASSERT_EQ(own_events->Wait(), 0) << own_events->output();
  EXPECT_THAT(own_events->output(), HasSubstr("owner-engine"));
  auto their_events = Admin(TestUsers::kMember, {"events"});
  ASSERT_EQ(their_events->Wait(), 0) << their_events->output();
  EXPECT_THAT(their_events->output(), Not(HasSubstr("owner-engine")));
  // Nor over a worker channel of its own: a member's client asks its stats.
  auto worker = Spawn(TestUsers::As(TestUsers::kMember,
                                    {TEST_WORKER_PATH, "workers", socket_}));
  ASSERT_EQ(worker->Wait(), 0) << worker->output();
  EXPECT_THAT(worker->output(), HasSubstr("worker workers-0\n"));
  EXPECT_THAT(worker->output(), Not(HasSubstr("owner-engine")));
  auto owners = Spawn({TEST_WORKER_PATH, "workers", socket_});
  ASSERT_EQ(owners->Wait(), 0) << owners->output();
  EXPECT_THAT(owners->output(), HasSubstr("worker owner-engine\n"));
}

// A route is read-only, but what is cached names a tenant's prompts: a user
// other than tierkvd's own asks only about its own tenants, as its workers
// see them. "acme" means uid<UID>/acme for that user.
TEST_F(OperatorRightsTest, AnotherUsersRouteSeesOnlyItsOwnTenants) {
  StartDaemon("1M", {"--group", TestUsers::kGroup, "--mode", "0660"});
  auto fill = Spawn({TEST_WORKER_PATH, "--model", "", "--tenant", "acme",
                     "fill", socket_, "21", "4"});
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  // fill's first one-block request (tests/fill_worker.h's tokens).
  std::string tokens;
  for (uint32_t i = 0; i < 16; ++i) {
    tokens += std::to_string((21u * 1000003u) * 16u + i) + " ";
  }
  auto own = Admin("", {"route", "--tenant", "acme", tokens});
  ASSERT_EQ(own->Wait(), 0) << own->output();
  EXPECT_THAT(own->output(),
              HasSubstr("longest cached prefix: local (16 tokens)"));
  auto theirs =
      Admin(TestUsers::kMember, {"route", "--tenant", "acme", tokens});
  ASSERT_EQ(theirs->Wait(), 0) << theirs->output();
  EXPECT_THAT(theirs->output(), HasSubstr("cached nowhere"));
  // Naming the owner's tenant in full does not reach it either.
  const uid_t owner = geteuid();
  auto spelled = Admin(
      TestUsers::kMember,
      {"route", "--tenant", "uid" + std::to_string(owner) + "/acme", tokens});
  spelled->Wait();
  EXPECT_THAT(spelled->output(), Not(HasSubstr("longest cached prefix")))
      << spelled->output();
}

}  // namespace
}  // namespace tierkv
