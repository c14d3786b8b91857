// The block events the tiers report (src/cache_event_sink.h): replaying
// the coordinator's host-tier events (stores, evictions for reuse, an
// operator's evict and clear) and a real disk tier's events (writes, LRU
// evictions, removals, the blocks Open finds) rebuilds exactly the keys each
// tier holds (Coordinator::HeldKeysNow, DiskTier::StoredKeys); stored blocks
// carry their parent in the request's key chain and the request's LoRA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/cache_event_sink.h"
#include "src/coordinator.h"
#include "src/mutex.h"
#include "tests/scratch.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

using ::testing::ElementsAreArray;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

// What a router does with the events: one set of keys per medium.
class IndexSink : public CacheEventSink {
 public:
  struct Stored {
    CacheMedium medium;
    BlockKey key;
    std::optional<BlockKey> parent;
    std::vector<TokenId> tokens;
    std::optional<uint64_t> lora_id;
  };

  void BlockStored(const StoredBlockEvent& b) override {
    MutexLock lock(&mu_);
    held_[b.medium].insert(b.key.ToHex());
    stored_.push_back({b.medium,
                       b.key,
                       b.parent,
                       {b.tokens.begin(), b.tokens.end()},
                       b.lora_id});
  }
  void BlockRemoved(CacheMedium medium, const BlockKey& key) override {
    MutexLock lock(&mu_);
    // A tier reports only keys it held: a removal of anything else would
    // mean the stream lost or reordered an event.
    if (held_[medium].erase(key.ToHex()) == 0) ++unknown_removals_;
  }
  void AllBlocksCleared() override {
    MutexLock lock(&mu_);
    held_.clear();
    ++clears_;
  }

  std::set<std::string> Held(CacheMedium medium) {
    MutexLock lock(&mu_);
    return held_[medium];
  }
  std::vector<Stored> stored() {
    MutexLock lock(&mu_);
    return stored_;
  }
  int unknown_removals() {
    MutexLock lock(&mu_);
    return unknown_removals_;
  }
  int clears() {
    MutexLock lock(&mu_);
    return clears_;
  }

 private:
  Mutex mu_;
  std::map<CacheMedium, std::set<std::string>> held_ TIERKV_GUARDED_BY(mu_);
  std::vector<Stored> stored_ TIERKV_GUARDED_BY(mu_);
  int unknown_removals_ TIERKV_GUARDED_BY(mu_) = 0;
  int clears_ TIERKV_GUARDED_BY(mu_) = 0;
};

std::set<std::string> Hex(const std::vector<BlockKey>& keys) {
  std::set<std::string> out;
  for (const BlockKey& key : keys) out.insert(key.ToHex());
  return out;
}

class KvEventsCoordinatorTest : public ::testing::Test {
 protected:
  KvEventsCoordinatorTest()
      : c_(Coordinator::Create({.layout = TestLayout(),
                                .host_slots = 10,
                                .caps = {.worker_pin_share = 1.0},
                                .cache_events = &sink_})
               .value()),
        w_(c_.RegisterWorker({.layout = TestLayout(),
                              .num_device_blocks = 100,
                              .tenant = "",
                              .pid = 1,
                              .name = "w"})
               .value()) {}

  // Stores every full block of `tokens` as request `id`.
  void Store(RequestId id, const std::vector<TokenId>& tokens,
             const RequestExtras& extras = {}) {
    ASSERT_THAT(c_.Lookup(w_, id, tokens, 0, extras), IsOk());
    std::vector<BlockId> device;
    for (size_t b = 0; b <= tokens.size() / 16; ++b) {
      device.push_back(static_cast<BlockId>(b + 1));
    }
    ASSERT_THAT(c_.Allocate(w_, id, device, 0), IsOk());
    StatusOr<CommitResult> commit =
        c_.Commit(w_, id, static_cast<int32_t>(tokens.size()), device);
    ASSERT_THAT(commit, IsOk());
    for (const TransferEvent& e : commit->stores) {
      std::vector<CompletedEvent> done{{e.ref, true}};
      ASSERT_THAT(c_.Complete(w_, done), IsOk());
    }
    ASSERT_THAT(c_.Finish(w_, id), IsOk());
  }
  void ExpectIndexMatches() {
    const HeldKeys held = c_.HeldKeysNow(1000);
    EXPECT_EQ(sink_.Held(CacheMedium::kCpu), Hex(held.host));
    EXPECT_EQ(sink_.unknown_removals(), 0);
  }

  IndexSink sink_;
  Coordinator c_;
  WorkerId w_;
};

TEST_F(KvEventsCoordinatorTest, StoredBlocksCarryTheirChainAndLora) {
  RequestExtras extras;
  extras.lora_id = 7;
  Store(1, SequentialTokens(0, 48), extras);
  const std::vector<IndexSink::Stored> stored = sink_.stored();
  ASSERT_EQ(stored.size(), 3u);
  EXPECT_EQ(stored[0].parent, std::nullopt);
  EXPECT_EQ(stored[1].parent, stored[0].key);
  EXPECT_EQ(stored[2].parent, stored[1].key);
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_EQ(stored[i].medium, CacheMedium::kCpu);
    EXPECT_EQ(stored[i].lora_id, 7u);
    EXPECT_THAT(stored[i].tokens, ElementsAreArray(SequentialTokens(
                                      static_cast<TokenId>(16 * i), 16)));
  }
  ExpectIndexMatches();
  EXPECT_EQ(c_.HeldKeysNow(1000).host_total, 3u);
}

// A chunk is keyed by content alone: its blocks chain from the chunk's
// first block and carry no LoRA, even on a request a LoRA lookup left open.
TEST_F(KvEventsCoordinatorTest, ChunkBlocksChainWithinTheChunk) {
  RequestExtras extras;
  extras.lora_id = 7;
  ASSERT_THAT(c_.Lookup(w_, 5, SequentialTokens(0, 48), 0, extras), IsOk());
  const std::vector<BlockId> device = {1, 2};
  StatusOr<CommitResult> publish =
      c_.PublishChunk(w_, 5, SequentialTokens(500, 24), device);
  ASSERT_THAT(publish, IsOk());
  for (const TransferEvent& e : publish->stores) {
    std::vector<CompletedEvent> done{{e.ref, true}};
    ASSERT_THAT(c_.Complete(w_, done), IsOk());
  }
  const std::vector<IndexSink::Stored> stored = sink_.stored();
  ASSERT_EQ(stored.size(), 2u);  // A full block and the partial last one.
  EXPECT_EQ(stored[0].parent, std::nullopt);
  EXPECT_EQ(stored[1].parent, stored[0].key);
  EXPECT_EQ(stored[1].tokens.size(), 8u);
  EXPECT_EQ(stored[0].lora_id, std::nullopt);
  EXPECT_EQ(stored[1].lora_id, std::nullopt);
  ExpectIndexMatches();
}

// Nine usable host slots: the fourth request of three blocks evicts.
TEST_F(KvEventsCoordinatorTest, ReplayingTheEventsRebuildsTheHostIndex) {
  for (RequestId r = 1; r <= 6; ++r) {
    Store(r, SequentialTokens(static_cast<TokenId>(1000 * r), 48));
    ExpectIndexMatches();
  }
  EXPECT_GT(c_.stats().host.evictions, 0u);
  const HeldKeys held = c_.HeldKeysNow(1000);
  ASSERT_FALSE(held.host.empty());
  (void)c_.Evict(std::vector<BlockKey>{held.host[0]});
  ExpectIndexMatches();
  EXPECT_EQ(sink_.Held(CacheMedium::kCpu).count(held.host[0].ToHex()), 0u);
  ASSERT_THAT(c_.Clear(TierSelection::kAll), IsOk());
  ExpectIndexMatches();
  EXPECT_THAT(sink_.Held(CacheMedium::kCpu), IsEmpty());
  EXPECT_EQ(sink_.clears(), 1);  // Nothing kept: a full clear.
}

// A clear that keeps pinned blocks is no AllBlocksCleared.
TEST_F(KvEventsCoordinatorTest, AClearThatKeepsPinnedBlocksIsNotAFullClear) {
  const std::vector<TokenId> tokens = SequentialTokens(0, 48);
  Store(1, tokens);
  ASSERT_EQ(c_.Lookup(w_, 2, tokens, 0, {}).value().hit_tokens, 32);
  StatusOr<ClearResult> cleared = c_.Clear(TierSelection::kAll);
  ASSERT_THAT(cleared, IsOk());
  EXPECT_EQ(cleared->host_kept_pinned, 2u);
  EXPECT_EQ(sink_.clears(), 0);
  ExpectIndexMatches();
  EXPECT_EQ(sink_.Held(CacheMedium::kCpu).size(), 2u);
}

class KvEventsDiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(uint64_t blocks) {
    const KvLayout layout = TestLayout();
    DiskTierOptions options;
    options.storage.path = dir_.path() + "/db";
    options.layout_fingerprint = layout.Fingerprint();
    options.block_bytes = layout.BlockBytes();
    options.capacity_bytes =
        blocks * DiskValueBytes(layout.BlockBytes(),
                                options.layout_fingerprint.size(), 16);
    options.cache_events = &sink_;
    options.block_size = layout.block_size;
    return options;
  }
  static Status Put(DiskTier& tier, int i, std::span<const std::byte> bytes) {
    std::promise<Status> done;
    std::future<Status> result = done.get_future();
    const std::vector<TokenId> tokens = SequentialTokens(16 * i, 16);
    tier.Put(Key(i), tokens, bytes, [&](Status s) { done.set_value(s); });
    return result.get();
  }
  static BlockKey Key(int i) {
    return {.lo = static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15, .hi = 1};
  }
  std::set<std::string> Stored(const DiskTier& tier) {
    uint64_t total = 0;
    std::vector<BlockKey> keys = tier.StoredKeys(1000, &total);
    EXPECT_EQ(total, keys.size());
    return Hex(keys);
  }

  TempDir dir_{"cache_events_test"};
  IndexSink sink_;
};

TEST_F(KvEventsDiskTierTest, ReplayingTheEventsRebuildsTheDiskIndex) {
  const std::vector<std::byte> bytes(TestLayout().BlockBytes(),
                                     std::byte{0x5a});
  {
    std::unique_ptr<DiskTier> tier = DiskTier::Open(Options(3)).value();
    for (int i = 0; i < 6; ++i) {
      ASSERT_THAT(Put(*tier, i, bytes), IsOk());
      EXPECT_EQ(sink_.Held(CacheMedium::kStorage), Stored(*tier));
    }
    EXPECT_GT(tier->stats().evictions, 0u);     // The bound evicted some.
    ASSERT_THAT(Put(*tier, 5, bytes), IsOk());  // A rewrite of a held key.
    EXPECT_TRUE(tier->Remove(Key(4)));
    EXPECT_EQ(sink_.Held(CacheMedium::kStorage), Stored(*tier));
    EXPECT_EQ(sink_.unknown_removals(), 0);
    const std::vector<IndexSink::Stored> stored = sink_.stored();
    ASSERT_FALSE(stored.empty());
    EXPECT_EQ(stored.back().medium, CacheMedium::kStorage);
    EXPECT_EQ(stored.back().parent, std::nullopt);  // The tier keeps none.
    EXPECT_THAT(stored.back().tokens,
                ElementsAreArray(SequentialTokens(80, 16)));
  }
  // Open reports what it finds, to a router that starts from nothing.
  IndexSink reopened;
  DiskTierOptions options = Options(3);
  options.cache_events = &reopened;
  std::unique_ptr<DiskTier> tier = DiskTier::Open(options).value();
  EXPECT_EQ(reopened.Held(CacheMedium::kStorage), Stored(*tier));
  EXPECT_FALSE(Stored(*tier).empty());
  EXPECT_GT(tier->RemoveAll(), 0u);
  EXPECT_THAT(reopened.Held(CacheMedium::kStorage), IsEmpty());
  EXPECT_EQ(reopened.unknown_removals(), 0);
}

}  // namespace
}  // namespace tierkv
