// tierkvd's disk tier as an operator meets it, with real tierkvd and worker
// processes: a disk tier of another model refused until --disk-reset,
// evictions that survive tierkvd being killed right after, a filesystem that
// fills up (a tmpfs in a private mount namespace), and its directory removed
// while tierkvd runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/fill_worker.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client.h"
#include "tierkv/kv_layout.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

class TierkvdDiskTest : public TierkvdFixture {
 protected:
  std::vector<std::string> DiskArgs(const std::string& disk_dir,
                                    const std::string& capacity,
                                    std::vector<std::string> more) const {
    std::vector<std::string> args = DaemonArgs(
        std::to_string(17 * TestLayout().BlockBytes()));  // 16 slots.
    for (const std::string& a :
         {std::string("--disk-dir"), disk_dir, std::string("--disk-capacity"),
          capacity, std::string("--spill-high"), std::string("0.5"),
          std::string("--spill-low"), std::string("0.25")}) {
      args.push_back(a);
    }
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  void StartOn(const std::string& disk_dir, const std::string& capacity,
               std::vector<std::string> more = {}) {
    daemon_ = Spawn(DiskArgs(disk_dir, capacity, std::move(more)));
    ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  }
  DiskTierStats DiskStats(const std::string& model = "") {
    std::unique_ptr<Client> observer = Attach("observer", model);
    EXPECT_NE(observer, nullptr);
    if (observer == nullptr) return {};
    return SettledStats(*observer).disk.value_or(DiskTierStats{});
  }
  void Kill() {
    daemon_->Signal(SIGKILL);
    EXPECT_EQ(daemon_->Wait(), 128 + SIGKILL);
    daemon_.reset();
  }
  std::string Admin(std::vector<std::string> args) {
    args.insert(args.begin(), TIERKV_ADMIN_PATH);
    args.push_back("--socket");
    args.push_back(socket_);
    auto admin = Spawn(args);
    EXPECT_EQ(admin->Wait(), 0) << admin->output();
    return admin->output();
  }
  const std::string disk_ = dir_ + "/disk";
};

// A disk tier written for model A is refused by a tierkvd of model B, which
// names both and --disk-reset and leaves the blocks alone; --disk-reset
// drops them knowingly.
TEST_F(TierkvdDiskTest, ModelMismatchRefusesToStartUntilDiskReset) {
  StartOn(disk_, "64M", {"--model", "model-a"});
  auto fill = ManyWorker("fill", 3, 160, "model-a");
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  StopDaemon();

  auto refused = Spawn(DiskArgs(disk_, "64M", {"--model", "model-b"}));
  EXPECT_NE(refused->Wait(), 0);
  EXPECT_THAT(refused->output(), HasSubstr("model=model-a"));
  EXPECT_THAT(refused->output(), HasSubstr("model=model-b"));
  EXPECT_THAT(refused->output(), HasSubstr("--disk-reset"));
  EXPECT_THAT(refused->output(), ::testing::Not(HasSubstr("serving store")));

  // Untouched: model A's restart is warm.
  StartOn(disk_, "64M", {"--model", "model-a"});
  const uint64_t on_disk = DiskStats("model-a").keys;
  ASSERT_GT(on_disk, 0u);
  auto verify_a = ManyWorker("verify", 3, 160, "model-a");
  ASSERT_EQ(verify_a->Wait(), 0) << verify_a->output();
  EXPECT_GE(ParseTally(verify_a->output()).hit, static_cast<long long>(on_disk))
      << verify_a->output();
  StopDaemon();

  StartOn(disk_, "64M", {"--model", "model-b", "--disk-reset"});
  EXPECT_THAT(daemon_->output(), HasSubstr("--disk-reset dropped"));
  const DiskTierStats b = DiskStats("model-b");
  EXPECT_EQ(b.keys, 0u);
  EXPECT_GE(b.layout_mismatches, on_disk);
  auto verify_b = ManyWorker("verify", 3, 160, "model-b");
  ASSERT_EQ(verify_b->Wait(), 0) << verify_b->output();
  EXPECT_EQ(ParseTally(verify_b->output()).hit, 0) << verify_b->output();
}

// tierkv-admin evict and clear are on disk once they answer: tierkvd
// killed right after does not bring the blocks back.
// A --disk-dir that another tierkvd has open (its RocksDB LOCK) is busy
// (exit 3), not an unusable store.
TEST_F(TierkvdDiskTest, ADiskDirInUseByAnotherTierkvdIsBusy) {
  StartOn(disk_, "64M");
  std::vector<std::string> args = DiskArgs(disk_, "64M", {});
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--store") args[i + 1] = store_ + "b";
    if (args[i] == "--socket") args[i + 1] = dir_ + "/second.sock";
  }
  auto second = Spawn(args);
  EXPECT_EQ(second->Wait(), 3) << second->output();
  EXPECT_THAT(second->output(), HasSubstr("another process"));
  EXPECT_THAT(second->output(), HasSubstr(disk_));
  RemoveStoreSegments(store_ + "b");
}

// A --disk-capacity that leaves no room for one block's value beside
// RocksDB's reserve is refused at start, naming the flag and the minimum
// (2 MiB blocks: 4M keeps 3 MiB for RocksDB and 1 MiB for values).
TEST_F(TierkvdDiskTest, DiskCapacityHoldingNoBlockIsRefused) {
  const std::vector<std::string> args = {
      TIERKVD_PATH, "--store",         store_, "--socket",
      socket_,      "--layers",        "32",   "--kv-heads",
      "8",          "--head-dim",      "128",  "--dtype",
      "bf16",       "--host-capacity", "8M",   "--disk-dir",
      disk_,        "--disk-capacity", "4M"};
  auto refused = Spawn(args);
  EXPECT_EQ(refused->Wait(), 2) << refused->output();
  EXPECT_THAT(refused->output(), HasSubstr("give --disk-capacity at least 6M"));
  EXPECT_THAT(refused->output(), ::testing::Not(HasSubstr("serving store")));
}

TEST_F(TierkvdDiskTest, TombstoneEvictionsSurviveTierkvdKilledRightAfter) {
  StartOn(disk_, "64M");
  auto fill = ManyWorker("fill", 1, 40);  // Past the host: the oldest spill.
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  const uint64_t before = DiskStats().keys;
  ASSERT_GT(before, 3u);
  const std::vector<std::string> evicted = {FillKeyHex(1, 0), FillKeyHex(1, 1),
                                            FillKeyHex(1, 2)};
  std::vector<std::string> args = {"evict"};
  args.insert(args.end(), evicted.begin(), evicted.end());
  const std::string out = Admin(args);
  // Each is on disk; the oldest are usually off host too, but one whose
  // write-behind copy finished late went back to the host's newest end.
  for (const std::string& key : evicted) {
    ASSERT_THAT(out, ::testing::ContainsRegex(
                         key + "  dropped from (host and )?disk\n"));
  }
  Kill();

  StartOn(disk_, "64M");
  EXPECT_EQ(DiskStats().keys, before - evicted.size());
  const std::string again = Admin(args);
  for (const std::string& key : evicted) {
    EXPECT_THAT(again, HasSubstr(key + "  not cached\n"));
  }
  EXPECT_THAT(Admin({"clear", "--tier", "disk"}),
              ::testing::ContainsRegex("disk: dropped [1-9][0-9]* blocks\n"));
  Kill();

  StartOn(disk_, "64M");
  EXPECT_EQ(DiskStats().keys, 0u);
}

// A disk tier bounded past its filesystem (64M on a 16 MiB tmpfs): it fills,
// stops spilling with one log line, keeps serving, stops cleanly, and
// tierkvd starts again on the full filesystem with every block.
TEST_F(TierkvdDiskTest, DiskFullOnASmallFilesystemDegradesAndRestarts) {
  const std::string mnt = dir_ + "/mnt";
  const std::string why = MountTmpfs(mnt, 16 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  StartOn(mnt + "/disk", "64M");
  auto fill = ManyWorker("fill", 5, 1200);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  ASSERT_TRUE(daemon_->WaitForOutput("blocks are not spilled until space"))
      << daemon_->output();
  const DiskTierStats full = DiskStats();
  EXPECT_EQ(full.degraded, 1u);
  EXPECT_EQ(full.write_errors, 0u);  // Refused before RocksDB ran out.
  EXPECT_GT(full.space_refusals, 0u);
  EXPECT_GT(full.keys, 0u);
  const std::string log = daemon_->output();
  EXPECT_EQ(log.find("blocks are not spilled until space"),
            log.rfind("blocks are not spilled until space"))
      << "logged more than once:\n"
      << log;
  // The stop cannot spill what is left on host to a full disk: it says so
  // and exits 7, though what the disk holds is intact.
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 7) << daemon_->output();
  EXPECT_THAT(daemon_->output(), HasSubstr("spill on stop failed"));
  daemon_.reset();

  StartOn(mnt + "/disk", "64M");
  EXPECT_EQ(DiskStats().keys, full.keys) << daemon_->output();
  auto verify = ManyWorker("verify", 5, 1200);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  const Tally t = ParseTally(verify->output());
  EXPECT_EQ(t.wrong, 0) << verify->output();
  EXPECT_GE(t.hit, static_cast<long long>(full.keys)) << verify->output();
}

// A --disk-dir on a read-only filesystem (a tmpfs remounted read-only in a
// private mount namespace): permission refused (exit 5, which systemd does
// not restart), naming the filesystem, not "store busy" (exit 3).
TEST_F(TierkvdDiskTest, ADiskDirOnAReadOnlyFilesystemIsRefusedNotBusy) {
  const std::string mnt = dir_ + "/mnt";
  const std::string why = MountTmpfs(mnt, 16 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  std::filesystem::create_directories(mnt + "/disk");
  ASSERT_EQ(
      mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0)
      << strerror(errno);
  auto refused = Spawn(DiskArgs(mnt + "/disk", "64M", {}));
  EXPECT_EQ(refused->Wait(), 5) << refused->output();
  EXPECT_THAT(refused->output(), HasSubstr("Read-only file system"));
  EXPECT_THAT(refused->output(), ::testing::Not(HasSubstr("another process")));
}

// The disk tier's directory removed under a running tierkvd: spills fail,
// it says so once and keeps serving; an operator's clear is told its
// blocks were forgotten, not deleted; the final flush reports the loss.
TEST_F(TierkvdDiskTest, DiskFullDirectoryRemovedWhileRunningIsReported) {
  StartOn(disk_, "64M");
  auto first = ManyWorker("fill", 7, 40);
  ASSERT_EQ(first->Wait(), 0) << first->output();
  std::filesystem::remove_all(disk_);
  // RocksDB may take a burst of writes into files it still holds open (the
  // memtable, the unlinked WAL); the loss shows when it needs the directory
  // again or the space check runs. New blocks until it does.
  const std::string stopped = "disk tier stopped taking writes";
  for (int seed = 8; daemon_->output().find(stopped) == std::string::npos;
       ++seed) {
    ASSERT_LT(seed, 208) << daemon_->output();
    auto more = ManyWorker("fill", seed, 400);
    ASSERT_EQ(more->Wait(), 0) << more->output();
  }
  const DiskTierStats s = DiskStats();
  EXPECT_EQ(s.degraded, 1u);
  EXPECT_EQ(s.writes_stopped, 1u);
  EXPECT_GE(s.write_errors, 1u);
  ASSERT_GT(s.keys, 0u);
  // Blocks evicted for room as the tier stopped (a victim's delete may be
  // the write that finds the directory gone) are forgotten, not deleted,
  // too: counted already, and not counted again below.
  const std::string cleared = Admin({"clear", "--tier", "disk"});
  EXPECT_THAT(cleared, HasSubstr("disk: dropped " + std::to_string(s.keys)));
  EXPECT_THAT(cleared, HasSubstr("forgotten, not deleted"));
  EXPECT_THAT(Admin({"clear", "--tier", "disk", "--json"}),
              HasSubstr("\"undeleted\":false"));  // Nothing left to drop.
  EXPECT_EQ(DiskStats().undeleted_removals, s.undeleted_removals + s.keys);
  EXPECT_THAT(daemon_->output(), HasSubstr("were forgotten, not deleted"));
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 7) << daemon_->output();
  EXPECT_THAT(daemon_->output(), HasSubstr("on stop failed"));
  daemon_.reset();
}

}  // namespace
}  // namespace tierkv
