// Split roles in the coordinator: a scheduler's events are copied by its
// rank workers (tensor-parallel workers) and complete only once every rank
// has completed them; a failed or dropped rank fails them; a dropped
// scheduler keeps the slots its ranks may still copy. tierkvd_ranks_test
// runs the same roles through a real tierkvd.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "src/coordinator.h"
#include "tests/manual_lower_tier.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

class CoordinatorRanksTest : public ::testing::Test {
 protected:
  CoordinatorRanksTest()
      : c_(Coordinator::Create({.layout = TestLayout(), .host_slots = 20})
               .value()) {}

  StatusOr<WorkerId> Register(int32_t ranks, WorkerId scheduler, int32_t rank,
                              uint32_t uid = 7, const std::string& tenant = "",
                              const std::string& tag = "") {
    return c_.RegisterWorker({.layout = TestLayout(),
                              .num_device_blocks = 100,
                              .tenant = tenant,
                              .pid = 1,
                              .uid = uid,
                              .name = "w",
                              .ranks = ranks,
                              .scheduler = scheduler,
                              .rank = rank,
                              .attachment_tag = tag});
  }
  void SetUp() override {
    scheduler_ = Register(2, 0, 0).value();
    rank0_ = Register(0, scheduler_, 0).value();
    rank1_ = Register(0, scheduler_, 1).value();
  }
  // `scheduler` (default: the fixture's) commits `tokens`' full blocks as
  // request `id`: the store.
  TransferEvent CommitStore(RequestId id, const std::vector<TokenId>& tokens,
                            WorkerId scheduler = 0) {
    if (scheduler == 0) scheduler = scheduler_;
    EXPECT_THAT(c_.Lookup(scheduler, id, tokens, 0, {}), IsOk());
    const std::vector<BlockId> device{1, 2, 3};
    EXPECT_THAT(c_.Allocate(scheduler, id, device, 0), IsOk());
    CommitResult commit =
        c_.Commit(scheduler, id, static_cast<int32_t>(tokens.size()), device)
            .value();
    EXPECT_EQ(commit.stores.size(), 1u);
    return commit.stores.at(0);
  }
  // Hit tokens a fresh lookup of `tokens` finds (then finished).
  int32_t Hits(const std::vector<TokenId>& tokens) {
    const RequestId id = next_probe_++;
    const int32_t hits = c_.Lookup(scheduler_, id, tokens, 0, {})->hit_tokens;
    EXPECT_THAT(c_.Finish(scheduler_, id), IsOk());
    return hits;
  }
  Status CompleteBy(WorkerId rank, const TransferEvent& e, bool ok = true) {
    const std::vector<CompletedEvent> done{{e.ref, ok}};
    return c_.Complete(rank, done);
  }
  int32_t Ref(BlockId slot) const { return c_.host_pool().block(slot).ref_cnt; }
  // A scheduler with an attachment tag and two ranks; its store of tokens_
  // (request 1) rank 0 has completed, and a rank 1 is registered that the
  // test then refuses.
  struct HalfCopied {
    WorkerId scheduler = 0, refused = 0;
    TransferEvent store;
  };
  HalfCopied StoreAwaitingARefusedRank() {
    HalfCopied h;
    h.scheduler = Register(2, 0, 0, 7, "", "epoch-1").value();
    const WorkerId r0 = Register(0, h.scheduler, 0, 7, "", "epoch-1").value();
    h.store = CommitStore(1, tokens_, h.scheduler);
    EXPECT_THAT(CompleteBy(r0, h.store), IsOk());
    h.refused = Register(0, h.scheduler, 1, 7, "", "epoch-1").value();
    return h;
  }

  Coordinator c_;
  WorkerId scheduler_ = 0, rank0_ = 0, rank1_ = 0;
  RequestId next_probe_ = 1000;
  const std::vector<TokenId> tokens_ = SequentialTokens(1, 33);  // 2 blocks.
};

TEST_F(CoordinatorRanksTest, AStoreIsKeyedOnlyOnceEveryRankCompletedIt) {
  const TransferEvent store = CommitStore(1, tokens_);
  ASSERT_EQ(store.host_blocks.size(), 2u);
  EXPECT_THAT(CompleteBy(rank0_, store), IsOk());
  // Rank 1 may still be writing its heads: nothing is served yet.
  EXPECT_EQ(Hits(tokens_), 0);
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);
  EXPECT_THAT(CompleteBy(rank1_, store), IsOk());
  EXPECT_EQ(Hits(tokens_), 32);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0);
}

TEST_F(CoordinatorRanksTest, AStoreOneRankFailedIsNeverServed) {
  const TransferEvent store = CommitStore(1, tokens_);
  EXPECT_THAT(CompleteBy(rank1_, store, /*ok=*/false), IsOk());
  EXPECT_THAT(CompleteBy(rank0_, store), IsOk());
  EXPECT_EQ(Hits(tokens_), 0);
  EXPECT_EQ(Ref(store.host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.stores_failed, 2u);
}

TEST_F(CoordinatorRanksTest, ARankCompletesAnEventOnceAndTheSchedulerNever) {
  const TransferEvent store = CommitStore(1, tokens_);
  EXPECT_THAT(CompleteBy(scheduler_, store),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(CompleteBy(rank0_, store), IsOk());
  EXPECT_THAT(CompleteBy(rank0_, store),
              StatusIs(StatusCode::kInvalidArgument));
  TransferEvent unknown;
  unknown.ref = {EventKind::kLoad, 99};
  EXPECT_THAT(CompleteBy(rank0_, unknown), StatusIs(StatusCode::kNotFound));
  // Rank 1's part is still awaited.
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);
}

TEST_F(CoordinatorRanksTest, ADroppedRankFailsWhatItHadNotCompleted) {
  const TransferEvent store = CommitStore(1, tokens_);
  ASSERT_THAT(CompleteBy(rank0_, store), IsOk());
  ASSERT_THAT(CompleteBy(rank1_, store), IsOk());
  ASSERT_EQ(Hits(tokens_), 32);
  // A load of the stored blocks: rank 0 copies it, rank 1 dies.
  ASSERT_THAT(c_.Lookup(scheduler_, 2, tokens_, 0, {}), IsOk());
  const std::vector<BlockId> device{4, 5, 6};
  const AllocateResult alloc = c_.Allocate(scheduler_, 2, device, 32).value();
  ASSERT_TRUE(alloc.load.has_value());
  EXPECT_EQ(Ref(alloc.load->host_blocks[0]), 1);
  ASSERT_THAT(CompleteBy(rank0_, *alloc.load), IsOk());
  EXPECT_EQ(Ref(alloc.load->host_blocks[0]), 1);
  ASSERT_THAT(c_.DropWorker(rank1_), IsOk());
  EXPECT_EQ(Ref(alloc.load->host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0);
  // A new rank 1 takes the dead one's place and completes new events.
  const WorkerId again = Register(0, scheduler_, 1).value();
  const TransferEvent second = CommitStore(3, SequentialTokens(500, 17));
  ASSERT_THAT(CompleteBy(rank0_, second), IsOk());
  ASSERT_THAT(CompleteBy(again, second), IsOk());
  EXPECT_EQ(Hits(SequentialTokens(500, 17)), 16);
}

TEST_F(CoordinatorRanksTest, ATaggedSchedulerThatLosesARankHandsOutNoMore) {
  const WorkerId tagged = Register(2, 0, 0, 7, "", "epoch-1").value();
  const WorkerId r0 = Register(0, tagged, 0, 7, "", "epoch-1").value();
  const WorkerId r1 = Register(0, tagged, 1, 7, "", "epoch-1").value();
  const std::vector<BlockId> device{1, 2, 3};
  // A store in flight, and a request looked up but not yet allocated.
  const TransferEvent store = CommitStore(1, tokens_, tagged);
  ASSERT_THAT(c_.Lookup(tagged, 2, SequentialTokens(300, 17), 0, {}), IsOk());
  ASSERT_THAT(c_.DropWorker(r1), IsOk());
  // The store in flight failed for rank 1; rank 0 still ends its part.
  ASSERT_THAT(CompleteBy(r0, store), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0);
  // Every call that could hand out an event is refused, naming the rank.
  StatusOr<LookupResult> lookup = c_.Lookup(tagged, 3, tokens_, 0, {});
  ASSERT_THAT(lookup, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(lookup.status().message(), HasSubstr("lost rank 1"));
  EXPECT_THAT(c_.Allocate(tagged, 2, device, 0),
              StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(c_.Commit(tagged, 1, 33, device),
              StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(c_.TakeReadyLoads(tagged), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(c_.LookupChunk(tagged, 4, tokens_),
              StatusIs(StatusCode::kUnavailable));
  // No rank takes the lost one's place; the requests still finish.
  EXPECT_THAT(Register(0, tagged, 1, 7, "", "epoch-1"),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(c_.Finish(tagged, 1), IsOk());
  EXPECT_THAT(c_.Finish(tagged, 2), IsOk());
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  // The untagged scheduler of the fixture is untouched, and a new
  // attachment works.
  EXPECT_EQ(Hits(tokens_), 0);
  const WorkerId next = Register(2, 0, 0, 7, "", "epoch-2").value();
  EXPECT_THAT(c_.Lookup(next, 1, tokens_, 0, {}), IsOk());
  EXPECT_THAT(Register(0, next, 1, 7, "", "epoch-2"), IsOk());
}

TEST_F(CoordinatorRanksTest, AnEndedAttachmentFailsWhatWaitsForAbsentRanks) {
  // Rank 2 never attached: the store waits for it too. Losing rank 1 ends
  // the attachment, and no rank 2 will come to decline it.
  const WorkerId tagged = Register(3, 0, 0, 7, "", "epoch-1").value();
  const WorkerId r0 = Register(0, tagged, 0, 7, "", "epoch-1").value();
  const WorkerId r1 = Register(0, tagged, 1, 7, "", "epoch-1").value();
  const TransferEvent store = CommitStore(1, tokens_, tagged);
  ASSERT_THAT(CompleteBy(r0, store), IsOk());
  ASSERT_THAT(c_.Finish(tagged, 1), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);
  ASSERT_THAT(c_.DropWorker(r1), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
}

// A rank tierkvd registered and then could not serve (no thread for its
// session, say) never copied anything: its place is vacant again, the
// attachment goes on, and the rank that attaches next completes the store
// in flight.
TEST_F(CoordinatorRanksTest, ARankRefusedAfterRegisteringEndsNothing) {
  const HalfCopied h = StoreAwaitingARefusedRank();
  const WorkerId tagged = h.scheduler, refused = h.refused;
  const TransferEvent& store = h.store;
  ASSERT_THAT(c_.DropWorker(refused, Coordinator::Departure::kRefused), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);  // Still awaited from rank 1.
  EXPECT_THAT(c_.Lookup(tagged, 2, tokens_, 0, {}), IsOk());
  ASSERT_THAT(c_.Finish(tagged, 2), IsOk());
  const WorkerId r1 = Register(0, tagged, 1, 7, "", "epoch-1").value();
  ASSERT_THAT(CompleteBy(r1, store), IsOk());
  ASSERT_THAT(c_.Finish(tagged, 1), IsOk());
  const RequestId probe = 3;
  EXPECT_EQ(c_.Lookup(tagged, probe, tokens_, 0, {})->hit_tokens, 32);
  EXPECT_THAT(c_.Finish(tagged, probe), IsOk());
  // Gone after serving, the same rank ends the attachment.
  ASSERT_THAT(c_.DropWorker(r1), IsOk());
  EXPECT_THAT(c_.Lookup(tagged, 4, tokens_, 0, {}),
              StatusIs(StatusCode::kUnavailable));
}

// Refused after its scheduler went: no rank will come for its part any
// more, so that fails, and the store's slots go.
TEST_F(CoordinatorRanksTest, ARankRefusedAfterItsSchedulerWentFailsItsPart) {
  const HalfCopied h = StoreAwaitingARefusedRank();
  const WorkerId tagged = h.scheduler, refused = h.refused;
  const TransferEvent& store = h.store;
  ASSERT_THAT(c_.DropWorker(tagged), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);  // Rank 1 may still copy it.
  ASSERT_THAT(c_.DropWorker(refused, Coordinator::Departure::kRefused), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
}

TEST_F(CoordinatorRanksTest, ADroppedSchedulerKeepsTheSlotsItsRanksCopy) {
  const TransferEvent store = CommitStore(1, tokens_);
  const size_t workers = c_.num_workers();
  ASSERT_THAT(c_.DropWorker(scheduler_), IsOk());
  // Both ranks may still write: the slots are not reused.
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);
  EXPECT_EQ(Ref(store.host_blocks[1]), 1);
  EXPECT_THAT(CompleteBy(rank0_, store), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 1);
  // A rank that dies now ends the last part: the store fails and is freed,
  // and the scheduler is forgotten.
  EXPECT_THAT(c_.DropWorker(rank1_), IsOk());
  EXPECT_EQ(Ref(store.host_blocks[0]), 0);
  EXPECT_EQ(c_.num_workers(), workers - 2);
  EXPECT_EQ(c_.stats().host.stores_failed, 2u);
  // Its ranks' calls now name the scheduler as gone.
  EXPECT_THAT(CompleteBy(rank0_, store), StatusIs(StatusCode::kNotFound));
}

TEST_F(CoordinatorRanksTest, ASchedulerWithoutRanksAttachedDropsAtOnce) {
  const WorkerId lone = Register(4, 0, 0).value();
  ASSERT_THAT(c_.Lookup(lone, 1, tokens_, 0, {}), IsOk());
  const std::vector<BlockId> device{1, 2, 3};
  ASSERT_THAT(c_.Allocate(lone, 1, device, 0), IsOk());
  const CommitResult commit = c_.Commit(lone, 1, 33, device).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  ASSERT_THAT(c_.DropWorker(lone), IsOk());
  EXPECT_EQ(Ref(commit.stores[0].host_blocks[0]), 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0);
}

TEST_F(CoordinatorRanksTest, RolesAreChecked) {
  EXPECT_THAT(Register(kMaxRanks + 1, 0, 0),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Register(2, scheduler_, 0),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Register(0, 999, 0), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(Register(0, rank0_, 0),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(Register(0, scheduler_, 2),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Register(0, scheduler_, 0, /*uid=*/8),
              StatusIs(StatusCode::kPermissionDenied));
  EXPECT_THAT(Register(0, scheduler_, 0, 7, "other"),
              StatusIs(StatusCode::kFailedPrecondition));
  StatusOr<WorkerId> twice = Register(0, scheduler_, 1);
  ASSERT_THAT(twice, StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(twice.status().message(), HasSubstr("rank 1"));
  // A rank makes no requests of its own.
  StatusOr<LookupResult> lookup = c_.Lookup(rank0_, 1, tokens_, 0, {});
  ASSERT_THAT(lookup, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(lookup.status().message(), HasSubstr("rank 0 of scheduler"));
  EXPECT_THAT(c_.TakeReadyLoads(rank1_),
              StatusIs(StatusCode::kFailedPrecondition));
}

// A scheduler's load that waits for promotions from the lower tier, while
// its ranks are dropped and replaced.
class CoordinatorRanksPendingTest : public ::testing::Test {
 protected:
  CoordinatorRanksPendingTest()
      : c_(Coordinator::Create(
               {.layout = TestLayout(), .host_slots = 20, .lower = &lower_})
               .value()) {}
  WorkerId Register(int32_t ranks, WorkerId scheduler, int32_t rank) {
    return c_
        .RegisterWorker({.layout = TestLayout(),
                         .num_device_blocks = 100,
                         .tenant = "",
                         .pid = 1,
                         .name = "w",
                         .ranks = ranks,
                         .scheduler = scheduler,
                         .rank = rank})
        .value();
  }
  void SetUp() override {
    scheduler_ = Register(2, 0, 0);
    rank0_ = Register(0, scheduler_, 0);
    rank1_ = Register(0, scheduler_, 1);
    // Every block is on the lower tier: the load waits for promotions.
    ASSERT_EQ(c_.Lookup(scheduler_, 1, tokens_, 0, {})->disk_hit_tokens, 32);
    const std::vector<BlockId> device{1, 2, 3};
    ASSERT_TRUE(c_.Allocate(scheduler_, 1, device, 32)->load_pending);
  }
  // Lands the promotions; the load is then ready to hand out.
  void Promote() {
    for (auto& done : lower_.promotions) done(uint64_t{0});
    ASSERT_EQ(c_.PumpLowerTier(), 1u);
  }
  Status CompleteBy(WorkerId rank, const TransferEvent& e) {
    const std::vector<CompletedEvent> done{{e.ref, true}};
    return c_.Complete(rank, done);
  }

  ManualLowerTier lower_;
  Coordinator c_;
  WorkerId scheduler_ = 0, rank0_ = 0, rank1_ = 0;
  const std::vector<TokenId> tokens_ = SequentialTokens(1, 33);
};

TEST_F(CoordinatorRanksPendingTest, ARankDroppedBeforeHandOutDoesNotHoldIt) {
  ASSERT_THAT(c_.DropWorker(rank1_), IsOk());
  Promote();
  const std::vector<TransferEvent> ready =
      c_.TakeReadyLoads(scheduler_).value();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(c_.stats().host.events_in_flight, 1u);
  ASSERT_THAT(CompleteBy(rank0_, ready[0]), IsOk());
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
}

TEST_F(CoordinatorRanksPendingTest, ARankThatTakesTheDroppedOnesPlaceCopiesIt) {
  ASSERT_THAT(c_.DropWorker(rank1_), IsOk());
  const WorkerId again = Register(0, scheduler_, 1);
  Promote();
  const std::vector<TransferEvent> ready =
      c_.TakeReadyLoads(scheduler_).value();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_THAT(CompleteBy(rank0_, ready[0]), IsOk());
  // The new rank 1 may be copying it: its slots stay pinned.
  EXPECT_EQ(c_.stats().host.events_in_flight, 1u);
  EXPECT_GT(c_.stats().host.pinned_slots, 0);
  ASSERT_THAT(CompleteBy(again, ready[0]), IsOk());
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  EXPECT_EQ(c_.stats().host.loads_completed, 2u);
}

TEST_F(CoordinatorRanksPendingTest, ALoadNoRankIsLeftToCopyIsNotHandedOut) {
  ASSERT_THAT(c_.DropWorker(rank0_), IsOk());
  ASSERT_THAT(c_.DropWorker(rank1_), IsOk());
  Promote();
  EXPECT_TRUE(c_.TakeReadyLoads(scheduler_).value().empty());
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
}

}  // namespace
}  // namespace tierkv
