// RemoteTier (tiers/remote_tier.h) on a real Redis Cluster (3 masters, 3
// replicas; testing/redis_cluster_harness.h): blocks spilled from and
// promoted into host slots (here plain memory) bit-exact, and never served
// when the value is another store's, torn, damaged or another block's;
// its byte bound, TTL, Remove and RemoveAll; and the scans by which a tier
// learns of blocks another one wrote, and forgets those that are gone.
#include "tiers/remote_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/redis_cluster_harness.h"
#include "tests/status_matchers.h"
#include "tiers/redis_cluster.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr size_t kBlockBytes = 256 << 10;
constexpr int kSlots = 6;
constexpr auto kWait = std::chrono::seconds(10);

class RedisClusterRemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<RedisClusterHarness>> h =
        RedisClusterHarness::Start();
    ASSERT_THAT(h, IsOk());
    cluster_ = std::move(*h);
    RedisClusterOptions redis;
    redis.seeds = cluster_->Seeds();
    StatusOr<std::unique_ptr<RedisClusterClient>> raw =
        RedisClusterClient::Open(redis);
    ASSERT_THAT(raw, IsOk());
    raw_ = std::move(*raw);
    slots_.assign(kSlots, std::vector<std::byte>(kBlockBytes));
    for (int s = 0; s < kSlots; ++s) Fill(s, s + 1);
  }

  std::unique_ptr<RemoteTier> OpenTier(const std::string& fingerprint,
                                       uint64_t capacity_bytes = 0,
                                       std::chrono::milliseconds ttl = {},
                                       std::chrono::milliseconds scan = {}) {
    RemoteTierOptions options;
    options.redis.seeds = cluster_->Seeds();
    options.store_fingerprint = fingerprint;
    options.tenant = "tenant-a";
    options.block_bytes = kBlockBytes;
    options.slot_memory = [this](BlockId slot) {
      if (on_slot_read_) on_slot_read_(slot);
      return std::span<std::byte>(slots_[slot]);
    };
    options.max_demotion_backlog_bytes = max_demotion_backlog_bytes_;
    options.ttl = ttl;
    options.capacity_bytes = capacity_bytes;
    options.scan_interval = scan;
    options.cache_events = events_;
    options.block_size = 4;
    StatusOr<std::unique_ptr<RemoteTier>> tier = RemoteTier::Open(options);
    EXPECT_THAT(tier, IsOk());
    return tier.ok() ? std::move(*tier) : nullptr;
  }

  void Fill(int slot, int seed) {
    for (size_t i = 0; i < kBlockBytes; ++i) {
      slots_[slot][i] = static_cast<std::byte>((i * 131 + seed * 7) >> 3);
    }
  }
  uint64_t Checksum(int slot) {
    return XXH3_64bits(slots_[slot].data(), kBlockBytes);
  }

  static Status Spill(RemoteTier& tier, const BlockKey& key,
                      const std::vector<TokenId>& tokens, BlockId slot,
                      std::optional<uint64_t> checksum = std::nullopt) {
    std::promise<Status> done;
    tier.Spill(key, tokens, slot, checksum,
               [&done](Status s) { done.set_value(std::move(s)); });
    std::future<Status> f = done.get_future();
    if (f.wait_for(kWait) != std::future_status::ready) {
      return Status::DeadlineExceeded("spill never completed");
    }
    return f.get();
  }
  static StatusOr<uint64_t> Promote(RemoteTier& tier, const BlockKey& key,
                                    const std::vector<TokenId>& tokens,
                                    BlockId slot) {
    std::promise<StatusOr<uint64_t>> done;
    tier.Promote(key, tokens, slot, [&done](StatusOr<uint64_t> s) {
      done.set_value(std::move(s));
    });
    std::future<StatusOr<uint64_t>> f = done.get_future();
    if (f.wait_for(kWait) != std::future_status::ready) {
      return Status::DeadlineExceeded("promote never completed");
    }
    return f.get();
  }

  // The tier's remote stats once `done` holds; the last ones seen when it
  // does not within kWait.
  static RemoteTierStats WaitStats(
      const RemoteTier& tier,
      const std::function<bool(const RemoteTierStats&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    for (;;) {
      const RemoteTierStats s = tier.remote_stats().value();
      if (done(s) || std::chrono::steady_clock::now() > deadline) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Waits for two more whole scans: the second began after this call.
  static void WaitTwoScans(const RemoteTier& tier) {
    const uint64_t now = tier.remote_stats()->scan_passes;
    EXPECT_GE(WaitStats(tier,
                        [now](const RemoteTierStats& s) {
                          return s.scan_passes >= now + 2;
                        })
                  .scan_passes,
              now + 2);
  }

  // Holds the I/O thread in every spill of `slot` (as it reads the slot)
  // until ReleaseHeld; WaitUntilHeld returns once it is held.
  void HoldSpillsOfSlot(BlockId held) {
    on_slot_read_ = [this, held](BlockId slot) {
      if (slot != held) return;
      std::unique_lock<std::mutex> lock(hold_mu_);
      holding_ = true;
      hold_cv_.notify_all();
      hold_cv_.wait(lock, [this] { return released_; });
    };
  }
  void WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(hold_mu_);
    hold_cv_.wait(lock, [this] { return holding_; });
  }
  void ReleaseHeld() {
    {
      std::lock_guard<std::mutex> lock(hold_mu_);
      released_ = true;
    }
    hold_cv_.notify_all();
  }

  std::unique_ptr<RedisClusterHarness> cluster_;
  std::unique_ptr<RedisClusterClient> raw_;  // To read and damage values.
  CacheEventSink* events_ = nullptr;  // Given to the tiers OpenTier opens.
  // Called on the I/O thread as a spill reads a slot, for the tiers OpenTier
  // opens; and their bound on demotions waiting.
  std::function<void(BlockId)> on_slot_read_;
  uint64_t max_demotion_backlog_bytes_ = uint64_t{64} << 20;
  std::vector<std::vector<std::byte>> slots_;
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool holding_ = false;   // Guarded by hold_mu_.
  bool released_ = false;  // Guarded by hold_mu_.
};

const BlockKey kKey1{.lo = 0x1111, .hi = 0xaaaa};
const BlockKey kKey2{.lo = 0x2222, .hi = 0xbbbb};
const BlockKey kKey3{.lo = 0x3333, .hi = 0xcccc};
const std::vector<TokenId> kTokens1 = {1, 2, 3, 4};
const std::vector<TokenId> kTokens2 = {5, 6, 7, 8};
const std::vector<TokenId> kTokens3 = {9, 10, 11, 12};

TEST_F(RedisClusterRemoteTierTest, ServesOnlyVerifiedValuesOfItsBlock) {
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  EXPECT_THAT(tier->RedisKey(kKey1), StartsWith("tierkv:"));
  EXPECT_THAT(tier->RedisKey(kKey1), HasSubstr(":tenant-a:"));

  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  EXPECT_FALSE(tier->Contains(kKey1, kTokens2));
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 1), IsOkAndHolds(Checksum(0)));
  EXPECT_EQ(slots_[1], slots_[0]);

  // A slot that changed since its checksum was taken is not spilled.
  const uint64_t stale = Checksum(2);
  Fill(2, 99);
  EXPECT_THAT(Spill(*tier, kKey2, kTokens2, 2, stale),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_FALSE(tier->Contains(kKey2, kTokens2));

  // The same block key, other tokens (a collision): a miss. (A value as
  // long as the block's is read into the slot and verified there: after a
  // failed promotion the slot holds garbage, as Promote allows, and the
  // coordinator never serves it.)
  EXPECT_THAT(Promote(*tier, kKey1, kTokens2, 3),
              StatusIs(StatusCode::kNotFound));

  // Another model's store: its own key names, so a miss; and this store's
  // value copied under its key is refused too.
  std::unique_ptr<RemoteTier> other = OpenTier("model-b/layout-1");
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->RedisKey(kKey1), tier->RedisKey(kKey1));
  EXPECT_THAT(Promote(*other, kKey1, kTokens1, 3),
              StatusIs(StatusCode::kNotFound));
  StatusOr<std::string> value = raw_->Get(tier->RedisKey(kKey1));
  ASSERT_THAT(value, IsOk());
  ASSERT_THAT(raw_->Set(other->RedisKey(kKey1), *value), IsOk());
  EXPECT_THAT(Promote(*other, kKey1, kTokens1, 3),
              StatusIs(StatusCode::kNotFound));

  // A damaged payload byte, then a torn value: never served, deleted.
  std::string damaged = *value;
  damaged.back() = static_cast<char>(damaged.back() ^ 1);
  ASSERT_THAT(raw_->Set(tier->RedisKey(kKey1), damaged), IsOk());
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 3),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  // A value of another length is read whole and judged, never placed in
  // the slot.
  Fill(3, 3);
  const std::vector<std::byte> before = slots_[3];
  ASSERT_THAT(raw_->Set(tier->RedisKey(kKey1), value->substr(0, 1000)), IsOk());
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 3),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(slots_[3], before);
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));

  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.puts, 1u);
  EXPECT_EQ(stats.put_failures, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.token_mismatches, 1u);
  EXPECT_EQ(stats.checksum_failures, 2u);
  EXPECT_EQ(stats.keys, 0u);
}

// A block handed down as bytes (what a disk tier above evicts) is written
// as a spill is and reads back bit-exact. Demotions wait in a bounded queue:
// past the bound one is refused at once and counted, never queued without
// end behind a slow cluster; a block of the wrong size is refused too.
TEST_F(RedisClusterRemoteTierTest,
       DemotedBlocksAreWrittenAndTheirQueueBounded) {
  HoldSpillsOfSlot(5);  // The I/O thread waits there until released.
  max_demotion_backlog_bytes_ = kBlockBytes;  // One demotion waits at most.
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  std::promise<Status> held;
  tier->Spill(kKey3, kTokens3, 5, std::nullopt,
              [&held](Status s) { held.set_value(std::move(s)); });
  WaitUntilHeld();
  std::promise<Status> first;
  tier->Demote(kKey1, kTokens1, slots_[1],
               [&first](Status s) { first.set_value(std::move(s)); });
  Status second, wrong_size;
  tier->Demote(kKey2, kTokens2, slots_[2],
               [&second](Status s) { second = std::move(s); });
  tier->Demote(kKey2, kTokens2, std::vector<std::byte>(kBlockBytes - 1),
               [&wrong_size](Status s) { wrong_size = std::move(s); });
  EXPECT_THAT(second, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(wrong_size, StatusIs(StatusCode::kInvalidArgument));
  ReleaseHeld();
  EXPECT_THAT(held.get_future().get(), IsOk());
  EXPECT_THAT(first.get_future().get(), IsOk());
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  EXPECT_FALSE(tier->Contains(kKey2, kTokens2));
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 0), IsOkAndHolds(Checksum(1)));
  EXPECT_EQ(slots_[0], slots_[1]);
  const RemoteTierStats stats = tier->remote_stats().value();
  EXPECT_EQ(stats.puts, 2u);
  EXPECT_EQ(stats.put_failures, 2u);
  EXPECT_EQ(stats.keys, 2u);
}

TEST_F(RedisClusterRemoteTierTest, CapacityTtlRemoveAndRemoveAll) {
  // Room for two values (a value is the slot plus a small header).
  const uint64_t value_bytes = kBlockBytes + 200;
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 2 * value_bytes, std::chrono::seconds(60));
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0), IsOk());
  ASSERT_THAT(Spill(*tier, kKey2, kTokens2, 1), IsOk());
  // Using key 1 makes key 2 the least recently used.
  ASSERT_THAT(Promote(*tier, kKey1, kTokens1, 4), IsOk());
  ASSERT_THAT(Spill(*tier, kKey3, kTokens3, 2), IsOk());
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  EXPECT_FALSE(tier->Contains(kKey2, kTokens2));
  EXPECT_TRUE(tier->Contains(kKey3, kTokens3));
  uint64_t total = 0;
  EXPECT_THAT(tier->StoredKeys(16, &total), ElementsAre(kKey3, kKey1));
  EXPECT_EQ(total, 2u);
  EXPECT_THAT(tier->StoredKeys(1, &total), ElementsAre(kKey3));
  EXPECT_EQ(total, 2u);
  EXPECT_EQ(tier->stats().evictions, 1u);
  EXPECT_LE(tier->stats().bytes, 2 * value_bytes);
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey2)),
              StatusIs(StatusCode::kNotFound));

  // Values carry the TTL.
  const std::string key3 = tier->RedisKey(kKey3);
  StatusOr<int> master = cluster_->MasterOf(RedisKeySlot(key3));
  ASSERT_THAT(master, IsOk());
  StatusOr<std::string> pttl = cluster_->Command(*master, {"PTTL", key3});
  ASSERT_THAT(pttl, IsOk());
  EXPECT_GT(std::stoll(*pttl), 50000);
  EXPECT_LE(std::stoll(*pttl), 60000);

  // Remove forgets at once; the DEL runs before any later job.
  EXPECT_EQ(tier->Remove(kKey3).remote, 1u);
  EXPECT_FALSE(tier->Contains(kKey3, kTokens3));
  EXPECT_EQ(tier->Remove(kKey3).remote, 0u);
  EXPECT_THAT(Promote(*tier, kKey3, kTokens3, 4),
              StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(tier->RemoveAll().remote, 1u);
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 4),
              StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(tier->stats().bytes, 0u);
  EXPECT_THAT(tier->StoredKeys(16, &total), IsEmpty());
  EXPECT_EQ(total, 0u);
}

// A Remove while the key's write is queued: the write lands, but the DEL
// queued behind it deletes the value, so the index must not hold the key
// (the spill answers Aborted, as the disk tier's does). A later spill of
// the key is stored as ever.
TEST_F(RedisClusterRemoteTierTest, ARemoveBehindAQueuedWriteLeavesNothing) {
  HoldSpillsOfSlot(5);
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  std::promise<Status> spilled;
  tier->Spill(kKey1, kTokens1, 5, std::nullopt,
              [&spilled](Status s) { spilled.set_value(std::move(s)); });
  WaitUntilHeld();
  EXPECT_EQ(tier->Remove(kKey1).remote, 0u);  // Not stored yet.
  ReleaseHeld();
  EXPECT_THAT(spilled.get_future().get(), StatusIs(StatusCode::kAborted));
  tier->WaitQueued();
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  uint64_t total = 1;
  EXPECT_THAT(tier->StoredKeys(16, &total), IsEmpty());
  EXPECT_EQ(total, 0u);
  EXPECT_EQ(tier->stats().bytes, 0u);
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));
  on_slot_read_ = nullptr;
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 5), IsOk());
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 4), IsOkAndHolds(Checksum(5)));
}

// A RemoveAll (an operator's clear) while a demotion waits behind another
// write: the disk tier evicted that block before the clear, so it must not
// land in the cluster after it. A host slot's spill in flight does land.
TEST_F(RedisClusterRemoteTierTest, ADemotionQueuedBeforeRemoveAllIsNotKept) {
  HoldSpillsOfSlot(5);
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  std::promise<Status> spilled, demoted;
  tier->Spill(kKey3, kTokens3, 5, std::nullopt,
              [&spilled](Status s) { spilled.set_value(std::move(s)); });
  WaitUntilHeld();
  tier->Demote(kKey1, kTokens1, slots_[1],
               [&demoted](Status s) { demoted.set_value(std::move(s)); });
  EXPECT_EQ(tier->RemoveAll().remote, 0u);
  ReleaseHeld();
  EXPECT_THAT(spilled.get_future().get(), IsOk());
  EXPECT_THAT(demoted.get_future().get(), StatusIs(StatusCode::kAborted));
  tier->WaitQueued();
  EXPECT_TRUE(tier->Contains(kKey3, kTokens3));
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));
  // A demotion queued after the clear is kept.
  std::promise<Status> again;
  tier->Demote(kKey1, kTokens1, slots_[1],
               [&again](Status s) { again.set_value(std::move(s)); });
  EXPECT_THAT(again.get_future().get(), IsOk());
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
}

// A block the tier evicts past capacity_bytes is deleted as a Remove is:
// after scans had found it, it is no longer held, and later scans do not
// bring it back.
TEST_F(RedisClusterRemoteTierTest, AnEvictedBlockIsForgottenByScansToo) {
  const uint64_t value_bytes = kBlockBytes + 200;  // Room for two values.
  std::unique_ptr<RemoteTier> tier = OpenTier(
      "model-a/layout-1", 2 * value_bytes, {}, std::chrono::milliseconds(20));
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0), IsOk());
  WaitTwoScans(*tier);  // Key 1 is known to the scans as well.
  ASSERT_GE(tier->remote_stats()->known_keys, 1u);
  ASSERT_THAT(Spill(*tier, kKey2, kTokens2, 1), IsOk());
  ASSERT_THAT(Spill(*tier, kKey3, kTokens3, 2), IsOk());  // Evicts key 1.
  EXPECT_EQ(tier->stats().evictions, 1u);
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  WaitTwoScans(*tier);
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  EXPECT_TRUE(tier->Contains(kKey2, kTokens2));
  EXPECT_TRUE(tier->Contains(kKey3, kTokens3));
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));
}

// A value exactly as long as one of this block's, whose own header is
// longer (one more token id) and payload shorter: read into the slot as any
// value of that length is, then judged whole. Another store's (its payload
// is not block_bytes long): a miss, left in the cluster. Damaged: a miss,
// deleted.
TEST_F(RedisClusterRemoteTierTest, ValueOfThisLengthWithAnotherHeader) {
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  RemoteTierOptions options;
  options.redis.seeds = cluster_->Seeds();
  options.store_fingerprint = "model-a/layout-1";
  options.tenant = "tenant-a";
  options.block_bytes = kBlockBytes - 4;
  options.slot_memory = [this](BlockId slot) {
    return std::span<std::byte>(slots_[slot]).first(kBlockBytes - 4);
  };
  StatusOr<std::unique_ptr<RemoteTier>> shorter = RemoteTier::Open(options);
  ASSERT_THAT(shorter, IsOk());
  const std::vector<TokenId> five = {1, 2, 3, 4, 5};
  ASSERT_THAT(Spill(**shorter, kKey1, five, 0), IsOk());
  ASSERT_THAT(Spill(*tier, kKey2, kTokens1, 0), IsOk());
  StatusOr<std::string> foreign = raw_->Get(tier->RedisKey(kKey1));
  StatusOr<std::string> own = raw_->Get(tier->RedisKey(kKey2));
  ASSERT_THAT(foreign, IsOk());
  ASSERT_THAT(own, IsOk());
  ASSERT_EQ(foreign->size(), own->size());

  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 1),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)), IsOkAndHolds(*foreign));

  std::string damaged = *foreign;
  damaged.back() = static_cast<char>(damaged.back() ^ 1);
  ASSERT_THAT(raw_->Set(tier->RedisKey(kKey1), damaged), IsOk());
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 1),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(tier->stats().checksum_failures, 1u);

  // This tier's own value of that length is served, bit-exact.
  Fill(1, 77);
  EXPECT_THAT(Promote(*tier, kKey2, kTokens1, 1), IsOkAndHolds(Checksum(0)));
  EXPECT_EQ(slots_[1], slots_[0]);
}

// A value of another format version (a tierkvd of another release that
// shares the cluster, as in a rolling upgrade): a miss, left for the
// tierkvds that read it, never deleted as damaged.
TEST_F(RedisClusterRemoteTierTest, AValueOfAnotherFormatVersionIsLeftAlone) {
  std::unique_ptr<RemoteTier> tier = OpenTier("model-a/layout-1");
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0), IsOk());
  StatusOr<std::string> value = raw_->Get(tier->RedisKey(kKey1));
  ASSERT_THAT(value, IsOk());
  std::string newer = *value;
  uint16_t version = 0;  // After the 4-byte magic.
  std::memcpy(&version, newer.data() + 4, sizeof(version));
  ++version;
  std::memcpy(newer.data() + 4, &version, sizeof(version));
  // Its header laid out otherwise: what this release reads as the token
  // count is something else there.
  const uint32_t other_field = 0xffffffff;
  std::memcpy(newer.data() + 8, &other_field, sizeof(other_field));
  ASSERT_THAT(raw_->Set(tier->RedisKey(kKey1), newer), IsOk());
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 1),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(raw_->Get(tier->RedisKey(kKey1)), IsOkAndHolds(newer));
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
}

// A Remove whose DEL fails (here the key's master refuses writes) keeps the
// key deleting: no scan finds the value again meanwhile, and the DEL is
// tried again at each scan until it lands. Before, the value stayed in the
// cluster and the next scan served it again.
TEST_F(RedisClusterRemoteTierTest, ARemovedBlockWhoseDelFailedIsDeletedLater) {
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 0, {}, std::chrono::milliseconds(20));
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  const std::string redis_key = tier->RedisKey(kKey1);
  StatusOr<int> master = cluster_->MasterOf(RedisKeySlot(redis_key));
  ASSERT_THAT(master, IsOk());
  auto refuse_writes = [&](bool refuse) {
    ASSERT_THAT(
        cluster_->Command(*master, {"CONFIG", "SET", "min-replicas-to-write",
                                    refuse ? "5" : "0"}),
        IsOk());
  };
  refuse_writes(true);
  const uint64_t errors_before = tier->remote_stats()->errors;
  EXPECT_EQ(tier->Remove(kKey1).remote, 1u);
  const RemoteTierStats failed = WaitStats(
      *tier,
      [&](const RemoteTierStats& s) { return s.errors > errors_before; });
  ASSERT_GT(failed.errors, errors_before);  // The DEL: NOREPLICAS.
  WaitTwoScans(*tier);
  EXPECT_THAT(raw_->Get(redis_key), IsOk());      // Still there...
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));  // ...and not served.
  refuse_writes(false);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  StatusOr<std::string> value = raw_->Get(redis_key);
  while (value.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    value = raw_->Get(redis_key);
  }
  EXPECT_THAT(value, StatusIs(StatusCode::kNotFound));
  WaitTwoScans(*tier);
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
}

TEST(RedisClusterRemoteTierOptionsTest, RefusesMissingOrUnsafeOptions) {
  RemoteTierOptions options;
  options.redis.seeds = "127.0.0.1:1";
  options.block_bytes = 4096;
  options.slot_memory = [](BlockId) { return std::span<std::byte>(); };
  options.tenant = "t";
  EXPECT_THAT(RemoteTier::Open(options),
              StatusIs(StatusCode::kInvalidArgument));  // No fingerprint.
  options.store_fingerprint = "fp";
  for (const std::string& tenant :
       std::vector<std::string>{"", "a{b}", "a:b", std::string(65, 'x')}) {
    options.tenant = tenant;
    EXPECT_THAT(RemoteTier::Open(options),
                StatusIs(StatusCode::kInvalidArgument))
        << tenant;
  }
}

// A tier that scans learns of the blocks another tier (another machine)
// wrote, by key, and serves them bit-exact; a forged value under a key it
// learned is a counted miss, never served; keys that leave the cluster
// leave Contains at the next whole scan.
TEST_F(RedisClusterRemoteTierTest, ScansLearnOfOtherWritersBlocksAndForget) {
  std::unique_ptr<RemoteTier> writer = OpenTier("model-a/layout-1");
  std::unique_ptr<RemoteTier> reader =
      OpenTier("model-a/layout-1", 0, {}, std::chrono::milliseconds(20));
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  ASSERT_THAT(Spill(*writer, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  ASSERT_THAT(Spill(*writer, kKey2, kTokens2, 1, Checksum(1)), IsOk());
  // Another store's key and a key that names no block: never known.
  std::unique_ptr<RemoteTier> other = OpenTier("model-b/layout-1");
  ASSERT_NE(other, nullptr);
  ASSERT_THAT(Spill(*other, kKey3, kTokens3, 2, Checksum(2)), IsOk());
  const std::string prefix =
      reader->RedisKey(kKey1).substr(0, reader->RedisKey(kKey1).size() - 32);
  ASSERT_THAT(raw_->Set(prefix + "not-a-block-key", "x"), IsOk());

  RemoteTierStats s = WaitStats(
      *reader, [](const RemoteTierStats& s) { return s.known_keys >= 2; });
  EXPECT_EQ(s.known_keys, 2u);
  EXPECT_EQ(s.keys, 0u);  // It wrote none of them.
  EXPECT_TRUE(reader->Contains(kKey1, kTokens1));
  EXPECT_TRUE(reader->Contains(kKey2, kTokens2));
  EXPECT_FALSE(reader->Contains(kKey3, kTokens3));
  EXPECT_THAT(Promote(*reader, kKey1, kTokens1, 4), IsOkAndHolds(Checksum(0)));
  EXPECT_EQ(slots_[4], slots_[0]);

  // Known by key alone: the token ids are checked when the value is read
  // (into the slot, which holds garbage after the failed promotion).
  EXPECT_TRUE(reader->Contains(kKey2, kTokens1));
  EXPECT_THAT(Promote(*reader, kKey2, kTokens1, 5),
              StatusIs(StatusCode::kNotFound));
  // (Forgotten then, until the next scan finds the key again: a check here
  // would race the scans, every 20 ms.)

  // A forged value under a known key (of another length): a miss, deleted,
  // slot untouched.
  Fill(5, 55);
  const std::vector<std::byte> before = slots_[5];
  ASSERT_THAT(raw_->Set(reader->RedisKey(kKey1), std::string(4096, 'f')),
              IsOk());
  EXPECT_THAT(Promote(*reader, kKey1, kTokens1, 5),
              StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(slots_[5], before);

  // Gone from the cluster (deleted by the writer here): forgotten by the
  // next whole scan.
  EXPECT_EQ(writer->Remove(kKey2).remote, 1u);
  writer->WaitQueued();
  WaitTwoScans(*reader);
  EXPECT_FALSE(reader->Contains(kKey1, kTokens1));
  EXPECT_FALSE(reader->Contains(kKey2, kTokens2));
  s = *reader->remote_stats();
  EXPECT_EQ(s.known_keys, 0u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.token_mismatches, 1u);
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.scan_failures, 0u);
}

// Undoing a discarded spill (an operator's host clear) deletes only what
// this process may have written: another machine's block, known from a
// scan, stays in the cluster.
TEST_F(RedisClusterRemoteTierTest, UndoingASpillLeavesOtherMachinesBlocks) {
  std::unique_ptr<RemoteTier> writer = OpenTier("model-a/layout-1");
  std::unique_ptr<RemoteTier> reader =
      OpenTier("model-a/layout-1", 0, {}, std::chrono::milliseconds(20));
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  ASSERT_THAT(Spill(*writer, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  WaitStats(*reader,
            [](const RemoteTierStats& s) { return s.known_keys >= 1; });
  EXPECT_EQ(reader->RemoveSpilled(kKey1).remote, 0u);
  reader->WaitQueued();
  EXPECT_THAT(raw_->Get(reader->RedisKey(kKey1)), IsOk());
  EXPECT_TRUE(reader->Contains(kKey1, kTokens1));
  // The writer's own block is undone.
  EXPECT_EQ(writer->RemoveSpilled(kKey1).remote, 1u);
  writer->WaitQueued();
  EXPECT_THAT(raw_->Get(writer->RedisKey(kKey1)),
              StatusIs(StatusCode::kNotFound));
}

// The writer's own index drops blocks that expired in the cluster (TTL) at
// the first whole scan that began after they were written.
TEST_F(RedisClusterRemoteTierTest, AWholeScanDropsItsOwnExpiredBlocks) {
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 0, std::chrono::milliseconds(2000),
               std::chrono::milliseconds(20));
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  // Still there: the TTL leaves a loaded machine time to look.
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  // Its TTL counts from before the SET reached Redis, so a scan may still
  // find the key for a moment after the index dropped it.
  const RemoteTierStats s = WaitStats(*tier, [](const RemoteTierStats& s) {
    return s.keys == 0 && s.known_keys == 0;
  });
  EXPECT_EQ(s.keys, 0u);
  EXPECT_EQ(s.known_keys, 0u);
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
}

// A block whose TTL ran out is gone from the cluster: without scans nothing
// else drops it from the index, yet it is no hit, and the host must not
// drop its own copy on its account (Covers), or no tier would hold it.
TEST_F(RedisClusterRemoteTierTest, ABlockPastItsTtlNeitherHitsNorCovers) {
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 0, std::chrono::milliseconds(2000));
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  // Still there: the TTL leaves a loaded machine time to look.
  EXPECT_TRUE(tier->Contains(kKey1, kTokens1));
  EXPECT_TRUE(tier->Covers(kKey1, kTokens1));
  EXPECT_FALSE(tier->Covers(kKey1, kTokens2));  // Not for other tokens.
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (tier->Contains(kKey1, kTokens1) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(tier->Contains(kKey1, kTokens1));
  EXPECT_FALSE(tier->Covers(kKey1, kTokens1));
  // The next write drops it from the index: it holds no bytes of the bound.
  ASSERT_THAT(Spill(*tier, kKey2, kTokens2, 1, Checksum(1)), IsOk());
  uint64_t total = 0;
  EXPECT_THAT(tier->StoredKeys(16, &total), ElementsAre(kKey2));
  EXPECT_EQ(total, 1u);
  EXPECT_EQ(tier->remote_stats()->keys, 1u);
  // Spilled again, it is held for another TTL.
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  EXPECT_TRUE(tier->Covers(kKey1, kTokens1));
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 4), IsOkAndHolds(Checksum(0)));
}

// A block this tier wrote expired, and another machine wrote it again: the
// scans find it, and the expired write no longer hides it.
TEST_F(RedisClusterRemoteTierTest, ABlockWrittenAgainAfterItExpiredIsAHit) {
  // Scans every 3 s: the rewrite below lands before the scan after the
  // expiry, so every scan from then on finds the key.
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 0, std::chrono::milliseconds(2000),
               std::chrono::milliseconds(3000));
  std::unique_ptr<RemoteTier> other =
      OpenTier("model-a/layout-1", 0, std::chrono::seconds(60));
  ASSERT_NE(tier, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  const auto until = [&](bool contained) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (tier->Contains(kKey1, kTokens1) != contained &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return tier->Contains(kKey1, kTokens1) == contained;
  };
  EXPECT_TRUE(until(false));  // Expired.
  ASSERT_THAT(Spill(*other, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  EXPECT_TRUE(until(true));  // Found by the next scan.
  EXPECT_THAT(Promote(*tier, kKey1, kTokens1, 4), IsOkAndHolds(Checksum(0)));
}

// A key known only from a scan: another machine wrote it, when this tier
// does not know. Under a TTL it may expire at once, so it is a hit to try
// but does not cover the host's copy; without one it covers.
TEST_F(RedisClusterRemoteTierTest, AKeyKnownFromAScanCoversOnlyWithoutATtl) {
  std::unique_ptr<RemoteTier> writer =
      OpenTier("model-a/layout-1", 0, std::chrono::seconds(60));
  std::unique_ptr<RemoteTier> with_ttl =
      OpenTier("model-a/layout-1", 0, std::chrono::seconds(60),
               std::chrono::milliseconds(20));
  std::unique_ptr<RemoteTier> without_ttl =
      OpenTier("model-a/layout-1", 0, {}, std::chrono::milliseconds(20));
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(with_ttl, nullptr);
  ASSERT_NE(without_ttl, nullptr);
  ASSERT_THAT(Spill(*writer, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  for (RemoteTier* reader : {with_ttl.get(), without_ttl.get()}) {
    EXPECT_EQ(
        WaitStats(*reader,
                  [](const RemoteTierStats& s) { return s.known_keys >= 1; })
            .known_keys,
        1u);
    EXPECT_TRUE(reader->Contains(kKey1, kTokens1));
  }
  EXPECT_FALSE(with_ttl->Covers(kKey1, kTokens1));
  EXPECT_TRUE(without_ttl->Covers(kKey1, kTokens1));
  // Its own write covers under the TTL.
  ASSERT_THAT(Spill(*with_ttl, kKey1, kTokens1, 0, Checksum(0)), IsOk());
  EXPECT_TRUE(with_ttl->Covers(kKey1, kTokens1));
}

// The KV events of the remote tier: what this tier's index gains and loses,
// each key once, so a router's copy of the index stays exact.
class EventLog final : public CacheEventSink {
 public:
  void BlockStored(const StoredBlockEvent& b) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(b.medium, CacheMedium::kRemote);
    EXPECT_EQ(b.block_size, 4);
    EXPECT_FALSE(b.parent.has_value());
    log_.push_back("stored " + std::to_string(b.key.lo) + " tokens " +
                   std::to_string(b.tokens.size()));
  }
  void BlockRemoved(CacheMedium medium, const BlockKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_EQ(medium, CacheMedium::kRemote);
    log_.push_back("removed " + std::to_string(key.lo));
  }
  void AllBlocksCleared() override {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back("cleared");
  }
  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(log_, {});
  }

 private:
  std::mutex mu_;
  std::vector<std::string> log_;
};

TEST_F(RedisClusterRemoteTierTest, ReportsTheBlocksItWroteAsKvEvents) {
  EventLog log;
  events_ = &log;
  const uint64_t value_bytes = kBlockBytes + 200;
  std::unique_ptr<RemoteTier> tier =
      OpenTier("model-a/layout-1", 2 * value_bytes);
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0), IsOk());
  ASSERT_THAT(Spill(*tier, kKey2, kTokens2, 1), IsOk());
  EXPECT_THAT(log.Take(),
              ElementsAre("stored 4369 tokens 4", "stored 8738 tokens 4"));
  // Written again: still one entry, no second BlockStored; key 2 is now the
  // least recently used, and goes for the byte bound.
  ASSERT_THAT(Spill(*tier, kKey1, kTokens1, 0), IsOk());
  ASSERT_THAT(Spill(*tier, kKey3, kTokens3, 2), IsOk());
  EXPECT_THAT(log.Take(), ElementsAre("stored 13107 tokens 4", "removed 8738"));
  EXPECT_EQ(tier->Remove(kKey1).remote, 1u);
  EXPECT_THAT(log.Take(), ElementsAre("removed 4369"));
  // A value deleted behind the tier's back: the promotion that finds it gone
  // drops it from the index, and says so.
  const std::string key3[] = {tier->RedisKey(kKey3)};
  ASSERT_THAT(raw_->MultiDel(key3), ElementsAre(IsOkAndHolds(true)));
  EXPECT_THAT(Promote(*tier, kKey3, kTokens3, 4),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(log.Take(), ElementsAre("removed 13107"));
  ASSERT_THAT(Spill(*tier, kKey2, kTokens2, 1), IsOk());
  EXPECT_EQ(tier->RemoveAll().remote, 1u);
  EXPECT_THAT(log.Take(), ElementsAre("stored 8738 tokens 4", "removed 8738"));
  tier.reset();
  EXPECT_THAT(log.Take(), IsEmpty());
}

}  // namespace
}  // namespace tierkv
