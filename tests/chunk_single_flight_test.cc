// Chunks between real worker processes and a real tierkvd: a fetch of a
// chunk on host and a publish each cost one waited-for round trip, and when
// workers miss one chunk at once one computes it while the others wait for
// its publish (single flight), however the lease holder ends: publishing,
// dying, giving up, or outlasting the waiter's bound.
#include <gmock/gmock.h>
#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/block_pattern.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client_chunk_source.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kTokens = 40;  // Three blocks, the last one partial.

class ChunkSingleFlightTest : public TierkvdFixture {
 protected:
  void SetUp() override {
    TierkvdFixture::SetUp();
    StartDaemon();
    observer_ = Attach("observer");
    ASSERT_NE(observer_, nullptr);
  }

  std::unique_ptr<ChildProcess> ChunkWorker(uint32_t seed, int32_t wait_ms,
                                            const std::string& mode) {
    return Spawn({CHUNK_WORKER_PATH, socket_, std::to_string(seed),
                  std::to_string(kTokens), std::to_string(wait_ms), mode});
  }

  // Waits until tierkvd's host stats satisfy `done`.
  void WaitForStats(const std::function<bool(const HostTierStats&)>& done) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      StatusOr<CoordinatorStats> s = observer_->Stats();
      ASSERT_THAT(s, IsOk());
      if (done(s->host)) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "tierkvd's stats never got there";
      std::this_thread::yield();
    }
  }
  void WaitForWaiters(uint64_t n) {
    WaitForStats(
        [n](const HostTierStats& h) { return h.chunk_fetches_waiting == n; });
  }

  std::unique_ptr<Client> observer_;
};

TEST_F(ChunkSingleFlightTest, OneRoundTripPerFetchAndPublish) {
  std::unique_ptr<Client> a = Attach("publisher");
  ClientChunkSource source(a.get());
  std::vector<TokenId> chunk(kTokens);
  for (int32_t i = 0; i < kTokens; ++i) chunk[i] = 7919u * 5u + i * 3u + 1u;
  const std::vector<BlockId> blocks = {1, 2, 3};
  auto* device = static_cast<EmulatedDeviceTier*>(a->device());
  for (size_t j = 0; j < blocks.size(); ++j) {
    FillBlock(chunk[j * 16], device->block(blocks[j]));
  }
  ClientCallCounts before = a->call_counts();
  ASSERT_THAT(source.Publish(chunk, 0, {}, blocks), IsOk());
  EXPECT_EQ(a->call_counts().calls - before.calls, 1u);
  EXPECT_EQ(a->call_counts().posts - before.posts, 1u);
  // The next call collects the posted completion: the chunk is keyed.
  ASSERT_THAT(a->Stats(), IsOk());
  EXPECT_EQ(a->call_counts().post_errors, 0u);

  // Another process fetches it in one round trip, byte for byte.
  auto reader = ChunkWorker(5, 0, "compute");
  EXPECT_TRUE(reader->WaitForOutput("fetch hit=1 lease=0 waited=0 calls=1 ms="))
      << reader->output();
  EXPECT_TRUE(reader->WaitForOutput("bytes ok")) << reader->output();
  EXPECT_EQ(reader->Wait(), 0) << reader->output();

  // A miss is one round trip too, and gives this worker the lease.
  std::vector<TokenId> other = chunk;
  other[0] += 1;
  before = a->call_counts();
  StatusOr<bool> fetched =
      source.Fetch(other, 0, {}, [](int32_t) -> StatusOr<std::vector<BlockId>> {
        ADD_FAILURE() << "allocate on a miss";
        return Status::Internal("allocate on a miss");
      });
  ASSERT_THAT(fetched, IsOk());
  EXPECT_FALSE(*fetched);
  EXPECT_EQ(a->call_counts().calls - before.calls, 1u);
  EXPECT_EQ(a->call_counts().posts - before.posts, 0u);
  EXPECT_EQ(source.stats().leases, 1u);
  EXPECT_EQ(observer_->Stats().value().host.chunk_leases, 1u);
  // Its publish ends the lease once the store completes.
  ASSERT_THAT(source.Publish(other, 0, {}, blocks), IsOk());
  ASSERT_THAT(a->Stats(), IsOk());
  EXPECT_EQ(observer_->Stats().value().host.chunk_leases, 0u);
  EXPECT_EQ(observer_->Stats().value().host.pinned_slots, 0);
}

TEST_F(ChunkSingleFlightTest, AChunkWhoseHostBytesChangedIsNeverLoaded) {
  observer_.reset();
  StopDaemon();
  StartDaemon("1M", {"--verify-loads"});
  std::unique_ptr<Client> a = Attach("publisher");
  std::vector<TokenId> chunk(kTokens);
  for (int32_t i = 0; i < kTokens; ++i) chunk[i] = 11u + i;
  const std::vector<BlockId> blocks = {1, 2, 3};
  StatusOr<CommitResult> commit = a->PublishChunk(1, chunk, blocks);
  ASSERT_THAT(commit, IsOk());
  ASSERT_EQ(commit->stores.size(), 1u);
  std::vector<FinishedTransfer> done = a->WaitEvents(std::chrono::seconds(10));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_THAT(a->CompleteOneWay(done), IsOk());
  ASSERT_THAT(a->Stats(), IsOk());  // The store is checksummed and keyed.
  // A hostile worker writes into the stored block's slot afterwards.
  StatusOr<std::span<std::byte>> slot =
      a->host_block(commit->stores[0].host_blocks[1]);
  ASSERT_THAT(slot, IsOk());
  (*slot)[0] = ~(*slot)[0];

  std::unique_ptr<Client> b = Attach("reader");
  ClientChunkSource source(b.get());
  StatusOr<bool> fetched =
      source.Fetch(chunk, 0, {}, [](int32_t) -> StatusOr<std::vector<BlockId>> {
        ADD_FAILURE() << "allocate for a load cut short";
        return Status::Internal("allocate for a load cut short");
      });
  ASSERT_THAT(fetched, IsOk());
  EXPECT_FALSE(*fetched);
  EXPECT_EQ(source.stats().failed, 1u);
  EXPECT_EQ(b->call_counts().calls, 1u);
  // The load's slots were released with it.
  ASSERT_THAT(b->Stats(), IsOk());
  EXPECT_EQ(b->Stats().value().host.pinned_slots, 0);
}

// A refused one-way completion is counted and kept, and the message after
// it is still sent: were it a completion too, failing it unsent would
// leave its slots pinned in tierkvd.
TEST_F(ChunkSingleFlightTest, AFailedOneWayCompletionIsKeptNotPassedOn) {
  std::unique_ptr<Client> a = Attach("poster");
  // An event never handed out is refused by the client itself: nothing is
  // sent.
  FinishedTransfer bogus;
  bogus.event.ref = {EventKind::kStore, 999};
  bogus.session = a->session();
  EXPECT_THAT(a->CompleteOneWay({&bogus, 1}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(a->call_counts().posts, 0u);
  // Requests tierkvd does not know: their finishes are refused there.
  ASSERT_THAT(a->CompleteOneWay({}, /*finish=*/999), IsOk());  // Not waited.
  // Collects the first one's error, and is sent all the same.
  ASSERT_THAT(a->CompleteOneWay({}, /*finish=*/998), IsOk());
  EXPECT_THAT(a->Stats(), IsOk());
  EXPECT_EQ(a->call_counts().post_errors, 2u);  // Both reached tierkvd.
  EXPECT_THAT(a->last_post_error().message(), HasSubstr("one-way ChunkDone"));
  EXPECT_TRUE(a->connected());
}

TEST_F(ChunkSingleFlightTest, SecondMisserIsServedTheFirstOnesPublish) {
  auto first = ChunkWorker(1, 20000, "hold");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  auto second = ChunkWorker(1, 20000, "compute");
  WaitForWaiters(1);
  first->Signal(SIGUSR1);  // Computes and publishes.
  EXPECT_TRUE(first->WaitForOutput("published calls=1 posts=1"))
      << first->output();
  EXPECT_TRUE(second->WaitForOutput("fetch hit=1 lease=0 waited=1 calls=1 ms="))
      << second->output();
  EXPECT_TRUE(second->WaitForOutput("bytes ok")) << second->output();
  EXPECT_EQ(first->Wait(), 0) << first->output();
  EXPECT_EQ(second->Wait(), 0) << second->output();
  const HostTierStats h = SettledStats(*observer_).host;
  EXPECT_EQ(h.chunk_leases, 0u);
  EXPECT_EQ(h.chunk_lease_waits, 1u);
  EXPECT_EQ(h.chunk_fetches_waiting, 0u);
  EXPECT_EQ(h.stores_completed, 3u);  // Computed and stored once.
  EXPECT_EQ(h.pinned_slots, 0);
}

TEST_F(ChunkSingleFlightTest, LeaseHolderDyingLetsTheWaiterCompute) {
  auto first = ChunkWorker(2, 20000, "hold");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  auto second = ChunkWorker(2, 20000, "compute");
  WaitForWaiters(1);
  first->Signal(SIGKILL);
  first->Wait();
  EXPECT_TRUE(second->WaitForOutput("fetch hit=0 lease=1 waited=1"))
      << second->output();
  EXPECT_TRUE(second->WaitForOutput("published")) << second->output();
  EXPECT_EQ(second->Wait(), 0) << second->output();
  // What the waiter computed is served to the next worker.
  auto third = ChunkWorker(2, 0, "compute");
  EXPECT_TRUE(third->WaitForOutput("fetch hit=1")) << third->output();
  EXPECT_TRUE(third->WaitForOutput("bytes ok")) << third->output();
  EXPECT_EQ(third->Wait(), 0);
  EXPECT_EQ(SettledStats(*observer_).host.chunk_leases, 0u);
}

TEST_F(ChunkSingleFlightTest, FinishWithoutPublishEndsTheLease) {
  auto first = ChunkWorker(3, 20000, "abandon");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  auto second = ChunkWorker(3, 20000, "compute");
  WaitForWaiters(1);
  first->Signal(SIGUSR1);  // Finishes its fetch's request, publishing nothing.
  EXPECT_TRUE(first->WaitForOutput("abandoned")) << first->output();
  EXPECT_TRUE(second->WaitForOutput("fetch hit=0 lease=1 waited=1"))
      << second->output();
  EXPECT_TRUE(second->WaitForOutput("published")) << second->output();
  EXPECT_EQ(first->Wait(), 0);
  EXPECT_EQ(second->Wait(), 0);
  EXPECT_EQ(SettledStats(*observer_).host.chunk_leases, 0u);
}

TEST_F(ChunkSingleFlightTest, TheWaitIsBoundedThenTheWaiterComputes) {
  auto first = ChunkWorker(4, 20000, "hold");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  // The lease holder never publishes: the waiter gives up after 200 ms and
  // computes and publishes the chunk itself, though another holds its lease.
  auto second = ChunkWorker(4, 200, "compute");
  EXPECT_TRUE(second->WaitForOutput("fetch hit=0 lease=0 waited=1"))
      << second->output();
  EXPECT_TRUE(second->WaitForOutput("published calls=1 posts=1"))
      << second->output();
  EXPECT_EQ(second->Wait(), 0);
  const std::string out = second->output();
  const size_t at = out.find(" ms=");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::stoi(out.substr(at + 4)), 200) << out;
  // Its publish is served at once; the first worker still holds the lease.
  auto third = ChunkWorker(4, 20000, "compute");
  EXPECT_TRUE(third->WaitForOutput("fetch hit=1 lease=0 waited=0"))
      << third->output();
  EXPECT_TRUE(third->WaitForOutput("bytes ok")) << third->output();
  EXPECT_EQ(third->Wait(), 0);
  EXPECT_EQ(observer_->Stats().value().host.chunk_leases, 1u);
  // Its holder gone, the lease goes with it.
  first->Signal(SIGKILL);
  first->Wait();
  WaitForStats([](const HostTierStats& h) { return h.chunk_leases == 0; });
}

TEST_F(ChunkSingleFlightTest, AWaiterThatDiesStopsWaiting) {
  auto first = ChunkWorker(7, 20000, "hold");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  auto second = ChunkWorker(7, 20000, "compute");
  WaitForWaiters(1);
  second->Signal(SIGKILL);
  second->Wait();
  // Its session thread leaves the wait (and is reaped) though the lease
  // holder never publishes.
  WaitForStats([](const HostTierStats& h) {
    return h.chunk_fetches_waiting == 0 && h.chunk_leases == 1;
  });
  first->Signal(SIGUSR1);
  EXPECT_TRUE(first->WaitForOutput("published calls=1 posts=1"))
      << first->output();
  EXPECT_EQ(first->Wait(), 0);
  EXPECT_EQ(SettledStats(*observer_).host.chunk_leases, 0u);
}

// A stop serves nothing new: the holder's session closing first releases
// the lease, and a waiter then handed it must not get its publish served.
// Several waiters, so that some close well after the holder.
TEST_F(ChunkSingleFlightTest, AStopEndsEveryWaitingFetch) {
  constexpr int kWaiters = 4;
  auto first = ChunkWorker(6, 20000, "hold");
  ASSERT_TRUE(first->WaitForOutput("lease")) << first->output();
  std::vector<std::unique_ptr<ChildProcess>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(ChunkWorker(6, 20000, "compute"));
  }
  WaitForWaiters(kWaiters);
  observer_.reset();
  StopDaemon();  // Exits 0, the waiting session threads ended.
  for (auto& waiter : waiters) {
    EXPECT_TRUE(waiter->WaitForOutput("error")) << waiter->output();
    EXPECT_EQ(waiter->Wait(), 1) << waiter->output();
  }
}

}  // namespace
}  // namespace tierkv
