// Copy roles through a real tierkvd: a scheduler client (copies = kRanks)
// whose events two rank clients copy, each its half of every block, as
// tensor-parallel workers do (through host slot views, and on
// RegisteredDeviceTiers over their shard of the heads in vLLM's paged
// layout); a rank lost mid-store; and an engine that copies through host
// slot views itself (copies = kCaller).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/sequential_tokens.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

// The byte the test's model writes at `offset` of the block keyed by
// tokens starting at `first`.
std::byte PatternByte(TokenId first, size_t block, size_t offset) {
  return static_cast<std::byte>((first * 131 + block * 17 + offset * 7) & 0xff);
}

// The lowest descriptor limit under which `pid` has exactly `spare` free
// descriptor numbers: its `spare + 1`th free number.
rlim_t LimitLeaving(pid_t pid, int spare) {
  std::set<int> open;
  for (const auto& entry : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    open.insert(std::stoi(entry.path().filename().string()));
  }
  int fd = 0;
  for (int free = 0;; ++fd) {
    if (!open.contains(fd) && free++ == spare) return static_cast<rlim_t>(fd);
  }
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

  // A scheduler with an attachment tag and one rank, that rank gone:
  // tierkvd dropped it, and no rank can attach for the scheduler any more.
  std::unique_ptr<Client> TaggedSchedulerThatLostItsRank() {
    ClientOptions s = ClientOptionsFor("tagged");
    s.copies = CopyMode::kRanks;
    s.ranks = 1;
    s.attachment_tag = "epoch-1";
    std::unique_ptr<Client> tagged = std::move(Client::Open(s).value());
    ClientOptions o = ClientOptionsFor("rank");
    o.copies = CopyMode::kCaller;
    o.scheduler = tagged->worker_id();
    o.attachment_tag = "epoch-1";
    std::unique_ptr<Client> rank = std::move(Client::Open(o).value());
    const WorkerId lost = rank->worker_id();
    EXPECT_THAT(tagged->Lookup(1, tokens_), IsOk());  // Pins nothing yet.
    rank.reset();
    EXPECT_TRUE(
        daemon_->WaitForOutput("worker " + std::to_string(lost) + " (pid"))
        << daemon_->output();
    EXPECT_THAT(Client::Open(o), StatusIs(StatusCode::kFailedPrecondition));
    return tagged;
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
  auto& device_tier = *static_cast<EmulatedDeviceTier*>(reader->device());
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

// vLLM's paged layout for one layer, [2][kBlocks][block_size][heads][dim]
// bf16 elements, of `heads` heads starting at `first_head`: each element
// names its layer, plane, block, token, head and dim.
struct PagedLayer {
  static constexpr int32_t kBlocks = 64;
  PagedLayer(int32_t layer, int32_t first_head, int32_t heads, bool fill)
      : heads(heads), data(Index(2, 0, 0, 0, 0), 0) {
    if (!fill) return;
    for (int32_t p = 0; p < 2; ++p) {
      for (int32_t b = 0; b < kBlocks; ++b) {
        for (int32_t t = 0; t < TestLayout().block_size; ++t) {
          for (int32_t h = 0; h < heads; ++h) {
            for (int32_t d = 0; d < TestLayout().head_dim; ++d) {
              data[Index(p, b, t, h, d)] =
                  Element(layer, p, b, t, first_head + h, d);
            }
          }
        }
      }
    }
  }
  static uint16_t Element(int32_t layer, int32_t p, int32_t b, int32_t t,
                          int32_t head, int32_t d) {
    return static_cast<uint16_t>(layer * 40009 + p * 20011 + b * 1009 +
                                 t * 101 + head * 67 + d);
  }
  size_t Index(int32_t p, int32_t b, int32_t t, int32_t h, int32_t d) const {
    const KvLayout l = TestLayout();
    return (((static_cast<size_t>(p) * kBlocks + b) * l.block_size + t) *
                heads +
            h) *
               l.head_dim +
           d;
  }
  LayerMemory Memory() {
    const size_t plane = Index(1, 0, 0, 0, 0) * sizeof(uint16_t);
    auto* base = reinterpret_cast<std::byte*>(data.data());
    return {.key = base,
            .value = base + plane,
            .block_stride = Index(0, 1, 0, 0, 0) * sizeof(uint16_t)};
  }
  int32_t heads;
  std::vector<uint16_t> data;
};

// A device tier over `layers`' memory: heads [first_head, +heads).
std::unique_ptr<RegisteredDeviceTier> DeviceOver(
    std::vector<PagedLayer>& layers, int32_t first_head, int32_t heads) {
  RegisteredDeviceOptions o{.layout = TestLayout(),
                            .num_blocks = PagedLayer::kBlocks,
                            .first_head = first_head,
                            .num_heads = heads};
  for (PagedLayer& l : layers) o.layers.push_back(l.Memory());
  return RegisteredDeviceTier::Create(std::move(o)).value();
}

TEST_F(TierkvdRanksTest, TwoRankShardsStoreWhatOneWorkerLoadsWhole) {
  // A second scheduler, whose ranks copy their shard of the heads on
  // their own device tiers (Start, then WaitEvents).
  ClientOptions s = ClientOptionsFor("scheduler2");
  s.copies = CopyMode::kRanks;
  s.ranks = 2;
  scheduler_ = std::move(Client::Open(s).value());
  const KvLayout layout = TestLayout();
  ASSERT_EQ(layout.num_kv_heads, 2);
  std::vector<std::vector<PagedLayer>> shards(2);
  std::vector<std::unique_ptr<RegisteredDeviceTier>> devices;
  std::vector<std::unique_ptr<Client>> ranks;
  for (int32_t r = 0; r < 2; ++r) {
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      shards[r].emplace_back(l, r, 1, /*fill=*/true);
    }
    devices.push_back(DeviceOver(shards[r], r, 1));
    ClientOptions o = ClientOptionsFor("rank" + std::to_string(r));
    o.scheduler = scheduler_->worker_id();
    o.rank = r;
    o.device = devices.back().get();
    StatusOr<std::unique_ptr<Client>> opened = Client::Open(o);
    ASSERT_THAT(opened, IsOk());
    ranks.push_back(std::move(*opened));
  }
  const TransferEvent store = Commit(1);
  for (auto& rank : ranks) {
    ASSERT_THAT(rank->Start(store), IsOk());
    std::vector<FinishedTransfer> done;
    while (done.empty()) done = rank->WaitEvents(std::chrono::seconds(5));
    ASSERT_THAT(done[0].status, IsOk());
    ASSERT_THAT(rank->Complete(done), IsOk());
  }
  // A worker with every head loads both blocks into its blocks 5 and 6.
  std::vector<PagedLayer> whole;
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    whole.emplace_back(l, 0, 2, /*fill=*/false);
  }
  std::unique_ptr<RegisteredDeviceTier> device = DeviceOver(whole, 0, 2);
  ClientOptions o = ClientOptionsFor("reader");
  o.device = device.get();
  std::unique_ptr<Client> reader = std::move(Client::Open(o).value());
  ASSERT_EQ(reader->Lookup(2, tokens_)->hit_tokens, 32);
  const std::vector<BlockId> into{5, 6, 7};
  ASSERT_THAT(reader->Allocate(2, into, 32), IsOk());
  std::vector<FinishedTransfer> done;
  while (done.empty()) done = reader->WaitEvents(std::chrono::seconds(5));
  ASSERT_THAT(done[0].status, IsOk());
  ASSERT_THAT(reader->Complete(done), IsOk());
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    for (int32_t i = 0; i < 2; ++i) {
      for (int32_t p = 0; p < 2; ++p) {
        for (int32_t t = 0; t < layout.block_size; ++t) {
          for (int32_t h = 0; h < 2; ++h) {
            for (int32_t d = 0; d < layout.head_dim; ++d) {
              // Device block 1 + i of the ranks, 5 + i of the reader.
              ASSERT_EQ(whole[l].data[whole[l].Index(p, 5 + i, t, h, d)],
                        PagedLayer::Element(l, p, 1 + i, t, h, d))
                  << "layer " << l << " block " << i << " plane " << p
                  << " token " << t << " head " << h << " dim " << d;
            }
          }
        }
      }
    }
  }
  // The scheduler's own Start is refused; so are blocks out of range.
  EXPECT_THAT(scheduler_->Start(store),
              StatusIs(StatusCode::kFailedPrecondition));
  TransferEvent bad = store;
  bad.device_blocks[0] = 64;
  EXPECT_THAT(ranks[0]->Start(bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TierkvdRanksTest, AnEventStartedTwiceIsCopiedAndCompletedOnce) {
  ClientOptions s = ClientOptionsFor("scheduler2");
  s.copies = CopyMode::kRanks;
  s.ranks = 1;
  scheduler_ = std::move(Client::Open(s).value());
  std::vector<PagedLayer> shard;
  for (int32_t l = 0; l < TestLayout().num_layers; ++l) {
    shard.emplace_back(l, 0, 2, /*fill=*/true);
  }
  std::unique_ptr<RegisteredDeviceTier> device = DeviceOver(shard, 0, 2);
  // The engine pins the event's blocks: each pin must meet its unpin.
  KVCacheManager engine =
      KVCacheManager::Create({.pool = {.num_blocks = PagedLayer::kBlocks,
                                       .block_size = TestLayout().block_size,
                                       .reserve_null_block = true}})
          .value();
  ClientOptions o = ClientOptionsFor("rank0");
  o.scheduler = scheduler_->worker_id();
  o.device = device.get();
  o.engine = &engine;
  std::unique_ptr<Client> rank = std::move(Client::Open(o).value());
  const int32_t free_before = engine.num_free_blocks();

  const TransferEvent store = Commit(1);
  ASSERT_THAT(rank->Start(store), IsOk());
  // The engine hands the same event over again (a retried step): refused,
  // and the first copy goes on.
  EXPECT_THAT(rank->Start(store), StatusIs(StatusCode::kAlreadyExists));
  std::vector<FinishedTransfer> done;
  while (done.empty()) done = rank->WaitEvents(std::chrono::seconds(5));
  ASSERT_EQ(done.size(), 1u);
  ASSERT_THAT(done[0].status, IsOk());
  // Finished but not completed: still refused.
  EXPECT_THAT(rank->Start(store), StatusIs(StatusCode::kAlreadyExists));
  ASSERT_THAT(rank->Complete(done), IsOk());
  EXPECT_EQ(rank->transfers_in_flight(), 0u);
  EXPECT_TRUE(rank->WaitEvents(std::chrono::milliseconds(0)).empty());
  // Every pin was undone: the blocks went back to the engine's free queue.
  EXPECT_EQ(engine.num_free_blocks(), free_before);
  // tierkvd completed the event: a reader loads both blocks.
  ClientOptions r = ClientOptionsFor("reader");
  r.copies = CopyMode::kCaller;
  std::unique_ptr<Client> reader = std::move(Client::Open(r).value());
  EXPECT_EQ(reader->Lookup(2, tokens_)->hit_tokens, 32);
}

TEST_F(TierkvdRanksTest, ARankThatDeclinesFailsTheEventForAll) {
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const TransferEvent store = Commit(1);
  // Rank 0 was not attached when the event came: it declines its part.
  ASSERT_THAT(ranks_[0]->Decline({&store, 1}), IsOk());
  EXPECT_EQ(observer->Stats()->host.events_in_flight, 1u);  // Rank 1's.
  CopyHalf(1, store);  // Completes its part, and tierkvd answers.
  ASSERT_THAT(scheduler_->Finish(1), IsOk());
  const CoordinatorStats settled = observer->Stats().value();
  EXPECT_EQ(settled.host.events_in_flight, 0u);
  EXPECT_EQ(settled.host.pinned_slots, 0);
  // Half a block is never kept.
  EXPECT_EQ(observer->Lookup(9, tokens_)->hit_tokens, 0);
  EXPECT_THAT(scheduler_->Decline({&store, 1}),
              StatusIs(StatusCode::kFailedPrecondition));
}

TEST_F(TierkvdRanksTest,
       ARankNamingAnotherAttachmentIsRefusedBeforeItRegisters) {
  ClientOptions s = ClientOptionsFor("tagged");
  s.copies = CopyMode::kRanks;
  s.ranks = 1;
  s.attachment_tag = "epoch-2";
  std::unique_ptr<Client> tagged = std::move(Client::Open(s).value());
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const size_t workers = observer->Stats()->workers.size();
  ClientOptions o = ClientOptionsFor("rank");
  o.copies = CopyMode::kCaller;
  o.scheduler = tagged->worker_id();
  o.rank = 0;
  // Metadata of an earlier attachment (or of another engine) names this
  // scheduler's id with its own tag: refused, nothing registered.
  o.attachment_tag = "epoch-1";
  StatusOr<std::unique_ptr<Client>> stale = Client::Open(o);
  ASSERT_THAT(stale, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(stale.status().message(), HasSubstr("another tag"));
  EXPECT_EQ(observer->Stats()->workers.size(), workers);
  // The scheduler's own tag, or none: attached.
  o.attachment_tag = "epoch-2";
  StatusOr<std::unique_ptr<Client>> rank = Client::Open(o);
  ASSERT_THAT(rank, IsOk());
  EXPECT_EQ(observer->Stats()->workers.size(), workers + 1);
  // A tagged attachment is never made again under the old tag.
  EXPECT_THAT(tagged->Reconnect(), IsOk());  // Still attached: nothing to do.
  StopDaemon();
  StartDaemon();
  EXPECT_THAT(tagged->Reconnect(), StatusIs(StatusCode::kFailedPrecondition));
}

// A tagged scheduler's attachment ends with its first lost rank: its next
// call is Unavailable, and its client then counts the attachment lost
// (the socket closes, tierkvd releases its pins); a rank cannot attach.
TEST_F(TierkvdRanksTest, ALostRankEndsATaggedAttachment) {
  std::unique_ptr<Client> tagged = TaggedSchedulerThatLostItsRank();
  StatusOr<LookupResult> refused = tagged->Lookup(2, tokens_);
  ASSERT_THAT(refused, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(refused.status().message(), HasSubstr("lost rank 0"));
  EXPECT_FALSE(tagged->connected());
  EXPECT_THAT(tagged->connection_status().message(), HasSubstr("lost rank"));
  EXPECT_THAT(tagged->Lookup(3, tokens_), StatusIs(StatusCode::kUnavailable));
  ASSERT_TRUE(daemon_->WaitForOutput(
      "worker " + std::to_string(tagged->worker_id()) + " (pid"))
      << daemon_->output();
}

// The same end answered inside a batch's reply fails the whole call.
TEST_F(TierkvdRanksTest, ALostRankEndsATaggedAttachmentInABatch) {
  std::unique_ptr<Client> tagged = TaggedSchedulerThatLostItsRank();
  const LookupQuery queries[] = {{.request = 2, .tokens = tokens_},
                                 {.request = 3, .tokens = tokens_}};
  auto refused = tagged->LookupBatch(queries);
  ASSERT_THAT(refused, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(refused.status().message(), HasSubstr("lost rank 0"));
  EXPECT_FALSE(tagged->connected());
  ASSERT_TRUE(daemon_->WaitForOutput(
      "worker " + std::to_string(tagged->worker_id()) + " (pid"))
      << daemon_->output();
}

// A rank tierkvd registers but cannot hand its descriptors (EMFILE at
// the last step) is refused like any other, and its tagged scheduler's
// attachment goes on: a refusal is "try again", not a lost rank.
TEST_F(TierkvdRanksTest, ARankRefusedForWantOfDescriptorsEndsNothing) {
  ClientOptions s = ClientOptionsFor("tagged");
  s.copies = CopyMode::kRanks;
  s.ranks = 1;
  s.attachment_tag = "epoch-1";
  std::unique_ptr<Client> tagged = std::move(Client::Open(s).value());
  ASSERT_THAT(tagged->Lookup(1, tokens_), IsOk());
  ClientOptions o = ClientOptionsFor("rank");
  o.copies = CopyMode::kCaller;
  o.scheduler = tagged->worker_id();
  o.attachment_tag = "epoch-1";
  const pid_t pid = daemon_->pid();
  rlimit before{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &before), 0);
  // Room for the rank's socket, its copy of the host segment's descriptor,
  // its channel segment and readiness pipe (five), none for the two more
  // copies its reply passes.
  rlimit lowered = before;
  lowered.rlim_cur = LimitLeaving(pid, 5);
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &lowered, nullptr), 0)
      << std::strerror(errno);
  StatusOr<std::unique_ptr<Client>> refused = Client::Open(o);
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &before, nullptr), 0);
  ASSERT_THAT(refused, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("cannot pass a descriptor"));
  ASSERT_TRUE(daemon_->WaitForOutput("refused worker pid"))
      << daemon_->output();
  // The rank's place is still open, and the scheduler still served.
  StatusOr<std::unique_ptr<Client>> rank = Client::Open(o);
  ASSERT_THAT(rank, IsOk());
  EXPECT_THAT(tagged->Lookup(2, tokens_), IsOk());
  EXPECT_TRUE(tagged->connected());
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

TEST_F(TierkvdRanksTest, ARankDoesNotReconnectToARestartedTierkvd) {
  StopDaemon();
  StartDaemon(std::to_string(40 * TestLayout().BlockBytes()));
  // The new tierkvd numbers workers from 1 again: the scheduler's old id
  // may name another scheduler there.
  EXPECT_THAT(scheduler_->Reconnect(), IsOk());
  Status again = ranks_[0]->Reconnect();
  EXPECT_THAT(again, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(again.message(), HasSubstr("open a new rank client"));
  // A new rank client for the scheduler's new id is what works.
  EXPECT_THAT(OpenRank(0, CopyMode::kCaller), ::testing::NotNull());
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
