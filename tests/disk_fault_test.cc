// The disk tier under faults, against a real RocksDB: a full filesystem (a
// small tmpfs in a private mount namespace), its directory deleted while in
// use, failing writes (a DiskStorage wrapper), damaged files, and removals
// racing writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr size_t kBlockBytes = 16 << 10;

BlockKey KeyOf(int block) {
  return BlockKey{.lo = (static_cast<uint64_t>(block) + 1) * 0x9e3779b97f4a7c15,
                  .hi = 0xfa017};
}

std::vector<TokenId> TokensOf(int block) {
  std::vector<TokenId> tokens(16);
  for (int j = 0; j < 16; ++j) tokens[j] = static_cast<TokenId>(block * 16 + j);
  return tokens;
}

std::vector<std::byte> BlockOf(int block) {
  std::mt19937_64 rng(block);
  std::vector<std::byte> out(kBlockBytes);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

Status PutSync(DiskTier& tier, int i) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  const std::vector<std::byte> block = BlockOf(i);
  tier.Put(KeyOf(i), TokensOf(i), block, [&](Status s) { done.set_value(s); });
  return result.get();
}

// OK only when the block comes back bit for bit.
Status GetAndCheck(DiskTier& tier, int i) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  std::vector<std::byte> out(kBlockBytes);
  tier.Get(KeyOf(i), TokensOf(i), out, [&](Status s) { done.set_value(s); });
  Status s = result.get();
  if (s.ok() && out != BlockOf(i)) return Status::Internal("bytes differ");
  return s;
}

DiskTierOptions OptionsAt(const std::string& path) {
  DiskTierOptions options;
  options.storage.path = path;
  options.storage.write_buffer_bytes = size_t{1} << 20;
  options.capacity_bytes = uint64_t{1} << 30;
  options.layout_fingerprint = "disk fault test layout";
  options.block_bytes = kBlockBytes;
  return options;
}

std::unique_ptr<DiskTier> OpenTier(const DiskTierOptions& options) {
  StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
  EXPECT_THAT(tier, IsOk());
  return tier.ok() ? std::move(tier).value() : nullptr;
}

// --- A full filesystem -------------------------------------------------------

TEST(DiskFullTest, AFullFilesystemDegradesTheTierWhichStillServesAndReopens) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 8 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string ballast = scratch.path() + "/ballast";
  std::ofstream(ballast) << std::string(2 << 20, 'x');
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  options.capacity_bytes = uint64_t{1} << 30;  // Far past the filesystem.
  std::vector<Status> reports;
  options.on_degraded = [&](const Status& s) { reports.push_back(s); };
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);

  int stored = 0;
  Status refused;
  for (; stored < 2000; ++stored) {
    refused = PutSync(*tier, stored);
    if (!refused.ok()) break;
  }
  ASSERT_LT(stored, 2000) << "the filesystem never filled";
  ASSERT_GT(stored, 10);
  // Refused before RocksDB ran out: no write error, the tier degraded.
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted)
      << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("bytes free"));
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.degraded, 1u);
  EXPECT_EQ(stats.write_errors, 0u);
  EXPECT_GE(stats.space_refusals, 1u);
  ASSERT_EQ(reports.size(), 1u);  // Reported once, not per refusal.
  EXPECT_EQ(PutSync(*tier, stored + 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reports.size(), 1u);
  for (int i = 0; i < stored; ++i) EXPECT_THAT(GetAndCheck(*tier, i), IsOk());
  EXPECT_THAT(tier->Flush(), IsOk());
  tier.reset();

  // Restarts on the full filesystem, serving everything it kept.
  tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().keys, static_cast<uint64_t>(stored));
  for (int i = 0; i < stored; i += 7) {
    EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  }
  const bool read_only = tier->stats().degraded == 1;
  tier.reset();

  // Space freed: a tier opened writable takes writes again.
  fs::remove(ballast);
  reports.clear();
  tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().degraded, 0u) << "read-only before: " << read_only;
  EXPECT_THAT(PutSync(*tier, 5000), IsOk());
  EXPECT_THAT(GetAndCheck(*tier, 5000), IsOk());
}

// A new store on a full filesystem: nothing to open read-only, so the lack
// of space is the error (not a damaged store).
TEST(DiskFullTest, ANewStoreOnAFullFilesystemIsResourceExhausted) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 4 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  {
    std::ofstream ballast(scratch.path() + "/ballast");
    const std::string chunk(64 << 10, 'x');
    while (ballast.write(chunk.data(), chunk.size())) {
    }
  }
  const DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kResourceExhausted)
      << tier.status().ToString();
}

// A store another process has open is refused to a second one, however
// it would open it: RocksDB takes its lock only for a writable open, and a
// nearly full filesystem makes the second open read-only.
TEST(DiskFullTest, AStoreInUseIsRefusedEvenWhereItWouldOpenReadOnly) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 8 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  const DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  std::unique_ptr<DiskTier> first = OpenTier(options);
  ASSERT_NE(first, nullptr);
  // (No Flush: RocksDB's background threads do not see this test's mount.)
  for (int i = 0; i < 4; ++i) ASSERT_THAT(PutSync(*first, i), IsOk());
  {
    std::ofstream ballast(scratch.path() + "/ballast");
    const std::string chunk(64 << 10, 'x');
    while (ballast.write(chunk.data(), chunk.size())) {
    }
  }
  StatusOr<std::unique_ptr<DiskTier>> second = DiskTier::Open(options);
  ASSERT_FALSE(second.ok()) << "opened a store another tier has open";
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists)
      << second.status().ToString();
  // Once the first lets it go, it opens (read-only: the filesystem is full)
  // and serves what the first stored.
  first.reset();
  std::unique_ptr<DiskTier> reopened = OpenTier(options);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->stats().degraded, 1u);
  for (int i = 0; i < 4; ++i) EXPECT_THAT(GetAndCheck(*reopened, i), IsOk());
}

TEST(DiskFullTest, SpaceFreedWhileRunningEndsTheDegradedState) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 8 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string ballast = scratch.path() + "/ballast";
  std::ofstream(ballast) << std::string(4 << 20, 'x');
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  std::mutex mu;
  std::vector<Status> reports;
  options.on_degraded = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(s);
  };
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  int i = 0;
  while (i < 2000 && PutSync(*tier, i).ok()) ++i;
  ASSERT_EQ(tier->stats().degraded, 1u);
  EXPECT_EQ(tier->stats().writes_stopped, 0u);  // Short of space only.
  fs::remove(ballast);
  // Free space is looked at again within 100 ms of a refusal: with twice
  // the reserve free, writes resume.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Status s;
  while (!(s = PutSync(*tier, i)).ok() &&
         std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  }
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(tier->stats().degraded, 0u);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_FALSE(reports[0].ok());
  EXPECT_TRUE(reports[1].ok());
}

// Another writer fills the filesystem between two looks at its free space:
// RocksDB's own writes fail. No crash, the tier degrades, and every block a
// Put reported stored is there after a restart with space again.
TEST(DiskFullTest, AFilesystemFilledBehindItsBackLosesNoStoredBlock) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 8 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  int i = 0;
  for (; i < 40; ++i) ASSERT_THAT(PutSync(*tier, i), IsOk());
  const std::string ballast = scratch.path() + "/ballast";
  {
    std::ofstream out(ballast, std::ios::binary);
    const std::string chunk(4096, 'x');
    while (out.write(chunk.data(), chunk.size())) {
    }
  }
  std::vector<int> stored;
  for (int k = 0; k < 400; ++k, ++i) {
    if (PutSync(*tier, i).ok()) stored.push_back(i);
  }
  EXPECT_EQ(tier->stats().degraded, 1u);
  Status flushed = tier->Flush();
  tier.reset();
  fs::remove(ballast);
  tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  for (int k = 0; k < 40; ++k) EXPECT_THAT(GetAndCheck(*tier, k), IsOk()) << k;
  for (int k : stored) {
    EXPECT_THAT(GetAndCheck(*tier, k), IsOk())
        << k << " of " << stored.size() << "; flush: " << flushed.ToString();
  }
}

// The directory removed under a running tier: writes fail, the tier
// degrades once and says so, and the final Flush reports the loss.
TEST(DiskFullTest, DirectoryDeletedWhileRunningDegradesAndFlushFails) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  std::mutex mu;
  std::vector<Status> reports;
  options.on_degraded = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(s);
  };
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  for (int i = 0; i < 5; ++i) ASSERT_THAT(PutSync(*tier, i), IsOk());
  fs::remove_all(options.storage.path);
  // Writes already open in RocksDB may land in unlinked files for a moment;
  // the next look at the directory (every 250 ms at most) stops them.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int i = 5;
  Status s;
  while ((s = PutSync(*tier, i)).ok() &&
         std::chrono::steady_clock::now() < deadline) {
    ++i;
  }
  ASSERT_FALSE(s.ok()) << "writes never failed";
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.degraded, 1u);
  EXPECT_GE(stats.write_errors, 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_THAT(reports[0].message(), HasSubstr(options.storage.path));
  }
  // Later writes fail at once, without reaching RocksDB; reads never
  // return wrong bytes.
  EXPECT_FALSE(PutSync(*tier, i + 1).ok());
  for (int j = 0; j < 5; ++j) {
    EXPECT_NE(GetAndCheck(*tier, j).code(), StatusCode::kInternal) << j;
  }
  Status flushed = tier->Flush();
  EXPECT_FALSE(flushed.ok());
  EXPECT_THAT(flushed.message(), HasSubstr("may be lost"));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(reports.size(), 1u);
}

// A storage whose writes fail once `fail` is set, counting the writes that
// reach it.
class FailingStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<bool> fail{false};
  std::atomic<int> puts{0};
  std::atomic<int> deletes{0};

  Status Put(std::string_view key,
             std::span<const std::string_view> parts) override {
    ++puts;
    if (fail) return Status::ResourceExhausted("No space left on device");
    return DiskStorageWrapper::Put(key, parts);
  }
  Status Delete(std::string_view key) override {
    ++deletes;
    if (fail) return Status::Unavailable("IO error");
    return DiskStorageWrapper::Delete(key);
  }
};

// A tier over RocksDB wrapped in a `Wrapper` (a DiskStorageWrapper that
// breaks something), which *wrapper then points at; null if it failed.
template <typename Wrapper>
std::unique_ptr<DiskTier> OpenWrapped(const DiskTierOptions& options,
                                      Wrapper** wrapper) {
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(options.storage);
  EXPECT_THAT(rocks, IsOk());
  if (!rocks.ok()) return nullptr;
  auto wrapped = std::make_unique<Wrapper>(std::move(rocks).value());
  *wrapper = wrapped.get();
  StatusOr<std::unique_ptr<DiskTier>> opened =
      DiskTier::Open(options, std::move(wrapped));
  EXPECT_THAT(opened, IsOk());
  return opened.ok() ? std::move(opened).value() : nullptr;
}

TEST(DiskFullTest, AWriteErrorStopsEveryLaterWriteButNotReads) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  int reports = 0;
  options.on_degraded = [&](const Status&) { ++reports; };
  FailingStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  for (int i = 0; i < 4; ++i) ASSERT_THAT(PutSync(tier, i), IsOk());

  storage->fail = true;
  EXPECT_EQ(PutSync(tier, 4).code(), StatusCode::kResourceExhausted);
  const int puts = storage->puts, deletes = storage->deletes;
  EXPECT_FALSE(PutSync(tier, 5).ok());
  EXPECT_TRUE(tier.Remove(KeyOf(0)));  // Forgotten, not deleted.
  EXPECT_FALSE(tier.Contains(KeyOf(0)));
  EXPECT_EQ(storage->puts, puts);  // Nothing more reached the storage.
  EXPECT_EQ(storage->deletes, deletes);
  DiskTierStats stats = tier.stats();
  EXPECT_EQ(stats.degraded, 1u);
  EXPECT_EQ(stats.writes_stopped, 1u);
  EXPECT_EQ(stats.undeleted_removals, 1u);
  EXPECT_EQ(stats.write_errors, 1u);
  EXPECT_EQ(reports, 1);
  for (int i = 1; i < 4; ++i) EXPECT_THAT(GetAndCheck(tier, i), IsOk()) << i;
  EXPECT_FALSE(tier.Flush().ok());
  // Every other block forgotten too, each counted once: a second RemoveAll
  // finds none (nor the records the first left behind).
  EXPECT_EQ(tier.RemoveAll(), 3u);
  EXPECT_EQ(tier.RemoveAll(), 0u);
  EXPECT_EQ(tier.stats().undeleted_removals, 4u);
  EXPECT_EQ(storage->deletes, deletes);
}

// A removal whose own delete is the write that fails: the block is
// forgotten, counted as not deleted once, and writes stop.
TEST(DiskFullTest, ARemovalWhoseDeleteFailsIsCountedUndeletedOnce) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  FailingStorage* storage = nullptr;
  std::unique_ptr<DiskTier> tier = OpenWrapped(options, &storage);
  ASSERT_NE(tier, nullptr);
  for (int i = 0; i < 4; ++i) ASSERT_THAT(PutSync(*tier, i), IsOk());
  storage->fail = true;
  EXPECT_TRUE(tier->Remove(KeyOf(0)));
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.writes_stopped, 1u);
  EXPECT_EQ(stats.write_errors, 1u);
  EXPECT_EQ(stats.undeleted_removals, 1u);
  EXPECT_EQ(tier->RemoveAll(), 3u);
  EXPECT_EQ(tier->stats().undeleted_removals, 4u);
}

// The value file is the tier's own: RocksDB never sees a write that finds
// its filesystem full, so the storage does not latch it as it latches a
// RocksDB write error, and takes writes again once there is room.
TEST(DiskFullTest, AFullValueFileIsNotLatchedByTheStorage) {
  TempDir scratch("disk_fault_test");
  const std::string why = MountTmpfs(scratch.path(), 8 << 20);
  if (!why.empty()) GTEST_SKIP() << why;
  const DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  StatusOr<std::unique_ptr<DiskStorage>> opened =
      OpenRocksDbStorage(options.storage);
  ASSERT_THAT(opened, IsOk());
  DiskStorage& storage = **opened;
  const std::string ballast = scratch.path() + "/ballast";
  {
    std::ofstream out(ballast, std::ios::binary);
    const std::string chunk(4096, 'x');
    while (out.write(chunk.data(), chunk.size())) {
    }
  }
  // Past the value file's end: pages the filesystem no longer has.
  const std::string bytes(256 << 10, 'b');
  const Status full = storage.WritePayload(0, bytes);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.ToString();
  EXPECT_THAT(storage.Writable(), IsOk());
  fs::remove(ballast);
  EXPECT_THAT(storage.WritePayload(0, bytes), IsOk());
  const std::string_view record[1] = {"a record"};
  EXPECT_THAT(storage.Put("key", record), IsOk());
}

// A storage whose value file is full while `full` is set (its writes fail
// as ENOSPC, possibly half done); RocksDB has room.
class FullValueFileStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<bool> full{false};

  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    if (!full) return DiskStorageWrapper::WritePayload(offset, bytes);
    (void)DiskStorageWrapper::WritePayload(offset, bytes.substr(0, 1));
    return Status::ResourceExhausted(
        "writing the value file: No space left on device");
  }
};

// The value file is the tier's own, so a write that finds its filesystem
// full degrades the tier only until there is room again, as a low reading
// of the free space does; RocksDB never saw the write. (A RocksDB write
// that fails stops writes for good: above.)
TEST(DiskFullTest, AFullValueFileDegradesUntilThereIsRoom) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  std::mutex mu;
  std::vector<StatusCode> reports;
  options.on_degraded = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(s.code());
  };
  FullValueFileStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  for (int i = 0; i < 3; ++i) ASSERT_THAT(PutSync(tier, i), IsOk());
  storage->full = true;
  EXPECT_EQ(PutSync(tier, 3).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(tier.Contains(KeyOf(3)));
  DiskTierStats stats = tier.stats();
  EXPECT_EQ(stats.degraded, 1u);
  EXPECT_EQ(stats.write_errors, 1u);
  for (int i = 0; i < 3; ++i) EXPECT_THAT(GetAndCheck(tier, i), IsOk()) << i;
  // Room again: the tier takes writes once it reads the free space anew
  // (at most every 100 ms while short).
  storage->full = false;
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Status put = PutSync(tier, 3);
  while (!put.ok() && std::chrono::steady_clock::now() < give_up) {
    ASSERT_EQ(put.code(), StatusCode::kResourceExhausted) << put.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    put = PutSync(tier, 3);
  }
  ASSERT_THAT(put, IsOk());
  EXPECT_THAT(GetAndCheck(tier, 3), IsOk());
  stats = tier.stats();
  EXPECT_EQ(stats.degraded, 0u);
  EXPECT_EQ(stats.write_errors, 1u);
  EXPECT_THAT(tier.Flush(), IsOk());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(reports, ::testing::ElementsAre(StatusCode::kResourceExhausted,
                                              StatusCode::kOk));
}

// A storage whose free space cannot be read while `fail` is set (statvfs
// interrupted, or timing out on NFS).
class UnmeasurableStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<bool> fail{false};
  StatusOr<uint64_t> FreeBytes() override {
    if (fail) return Status::Unavailable("statvfs: Connection timed out");
    return DiskStorageWrapper::FreeBytes();
  }
};

// A free-space reading that fails refuses writes while it fails, as a low
// one does; it does not stop the tier until restart.
TEST(DiskFullTest, AFreeSpaceReadingThatFailsRefusesWritesUntilItWorks) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  UnmeasurableStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  ASSERT_THAT(PutSync(tier, 0), IsOk());
  storage->fail = true;
  // Read again within 250 ms: until then the last reading stands.
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Status put = PutSync(tier, 1);
  for (int i = 2; put.ok() && std::chrono::steady_clock::now() < give_up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    put = PutSync(tier, i);
  }
  EXPECT_EQ(put.code(), StatusCode::kResourceExhausted) << put.ToString();
  EXPECT_THAT(put.message(), HasSubstr("timed out"));
  EXPECT_EQ(tier.stats().write_errors, 0u);
  storage->fail = false;
  put = PutSync(tier, 1000);
  while (!put.ok() && std::chrono::steady_clock::now() < give_up) {
    ASSERT_EQ(put.code(), StatusCode::kResourceExhausted) << put.ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    put = PutSync(tier, 1000);
  }
  ASSERT_THAT(put, IsOk());
  EXPECT_EQ(tier.stats().degraded, 0u);
}

// A storage whose value reads fail while `fail` is set: with an I/O error
// as a bad sector does, or, `transient`, for want of memory.
class UnreadableStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<bool> fail{false};
  std::atomic<bool> transient{false};

  Status ReadPayload(uint64_t offset,
                     std::span<const std::span<std::byte>> outs) override {
    if (fail && transient) {
      return Status::ResourceExhausted("reading the values: out of memory");
    }
    if (fail) return Status::Unavailable("reading the values: I/O error");
    return DiskStorageWrapper::ReadPayload(offset, outs);
  }
};

// A block the storage cannot read is dropped, not kept as the most
// recently used entry that every lookup then finds and fails: it is a
// miss, and a new Put of it is read back.
TEST(DiskReadErrorTest, AnUnreadableBlockIsDroppedAndStoredAnew) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  UnreadableStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  for (int i = 0; i < 3; ++i) ASSERT_THAT(PutSync(tier, i), IsOk());
  // A read that may pass leaves the block: it reads back once it does.
  storage->fail = true;
  storage->transient = true;
  EXPECT_EQ(GetAndCheck(tier, 2).code(), StatusCode::kResourceExhausted);
  storage->fail = false;
  EXPECT_THAT(GetAndCheck(tier, 2), IsOk());
  storage->fail = true;
  storage->transient = false;
  EXPECT_EQ(GetAndCheck(tier, 1).code(), StatusCode::kUnavailable);
  storage->fail = false;
  EXPECT_FALSE(tier.Contains(KeyOf(1)));
  EXPECT_EQ(GetAndCheck(tier, 1).code(), StatusCode::kNotFound);
  DiskTierStats stats = tier.stats();
  EXPECT_EQ(stats.read_errors, 2u);
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_EQ(stats.keys, 2u);
  EXPECT_EQ(stats.degraded, 0u);  // A read error stops no writes.
  ASSERT_THAT(PutSync(tier, 1), IsOk());
  for (int i = 0; i < 3; ++i) EXPECT_THAT(GetAndCheck(tier, i), IsOk()) << i;
}

// --- Damaged files -----------------------------------------------------------

// A store of 24 blocks in three flushes: three SSTs of their records.
void WriteStore(const DiskTierOptions& options) {
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  for (int i = 0; i < 24; ++i) {
    ASSERT_THAT(PutSync(*tier, i), IsOk());
    if (i % 8 == 7) {
      ASSERT_THAT(tier->Flush(), IsOk());
    }
  }
}

std::vector<fs::path> DataFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string ext = entry.path().extension();
    if (ext == ".sst") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Damages `file` as `seed` says: bytes flipped at a few offsets, the tail
// (footer) flipped, truncated, or removed. Returns what it did.
std::string Damage(const fs::path& file, uint32_t seed) {
  std::mt19937 rng(seed);
  const uint64_t size = fs::file_size(file);
  switch (seed % 4) {
    case 0:
    case 1: {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      std::string what = "flipped";
      for (int k = 0; k < 3; ++k) {
        const uint64_t at =
            seed % 4 == 0 ? rng() % size
                          : size - 1 - rng() % std::min<uint64_t>(size, 64);
        f.seekg(static_cast<std::streamoff>(at));
        char c = 0;
        f.get(c);
        f.seekp(static_cast<std::streamoff>(at));
        f.put(static_cast<char>(c ^ 0x5a));
        what += " " + std::to_string(at);
      }
      return what;
    }
    case 2: {
      const uint64_t to = rng() % size;
      fs::resize_file(file, to);
      return "truncated to " + std::to_string(to);
    }
    default:
      fs::remove(file);
      return "removed";
  }
}

TEST(DamagedSstTest, DamagedFilesAreNeverServedNorCrashTheOpen) {
  TempDir scratch("disk_fault_test");
  const DiskTierOptions pristine = OptionsAt(scratch.path() + "/pristine");
  WriteStore(pristine);
  const size_t files = DataFiles(pristine.storage.path).size();
  ASSERT_GE(files, 3u);
  int opened = 0, refused = 0;
  for (uint32_t seed = 0; seed < 16; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::string dir = scratch.path() + "/s" + std::to_string(seed);
    fs::copy(pristine.storage.path, dir);
    const fs::path victim = DataFiles(dir)[seed % files];
    const std::string what = Damage(victim, seed);
    SCOPED_TRACE(victim.filename().string() + " " + what);
    DiskTierOptions options = OptionsAt(dir);
    StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
    if (!tier.ok()) {
      // A clear refusal: what is damaged and what to do.
      ++refused;
      EXPECT_EQ(tier.status().code(), StatusCode::kDataLoss)
          << tier.status().ToString();
      EXPECT_THAT(tier.status().message(), HasSubstr("--disk-reset"));
      EXPECT_THAT(tier.status().message(),
                  HasSubstr(victim.filename().string()));
      // Reset starts empty (and keeps nothing damaged).
      options.reset = true;
      StatusOr<std::unique_ptr<DiskTier>> reset = DiskTier::Open(options);
      ASSERT_THAT(reset, IsOk());
      EXPECT_EQ((*reset)->stats().keys, 0u);
      continue;
    }
    ++opened;
    // Every block it kept reads back bit for bit; the rest are gone.
    const DiskTierStats stats = (*tier)->stats();
    uint64_t served = 0;
    for (int i = 0; i < 24; ++i) {
      if (!(*tier)->Contains(KeyOf(i))) continue;
      Status s = GetAndCheck(**tier, i);
      EXPECT_NE(s.code(), StatusCode::kInternal) << i;  // Never wrong bytes.
      if (s.ok()) ++served;
    }
    EXPECT_EQ(stats.keys + stats.dropped_on_open, 24u);
    if (stats.dropped_on_open > 0) {
      EXPECT_EQ(stats.damaged_files, 1u);
      ASSERT_EQ((*tier)->damaged_files().size(), 1u);
      EXPECT_THAT((*tier)->damaged_files()[0],
                  HasSubstr(victim.filename().string()));
    }
    EXPECT_EQ(served, stats.keys);
    tier->reset();
    // Dropped for good: the next open finds no damage.
    StatusOr<std::unique_ptr<DiskTier>> again = DiskTier::Open(options);
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ((*again)->stats().dropped_on_open, 0u);
    EXPECT_EQ((*again)->stats().keys, stats.keys);
  }
  EXPECT_GT(opened, 0);
  RecordProperty("opened", opened);
  RecordProperty("refused", refused);
}

// One SST of many data blocks (400 keys and their records), one
// block in its middle damaged: the open either refuses the store naming the
// file or accounts for every key, never lists the keys before the damage
// and silently forgets the rest.
TEST(DamagedSstTest, ADamagedDataBlockMidSstHidesNoKey) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  options.storage.write_buffer_bytes = size_t{32} << 20;  // One flush.
  constexpr int kBlocks = 400;
  {
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    ASSERT_NE(tier, nullptr);
    for (int i = 0; i < kBlocks; ++i) ASSERT_THAT(PutSync(*tier, i), IsOk());
    ASSERT_THAT(tier->Flush(), IsOk());
  }
  std::vector<fs::path> ssts;
  for (const fs::path& file : DataFiles(options.storage.path)) {
    if (file.extension() == ".sst") ssts.push_back(file);
  }
  ASSERT_EQ(ssts.size(), 1u);
  const uint64_t size = fs::file_size(ssts[0]);
  ASSERT_GT(size, 12u << 10) << "one data block only";
  {
    // Data blocks come first; index, filter and footer at the end.
    std::fstream f(ssts[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 3));
    f.write("\xde\xad\xbe\xef", 4);
  }
  StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
  if (!tier.ok()) {
    EXPECT_EQ(tier.status().code(), StatusCode::kDataLoss)
        << tier.status().ToString();
    EXPECT_THAT(tier.status().message(),
                HasSubstr(ssts[0].filename().string()));
    EXPECT_THAT(tier.status().message(), HasSubstr("--disk-reset"));
    return;
  }
  const DiskTierStats stats = (*tier)->stats();
  EXPECT_EQ(stats.keys + stats.dropped_on_open, uint64_t{kBlocks});
}

// --- Removals and writes
// -------------------------------------------------------

// A storage whose value writes each wait for a permit once Hold is called.
class MeteredWritesStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ = 0;
  }
  void Let(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    permits_ += n;
    cv_.notify_all();
  }
  void WaitUntilWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ >= n; });
  }
  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++waiting_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return permits_ > 0; });
      --permits_;
      --waiting_;
    }
    return DiskStorageWrapper::WritePayload(offset, bytes);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int permits_ = 1 << 30;
  int waiting_ = 0;
};

// A read (a promotion a lookup waits for) goes before the writes queued
// ahead of it: it waits for an I/O thread to finish the write it is in, not
// for every spill queued.
TEST(DiskIoOrderTest, AReadGoesBeforeQueuedWrites) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  options.io_threads = 2;
  MeteredWritesStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  ASSERT_THAT(PutSync(tier, 0), IsOk());
  storage->Hold();
  constexpr int kPuts = 6;
  std::vector<std::promise<Status>> put_done(kPuts);
  std::vector<std::vector<std::byte>> blocks;
  for (int i = 1; i <= kPuts; ++i) blocks.push_back(BlockOf(i));
  for (int i = 1; i <= kPuts; ++i) {
    tier.Put(KeyOf(i), TokensOf(i), blocks[i - 1],
             [&put_done, i](Status s) { put_done[i - 1].set_value(s); });
  }
  storage->WaitUntilWaiting(2);  // Both threads in a write; four queued.
  std::promise<Status> got;
  std::vector<std::byte> out(kBlockBytes);
  tier.Get(KeyOf(0), TokensOf(0), out, [&](Status s) { got.set_value(s); });
  storage->Let(1);  // One write ends; its thread takes the read next.
  std::future<Status> read = got.get_future();
  const bool in_time =
      read.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  storage->Let(kPuts);
  for (auto& done : put_done) EXPECT_THAT(done.get_future().get(), IsOk());
  ASSERT_TRUE(in_time) << "the read waited for the queued writes";
  EXPECT_THAT(read.get(), IsOk());
  EXPECT_EQ(out, BlockOf(0));
}

// Writes still get a turn while reads keep coming: on one I/O thread, a
// write queued behind a stream of reads runs after eight of them, not after
// the last (spills would otherwise wait for as long as promotions come).
// Each read is asked for when the one before it is done, as promotions a
// lookup waits on arrive; reads queued together are read in one task.
TEST(DiskIoOrderTest, AWriteRunsAfterEightReadsWhileReadsKeepComing) {
  TempDir scratch("disk_fault_test");
  DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  options.io_threads = 1;
  MeteredWritesStorage* storage = nullptr;
  std::unique_ptr<DiskTier> opened = OpenWrapped(options, &storage);
  ASSERT_NE(opened, nullptr);
  DiskTier& tier = *opened;
  ASSERT_THAT(PutSync(tier, 0), IsOk());

  constexpr int kReads = 20;
  std::mutex mu;
  std::condition_variable cv;
  std::string order;  // 'w' per write done, 'r' per read, in order.
  std::vector<std::byte> out(kBlockBytes);
  std::function<void(Status)> read_done = [&](Status s) {
    EXPECT_THAT(s, IsOk());
    std::lock_guard<std::mutex> lock(mu);
    order += 'r';
    if (std::ranges::count(order, 'r') < kReads) {
      tier.Get(KeyOf(0), TokensOf(0), out, read_done);  // The next one.
    }
    cv.notify_all();
  };
  auto write_done = [&](Status s) {
    EXPECT_THAT(s, IsOk());
    std::lock_guard<std::mutex> lock(mu);
    order += 'w';
    cv.notify_all();
  };
  storage->Hold();
  const std::vector<std::byte> first = BlockOf(1), second = BlockOf(2);
  tier.Put(KeyOf(1), TokensOf(1), first, write_done);
  storage->WaitUntilWaiting(1);  // The thread is in the first write.
  tier.Put(KeyOf(2), TokensOf(2), second, write_done);
  tier.Get(KeyOf(0), TokensOf(0), out, read_done);
  storage->Let(2);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] {
    return order.size() == kReads + 2;
  })) << order;
  EXPECT_EQ(order, "w" + std::string(8, 'r') + "w" + std::string(12, 'r'));
}

// Holds every Put of `gated` inside the storage until released (or, with
// GateFreeBytes, the next FreeBytes: the tier's space check, which a Put
// runs between taking its work and reserving its key). Counts deletes and
// records the threads FileBytes runs on.
class GatedStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;

  void Gate(const BlockKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    gated_ = DiskStorageKey(key);
  }
  void GateFreeBytes() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_free_bytes_ = true;
  }
  void WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int puts_of(const BlockKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(
        std::count(written_.begin(), written_.end(), DiskStorageKey(key)));
  }
  int deletes() {
    std::lock_guard<std::mutex> lock(mu_);
    return deletes_;
  }
  int delete_batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return delete_batches_;
  }
  std::vector<std::thread::id> file_bytes_threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return file_bytes_threads_;
  }

  Status Put(std::string_view key,
             std::span<const std::string_view> parts) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      written_.emplace_back(key);
      if (key == gated_) Hold(lock);
    }
    return DiskStorageWrapper::Put(key, parts);
  }
  StatusOr<uint64_t> FreeBytes() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (gate_free_bytes_) {
        gate_free_bytes_ = false;
        Hold(lock);
      }
    }
    return DiskStorageWrapper::FreeBytes();
  }
  Status Delete(std::string_view key) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++deletes_;
    }
    return DiskStorageWrapper::Delete(key);
  }
  Status DeleteBatch(std::span<const std::string> keys) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++delete_batches_;
    }
    return DiskStorageWrapper::DeleteBatch(keys);
  }
  uint64_t FileBytes() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      file_bytes_threads_.push_back(std::this_thread::get_id());
    }
    return DiskStorageWrapper::FileBytes();
  }

 private:
  void Hold(std::unique_lock<std::mutex>& lock) {
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::string gated_;
  bool gate_free_bytes_ = false;
  bool held_ = false;
  bool released_ = false;
  int deletes_ = 0;
  int delete_batches_ = 0;
  std::vector<std::string> written_;
  std::vector<std::thread::id> file_bytes_threads_;
};

// Waits (yielding) until `done` holds; false if it does not within 10 s,
// which only a broken tier takes.
template <typename Fn>
bool WaitFor(Fn done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

bool StorageHas(DiskStorage& storage, const BlockKey& key) {
  return storage
      .Get(DiskStorageKey(key), [](std::string_view) { return Status::Ok(); })
      .ok();
}

struct GatedTier {
  GatedStorage* storage = nullptr;
  std::unique_ptr<DiskTier> tier;
};

GatedTier OpenGated(const std::string& path) {
  DiskTierOptions options = OptionsAt(path);
  options.io_threads = 1;  // Queued Puts wait behind the gated one.
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(options.storage);
  EXPECT_THAT(rocks, IsOk());
  auto gated = std::make_unique<GatedStorage>(std::move(rocks).value());
  GatedTier out{.storage = gated.get(), .tier = nullptr};
  StatusOr<std::unique_ptr<DiskTier>> tier =
      DiskTier::Open(options, std::move(gated));
  EXPECT_THAT(tier, IsOk());
  out.tier = std::move(tier).value();
  return out;
}

// A removed key whose Put is still queued never reaches the storage.
TEST(TombstoneTest, RemoveCancelsAQueuedPut) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  g.storage->Gate(KeyOf(0));
  std::vector<std::promise<Status>> done(2);
  const std::vector<std::byte> b0 = BlockOf(0), b1 = BlockOf(1);
  g.tier->Put(KeyOf(0), TokensOf(0), b0,
              [&](Status s) { done[0].set_value(s); });
  g.storage->WaitUntilHeld();  // The one I/O thread is busy with key 0.
  g.tier->Put(KeyOf(1), TokensOf(1), b1,
              [&](Status s) { done[1].set_value(s); });
  EXPECT_FALSE(g.tier->Remove(KeyOf(1)));  // Being written: not stored yet.
  g.storage->Release();
  EXPECT_THAT(done[0].get_future().get(), IsOk());
  // Cancelled: nothing written, and the caller is told so.
  EXPECT_EQ(done[1].get_future().get().code(), StatusCode::kAborted);
  EXPECT_THAT(g.tier->Flush(), IsOk());
  EXPECT_EQ(g.storage->puts_of(KeyOf(1)), 0);
  EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(1)));
  EXPECT_FALSE(g.tier->Contains(KeyOf(1)));
  EXPECT_TRUE(g.tier->Contains(KeyOf(0)));
}

// A Remove racing the write of its key waits for it and deletes it: once
// Remove returns, the storage holds nothing of the key.
TEST(TombstoneTest, RemoveDuringTheWriteDeletesItBeforeReturning) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  g.storage->Gate(KeyOf(0));
  std::promise<Status> done;
  const std::vector<std::byte> b0 = BlockOf(0);
  g.tier->Put(KeyOf(0), TokensOf(0), b0, [&](Status s) { done.set_value(s); });
  g.storage->WaitUntilHeld();  // Inside the storage's Put.
  ASSERT_GT(g.tier->stats().bytes, 0u);
  std::future<bool> removed =
      std::async(std::launch::async, [&] { return g.tier->Remove(KeyOf(0)); });
  // Remove has forgotten the key (its bytes are off the bound) and now
  // waits for the write, which the gate still holds.
  ASSERT_TRUE(WaitFor([&] { return g.tier->stats().bytes == 0; }));
  EXPECT_FALSE(g.tier->Contains(KeyOf(0)));
  g.storage->Release();
  EXPECT_FALSE(removed.get());  // Being written: not stored yet.
  EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(0)));
  EXPECT_EQ(g.storage->puts_of(KeyOf(0)), 1);  // It did land, then went.
  EXPECT_EQ(done.get_future().get().code(), StatusCode::kAborted);
  EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(0)));
  EXPECT_FALSE(g.tier->Contains(KeyOf(0)));
}

// A Remove that comes after a Put has left the queue but before it reserved
// its key (here: inside its space check) cancels it: the write never
// happens, so a kill after Remove cannot bring the block back.
TEST(TombstoneTest, RemoveWhileAPutIsPreparedCancelsIt) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  g.storage->GateFreeBytes();  // The first Put's space check.
  std::promise<Status> done;
  const std::vector<std::byte> b0 = BlockOf(0);
  g.tier->Put(KeyOf(0), TokensOf(0), b0, [&](Status s) { done.set_value(s); });
  g.storage->WaitUntilHeld();
  EXPECT_FALSE(g.tier->Remove(KeyOf(0)));
  g.storage->Release();
  EXPECT_EQ(done.get_future().get().code(), StatusCode::kAborted);
  EXPECT_THAT(g.tier->Flush(), IsOk());
  EXPECT_EQ(g.storage->puts_of(KeyOf(0)), 0);
  EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(0)));
  EXPECT_FALSE(g.tier->Contains(KeyOf(0)));
  EXPECT_EQ(g.tier->stats().bytes, 0u);
}

// Remove waits for a write of its own key only: a write of another key
// held in the storage does not hold it up.
TEST(TombstoneTest, RemoveWaitsOnlyForAWriteOfItsOwnKey) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  // Keys that shared a lock stripe (key.lo % 16) when removals locked one.
  int other = 1;
  while (KeyOf(other).lo % 16 != KeyOf(0).lo % 16) ++other;
  ASSERT_THAT(PutSync(*g.tier, 0), IsOk());
  g.storage->Gate(KeyOf(other));
  std::promise<Status> done;
  const std::vector<std::byte> block = BlockOf(other);
  g.tier->Put(KeyOf(other), TokensOf(other), block,
              [&](Status s) { done.set_value(s); });
  g.storage->WaitUntilHeld();
  std::future<bool> removed =
      std::async(std::launch::async, [&] { return g.tier->Remove(KeyOf(0)); });
  const bool returned =
      removed.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  g.storage->Release();
  ASSERT_TRUE(returned) << "Remove waited for another key's write";
  EXPECT_TRUE(removed.get());
  EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(0)));
  EXPECT_THAT(done.get_future().get(), IsOk());
  EXPECT_TRUE(g.tier->Contains(KeyOf(other)));
}

// RemoveAll deletes every key in one storage write (one log record).
TEST(TombstoneTest, RemoveAllDeletesInOneStorageWrite) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  for (int i = 0; i < 8; ++i) ASSERT_THAT(PutSync(*g.tier, i), IsOk());
  const int deletes = g.storage->deletes();
  EXPECT_EQ(g.tier->RemoveAll(), 8u);
  EXPECT_EQ(g.storage->delete_batches(), 1);
  EXPECT_EQ(g.storage->deletes(), deletes);
  for (int i = 0; i < 8; ++i) {
    EXPECT_FALSE(StorageHas(*g.storage->target(), KeyOf(i))) << i;
    EXPECT_FALSE(g.tier->Contains(KeyOf(i))) << i;
  }
}

// stats() never reads the storage's files on its caller's thread (a hung
// disk must not stall the stats thread or a metrics scrape), and Flush
// brings file_bytes up to date.
TEST(DiskStatsTest, StatsNeverReadTheDiskOnTheCallersThread) {
  TempDir scratch("disk_fault_test");
  GatedTier g = OpenGated(scratch.path() + "/db");
  for (int i = 0; i < 4; ++i) ASSERT_THAT(PutSync(*g.tier, i), IsOk());
  const size_t before = g.storage->file_bytes_threads().size();
  for (int i = 0; i < 3; ++i) (void)g.tier->stats();
  const std::vector<std::thread::id> threads = g.storage->file_bytes_threads();
  EXPECT_EQ(std::count(threads.begin() + static_cast<ptrdiff_t>(before),
                       threads.end(), std::this_thread::get_id()),
            0);
  EXPECT_THAT(g.tier->Flush(), IsOk());
  EXPECT_GT(g.tier->stats().file_bytes, 0u);
}

// Remove and RemoveAll delete before they return: a process that dies right
// after (no flush, no close) does not bring the blocks back.
// The test runs itself again (a fresh process: RocksDB's threads do not
// survive fork) with kChildDir set, to write, remove and die.
constexpr char kChildDir[] = "TIERKV_DISK_FAULT_CHILD_DIR";

TEST(TombstoneTest, RemovalsSurviveTheProcessDyingRightAfter) {
  if (const char* dir = getenv(kChildDir); dir != nullptr) {
    StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(OptionsAt(dir));
    if (!tier.ok()) _exit(2);
    for (int i = 0; i < 8; ++i) {
      if (!PutSync(**tier, i).ok()) _exit(3);
    }
    if (!(*tier)->Flush().ok()) _exit(4);  // All eight durable in files.
    if (!(*tier)->Remove(KeyOf(2))) _exit(5);
    if (!(*tier)->Remove(KeyOf(5))) _exit(6);
    _exit(0);  // Dies: no flush, no close.
  }
  TempDir scratch("disk_fault_test");
  const DiskTierOptions options = OptionsAt(scratch.path() + "/db");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv(kChildDir, options.storage.path.c_str(), 1);
    execl(
        "/proc/self/exe", "disk_fault_test",
        "--gtest_filter=TombstoneTest.RemovalsSurviveTheProcessDyingRightAfter",
        nullptr);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().keys, 6u);
  EXPECT_FALSE(tier->Contains(KeyOf(2)));
  EXPECT_FALSE(tier->Contains(KeyOf(5)));
  EXPECT_THAT(GetAndCheck(*tier, 0), IsOk());
  EXPECT_EQ(tier->RemoveAll(), 6u);
  tier.reset();  // Closing flushes, so this only checks the count.
  tier = OpenTier(options);
  EXPECT_EQ(tier->stats().keys, 0u);
}

}  // namespace
}  // namespace tierkv
