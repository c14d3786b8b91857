// The coordinator's chunks in one call each and their compute leases (see
// "Chunks in one call" in src/coordinator.h), in-process: who holds a
// lease, what ends it, and that nothing is kept for a fetch that finds the
// chunk busy. chunk_single_flight_test runs the same rules across real
// worker processes and a real tierkvd.
#include <gtest/gtest.h>

#include <vector>

#include "src/coordinator.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"

namespace tierkv {
namespace {

const std::vector<BlockId> kBlocks = {1, 2, 3};
const std::vector<BlockId> kBadBlocks = {1, 2, 999};  // Past the 100.
const std::vector<BlockId> kOneBlock = {1};

class ChunkLeaseTest : public ::testing::Test {
 protected:
  ChunkLeaseTest()
      : c_(Coordinator::Create({.layout = TestLayout(),
                                .host_slots = 50,
                                .chunk_lease_released = [this] { ++ended_; }})
               .value()) {}

  WorkerId Register() {
    return c_
        .RegisterWorker({.layout = TestLayout(),
                         .num_device_blocks = 100,
                         .tenant = "",
                         .pid = 1,
                         .name = "w"})
        .value();
  }
  static std::vector<TokenId> Chunk(TokenId first) {
    std::vector<TokenId> t(40);  // Three blocks, the last one partial.
    for (size_t i = 0; i < t.size(); ++i) t[i] = first + i;
    return t;
  }
  // Publishes `chunk` from worker `w` and completes its store.
  void PublishAndComplete(WorkerId w, RequestId request,
                          const std::vector<TokenId>& chunk) {
    CommitResult commit = c_.PublishChunk(w, request, chunk, kBlocks).value();
    ASSERT_EQ(commit.stores.size(), 1u);
    const std::vector<CompletedEvent> done{{commit.stores[0].ref, true}};
    ASSERT_THAT(c_.Complete(w, done), IsOk());
  }
  HostTierStats Host() const { return c_.stats().host; }

  int ended_ = 0;
  Coordinator c_;
};

TEST_F(ChunkLeaseTest, OneComputesTheOtherIsBusyUntilThePublishIsStored) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> chunk = Chunk(100);
  Coordinator::ChunkFetch first = c_.FetchChunk(a, 1, chunk).value();
  EXPECT_TRUE(first.result.lease);
  EXPECT_FALSE(first.busy);
  EXPECT_FALSE(first.result.load.has_value());
  Coordinator::ChunkFetch second = c_.FetchChunk(b, 1, chunk).value();
  EXPECT_TRUE(second.busy);
  EXPECT_FALSE(second.result.lease);
  // Nothing kept for either: no request open, no slot pinned.
  EXPECT_EQ(Host().pinned_slots, 0);
  EXPECT_EQ(Host().request_state_bytes, 0u);
  EXPECT_EQ(c_.chunk_leases(), 1u);

  CommitResult commit = c_.PublishChunk(a, 2, chunk, kBlocks).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  EXPECT_EQ(commit.stores[0].host_blocks.size(), 3u);
  // Stored, not keyed yet: still busy, the lease lasts until it is.
  EXPECT_TRUE(c_.FetchChunk(b, 2, chunk).value().busy);
  EXPECT_EQ(ended_, 0);
  const std::vector<CompletedEvent> stored{{commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(a, stored), IsOk());
  EXPECT_EQ(ended_, 1);
  EXPECT_EQ(c_.chunk_leases(), 0u);

  Coordinator::ChunkFetch hit = c_.FetchChunk(b, 3, chunk).value();
  EXPECT_FALSE(hit.busy);
  ASSERT_TRUE(hit.result.load.has_value());
  EXPECT_EQ(hit.result.lookup.hit_tokens, 40);
  EXPECT_EQ(hit.result.load->host_blocks, commit.stores[0].host_blocks);
  EXPECT_TRUE(hit.result.load->device_blocks.empty());  // The worker's choice.
  // The request is over; the load pins its slots until completed.
  EXPECT_EQ(Host().request_state_bytes, 0u);
  EXPECT_EQ(Host().pinned_slots, 3);
  const std::vector<CompletedEvent> loaded{{hit.result.load->ref, true}};
  ASSERT_THAT(c_.Complete(b, loaded), IsOk());
  EXPECT_EQ(Host().pinned_slots, 0);
}

TEST_F(ChunkLeaseTest, FinishingTheFetchGivesTheLeaseUp) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> chunk = Chunk(200);
  ASSERT_TRUE(c_.FetchChunk(a, 7, chunk).value().result.lease);
  // The fetch's request is closed already; finishing it ends the lease.
  EXPECT_THAT(c_.Finish(a, 7), IsOk());
  EXPECT_EQ(ended_, 1);
  EXPECT_THAT(c_.Finish(a, 7), StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(c_.FetchChunk(b, 1, chunk).value().result.lease);
}

TEST_F(ChunkLeaseTest, FinishingTheFetchWhileItsPublishIsStoredKeepsTheLease) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> chunk = Chunk(250);
  ASSERT_TRUE(c_.FetchChunk(a, 1, chunk).value().result.lease);
  CommitResult commit = c_.PublishChunk(a, 2, chunk, kBlocks).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  EXPECT_THAT(c_.Finish(a, 1), StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(c_.FetchChunk(b, 1, chunk).value().busy);
  // A failed store ends it too: the waiters compute.
  const std::vector<CompletedEvent> failed{{commit.stores[0].ref, false}};
  ASSERT_THAT(c_.Complete(a, failed), IsOk());
  EXPECT_EQ(c_.chunk_leases(), 0u);
  EXPECT_TRUE(c_.FetchChunk(b, 2, chunk).value().result.lease);
}

// While the holder's publish is being stored, the holder itself fetching
// the chunk again gets a plain miss (not the lease again, and no wait on
// its own store), and a second publish of it, which stores nothing, does
// not end the lease early: other workers stay busy until the store lands.
TEST_F(ChunkLeaseTest, AStoringLeaseLastsUntilItsStoreLands) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> chunk = Chunk(275);
  ASSERT_TRUE(c_.FetchChunk(a, 1, chunk).value().result.lease);
  CommitResult commit = c_.PublishChunk(a, 2, chunk, kBlocks).value();
  ASSERT_EQ(commit.stores.size(), 1u);

  Coordinator::ChunkFetch again = c_.FetchChunk(a, 3, chunk).value();
  EXPECT_FALSE(again.busy);
  EXPECT_FALSE(again.result.lease);
  EXPECT_FALSE(again.result.load.has_value());
  EXPECT_TRUE(c_.PublishChunk(a, 4, chunk, kBlocks).value().stores.empty());
  EXPECT_EQ(ended_, 0);
  EXPECT_TRUE(c_.FetchChunk(b, 1, chunk).value().busy);

  const std::vector<CompletedEvent> stored{{commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(a, stored), IsOk());
  EXPECT_EQ(ended_, 1);
  EXPECT_TRUE(c_.FetchChunk(b, 2, chunk).value().result.load.has_value());
}

TEST_F(ChunkLeaseTest, AWorkerHoldsOneLeaseAtATime) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> x = Chunk(300), y = Chunk(400);
  ASSERT_TRUE(c_.FetchChunk(a, 1, x).value().result.lease);
  ASSERT_TRUE(c_.FetchChunk(a, 2, y).value().result.lease);
  EXPECT_EQ(ended_, 1);  // x's.
  EXPECT_EQ(c_.chunk_leases(), 1u);
  EXPECT_TRUE(c_.FetchChunk(b, 1, x).value().result.lease);
  EXPECT_EQ(c_.chunk_leases(), 2u);
  // Fetching its own leased chunk again keeps the lease.
  EXPECT_TRUE(c_.FetchChunk(a, 3, y).value().result.lease);
  EXPECT_EQ(c_.chunk_leases(), 2u);
  // b moves on to y, busy: that ends its lease on x all the same.
  EXPECT_TRUE(c_.FetchChunk(b, 2, y).value().busy);
  EXPECT_EQ(c_.chunk_leases(), 1u);
  EXPECT_EQ(ended_, 2);
}

TEST_F(ChunkLeaseTest, ADroppedHolderLeavesNoLease) {
  const WorkerId a = Register(), b = Register();
  const std::vector<TokenId> chunk = Chunk(500);
  ASSERT_TRUE(c_.FetchChunk(a, 1, chunk).value().result.lease);
  CommitResult commit = c_.PublishChunk(a, 2, chunk, kBlocks).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  ASSERT_THAT(c_.DropWorker(a), IsOk());
  EXPECT_EQ(ended_, 1);
  EXPECT_EQ(c_.chunk_leases(), 0u);
  // Its store failed with it: nothing half-written is served.
  Coordinator::ChunkFetch fetch = c_.FetchChunk(b, 1, chunk).value();
  EXPECT_FALSE(fetch.result.load.has_value());
  EXPECT_TRUE(fetch.result.lease);
  EXPECT_EQ(Host().pinned_slots, 0);
}

TEST_F(ChunkLeaseTest, APublishByAnotherWorkerIsStoredAndServed) {
  const WorkerId a = Register(), b = Register(), c = Register();
  const std::vector<TokenId> chunk = Chunk(600);
  ASSERT_TRUE(c_.FetchChunk(a, 1, chunk).value().result.lease);
  PublishAndComplete(b, 1, chunk);   // b computed it too (its wait ran out).
  EXPECT_EQ(c_.chunk_leases(), 1u);  // Still a's.
  EXPECT_TRUE(c_.FetchChunk(c, 1, chunk).value().result.load.has_value());
  // The holder's own fetch now hits, which ends its lease.
  Coordinator::ChunkFetch own = c_.FetchChunk(a, 2, chunk).value();
  EXPECT_TRUE(own.result.load.has_value());
  EXPECT_EQ(c_.chunk_leases(), 0u);
  // And its publish stores nothing more.
  EXPECT_TRUE(c_.PublishChunk(a, 3, chunk, kBlocks).value().stores.empty());
}

TEST_F(ChunkLeaseTest, BadPublishesAreRefusedAndEndTheLease) {
  const WorkerId a = Register();
  const std::vector<TokenId> chunk = Chunk(700);
  ASSERT_TRUE(c_.FetchChunk(a, 1, chunk).value().result.lease);
  EXPECT_THAT(c_.PublishChunk(a, 2, chunk, kBadBlocks),
              StatusIs(StatusCode::kOutOfRange));
  EXPECT_EQ(c_.chunk_leases(), 0u);
  EXPECT_THAT(c_.PublishChunk(a, 3, chunk, kOneBlock),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(c_.FetchChunk(a, 4, std::vector<TokenId>{}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(Host().pinned_slots, 0);
  EXPECT_EQ(Host().request_state_bytes, 0u);
}

}  // namespace
}  // namespace tierkv
