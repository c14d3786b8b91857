// tierkvd's life at its edges: memory that is not there (a /dev/shm too
// small for the stats page, a host capacity past the machine's memory, a
// slot whose memory cannot be reserved), a stop that spills the host tier
// and a restart that finds it on disk, a stop asked for while starting,
// what a stop and a kill leave behind, and the exit status of each class
// of failure. Real tierkvd processes; a private mount namespace with a
// tiny tmpfs on /dev/shm where the machine allows one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ipc/server.h"
#include "src/coordinator.h"
#include "tests/fill_worker.h"
#include "tests/sequential_tokens.h"
#include "tests/tierkvd_fixture.h"
#include "tiers/host_tier.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The exit status the shell script below gives when it may not make a
// private tmpfs (no CAP_SYS_ADMIN, or unshare refused).
constexpr int kNoPrivateMount = 77;

// What is left in `dir`, by name.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

class TierkvdLifecycleTest : public TierkvdFixture {
 protected:
  // A host of `slots` usable slots over a disk tier in dir_/disk with the
  // default watermarks and no write-behind: fewer than 90% of the slots
  // stay on host only until a stop spills them.
  std::vector<std::string> DiskArgs(int slots) const {
    std::vector<std::string> args =
        DaemonArgs(std::to_string((slots + 1) * TestLayout().BlockBytes()));
    for (const char* a : {"--disk-dir", "DISK", "--disk-capacity", "64M",
                          "--write-behind-spills", "0"}) {
      args.push_back(a == std::string("DISK") ? dir_ + "/disk" : a);
    }
    return args;
  }
  std::unique_ptr<ChildProcess> Run(std::vector<std::string> args) {
    return Spawn(std::move(args));
  }
};

using ShmFullTest = TierkvdLifecycleTest;
using GracefulSpillTest = TierkvdLifecycleTest;
using TierkvdLeftoversTest = TierkvdLifecycleTest;
using TierkvdExitStatusTest = TierkvdLifecycleTest;

// /dev/shm holds one page: the stats page does not fit. tierkvd reserves
// the page's memory when it makes it, so it starts without one (a warning)
// instead of dying of SIGBUS at its first write, and serves workers, whose
// segments are memfds outside /dev/shm.
TEST_F(ShmFullTest, TinyDevShmStartsWithoutStatsPageAndServes) {
  auto probe =
      Run({"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/true"});
  if (probe->Wait() != 0) {
    GTEST_SKIP() << "no private mount namespace here: " << probe->output();
  }
  std::vector<std::string> argv = {
      "/usr/bin/unshare",
      "-m",
      "--propagation",
      "private",
      "/bin/sh",
      "-c",
      "mount -t tmpfs -o size=4k tmpfs /dev/shm || exit " +
          std::to_string(kNoPrivateMount) + "; exec \"$@\"",
      "sh"};
  for (const std::string& a : DaemonArgs("1M")) argv.push_back(a);
  daemon_ = Spawn(argv);
  if (!daemon_->WaitForOutput("serving store")) {
    const int status = daemon_->Wait();
    if (status == kNoPrivateMount) {
      GTEST_SKIP() << "cannot mount a private tmpfs on /dev/shm here: "
                   << daemon_->output();
    }
    FAIL() << "exit " << status << ": " << daemon_->output();
  }
  EXPECT_THAT(daemon_->output(), HasSubstr("stats page: ResourceExhausted"));
  EXPECT_THAT(daemon_->output(),
              HasSubstr("tierkv-admin reads stats over the socket"));
  auto store = Worker("store", 5, 3);
  ASSERT_EQ(store->Wait(), 0) << store->output();
  auto load = Worker("load", 5, 3);
  ASSERT_EQ(load->Wait(), 0) << load->output();
  EXPECT_THAT(load->output(), HasSubstr("hit 48 "));
  StopDaemon();
}

// A host tier larger than the memory there is fails at once, naming the
// flag, instead of growing until the machine runs out.
TEST_F(ShmFullTest, HostCapacityOverMemoryIsRefusedNamingTheFlag) {
  auto daemon = Run(DaemonArgs("20T"));
  EXPECT_EQ(daemon->Wait(), 4) << daemon->output();
  EXPECT_THAT(daemon->output(), HasSubstr("ResourceExhausted"));
  EXPECT_THAT(daemon->output(), HasSubstr("--host-capacity of 20971520 MiB"));
  EXPECT_THAT(daemon->output(), HasSubstr("MemAvailable"));
  EXPECT_THAT(Entries(dir_), IsEmpty());  // Nothing taken, nothing left.
}

// The same where /proc/meminfo cannot be read (systemd's ProcSubset=pid
// hides it; here an empty file is bound over it in a private mount
// namespace): the machine's physical memory bounds the host tier instead.
TEST_F(ShmFullTest, HostCapacityOverMemoryIsRefusedWithoutProcMeminfo) {
  const std::string empty = dir_ + "/empty-meminfo";
  std::ofstream(empty).close();
  if (unshare(CLONE_NEWNS) != 0 ||
      mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount(empty.c_str(), "/proc/meminfo", nullptr, MS_BIND, nullptr) != 0) {
    GTEST_SKIP() << "cannot hide /proc/meminfo here: " << strerror(errno);
  }
  auto daemon = Run(DaemonArgs("20T"));
  EXPECT_EQ(daemon->Wait(), 4) << daemon->output();
  EXPECT_THAT(daemon->output(), HasSubstr("--host-capacity of 20971520 MiB"));
  EXPECT_THAT(daemon->output(), HasSubstr("of physical memory"));
  EXPECT_THAT(Entries(dir_), ::testing::ElementsAre("empty-meminfo"));
}

// Worker memory reserved slot by slot: a tenant's slot whose memory cannot
// be reserved in its segment is not handed out (a miss, counted), the slot
// stays usable, and storing works again once memory is back.
TEST(ShmFullHostTierTest, SlotWhoseMemoryCannotBeReservedIsAMiss) {
  const KvLayout layout = TestLayout();
  std::atomic<bool> short_of_memory{false};
  StatusOr<std::unique_ptr<HostTier>> host = HostTier::Create(
      {.shared = true,
       .max_segments = 2,
       .num_slots = 9,
       .slot_bytes = layout.BlockBytes(),
       .layout_fingerprint = "test",
       .reserve = [&](const ShmSegment& segment, size_t offset,
                      size_t bytes) -> Status {
         if (short_of_memory.load() && bytes == layout.BlockBytes()) {
           return Status::ResourceExhausted("no memory (injected)");
         }
         return segment.Reserve(offset, bytes);
       }});
  ASSERT_THAT(host, IsOk());
  HostTier& tier = **host;
  StatusOr<Coordinator> made = Coordinator::Create(
      {.layout = layout,
       .host_slots = tier.num_slots(),
       .max_tenants = 2,
       .assign_slot = [&tier](BlockId slot, uint32_t segment) {
         return tier.AssignSlot(slot, segment);
       }});
  ASSERT_THAT(made, IsOk());
  Coordinator& c = *made;
  auto register_worker = [&](const std::string& tenant) {
    return c
        .RegisterWorker({.layout = layout,
                         .num_device_blocks = 8,
                         .tenant = tenant,
                         .pid = 1,
                         .name = tenant})
        .value();
  };
  const WorkerId a = register_worker("tenant-a");  // Segment 0.
  const WorkerId b = register_worker("tenant-b");  // Segment 1.
  ASSERT_THAT(tier.EnsureSegment(1), IsOk());
  // Stores two blocks through `w`; returns how many got a slot.
  auto store = [&](WorkerId w, RequestId id, TokenId first) {
    const std::vector<TokenId> tokens = SequentialTokens(first, 32);
    EXPECT_THAT(c.Lookup(w, id, tokens, 0, {}), IsOk());
    const std::vector<BlockId> device = {1, 2, 3};
    EXPECT_THAT(c.Allocate(w, id, device, 0), IsOk());
    CommitResult commit = c.Commit(w, id, 32, device).value();
    size_t stored = 0;
    for (const TransferEvent& e : commit.stores) {
      for (BlockId slot : e.host_blocks) {
        std::memset(tier.slot(slot), 0x5A, tier.slot_bytes());  // No SIGBUS.
      }
      stored += e.host_blocks.size();
      const std::vector<CompletedEvent> done{{e.ref, true}};
      EXPECT_THAT(c.Complete(w, done), IsOk());
    }
    EXPECT_THAT(c.Finish(w, id), IsOk());
    return stored;
  };

  short_of_memory = true;
  EXPECT_EQ(store(b, 1, 1), 0u);  // Every slot would move to segment 1.
  EXPECT_EQ(c.stats().host.slot_reserve_failures, 2u);
  EXPECT_EQ(c.stats().host.used_slots, 0);  // The slots went back.
  EXPECT_EQ(c.Lookup(b, 2, SequentialTokens(1, 32), 0, {})->hit_tokens, 0);
  ASSERT_THAT(c.Finish(b, 2), IsOk());
  // Segment 0's memory was reserved whole at start: tenant A stores.
  EXPECT_EQ(store(a, 3, 100), 2u);

  short_of_memory = false;
  EXPECT_EQ(store(b, 4, 1), 2u);
  // A lookup leaves the last token to compute: 33 tokens hit 32.
  EXPECT_EQ(c.Lookup(b, 5, SequentialTokens(1, 33), 0, {})->hit_tokens, 32);
  ASSERT_THAT(c.Finish(b, 5), IsOk());
  EXPECT_EQ(c.stats().host.slot_reserve_failures, 2u);

  // A tenant short of memory costs the others one cached block at most:
  // the slot it could not use goes back to the front of the free queue
  // and is tried again, instead of evicting the next block each time.
  for (int i = 0; i < 4; ++i) {  // Tenant A's blocks fill all 8 slots.
    EXPECT_EQ(store(a, 10 + i, 1000 + 100 * i), 2u);
  }
  short_of_memory = true;
  EXPECT_EQ(store(b, 20, 5000), 0u);
  EXPECT_EQ(c.stats().host.slot_reserve_failures, 4u);
  int32_t hit_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    hit_tokens +=
        c.Lookup(a, 30 + i, SequentialTokens(1000 + 100 * i, 33), 0, {})
            ->hit_tokens;
    ASSERT_THAT(c.Finish(a, 30 + i), IsOk());
  }
  // The least recently used block (the oldest request's second) went.
  EXPECT_EQ(hit_tokens, 3 * 32 + 16);
}

// A stop asked for while tierkvd reserves its host memory ends the start
// there: it never serves, and exits 0 at once.
TEST_F(ShmFullTest, SigtermWhileReservingMemoryStopsTheStart) {
  // 2 GiB takes most of a second to reserve. tierkvd is frozen as soon as
  // it says it began, and the signal is pending when it thaws: its signal
  // thread takes it at once, while the reservation still has hundreds of
  // milliseconds to go however slow the machine (both thaw together).
  if (Status room = ipc::CheckHostMemory(size_t{3} << 30); !room.ok()) {
    GTEST_SKIP() << "needs 3 GiB of memory: " << room.ToString();
  }
  auto daemon = Run(DaemonArgs("2G"));
  ASSERT_TRUE(daemon->WaitForOutput("host tier: reserving"))
      << daemon->output();
  daemon->Freeze();
  daemon->Signal(SIGTERM);
  daemon->Thaw();
  EXPECT_EQ(daemon->Wait(), 0) << daemon->output();
  EXPECT_THAT(daemon->output(), HasSubstr("stopped while starting"));
  EXPECT_THAT(daemon->output(), Not(HasSubstr("serving store")));
  EXPECT_THAT(Entries(dir_), IsEmpty());
}

// A graceful stop spills every host block to disk, though none had to
// spill (the host is far below its high watermark); the restart is warm:
// every block is a hit, bit-exact, from disk.
TEST_F(GracefulSpillTest, StopSpillsTheHostAndTheRestartIsWarm) {
  daemon_ = Run(DiskArgs(64));
  ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  auto fill = ManyWorker("fill", 7, 20);  // 20 one-block requests.
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  {
    std::unique_ptr<Client> observer = Attach("observer");
    ASSERT_NE(observer, nullptr);
    const CoordinatorStats s = SettledStats(*observer);
    EXPECT_EQ(s.host.cached_slots, 20);
    EXPECT_EQ(s.host.spills, 0u);  // All of it on host only.
  }
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
  EXPECT_THAT(daemon_->output(),
              HasSubstr("spilling 20 host blocks before stopping"));

  daemon_ = Run(DiskArgs(64));
  ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  EXPECT_THAT(daemon_->output(), HasSubstr("disk tier: 20 blocks"));
  auto verify = ManyWorker("verify", 7, 20);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  const Tally t = ParseTally(verify->output());
  EXPECT_EQ(t.blocks, 20) << verify->output();
  EXPECT_EQ(t.hit, 20) << verify->output();
  EXPECT_EQ(t.wrong, 0) << verify->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  EXPECT_EQ(SettledStats(*observer).host.promotions, 20u);
}

// The disk tier's directory is gone by the stop: the host blocks cannot be
// made durable, and tierkvd says so with its exit status.
TEST_F(GracefulSpillTest, StopThatCannotReachTheDiskExitsNonZero) {
  daemon_ = Run(DiskArgs(64));
  ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  auto fill = ManyWorker("fill", 8, 20);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::filesystem::remove_all(dir_ + "/disk");
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 7) << daemon_->output();
  EXPECT_THAT(daemon_->output(),
              HasSubstr("the host tier is not all on disk and durable"));
  daemon_.reset();
}

// A clean stop leaves nothing: no socket, no lock file, no stats page. A
// killed tierkvd leaves all three; the next one takes them over, and its
// own clean stop leaves nothing again.
TEST_F(TierkvdLeftoversTest, CleanStopLeavesNothingAndAKilledOnesAreTaken) {
  StartDaemon();
  EXPECT_THAT(ShmNames(), Not(IsEmpty()));
  StopDaemon();
  EXPECT_THAT(Entries(dir_), IsEmpty());
  EXPECT_THAT(ShmNames(), IsEmpty());

  StartDaemon();
  daemon_->Signal(SIGKILL);
  EXPECT_EQ(daemon_->Wait(), 128 + SIGKILL);
  daemon_.reset();
  EXPECT_THAT(Entries(dir_), Not(IsEmpty()));  // Socket and lock files.
  EXPECT_THAT(ShmNames(), Not(IsEmpty()));     // Its stats page.

  StartDaemon();
  std::unique_ptr<Client> client = Attach();
  ASSERT_NE(client, nullptr);
  client.reset();
  StopDaemon();
  EXPECT_THAT(Entries(dir_), IsEmpty());
  EXPECT_THAT(ShmNames(), IsEmpty());
}

// One exit status per class of error, from real runs.
TEST_F(TierkvdExitStatusTest, EachClassOfErrorHasItsStatus) {
  auto help = Run({TIERKVD_PATH, "--help"});
  EXPECT_EQ(help->Wait(), 0);
  EXPECT_THAT(help->output(), HasSubstr("Exit status:"));
  EXPECT_THAT(help->output(), HasSubstr("3  the store is busy"));

  std::vector<std::string> bad = DaemonArgs("1M");
  bad.push_back("--no-such-flag");
  auto usage = Run(bad);
  EXPECT_EQ(usage->Wait(), 2) << usage->output();

  auto over_memory = Run(DaemonArgs("20T"));
  EXPECT_EQ(over_memory->Wait(), 4) << over_memory->output();

  StartDaemon();
  auto second = Run(DaemonArgs("1M"));
  EXPECT_EQ(second->Wait(), 3) << second->output();
  EXPECT_THAT(second->output(), HasSubstr("served by a live tierkvd"));
  StopDaemon();
}

}  // namespace
}  // namespace tierkv
