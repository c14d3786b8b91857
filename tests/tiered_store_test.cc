// The coordinator over a real host tier and a real disk tier (RocksDB in a
// temporary directory), in one process: spilling past the high watermark,
// promotion on a hit, a working set ten times the host, a corrupted value,
// the disk's byte bound, a worker dropped mid-promotion, and an operator's
// evict and clear. The test plays the worker: it writes a store's bytes
// into the host slots itself and reads a load's bytes from them.
#include "tiers/tiered_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "src/coordinator.h"
#include "tests/block_pattern.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tierkv/embedded.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace tierkv {
namespace {

constexpr int32_t kBs = 16;

// Tokens of request r: `blocks` full blocks, distinct for every r.
std::vector<TokenId> RequestTokens(int r, int blocks) {
  std::vector<TokenId> t(static_cast<size_t>(blocks) * kBs);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<TokenId>(r * 100000 + static_cast<int>(i) + 1);
  }
  return t;
}

// Flips the last byte of any block read back whose token ids include
// `poison`: a block's bytes go to the value file (WritePayload), then its
// record, token ids included, on the same thread (Put).
class CorruptingStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<TokenId> poison{0};

  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    last_write_offset_ = offset;
    return DiskStorageWrapper::WritePayload(offset, bytes);
  }

  Status Put(std::string_view key,
             std::span<const std::string_view> parts) override {
    std::string record;
    for (std::string_view part : parts) record.append(part);
    {
      std::lock_guard<std::mutex> lock(mu_);
      records_[last_write_offset_] = record;
    }
    return DiskStorageWrapper::Put(key, parts);
  }

  Status ReadPayload(uint64_t offset,
                     std::span<const std::span<std::byte>> outs) override {
    Status s = DiskStorageWrapper::ReadPayload(offset, outs);
    const TokenId p = poison.load();
    const std::string_view needle(reinterpret_cast<const char*>(&p), sizeof(p));
    std::lock_guard<std::mutex> lock(mu_);
    for (std::span<std::byte> out : outs) {
      auto it = records_.find(offset);
      if (p != 0 && !out.empty() && it != records_.end() &&
          it->second.find(needle) != std::string::npos) {
        out.back() ^= std::byte{0x5A};
      }
      offset += out.size();
    }
    return s;
  }

 private:
  static thread_local uint64_t last_write_offset_;
  std::mutex mu_;
  // The record last written for each value file offset.
  std::map<uint64_t, std::string> records_;  // GUARDED_BY(mu_)
};
thread_local uint64_t CorruptingStorage::last_write_offset_ = 0;

// With `refuse` set, every write fails, as a broken disk's would: the
// disk tier degrades and takes no more.
class RefusingStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  std::atomic<bool> refuse{false};

  Status Put(std::string_view key,
             std::span<const std::string_view> value_parts) override {
    if (refuse.load()) return Status::Unavailable("injected write error");
    return DiskStorageWrapper::Put(key, value_parts);
  }
};

// A remote tier in memory (TieredStoreOptions::remote): a copy of each
// block spilled, served back bit-exact; counts what it did.
class MemoryRemoteTier final : public LowerTier {
 public:
  explicit MemoryRemoteTier(
      std::function<std::span<std::byte>(BlockId)> slot_memory)
      : slot_memory_(std::move(slot_memory)) {}

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = blocks_.find(key);
    return it != blocks_.end() &&
           std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(),
                      it->second.tokens.end());
  }
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             std::optional<uint64_t>, Done done) override {
    const std::span<std::byte> bytes = slot_memory_(slot);
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[key] = {{tokens.begin(), tokens.end()},
                      {bytes.begin(), bytes.end()}};
      ++spills;
    }
    done(Status::Ok());
  }
  void Demote(const BlockKey& key, std::span<const TokenId> tokens,
              std::vector<std::byte> payload, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[key] = {{tokens.begin(), tokens.end()}, std::move(payload)};
      ++demotions;
    }
    done(Status::Ok());
  }
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, PromoteDone done) override {
    const std::span<std::byte> bytes = slot_memory_(slot);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = blocks_.find(key);
      if (it == blocks_.end() ||
          !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(),
                      it->second.tokens.end())) {
        return done(Status::NotFound("not in the remote tier"));
      }
      std::memcpy(bytes.data(), it->second.bytes.data(), bytes.size());
      ++promotions;
    }
    done(XXH3_64bits(bytes.data(), bytes.size()));
  }
  LowerRemoval Remove(const BlockKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return {.remote = blocks_.erase(key)};
  }
  LowerRemoval RemoveAll() override {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t n = blocks_.size();
    blocks_.clear();
    return {.remote = n};
  }
  std::vector<BlockKey> StoredKeys(size_t, uint64_t* total) const override {
    std::lock_guard<std::mutex> lock(mu_);
    *total = blocks_.size();
    return {};
  }
  DiskTierStats stats() const override { return {}; }
  std::optional<DiskTierStats> disk_stats() const override {
    return std::nullopt;
  }
  std::optional<RemoteTierStats> remote_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return RemoteTierStats{.keys = blocks_.size(), .hits = promotions};
  }

  bool HasKey(const BlockKey& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.contains(key);
  }

  uint64_t spills = 0;      // Guarded by mu_.
  uint64_t demotions = 0;   // Guarded by mu_.
  uint64_t promotions = 0;  // Guarded by mu_.
  std::mutex& mu() const { return mu_; }

 private:
  struct Block {
    std::vector<TokenId> tokens;
    std::vector<std::byte> bytes;
  };
  const std::function<std::span<std::byte>(BlockId)> slot_memory_;
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Block, BlockKeyHash> blocks_;  // Guarded by mu_.
};

struct LoadOutcome {
  int32_t hit_blocks = 0;
  int32_t disk_hit_blocks = 0;
  int32_t loaded_blocks = 0;
  int32_t failed_blocks = 0;
  int32_t wrong_blocks = 0;
  bool was_pending = false;
};

class TieredStoreTest : public ::testing::Test {
 protected:
  // `host_slots` usable slots; a disk bounded to `disk_blocks` values.
  // Write-behind is off unless asked for: most tests count the spills the
  // watermarks make.
  // With `remote`, a MemoryRemoteTier beside (or under) the disk tier
  // (remote_).
  void Open(int32_t host_slots, int64_t disk_blocks, double high = 0.8,
            double low = 0.5, int32_t write_behind_spills = 0,
            bool remote = false,
            RemotePlacement placement = RemotePlacement::kBeside) {
    const KvLayout layout = TestLayout();
    auto storage = OpenRocksDbStorage(
        {.path = dir_ + "/disk", .write_buffer_bytes = 1 << 20});
    ASSERT_THAT(storage, IsOk());
    auto corrupting = std::make_unique<CorruptingStorage>(std::move(*storage));
    corrupting_ = corrupting.get();
    auto refusing = std::make_unique<RefusingStorage>(std::move(corrupting));
    refusing_ = refusing.get();
    DiskTierOptions disk;
    // A value is a block plus a header of about 130 bytes.
    disk.capacity_bytes = disk_blocks * (layout.BlockBytes() + 256);
    disk.layout_fingerprint = layout.Fingerprint();
    disk.block_bytes = layout.BlockBytes();
    auto tier = DiskTier::Open(disk, std::move(refusing));
    ASSERT_THAT(tier, IsOk());
    TieredStoreOptions options;
    options.layout = layout;
    options.host.num_slots = host_slots + 1;
    options.host.layout_fingerprint = layout.Fingerprint();
    options.disk = std::move(*tier);
    options.spill_high = high;
    options.spill_low = low;
    options.write_behind_spills = write_behind_spills;
    if (remote) {
      options.remote =
          [this](std::function<std::span<std::byte>(BlockId)> slot_memory)
          -> StatusOr<std::unique_ptr<LowerTier>> {
        auto tier = std::make_unique<MemoryRemoteTier>(std::move(slot_memory));
        remote_ = tier.get();
        return std::unique_ptr<LowerTier>(std::move(tier));
      };
      options.remote_placement = placement;
    }
    // One worker, alone on the store: it may pin every slot.
    options.caps.worker_pin_share = 1;
    // The test applies the disk tier's results itself (Settle), so spills
    // and promotions stay in flight until it says.
    options.tier_thread = false;
    auto store = TieredStore::Open(std::move(options));
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    worker_ = c()->RegisterWorker({.layout = layout,
                                   .num_device_blocks = 1024,
                                   .tenant = "",
                                   .pid = 1,
                                   .name = "test"})
                  .value();
  }

  // The coordinator, locked for one call: c()->Lookup(...).
  TieredStore::Locked c() { return store_->Lock(); }
  const HostTier& host() const { return store_->host(); }

  // Runs every spill and promotion the coordinator started (and those the
  // results start in turn) to the end.
  void Settle() { ASSERT_TRUE(store_->WaitIdle(std::chrono::seconds(60))); }
  // A host of 10 slots over a disk tier with a remote tier beside it
  // (remote_), and request 0's five blocks pushed down to both by requests
  // 1 to 3. Returns request 0's tokens.
  std::vector<TokenId> SpillVictimBesideRemote() {
    Open(/*host_slots=*/10, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.1,
         /*write_behind_spills=*/0, /*remote=*/true);
    const std::vector<TokenId> victim = RequestTokens(0, 5);
    Store(victim);
    Settle();
    for (int r = 1; r < 4; ++r) {
      Store(RequestTokens(r, 2));
      Settle();
    }
    return victim;
  }

  std::vector<BlockId> DeviceBlocks(size_t n) const {
    std::vector<BlockId> blocks(n);
    for (size_t i = 0; i < n; ++i) blocks[i] = static_cast<BlockId>(i);
    return blocks;
  }

  // Stores every full block of `tokens`, as a worker would.
  void Store(const std::vector<TokenId>& tokens) {
    const RequestId id = next_request_++;
    const size_t blocks = tokens.size() / kBs;
    ASSERT_THAT(c()->Lookup(worker_, id, tokens, 0, {}), IsOk());
    ASSERT_THAT(c()->Allocate(worker_, id, DeviceBlocks(blocks), 0), IsOk());
    auto commit = c()->Commit(worker_, id, static_cast<int32_t>(tokens.size()),
                              DeviceBlocks(blocks));
    ASSERT_THAT(commit, IsOk());
    std::vector<CompletedEvent> done;
    for (const TransferEvent& store : commit->stores) {
      for (size_t i = 0; i < store.host_blocks.size(); ++i) {
        // Device block b holds the request's block b.
        const BlockId b = store.device_blocks[i];
        FillBlock(tokens[b * kBs],
                  {host().slot(store.host_blocks[i]), host().slot_bytes()});
      }
      done.push_back({store.ref, true});
    }
    ASSERT_THAT(c()->Complete(worker_, done), IsOk());
    ASSERT_THAT(c()->Finish(worker_, id), IsOk());
  }

  // Looks `tokens` (plus one token) up, loads the whole hit and checks the
  // bytes of every loaded block.
  LoadOutcome Load(std::vector<TokenId> tokens) {
    LoadOutcome out;
    const RequestId id = next_request_++;
    tokens.push_back(1);
    auto hit = c()->Lookup(worker_, id, tokens, 0, {});
    EXPECT_THAT(hit, IsOk());
    out.hit_blocks = hit->hit_tokens / kBs;
    out.disk_hit_blocks = hit->disk_hit_tokens / kBs;
    auto alloc = c()->Allocate(worker_, id, DeviceBlocks(tokens.size() / kBs),
                               hit->hit_tokens);
    EXPECT_THAT(alloc, IsOk());
    std::optional<TransferEvent> load = alloc->load;
    out.was_pending = alloc->load_pending;
    if (alloc->load_pending) {
      Settle();
      std::vector<TransferEvent> ready = c()->TakeReadyLoads(worker_).value();
      EXPECT_EQ(ready.size(), 1u);
      if (ready.size() != 1) return out;
      load = ready[0];
    }
    if (load.has_value()) {
      out.loaded_blocks = static_cast<int32_t>(load->host_blocks.size());
      out.failed_blocks = load->failed_blocks;
      std::vector<std::byte> expected(host().slot_bytes());
      for (size_t i = 0; i < load->host_blocks.size(); ++i) {
        FillBlock(tokens[load->device_blocks[i] * kBs], expected);
        if (std::memcmp(host().slot(load->host_blocks[i]), expected.data(),
                        expected.size()) != 0) {
          ++out.wrong_blocks;
        }
      }
      const CompletedEvent done[] = {{load->ref, true}};
      EXPECT_THAT(c()->Complete(worker_, done), IsOk());
    }
    EXPECT_THAT(c()->Finish(worker_, id), IsOk());
    return out;
  }

  // Values in RocksDB itself (not the disk tier's index), once flushed.
  // Block values in the storage (not the store's fingerprint record).
  size_t StoredValues() {
    EXPECT_THAT(store_->Flush(), IsOk());
    size_t values = 0;
    EXPECT_THAT(
        corrupting_->ForEach([&](std::string_view key, std::string_view) {
          if (key != DiskFingerprintKey()) ++values;
          return Status::Ok();
        }),
        IsOk());
    return values;
  }

  const TempDir scratch_{"tiered_store_test"};
  const std::string dir_ = scratch_.path();
  CorruptingStorage* corrupting_ = nullptr;  // Owned by store_'s disk tier.
  RefusingStorage* refusing_ = nullptr;      // Owned by store_'s disk tier.
  MemoryRemoteTier* remote_ = nullptr;       // Owned by store_, if any.
  std::unique_ptr<TieredStore> store_;
  WorkerId worker_ = 0;
  RequestId next_request_ = 1;
};

// Options the coordinator refuses are an error, after the disk tier was
// opened: the half-built store closes its tiers cleanly.
TEST_F(TieredStoreTest, RefusedWatermarksCloseTheOpenedDiskTier) {
  const KvLayout layout = TestLayout();
  auto disk = DiskTier::Open({.storage = {.path = dir_ + "/refused"},
                              .capacity_bytes = 1 << 20,
                              .layout_fingerprint = layout.Fingerprint(),
                              .block_bytes = layout.BlockBytes()});
  ASSERT_THAT(disk, IsOk());
  TieredStoreOptions options;
  options.layout = layout;
  options.host.num_slots = 9;
  options.disk = std::move(*disk);
  options.spill_high = 1.5;
  EXPECT_THAT(TieredStore::Open(std::move(options)),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TieredStoreTest, SpillsPastTheHighWatermarkDownToTheLowOne) {
  Open(/*host_slots=*/20, /*disk_blocks=*/100, /*high=*/0.8, /*low=*/0.5);
  for (int r = 0; r < 4; ++r) {
    Store(RequestTokens(r, 5));
    Settle();
  }
  // 20 blocks stored: past 16 in use, spilling brought the host to 10.
  const CoordinatorStats s = c()->stats();
  EXPECT_LE(s.host.used_slots, 16);
  EXPECT_GT(s.host.spills, 0u);
  EXPECT_EQ(s.host.spills + static_cast<uint64_t>(s.host.used_slots), 20u);
  EXPECT_EQ(s.host.evictions, 0u);
  EXPECT_EQ(s.host.pinned_slots, 0);
  ASSERT_TRUE(s.disk.has_value());
  EXPECT_EQ(s.disk->keys, s.host.spills);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());

  // The oldest request went to disk first; it comes back through a
  // pending load, bit-exact, and is on host again afterwards.
  LoadOutcome first = Load(RequestTokens(0, 5));
  EXPECT_EQ(first.hit_blocks, 5);
  EXPECT_EQ(first.disk_hit_blocks, 5);
  EXPECT_TRUE(first.was_pending);
  EXPECT_EQ(first.loaded_blocks, 5);
  EXPECT_EQ(first.wrong_blocks, 0);
  EXPECT_EQ(c()->stats().host.promotions, 5u);
  LoadOutcome again = Load(RequestTokens(0, 5));
  EXPECT_EQ(again.disk_hit_blocks, 0);
  EXPECT_FALSE(again.was_pending);
  EXPECT_EQ(again.loaded_blocks, 5);
  EXPECT_EQ(again.wrong_blocks, 0);
}

// The keys a worker of the shared tenant gets for `tokens`' full blocks.
std::vector<BlockKey> PrefixKeys(const std::vector<TokenId>& tokens) {
  const KeyHasher hasher(
      {.model_fingerprint = TestLayout().Fingerprint(), .tenant = ""});
  std::vector<BlockKey> keys;
  hasher.AppendPrefixKeys(tokens, kBs, {}, &keys);
  return keys;
}

TEST_F(TieredStoreTest, EvictAndClearRemoveBlocksFromDisk) {
  Open(/*host_slots=*/20, /*disk_blocks=*/100, /*high=*/0.8, /*low=*/0.5);
  for (int r = 0; r < 4; ++r) {
    Store(RequestTokens(r, 5));
    Settle();
  }
  // Request 0 went to disk first (see the test above).
  const std::vector<BlockKey> keys = PrefixKeys(RequestTokens(0, 5));
  const BlockKey third[] = {keys[2]};
  EXPECT_EQ(c()->Evict(third)[0],
            (EvictedBlock{.key = keys[2], .disk_dropped = true}));
  LoadOutcome cut = Load(RequestTokens(0, 5));
  EXPECT_EQ(cut.hit_blocks, 2);
  EXPECT_EQ(cut.disk_hit_blocks, 2);
  EXPECT_EQ(cut.wrong_blocks, 0);
  // Promoted blocks are on host and still on disk: evict takes both.
  const BlockKey first[] = {keys[0]};
  EXPECT_EQ(EvictedBlockSummary(c()->Evict(first)[0]),
            "dropped from host and disk");
  EXPECT_EQ(Load(RequestTokens(0, 5)).hit_blocks, 0);

  const uint64_t on_disk = c()->stats().disk->keys;
  ASSERT_GT(on_disk, 0u);
  const ClearResult cleared = c()->Clear(TierSelection::kDisk).value();
  EXPECT_TRUE(cleared.disk_cleared);
  EXPECT_EQ(cleared.disk_dropped, on_disk);
  EXPECT_EQ(cleared.host_dropped, 0u);  // The host is not touched.
  EXPECT_EQ(c()->stats().disk->keys, 0u);
  EXPECT_EQ(c()->stats().disk->evictions, 0u);
  // What only the disk held is gone; what the host holds still hits.
  const LoadOutcome second = Load(RequestTokens(1, 5));
  EXPECT_EQ(second.disk_hit_blocks, 0);
  const LoadOutcome last = Load(RequestTokens(3, 5));
  EXPECT_EQ(last.hit_blocks, 5);
  EXPECT_EQ(last.disk_hit_blocks, 0);

  EXPECT_GT(c()->Clear(TierSelection::kAll).value().host_dropped, 0u);
  EXPECT_EQ(Load(RequestTokens(3, 5)).hit_blocks, 0);
  // The values are gone from RocksDB too, not just from the index.
  EXPECT_EQ(StoredValues(), 0u);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

TEST_F(TieredStoreTest, TenTimesTheHostReadsBackBitExact) {
  Open(/*host_slots=*/16, /*disk_blocks=*/400);
  constexpr int kRequests = 40, kBlocks = 4;  // 160 blocks: 10x the host.
  for (int r = 0; r < kRequests; ++r) {
    Store(RequestTokens(r, kBlocks));
    Settle();
  }
  EXPECT_EQ(c()->stats().host.evictions, 0u);
  int wrong = 0, loaded = 0, from_disk = 0;
  for (int r = 0; r < kRequests; ++r) {
    LoadOutcome o = Load(RequestTokens(r, kBlocks));
    EXPECT_EQ(o.hit_blocks, kBlocks) << "request " << r;
    EXPECT_EQ(o.failed_blocks, 0) << "request " << r;
    wrong += o.wrong_blocks;
    loaded += o.loaded_blocks;
    from_disk += o.disk_hit_blocks;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(loaded, kRequests * kBlocks);
  EXPECT_GE(from_disk, kRequests * kBlocks - 16);  // All but what host held.
  const CoordinatorStats s = c()->stats();
  EXPECT_EQ(s.host.promotion_failures, 0u);
  EXPECT_EQ(s.host.pinned_slots, 0);
  // Promoted blocks had a disk copy: pressure dropped them, not re-spilled.
  EXPECT_GT(s.host.spill_drops, 0u);
  EXPECT_LE(s.disk->puts, uint64_t{kRequests * kBlocks});  // Once each.
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// An engine aborts a request whose load waits for promotions: Finish
// cancels the load, so no copy ever starts into device blocks the engine
// may already have given to another request. The promotions still land on
// host, where the next lookup hits them.
TEST_F(TieredStoreTest, PendingLoadIsCancelledByFinish) {
  Open(/*host_slots=*/8, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.25);
  for (int r = 0; r < 4; ++r) {
    Store(RequestTokens(r, 2));
    Settle();
  }
  for (const bool ready_first : {false, true}) {
    const RequestId id = next_request_++;
    std::vector<TokenId> tokens = RequestTokens(ready_first ? 1 : 0, 2);
    tokens.push_back(1);
    auto hit = c()->Lookup(worker_, id, tokens, 0, {});
    ASSERT_THAT(hit, IsOk());
    ASSERT_EQ(hit->disk_hit_tokens, 2 * kBs) << "spilled to disk first";
    auto alloc = c()->Allocate(worker_, id, DeviceBlocks(3), hit->hit_tokens);
    ASSERT_THAT(alloc, IsOk());
    ASSERT_TRUE(alloc->load_pending);
    EXPECT_EQ(c()->stats().host.events_in_flight, 1u);
    if (ready_first) Settle();  // READY, not taken yet.
    ASSERT_THAT(c()->Finish(worker_, id), IsOk());
    Settle();
    EXPECT_TRUE(c()->TakeReadyLoads(worker_).value().empty());
    const CoordinatorStats s = c()->stats();
    EXPECT_EQ(s.host.events_in_flight, 0u);
    EXPECT_EQ(s.host.pinned_slots, 0);
    EXPECT_TRUE(c()->events().empty());
    // The promoted blocks are on host now.
    LoadOutcome again = Load(RequestTokens(ready_first ? 1 : 0, 2));
    EXPECT_EQ(again.hit_blocks, 2);
    EXPECT_FALSE(again.was_pending);
    EXPECT_EQ(again.wrong_blocks, 0);
  }
  EXPECT_EQ(c()->stats().host.loads_cancelled, 2u);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

TEST_F(TieredStoreTest, CorruptedValueIsDroppedCountedAndRecomputed) {
  Open(/*host_slots=*/10, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.1);
  const std::vector<TokenId> victim = RequestTokens(0, 5);
  Store(victim);
  Settle();
  for (int r = 1; r < 4; ++r) {  // Push the victim's blocks to disk.
    Store(RequestTokens(r, 2));
    Settle();
  }
  // Block 2's value is corrupted on its way back.
  corrupting_->poison = victim[2 * kBs];
  LoadOutcome o = Load(victim);
  EXPECT_EQ(o.hit_blocks, 5);
  EXPECT_EQ(o.disk_hit_blocks, 5);
  EXPECT_TRUE(o.was_pending);
  EXPECT_EQ(o.loaded_blocks, 2);  // Cut before the bad block...
  EXPECT_EQ(o.failed_blocks, 3);  // ...which the engine recomputes.
  EXPECT_EQ(o.wrong_blocks, 0);
  CoordinatorStats s = c()->stats();
  EXPECT_EQ(s.disk->checksum_failures, 1u);
  EXPECT_EQ(s.host.promotion_failures, 1u);
  EXPECT_EQ(s.host.pinned_slots, 0);
  // The bad value is gone from disk: the chain now stops before it.
  corrupting_->poison = 0;
  LoadOutcome after = Load(victim);
  EXPECT_EQ(after.hit_blocks, 2);
  EXPECT_EQ(after.wrong_blocks, 0);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// A remote tier beside the disk tier: every spill is written to both, and
// a block whose disk value fails verification is loaded from the remote
// tier instead, bit-exact, rather than cut from the load.
TEST_F(TieredStoreTest, DiskBesideRemoteWritesBothAndFallsBackOnABadRead) {
  const std::vector<TokenId> victim = SpillVictimBesideRemote();
  ASSERT_NE(remote_, nullptr);
  CoordinatorStats s = c()->stats();
  ASSERT_TRUE(s.disk.has_value());
  ASSERT_TRUE(s.remote.has_value());
  EXPECT_EQ(s.remote->keys, s.disk->keys);  // Written through.
  EXPECT_GE(s.disk->keys, 5u);
  EXPECT_EQ(s.host.spill_failures, 0u);

  corrupting_->poison = victim[2 * kBs];
  LoadOutcome o = Load(victim);
  EXPECT_EQ(o.hit_blocks, 5);
  EXPECT_EQ(o.disk_hit_blocks, 5);
  EXPECT_EQ(o.loaded_blocks, 5);  // Block 2 from the remote tier.
  EXPECT_EQ(o.failed_blocks, 0);
  EXPECT_EQ(o.wrong_blocks, 0);
  s = c()->stats();
  EXPECT_EQ(s.disk->checksum_failures, 1u);
  EXPECT_EQ(s.remote->hits, 1u);
  EXPECT_EQ(s.host.promotion_failures, 0u);

  // The bad disk value is gone: the remote tier still holds the block.
  corrupting_->poison = 0;
  o = Load(victim);
  EXPECT_EQ(o.loaded_blocks, 5);
  EXPECT_EQ(o.wrong_blocks, 0);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// With the remote tier beside the disk tier every spilled block is on both:
// evict and clear say what each medium dropped, and count a block held by
// both once in each (not twice under "disk").
TEST_F(TieredStoreTest, EvictAndClearCountDiskAndRemoteApart) {
  const std::vector<TokenId> victim = SpillVictimBesideRemote();
  ASSERT_NE(remote_, nullptr);
  const std::vector<BlockKey> keys = PrefixKeys(victim);
  ASSERT_TRUE(remote_->HasKey(keys[1]));
  const BlockKey second[] = {keys[1]};
  const EvictedBlock evicted = c()->Evict(second)[0];
  EXPECT_EQ(evicted,
            (EvictedBlock{
                .key = keys[1], .disk_dropped = true, .remote_dropped = true}));
  EXPECT_EQ(EvictedBlockSummary(evicted), "dropped from disk and remote");
  EXPECT_FALSE(remote_->HasKey(keys[1]));

  const CoordinatorStats s = c()->stats();
  ASSERT_GT(s.disk->keys, 0u);
  ASSERT_EQ(s.remote->keys, s.disk->keys);  // Written through.
  const ClearResult cleared = c()->Clear(TierSelection::kDisk).value();
  EXPECT_TRUE(cleared.disk_cleared);
  EXPECT_TRUE(cleared.remote_cleared);
  EXPECT_EQ(cleared.disk_dropped, s.disk->keys);
  EXPECT_EQ(cleared.remote_dropped, s.remote->keys);
  EXPECT_EQ(c()->stats().remote->keys, 0u);
  EXPECT_EQ(c()->stats().disk->keys, 0u);
}

// A block read from the remote tier is kept on the local disk once the
// host evicts it again (the disk tier is the nearer copy), and that spill
// does not write the block to the remote tier a second time.
TEST_F(TieredStoreTest, ABlockReadFromTheRemoteTierGoesToDiskWhenEvicted) {
  const std::vector<TokenId> victim = SpillVictimBesideRemote();
  ASSERT_NE(remote_, nullptr);
  // Block 2's disk value fails verification and is deleted: the load takes
  // it from the remote tier, which alone holds it now.
  corrupting_->poison = victim[2 * kBs];
  LoadOutcome o = Load(victim);
  ASSERT_EQ(o.loaded_blocks, 5);
  ASSERT_EQ(o.wrong_blocks, 0);
  corrupting_->poison = 0;
  CoordinatorStats s = c()->stats();
  ASSERT_EQ(s.disk->checksum_failures, 1u);
  ASSERT_EQ(s.remote->hits, 1u);
  const uint64_t disk_keys = s.disk->keys;
  uint64_t remote_spills = 0;
  {
    std::lock_guard<std::mutex> lock(remote_->mu());
    remote_spills = remote_->spills;
  }
  for (int r = 4; r < 8; ++r) {  // Push the victim down again.
    Store(RequestTokens(r, 2));
    Settle();
  }
  s = c()->stats();
  // Block 2 went to disk again, and to disk alone: every other block spilled
  // since is one of the new requests', written to both tiers.
  ASSERT_GT(s.disk->keys, disk_keys);
  {
    std::lock_guard<std::mutex> lock(remote_->mu());
    EXPECT_EQ(remote_->spills - remote_spills, s.disk->keys - disk_keys - 1);
  }
  // With the remote tier emptied, the whole victim comes from disk.
  remote_->RemoveAll();
  o = Load(victim);
  EXPECT_EQ(o.hit_blocks, 5);
  EXPECT_EQ(o.loaded_blocks, 5);
  EXPECT_EQ(o.failed_blocks, 0);
  EXPECT_EQ(o.wrong_blocks, 0);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// A remote tier under the disk tier: spills go to disk alone, and what the
// disk tier evicts for room goes on to the remote tier, from which it loads
// back bit-exact; blocks the disk still holds are not written there.
TEST_F(TieredStoreTest, DiskOverRemoteHandsDownWhatTheDiskEvicts) {
  Open(/*host_slots=*/8, /*disk_blocks=*/6, /*high=*/0.5, /*low=*/0.25,
       /*write_behind_spills=*/0, /*remote=*/true, RemotePlacement::kUnder);
  ASSERT_NE(remote_, nullptr);
  constexpr int kRequests = 12;
  for (int r = 0; r < kRequests; ++r) {
    Store(RequestTokens(r, 2));
    Settle();
  }
  CoordinatorStats s = c()->stats();
  ASSERT_TRUE(s.disk.has_value());
  ASSERT_TRUE(s.remote.has_value());
  ASSERT_GT(s.disk->evictions, 0u);
  {
    std::lock_guard<std::mutex> lock(remote_->mu());
    EXPECT_EQ(remote_->spills, 0u);  // Nothing from host directly.
    EXPECT_EQ(remote_->demotions, s.disk->evictions);
  }
  EXPECT_EQ(s.remote->keys, s.disk->evictions);
  EXPECT_EQ(s.host.evicted_unspilled, 0u);
  // The blocks the disk holds are not in the remote tier.
  const HeldKeys held = c()->HeldKeysNow(1000);
  ASSERT_FALSE(held.disk.empty());
  for (const BlockKey& key : held.disk) {
    EXPECT_FALSE(remote_->HasKey(key)) << key.ToHex();
  }
  // The first request left host, then disk: it loads from the remote tier.
  LoadOutcome o = Load(RequestTokens(0, 2));
  EXPECT_EQ(o.hit_blocks, 2);
  EXPECT_EQ(o.disk_hit_blocks, 2);
  EXPECT_EQ(o.loaded_blocks, 2);
  EXPECT_EQ(o.failed_blocks, 0);
  EXPECT_EQ(o.wrong_blocks, 0);
  EXPECT_EQ(c()->stats().remote->hits, 2u);
  // Every request is still somewhere, whole and bit-exact.
  for (int r = 0; r < kRequests; ++r) {
    o = Load(RequestTokens(r, 2));
    EXPECT_EQ(o.hit_blocks, 2) << r;
    EXPECT_EQ(o.wrong_blocks, 0) << r;
  }
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// Under a disk tier that takes no writes (degraded), the remote tier is no
// longer only what the disk gives up: spills the disk fails go to it, so
// the host still evicts nothing no tier holds.
TEST_F(TieredStoreTest, DiskOverRemoteSpillsToRemoteWhenTheDiskRefuses) {
  Open(/*host_slots=*/8, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.25,
       /*write_behind_spills=*/0, /*remote=*/true, RemotePlacement::kUnder);
  ASSERT_NE(remote_, nullptr);
  refusing_->refuse = true;
  constexpr int kRequests = 8;
  for (int r = 0; r < kRequests; ++r) {
    Store(RequestTokens(r, 2));
    Settle();
  }
  const CoordinatorStats s = c()->stats();
  ASSERT_TRUE(s.disk.has_value());
  EXPECT_EQ(s.disk->degraded, 1u);
  EXPECT_EQ(s.disk->keys, 0u);
  EXPECT_GT(s.host.spills, 0u);
  EXPECT_EQ(s.host.spill_failures, 0u);
  EXPECT_EQ(s.host.evicted_unspilled, 0u);
  {
    std::lock_guard<std::mutex> lock(remote_->mu());
    EXPECT_EQ(remote_->spills, s.host.spills);
  }
  for (int r = 0; r < kRequests; ++r) {
    const LoadOutcome o = Load(RequestTokens(r, 2));
    EXPECT_EQ(o.hit_blocks, 2) << r;
    EXPECT_EQ(o.wrong_blocks, 0) << r;
  }
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
}

// A remote tier under no disk tier is a mistake in the options, not a
// remote tier silently under host.
TEST_F(TieredStoreTest, RemoteUnderNoDiskIsRefused) {
  const KvLayout layout = TestLayout();
  TieredStoreOptions options;
  options.layout = layout;
  options.host.num_slots = 9;
  options.remote = [](std::function<std::span<std::byte>(BlockId)> slot_memory)
      -> StatusOr<std::unique_ptr<LowerTier>> {
    return std::unique_ptr<LowerTier>(
        std::make_unique<MemoryRemoteTier>(std::move(slot_memory)));
  };
  options.remote_placement = RemotePlacement::kUnder;
  EXPECT_THAT(TieredStore::Open(std::move(options)),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TieredStoreTest, DiskBoundEvictsLeastRecentlyUsedBlocks) {
  Open(/*host_slots=*/8, /*disk_blocks=*/6, /*high=*/0.5, /*low=*/0.25);
  constexpr int kRequests = 30;
  for (int r = 0; r < kRequests; ++r) {
    Store(RequestTokens(r, 1));
    Settle();
  }
  const CoordinatorStats s = c()->stats();
  ASSERT_TRUE(s.disk.has_value());
  EXPECT_LE(s.disk->bytes, s.disk->capacity_bytes);
  EXPECT_GT(s.disk->evictions, 0u);
  EXPECT_EQ(s.host.evictions, 0u);
  // Every block is on host, on disk, or was evicted from disk: counted.
  EXPECT_EQ(static_cast<uint64_t>(s.host.used_slots) + s.disk->keys +
                s.disk->evictions,
            static_cast<uint64_t>(kRequests));
  // The oldest are gone (a miss, never wrong bytes); the newest hit.
  LoadOutcome oldest = Load(RequestTokens(0, 1));
  EXPECT_EQ(oldest.hit_blocks, 0);
  LoadOutcome newest = Load(RequestTokens(kRequests - 1, 1));
  EXPECT_EQ(newest.hit_blocks, 1);
  EXPECT_EQ(newest.wrong_blocks, 0);
}

// A host eviction of a block the disk holds renews it there: written
// behind first, evicted from host later, it is then the disk's most
// recently used, after blocks written since.
TEST_F(TieredStoreTest, AHostEvictionRenewsTheBlockOnDisk) {
  // Eight slots, no watermark (evictions alone), every block written
  // behind; the disk holds them all.
  Open(/*host_slots=*/8, /*disk_blocks=*/100, 1.0, 1.0,
       /*write_behind_spills=*/16);
  Store(RequestTokens(0, 4));
  Settle();
  Store(RequestTokens(1, 4));
  Settle();
  const std::vector<BlockKey> first = PrefixKeys(RequestTokens(0, 4));
  const std::vector<BlockKey> second = PrefixKeys(RequestTokens(1, 4));
  uint64_t total = 0;
  auto position = [&](const BlockKey& key) {
    const std::vector<BlockKey> order =
        store_->disk()->StoredKeys(1000, &total);
    const auto it = std::find(order.begin(), order.end(), key);
    EXPECT_NE(it, order.end());
    return it - order.begin();
  };
  EXPECT_LT(position(first[0]), position(second[0]));  // Written first.
  // Four more blocks: the host evicts the first request's.
  Store(RequestTokens(2, 4));
  Settle();
  EXPECT_GT(c()->stats().host.evictions, 0u);
  int renewed = 0;
  for (const BlockKey& k : first) {
    if (c()->host_pool().FindKeyedBlock(k).has_value()) continue;
    EXPECT_GT(position(k), position(second[3])) << k.ToHex();
    ++renewed;
  }
  EXPECT_GT(renewed, 0);
}

// Lost and kept blocks of requests 0..requests-1 (blocks_each blocks
// each, as RequestTokens): on host, on disk, or on neither.
struct Whereabouts {
  int64_t on_host = 0;
  int64_t on_disk_only = 0;
  int64_t lost = 0;
};

class TieredStoreWriteBehindTest : public TieredStoreTest {
 protected:
  // Bursts of four blocks on a host of eight, each burst stored in one
  // commit while the previous burst's spills are still to come: the
  // watermark (0.9, 0.7) alone starts spills only once the host is full,
  // so the next burst evicts blocks whose spills have not started.
  static constexpr int kBursts = 10;
  static constexpr int kBlocksEach = 4;
  void StoreBursts() {
    for (int r = 0; r < kBursts; ++r) {
      Store(RequestTokens(r, kBlocksEach));
      Settle();
    }
  }
  Whereabouts Find() {
    Whereabouts out;
    for (int r = 0; r < kBursts; ++r) {
      const std::vector<TokenId> tokens = RequestTokens(r, kBlocksEach);
      const std::vector<BlockKey> keys = PrefixKeys(tokens);
      for (size_t b = 0; b < keys.size(); ++b) {
        const std::span<const TokenId> block =
            std::span<const TokenId>(tokens).subspan(b * kBs, kBs);
        if (c()->host_pool().GetCachedBlock(keys[b], block).has_value()) {
          ++out.on_host;
        } else if (store_->disk()->Contains(keys[b], block)) {
          ++out.on_disk_only;
        } else {
          ++out.lost;
        }
      }
    }
    return out;
  }
};

// The counter counts exactly the blocks no tier holds; without write-behind
// this load loses some.
TEST_F(TieredStoreWriteBehindTest, WatermarkAloneLosesBlocksAndCountsEachOne) {
  Open(/*host_slots=*/8, /*disk_blocks=*/100, 0.9, 0.7,
       /*write_behind_spills=*/0);
  StoreBursts();
  const Whereabouts where = Find();
  const HostTierStats h = c()->stats().host;
  EXPECT_GT(where.lost, 0);
  EXPECT_EQ(h.evicted_unspilled, static_cast<uint64_t>(where.lost));
  EXPECT_EQ(where.on_host + where.on_disk_only + where.lost,
            kBursts * kBlocksEach);
  EXPECT_EQ(h.spills_kept, 0u);
}

// With one write-behind copy at a time, every burst's blocks reach the disk
// before the next burst needs their slots: evictions lose nothing, and
// every block comes back bit-exact.
TEST_F(TieredStoreWriteBehindTest, OneCopyAtATimeLosesNoBlockToABurst) {
  Open(/*host_slots=*/8, /*disk_blocks=*/100, 0.9, 0.7,
       /*write_behind_spills=*/1);
  StoreBursts();
  const Whereabouts where = Find();
  const CoordinatorStats s = c()->stats();
  EXPECT_EQ(where.lost, 0);
  EXPECT_EQ(s.host.evicted_unspilled, 0u);
  EXPECT_GT(s.host.evictions + s.host.spill_drops, 0u);
  // Every block went down by write-behind; the watermark only dropped
  // blocks already there.
  EXPECT_EQ(s.host.spills_kept, static_cast<uint64_t>(kBursts * kBlocksEach));
  EXPECT_EQ(s.host.spills, s.host.spills_kept);
  EXPECT_EQ(s.host.spill_failures, 0u);
  EXPECT_EQ(s.host.store_skipped, 0u);
  EXPECT_EQ(s.host.pinned_slots, 0);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
  for (int r = 0; r < kBursts; ++r) {
    const LoadOutcome load = Load(RequestTokens(r, kBlocksEach));
    EXPECT_EQ(load.loaded_blocks, kBlocksEach) << "request " << r;
    EXPECT_EQ(load.wrong_blocks, 0) << "request " << r;
  }
}

// A disk that takes no writes: copies and spills fail, stores go on (the
// host evicts as it must), and every block lost is counted.
TEST_F(TieredStoreWriteBehindTest, RefusingDiskCountsEveryBlockLost) {
  Open(/*host_slots=*/8, /*disk_blocks=*/100, 0.9, 0.7,
       /*write_behind_spills=*/4);
  refusing_->refuse = true;
  StoreBursts();
  const Whereabouts where = Find();
  const CoordinatorStats s = c()->stats();
  EXPECT_EQ(where.on_disk_only, 0);
  EXPECT_GT(where.lost, 0);
  EXPECT_EQ(s.host.evicted_unspilled, static_cast<uint64_t>(where.lost));
  EXPECT_EQ(s.host.evicted_unspilled, s.host.evictions);
  EXPECT_GT(s.host.spill_failures, 0u);
  EXPECT_EQ(s.host.stores_completed,
            static_cast<uint64_t>(kBursts * kBlocksEach));
  EXPECT_EQ(s.host.store_skipped, 0u);
  ASSERT_TRUE(s.disk.has_value());
  EXPECT_EQ(s.disk->degraded, 1u);
  EXPECT_EQ(s.host.pinned_slots, 0);
}

// Evict and clear with spills in flight: however far each write has got on
// the I/O threads (queued, written, or written but not pumped yet), nothing
// of a dropped block stays on host or on disk once the spills finish.
class MidSpillTest : public TieredStoreTest {
 protected:
  // Stores six blocks on a host of ten that spills past five down to one:
  // five blocks are being spilled, and stay so until pumped.
  std::vector<TokenId> StoreAndStartSpills() {
    Open(/*host_slots=*/10, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.1);
    const std::vector<TokenId> tokens = RequestTokens(0, 6);
    Store(tokens);
    EXPECT_EQ(c()->stats().host.spills_in_flight, 5u);
    return tokens;
  }
  void ExpectNothingLeft(const std::vector<TokenId>& tokens) {
    EXPECT_EQ(Load(tokens).hit_blocks, 0);
    Settle();
    const CoordinatorStats s = c()->stats();
    EXPECT_EQ(s.host.cached_slots, 0);
    EXPECT_EQ(s.host.pinned_slots, 0);
    EXPECT_EQ(s.host.spills, 0u);
    EXPECT_EQ(s.disk->keys, 0u);
    EXPECT_EQ(Load(tokens).hit_blocks, 0);
    // The values are gone from RocksDB too, not just from the index.
    EXPECT_EQ(StoredValues(), 0u);
    EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
  }
};

TEST_F(MidSpillTest, EvictLeavesNothingBehind) {
  const std::vector<TokenId> tokens = StoreAndStartSpills();
  const std::vector<BlockKey> keys = PrefixKeys(tokens);
  for (const EvictedBlock& e : c()->Evict(keys)) {
    EXPECT_TRUE(e.host_dropped);
    EXPECT_FALSE(e.host_pinned);
  }
  ExpectNothingLeft(tokens);
}

TEST_F(MidSpillTest, ClearAllLeavesNothingBehind) {
  const std::vector<TokenId> tokens = StoreAndStartSpills();
  const ClearResult cleared = c()->Clear(TierSelection::kAll).value();
  EXPECT_EQ(cleared.host_dropped, 6u);
  EXPECT_EQ(cleared.host_kept_pinned, 0u);
  ExpectNothingLeft(tokens);
}

TEST_F(TieredStoreTest, WorkerDroppedMidPromotionLeaksNoPin) {
  Open(/*host_slots=*/10, /*disk_blocks=*/100, /*high=*/0.5, /*low=*/0.1);
  const std::vector<TokenId> tokens = RequestTokens(0, 4);
  Store(tokens);
  Settle();
  Store(RequestTokens(1, 4));
  Settle();
  std::vector<TokenId> lookup = tokens;
  lookup.push_back(1);
  auto hit = c()->Lookup(worker_, 99, lookup, 0, {});
  ASSERT_THAT(hit, IsOk());
  ASSERT_GT(hit->disk_hit_tokens, 0);
  auto alloc = c()->Allocate(worker_, 99, DeviceBlocks(5), hit->hit_tokens);
  ASSERT_THAT(alloc, IsOk());
  ASSERT_TRUE(alloc->load_pending);
  // Completing a load that is still promoting is refused.
  const CompletedEvent early[] = {{alloc->load->ref, true}};
  EXPECT_EQ(c()->Complete(worker_, early).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_THAT(c()->DropWorker(worker_), IsOk());
  Settle();
  const CoordinatorStats s = c()->stats();
  EXPECT_EQ(s.host.pinned_slots, 0);
  EXPECT_EQ(s.host.events_in_flight, 0u);
  EXPECT_THAT(c()->host_pool().CheckInvariants(), IsOk());
  // What was promoted is on host for the next worker.
  worker_ = c()->RegisterWorker({.layout = TestLayout(),
                                 .num_device_blocks = 64,
                                 .tenant = "",
                                 .pid = 2,
                                 .name = "next"})
                .value();
  LoadOutcome o = Load(tokens);
  EXPECT_EQ(o.hit_blocks, 4);
  EXPECT_EQ(o.wrong_blocks, 0);
}

// The embedded client (no tierkvd) with a disk tier: pending loads start
// their copies from PollEvents / WaitEvents once promoted.
TEST_F(TieredStoreTest, EmbeddedClientSpillsAndPromotes) {
  ClientOptions options;
  options.layout = TestLayout();
  options.num_device_blocks = 4;
  EmbeddedOptions embedded;
  embedded.host_bytes = 9 * TestLayout().BlockBytes();  // 8 slots.
  embedded.disk_path = dir_ + "/embedded";
  auto opened = OpenEmbedded(options, embedded);
  ASSERT_THAT(opened, IsOk());
  Client& client = **opened;
  auto* device = dynamic_cast<EmulatedDeviceTier*>(client.device());
  ASSERT_NE(device, nullptr);
  const std::vector<BlockId> blocks = {1, 2};
  auto wait_one = [&]() -> FinishedTransfer {
    for (int i = 0; i < 100; ++i) {
      std::vector<FinishedTransfer> done =
          client.WaitEvents(std::chrono::milliseconds(100));
      if (!done.empty()) {
        EXPECT_EQ(done.size(), 1u);
        EXPECT_THAT(client.Complete(done), IsOk());
        return done[0];
      }
    }
    ADD_FAILURE() << "no transfer finished";
    return {};
  };
  constexpr int kRequests = 40;  // Five times the host.
  RequestId id = 1;
  for (int r = 0; r < kRequests; ++r, ++id) {
    const std::vector<TokenId> tokens = RequestTokens(r, 1);
    ASSERT_THAT(client.Lookup(id, tokens), IsOk());
    ASSERT_THAT(client.Allocate(id, blocks, 0), IsOk());
    FillBlock(tokens[0], device->block(1));
    auto commit = client.Commit(id, kBs, blocks);
    ASSERT_THAT(commit, IsOk());
    if (!commit->stores.empty()) wait_one();
    ASSERT_THAT(client.Finish(id), IsOk());
    // Requests this fast outrun the disk: let the spills finish, as a gap
    // between requests would. Without it, blocks not yet spilled are
    // evicted.
    ASSERT_THAT(client.WaitIdle(std::chrono::seconds(60)), IsOk());
  }
  int pending = 0, loaded = 0;
  std::vector<std::byte> expected(device->block_bytes());
  for (int r = 0; r < kRequests; ++r, ++id) {
    std::vector<TokenId> tokens = RequestTokens(r, 1);
    tokens.push_back(1);
    auto hit = client.Lookup(id, tokens);
    ASSERT_THAT(hit, IsOk());
    auto alloc = client.Allocate(id, blocks, hit->hit_tokens);
    ASSERT_THAT(alloc, IsOk());
    if (alloc->load.has_value()) {
      pending += alloc->load_pending ? 1 : 0;
      EXPECT_EQ(client.loads_pending(), alloc->load_pending ? 1u : 0u);
      FinishedTransfer done = wait_one();
      EXPECT_THAT(done.status, IsOk());
      if (done.event.device_blocks.size() == 1) {
        FillBlock(tokens[0], expected);
        EXPECT_EQ(std::memcmp(device->block(1).data(), expected.data(),
                              expected.size()),
                  0)
            << "request " << r;
        ++loaded;
      }
    }
    ASSERT_THAT(client.Finish(id), IsOk());
  }
  const CoordinatorStats s = client.Stats().value();
  // Every block loads bit-exact, or was evicted from host and counted. (With
  // 8 slots the 0.9 watermark leaves one free slot, so a promotion can
  // still evict a block that was never spilled.)
  EXPECT_GE(loaded + static_cast<int>(s.host.evictions), kRequests);
  EXPECT_GE(loaded, kRequests * 3 / 4);
  EXPECT_GT(pending, 0);
  EXPECT_GT(s.host.spills, 0u);
  EXPECT_EQ(client.loads_pending(), 0u);
}

TEST_F(TieredStoreTest, WatermarksAreValidated) {
  auto c = Coordinator::Create({.layout = TestLayout(),
                                .host_slots = 4,
                                .lower = nullptr,
                                .spill_high = 0.5,
                                .spill_low = 0.9,
                                .lower_tier_wakeup = {}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("watermarks"));
}

TEST_F(TieredStoreTest, NegativeWriteBehindIsRefused) {
  auto c = Coordinator::Create({.layout = TestLayout(),
                                .host_slots = 4,
                                .lower = nullptr,
                                .write_behind_spills = -1});
  EXPECT_THAT(c, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(c.status().message(),
              ::testing::HasSubstr("write_behind_spills"));
}

}  // namespace
}  // namespace tierkv
