// A device chunk pool backed by the tiers below it (ClientChunkSource over an
// embedded client: tierkvd's coordinator in-process, real shared host
// memory, a real RocksDB disk tier). A chunk evicted from the pool comes
// back from host DRAM or disk byte for byte, its partial last block
// included; a chunk nobody computed is a miss, not an error. Against a real
// tierkvd that dies, the pool goes on computing and counts the failures.
// rag_demo_test runs the same path across worker processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "testing/cached_prefill.h"
#include "testing/reference_model.h"
#include "tests/child_process.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tierkv/client.h"
#include "tierkv/client_chunk_source.h"
#include "tierkv/device_tier.h"
#include "tierkv/embedded.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kBs = 16;

std::vector<TokenId> Tokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (TokenId& x : t) x = rng() % 200;
  return t;
}

// A device tier whose copies take a while: a job submitted after hold()
// starts only once the caller has polled for completions `polls` times (a
// copy still going when the caller's patience runs out).
class SlowCopyDeviceTier final : public DeviceTier {
 public:
  explicit SlowCopyDeviceTier(DeviceTier* inner) : inner_(inner) {}
  void hold(int polls) { polls_left_ = polls; }
  size_t held() const { return held_.size(); }

  int32_t num_blocks() const override { return inner_->num_blocks(); }
  size_t block_bytes() const override { return inner_->block_bytes(); }
  Status Submit(CopyJob job) override {
    if (polls_left_ == 0) return inner_->Submit(std::move(job));
    held_.push_back(std::move(job));
    return Status::Ok();
  }
  std::vector<CopyCompletion> PollCompleted() override {
    Polled();
    return inner_->PollCompleted();
  }
  std::vector<CopyCompletion> WaitCompleted(
      std::chrono::milliseconds timeout) override {
    Polled();
    return inner_->WaitCompleted(timeout);
  }
  size_t in_flight() const override {
    return held_.size() + inner_->in_flight();
  }

 private:
  void Polled() {
    if (held_.empty() || --polls_left_ > 0) return;
    polls_left_ = 0;
    for (CopyJob& job : held_) {
      EXPECT_THAT(inner_->Submit(std::move(job)), IsOk());
    }
    held_.clear();
  }

  DeviceTier* inner_;
  int polls_left_ = 0;
  std::vector<CopyJob> held_;
};

class ChunkTierTest : public ::testing::Test {
 protected:
  // A device chunk pool and the tiers below it, released in this order's
  // reverse.
  struct Pool {
    std::unique_ptr<ChunkKvStore> store;
    std::unique_ptr<EmulatedDeviceTier> device;
    std::unique_ptr<Client> client;
    std::unique_ptr<ClientChunkSource> source;
  };
  // A pool of `pool_blocks` (the null block included) computing chunks at
  // `virtual_start`, over a client attached to the tierkvd at `socket`, or
  // embedded (with `embedded`'s tiers) when it is empty. Null members when
  // the client cannot be opened (a test failure).
  Pool MakePool(int32_t pool_blocks, int64_t virtual_start,
                const std::string& socket, const EmbeddedOptions& embedded = {},
                const std::string& variant = "") {
    Pool p;
    p.store = std::make_unique<ChunkKvStore>(
        CreateChunkKvStore(model_, {.num_blocks = pool_blocks,
                                    .block_size = kBs,
                                    .virtual_start = virtual_start,
                                    .variant = variant})
            .value());
    const KvLayout& layout = p.store->layout();
    const size_t bytes = static_cast<size_t>(pool_blocks) * layout.BlockBytes();
    p.device = EmulatedDeviceTier::CreateOver({p.store->memory(), bytes},
                                              pool_blocks, layout.BlockBytes())
                   .value();
    ClientOptions options;
    options.socket_path = socket;
    options.layout = layout;
    options.num_device_blocks = pool_blocks;
    options.device = p.device.get();
    if (call_timeout_.count() > 0) options.call_timeout = call_timeout_;
    auto client = socket.empty() ? OpenEmbedded(options, embedded)
                                 : Client::Open(options);
    EXPECT_THAT(client, IsOk());
    if (!client.ok()) return p;
    p.client = std::move(*client);
    p.source = std::make_unique<ClientChunkSource>(p.client.get());
    EXPECT_THAT(p.store->SetTier(p.source.get()), IsOk());
    return p;
  }

  // The fixture's pool (virtual start 100) over a client whose host tier
  // has host_slots usable slots, with a disk tier when asked; attached to
  // the tierkvd at `socket`, or embedded.
  // A 64-block pool whose device tier starts copies only when the test
  // lets it (SlowCopyDeviceTier), embedded, with `chunk` computed and
  // published; released in its members' reverse order, as Pool.
  struct SlowCopyPool {
    std::unique_ptr<ChunkKvStore> store;
    std::unique_ptr<EmulatedDeviceTier> device;
    std::unique_ptr<SlowCopyDeviceTier> slow;
    std::unique_ptr<Client> client;
    std::unique_ptr<ClientChunkSource> patient;
  };
  SlowCopyPool PublishedOverSlowCopies(const std::vector<TokenId>& chunk) {
    SlowCopyPool p;
    p.store = std::make_unique<ChunkKvStore>(
        CreateChunkKvStore(model_, {.num_blocks = 64, .block_size = kBs})
            .value());
    const KvLayout& layout = p.store->layout();
    p.device = EmulatedDeviceTier::CreateOver(
                   {p.store->memory(), size_t{64} * layout.BlockBytes()}, 64,
                   layout.BlockBytes())
                   .value();
    p.slow = std::make_unique<SlowCopyDeviceTier>(p.device.get());
    ClientOptions options;
    options.layout = layout;
    options.num_device_blocks = 64;
    options.device = p.slow.get();
    EmbeddedOptions embedded;
    embedded.host_bytes = size_t{65} * layout.BlockBytes();
    StatusOr<std::unique_ptr<Client>> client = OpenEmbedded(options, embedded);
    EXPECT_THAT(client, IsOk());
    if (!client.ok()) return p;
    p.client = std::move(*client);
    p.patient = std::make_unique<ClientChunkSource>(p.client.get());
    EXPECT_THAT(p.store->SetTier(p.patient.get()), IsOk());
    EXPECT_THAT(p.store->Release(p.store->ComputeAndInsert(chunk).value()),
                IsOk());
    EXPECT_EQ(p.store->stats().published, 1u);
    return p;
  }

  std::chrono::milliseconds call_timeout_{0};  // 0: the client's default.

  void Open(int32_t pool_blocks, int32_t host_slots, bool disk,
            const std::string& socket = "") {
    const KvLayout layout = model_.config().CacheLayout(kBs, DType::kF32);
    EmbeddedOptions embedded;
    embedded.host_bytes =
        static_cast<size_t>(host_slots + 1) * layout.BlockBytes();
    if (disk) embedded.disk_path = dir_.path() + "/disk";
    Pool p = MakePool(pool_blocks, 100, socket, embedded);
    ASSERT_NE(p.client, nullptr);
    store_ = std::move(p.store);
    device_ = std::move(p.device);
    client_ = std::move(p.client);
    tier_ = std::move(p.source);
  }

  void Compute(const std::vector<TokenId>& chunk) {
    StatusOr<std::vector<BlockId>> blocks = store_->ComputeAndInsert(chunk);
    ASSERT_THAT(blocks, IsOk());
    EXPECT_THAT(store_->Release(*blocks), IsOk());
  }

  // The blocks hold `chunk`'s KV computed in isolation at the virtual
  // positions, every token of every layer, K and V.
  void ExpectChunkKv(const std::vector<TokenId>& chunk,
                     const std::vector<BlockId>& blocks) {
    ExpectChunkKvIn(store_.get(), chunk, blocks);
  }
  void ExpectChunkKvIn(ChunkKvStore* store, const std::vector<TokenId>& chunk,
                       const std::vector<BlockId>& blocks) {
    const auto n = static_cast<int64_t>(chunk.size());
    PagedKvCache own =
        PagedKvCache::Create(store->layout(), (n + kBs - 1) / kBs).value();
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) slots[i] = i;
    ASSERT_THAT(model_.Prefill({.tokens = chunk,
                                .slots = slots,
                                .start_position = store->virtual_start(),
                                .num_logits = 0},
                               &own),
                IsOk());
    const PagedKvCache pool = ChunkPoolView(store).value();
    const size_t stride = own.layout().TokenStride();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t slot = int64_t{blocks[t / kBs]} * kBs + t % kBs;
      for (int32_t l = 0; l < model_.config().num_layers; ++l) {
        for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
          ASSERT_EQ(std::memcmp(pool.token(slot, l, plane),
                                own.token(t, l, plane), stride),
                    0)
              << "token " << t << " layer " << l;
        }
      }
    }
  }

  // Lets the disk finish spilling, as a gap between requests would.
  void SettleSpills() {
    ASSERT_THAT(client_->WaitIdle(std::chrono::seconds(60)), IsOk());
  }

  TempDir dir_{"tierkv-chunk-tier"};
  ReferenceModel model_ = ReferenceModel::Create({}).value();
  std::unique_ptr<ChunkKvStore> store_;
  std::unique_ptr<EmulatedDeviceTier> device_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ClientChunkSource> tier_;
};

// A client that would copy somewhere other than the pool's memory is
// refused: its fetches would key blocks nothing was copied into, and its
// publishes would give every worker those bytes under the chunk's keys.
TEST_F(ChunkTierTest, AClientThatCopiesElsewhereIsRefused) {
  ChunkKvStore store =
      CreateChunkKvStore(model_, {.num_blocks = 8, .block_size = kBs}).value();
  const KvLayout& layout = store.layout();
  auto refused = [&](int32_t device_blocks, CopyMode copies) {
    ClientOptions options;
    options.layout = layout;
    options.num_device_blocks = device_blocks;
    options.copies = copies;
    StatusOr<std::unique_ptr<Client>> client = OpenEmbedded(options, {});
    EXPECT_THAT(client, IsOk());
    if (!client.ok()) return std::string();
    ClientChunkSource source(client->get());
    const Status s = store.SetTier(&source);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    return s.message();
  };
  // The client's own arena, of the pool's size or not.
  EXPECT_THAT(refused(8, CopyMode::kClient),
              ::testing::HasSubstr("memory of its own"));
  EXPECT_THAT(refused(9, CopyMode::kClient),
              ::testing::HasSubstr("pool's 8 blocks"));
  // Copies the engine makes.
  EXPECT_THAT(refused(8, CopyMode::kCaller),
              ::testing::HasSubstr("its caller"));
  // Over the pool's memory: served.
  std::unique_ptr<EmulatedDeviceTier> device =
      EmulatedDeviceTier::CreateOver(
          {store.memory(), size_t{8} * layout.BlockBytes()}, 8,
          layout.BlockBytes())
          .value();
  ClientOptions options;
  options.layout = layout;
  options.num_device_blocks = 8;
  options.device = device.get();
  StatusOr<std::unique_ptr<Client>> client = OpenEmbedded(options, {});
  ASSERT_THAT(client, IsOk());
  ClientChunkSource source(client->get());
  EXPECT_THAT(store.SetTier(&source), IsOk());
  EXPECT_THAT(store.SetTier(nullptr), IsOk());
}

TEST_F(ChunkTierTest, ChunkEvictedFromThePoolComesBackFromHost) {
  Open(/*pool_blocks=*/5, /*host_slots=*/32, /*disk=*/false);  // 4 usable.
  const auto a = Tokens(1, 20), b = Tokens(2, 20), c = Tokens(3, 20);
  Compute(a);
  Compute(b);
  Compute(c);  // Evicts a (least recently used) from the pool.
  EXPECT_FALSE(store_->Contains(a));
  EXPECT_EQ(client_->Stats().value().host.cached_slots, 6);

  const std::vector<BlockId> blocks = store_->Acquire(a);
  ASSERT_EQ(blocks.size(), 2u);
  ExpectChunkKv(a, blocks);
  EXPECT_THAT(store_->Release(blocks), IsOk());
  EXPECT_TRUE(store_->Contains(a));  // Keyed in the pool again.

  const ChunkStoreStats s = store_->stats();
  EXPECT_EQ(s.computed, 3u);
  EXPECT_EQ(s.published, 3u);
  EXPECT_EQ(s.tier_hits, 1u);
  EXPECT_EQ(s.tier_errors, 0u);
  // A chunk no one computed is a miss below too.
  EXPECT_TRUE(store_->Acquire(Tokens(4, 20)).empty());
  EXPECT_EQ(store_->stats().tier_errors, 0u);
  // Nothing stays pinned, in the pool or on host.
  EXPECT_EQ(store_->num_free_blocks(), 4);
  EXPECT_EQ(client_->Stats().value().host.pinned_slots, 0);
}

// A fetch's copy is queued for a caller that waits for it at once
// (DeviceTier::SubmitForWaiter: the device tier's thread is not woken for
// it). An engine that only polls, with PollEvents or WaitEvents(0), still
// gets it: those calls wake that thread.
TEST_F(ChunkTierTest, AFetchCopiesForAnEngineThatOnlyPolls) {
  Open(/*pool_blocks=*/64, /*host_slots=*/64, /*disk=*/false);
  const std::vector<TokenId> chunk = Tokens(3, 40);  // 3 blocks, 1 partial.
  Compute(chunk);
  const std::vector<BlockId> target = {61, 62, 63};
  for (bool wait_events : {false, true}) {
    SCOPED_TRACE(wait_events ? "WaitEvents(0)" : "PollEvents");
    for (BlockId b : target) {
      std::memset(device_->block(b).data(), 0, device_->block(b).size());
    }
    StatusOr<ChunkFetchResult> fetch = client_->FetchChunk(
        wait_events ? 1001 : 1000, chunk, std::chrono::milliseconds(0),
        [&](int32_t n) -> StatusOr<std::vector<BlockId>> {
          EXPECT_EQ(n, 3);
          return target;
        },
        store_->virtual_start(), store_->variant());
    ASSERT_THAT(fetch, IsOk());
    ASSERT_TRUE(fetch->load.has_value());
    std::vector<FinishedTransfer> done;
    const auto fail_after =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (done.empty() && std::chrono::steady_clock::now() < fail_after) {
      done = wait_events ? client_->WaitEvents(std::chrono::milliseconds(0))
                         : client_->PollEvents();
      std::this_thread::yield();
    }
    ASSERT_EQ(done.size(), 1u);
    EXPECT_THAT(done[0].status, IsOk());
    ASSERT_THAT(client_->Complete(done), IsOk());
    ExpectChunkKv(chunk, target);
  }
}

// A fetch whose copy outlasts copy_timeout does not hand its blocks back
// while the copy still writes them (the pool would give them to another
// chunk, whose KV the late copy would then overwrite): it waits for the
// copy to end, and the chunk it brought is served whole.
TEST_F(ChunkTierTest, AFetchNeverLeavesACopyWritingItsBlocks) {
  const std::vector<TokenId> chunk = Tokens(4, 40);  // 3 blocks, 1 partial.
  SlowCopyPool p = PublishedOverSlowCopies(chunk);
  ASSERT_NE(p.client, nullptr);
  ClientChunkSource impatient(p.client.get(),
                              {.copy_timeout = std::chrono::milliseconds(0)});
  const std::vector<BlockId> target = {61, 62, 63};
  p.slow->hold(/*polls=*/8);
  StatusOr<bool> hit = impatient.Fetch(
      chunk, p.store->virtual_start(), p.store->variant(),
      [&](int32_t) -> StatusOr<std::vector<BlockId>> { return target; });
  EXPECT_EQ(p.slow->held(), 0u);                   // The copy had started...
  EXPECT_EQ(p.client->transfers_in_flight(), 0u);  // ...and ended.
  ASSERT_THAT(hit, IsOk());
  EXPECT_TRUE(*hit);
  ExpectChunkKvIn(p.store.get(), chunk, target);
}

// A copy the device tier never ends is given up on after
// stuck_copy_timeout, as DeadlineExceeded: the pool then never reuses the
// blocks (ChunkKvStore.BlocksACopyMayStillUseAreNeverReused).
TEST_F(ChunkTierTest, AFetchGivesUpOnAWedgedCopyWithDeadlineExceeded) {
  const std::vector<TokenId> chunk = Tokens(4, 40);
  SlowCopyPool p = PublishedOverSlowCopies(chunk);
  ASSERT_NE(p.client, nullptr);
  ClientChunkSource wedged(
      p.client.get(), {.copy_timeout = std::chrono::milliseconds(0),
                       .stuck_copy_timeout = std::chrono::milliseconds(0)});
  const std::vector<BlockId> target = {61, 62, 63};
  p.slow->hold(/*polls=*/1 << 30);
  StatusOr<bool> hit = wedged.Fetch(
      chunk, p.store->virtual_start(), p.store->variant(),
      [&](int32_t) -> StatusOr<std::vector<BlockId>> { return target; });
  EXPECT_THAT(hit, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_THAT(hit.status().message(), ::testing::HasSubstr("never reused"));
  EXPECT_EQ(wedged.stats().stuck_copies, 1u);
  EXPECT_EQ(p.slow->held(), 1u);  // The copy was never let run.
  // Once it runs, a later wait completes it; the blocks get the chunk.
  p.slow->hold(/*polls=*/1);
  while (p.client->transfers_in_flight() > 0) {
    ASSERT_THAT(
        p.client->Complete(p.client->WaitEvents(std::chrono::milliseconds(10))),
        IsOk());
  }
  ExpectChunkKvIn(p.store.get(), chunk, target);
}

TEST_F(ChunkTierTest, FullPoolIsNotATierError) {
  Open(/*pool_blocks=*/5, /*host_slots=*/32, /*disk=*/false);  // 4 usable.
  const auto a = Tokens(1, 20), b = Tokens(2, 20), c = Tokens(3, 20);
  Compute(a);
  Compute(b);
  Compute(c);  // Evicts a from the pool; host still has it.
  // b and c pinned: no pool block is free for a.
  const std::vector<BlockId> held_b = store_->Acquire(b);
  const std::vector<BlockId> held_c = store_->Acquire(c);
  ASSERT_EQ(held_b.size() + held_c.size(), 4u);
  EXPECT_TRUE(store_->Acquire(a).empty());
  ChunkStoreStats s = store_->stats();
  EXPECT_EQ(s.pool_full, 1u);
  EXPECT_EQ(s.tier_errors, 0u) << store_->last_tier_error().ToString();
  EXPECT_THAT(store_->last_tier_error(), IsOk());
  // tierkvd's side of the failed fetch is undone: nothing stays pinned.
  EXPECT_EQ(client_->Stats().value().host.pinned_slots, 0);

  // With room again, the same chunk comes from host, bit-exact.
  EXPECT_THAT(store_->Release(held_b), IsOk());
  EXPECT_THAT(store_->Release(held_c), IsOk());
  const std::vector<BlockId> blocks = store_->Acquire(a);
  ASSERT_EQ(blocks.size(), 2u);
  ExpectChunkKv(a, blocks);
  EXPECT_THAT(store_->Release(blocks), IsOk());
  s = store_->stats();
  EXPECT_EQ(s.tier_hits, 1u);
  EXPECT_EQ(s.pool_full, 1u);
}

// A compute that fails (here: no free pool block for it) ends the compute
// lease its miss took, so workers waiting for its publish compute the chunk
// at once instead of waiting out their single_flight_wait.
TEST_F(ChunkTierTest, AFailedComputeEndsItsLease) {
  Open(/*pool_blocks=*/5, /*host_slots=*/32, /*disk=*/false);  // 4 usable.
  const auto a = Tokens(1, 40), b = Tokens(2, 20);
  Compute(a);
  const std::vector<BlockId> held = store_->Acquire(a);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_TRUE(store_->Acquire(b).empty());  // A miss: this worker's lease.
  EXPECT_EQ(tier_->stats().leases, 1u);
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 1u);
  EXPECT_THAT(store_->ComputeAndInsert(b).status(),
              StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 0u);
  EXPECT_EQ(store_->stats().tier_errors, 0u)
      << store_->last_tier_error().ToString();

  // A failure of a chunk it holds no lease on ends nothing (nothing to end),
  // and a lease on another chunk stays.
  const auto c = Tokens(3, 20);
  EXPECT_TRUE(store_->Acquire(c).empty());
  EXPECT_THAT(store_->ComputeAndInsert(b).status(),
              StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 1u);
  EXPECT_THAT(store_->Release(held), IsOk());
  Compute(c);                             // Its publish ends the lease.
  EXPECT_THAT(client_->Stats(), IsOk());  // Collects the posted completion.
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 0u);
  EXPECT_EQ(store_->stats().tier_errors, 0u);
}

// An engine that aborts the request that missed a chunk gives the miss up
// (ChunkKvStore::Abandon): the lease its miss took ends, so other workers
// stop waiting for a publish that will not come. Giving up a chunk it holds
// no lease on ends nothing.
TEST_F(ChunkTierTest, AnAbandonedMissEndsItsLease) {
  Open(/*pool_blocks=*/8, /*host_slots=*/32, /*disk=*/false);
  const auto a = Tokens(1, 20), b = Tokens(2, 20);
  EXPECT_TRUE(store_->Acquire(a).empty());  // A miss: this worker's lease.
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 1u);
  EXPECT_THAT(store_->Abandon(b), IsOk());  // Not the leased chunk.
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 1u);
  EXPECT_THAT(store_->Abandon(a), IsOk());
  EXPECT_EQ(client_->Stats().value().host.chunk_leases, 0u);
  EXPECT_THAT(store_->Abandon(a), IsOk());  // Once more: nothing to end.
  const ChunkStoreStats s = store_->stats();
  EXPECT_EQ(s.computed, 0u);
  EXPECT_EQ(s.tier_errors, 0u) << store_->last_tier_error().ToString();
  // The chunk is still computed and published by whoever needs it next.
  EXPECT_TRUE(store_->Acquire(a).empty());
  Compute(a);
  EXPECT_EQ(store_->stats().published, 1u);
}

// A publish that could not store the whole chunk (host DRAM too small for
// it, no disk tier) is not a published chunk: no other worker can fetch
// part of a chunk. Nor is it a tier error: the tier had no room.
TEST_F(ChunkTierTest, APublishThatStoredPartOfTheChunkIsNotPublished) {
  Open(/*pool_blocks=*/8, /*host_slots=*/2, /*disk=*/false);
  const auto big = Tokens(1, 40);
  Compute(big);  // Three blocks for two host slots.
  ChunkStoreStats s = store_->stats();
  EXPECT_EQ(s.computed, 1u);
  EXPECT_EQ(s.published, 0u);
  EXPECT_EQ(s.unpublished, 1u);
  EXPECT_EQ(s.tier_errors, 0u);
  // A chunk that fits is published.
  Compute(Tokens(2, 20));
  s = store_->stats();
  EXPECT_EQ(s.published, 1u);
  EXPECT_EQ(s.unpublished, 1u);
  EXPECT_EQ(s.tier_errors, 0u);
}

TEST_F(ChunkTierTest, ChunksSpilledToDiskComeBackBitExact) {
  Open(/*pool_blocks=*/5, /*host_slots=*/6, /*disk=*/true);
  std::vector<std::vector<TokenId>> chunks;
  for (uint32_t i = 0; i < 8; ++i) {
    chunks.push_back(Tokens(10 + i, 17 + static_cast<int>(i)));  // 2 blocks.
    Compute(chunks.back());
    SettleSpills();
  }
  const CoordinatorStats before = client_->Stats().value();
  ASSERT_TRUE(before.disk.has_value());
  EXPECT_GT(before.host.spills, 0u);
  for (const auto& chunk : chunks) {
    const std::vector<BlockId> blocks = store_->Acquire(chunk);
    ASSERT_EQ(blocks.size(), 2u);
    ExpectChunkKv(chunk, blocks);
    EXPECT_THAT(store_->Release(blocks), IsOk());
    SettleSpills();
  }
  const ChunkStoreStats s = store_->stats();
  EXPECT_EQ(s.computed, 8u);
  EXPECT_EQ(s.tier_errors, 0u);
  EXPECT_EQ(s.pool_hits + s.tier_hits, 8u);
  EXPECT_GT(client_->Stats().value().host.promotions, 0u);
}

// Pools whose chunks are computed at different virtual starts share one
// tierkvd: a chunk's KV depends on its start (RoPE), so one pool's chunk
// is never another's hit; a pool at the same start does load it.
TEST_F(ChunkTierTest, AChunkComputedAtAnotherVirtualStartOrVariantIsAMiss) {
  const std::string store = "cv" + std::to_string(getpid());
  const std::string socket = dir_.path() + "/tierkvd.sock";
  const KvLayout layout = model_.config().CacheLayout(kBs, DType::kF32);
  auto daemon =
      ChildProcess::Spawn({TIERKVD_PATH, "--store", store, "--socket", socket,
                           "--layers", std::to_string(layout.num_layers),
                           "--kv-heads", std::to_string(layout.num_kv_heads),
                           "--head-dim", std::to_string(layout.head_dim),
                           "--dtype", "f32", "--host-capacity", "1M"});
  ASSERT_THAT(daemon, IsOk());
  ASSERT_TRUE((*daemon)->WaitForOutput("serving store")) << (*daemon)->output();
  constexpr int32_t kPoolBlocks = 8;
  const auto open = [&](int64_t virtual_start) {
    return MakePool(kPoolBlocks, virtual_start, socket);
  };
  const std::vector<TokenId> chunk = Tokens(7, 40);  // 3 blocks, 1 partial.
  Pool a = open(100);
  Pool b = open(1000);
  Pool c = open(100);
  // Another variant (say, a LoRA adapter on K and V) at the same start.
  Pool d = MakePool(kPoolBlocks, 100, socket, {}, "lora-7");
  for (const Pool* p : {&a, &b, &c, &d}) ASSERT_NE(p->client, nullptr);
  const std::vector<BlockId> computed =
      a.store->ComputeAndInsert(chunk).value();
  EXPECT_THAT(a.store->Release(computed), IsOk());
  ASSERT_EQ(a.store->stats().published, 1u);
  // The publish's completion went one-way: a call on A's attachment
  // collects its answer, so tierkvd has keyed the chunk.
  ASSERT_THAT(a.client->Stats(), IsOk());

  // At another start: a miss below (not an error), computed at its own.
  EXPECT_TRUE(b.store->Acquire(chunk).empty());
  EXPECT_EQ(b.store->stats().tier_hits, 0u);
  EXPECT_EQ(b.store->stats().tier_errors, 0u);
  const std::vector<BlockId> own = b.store->ComputeAndInsert(chunk).value();
  ExpectChunkKvIn(b.store.get(), chunk, own);
  EXPECT_THAT(b.store->Release(own), IsOk());
  ASSERT_THAT(b.client->Stats(), IsOk());

  // Another variant: a miss as well.
  EXPECT_TRUE(d.store->Acquire(chunk).empty());
  EXPECT_EQ(d.store->stats().tier_hits, 0u);
  EXPECT_EQ(d.store->stats().tier_errors, 0u);

  // At the same start: loaded, A's KV, and B's publish changed nothing.
  const std::vector<BlockId> loaded = c.store->Acquire(chunk);
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(c.store->stats().tier_hits, 1u);
  ExpectChunkKvIn(c.store.get(), chunk, loaded);
  EXPECT_THAT(c.store->Release(loaded), IsOk());
  for (Pool* p : {&a, &b, &c, &d}) p->client.reset();
  (*daemon)->Stop();
  RemoveStoreSegments(store);
}

TEST_F(ChunkTierTest, DeadTierkvdIsCountedThenReattached) {
  const std::string store = "ct" + std::to_string(getpid());
  const std::string socket = dir_.path() + "/tierkvd.sock";
  const KvLayout layout = model_.config().CacheLayout(kBs, DType::kF32);
  const auto start_tierkvd = [&] {
    return ChildProcess::Spawn({TIERKVD_PATH, "--store", store, "--socket",
                                socket, "--layers",
                                std::to_string(layout.num_layers), "--kv-heads",
                                std::to_string(layout.num_kv_heads),
                                "--head-dim", std::to_string(layout.head_dim),
                                "--dtype", "f32", "--host-capacity", "1M"});
  };
  auto daemon = start_tierkvd();
  ASSERT_THAT(daemon, IsOk());
  ASSERT_TRUE((*daemon)->WaitForOutput("serving store")) << (*daemon)->output();
  Open(/*pool_blocks=*/5, /*host_slots=*/0, /*disk=*/false, socket);
  const auto a = Tokens(1, 20), b = Tokens(2, 20), c = Tokens(3, 20);
  Compute(a);
  Compute(b);
  Compute(c);  // a leaves the pool; tierkvd has it.
  EXPECT_EQ(store_->stats().published, 3u);

  (*daemon)->Signal(SIGKILL);
  (*daemon)->Wait();
  RemoveStoreSegments(store);
  // a cannot be fetched: a miss, counted, not a crash or stale bytes.
  EXPECT_TRUE(store_->Acquire(a).empty());
  EXPECT_EQ(store_->stats().tier_errors, 1u);
  EXPECT_FALSE(store_->last_tier_error().ok());
  // Computing goes on; the publish fails and is counted.
  const std::vector<BlockId> blocks = store_->ComputeAndInsert(a).value();
  ExpectChunkKv(a, blocks);
  EXPECT_THAT(store_->Release(blocks), IsOk());
  EXPECT_EQ(store_->stats().tier_errors, 2u);
  EXPECT_EQ(store_->stats().published, 3u);
  // What the pool still holds is served as before.
  const std::vector<BlockId> held = store_->Acquire(c);
  EXPECT_EQ(held.size(), 2u);
  EXPECT_THAT(store_->Release(held), IsOk());

  // tierkvd comes back: the next publish re-attaches, and what it publishes
  // is fetched again once the pool has dropped it.
  auto again = start_tierkvd();
  ASSERT_THAT(again, IsOk());
  ASSERT_TRUE((*again)->WaitForOutput("serving store")) << (*again)->output();
  const auto d = Tokens(4, 20);
  Compute(d);
  EXPECT_EQ(store_->stats().published, 4u);
  EXPECT_EQ(client_->session(), 2u);
  Compute(Tokens(5, 20));
  Compute(Tokens(6, 20));  // d leaves the pool; the new tierkvd has it.
  const uint64_t tier_hits = store_->stats().tier_hits;
  const std::vector<BlockId> fetched = store_->Acquire(d);
  ASSERT_EQ(fetched.size(), 2u);
  EXPECT_EQ(store_->stats().tier_hits, tier_hits + 1);
  ExpectChunkKv(d, fetched);
  EXPECT_THAT(store_->Release(fetched), IsOk());
  EXPECT_EQ(store_->stats().tier_errors, 2u);
  (*again)->Stop();
  RemoveStoreSegments(store);
}

// A call tierkvd does not answer in time is no stuck copy: the publish
// fails, and the pool keeps every block to reuse (ChunkSource keeps
// DeadlineExceeded for a copy that may still use them).
TEST_F(ChunkTierTest, AStalledTierkvdRetiresNoBlocks) {
  const std::string store = "cs" + std::to_string(getpid());
  const std::string socket = dir_.path() + "/tierkvd.sock";
  const KvLayout layout = model_.config().CacheLayout(kBs, DType::kF32);
  auto daemon =
      ChildProcess::Spawn({TIERKVD_PATH, "--store", store, "--socket", socket,
                           "--layers", std::to_string(layout.num_layers),
                           "--kv-heads", std::to_string(layout.num_kv_heads),
                           "--head-dim", std::to_string(layout.head_dim),
                           "--dtype", "f32", "--host-capacity", "1M"});
  ASSERT_THAT(daemon, IsOk());
  ASSERT_TRUE((*daemon)->WaitForOutput("serving store")) << (*daemon)->output();
  // Long enough for the calls before the freeze on a loaded machine.
  call_timeout_ = std::chrono::milliseconds(1000);
  Open(/*pool_blocks=*/5, /*host_slots=*/0, /*disk=*/false, socket);
  Compute(Tokens(1, 20));
  (*daemon)->Freeze();
  const std::vector<BlockId> blocks =
      store_->ComputeAndInsert(Tokens(2, 20)).value();
  EXPECT_THAT(store_->Release(blocks), IsOk());
  EXPECT_EQ(store_->stats().tier_errors, 1u);
  EXPECT_EQ(store_->last_tier_error().code(), StatusCode::kUnavailable)
      << store_->last_tier_error().ToString();
  EXPECT_EQ(store_->stats().retired_blocks, 0u);
  EXPECT_EQ(store_->num_free_blocks(), 4);  // Every usable block.
  (*daemon)->Thaw();
  (*daemon)->Stop();
  RemoveStoreSegments(store);
}

}  // namespace
}  // namespace tierkv
