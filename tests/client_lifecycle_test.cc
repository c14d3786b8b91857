// The worker client's load lifecycle against a real tierkvd, where an engine
// meets it: a request aborted while its load waits for promotions, a
// stopped (wedged) tierkvd, a tierkvd that dies and restarts. In each, the
// engine's device blocks stay consistent: a block receives bytes only while
// the transfer that writes it pins it, and nothing is pinned forever.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "src/kv_cache_manager_internal.h"
#include "tests/block_pattern.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client.h"
#include "tierkv/device_tier.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kBs = 16;
constexpr int32_t kDeviceBlocks = 32;

// An engine: its main pool (KVCacheManager), its device memory and its
// client, which pins the pool's blocks during transfers.
struct Engine {
  std::unique_ptr<KVCacheManager> manager;
  std::unique_ptr<EmulatedDeviceTier> device;
  std::unique_ptr<Client> client;

  static Engine Open(const std::string& socket,
                     std::chrono::milliseconds timeout) {
    Engine e;
    e.manager = std::make_unique<KVCacheManager>(
        KVCacheManager::Create({.pool = {.num_blocks = kDeviceBlocks,
                                         .block_size = kBs,
                                         .reserve_null_block = true}})
            .value());
    e.device =
        EmulatedDeviceTier::Create(kDeviceBlocks, TestLayout().BlockBytes())
            .value();
    ClientOptions options;
    options.socket_path = socket;
    options.layout = TestLayout();
    options.num_device_blocks = kDeviceBlocks;
    options.name = "engine";
    options.device = e.device.get();
    options.engine = e.manager.get();
    options.call_timeout = timeout;
    auto client = Client::Open(options);
    EXPECT_THAT(client, IsOk());
    if (client.ok()) e.client = std::move(*client);
    return e;
  }
  int32_t Ref(BlockId b) const { return PoolOf(*manager).block(b).ref_cnt; }
  // Blocks the engine pins beyond its requests' own references.
  int32_t TotalRefs() const {
    int32_t refs = 0;
    for (BlockId b = 1; b < kDeviceBlocks; ++b) refs += Ref(b);
    return refs;
  }
};

class ClientLifecycle : public TierkvdFixture {
 protected:
  // A store whose host holds 6 blocks over a disk tier, filled with 40
  // one-block requests of fill seed 1 by a worker process, and settled: the
  // oldest requests are on disk only. In LRU order, and without
  // write-behind, whose copies pin blocks out of that order and could keep
  // an old block on host.
  void StartFilledStore() {
    StartDaemonWithDisk(
        6, {"--write-behind-spills", "0", "--eviction-policy", "lru"});
    auto fill = ManyWorker("fill", 1, 40);
    ASSERT_EQ(fill->Wait(), 0) << fill->output();
    std::unique_ptr<Client> observer = Attach("observer");
    ASSERT_NE(observer, nullptr);
    SettledStats(*observer);
  }

  // Looks fill request `r` (two blocks: its stored one plus one more
  // token's) up and allocates it with delayed caching, loading the hit.
  // Returns the load event Allocate gave.
  AllocateResult LookupAndAllocate(Engine& e, RequestId id, int32_t r) {
    std::vector<TokenId> tokens = FillRequestTokens(1, r, 1);
    tokens.push_back(7);
    Request request(id, tokens, kBs, hasher_);
    auto hit = e.client->Lookup(id, tokens);
    EXPECT_THAT(hit, IsOk());
    EXPECT_EQ(hit->disk_hit_tokens, kBs) << "request " << r << " on disk";
    auto blocks = e.manager->AllocateSlots(request, kBs + 1, {}, kBs);
    EXPECT_THAT(blocks, IsOk());
    auto alloc = e.client->Allocate(id, *blocks, kBs);
    EXPECT_THAT(alloc, IsOk());
    return alloc.ok() ? *alloc : AllocateResult{};
  }

  // The next transfers WaitEvents hands out (it returns none when its
  // wait runs out first).
  static std::vector<FinishedTransfer> NextTransfers(Engine& e) {
    std::vector<FinishedTransfer> done;
    while (done.empty()) done = e.client->WaitEvents(std::chrono::seconds(60));
    return done;
  }

  // Waits until tierkvd has landed its promotion and cancelled the one load
  // of `e` that waited for it: nothing of it is in flight any more.
  static void WaitForTheCancelledLoad(Engine& e) {
    for (;;) {
      const CoordinatorStats s = e.client->Stats().value();
      if (s.host.promotions_in_flight == 0 && s.host.loads_cancelled == 1) {
        EXPECT_EQ(s.host.events_in_flight, 0u);
        return;
      }
      std::this_thread::yield();
    }
  }

  const KeyHasher hasher_{
      {.model_fingerprint = TestLayout().Fingerprint(), .tenant = ""}};
};

class PendingLoad : public ClientLifecycle {};
class ClientDeadline : public ClientLifecycle {};
class Reconnect : public ClientLifecycle {};

// A load waiting for its promotion is started when tierkvd signals it
// ready: WaitEvents asks tierkvd once, for the ready load, and copies it.
// The call_timeout is far beyond the wait, so only the signal can wake it.
TEST_F(PendingLoad, ReadyLoadIsStartedOnTierkvdsSignal) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::hours(1));
  ASSERT_NE(e.client, nullptr);
  ASSERT_TRUE(LookupAndAllocate(e, 1, 0).load_pending);
  const uint64_t before = e.client->call_counts().calls;
  const std::vector<FinishedTransfer> done =
      e.client->WaitEvents(std::chrono::seconds(60));
  EXPECT_EQ(e.client->call_counts().calls - before, 1u);  // ReadyLoads, once.
  ASSERT_EQ(done.size(), 1u);
  ASSERT_THAT(done[0].status, IsOk());
  EXPECT_EQ(done[0].loaded_blocks(), 1);
  std::vector<std::byte> expected(e.device->block_bytes());
  FillBlock(FillRequestTokens(1, 0, 1)[0], expected);
  EXPECT_EQ(std::memcmp(e.device->block(done[0].event.device_blocks[0]).data(),
                        expected.data(), expected.size()),
            0);
  ASSERT_THAT(e.client->Complete(done), IsOk());
  ASSERT_THAT(e.client->Finish(1), IsOk());
  // Nothing pending, nothing in flight: WaitEvents sends nothing at all.
  EXPECT_TRUE(e.client->WaitEvents(std::chrono::milliseconds(20)).empty());
  EXPECT_EQ(e.client->call_counts().calls - before, 3u);  // + Complete, Finish.
}

// An engine that completes a load twice (alone, or in a batch with a new
// one) never unpins its blocks twice: the second is refused and the block
// stays its request's, and the new one in the batch is completed.
TEST_F(PendingLoad, ACompletionTwiceUnpinsOnce) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  const BlockId target = LookupAndAllocate(e, 1, 0).load->device_blocks.at(0);
  const std::vector<FinishedTransfer> first = NextTransfers(e);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_THAT(e.client->Complete(first), IsOk());
  EXPECT_EQ(e.Ref(target), 1);  // The request's own.
  EXPECT_THAT(e.client->Complete(first),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(e.Ref(target), 1);
  // A batch of a new load and the old one: the new one completes.
  const BlockId second = LookupAndAllocate(e, 2, 1).load->device_blocks.at(0);
  std::vector<FinishedTransfer> batch = NextTransfers(e);
  ASSERT_EQ(batch.size(), 1u);
  batch.push_back(first[0]);
  EXPECT_THAT(e.client->Complete(batch),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(e.Ref(target), 1);
  EXPECT_EQ(e.Ref(second), 1);
  EXPECT_EQ(e.client->Stats().value().host.events_in_flight, 0u);
  ASSERT_THAT(e.client->Finish(1), IsOk());
  ASSERT_THAT(e.client->Finish(2), IsOk());
  EXPECT_EQ(e.client->Stats().value().host.pinned_slots, 0);
}

// A client dropped with a transfer handed out and not completed leaves
// no pin behind in the engine's pool.
TEST_F(PendingLoad, AClientDroppedUnpinsWhatItHandedOut) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  const BlockId target = LookupAndAllocate(e, 1, 0).load->device_blocks.at(0);
  NextTransfers(e);  // Handed out, never completed.
  EXPECT_EQ(e.Ref(target), 2);
  e.client.reset();
  EXPECT_EQ(e.Ref(target), 1);  // The request's own.
}

// The engine aborts a request whose load waits for a promotion and gives
// its block to another request at once. The load is cancelled: the new
// owner's bytes are never overwritten, and nothing stays pinned.
TEST_F(PendingLoad, AbortedRequestsBlocksAreNeverWritten) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  AllocateResult alloc = LookupAndAllocate(e, 1, 0);
  ASSERT_TRUE(alloc.load_pending);
  const BlockId target = alloc.load->device_blocks.at(0);
  EXPECT_EQ(e.Ref(target), 2);  // The request's, and the load's pin.
  EXPECT_EQ(e.client->loads_pending(), 1u);

  ASSERT_THAT(e.client->Finish(1), IsOk());
  ASSERT_THAT(e.manager->Free(1), IsOk());
  EXPECT_EQ(e.Ref(target), 0);
  EXPECT_EQ(e.client->loads_pending(), 0u);
  // Never keyed: the load did not land.
  EXPECT_FALSE(PoolOf(*e.manager).block(target).has_key());

  // Another request takes every free block, so `target` among them, and
  // computes its own bytes into them.
  Request other(2, FillRequestTokens(9, 0, 31), kBs, hasher_);
  std::vector<BlockId> taken =
      e.manager->AllocateSlots(other, other.num_tokens()).value();
  ASSERT_THAT(taken, ::testing::Contains(target));
  std::vector<std::byte> mine(e.device->block_bytes());
  FillBlock(424242, mine);
  std::memcpy(e.device->block(target).data(), mine.data(), mine.size());

  // tierkvd lands the promotion on host and cancels the load.
  WaitForTheCancelledLoad(e);
  EXPECT_TRUE(e.client->PollEvents().empty());
  EXPECT_EQ(e.client->transfers_in_flight(), 0u);
  EXPECT_EQ(
      std::memcmp(e.device->block(target).data(), mine.data(), mine.size()), 0);
  // The promoted block serves the next lookup from host.
  std::vector<TokenId> again = FillRequestTokens(1, 0, 1);
  again.push_back(7);
  auto hit = e.client->Lookup(3, again);
  ASSERT_THAT(hit, IsOk());
  EXPECT_EQ(hit->hit_tokens, kBs);
  EXPECT_EQ(hit->disk_hit_tokens, 0);
  ASSERT_THAT(e.client->Finish(3), IsOk());
}

// Finishing the request one-way (CompleteOneWay's finish, as a chunk pool
// does) ends its waiting load on this side as Finish does: nothing stays
// pinned, and no ready-load round trips go on for it.
TEST_F(PendingLoad, AOneWayFinishAlsoEndsTheWaitingLoad) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  AllocateResult alloc = LookupAndAllocate(e, 1, 0);
  ASSERT_TRUE(alloc.load_pending);
  const BlockId target = alloc.load->device_blocks.at(0);
  EXPECT_EQ(e.Ref(target), 2);  // The request's, and the load's pin.

  ASSERT_THAT(e.client->CompleteOneWay({}, /*finish=*/1), IsOk());
  EXPECT_EQ(e.client->loads_pending(), 0u);
  ASSERT_THAT(e.manager->Free(1), IsOk());
  EXPECT_EQ(e.Ref(target), 0);
  // tierkvd cancelled it too: the load is never handed out.
  WaitForTheCancelledLoad(e);
  EXPECT_EQ(e.client->call_counts().post_errors, 0u);
  EXPECT_TRUE(e.client->PollEvents().empty());
  EXPECT_EQ(e.client->transfers_in_flight(), 0u);
}

// ~Client unpins what it pinned: a load waiting for promotions and copies
// in flight leave no block of the engine's pool pinned.
TEST_F(PendingLoad, DestroyingTheClientUnpinsEveryBlock) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  ASSERT_TRUE(LookupAndAllocate(e, 1, 0).load_pending);
  ASSERT_TRUE(LookupAndAllocate(e, 2, 1).load_pending);
  const int32_t requests_refs = e.TotalRefs() - 2;
  e.client.reset();
  EXPECT_EQ(e.TotalRefs(), requests_refs);
  ASSERT_THAT(e.manager->Free(1), IsOk());
  ASSERT_THAT(e.manager->Free(2), IsOk());
  EXPECT_EQ(e.TotalRefs(), 0);
  EXPECT_THAT(PoolOf(*e.manager).CheckInvariants(), IsOk());
}

// A loaded block becomes a prefix hit on the engine only once its bytes are
// there, and is checked bit for bit.
TEST_F(PendingLoad, LoadedBlockIsKeyedOnlyOnceItLands) {
  StartFilledStore();
  Engine e = Engine::Open(socket_, std::chrono::seconds(5));
  ASSERT_NE(e.client, nullptr);
  AllocateResult alloc = LookupAndAllocate(e, 1, 0);
  ASSERT_TRUE(alloc.load_pending);
  std::vector<TokenId> tokens = FillRequestTokens(1, 0, 1);
  tokens.push_back(7);
  Request twin(2, tokens, kBs, hasher_);
  EXPECT_TRUE(e.manager->GetComputedBlocks(twin).blocks.empty());

  std::vector<FinishedTransfer> done;
  while (done.empty()) done = e.client->WaitEvents(std::chrono::seconds(10));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_THAT(done[0].status, IsOk());
  ASSERT_EQ(done[0].loaded_blocks(), 1);
  ASSERT_THAT(e.client->Complete(done), IsOk());
  Request request(1, tokens, kBs, hasher_);
  ExternalLoadResult landed =
      e.manager->CompleteExternalLoad(request, done[0].loaded_blocks() * kBs)
          .value();
  EXPECT_EQ(landed.num_computed_tokens, kBs);
  std::vector<std::byte> expected(e.device->block_bytes());
  FillBlock(tokens[0], expected);
  const BlockId b = done[0].event.device_blocks[0];
  EXPECT_EQ(
      std::memcmp(e.device->block(b).data(), expected.data(), expected.size()),
      0);
  EXPECT_THAT(e.manager->GetComputedBlocks(twin).blocks,
              ::testing::ElementsAre(b));
  EXPECT_EQ(e.Ref(b), 1);  // The load's pin is gone.
  ASSERT_THAT(e.client->Finish(1), IsOk());
}

// A stopped tierkvd: every call fails within the deadline instead of
// blocking, pending loads come back failed, and once tierkvd runs again
// Reconnect attaches anew.
TEST_F(ClientDeadline, StoppedTierkvdFailsCallsInTime) {
  StartFilledStore();
  // Long enough for every call before the freeze on a loaded machine.
  const auto timeout = std::chrono::milliseconds(1000);
  Engine e = Engine::Open(socket_, timeout);
  ASSERT_NE(e.client, nullptr);
  ASSERT_TRUE(LookupAndAllocate(e, 1, 0).load_pending);
  daemon_->Freeze();

  std::vector<TokenId> tokens = FillRequestTokens(1, 5, 1);
  const auto start = Clock::now();
  auto hit = e.client->Lookup(2, tokens);
  const auto took = Clock::now() - start;
  EXPECT_EQ(hit.status().code(), StatusCode::kDeadlineExceeded)
      << hit.status().ToString();
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + std::chrono::seconds(4));
  EXPECT_FALSE(e.client->connected());
  // Later calls fail at once; the pending load is handed back failed.
  EXPECT_EQ(e.client->Lookup(2, tokens).status().code(),
            StatusCode::kUnavailable);
  std::vector<FinishedTransfer> lost = e.client->PollEvents();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(lost[0].loaded_blocks(), 0);
  EXPECT_EQ(e.client->loads_pending(), 0u);
  ASSERT_THAT(e.client->Complete(lost), IsOk());
  EXPECT_EQ(e.TotalRefs(), 2);  // The request's own two blocks.

  // Registration too has a deadline.
  ClientOptions options;
  options.socket_path = socket_;
  options.layout = TestLayout();
  options.num_device_blocks = 4;
  options.call_timeout = timeout;
  auto refused = Client::Open(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kDeadlineExceeded)
      << refused.status().ToString();

  daemon_->Thaw();
  // The thawed tierkvd may take a while to answer a registration in time.
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  Status again = e.client->Reconnect();
  while (!again.ok() && Clock::now() < give_up) again = e.client->Reconnect();
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(e.client->connected());
  EXPECT_EQ(e.client->session(), 2u);
  ASSERT_THAT(e.client->Lookup(3, tokens), IsOk());
  ASSERT_THAT(e.client->Finish(3), IsOk());
}

// copies = caller: the engine runs the copies, and the client cannot wait
// for them. A lost attachment keeps its socket, and with it tierkvd's pins
// on the copies' host slots, until the engine has completed them (else a
// store of another worker could take a slot the engine still writes), and
// Reconnect is refused until then.
TEST_F(ClientDeadline, CallerCopiesKeepTheirSlotsPastALostAttachment) {
  StartDaemon();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  ClientOptions options = ClientOptionsFor("engine");
  options.copies = CopyMode::kCaller;
  options.call_timeout = std::chrono::milliseconds(1000);
  std::unique_ptr<Client> engine = Client::Open(options).value();
  const std::vector<TokenId> tokens = FillRequestTokens(3, 0, 2);
  const std::vector<BlockId> device = {1, 2};
  ASSERT_THAT(engine->Lookup(1, tokens), IsOk());
  ASSERT_THAT(engine->Allocate(1, device, 0), IsOk());
  const CommitResult commit = engine->Commit(1, 2 * kBs, device).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  const uint64_t session = engine->session();

  daemon_->Freeze();
  EXPECT_EQ(engine->Lookup(2, tokens).status().code(),
            StatusCode::kDeadlineExceeded);
  daemon_->Thaw();
  EXPECT_FALSE(engine->connected());
  EXPECT_EQ(observer->Stats().value().host.pinned_slots, 2);
  const Status early = engine->Reconnect();
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << early.ToString();
  EXPECT_THAT(early.message(),
              ::testing::HasSubstr("1 transfer(s) handed to the engine"));

  // The engine's copy ends: completing it lets the attachment go, and
  // tierkvd releases the slots (the store is never keyed).
  const FinishedTransfer done{
      .event = commit.stores[0], .status = Status::Ok(), .session = session};
  ASSERT_THAT(engine->Complete({&done, 1}), IsOk());
  const auto fail_after = Clock::now() + std::chrono::seconds(20);
  while (observer->Stats().value().host.pinned_slots != 0) {
    ASSERT_LT(Clock::now(), fail_after) << "the slots stayed pinned";
    std::this_thread::yield();
  }
  EXPECT_EQ(observer->Stats().value().host.cached_slots, 0);
  ASSERT_THAT(engine->Reconnect(), IsOk());
  EXPECT_EQ(engine->session(), session + 1);
}

// A stopped tierkvd never signals: a load waiting for its promotion comes
// back failed once the call_timeout passes, as a call to it would.
TEST_F(ClientDeadline, StoppedTierkvdFailsAPendingLoadInTime) {
  StartFilledStore();
  const auto timeout = std::chrono::milliseconds(1000);
  Engine e = Engine::Open(socket_, timeout);
  ASSERT_NE(e.client, nullptr);
  ASSERT_TRUE(LookupAndAllocate(e, 1, 0).load_pending);
  daemon_->Freeze();
  const auto start = Clock::now();
  std::vector<FinishedTransfer> lost;
  while (lost.empty() && Clock::now() - start < std::chrono::seconds(20)) {
    lost = e.client->WaitEvents(std::chrono::seconds(1));
  }
  const auto took = Clock::now() - start;
  daemon_->Thaw();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].status.code(), StatusCode::kUnavailable)
      << lost[0].status.ToString();
  EXPECT_EQ(lost[0].loaded_blocks(), 0);
  EXPECT_FALSE(e.client->connected());
  EXPECT_LT(took, std::chrono::seconds(10));  // Two deadlines, or so.
  ASSERT_THAT(e.client->Complete(lost), IsOk());
  EXPECT_EQ(e.TotalRefs(), 2);  // The request's own two blocks.
}

// tierkvd is SIGKILLed with a load pending and restarted on its disk
// directory: the load resolves failed (its blocks are reported to
// recompute), Reconnect attaches to the new tierkvd, and the disk's blocks
// load bit-exact again.
TEST_F(Reconnect, EngineRidesThroughATierkvdRestart) {
  StartFilledStore();
  // No call deadline within the test: only the closed socket can fail the
  // pending load.
  Engine e = Engine::Open(socket_, std::chrono::hours(1));
  ASSERT_NE(e.client, nullptr);
  ASSERT_TRUE(LookupAndAllocate(e, 1, 0).load_pending);
  daemon_->Signal(SIGKILL);
  EXPECT_EQ(daemon_->Wait(), 128 + SIGKILL);
  daemon_.reset();

  // The closed socket wakes WaitEvents: the load fails at once.
  std::vector<FinishedTransfer> lost =
      e.client->WaitEvents(std::chrono::seconds(60));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].status.code(), StatusCode::kUnavailable);
  ASSERT_THAT(e.client->Complete(lost), IsOk());
  std::vector<TokenId> tokens = FillRequestTokens(1, 0, 1);
  tokens.push_back(7);
  Request request(1, tokens, kBs, hasher_);
  ExternalLoadResult cut =
      e.manager->CompleteExternalLoad(request, lost[0].loaded_blocks() * kBs)
          .value();
  EXPECT_EQ(cut.num_computed_tokens, 0);
  EXPECT_EQ(cut.failed_blocks.size(), 1u);
  EXPECT_EQ(PoolOf(*e.manager).num_cached_blocks(), 0u);
  EXPECT_FALSE(e.client->Finish(1).ok());  // Lost with tierkvd.
  ASSERT_THAT(e.manager->Free(1), IsOk());
  EXPECT_EQ(e.TotalRefs(), 0);
  EXPECT_EQ(e.client->Reconnect().code(), StatusCode::kUnavailable);

  StartDaemonWithDisk(6);
  ASSERT_THAT(e.client->Reconnect(), IsOk());
  EXPECT_EQ(e.client->session(), 2u);
  AllocateResult alloc = LookupAndAllocate(e, 2, 0);
  ASSERT_TRUE(alloc.load.has_value());
  std::vector<FinishedTransfer> done;
  while (done.empty()) done = e.client->WaitEvents(std::chrono::seconds(10));
  ASSERT_THAT(done[0].status, IsOk());
  ASSERT_EQ(done[0].loaded_blocks(), 1);
  ASSERT_THAT(e.client->Complete(done), IsOk());
  std::vector<std::byte> expected(e.device->block_bytes());
  FillBlock(tokens[0], expected);
  EXPECT_EQ(std::memcmp(e.device->block(done[0].event.device_blocks[0]).data(),
                        expected.data(), expected.size()),
            0);
  ASSERT_THAT(e.client->Finish(2), IsOk());
  ASSERT_THAT(e.manager->Free(2), IsOk());
  EXPECT_EQ(e.TotalRefs(), 0);
}

// examples/engine, the request loop the README shows: tierkvd is killed
// and restarted under it, and it goes on serving requests.
TEST_F(Reconnect, ExampleEngineRidesThroughARestart) {
  StartDaemon();
  auto engine = Spawn({EXAMPLE_ENGINE_PATH, socket_});
  ASSERT_TRUE(engine->WaitForOutput("request 20:")) << engine->output();
  daemon_->Signal(SIGKILL);
  daemon_->Wait();
  ASSERT_TRUE(engine->WaitForOutput(" dropped: ")) << engine->output();
  StartDaemon();
  ASSERT_TRUE(engine->WaitForOutput("reconnected to tierkvd\n"))
      << engine->output();
  const size_t after = engine->output().size();
  ASSERT_TRUE(engine->WaitFor([&](const std::string& out) {
    return out.find("tokens cached", after) != std::string::npos;
  })) << engine->output();
  engine->Signal(SIGTERM);
  EXPECT_EQ(engine->Wait(), 0) << engine->output();
}

}  // namespace
}  // namespace tierkv
