// Copy roles through a real tierkvd: a scheduler client (copies = kRanks)
// whose events two rank clients copy, each its half of every block, as
// tensor-parallel workers do; a rank lost mid-store; and an engine that
// copies through host slot views itself (copies = kCaller).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "tests/sequential_tokens.h"
#include "tests/tierkvd_fixture.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

// The byte the test's model writes at `offset` of the block keyed by
// tokens starting at `first`.
std::byte PatternByte(TokenId first, size_t block, size_t offset) {
  return static_cast<std::byte>((first * 131 + block * 17 + offset * 7) & 0xff);
}

class TierkvdRanksTest : public TierkvdFixture {
 protected:
  void SetUp() override {
    TierkvdFixture::SetUp();
    StartDaemon(std::to_string(40 * TestLayout().BlockBytes()));
    ClientOptions s = ClientOptionsFor("scheduler");
    s.copies = CopyMode::kRanks;
    s.ranks = 2;
    StatusOr<std::unique_ptr<Client>> opened = Client::Open(s);
    ASSERT_THAT(opened, IsOk());
    scheduler_ = std::move(*opened);
    for (int32_t r = 0; r < 2; ++r) {
      ranks_.push_back(OpenRank(r, CopyMode::kCaller));
      ASSERT_NE(ranks_.back(), nullptr);
    }
  }
  std::unique_ptr<Client> OpenRank(int32_t rank, CopyMode copies) {
    ClientOptions o = ClientOptionsFor("rank" + std::to_string(rank));
    o.copies = copies;
    o.scheduler = scheduler_->worker_id();
    o.rank = rank;
    StatusOr<std::unique_ptr<Client>> opened = Client::Open(o);
    EXPECT_THAT(opened, IsOk());
    return opened.ok() ? std::move(*opened) : nullptr;
  }
  // Rank `rank` writes its half of each of the store's host slots and
  // completes its part.
  void CopyHalf(int32_t rank, const TransferEvent& store, bool ok = true) {
    const size_t bytes = TestLayout().BlockBytes();
    const size_t half = bytes / 2;
    for (size_t i = 0; i < store.host_blocks.size(); ++i) {
      StatusOr<std::span<std::byte>> slot =
          ranks_[rank]->host_block(store.host_blocks[i]);
      ASSERT_THAT(slot, IsOk());
      for (size_t o = rank * half; o < (rank + 1) * half; ++o) {
        (*slot)[o] = PatternByte(first_token_, i, o);
      }
    }
    const FinishedTransfer done{
        .event = store,
        .status = ok ? Status::Ok() : Status::Internal("copy failed"),
        .session = ranks_[rank]->session()};
    ASSERT_THAT(ranks_[rank]->Complete(std::span(&done, 1)), IsOk());
  }
  // The scheduler commits the prompt's two full blocks as request `id`.
  TransferEvent Commit(RequestId id) {
    EXPECT_THAT(scheduler_->Lookup(id, tokens_), IsOk());
    const std::vector<BlockId> device{1, 2, 3};
    EXPECT_THAT(scheduler_->Allocate(id, device, 0), IsOk());
    StatusOr<CommitResult> commit = scheduler_->Commit(id, 33, device);
    EXPECT_THAT(commit, IsOk());
    EXPECT_EQ(commit->stores.size(), 1u);
    return commit->stores.at(0);
  }

  const TokenId first_token_ = 77;
  const std::vector<TokenId> tokens_ = SequentialTokens(first_token_, 33);
  std::unique_ptr<Client> scheduler_;
  std::vector<std::unique_ptr<Client>> ranks_;
};

TEST_F(TierkvdRanksTest, TwoRanksFillOneBlockAnotherWorkerLoads) {
  const TransferEvent store = Commit(1);
  // The scheduler copies nothing and completes nothing.
  EXPECT_THAT(scheduler_->Complete({}),
              StatusIs(StatusCode::kFailedPrecondition));
  CopyHalf(0, store);
  std::unique_ptr<Client> reader = Attach("reader");
  ASSERT_NE(reader, nullptr);
  // Half a block is never served.
  EXPECT_EQ(reader->Lookup(50, tokens_)->hit_tokens, 0);
  ASSERT_THAT(reader->Finish(50), IsOk());
  CopyHalf(1, store);
  ASSERT_EQ(reader->Lookup(51, tokens_)->hit_tokens, 32);
  const std::vector<BlockId> device{5, 6, 7};
  StatusOr<AllocateResult> alloc = reader->Allocate(51, device, 32);
  ASSERT_THAT(alloc, IsOk());
  std::vector<FinishedTransfer> done;
  while (done.empty()) done = reader->WaitEvents(std::chrono::seconds(5));
  ASSERT_THAT(done[0].status, IsOk());
  ASSERT_THAT(reader->Complete(done), IsOk());
  auto& device_tier = static_cast<EmulatedDeviceTier&>(reader->device());
  for (size_t i = 0; i < 2; ++i) {
    std::span<std::byte> block = device_tier.block(device[i]);
    for (size_t o = 0; o < block.size(); ++o) {
      ASSERT_EQ(block[o], PatternByte(first_token_, i, o))
          << "block " << i << " byte " << o;
    }
  }
}

TEST_F(TierkvdRanksTest, ARankLostMidStoreFailsTheStore) {
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const TransferEvent store = Commit(1);
  CopyHalf(0, store);
  EXPECT_EQ(observer->Stats()->host.events_in_flight, 1u);
  ranks_[1].reset();  // Its socket closes: tierkvd drops it.
  ASSERT_THAT(scheduler_->Finish(1), IsOk());
  scheduler_.reset();
  ranks_[0].reset();
  const CoordinatorStats settled = SettledStats(*observer);
  EXPECT_EQ(settled.host.events_in_flight, 0u);
  EXPECT_EQ(settled.host.pinned_slots, 0);
  EXPECT_EQ(settled.host.stores_failed, 2u);
  EXPECT_EQ(observer->Lookup(9, tokens_)->hit_tokens, 0);
}

TEST_F(TierkvdRanksTest, RankClientsCopyOnTheirDeviceTiers) {
  // Rank clients that copy on a device tier (Start, then WaitEvents), of
  // a second scheduler.
  ClientOptions s = ClientOptionsFor("scheduler2");
  s.copies = CopyMode::kRanks;
  s.ranks = 2;
  scheduler_ = std::move(Client::Open(s).value());
  std::vector<std::unique_ptr<Client>> ranks;
  for (int32_t r = 0; r < 2; ++r) {
    ranks.push_back(OpenRank(r, CopyMode::kClient));
    ASSERT_NE(ranks.back(), nullptr);
    auto& dev = static_cast<EmulatedDeviceTier&>(ranks.back()->device());
    for (BlockId b : {1, 2}) {
      std::memset(dev.block(b).data(), 0x40 + b, dev.block(b).size());
    }
  }
  const TransferEvent store = Commit(1);
  for (auto& rank : ranks) {
    ASSERT_THAT(rank->Start(store), IsOk());
    std::vector<FinishedTransfer> done;
    while (done.empty()) done = rank->WaitEvents(std::chrono::seconds(5));
    ASSERT_THAT(done[0].status, IsOk());
    ASSERT_THAT(rank->Complete(done), IsOk());
  }
  std::unique_ptr<Client> reader = Attach("reader");
  EXPECT_EQ(reader->Lookup(2, tokens_)->hit_tokens, 32);
  // The scheduler's own Start is refused; so are blocks out of range.
  EXPECT_THAT(scheduler_->Start(store),
              StatusIs(StatusCode::kFailedPrecondition));
  TransferEvent bad = store;
  bad.device_blocks[0] = 64;
  EXPECT_THAT(ranks[0]->Start(bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TierkvdRanksTest, RolesAreCheckedAtAttach) {
  // tierkv-admin shows who copies for whom.
  StatusOr<CoordinatorStats> stats = scheduler_->Stats();
  ASSERT_THAT(stats, IsOk());
  std::vector<std::string> roles;
  for (const WorkerStats& w : stats->workers) roles.push_back(w.role);
  const std::string of =
      " of worker " + std::to_string(scheduler_->worker_id());
  EXPECT_THAT(roles, ::testing::UnorderedElementsAre(
                         "scheduler of 2 ranks", "rank 0" + of, "rank 1" + of));
  // Rank 1 is attached already.
  ClientOptions o = ClientOptionsFor("again");
  o.copies = CopyMode::kCaller;
  o.scheduler = scheduler_->worker_id();
  o.rank = 1;
  StatusOr<std::unique_ptr<Client>> again = Client::Open(o);
  ASSERT_THAT(again, StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(again.status().message(), HasSubstr("rank 1"));
  o.rank = 0;
  o.scheduler = ranks_[0]->worker_id();
  EXPECT_THAT(Client::Open(o), StatusIs(StatusCode::kFailedPrecondition));
  ClientOptions s = ClientOptionsFor("bad");
  s.copies = CopyMode::kRanks;
  s.ranks = 0;
  EXPECT_THAT(Client::Open(s), StatusIs(StatusCode::kInvalidArgument));
  s.ranks = 2;
  std::unique_ptr<EmulatedDeviceTier> device =
      EmulatedDeviceTier::Create(64, TestLayout().BlockBytes()).value();
  s.device = device.get();
  EXPECT_THAT(Client::Open(s), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TierkvdRanksTest, AnEngineCopiesThroughHostSlotViews) {
  ClientOptions o = ClientOptionsFor("caller");
  o.copies = CopyMode::kCaller;
  StatusOr<std::unique_ptr<Client>> opened = Client::Open(o);
  ASSERT_THAT(opened, IsOk());
  Client& c = **opened;
  EXPECT_THAT(c.host_block(0), StatusIs(StatusCode::kOutOfRange));
  const std::vector<TokenId> tokens = SequentialTokens(900, 17);
  ASSERT_THAT(c.Lookup(1, tokens), IsOk());
  const std::vector<BlockId> device{3, 4};
  ASSERT_THAT(c.Allocate(1, device, 0), IsOk());
  StatusOr<CommitResult> commit = c.Commit(1, 17, device);
  ASSERT_THAT(commit, IsOk());
  ASSERT_EQ(commit->stores.size(), 1u);
  const TransferEvent& store = commit->stores[0];
  EXPECT_EQ(c.transfers_in_flight(), 0u);  // Nothing copies here.
  std::span<std::byte> slot = c.host_block(store.host_blocks[0]).value();
  std::memset(slot.data(), 0x5c, slot.size());
  const FinishedTransfer done{
      .event = store, .status = Status::Ok(), .session = c.session()};
  ASSERT_THAT(c.Complete(std::span(&done, 1)), IsOk());
  ASSERT_THAT(c.Finish(1), IsOk());
  // A load hands out the slot to read.
  ASSERT_EQ(c.Lookup(2, tokens)->hit_tokens, 16);
  const std::vector<BlockId> into{5, 6};
  StatusOr<AllocateResult> alloc = c.Allocate(2, into, 16);
  ASSERT_THAT(alloc, IsOk());
  ASSERT_TRUE(alloc->load.has_value());
  std::span<std::byte> loaded =
      c.host_block(alloc->load->host_blocks[0]).value();
  EXPECT_EQ(loaded[0], std::byte{0x5c});
  EXPECT_EQ(loaded[loaded.size() - 1], std::byte{0x5c});
  EXPECT_THAT(c.TakeReadyLoads(), IsOk());
}

}  // namespace
}  // namespace tierkv
