// The coordinator state machine in-process: seed 004's host-side timeline
// (slot ids, ref counts, free-queue order, event ids), pins, the host tier
// full of pinned blocks, a dead worker's pins, validation of what a worker
// sends, the in-flight events with their ages and latencies, and an
// operator's clear and evict. tierkvd_test runs the same flow through real
// processes.
#include "src/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <unordered_map>
#include <vector>

#include "tests/manual_lower_tier.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

KvLayout Layout() { return TestLayout(); }

// Worker "w" of the test layout, with `device_blocks` device blocks.
WorkerRegistration TestWorker(int32_t device_blocks) {
  return {.layout = Layout(),
          .num_device_blocks = device_blocks,
          .tenant = "",
          .pid = 1,
          .name = "w"};
}

std::vector<BlockId> Range(BlockId first, BlockId last) {
  std::vector<BlockId> v;
  for (BlockId b = first; b <= last; ++b) v.push_back(b);
  return v;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  explicit CoordinatorTest(int32_t host_slots = 50,
                           double worker_pin_share = 0.5)
      : c_(Coordinator::Create({.layout = Layout(),
                                .host_slots = host_slots,
                                .clock = [this] { return now_; },
                                .caps = {.worker_pin_share = worker_pin_share}})
               .value()) {}

  WorkerId Register(const std::string& tenant = "",
                    const std::string& name = "w") {
    return c_
        .RegisterWorker({.layout = Layout(),
                         .num_device_blocks = 100,
                         .tenant = tenant,
                         .pid = 1,
                         .name = name})
        .value();
  }
  // Stores `tokens`' full blocks through worker `w` as request `id` and
  // completes the stores. Returns the host slots.
  std::vector<BlockId> StoreAll(WorkerId w, RequestId id,
                                const std::vector<TokenId>& tokens) {
    EXPECT_THAT(c_.Lookup(w, id, tokens, 0, {}), IsOk());
    std::vector<BlockId> device = Range(1, tokens.size() / 16 + 1);
    EXPECT_THAT(c_.Allocate(w, id, device, 0), IsOk());
    CommitResult commit =
        c_.Commit(w, id, static_cast<int32_t>(tokens.size()), device).value();
    std::vector<BlockId> slots;
    for (const TransferEvent& e : commit.stores) {
      slots.insert(slots.end(), e.host_blocks.begin(), e.host_blocks.end());
      std::vector<CompletedEvent> done{{e.ref, true}};
      EXPECT_THAT(c_.Complete(w, done), IsOk());
    }
    EXPECT_THAT(c_.Finish(w, id), IsOk());
    return slots;
  }
  int32_t Ref(BlockId slot) const { return c_.host_pool().block(slot).ref_cnt; }
  std::vector<BlockId> FreeQueue() const {
    return c_.host_pool().FreeQueueSnapshot();
  }

  // The coordinator's clock: moves only when a test advances it.
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  Coordinator c_;
};

// Seed 004 on the host side; tests/seed004_scenario.h explains where the
// inputs differ from the seed.
TEST_F(CoordinatorTest, Seed004HostTimeline) {
  const WorkerId w1 = Register();
  const WorkerId w2 = Register();
  EXPECT_THAT(FreeQueue(), ElementsAreArray(Range(1, 49)));

  // Request A (16 tokens): miss, then a store into host slot 1.
  const std::vector<TokenId> a = SequentialTokens(1, 16);
  EXPECT_EQ(c_.Lookup(w1, 1, a, 0, {}).value().hit_tokens, 0);
  EXPECT_FALSE(c_.Allocate(w1, 1, {{1}}, 0).value().load.has_value());
  CommitResult a_commit = c_.Commit(w1, 1, 16, {{1}}).value();
  ASSERT_EQ(a_commit.stores.size(), 1u);
  EXPECT_EQ(a_commit.stores[0].ref, (EventRef{EventKind::kStore, 0}));
  EXPECT_THAT(a_commit.stores[0].host_blocks, ElementsAre(1));
  EXPECT_EQ(Ref(1), 1);                             // Pinned while written ...
  EXPECT_FALSE(c_.host_pool().block(1).has_key());  // ... and invisible.
  EXPECT_EQ(c_.Lookup(w2, 99, a, 0, {}).value().hit_tokens, 0);
  ASSERT_THAT(c_.Finish(w2, 99), IsOk());
  EXPECT_THAT(FreeQueue(), ElementsAreArray(Range(2, 49)));
  std::vector<CompletedEvent> done{{a_commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(w1, done), IsOk());
  ASSERT_THAT(c_.Finish(w1, 1), IsOk());
  EXPECT_EQ(Ref(1), 0);
  EXPECT_TRUE(c_.host_pool().block(1).has_key());
  std::vector<BlockId> queue = Range(2, 49);
  queue.push_back(1);
  EXPECT_THAT(FreeQueue(), ElementsAreArray(queue));

  // Request B (A's block + 16 more) on worker 2: a hit pins slot 1.
  std::vector<TokenId> b = a;
  for (TokenId t : SequentialTokens(101, 16)) b.push_back(t);
  EXPECT_EQ(c_.Lookup(w2, 2, b, 0, {}).value().hit_tokens, 16);
  EXPECT_EQ(Ref(1), 1);
  EXPECT_THAT(FreeQueue(), ElementsAreArray(Range(2, 49)));
  AllocateResult alloc = c_.Allocate(w2, 2, {{1, 2}}, 16).value();
  ASSERT_TRUE(alloc.load.has_value());
  EXPECT_EQ(alloc.load->ref, (EventRef{EventKind::kLoad, 0}));
  EXPECT_THAT(alloc.load->host_blocks, ElementsAre(1));
  EXPECT_THAT(alloc.load->device_blocks, ElementsAre(1));
  EXPECT_EQ(Ref(1), 1);  // The lookup's pin became the load's.
  CommitResult b_commit = c_.Commit(w2, 2, 32, {{1, 2}}).value();
  ASSERT_EQ(b_commit.stores.size(), 1u);
  EXPECT_EQ(b_commit.stores[0].ref, (EventRef{EventKind::kStore, 0}));
  EXPECT_THAT(b_commit.stores[0].host_blocks, ElementsAre(2));
  EXPECT_THAT(b_commit.stores[0].device_blocks, ElementsAre(2));
  EXPECT_THAT(FreeQueue(), ElementsAreArray(Range(3, 49)));
  std::vector<CompletedEvent> b_done{{alloc.load->ref, true},
                                     {b_commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(w2, b_done), IsOk());
  ASSERT_THAT(c_.Finish(w2, 2), IsOk());
  // Final: [3..49, 1, 2]; 1 is older than 2 and is evicted first.
  queue = Range(3, 49);
  queue.push_back(1);
  queue.push_back(2);
  EXPECT_THAT(FreeQueue(), ElementsAreArray(queue));
  EXPECT_EQ(c_.host_pool().num_cached_blocks(), 2u);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

// Items may share tokens (a video's audio over its frames), but no more
// than a few over one token: many items over every block would make keying
// cost blocks times items under the store's lock. Many that share none are
// served, in any order.
TEST_F(CoordinatorTest, MultimodalItemsOverOneTokenAreBounded) {
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 2048);
  RequestExtras crowd;
  for (int i = 0; i < 2048; ++i) {
    crowd.mm_items.push_back({.hash = {static_cast<uint64_t>(i), 1},
                              .start = 0,
                              .length = static_cast<int64_t>(t.size())});
  }
  StatusOr<LookupResult> refused = c_.Lookup(w, 1, t, 0, crowd);
  ASSERT_THAT(refused, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(refused.status().message(), HasSubstr("cover token"));
  EXPECT_THAT(c_.Route("", t, crowd), StatusIs(StatusCode::kInvalidArgument));
  RequestExtras shared;  // A video [100, 500) and its audio [100, 300).
  shared.mm_items = {{.hash = {1, 1}, .start = 100, .length = 400},
                     {.hash = {2, 2}, .start = 100, .length = 200}};
  EXPECT_THAT(c_.Lookup(w, 2, t, 0, shared), IsOk());
  for (int i = 0; i < 2; ++i) {  // Four over [150, 160): the bound.
    shared.mm_items.push_back(
        {.hash = {3, static_cast<uint64_t>(i)}, .start = 150, .length = 10});
  }
  EXPECT_THAT(c_.Lookup(w, 3, t, 0, shared), IsOk());
  shared.mm_items.push_back({.hash = {4, 4}, .start = 159, .length = 1});
  EXPECT_THAT(c_.Lookup(w, 4, t, 0, shared),
              StatusIs(StatusCode::kInvalidArgument));
  shared.mm_items.back().start = 160;  // Past the four: ends come first.
  EXPECT_THAT(c_.Lookup(w, 5, t, 0, shared), IsOk());
  RequestExtras every_token;
  for (int64_t i = static_cast<int64_t>(t.size()) - 1; i >= 0; --i) {
    every_token.mm_items.push_back(
        {.hash = {static_cast<uint64_t>(i), 2}, .start = i, .length = 1});
  }
  EXPECT_THAT(c_.Lookup(w, 6, t, 0, every_token), IsOk());
}

TEST_F(CoordinatorTest, MaxHitLeavesTheLastTokenToCompute) {
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 32);
  StoreAll(w, 1, t);
  // 32 tokens, both blocks stored: at most 31 may hit, so one block.
  EXPECT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 16);
  // One more token: both blocks hit.
  std::vector<TokenId> t33 = t;
  t33.push_back(7);
  EXPECT_EQ(c_.Lookup(w, 3, t33, 0, {}).value().hit_tokens, 32);
  // Blocks the engine already has are not looked up again.
  EXPECT_EQ(c_.Lookup(w, 4, t33, 16, {}).value().hit_tokens, 16);
}

TEST_F(CoordinatorTest, RepeatedLookupDropsTheEarlierPins) {
  const WorkerId w = Register();
  std::vector<TokenId> t = SequentialTokens(1, 33);
  StoreAll(w, 1, t);
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 32);
  EXPECT_EQ(c_.stats().host.pinned_slots, 2);
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 32);
  EXPECT_EQ(c_.stats().host.pinned_slots, 2);  // Not 4.
  // Unused hits are released by Allocate; Finish releases the rest.
  ASSERT_THAT(c_.Allocate(w, 2, Range(1, 3), 16), IsOk());
  EXPECT_EQ(c_.stats().host.pinned_slots, 1);
  ASSERT_THAT(c_.Finish(w, 2), IsOk());
  EXPECT_EQ(c_.stats().host.pinned_slots, 1);  // The load is in flight.
  EXPECT_EQ(c_.stats().host.events_in_flight, 1u);
}

// A repeated lookup keeps the pins of the blocks whose tokens did not
// change and looks the rest up again: a changed block and those after it
// are released (into the free queue, as a fresh lookup would leave them),
// an extra key (cache salt) or a chunk lookup in between means nothing is
// kept, and num_computed_tokens moving starts the run anew.
TEST_F(CoordinatorTest, RepeatedLookupKeepsOnlyWhatDidNotChange) {
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 65);  // 4 blocks + 1.
  const std::vector<BlockId> slots = StoreAll(w, 1, t);
  ASSERT_EQ(slots.size(), 4u);
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  EXPECT_EQ(c_.stats().host.pinned_slots, 4);

  std::vector<TokenId> changed = t;
  changed[40] = 999'999;  // In block 2.
  ASSERT_EQ(c_.Lookup(w, 2, changed, 0, {}).value().hit_tokens, 32);
  EXPECT_EQ(c_.stats().host.pinned_slots, 2);
  for (int b : {0, 1}) EXPECT_EQ(Ref(slots[b]), 1) << b;
  for (int b : {2, 3}) EXPECT_EQ(Ref(slots[b]), 0) << b;
  // Back to the stored tokens: all four hit again, pinned once each.
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  for (BlockId slot : slots) EXPECT_EQ(Ref(slot), 1);

  const RequestExtras salted{
      .lora_id = std::nullopt, .mm_items = {}, .cache_salt = "salt"};
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, salted).value().hit_tokens, 0);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  ASSERT_EQ(c_.LookupChunk(w, 2, t).value().hit_tokens, 0);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  // From block 1 on: three hits, block 0 released.
  ASSERT_EQ(c_.Lookup(w, 2, t, 16, {}).value().hit_tokens, 48);
  EXPECT_EQ(Ref(slots[0]), 0);
  EXPECT_EQ(c_.stats().host.pinned_slots, 3);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

// A lookup sent as what changed (LookupAgain: the first kept_tokens of the
// request's last tokens, named by their tag, then the rest) finds what a
// lookup of all the tokens finds, pins the same slots, and names its
// tokens anew; a tag that no longer names the request's tokens is Aborted
// with nothing changed, so the caller can send them all.
TEST_F(CoordinatorTest, LookupAgainIsALookupOfTheKeptTokensAndTheRest) {
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 65);  // 4 blocks + 1.
  const std::vector<BlockId> slots = StoreAll(w, 1, t);
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(c_.TokensTag(w, 2), 0u);  // Never asked.
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  const uint64_t tag = c_.TokensTag(w, 2);
  ASSERT_NE(tag, 0u);
  auto tail = [&](const std::vector<TokenId>& tokens, size_t kept) {
    return std::span(tokens).subspan(kept);
  };
  // Unchanged, all kept: the same hits and pins.
  ASSERT_EQ(c_.LookupAgain(w, 2, 65, tag, {}, 0, {}).value().hit_tokens, 64);
  for (BlockId slot : slots) EXPECT_EQ(Ref(slot), 1);
  const uint64_t tag2 = c_.TokensTag(w, 2);
  EXPECT_NE(tag2, tag);
  // The old tag no longer names them: Aborted, nothing changed.
  EXPECT_THAT(c_.LookupAgain(w, 2, 65, tag, {}, 0, {}),
              StatusIs(StatusCode::kAborted));
  EXPECT_EQ(c_.TokensTag(w, 2), tag2);
  EXPECT_EQ(c_.stats().host.pinned_slots, 4);
  // Changed from token 40 (block 2) on: two hits, as a full lookup.
  std::vector<TokenId> changed = t;
  changed[40] = 999'999;
  ASSERT_EQ(c_.LookupAgain(w, 2, 40, tag2, tail(changed, 40), 0, {})
                .value()
                .hit_tokens,
            32);
  for (int b : {0, 1}) EXPECT_EQ(Ref(slots[b]), 1) << b;
  for (int b : {2, 3}) EXPECT_EQ(Ref(slots[b]), 0) << b;
  // Back, kept up to the middle of block 1: four hits again.
  ASSERT_EQ(c_.LookupAgain(w, 2, 20, c_.TokensTag(w, 2), tail(t, 20), 0, {})
                .value()
                .hit_tokens,
            64);
  for (BlockId slot : slots) EXPECT_EQ(Ref(slot), 1);
  // Shorter: 33 tokens kept of 65, nothing appended: two full blocks hit.
  ASSERT_EQ(c_.LookupAgain(w, 2, 33, c_.TokensTag(w, 2), {}, 0, {})
                .value()
                .hit_tokens,
            32);
  EXPECT_EQ(c_.stats().host.pinned_slots, 2);
  // More kept than the request keeps, or a malformed result: refused.
  EXPECT_THAT(c_.LookupAgain(w, 2, 34, c_.TokensTag(w, 2), {}, 0, {}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(c_.LookupAgain(w, 2, 33, c_.TokensTag(w, 2), {}, 48, {}),
              StatusIs(StatusCode::kInvalidArgument));
  // With extra keys (a salt) nothing is kept: a miss, as a full lookup.
  const RequestExtras salted{
      .lora_id = std::nullopt, .mm_items = {}, .cache_salt = "salt"};
  ASSERT_EQ(c_.LookupAgain(w, 2, 33, c_.TokensTag(w, 2), tail(t, 33), 0, salted)
                .value()
                .hit_tokens,
            0);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  ASSERT_EQ(c_.LookupAgain(w, 2, 65, c_.TokensTag(w, 2), {}, 0, {})
                .value()
                .hit_tokens,
            64);
  // A chunk lookup keeps other tokens: no tag, Aborted.
  const uint64_t before_chunk = c_.TokensTag(w, 2);
  ASSERT_THAT(c_.LookupChunk(w, 2, t), IsOk());
  EXPECT_EQ(c_.TokensTag(w, 2), 0u);
  EXPECT_THAT(c_.LookupAgain(w, 2, 65, before_chunk, {}, 0, {}),
              StatusIs(StatusCode::kAborted));
  EXPECT_THAT(c_.LookupAgain(w, 2, 1, 0, {}, 0, {}),
              StatusIs(StatusCode::kAborted));  // Tag 0 names nothing.
  // Finished: Aborted.
  ASSERT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
  const uint64_t last = c_.TokensTag(w, 2);
  ASSERT_THAT(c_.Finish(w, 2), IsOk());
  EXPECT_THAT(c_.LookupAgain(w, 2, 65, last, {}, 0, {}),
              StatusIs(StatusCode::kAborted));
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

// Randomized: a client that sends only what changed (as Client::Lookup
// does) sees exactly what a client sending all its tokens sees, on two
// coordinators holding the same blocks.
TEST(CoordinatorLookupAgainTest, MatchesFullLookupsUnderRandomEdits) {
  std::mt19937 rng(20261125);
  auto make = [] {
    return Coordinator::Create({.layout = Layout(), .host_slots = 64}).value();
  };
  Coordinator full = make(), delta = make();
  auto worker = [](Coordinator& c) {
    return c.RegisterWorker(TestWorker(100)).value();
  };
  const WorkerId wf = worker(full), wd = worker(delta);
  // The same stored prompt in both: 8 blocks.
  const std::vector<TokenId> stored = SequentialTokens(1, 129);
  for (auto [c, w] : {std::pair{&full, wf}, std::pair{&delta, wd}}) {
    ASSERT_THAT(c->Lookup(w, 1, stored, 0, {}), IsOk());
    const std::vector<BlockId> device = Range(1, 9);
    ASSERT_THAT(c->Allocate(w, 1, device, 0), IsOk());
    const CommitResult commit = c->Commit(w, 1, 129, device).value();
    for (const TransferEvent& e : commit.stores) {
      const std::vector<CompletedEvent> done{{e.ref, true}};
      ASSERT_THAT(c->Complete(w, done), IsOk());
    }
    ASSERT_THAT(c->Finish(w, 1), IsOk());
  }
  std::vector<TokenId> tokens(stored.begin(), stored.begin() + 40);
  std::vector<TokenId> sent;  // What the delta side's coordinator keeps.
  uint64_t tag = 0;
  int with_hits = 0, sent_little = 0;  // That the test covers what it says.
  for (int step = 0; step < 400; ++step) {
    switch (rng() % 4) {
      case 0:  // Grows by stored tokens (a request whose prompt arrives).
        tokens.resize(
            std::min<size_t>(stored.size(), tokens.size() + 1 + rng() % 20));
        std::copy(stored.begin(), stored.begin() + tokens.size(),
                  tokens.begin());
        break;
      case 1:  // One token changed.
        tokens[rng() % tokens.size()] = static_cast<TokenId>(rng() % 1000);
        break;
      case 2:  // Cut.
        tokens.resize(1 + rng() % tokens.size());
        break;
      default:  // Asked again unchanged.
        break;
    }
    const int32_t computed =
        static_cast<int32_t>(rng() % ((tokens.size() - 1) / 16 + 1)) * 16;
    const StatusOr<LookupResult> a = full.Lookup(wf, 2, tokens, computed, {});
    size_t kept = 0;
    while (kept < std::min(sent.size(), tokens.size()) &&
           sent[kept] == tokens[kept]) {
      ++kept;
    }
    const StatusOr<LookupResult> b =
        tag != 0
            ? delta.LookupAgain(wd, 2, static_cast<uint32_t>(kept), tag,
                                std::span(tokens).subspan(kept), computed, {})
            : delta.Lookup(wd, 2, tokens, computed, {});
    ASSERT_EQ(a.ok(), b.ok()) << step;
    if (!a.ok()) continue;
    ASSERT_EQ(a->hit_tokens, b->hit_tokens) << step;
    with_hits += a->hit_tokens > 0;
    sent_little += tag != 0 && kept >= tokens.size() / 2;
    ASSERT_EQ(full.stats().host.pinned_slots, delta.stats().host.pinned_slots)
        << step;
    sent = tokens;
    tag = delta.TokensTag(wd, 2);
    ASSERT_NE(tag, 0u);
  }
  EXPECT_GT(with_hits, 50);
  EXPECT_GT(sent_little, 100);
  EXPECT_THAT(delta.host_pool().CheckInvariants(), IsOk());
}

// The free queue after a repeated lookup is the one a finished lookup and
// a fresh one leave: keeping pins changes no eviction order.
TEST(CoordinatorRepeatedLookupTest, LeavesTheFreeQueueAsAFreshOne) {
  const std::vector<TokenId> t = SequentialTokens(1, 97);  // 6 blocks + 1.
  std::vector<TokenId> changed = t;
  changed[50] = 999'999;  // In block 3.
  auto free_queue_after = [&](bool repeated) {
    Coordinator c =
        Coordinator::Create({.layout = Layout(), .host_slots = 50}).value();
    const WorkerId w = c.RegisterWorker(TestWorker(100)).value();
    EXPECT_THAT(c.Lookup(w, 1, t, 0, {}), IsOk());
    const std::vector<BlockId> device = Range(1, 7);
    EXPECT_THAT(c.Allocate(w, 1, device, 0), IsOk());
    const CommitResult commit = c.Commit(w, 1, 97, device).value();
    for (const TransferEvent& e : commit.stores) {
      const std::vector<CompletedEvent> done{{e.ref, true}};
      EXPECT_THAT(c.Complete(w, done), IsOk());
    }
    EXPECT_THAT(c.Finish(w, 1), IsOk());
    EXPECT_EQ(c.Lookup(w, 2, t, 0, {}).value().hit_tokens, 96);
    if (!repeated) {
      EXPECT_THAT(c.Finish(w, 2), IsOk());
    }
    EXPECT_EQ(c.Lookup(w, repeated ? 2 : 3, changed, 0, {}).value().hit_tokens,
              48);
    return c.host_pool().FreeQueueSnapshot();
  };
  EXPECT_EQ(free_queue_after(/*repeated=*/true),
            free_queue_after(/*repeated=*/false));
}

// A chunk of 40 tokens: two full blocks and a partial one of 8, stored by
// one worker and loaded whole by another; prefix lookups never see it.
TEST_F(CoordinatorTest, ChunkIsStoredAndLoadedWholeIncludingItsPartialBlock) {
  const WorkerId a = Register();
  const WorkerId b = Register();
  const std::vector<TokenId> chunk = SequentialTokens(100, 40);
  ASSERT_EQ(c_.LookupChunk(a, 1, chunk).value().hit_tokens, 0);
  ASSERT_THAT(c_.Allocate(a, 1, Range(10, 12), 0), IsOk());
  // 32 tokens computed: only the full blocks are ready.
  CommitResult part = c_.Commit(a, 1, 32, Range(10, 12)).value();
  ASSERT_EQ(part.stores.size(), 1u);
  EXPECT_THAT(part.stores[0].device_blocks, ElementsAre(10, 11));
  // The whole chunk: the partial block follows.
  CommitResult rest = c_.Commit(a, 1, 40, Range(10, 12)).value();
  ASSERT_EQ(rest.stores.size(), 1u);
  EXPECT_THAT(rest.stores[0].device_blocks, ElementsAre(12));
  const std::vector<CompletedEvent> done{{part.stores[0].ref, true},
                                         {rest.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(a, done), IsOk());
  ASSERT_THAT(c_.Finish(a, 1), IsOk());
  EXPECT_EQ(c_.stats().host.cached_slots, 3);

  // Every token of the chunk may hit, the partial block included.
  const LookupResult hit = c_.LookupChunk(b, 7, chunk).value();
  EXPECT_EQ(hit.hit_tokens, 40);
  EXPECT_EQ(c_.stats().host.pinned_slots, 3);
  // A load ends mid-block only at the chunk's end.
  EXPECT_EQ(c_.Allocate(b, 7, Range(20, 22), 36).status().code(),
            StatusCode::kInvalidArgument);
  AllocateResult load = c_.Allocate(b, 7, Range(20, 22), 40).value();
  ASSERT_TRUE(load.load.has_value());
  EXPECT_FALSE(load.load_pending);
  EXPECT_THAT(load.load->device_blocks, ElementsAre(20, 21, 22));
  EXPECT_THAT(
      load.load->host_blocks,
      ElementsAre(part.stores[0].host_blocks[0], part.stores[0].host_blocks[1],
                  rest.stores[0].host_blocks[0]));
  const std::vector<CompletedEvent> loaded{{load.load->ref, true}};
  ASSERT_THAT(c_.Complete(b, loaded), IsOk());
  ASSERT_THAT(c_.Finish(b, 7), IsOk());
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);

  // The same tokens as a prompt: prefix keys, not chunk keys.
  std::vector<TokenId> prompt = chunk;
  prompt.push_back(1);
  EXPECT_EQ(c_.Lookup(b, 8, prompt, 0, {}).value().hit_tokens, 0);
  // A chunk that differs only in its partial block misses there.
  std::vector<TokenId> other = chunk;
  other.back() += 1;
  EXPECT_EQ(c_.LookupChunk(b, 9, other).value().hit_tokens, 32);
  // A chunk one token shorter is another chunk from its partial block on.
  const std::vector<TokenId> shorter(chunk.begin(), chunk.end() - 1);
  EXPECT_EQ(c_.LookupChunk(b, 10, shorter).value().hit_tokens, 32);
}

TEST_F(CoordinatorTest, ChunkShorterThanABlockIsOneBlock) {
  const WorkerId w = Register();
  const std::vector<TokenId> chunk = SequentialTokens(5, 3);
  ASSERT_EQ(c_.LookupChunk(w, 1, chunk).value().hit_tokens, 0);
  ASSERT_THAT(c_.Allocate(w, 1, Range(1, 1), 0), IsOk());
  EXPECT_TRUE(c_.Commit(w, 1, 2, Range(1, 1)).value().stores.empty());
  CommitResult commit = c_.Commit(w, 1, 3, Range(1, 1)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  const std::vector<CompletedEvent> done{{commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(w, done), IsOk());
  ASSERT_THAT(c_.Finish(w, 1), IsOk());
  EXPECT_EQ(c_.LookupChunk(w, 2, chunk).value().hit_tokens, 3);
  EXPECT_EQ(c_.LookupChunk(w, 3, std::vector<TokenId>{}).status().code(),
            StatusCode::kInvalidArgument);
}

// A chunk published at one virtual start is a miss at another (its KV
// holds other rotations) and a hit at its own; a start outside the RoPE
// positions tierkv remaps is refused.
TEST_F(CoordinatorTest, ChunksAtAnotherVirtualStartAreMisses) {
  const WorkerId w = Register();
  const std::vector<TokenId> chunk = SequentialTokens(5, 20);
  const CommitResult commit =
      c_.PublishChunk(w, 1, chunk, Range(1, 2), /*virtual_start=*/100).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  ASSERT_EQ(commit.stores[0].host_blocks.size(), 2u);  // One partial.
  const std::vector<CompletedEvent> done{{commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(w, done), IsOk());
  EXPECT_EQ(c_.LookupChunk(w, 2, chunk, 100).value().hit_tokens, 20);
  EXPECT_EQ(c_.LookupChunk(w, 3, chunk, 0).value().hit_tokens, 0);
  EXPECT_EQ(c_.LookupChunk(w, 4, chunk, 101).value().hit_tokens, 0);
  EXPECT_FALSE(c_.FetchChunk(w, 5, chunk, 0).value().result.load.has_value());
  EXPECT_TRUE(c_.FetchChunk(w, 6, chunk, 100).value().result.load.has_value());
  for (int64_t bad : {int64_t{-1}, int64_t{1} << 48}) {
    EXPECT_EQ(c_.LookupChunk(w, 7, chunk, bad).status().code(),
              StatusCode::kInvalidArgument);
  }
}

TEST_F(CoordinatorTest, TenantsDoNotShareBlocks) {
  const WorkerId a = Register("tenant-a");
  const WorkerId b = Register("tenant-b");
  std::vector<TokenId> t = SequentialTokens(1, 33);
  StoreAll(a, 1, t);
  EXPECT_EQ(c_.Lookup(a, 2, t, 0, {}).value().hit_tokens, 32);
  EXPECT_EQ(c_.Lookup(b, 2, t, 0, {}).value().hit_tokens, 0);
}

// Each worker may pin every slot: the host itself runs out (the caps that
// keep a worker to its share are WorkerQuotaTest's).
class SmallHostTest : public CoordinatorTest {
 protected:
  SmallHostTest()
      : CoordinatorTest(/*host_slots=*/5, /*worker_pin_share=*/1.0) {}
};

TEST_F(SmallHostTest, FullOfPinnedBlocksStoresNothingThenRecovers) {
  const WorkerId w1 = Register();
  const WorkerId w2 = Register();
  // Worker 1 is writing all 4 slots.
  const std::vector<TokenId> t = SequentialTokens(1, 64);
  ASSERT_THAT(c_.Lookup(w1, 1, t, 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w1, 1, Range(1, 4), 0), IsOk());
  CommitResult busy = c_.Commit(w1, 1, 64, Range(1, 4)).value();
  ASSERT_EQ(busy.stores.size(), 1u);
  EXPECT_EQ(busy.stores[0].host_blocks.size(), 4u);
  EXPECT_EQ(c_.stats().host.pinned_slots, 4);

  // Worker 2 is told that nothing can be stored now, and stores nothing.
  const std::vector<TokenId> u = SequentialTokens(1000, 32);
  ASSERT_THAT(c_.Lookup(w2, 2, u, 0, {}), IsOk());
  AllocateResult alloc = c_.Allocate(w2, 2, Range(1, 2), 0).value();
  EXPECT_EQ(alloc.store_status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(alloc.store_status.message(), HasSubstr("nothing can be stored"));
  CommitResult none = c_.Commit(w2, 2, 32, Range(1, 2)).value();
  EXPECT_TRUE(none.stores.empty());
  EXPECT_EQ(none.skipped_blocks, 2);
  ASSERT_THAT(c_.Finish(w2, 2), IsOk());

  // The pins go; storing works again (evicting worker 1's blocks, LRU).
  std::vector<CompletedEvent> done{{busy.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(w1, done), IsOk());
  EXPECT_EQ(StoreAll(w2, 3, u).size(), 2u);
  EXPECT_EQ(c_.stats().host.evictions, 2u);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(CoordinatorTest, DroppedWorkerReleasesPinsAndPublishesNothing) {
  const WorkerId w = Register();
  const WorkerId other = Register();
  std::vector<TokenId> stored = SequentialTokens(1, 33);
  StoreAll(other, 1, stored);
  const int64_t free_before = c_.stats().host.free_slots;

  // Worker w: a hit pinned by a lookup, a load in flight, a store in flight.
  ASSERT_EQ(c_.Lookup(w, 5, stored, 0, {}).value().hit_tokens, 32);
  std::vector<TokenId> fresh = SequentialTokens(500, 48);
  ASSERT_THAT(c_.Lookup(w, 6, fresh, 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w, 6, Range(1, 3), 0), IsOk());
  CommitResult writing = c_.Commit(w, 6, 48, Range(1, 3)).value();
  ASSERT_EQ(writing.stores.size(), 1u);
  EXPECT_LT(c_.stats().host.free_slots, free_before);

  ASSERT_THAT(c_.DropWorker(w), IsOk());
  EXPECT_EQ(c_.stats().host.free_slots, free_before);
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  // The slots it was writing never became visible.
  std::vector<TokenId> fresh49 = fresh;
  fresh49.push_back(1);
  EXPECT_EQ(c_.Lookup(other, 7, fresh49, 0, {}).value().hit_tokens, 0);
  EXPECT_EQ(c_.DropWorker(w).code(), StatusCode::kNotFound);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(CoordinatorTest, FailedStoreLeavesTheSlotUnkeyed) {
  const WorkerId w = Register();
  std::vector<TokenId> t = SequentialTokens(1, 17);
  ASSERT_THAT(c_.Lookup(w, 1, t, 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w, 1, Range(1, 2), 0), IsOk());
  CommitResult commit = c_.Commit(w, 1, 17, Range(1, 2)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  std::vector<CompletedEvent> failed{{commit.stores[0].ref, false}};
  ASSERT_THAT(c_.Complete(w, failed), IsOk());
  EXPECT_EQ(c_.stats().host.cached_slots, 0);
  EXPECT_EQ(c_.stats().host.stores_failed, 1u);
  EXPECT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 0);
}

// A commit naming one device block for two of a request's blocks would
// store that block's KV under both keys, and serve it to every worker for
// the other block's tokens: refused, nothing stored, and the request goes
// on with a list that names each block once.
TEST_F(CoordinatorTest, ACommitNamingADeviceBlockTwiceStoresNothing) {
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 48);
  ASSERT_THAT(c_.Lookup(w, 1, t, 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w, 1, {{1, 1, 2}}, 0), IsOk());
  for (const std::vector<BlockId>& twice :
       {std::vector<BlockId>{1, 1, 2}, std::vector<BlockId>{3, 2, 3}}) {
    StatusOr<CommitResult> commit = c_.Commit(w, 1, 48, twice);
    EXPECT_EQ(commit.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(commit.status().message(), HasSubstr("named twice"));
  }
  EXPECT_EQ(c_.stats().host.events_in_flight, 0u);
  // The same blocks, each named once, are taken.
  CommitResult commit = c_.Commit(w, 1, 48, Range(1, 3)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  EXPECT_EQ(commit.stores[0].device_blocks, Range(1, 3));
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(CoordinatorTest, RejectsWhatAWorkerMayNotSay) {
  const WorkerId w1 = Register();
  const WorkerId w2 = Register();
  std::vector<TokenId> t = SequentialTokens(1, 32);
  ASSERT_THAT(c_.Lookup(w1, 1, t, 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w1, 1, Range(1, 2), 0), IsOk());
  CommitResult commit = c_.Commit(w1, 1, 32, Range(1, 2)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  const EventRef ref = commit.stores[0].ref;

  // Another worker's event id.
  std::vector<CompletedEvent> theirs{{ref, true}};
  Status s = c_.Complete(w2, theirs);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("not in flight for worker"));
  // The same event twice in one call: nothing is applied.
  std::vector<CompletedEvent> twice{{ref, true}, {ref, true}};
  EXPECT_EQ(c_.Complete(w1, twice).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.stats().host.events_in_flight, 1u);
  // Out-of-range device blocks, bad token counts, unknown requests.
  ASSERT_THAT(c_.Lookup(w1, 2, t, 0, {}), IsOk());
  EXPECT_EQ(c_.Allocate(w1, 2, {{1, 100}}, 0).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(c_.Allocate(w1, 2, {{1, -1}}, 0).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(c_.Allocate(w1, 2, {{1, 2}}, 16).status().code(),
            StatusCode::kInvalidArgument);  // Beyond the hit.
  EXPECT_EQ(c_.Lookup(w1, 3, {}, 0, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.Lookup(w1, 3, t, 5, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.Commit(w1, 42, 16, {{1}}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.Finish(w1, 42).code(), StatusCode::kNotFound);
  EXPECT_EQ(c_.Lookup(77, 1, t, 0, {}).status().code(), StatusCode::kNotFound);
  // A completion still works after all that.
  std::vector<CompletedEvent> mine{{ref, true}};
  EXPECT_THAT(c_.Complete(w1, mine), IsOk());
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(CoordinatorTest, EventsAreListedOldestFirstUntilCompleted) {
  const WorkerId a = Register("", "engine-a");
  const WorkerId b = Register("", "engine-b");
  const std::vector<TokenId> stored = SequentialTokens(1, 16);
  StoreAll(a, 1, stored);  // Completed at once: a store latency of 0.
  EXPECT_TRUE(c_.events().empty());

  // t = 0: worker b stores two blocks.
  ASSERT_THAT(c_.Lookup(b, 7, SequentialTokens(500, 32), 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(b, 7, Range(1, 2), 0), IsOk());
  const CommitResult b_store =
      c_.Commit(b, 7, 32, Range(1, 2)).value();  // b's store 0.
  ASSERT_EQ(b_store.stores.size(), 1u);
  // t = 1 ms: worker a loads the stored block ...
  now_ += microseconds(1000);
  std::vector<TokenId> longer = stored;
  for (TokenId t : SequentialTokens(900, 17)) longer.push_back(t);
  ASSERT_EQ(c_.Lookup(a, 2, longer, 0, {}).value().hit_tokens, 16);
  const AllocateResult a_load = c_.Allocate(a, 2, Range(1, 3), 16).value();
  ASSERT_TRUE(a_load.load.has_value());
  // ... and at t = 3 ms stores the one it computed.
  now_ += microseconds(2000);
  const CommitResult a_store = c_.Commit(a, 2, 33, Range(1, 3)).value();
  ASSERT_EQ(a_store.stores.size(), 1u);

  now_ += microseconds(500);
  const std::vector<EventInfo> events = c_.events();
  ASSERT_EQ(events.size(), 3u);
  // Oldest first, whichever worker it belongs to.
  EXPECT_EQ(events[0].worker, b);
  EXPECT_EQ(events[0].worker_name, "engine-b");
  EXPECT_EQ(events[0].ref, (EventRef{EventKind::kStore, 0}));
  EXPECT_EQ(events[0].request, 7u);
  EXPECT_EQ(events[0].blocks, 2u);
  EXPECT_EQ(events[0].state, EventState::kCopying);
  EXPECT_EQ(events[0].age_us, 3500u);
  EXPECT_EQ(events[1].worker, a);
  EXPECT_EQ(events[1].worker_name, "engine-a");
  EXPECT_EQ(events[1].ref, a_load.load->ref);
  EXPECT_EQ(events[1].ref.kind, EventKind::kLoad);
  EXPECT_EQ(events[1].request, 2u);
  EXPECT_EQ(events[1].blocks, 1u);
  EXPECT_EQ(events[1].age_us, 2500u);
  EXPECT_EQ(events[2].ref, a_store.stores[0].ref);
  EXPECT_EQ(events[2].age_us, 500u);
  EXPECT_EQ(c_.stats().oldest_event_age_us, 3500u);

  // Complete drops an event from the list and records its latency.
  const std::vector<CompletedEvent> loaded{{a_load.load->ref, true}};
  ASSERT_THAT(c_.Complete(a, loaded), IsOk());
  std::vector<EventInfo> left = c_.events();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].worker, b);
  EXPECT_EQ(left[1].ref, a_store.stores[0].ref);
  CoordinatorStats s = c_.stats();
  EXPECT_EQ(s.load_latency.count, 1u);
  EXPECT_EQ(s.load_latency.sum_us, 2500u);
  EXPECT_EQ(s.load_latency.buckets[2], 1u);  // Within 5 ms.
  EXPECT_EQ(s.store_latency.count, 1u);      // StoreAll's.
  EXPECT_EQ(s.store_latency.buckets[0], 1u);

  // A failed copy completes too; then nothing is in flight.
  now_ += microseconds(2'000'000);
  const std::vector<CompletedEvent> b_done{{b_store.stores[0].ref, false}};
  const std::vector<CompletedEvent> a_done{{a_store.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(b, b_done), IsOk());
  ASSERT_THAT(c_.Complete(a, a_done), IsOk());
  EXPECT_TRUE(c_.events().empty());
  s = c_.stats();
  EXPECT_EQ(s.oldest_event_age_us, 0u);
  EXPECT_EQ(s.store_latency.count, 3u);
  EXPECT_EQ(s.store_latency.sum_us, 2'003'500u + 2'000'500u);
  EXPECT_EQ(s.store_latency.buckets[7], 2u);  // Within 10 s.
}

TEST_F(CoordinatorTest, ADroppedWorkersEventsLeaveTheList) {
  const WorkerId w = Register();
  ASSERT_THAT(c_.Lookup(w, 1, SequentialTokens(1, 32), 0, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w, 1, Range(1, 2), 0), IsOk());
  ASSERT_EQ(c_.Commit(w, 1, 32, Range(1, 2)).value().stores.size(), 1u);
  EXPECT_EQ(c_.events().size(), 1u);
  ASSERT_THAT(c_.DropWorker(w), IsOk());
  EXPECT_TRUE(c_.events().empty());
  EXPECT_EQ(c_.stats().store_latency.count, 0u);  // Never completed.
}

TEST(CoordinatorLatencyTest, BucketsTakeTheirUpperBound) {
  EventLatency l;
  l.Record(0);
  l.Record(100);         // 100 us: the first bucket's bound.
  l.Record(101);         // Just above it.
  l.Record(20'000'000);  // 20 s: past every bound.
  EXPECT_EQ(l.buckets[0], 2u);
  EXPECT_EQ(l.buckets[1], 1u);
  EXPECT_EQ(l.buckets[EventLatency::kBuckets - 1], 1u);
  EXPECT_EQ(l.count, 4u);
  EXPECT_EQ(l.sum_us, 20'000'201u);
}

std::vector<TokenId> WithOneMore(std::vector<TokenId> tokens) {
  tokens.push_back(7);
  return tokens;
}

TEST_F(CoordinatorTest, ClearHostDropsUnpinnedBlocksAndKeepsPinnedOnes) {
  const WorkerId w = Register();
  const std::vector<TokenId> a = SequentialTokens(1, 48);
  const std::vector<TokenId> b = SequentialTokens(1001, 32);
  ASSERT_EQ(StoreAll(w, 1, a).size(), 3u);
  ASSERT_EQ(StoreAll(w, 2, b).size(), 2u);
  // A lookup pins b's two blocks.
  ASSERT_EQ(c_.Lookup(w, 3, WithOneMore(b), 0, {}).value().hit_tokens, 32);

  const ClearResult cleared = c_.Clear(TierSelection::kHost).value();
  EXPECT_EQ(cleared.host_dropped, 3u);
  EXPECT_EQ(cleared.host_kept_pinned, 2u);
  EXPECT_EQ(cleared.disk_dropped, 0u);
  EXPECT_FALSE(cleared.disk_cleared);
  const HostTierStats h = c_.stats().host;
  EXPECT_EQ(h.cached_slots, 2);
  EXPECT_EQ(h.evictions, 0u);  // An operator's drop is not an eviction.
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());

  ASSERT_THAT(c_.Finish(w, 3), IsOk());
  EXPECT_EQ(c_.Lookup(w, 4, WithOneMore(a), 0, {}).value().hit_tokens, 0);
  EXPECT_EQ(c_.Lookup(w, 5, WithOneMore(b), 0, {}).value().hit_tokens, 32);
  ASSERT_THAT(c_.Finish(w, 5), IsOk());
  // Unpinned now: a second clear takes them, and then every lookup misses.
  EXPECT_EQ(c_.Clear(TierSelection::kAll).value().host_dropped, 2u);
  EXPECT_EQ(c_.Lookup(w, 6, WithOneMore(b), 0, {}).value().hit_tokens, 0);
  EXPECT_EQ(c_.stats().host.cached_slots, 0);
}

TEST_F(CoordinatorTest, ClearDiskWithoutALowerTierIsRefused) {
  StatusOr<ClearResult> cleared = c_.Clear(TierSelection::kDisk);
  ASSERT_EQ(cleared.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(cleared.status().message(), HasSubstr("no disk tier"));
}

// What an operator reads per evicted key: every tier it left, in order.
TEST(EvictedBlockSummaryTest, NamesEveryTierTheBlockLeft) {
  EXPECT_EQ(EvictedBlockSummary({.key = {},
                                 .host_dropped = true,
                                 .disk_dropped = true,
                                 .remote_dropped = true}),
            "dropped from host, disk and remote");
  EXPECT_EQ(EvictedBlockSummary(
                {.key = {}, .host_dropped = true, .disk_dropped = true}),
            "dropped from host and disk");
  EXPECT_EQ(EvictedBlockSummary({.key = {}, .remote_dropped = true}),
            "dropped from remote");
  EXPECT_EQ(EvictedBlockSummary(
                {.key = {}, .host_pinned = true, .disk_dropped = true}),
            "pinned, kept; dropped from disk");
  EXPECT_EQ(EvictedBlockSummary({}), "not cached");
}

TEST_F(CoordinatorTest, EvictDropsOnlyTheNamedBlocksAndKeepsPinnedOnes) {
  const WorkerId w = Register();
  const std::vector<TokenId> a = SequentialTokens(1, 48);
  const std::vector<BlockId> slots = StoreAll(w, 1, a);
  ASSERT_EQ(slots.size(), 3u);
  std::vector<BlockKey> keys;
  for (BlockId s : slots) keys.push_back(c_.host_pool().block(s).key);
  const BlockKey unknown{0x1234, 0x5678};

  const BlockKey evicted[] = {keys[1], unknown};
  std::vector<EvictedBlock> result = c_.Evict(evicted);
  ASSERT_EQ(result.size(), 2u);
  EXPECT_EQ(result[0], (EvictedBlock{.key = keys[1], .host_dropped = true}));
  EXPECT_EQ(result[1], (EvictedBlock{.key = unknown}));
  EXPECT_EQ(EvictedBlockSummary(result[0]), "dropped from host");
  EXPECT_EQ(EvictedBlockSummary(result[1]), "not cached");
  EXPECT_EQ(c_.stats().host.cached_slots, 2);
  EXPECT_EQ(c_.stats().host.evictions, 0u);
  // The prefix now stops before the dropped block.
  EXPECT_EQ(c_.Lookup(w, 2, WithOneMore(a), 0, {}).value().hit_tokens, 16);

  // Block 0 is pinned by that lookup: kept.
  const BlockKey pinned[] = {keys[0]};
  result = c_.Evict(pinned);
  EXPECT_EQ(result[0], (EvictedBlock{.key = keys[0], .host_pinned = true}));
  EXPECT_EQ(EvictedBlockSummary(result[0]), "pinned, kept");
  ASSERT_THAT(c_.Finish(w, 2), IsOk());
  EXPECT_TRUE(c_.Evict(pinned)[0].host_dropped);
  EXPECT_EQ(c_.Lookup(w, 3, WithOneMore(a), 0, {}).value().hit_tokens, 0);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

// Route says what a lookup by a worker of the tenant would find now and
// which of the tenant's workers are attached, without pinning or counting
// anything.
TEST_F(CoordinatorTest, RouteIsALookupThatPinsNothing) {
  const WorkerId w = Register("", "engine-a");
  const WorkerId other = Register("t2", "engine-b");
  const std::vector<TokenId> t = SequentialTokens(1, 65);  // 4 blocks + 1.
  ASSERT_EQ(StoreAll(w, 1, t).size(), 4u);
  const CoordinatorStats before = c_.stats();
  const RouteResult route = c_.Route("", t, {}).value();
  EXPECT_EQ(route.prompt_tokens, 64);
  EXPECT_EQ(route.cached_tokens, 64);
  EXPECT_EQ(route.lower_tokens, 0);
  EXPECT_THAT(route.workers,
              ElementsAre(RouteWorker{.id = w, .name = "engine-a", .pid = 1}));
  EXPECT_EQ(c_.stats().host.pinned_slots, before.host.pinned_slots);
  EXPECT_EQ(c_.stats().host.lookups, before.host.lookups);
  // Through a worker: its own tenant's keys.
  EXPECT_EQ(c_.Route(w, t, {}).value(), route);
  const RouteResult elsewhere = c_.Route(other, t, {}).value();
  EXPECT_EQ(elsewhere.cached_tokens, 0);
  EXPECT_THAT(
      elsewhere.workers,
      ElementsAre(RouteWorker{.id = other, .name = "engine-b", .pid = 1}));
  // A changed block ends the run there; a salt keys every block anew.
  std::vector<TokenId> changed = t;
  changed[40] = 999'999;
  EXPECT_EQ(c_.Route("", changed, {}).value().cached_tokens, 32);
  EXPECT_EQ(
      c_.Route("", t,
               {.lora_id = std::nullopt, .mm_items = {}, .cache_salt = "s"})
          .value()
          .cached_tokens,
      0);
  EXPECT_EQ(c_.Route("", std::span(t).first(15), {}).value().prompt_tokens, 0);
  EXPECT_THAT(c_.Route(9999, t, {}), StatusIs(StatusCode::kNotFound));
  // Multimodal items outside the prompt are refused as a lookup refuses
  // them (their keys' encoding would overflow).
  for (const MultiModalItem& item :
       {MultiModalItem{.hash = {1, 2}, .start = 10, .length = INT64_MAX},
        MultiModalItem{.hash = {1, 2}, .start = -1, .length = INT64_MIN},
        MultiModalItem{.hash = {1, 2}, .start = 60, .length = 6}}) {
    EXPECT_THAT(
        c_.Route(
            "", t,
            {.lora_id = std::nullopt, .mm_items = {item}, .cache_salt = ""}),
        StatusIs(StatusCode::kInvalidArgument));
  }
  // What a lookup then finds agrees.
  EXPECT_EQ(c_.Lookup(w, 2, t, 0, {}).value().hit_tokens, 64);
}

TEST(CoordinatorRouteTest, BlocksOnlyTheLowerTierHoldsAreCountedApart) {
  ManualLowerTier lower;  // Holds every block.
  Coordinator c = Coordinator::Create(
                      {.layout = Layout(), .host_slots = 50, .lower = &lower})
                      .value();
  const std::vector<TokenId> t = SequentialTokens(1, 40);  // 2 blocks + 8.
  const RouteResult route = c.Route("", t, {}).value();
  EXPECT_EQ(route.prompt_tokens, 32);
  EXPECT_EQ(route.cached_tokens, 32);
  EXPECT_EQ(route.lower_tokens, 32);
  EXPECT_THAT(route.workers, IsEmpty());
  const std::vector<TokenId> too_long((1 << 20) + 1, 1);
  EXPECT_THAT(c.Route("", too_long, {}),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(CoordinatorEventsTest, ALoadIsPromotingThenReadyThenCopying) {
  ManualLowerTier lower;
  Clock::time_point now = Clock::time_point() + std::chrono::hours(1);
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 50,
                                       .lower = &lower,
                                       .clock = [&now] { return now; }})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  const std::vector<TokenId> t = SequentialTokens(1, 33);
  ASSERT_EQ(c.Lookup(w, 4, t, 0, {}).value().disk_hit_tokens, 32);
  const AllocateResult alloc = c.Allocate(w, 4, Range(1, 3), 32).value();
  ASSERT_TRUE(alloc.load_pending);
  ASSERT_EQ(lower.promotions.size(), 2u);
  auto state = [&c] {
    const std::vector<EventInfo> events = c.events();
    EXPECT_EQ(events.size(), 1u);
    return events.empty() ? EventState::kCopying : events[0].state;
  };
  EXPECT_EQ(state(), EventState::kPromoting);
  lower.promotions[0](uint64_t{0});
  c.PumpLowerTier();
  EXPECT_EQ(state(), EventState::kPromoting);  // One block still to come.
  lower.promotions[1](uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 1u);
  EXPECT_EQ(state(), EventState::kReady);  // The worker has not taken it.
  ASSERT_EQ(c.TakeReadyLoads(w).value().size(), 1u);
  EXPECT_EQ(state(), EventState::kCopying);
  now += microseconds(700);
  EXPECT_EQ(c.events()[0].age_us, 700u);
  EXPECT_EQ(c.events()[0].blocks, 2u);
}

// A block promoted from the lower tier was just hit there: under ARC it
// is a second use, and waits in the frequent list, not the recent one;
// copies down (spills) pin blocks without using them.
TEST(CoordinatorEventsTest, APromotedBlockCountsAsUsedAgain) {
  ManualLowerTier lower;
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 50,
                                       .lower = &lower,
                                       .host_eviction = EvictionPolicy::kArc})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  const std::vector<TokenId> t = SequentialTokens(1, 33);
  ASSERT_EQ(c.Lookup(w, 4, t, 0, {}).value().disk_hit_tokens, 32);
  ASSERT_TRUE(c.Allocate(w, 4, Range(1, 3), 32).value().load_pending);
  ASSERT_EQ(lower.promotions.size(), 2u);
  lower.promotions[0](uint64_t{0});
  lower.promotions[1](uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 1u);
  int keyed = 0;
  for (BlockId id = 1; id < c.host_pool().num_blocks(); ++id) {
    const BlockPool::Block& b = c.host_pool().block(id);
    if (!b.has_key()) continue;
    ++keyed;
    EXPECT_TRUE(b.reused()) << "slot " << id;
  }
  EXPECT_EQ(keyed, 2);
  EXPECT_THAT(c.host_pool().CheckInvariants(), IsOk());
}

// The host tells the lower tier each block it drops that the tier holds,
// whether evicted for a slot or let go by a spill (covered below), so the
// tier can keep it as recent: its copy is now the closest one. A block the
// tier does not hold is lost when evicted, and not told of.
class ForgetfulLowerTier : public ManualLowerTier {
 public:
  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    (void)tokens;
    return !forgotten.contains(key.ToHex());
  }
  std::set<std::string> forgotten;
};

TEST(CoordinatorEventsTest, TheLowerTierHearsOfEveryBlockTheHostDrops) {
  ForgetfulLowerTier lower;
  // No watermark: slots are freed by eviction alone.
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 5,
                                       .lower = &lower,
                                       .spill_high = 1,
                                       .spill_low = 1})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  auto host_keys = [&c] {
    std::set<std::string> keys;
    for (BlockId id = 1; id < c.host_pool().num_blocks(); ++id) {
      const BlockPool::Block& b = c.host_pool().block(id);
      if (b.has_key()) keys.insert(b.key.ToHex());
    }
    return keys;
  };
  auto load = [&](RequestId r, TokenId first) {
    const std::vector<TokenId> t = SequentialTokens(first, 33);
    ASSERT_EQ(c.Lookup(w, r, t, 0, {}).value().disk_hit_tokens, 32);
    ASSERT_TRUE(c.Allocate(w, r, Range(1, 3), 32).value().load_pending);
    for (auto& done : lower.promotions) done(uint64_t{0});
    lower.promotions.clear();
    ASSERT_EQ(c.PumpLowerTier(), 1u);
    const std::vector<TransferEvent> ready = c.TakeReadyLoads(w).value();
    ASSERT_EQ(ready.size(), 1u);
    const std::vector<CompletedEvent> copied{{ready[0].ref, true}};
    ASSERT_THAT(c.Complete(w, copied), IsOk());
    ASSERT_THAT(c.Finish(w, r), IsOk());
  };
  auto told_since = [&lower](size_t* heard) {
    std::multiset<std::string> told;
    for (; *heard < lower.host_dropped.size(); ++*heard) {
      told.insert(lower.host_dropped[*heard].ToHex());
    }
    return told;
  };
  // Four slots, a worker pinning two at a time: twelve blocks, so eight
  // evictions. The tier forgets the second load's two blocks before they
  // are evicted: those two are lost, not told of.
  std::set<std::string> on_host;
  size_t heard = 0;
  size_t lost = 0;
  for (RequestId r = 1; r <= 6; ++r) {
    load(r, static_cast<TokenId>(100 * r));
    if (r == 2) {
      for (const std::string& k : host_keys()) {
        if (!on_host.contains(k)) lower.forgotten.insert(k);
      }
      ASSERT_EQ(lower.forgotten.size(), 2u);
    }
    const std::set<std::string> now = host_keys();
    std::multiset<std::string> left;
    for (const std::string& k : on_host) {
      if (now.contains(k)) continue;
      if (lower.forgotten.contains(k)) {
        ++lost;
      } else {
        left.insert(k);
      }
    }
    EXPECT_EQ(told_since(&heard), left) << "load " << r;
    on_host = now;
  }
  EXPECT_EQ(heard, 6u);
  EXPECT_EQ(lost, 2u);
  EXPECT_EQ(c.stats().host.evicted_unspilled, 2u);
  // A spill of blocks the lower tier holds drops them without a copy, and
  // tells it.
  c.SpillAll();
  EXPECT_EQ(told_since(&heard),
            std::multiset<std::string>(on_host.begin(), on_host.end()));
  EXPECT_TRUE(host_keys().empty());
}

// A coordinator over `lower` that records in `signals` each worker told
// its loads are ready.
Coordinator SignallingCoordinator(ManualLowerTier* lower,
                                  std::vector<WorkerId>* signals) {
  return Coordinator::Create(
             {.layout = Layout(),
              .host_slots = 50,
              .lower = lower,
              .loads_ready = [signals](WorkerId w) { signals->push_back(w); }})
      .value();
}

// Requests first..last of `w`: one-block loads waiting for their
// promotions from the lower tier.
void StartOneBlockLoads(Coordinator& c, WorkerId w, RequestId first,
                        RequestId last) {
  for (RequestId r = first; r <= last; ++r) {
    const std::vector<TokenId> t = SequentialTokens(100 * r, 17);
    ASSERT_EQ(c.Lookup(w, r, t, 0, {}).value().disk_hit_tokens, 16);
    ASSERT_TRUE(c.Allocate(w, r, Range(r, r + 1), 16).value().load_pending);
  }
}

// loads_ready tells the worker its loads are ready once per batch: when
// the first of them becomes ready, not for promotions still under way, and
// again only after TakeReadyLoads has emptied the list. A failed
// promotion readies its load too (cut short), within the same batch.
TEST(CoordinatorEventsTest, LoadsReadySignalsOncePerBatch) {
  ManualLowerTier lower;
  std::vector<WorkerId> signals;
  Coordinator c = SignallingCoordinator(&lower, &signals);
  auto worker = [&c](const char* name) {
    return c
        .RegisterWorker({.layout = Layout(),
                         .num_device_blocks = 10,
                         .tenant = "",
                         .pid = 1,
                         .name = name})
        .value();
  };
  const WorkerId w = worker("w");
  const WorkerId other = worker("other");
  // Three one-block loads of w (requests 1..3) and one of `other`.
  ASSERT_NO_FATAL_FAILURE(StartOneBlockLoads(c, w, 1, 3));
  ASSERT_EQ(c.Lookup(other, 1, SequentialTokens(900, 17), 0, {})
                .value()
                .disk_hit_tokens,
            16);
  ASSERT_TRUE(c.Allocate(other, 1, Range(1, 2), 16).value().load_pending);
  ASSERT_EQ(lower.promotions.size(), 4u);

  c.PumpLowerTier();
  EXPECT_TRUE(signals.empty());  // Nothing has landed.
  lower.promotions[0](uint64_t{0});
  lower.promotions[1](uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 2u);
  EXPECT_EQ(signals, std::vector<WorkerId>{w});  // Once for both.
  lower.promotions[2](Status::DataLoss("bad block"));
  ASSERT_EQ(c.PumpLowerTier(), 1u);
  EXPECT_EQ(signals.size(), 1u);  // w has not taken the first batch yet.
  ASSERT_EQ(c.TakeReadyLoads(w).value().size(), 3u);

  lower.promotions[3](uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 1u);
  EXPECT_EQ(signals, (std::vector<WorkerId>{w, other}));
  EXPECT_TRUE(c.TakeReadyLoads(w).value().empty());
  ASSERT_EQ(c.TakeReadyLoads(other).value().size(), 1u);
}

// Ready loads are handed out as one reply holds them (`fits`): the rest
// stay ready, the worker is told again, and the next take gets them, in
// order. The first is handed out whatever `fits` says.
TEST(CoordinatorEventsTest, ReadyLoadsPastWhatOneReplyHoldsComeNextTime) {
  ManualLowerTier lower;
  std::vector<WorkerId> signals;
  Coordinator c = SignallingCoordinator(&lower, &signals);
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  ASSERT_NO_FATAL_FAILURE(StartOneBlockLoads(c, w, 1, 3));
  for (auto& promotion : lower.promotions) promotion(uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 3u);
  ASSERT_EQ(signals.size(), 1u);

  int asked = 0;
  const auto none_fit = [&asked](const TransferEvent&) {
    ++asked;
    return false;
  };
  std::vector<TransferEvent> first = c.TakeReadyLoads(w, none_fit).value();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].request, 1u);
  EXPECT_EQ(asked, 2);            // The first, counted, and the one refused.
  EXPECT_EQ(signals.size(), 2u);  // Told of the two left.
  const auto two_fit = [n = 0](const TransferEvent&) mutable {
    return ++n <= 2;
  };
  std::vector<TransferEvent> rest = c.TakeReadyLoads(w, two_fit).value();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].request, 2u);
  EXPECT_EQ(rest[1].request, 3u);
  EXPECT_EQ(signals.size(), 2u);  // Nothing left to tell of.
  EXPECT_TRUE(c.TakeReadyLoads(w).value().empty());
}

// A disk tier in memory whose spills land only when the test says so.
// Remove forgets what is stored; with cancel_writes it also cancels the
// writes in flight (DiskTier's WRITING entry), without it a queued write
// still lands afterwards (DiskTier's Put not yet started).
class SlowSpillTier : public LowerTier {
 public:
  struct Write {
    BlockKey key;
    std::vector<TokenId> tokens;
    Done done;
    bool cancelled = false;
  };

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    auto it = stored.find(key);
    return it != stored.end() && std::ranges::equal(it->second, tokens);
  }
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId,
             std::optional<uint64_t>, Done done) override {
    writes.push_back({key, {tokens.begin(), tokens.end()}, std::move(done)});
  }
  void Promote(const BlockKey&, std::span<const TokenId>, BlockId,
               PromoteDone done) override {
    done(Status::NotFound("not stored"));
  }
  LowerRemoval Remove(const BlockKey& key) override {
    if (cancel_writes) {
      for (Write& w : writes) w.cancelled |= w.key == key;
    }
    return {.disk = stored.erase(key)};
  }
  LowerRemoval RemoveAll() override {
    const uint64_t n = stored.size();
    stored.clear();  // Writes in flight are left alone, as DiskTier does.
    return {.disk = n};
  }
  DiskTierStats stats() const override {
    return {.keys = static_cast<uint64_t>(stored.size())};
  }
  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const override {
    std::vector<BlockKey> keys;
    for (const auto& [key, tokens] : stored) {
      if (keys.size() < max) keys.push_back(key);
    }
    *total = stored.size();
    return keys;
  }

  // Finishes the i-th spill: it lands and reports OK unless cancelled,
  // which reports Aborted (as DiskTier does).
  void Land(size_t i) {
    Write& w = writes.at(i);
    if (!w.cancelled) stored[w.key] = w.tokens;
    w.done(w.cancelled ? Status::Aborted("removed while queued")
                       : Status::Ok());
  }

  // Finishes the i-th spill as failed (a full or broken disk).
  void Fail(size_t i) { writes.at(i).done(Status::Unavailable("disk full")); }

  bool cancel_writes = false;
  std::vector<Write> writes;
  std::unordered_map<BlockKey, std::vector<TokenId>, BlockKeyHash> stored;
};

// One block on a host of four usable slots that spills as soon as it holds
// anything: storing the block starts its spill at once.
class SpillTest : public ::testing::Test {
 protected:
  SpillTest()
      : c_(Coordinator::Create({.layout = Layout(),
                                .host_slots = 5,
                                .lower = &lower_,
                                .spill_high = 0.2,
                                .spill_low = 0.2,
                                .clock = [this] { return now_; }})
               .value()),
        w_(c_.RegisterWorker(TestWorker(10)).value()) {}

  // Stores one block of `tokens` as request `id`; returns its key. Its
  // spill is then in flight, and nothing else pins it.
  BlockKey StoreOneBlock(RequestId id, const std::vector<TokenId>& tokens) {
    EXPECT_THAT(c_.Lookup(w_, id, tokens, 0, {}), IsOk());
    const BlockId device[] = {1, 2};
    EXPECT_THAT(c_.Allocate(w_, id, device, 0), IsOk());
    CommitResult commit = c_.Commit(w_, id, 16, device).value();
    EXPECT_EQ(commit.stores.size(), 1u);
    slot_ = commit.stores.at(0).host_blocks.at(0);
    const CompletedEvent done[] = {{commit.stores[0].ref, true}};
    EXPECT_THAT(c_.Complete(w_, done), IsOk());
    EXPECT_THAT(c_.Finish(w_, id), IsOk());
    EXPECT_EQ(c_.stats().host.spills_in_flight, 1u);
    EXPECT_EQ(c_.host_pool().block(slot_).ref_cnt, 1);
    return c_.host_pool().block(slot_).key;
  }
  // Lookup's hit for `tokens` (host or disk), pins released.
  int32_t HitTokens(RequestId id, const std::vector<TokenId>& tokens) {
    const int32_t hit = c_.Lookup(w_, id, tokens, 0, {}).value().hit_tokens;
    EXPECT_THAT(c_.Finish(w_, id), IsOk());
    return hit;
  }
  void ExpectGoneEverywhere(const BlockKey& key,
                            const std::vector<TokenId>& tokens) {
    EXPECT_EQ(HitTokens(90, tokens), 0);
    EXPECT_FALSE(c_.host_pool().FindKeyedBlock(key).has_value());
    EXPECT_FALSE(lower_.stored.contains(key));
    const HostTierStats h = c_.stats().host;
    EXPECT_EQ(h.cached_slots, 0);
    EXPECT_EQ(h.pinned_slots, 0);
    EXPECT_EQ(h.spills_in_flight, 0u);
    EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
  }

  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  SlowSpillTier lower_;
  Coordinator c_;
  WorkerId w_;
  BlockId slot_ = 0;
};

// A lower tier that keeps failing is asked again after 100 ms, then 200,
// doubling, not at every pass; a spill that lands starts the waits over.
TEST_F(SpillTest, FailingSpillsBackOff) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  const auto pump_after = [&](int ms) {
    now_ += std::chrono::milliseconds(ms);
    c_.PumpLowerTier();
    return lower_.writes.size();
  };
  lower_.Fail(0);
  EXPECT_EQ(pump_after(0), 1u);
  EXPECT_EQ(pump_after(99), 1u);
  EXPECT_EQ(pump_after(1), 2u);  // 100 ms after the failure: again.
  lower_.Fail(1);
  EXPECT_EQ(pump_after(0), 2u);  // Applied at this pump.
  EXPECT_EQ(pump_after(100), 2u);
  EXPECT_EQ(pump_after(99), 2u);
  EXPECT_EQ(pump_after(1), 3u);  // 200 ms after the second failure.
  EXPECT_EQ(c_.stats().host.spill_failures, 2u);
  EXPECT_EQ(HitTokens(2, t), 16);  // Still served from host meanwhile.
  lower_.Land(2);
  c_.PumpLowerTier();
  EXPECT_TRUE(lower_.stored.contains(key));
  // Landed: the next failure waits 100 ms again.
  const BlockKey other = StoreOneBlock(3, SequentialTokens(500, 17));
  ASSERT_EQ(lower_.writes.size(), 4u);
  lower_.Fail(3);
  EXPECT_EQ(pump_after(0), 4u);
  EXPECT_EQ(pump_after(99), 4u);
  EXPECT_EQ(pump_after(1), 5u);
  lower_.Land(4);
  c_.PumpLowerTier();
  EXPECT_TRUE(lower_.stored.contains(other));
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(SpillTest, EvictMidSpillDropsTheBlockFromHostAndDisk) {
  for (bool cancel_writes : {false, true}) {
    SCOPED_TRACE(cancel_writes ? "Remove cancels the write"
                               : "the write lands after Remove");
    lower_.cancel_writes = cancel_writes;
    lower_.writes.clear();
    const std::vector<TokenId> t =
        SequentialTokens(cancel_writes ? 500 : 1, 17);
    const BlockKey key = StoreOneBlock(cancel_writes ? 20 : 10, t);
    const uint64_t spills = c_.stats().host.spills;

    const BlockKey keys[] = {key};
    const std::vector<EvictedBlock> result = c_.Evict(keys);
    ASSERT_EQ(result.size(), 1u);
    EXPECT_EQ(result[0], (EvictedBlock{.key = key, .host_dropped = true}));
    EXPECT_EQ(EvictedBlockSummary(result[0]), "dropped from host");
    // Lookups miss it at once, though its spill is still running.
    EXPECT_EQ(HitTokens(30, t), 0);

    ASSERT_EQ(lower_.writes.size(), 1u);
    lower_.Land(0);
    c_.PumpLowerTier();
    ExpectGoneEverywhere(key, t);
    EXPECT_EQ(c_.stats().host.spills, spills);  // Nothing moved down.
  }
}

TEST_F(SpillTest, StoreOfAKeyWhoseSpillIsDiscardedIsCountedSkipped) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  const BlockKey keys[] = {key};
  ASSERT_TRUE(c_.Evict(keys)[0].host_dropped);

  // A worker computes the block again while the discarded spill runs: its
  // slot still holds the key, so the store is skipped, and says so.
  ASSERT_EQ(c_.Lookup(w_, 2, t, 0, {}).value().hit_tokens, 0);
  const BlockId device[] = {1, 2};
  ASSERT_THAT(c_.Allocate(w_, 2, device, 0), IsOk());
  const CommitResult commit = c_.Commit(w_, 2, 16, device).value();
  EXPECT_TRUE(commit.stores.empty());
  EXPECT_EQ(commit.skipped_blocks, 1);
  EXPECT_EQ(c_.stats().host.store_skipped, 1u);
  ASSERT_THAT(c_.Finish(w_, 2), IsOk());

  lower_.Land(0);
  c_.PumpLowerTier();
  ExpectGoneEverywhere(key, t);
  // Once the spill is done, the block can be stored again.
  StoreOneBlock(3, t);
  EXPECT_EQ(HitTokens(4, t), 16);
}

TEST_F(SpillTest, EvictMidSpillKeepsABlockAWorkerPins) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  ASSERT_EQ(c_.Lookup(w_, 2, t, 0, {}).value().hit_tokens, 16);

  const BlockKey keys[] = {key};
  EXPECT_EQ(c_.Evict(keys)[0], (EvictedBlock{.key = key, .host_pinned = true}));
  lower_.Land(0);
  c_.PumpLowerTier();
  // Kept on host (the lookup still pins it), and now on disk too.
  EXPECT_EQ(c_.host_pool().FindKeyedBlock(key), slot_);
  EXPECT_TRUE(lower_.stored.contains(key));
  ASSERT_THAT(c_.Finish(w_, 2), IsOk());
  EXPECT_EQ(HitTokens(3, t), 16);
}

// The spill of a block a worker pins lands, and the operator's evict
// deletes what it wrote before its result is applied: the evict said
// kept, so the block stays on host, neither demoted nor counted a spill.
TEST_F(SpillTest, EvictAfterASpillLandedKeepsThePinnedBlockOnHost) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  ASSERT_EQ(c_.Lookup(w_, 2, t, 0, {}).value().hit_tokens, 16);
  lower_.Land(0);  // Written; the result waits to be pumped.
  const BlockKey keys[] = {key};
  EXPECT_EQ(
      c_.Evict(keys)[0],
      (EvictedBlock{.key = key, .host_pinned = true, .disk_dropped = true}));
  ASSERT_THAT(c_.Finish(w_, 2), IsOk());
  c_.PumpLowerTier();
  EXPECT_EQ(c_.host_pool().FindKeyedBlock(key), slot_);
  EXPECT_FALSE(lower_.stored.contains(key));
  EXPECT_EQ(c_.stats().host.spills, 0u);
  EXPECT_EQ(HitTokens(3, t), 16);
}

// An eviction that cancels the spill of a block a worker still pins: the
// block stays on host, keyed, and the aborted spill is neither a spill nor
// a failure.
TEST_F(SpillTest, EvictMidSpillOfAPinnedBlockCancelsItsWriteOnly) {
  lower_.cancel_writes = true;
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  ASSERT_EQ(c_.Lookup(w_, 2, t, 0, {}).value().hit_tokens, 16);
  const BlockKey keys[] = {key};
  EXPECT_EQ(c_.Evict(keys)[0], (EvictedBlock{.key = key, .host_pinned = true}));
  ASSERT_TRUE(lower_.writes.at(0).cancelled);
  lower_.Land(0);
  c_.PumpLowerTier();
  EXPECT_EQ(c_.host_pool().FindKeyedBlock(key), slot_);
  EXPECT_FALSE(lower_.stored.contains(key));
  const HostTierStats h = c_.stats().host;
  EXPECT_EQ(h.spills, 0u);
  EXPECT_EQ(h.spill_failures, 0u);
  EXPECT_EQ(h.spills_in_flight, 0u);
  ASSERT_THAT(c_.Finish(w_, 2), IsOk());
  EXPECT_EQ(HitTokens(3, t), 16);  // Still a host hit.
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(SpillTest, ClearMidSpillDropsTheBlockFromHostAndDisk) {
  for (TierSelection tiers : {TierSelection::kAll, TierSelection::kHost}) {
    SCOPED_TRACE(TierSelectionName(tiers));
    lower_.writes.clear();
    const std::vector<TokenId> t =
        SequentialTokens(tiers == TierSelection::kAll ? 1 : 500, 17);
    const BlockKey key =
        StoreOneBlock(tiers == TierSelection::kAll ? 10 : 20, t);

    lower_.cancel_writes = true;
    const ClearResult cleared = c_.Clear(tiers).value();
    EXPECT_EQ(cleared.host_dropped, 1u);
    EXPECT_EQ(cleared.host_kept_pinned, 0u);
    EXPECT_EQ(HitTokens(30, t), 0);
    // Clearing the disk too cancels the discarded spill's write before the
    // answer: it can never land, not even for a moment before a crash.
    ASSERT_EQ(lower_.writes.size(), 1u);
    EXPECT_EQ(lower_.writes[0].cancelled, tiers == TierSelection::kAll);

    lower_.Land(0);
    c_.PumpLowerTier();
    ExpectGoneEverywhere(key, t);
  }
}

// Clearing the disk alone leaves a spill in flight alone: the block was
// on host when the operator asked, and lands on disk as usual.
TEST_F(SpillTest, ClearDiskMidSpillLetsTheSpillLand) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  const ClearResult cleared = c_.Clear(TierSelection::kDisk).value();
  EXPECT_EQ(cleared.host_dropped, 0u);
  EXPECT_EQ(cleared.disk_dropped, 0u);
  lower_.Land(0);
  c_.PumpLowerTier();
  EXPECT_FALSE(c_.host_pool().FindKeyedBlock(key).has_value());
  EXPECT_TRUE(lower_.stored.contains(key));
  EXPECT_EQ(c_.stats().host.spills, 1u);
}

// A spill whose write landed before the clear, but whose answer the
// coordinator had not taken yet: the clear removed what it wrote, so the
// host copy is the block's last and stays.
TEST_F(SpillTest, ClearDiskAfterASpillLandedKeepsTheBlockOnHost) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockKey key = StoreOneBlock(1, t);
  lower_.Land(0);  // Written; its answer waits in the inbox.
  const ClearResult cleared = c_.Clear(TierSelection::kDisk).value();
  EXPECT_EQ(cleared.disk_dropped, 1u);
  c_.PumpLowerTier();
  EXPECT_FALSE(lower_.stored.contains(key));
  EXPECT_TRUE(c_.host_pool().FindKeyedBlock(key).has_value());
  EXPECT_EQ(c_.stats().host.spills, 0u);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

// The same for a write-behind copy: its block stays on host and is not
// put first in line for eviction as a block the disk holds would be.
TEST(CoordinatorWriteBehindTest, ClearDiskAfterACopyLandedKeepsItsBlockInLine) {
  SlowSpillTier lower;
  // Three usable slots, all keyed: the next victim is a block on no tier,
  // the case in which a block the disk holds would be put first. No
  // watermark spill: write-behind copies only.
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 4,
                                       .lower = &lower,
                                       .spill_high = 1,
                                       .spill_low = 1,
                                       .write_behind_spills = 1,
                                       .caps = {.worker_pin_share = 1}})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  std::vector<BlockId> slots;
  for (RequestId r = 1; r <= 3; ++r) {
    const std::vector<TokenId> t =
        SequentialTokens(static_cast<TokenId>(1000 * r), 17);
    ASSERT_THAT(c.Lookup(w, r, t, 0, {}), IsOk());
    const BlockId device[] = {1, 2};
    ASSERT_THAT(c.Allocate(w, r, device, 0), IsOk());
    const CommitResult commit = c.Commit(w, r, 16, device).value();
    ASSERT_EQ(commit.stores.size(), 1u);
    const CompletedEvent done[] = {{commit.stores[0].ref, true}};
    ASSERT_THAT(c.Complete(w, done), IsOk());
    ASSERT_THAT(c.Finish(w, r), IsOk());
    slots.push_back(commit.stores[0].host_blocks.at(0));
  }
  ASSERT_EQ(lower.writes.size(), 1u);  // The first block's copy; one at once.
  lower.Land(0);
  ASSERT_THAT(c.Clear(TierSelection::kDisk), IsOk());
  c.PumpLowerTier();  // Then the second block's copy starts (pinned).
  EXPECT_TRUE(lower.stored.empty());
  EXPECT_EQ(c.stats().host.spills_kept, 0u);
  EXPECT_EQ(c.host_pool().NextFreeBlock(), slots[2]);
  EXPECT_TRUE(c.host_pool().block(slots[0]).has_key());
}

// A write-behind copy that lands ends the spill backoff as a spill does:
// after an outage, the next failure rests 100 ms, not the last rest's
// double.
TEST(CoordinatorWriteBehindTest, ALandedCopyEndsTheSpillBackoff) {
  SlowSpillTier lower;
  Clock::time_point now = Clock::time_point() + std::chrono::hours(1);
  // No watermark spill: write-behind copies only, one at once.
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 8,
                                       .lower = &lower,
                                       .spill_high = 1,
                                       .spill_low = 1,
                                       .write_behind_spills = 1,
                                       .clock = [&now] { return now; },
                                       .caps = {.worker_pin_share = 1}})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  RequestId next = 1;
  // Stores one block and returns how many copies have started since.
  const auto store = [&] {
    const RequestId r = next++;
    const std::vector<TokenId> t =
        SequentialTokens(static_cast<TokenId>(1000 * r), 17);
    EXPECT_THAT(c.Lookup(w, r, t, 0, {}), IsOk());
    const BlockId device[] = {1, 2};
    EXPECT_THAT(c.Allocate(w, r, device, 0), IsOk());
    const CommitResult commit = c.Commit(w, r, 16, device).value();
    EXPECT_EQ(commit.stores.size(), 1u);
    const CompletedEvent done[] = {{commit.stores.at(0).ref, true}};
    EXPECT_THAT(c.Complete(w, done), IsOk());
    EXPECT_THAT(c.Finish(w, r), IsOk());
    return lower.writes.size();
  };
  const auto after = [&](int ms) {
    now += std::chrono::milliseconds(ms);
    c.PumpLowerTier();
  };
  ASSERT_EQ(store(), 1u);
  lower.Fail(0);
  after(0);  // Rests 100 ms.
  after(100);
  ASSERT_EQ(store(), 2u);
  lower.Fail(1);
  after(0);  // Rests 200 ms.
  after(200);
  ASSERT_EQ(store(), 3u);
  lower.Land(2);
  after(0);
  ASSERT_EQ(store(), 4u);
  lower.Fail(3);
  after(0);
  after(99);
  EXPECT_EQ(store(), 4u);  // Resting: the copy waits.
  after(1);
  EXPECT_EQ(lower.writes.size(), 5u);  // 100 ms, not 400.
  EXPECT_EQ(c.stats().host.spill_failures, 2u + 1u);
  EXPECT_THAT(c.host_pool().CheckInvariants(), IsOk());
}

// Write-behind over a disk slower than the stores: nothing lands until the
// test says so. Stores never wait for the disk: the host evicts blocks no
// tier holds, and counts each one.
TEST(CoordinatorWriteBehindTest, DiskSlowerThanStoresEvictsAndCountsEachLoss) {
  SlowSpillTier lower;
  Coordinator c = Coordinator::Create({.layout = Layout(),
                                       .host_slots = 9,
                                       .lower = &lower,
                                       .write_behind_spills = 1,
                                       .caps = {.worker_pin_share = 1}})
                      .value();
  const WorkerId w = c.RegisterWorker(TestWorker(10)).value();
  struct Stored {
    BlockKey key;
    std::vector<TokenId> tokens;
  };
  std::vector<Stored> stored;
  // Three bursts of four blocks on eight slots, no write landing between.
  for (RequestId r = 1; r <= 3; ++r) {
    const std::vector<TokenId> t =
        SequentialTokens(static_cast<TokenId>(1000 * r), 4 * 16 + 1);
    ASSERT_THAT(c.Lookup(w, r, t, 0, {}), IsOk());
    const BlockId device[] = {1, 2, 3, 4, 5};
    ASSERT_THAT(c.Allocate(w, r, device, 0), IsOk());
    const CommitResult commit = c.Commit(w, r, 4 * 16, device).value();
    ASSERT_EQ(commit.stores.size(), 1u);
    ASSERT_EQ(commit.stores[0].host_blocks.size(), 4u);
    const CompletedEvent done[] = {{commit.stores[0].ref, true}};
    ASSERT_THAT(c.Complete(w, done), IsOk());
    for (size_t b = 0; b < 4; ++b) {
      const BlockId slot = commit.stores[0].host_blocks[b];
      const auto first = t.begin() + static_cast<std::ptrdiff_t>(16 * b);
      stored.push_back({c.host_pool().block(slot).key, {first, first + 16}});
    }
    ASSERT_THAT(c.Finish(w, r), IsOk());
  }
  const auto lost = [&] {
    int64_t n = 0;
    for (const Stored& b : stored) {
      n += !c.host_pool().GetCachedBlock(b.key, b.tokens).has_value() &&
           !lower.Contains(b.key, b.tokens);
    }
    return n;
  };
  HostTierStats h = c.stats().host;
  EXPECT_EQ(h.stores_completed, 12u);
  EXPECT_EQ(h.store_skipped, 0u);
  EXPECT_GT(h.evicted_unspilled, 0u);
  EXPECT_EQ(h.evicted_unspilled, h.evictions);  // Nothing had landed.
  EXPECT_EQ(static_cast<int64_t>(h.evicted_unspilled), lost());

  // The writes land now, each starting the next copy: nothing more is lost,
  // and every block still on host reaches the disk.
  for (size_t i = 0; i < lower.writes.size(); ++i) {
    lower.Land(i);
    c.PumpLowerTier();
  }
  EXPECT_TRUE(c.lower_tier_idle());
  h = c.stats().host;
  EXPECT_EQ(static_cast<int64_t>(h.evicted_unspilled), lost());
  EXPECT_EQ(c.HostOnlyBlocks(), 0);
  EXPECT_EQ(h.pinned_slots, 0);
  EXPECT_THAT(c.host_pool().CheckInvariants(), IsOk());
}

// A slot a verified load found changed while another lookup still pins it
// (DropCorruptSlot marks it; the last release drops it).
class CorruptSlotTest : public ::testing::Test {
 protected:
  class ChecksumSeenTier : public SlowSpillTier {
   public:
    void Spill(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, std::optional<uint64_t> checksum,
               Done done) override {
      checksums.push_back(checksum);
      SlowSpillTier::Spill(key, tokens, slot, checksum, std::move(done));
    }
    std::vector<std::optional<uint64_t>> checksums;
  };

  explicit CorruptSlotTest(int32_t copies = 1)
      : sums_(10, 7),
        c_(Coordinator::Create(
               {.layout = Layout(),
                .host_slots = 10,
                .lower = &lower_,
                .write_behind_spills = copies,
                .clock = [this] { return now_; },
                .slot_checksum =
                    [this](BlockId s) { return sums_[static_cast<size_t>(s)]; },
                .verify_on_load = true})
               .value()),
        w_(c_.RegisterWorker(TestWorker(10)).value()) {}

  // Stores the one full block of `t` as request `id`; its host slot.
  BlockId Store(RequestId id, const std::vector<TokenId>& t) {
    EXPECT_THAT(c_.Lookup(w_, id, t, 0, {}), IsOk());
    EXPECT_THAT(c_.Allocate(w_, id, kDevice, 0), IsOk());
    const CommitResult commit = c_.Commit(w_, id, 16, kDevice).value();
    const CompletedEvent done[] = {{commit.stores.at(0).ref, true}};
    EXPECT_THAT(c_.Complete(w_, done), IsOk());
    EXPECT_THAT(c_.Finish(w_, id), IsOk());
    return commit.stores.at(0).host_blocks.at(0);
  }

  // Request `id`, whose lookup hit `slot`, loads it after a worker wrote
  // into it: the verified load is cut and the slot marked corrupt.
  void LoadFindsItChanged(RequestId id, BlockId slot) {
    sums_[static_cast<size_t>(slot)] = 8;
    const AllocateResult a = c_.Allocate(w_, id, kDevice, 16).value();
    ASSERT_TRUE(a.load.has_value());
    EXPECT_TRUE(a.load->host_blocks.empty());
    EXPECT_EQ(c_.stats().host.corrupt_slots_dropped, 1u);
  }

  static constexpr BlockId kDevice[] = {1, 2};
  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  ChecksumSeenTier lower_;
  std::vector<uint64_t> sums_;
  Coordinator c_;
  WorkerId w_;
};

// Its write-behind copy, still waiting, never starts: without the checksum
// (dropped with the slot's standing) the tier would keep the changed bytes
// under the key and a later lookup would promote them.
TEST_F(CorruptSlotTest, AWaitingCopyOfAChangedSlotNeverStarts) {
  Store(1, SequentialTokens(1000, 17));  // Its copy takes the one copy slot.
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockId slot = Store(2, t);  // Its copy waits.
  ASSERT_EQ(lower_.writes.size(), 1u);
  ASSERT_EQ(c_.Lookup(w_, 3, t, 0, {}).value().hit_tokens, 16);
  ASSERT_EQ(c_.Lookup(w_, 4, t, 0, {}).value().hit_tokens, 16);
  LoadFindsItChanged(3, slot);

  lower_.Land(0);
  c_.PumpLowerTier();  // Would start the waiting copy.
  EXPECT_EQ(lower_.writes.size(), 1u);
  EXPECT_TRUE(std::ranges::all_of(
      lower_.checksums, [](const auto& sum) { return sum.has_value(); }));
  ASSERT_THAT(c_.Finish(w_, 3), IsOk());
  ASSERT_THAT(c_.Finish(w_, 4), IsOk());  // The last pin: host drops it.
  EXPECT_FALSE(c_.host_pool().block(slot).has_key());
  const LookupResult again = c_.Lookup(w_, 5, t, 0, {}).value();
  EXPECT_EQ(again.hit_tokens, 0);
  EXPECT_EQ(again.disk_hit_tokens, 0);
}

// A copy already reading it when the load found it changed fails its
// checksum (DataLoss): the block was dropped as corrupt, once, and the
// lower tier did not fail, so spilling does not rest.
TEST_F(CorruptSlotTest, ACopyOfAChangedSlotIsNotASpillFailure) {
  const std::vector<TokenId> t = SequentialTokens(1, 17);
  const BlockId slot = Store(1, t);
  ASSERT_EQ(lower_.writes.size(), 1u);  // Its copy is reading it.
  ASSERT_EQ(c_.Lookup(w_, 2, t, 0, {}).value().hit_tokens, 16);
  LoadFindsItChanged(2, slot);
  ASSERT_THAT(c_.Finish(w_, 2), IsOk());

  lower_.writes[0].done(Status::DataLoss("bytes changed"));
  c_.PumpLowerTier();  // The copy's pin was the last.
  EXPECT_FALSE(c_.host_pool().block(slot).has_key());
  EXPECT_EQ(c_.stats().host.corrupt_slots_dropped, 1u);
  EXPECT_EQ(c_.stats().host.spill_failures, 0u);
  Store(3, SequentialTokens(500, 17));
  EXPECT_EQ(lower_.writes.size(), 2u);  // The next copy starts at once.
}

// A worker's load of a block on the lower tier, its promotion read but not
// yet applied (it keys a host slot when pumped).
class CoordinatorEvictTest : public ::testing::Test {
 protected:
  CoordinatorEvictTest()
      : c_(Coordinator::Create(
               {.layout = Layout(), .host_slots = 10, .lower = &lower_})
               .value()),
        w_(c_.RegisterWorker(TestWorker(10)).value()) {
    EXPECT_EQ(c_.Lookup(w_, 1, t_, 0, {}).value().disk_hit_tokens, 16);
    EXPECT_TRUE(c_.Allocate(w_, 1, Range(1, 2), 16).value().load_pending);
    EXPECT_EQ(lower_.promotions.size(), 1u);
    lower_.promotions.at(0)(uint64_t{0});
    std::vector<BlockKey> keys;
    KeyHasher(
        {.model_fingerprint = StoreFingerprint(Layout(), ""), .tenant = ""})
        .AppendPrefixKeys(t_, 16, {}, &keys);
    key_ = keys.at(0);
  }

  ManualLowerTier lower_;
  Coordinator c_;
  WorkerId w_;
  const std::vector<TokenId> t_ = SequentialTokens(1, 17);
  BlockKey key_;
};

// An operator's evict of a block whose promotion is landing: the promotion
// keys it on host, so the answer says so ("pinned, kept"), as for a block
// a store is writing.
TEST_F(CoordinatorEvictTest, ABlockBeingPromotedIsReportedKept) {
  const EvictedBlock e = c_.Evict({&key_, 1})[0];
  EXPECT_FALSE(e.host_dropped);
  EXPECT_TRUE(e.host_pinned);
  EXPECT_EQ(EvictedBlockSummary(e), "pinned, kept");
  c_.PumpLowerTier();
  EXPECT_TRUE(c_.host_pool().FindKeyedBlock(key_).has_value());
}

// The same block stored by another worker while the promotion runs: two
// host copies, one keyed, one keyed when the promotion lands. An evict
// cannot remove it from host, and says so instead of dropping the keyed
// copy only to see the promotion key it again.
TEST_F(CoordinatorEvictTest, ABlockStoredWhileItsPromotionRunsIsReportedKept) {
  const WorkerId b = c_.RegisterWorker(TestWorker(10)).value();
  ASSERT_THAT(c_.Lookup(b, 1, t_, 16, {}), IsOk());  // Computed it itself.
  ASSERT_THAT(c_.Allocate(b, 1, Range(1, 2), 0), IsOk());
  const CommitResult commit = c_.Commit(b, 1, 16, Range(1, 2)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  const CompletedEvent done[] = {{commit.stores[0].ref, true}};
  ASSERT_THAT(c_.Complete(b, done), IsOk());
  ASSERT_THAT(c_.Finish(b, 1), IsOk());
  ASSERT_TRUE(c_.host_pool().FindKeyedBlock(key_).has_value());
  const EvictedBlock e = c_.Evict({&key_, 1})[0];
  EXPECT_FALSE(e.host_dropped);
  EXPECT_TRUE(e.host_pinned);
  c_.PumpLowerTier();
  EXPECT_TRUE(c_.host_pool().FindKeyedBlock(key_).has_value());
}

TEST_F(CoordinatorTest, AnotherLayoutIsRefusedNamingBoth) {
  KvLayout other = Layout();
  other.head_dim = 128;
  StatusOr<WorkerId> w = c_.RegisterWorker({.layout = other,
                                            .num_device_blocks = 10,
                                            .tenant = "",
                                            .pid = 1,
                                            .name = "x"});
  ASSERT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(w.status().message(), HasSubstr("head_dim=64"));
  EXPECT_THAT(w.status().message(), HasSubstr("head_dim=128"));
}

WorkerRegistration ModelWorker(const std::string& model) {
  return {.layout = Layout(),
          .model = model,
          .num_device_blocks = 10,
          .tenant = "",
          .pid = 1,
          .name = "w"};
}

TEST(CoordinatorModelTest, AnotherModelIsRefusedNamingBoth) {
  Coordinator c =
      Coordinator::Create(
          {.layout = Layout(), .model = "org/model-a", .host_slots = 10})
          .value();
  StatusOr<WorkerId> b = c.RegisterWorker(ModelWorker("org/model-b"));
  ASSERT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status().message(), HasSubstr("\"org/model-a\""));
  EXPECT_THAT(b.status().message(), HasSubstr("\"org/model-b\""));
  StatusOr<WorkerId> unnamed = c.RegisterWorker(ModelWorker(""));
  ASSERT_EQ(unnamed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(unnamed.status().message(), HasSubstr("(unnamed)"));
  EXPECT_THAT(c.RegisterWorker(ModelWorker("org/model-a")), IsOk());
  EXPECT_EQ(c.stats().model, "org/model-a");
}

TEST(CoordinatorModelTest, AnUnnamedStoreRefusesANamedWorker) {
  Coordinator c =
      Coordinator::Create({.layout = Layout(), .host_slots = 10}).value();
  EXPECT_EQ(c.RegisterWorker(ModelWorker("org/model-a")).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.RegisterWorker(ModelWorker("")), IsOk());
}

TEST(CoordinatorModelTest, BadModelNamesAreInvalid) {
  EXPECT_EQ(Coordinator::Create(
                {.layout = Layout(), .model = "two words", .host_slots = 10})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  Coordinator c =
      Coordinator::Create({.layout = Layout(), .host_slots = 10}).value();
  EXPECT_EQ(
      c.RegisterWorker(ModelWorker(std::string(200, 'm'))).status().code(),
      StatusCode::kInvalidArgument);
}

// The model is part of every key: the same tokens under another model are
// another block, even where no registration check stood in the way (a
// disk tier written by another model's store).
TEST(CoordinatorModelTest, KeysAreInTheModelsNamespace) {
  Coordinator c =
      Coordinator::Create({.layout = Layout(), .model = "m", .host_slots = 10})
          .value();
  const WorkerId w = c.RegisterWorker(ModelWorker("m")).value();
  const std::vector<TokenId> t = SequentialTokens(1, 16);
  ASSERT_THAT(c.Lookup(w, 1, t, 0, {}), IsOk());
  ASSERT_THAT(c.Allocate(w, 1, Range(1, 2), 0), IsOk());
  CommitResult commit = c.Commit(w, 1, 16, Range(1, 2)).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  std::vector<CompletedEvent> done{{commit.stores[0].ref, true}};
  ASSERT_THAT(c.Complete(w, done), IsOk());

  auto key_under = [&t](const std::string& fingerprint) {
    std::vector<BlockKey> keys;
    KeyHasher({.model_fingerprint = fingerprint, .tenant = ""})
        .AppendPrefixKeys(t, 16, {}, &keys);
    return keys.at(0);
  };
  EXPECT_TRUE(c.host_pool()
                  .FindKeyedBlock(key_under(StoreFingerprint(Layout(), "m")))
                  .has_value());
  EXPECT_FALSE(c.host_pool()
                   .FindKeyedBlock(key_under(Layout().Fingerprint()))
                   .has_value());
}

}  // namespace
}  // namespace tierkv
