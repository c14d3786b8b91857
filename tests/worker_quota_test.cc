// Workers that misbehave cannot starve the others or corrupt the store:
// per-worker caps (a worker's share of the host slots, its open requests and
// their state bytes, its events in flight, workers per uid) in the
// coordinator and through a real tierkvd with stopped and never-completing
// worker processes (WorkerQuota*), and host slots overwritten by a worker
// that did not own them, caught by their checksums before they spill to
// disk or, with --verify-loads, before they are loaded (TenantIsolation*).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "src/coordinator.h"
#include "tests/child_process.h"
#include "tests/manual_lower_tier.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client.h"
#include "tiers/host_tier.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Clock = std::chrono::steady_clock;

std::vector<BlockId> Range(BlockId first, BlockId last) {
  std::vector<BlockId> v;
  for (BlockId b = first; b <= last; ++b) v.push_back(b);
  return v;
}

// ---- The coordinator's caps ------------------------------------------------

class WorkerQuotaTest : public ::testing::Test {
 protected:
  // 10 usable host slots; a worker's share is 5.
  explicit WorkerQuotaTest(CoordinatorOptions options = Options())
      : c_(Coordinator::Create(options).value()) {}

  static CoordinatorOptions Options() {
    return {.layout = TestLayout(), .host_slots = 11};
  }
  WorkerId Register(uint32_t uid = 1000) {
    return c_
        .RegisterWorker({.layout = TestLayout(),
                         .num_device_blocks = 100,
                         .tenant = "",
                         .pid = 1,
                         .uid = uid,
                         .name = "w"})
        .value();
  }
  // Looks `tokens` up as request `id`, allocates without a load and commits
  // every full block; the store (if any) is left in flight.
  CommitResult CommitAll(WorkerId w, RequestId id,
                         const std::vector<TokenId>& tokens) {
    EXPECT_THAT(c_.Lookup(w, id, tokens, 0, {}), IsOk());
    const std::vector<BlockId> device =
        Range(1, static_cast<BlockId>(tokens.size() / 16 + 1));
    EXPECT_THAT(c_.Allocate(w, id, device, 0), IsOk());
    return c_.Commit(w, id, static_cast<int32_t>(tokens.size()), device)
        .value();
  }
  void CompleteAll(WorkerId w, const CommitResult& commit) {
    for (const TransferEvent& e : commit.stores) {
      const CompletedEvent done[] = {{e.ref, true}};
      EXPECT_THAT(c_.Complete(w, done), IsOk());
    }
  }
  const WorkerStats& Worker(const CoordinatorStats& s, WorkerId w) {
    for (const WorkerStats& ws : s.workers) {
      if (ws.id == w) return ws;
    }
    ADD_FAILURE() << "worker " << w << " not listed";
    static const WorkerStats none;
    return none;
  }

  Coordinator c_;
};

TEST_F(WorkerQuotaTest, AStoreNeverCompletedHoldsAtMostItsShare) {
  const WorkerId hog = Register();
  const WorkerId other = Register();
  // The hog commits 8 blocks and never completes: it gets its share, 5.
  const CommitResult hogged = CommitAll(hog, 1, SequentialTokens(1, 8 * 16));
  ASSERT_EQ(hogged.stores.size(), 1u);
  EXPECT_EQ(hogged.stores[0].host_blocks.size(), 5u);
  EXPECT_EQ(hogged.skipped_blocks, 3);
  EXPECT_EQ(hogged.store_status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(hogged.store_status.message(), HasSubstr("worker_pin_share"));
  EXPECT_THAT(hogged.store_status.message(), HasSubstr("its cap"));
  // Its next request is told at once that it can store nothing.
  ASSERT_THAT(c_.Lookup(hog, 2, SequentialTokens(500, 32), 0, {}), IsOk());
  const AllocateResult told = c_.Allocate(hog, 2, Range(1, 2), 0).value();
  EXPECT_EQ(told.store_status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(told.store_status.message(), HasSubstr("worker_pin_share"));

  // The other worker still stores: the rest of the host is its to use.
  const CommitResult stored =
      CommitAll(other, 1, SequentialTokens(1000, 5 * 16));
  ASSERT_EQ(stored.stores.size(), 1u);
  EXPECT_EQ(stored.stores[0].host_blocks.size(), 5u);
  EXPECT_THAT(stored.store_status, IsOk());
  CompleteAll(other, stored);

  CoordinatorStats s = c_.stats();
  EXPECT_EQ(Worker(s, hog).pinned_slots, 5);
  EXPECT_EQ(Worker(s, other).pinned_slots, 0);
  EXPECT_EQ(s.host.quota_pin_refusals, 3u);
  // Once its store completes, the hog's pins go and it stores again.
  CompleteAll(hog, hogged);
  ASSERT_THAT(c_.Finish(hog, 1), IsOk());
  EXPECT_EQ(Worker(c_.stats(), hog).pinned_slots, 0);
  const CommitResult again = c_.Commit(hog, 2, 32, Range(1, 2)).value();
  EXPECT_THAT(again.store_status, IsOk());
  EXPECT_EQ(again.stores.at(0).host_blocks.size(), 2u);
}

TEST_F(WorkerQuotaTest, LookupHitsAreCutAtTheShare) {
  // Eight blocks of one prompt on host, stored five, then three at a time.
  const WorkerId w = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 8 * 16);
  CompleteAll(w,
              CommitAll(w, 1, std::vector<TokenId>(t.begin(), t.begin() + 80)));
  ASSERT_THAT(c_.Finish(w, 1), IsOk());
  ASSERT_THAT(c_.Lookup(w, 2, t, /*num_computed_tokens=*/80, {}), IsOk());
  ASSERT_THAT(c_.Allocate(w, 2, Range(1, 9), 0), IsOk());
  const CommitResult rest = c_.Commit(w, 2, 128, Range(1, 9)).value();
  ASSERT_EQ(rest.stores.size(), 1u);
  EXPECT_EQ(rest.stores[0].host_blocks.size(), 3u);
  CompleteAll(w, rest);
  ASSERT_THAT(c_.Finish(w, 2), IsOk());
  EXPECT_EQ(c_.stats().host.cached_slots, 8);

  // A reader's lookup pins its share of them, 5, and reports those.
  const WorkerId reader = Register();
  std::vector<TokenId> with_more = t;
  with_more.push_back(7);
  EXPECT_EQ(c_.Lookup(reader, 1, with_more, 0, {}).value().hit_tokens, 80);
  EXPECT_EQ(Worker(c_.stats(), reader).pinned_slots, 5);
  EXPECT_EQ(c_.stats().host.quota_pin_refusals, 1u);
  // Its other requests can store nothing until those pins go.
  const CommitResult none = CommitAll(reader, 2, SequentialTokens(5000, 32));
  EXPECT_TRUE(none.stores.empty());
  EXPECT_EQ(none.store_status.code(), StatusCode::kResourceExhausted);
  ASSERT_THAT(c_.Finish(reader, 1), IsOk());
  ASSERT_THAT(c_.Finish(reader, 2), IsOk());
  EXPECT_EQ(Worker(c_.stats(), reader).pinned_slots, 0);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

TEST_F(WorkerQuotaTest, PinsOfEveryKindAreCountedAndReturned) {
  const WorkerId w = Register();
  const WorkerId r = Register();
  const std::vector<TokenId> t = SequentialTokens(1, 4 * 16);
  CompleteAll(w, CommitAll(w, 1, t));
  ASSERT_THAT(c_.Finish(w, 1), IsOk());
  std::vector<TokenId> with_more = t;
  with_more.push_back(7);
  // A lookup pins 4 hits; its allocate loads 2 and drops the other 2.
  ASSERT_EQ(c_.Lookup(r, 1, with_more, 0, {}).value().hit_tokens, 64);
  EXPECT_EQ(Worker(c_.stats(), r).pinned_slots, 4);
  const AllocateResult alloc = c_.Allocate(r, 1, Range(1, 5), 32).value();
  ASSERT_TRUE(alloc.load.has_value());
  EXPECT_EQ(Worker(c_.stats(), r).pinned_slots, 2);
  const CommitResult commit = c_.Commit(r, 1, 65, Range(1, 5)).value();
  EXPECT_TRUE(commit.stores.empty());  // Its blocks are on host already.
  const CompletedEvent loaded[] = {{alloc.load->ref, true}};
  ASSERT_THAT(c_.Complete(r, loaded), IsOk());
  EXPECT_EQ(Worker(c_.stats(), r).pinned_slots, 0);
  // A dropped worker's pins go with it.
  ASSERT_THAT(c_.Lookup(r, 2, with_more, 0, {}), IsOk());
  ASSERT_THAT(c_.DropWorker(r), IsOk());
  EXPECT_EQ(c_.stats().host.pinned_slots, 0);
  EXPECT_THAT(c_.host_pool().CheckInvariants(), IsOk());
}

class WorkerQuotaCapsTest : public WorkerQuotaTest {
 protected:
  WorkerQuotaCapsTest() : WorkerQuotaTest(CapOptions()) {}
  static CoordinatorOptions CapOptions() {
    CoordinatorOptions o = Options();
    o.host_slots = 101;
    o.caps.max_requests_per_worker = 4;
    o.caps.max_request_bytes_per_worker = 1 << 20;
    o.caps.max_events_per_worker = 2;
    o.caps.max_workers_per_uid = 2;
    return o;
  }
};

TEST_F(WorkerQuotaCapsTest, OpenRequestsPastTheCapAreRefused) {
  const WorkerId w = Register();
  for (RequestId id = 1; id <= 4; ++id) {
    ASSERT_THAT(c_.Lookup(w, id, SequentialTokens(id * 100, 20), 0, {}),
                IsOk());
  }
  StatusOr<LookupResult> refused =
      c_.Lookup(w, 5, SequentialTokens(9000, 20), 0, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_requests_per_worker"));
  // A request already open may look up again; finishing one makes room.
  EXPECT_THAT(c_.Lookup(w, 4, SequentialTokens(400, 20), 0, {}), IsOk());
  ASSERT_THAT(c_.Finish(w, 1), IsOk());
  EXPECT_THAT(c_.Lookup(w, 5, SequentialTokens(9000, 20), 0, {}), IsOk());
  EXPECT_EQ(c_.stats().host.quota_request_refusals, 1u);
  EXPECT_EQ(Worker(c_.stats(), w).requests, 4u);
}

TEST_F(WorkerQuotaCapsTest, RequestStateStaysUnderItsBytes) {
  const WorkerId w = Register();
  // 64Ki tokens keep 256 KiB of token ids and 4Ki blocks of keys and hits
  // (80 KiB): three fit in 1 MiB, a fourth does not, however often asked.
  const std::vector<TokenId> big = SequentialTokens(1, 64 << 10);
  for (RequestId id = 1; id <= 3; ++id) {
    ASSERT_THAT(c_.Lookup(w, id, big, 0, {}), IsOk());
  }
  const uint64_t held = c_.stats().host.request_state_bytes;
  EXPECT_EQ(held, 3u * ((64u << 10) * 4 + (4u << 10) * 20));
  for (RequestId id = 4; id < 400; ++id) {
    StatusOr<LookupResult> refused = c_.Lookup(w, 4, big, 0, {});
    ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("max_request_bytes_per_worker"));
  }
  CoordinatorStats s = c_.stats();
  EXPECT_EQ(s.host.request_state_bytes, held);
  EXPECT_LE(s.host.request_state_bytes, uint64_t{1} << 20);
  EXPECT_EQ(Worker(s, w).request_state_bytes, held);
  EXPECT_EQ(s.host.quota_request_bytes_refusals, 396u);
  EXPECT_EQ(Worker(s, w).requests, 3u);
  // A repeated lookup of an open request replaces its state.
  EXPECT_THAT(c_.Lookup(w, 3, big, 0, {}), IsOk());
  EXPECT_EQ(c_.stats().host.request_state_bytes, held);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_THAT(c_.Finish(w, id), IsOk());
  EXPECT_EQ(c_.stats().host.request_state_bytes, 0u);
  // A dropped worker's state goes with it.
  ASSERT_THAT(c_.Lookup(w, 1, big, 0, {}), IsOk());
  ASSERT_THAT(c_.DropWorker(w), IsOk());
  EXPECT_EQ(c_.stats().host.request_state_bytes, 0u);
}

TEST_F(WorkerQuotaCapsTest, EventsPastTheCapStoreNothing) {
  const WorkerId w = Register();
  const CommitResult a = CommitAll(w, 1, SequentialTokens(100, 16));
  const CommitResult b = CommitAll(w, 2, SequentialTokens(200, 16));
  ASSERT_EQ(a.stores.size(), 1u);
  ASSERT_EQ(b.stores.size(), 1u);
  const CommitResult c = CommitAll(w, 3, SequentialTokens(300, 16));
  EXPECT_TRUE(c.stores.empty());
  EXPECT_EQ(c.skipped_blocks, 1);
  EXPECT_EQ(c.store_status.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(c.store_status.message(), HasSubstr("max_events_per_worker"));
  EXPECT_EQ(c_.stats().host.quota_event_refusals, 1u);
  CompleteAll(w, a);
  const CommitResult d = CommitAll(w, 4, SequentialTokens(400, 16));
  EXPECT_EQ(d.stores.size(), 1u);
  EXPECT_THAT(d.store_status, IsOk());
}

// Loads count too: a worker that never completes them cannot grow them
// without bound (a load whose promotions all failed holds no pin).
TEST_F(WorkerQuotaCapsTest, LoadsPastTheEventCapAreRefusedChangingNothing) {
  const WorkerId storer = Register(1001);
  const std::vector<TokenId> prompt = SequentialTokens(700, 32);
  CompleteAll(storer, CommitAll(storer, 1, prompt));
  const WorkerId w = Register();
  const CommitResult a = CommitAll(w, 1, SequentialTokens(100, 16));
  ASSERT_EQ(a.stores.size(), 1u);
  ASSERT_EQ(CommitAll(w, 2, SequentialTokens(200, 16)).stores.size(), 1u);
  ASSERT_EQ(
      c_.Lookup(w, 3, SequentialTokens(700, 48), 0, {}).value().hit_tokens, 32);
  const int64_t pinned = Worker(c_.stats(), w).pinned_slots;
  StatusOr<AllocateResult> refused = c_.Allocate(w, 3, Range(1, 3), 32);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_events_per_worker"));
  EXPECT_EQ(c_.stats().host.quota_event_refusals, 1u);
  EXPECT_EQ(Worker(c_.stats(), w).pinned_slots, pinned);  // Hits still held.
  // With an event completed, the same request loads.
  CompleteAll(w, a);
  const AllocateResult loaded = c_.Allocate(w, 3, Range(1, 3), 32).value();
  ASSERT_TRUE(loaded.load.has_value());
  EXPECT_EQ(loaded.load->host_blocks.size(), 2u);
  // A request that loads nothing is never refused for the cap.
  ASSERT_THAT(c_.Lookup(w, 4, SequentialTokens(900, 16), 0, {}), IsOk());
  EXPECT_THAT(c_.Allocate(w, 4, Range(1, 2), 0), IsOk());
}

TEST_F(WorkerQuotaCapsTest, RegistrationsPerUidAreCapped) {
  const WorkerId first = Register(1000);
  Register(1000);
  StatusOr<WorkerId> third = c_.RegisterWorker({.layout = TestLayout(),
                                                .num_device_blocks = 1,
                                                .tenant = "",
                                                .pid = 2,
                                                .uid = 1000,
                                                .name = "third"});
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("uid 1000"));
  EXPECT_THAT(third.status().message(), HasSubstr("max_workers_per_uid"));
  EXPECT_EQ(c_.stats().host.quota_registration_refusals, 1u);
  Register(1001);  // Another user is not held back.
  ASSERT_THAT(c_.DropWorker(first), IsOk());
  Register(1000);
  EXPECT_EQ(c_.stats().workers.at(0).uid, 1000u);
}

// One user's workers together pin at most uid_pin_share of the slots: a
// second worker of the same uid cannot take what a first left for others.
TEST(WorkerQuotaUidTest, OneUsersWorkersTogetherPinAtMostItsShare) {
  // 10 usable slots: 5 a worker, 7 a uid.
  Coordinator c = Coordinator::Create(
                      {.layout = TestLayout(),
                       .host_slots = 11,
                       .caps = {.worker_pin_share = 0.5, .uid_pin_share = 0.7}})
                      .value();
  auto reg = [&](uint32_t uid, bool op = false) {
    return c
        .RegisterWorker({.layout = TestLayout(),
                         .num_device_blocks = 100,
                         .tenant = "",
                         .pid = 1,
                         .uid = uid,
                         .operator_uid = op,
                         .name = "w"})
        .value();
  };
  // Commits `blocks` blocks as request `id` and never completes them.
  auto hog = [&](WorkerId w, RequestId id, int blocks) {
    const std::vector<TokenId> t =
        SequentialTokens(static_cast<TokenId>(1000 * id), blocks * 16);
    EXPECT_THAT(c.Lookup(w, id, t, 0, {}), IsOk());
    const std::vector<BlockId> device = Range(1, blocks + 1);
    EXPECT_THAT(c.Allocate(w, id, device, 0), IsOk());
    return c.Commit(w, id, blocks * 16, device).value();
  };
  const WorkerId a = reg(1000), b = reg(1000);
  EXPECT_EQ(hog(a, 1, 8).stores.at(0).host_blocks.size(), 5u);
  const CommitResult second = hog(b, 2, 8);
  ASSERT_EQ(second.stores.size(), 1u);
  EXPECT_EQ(second.stores[0].host_blocks.size(), 2u);  // 7 for uid 1000.
  EXPECT_THAT(second.store_status.message(), HasSubstr("uid_pin_share"));
  EXPECT_THAT(second.store_status.message(), HasSubstr("uid 1000"));
  // Another user still stores in what is left.
  const WorkerId other = reg(1001);
  EXPECT_EQ(hog(other, 3, 8).stores.at(0).host_blocks.size(), 3u);
  // Dropped, a worker's pins leave its uid's count.
  ASSERT_THAT(c.DropWorker(b), IsOk());
  ASSERT_THAT(c.DropWorker(other), IsOk());
  const WorkerId again = reg(1000);
  EXPECT_EQ(hog(again, 4, 8).stores.at(0).host_blocks.size(), 2u);
  // An operator's uid is held to each worker's share only.
  ASSERT_THAT(c.DropWorker(again), IsOk());
  const WorkerId root = reg(0, /*op=*/true);
  const WorkerId root2 = reg(0, /*op=*/true);
  EXPECT_EQ(hog(root, 5, 3).stores.at(0).host_blocks.size(), 3u);
  EXPECT_EQ(hog(root2, 6, 3).stores.at(0).host_blocks.size(), 2u);  // Full.
  EXPECT_THAT(c.host_pool().CheckInvariants(), IsOk());
}

// A worker asking for stats (over its channel) sees the workers of its own
// uid only: another user's workers' names, pids and requests are theirs. An
// operator's worker, like tierkv-admin, sees every one.
TEST(WorkerQuotaUidTest, AWorkerSeesOnlyItsOwnUsersWorkersInStats) {
  Coordinator c =
      Coordinator::Create({.layout = TestLayout(), .host_slots = 11}).value();
  auto reg = [&](uint32_t uid, std::string name, bool op = false) {
    return c
        .RegisterWorker({.layout = TestLayout(),
                         .num_device_blocks = 1,
                         .tenant = "",
                         .pid = static_cast<int32_t>(uid),
                         .uid = uid,
                         .operator_uid = op,
                         .name = std::move(name)})
        .value();
  };
  const WorkerId alice = reg(1000, "alice-engine");
  reg(1000, "alice-engine-2");
  reg(1001, "bob-engine");
  const WorkerId root = reg(0, "operator", /*op=*/true);
  auto names = [&](WorkerId viewer) {
    StatusOr<CoordinatorStats> seen = c.StatsSeenBy(viewer);
    std::vector<std::string> out;
    if (!seen.ok()) return out;
    for (const WorkerStats& w : seen->workers) out.push_back(w.name);
    return out;
  };
  EXPECT_THAT(names(alice),
              UnorderedElementsAre("alice-engine", "alice-engine-2"));
  EXPECT_THAT(names(root),
              UnorderedElementsAre("alice-engine", "alice-engine-2",
                                   "bob-engine", "operator"));
  EXPECT_EQ(c.StatsSeenBy(alice).value().host.capacity_slots,
            c.stats().host.capacity_slots);
  EXPECT_EQ(c.StatsSeenBy(12345).status().code(), StatusCode::kNotFound);
}

// With tenant isolation, one user cannot take every tenant segment.
TEST(WorkerQuotaTenantsTest, TenantsPerUidAreCapped) {
  Coordinator c = Coordinator::Create({.layout = TestLayout(),
                                       .host_slots = 11,
                                       .caps = {.max_tenants_per_uid = 2},
                                       .max_tenants = 7})
                      .value();
  auto reg = [&](uint32_t uid, std::string tenant, bool op = false) {
    return c.RegisterWorker({.layout = TestLayout(),
                             .num_device_blocks = 1,
                             .tenant = std::move(tenant),
                             .pid = 1,
                             .uid = uid,
                             .operator_uid = op,
                             .name = "w"});
  };
  const WorkerId a = reg(1000, "a").value();
  ASSERT_THAT(reg(1000, "b"), IsOk());
  StatusOr<WorkerId> third = reg(1000, "c");
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("uid 1000"));
  EXPECT_THAT(third.status().message(), HasSubstr("max_tenants_per_uid"));
  EXPECT_EQ(c.stats().host.quota_registration_refusals, 1u);
  // A tenant the user already brought attaches more workers; a tenant
  // counts for as long as it holds its segment, workers or not.
  EXPECT_THAT(reg(1000, "a"), IsOk());
  ASSERT_THAT(c.DropWorker(a), IsOk());
  EXPECT_EQ(reg(1000, "c").status().code(), StatusCode::kResourceExhausted);
  // Another user still has room, up to the store's max_tenants; an
  // operator's uid is not held to the cap.
  ASSERT_THAT(reg(0, "root-a", /*op=*/true), IsOk());
  ASSERT_THAT(reg(0, "root-b", /*op=*/true), IsOk());
  ASSERT_THAT(reg(0, "root-c", /*op=*/true), IsOk());
  ASSERT_THAT(reg(1001, "c"), IsOk());
  EXPECT_EQ(c.SegmentOf(reg(1001, "c").value()).value(), 5u);
  ASSERT_THAT(reg(1001, "d"), IsOk());
  StatusOr<WorkerId> eighth = reg(1002, "e");
  EXPECT_EQ(eighth.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(eighth.status().message(), HasSubstr("(max_tenants)"));
}

// Past max_tenants, a new tenant takes the segment of the tenant idle
// longest: that tenant's host blocks are dropped, its slots go back to
// segment 0, and the segment gets new memory, so a process of the old
// tenant that kept its mapping reads and writes nothing of the new one's.
TEST(WorkerQuotaTenantsTest, AnIdleTenantsSegmentPassesWithNewMemory) {
  const KvLayout layout = TestLayout();
  StatusOr<std::unique_ptr<HostTier>> host =
      HostTier::Create({.shared = true,
                        .max_segments = 3,
                        .num_slots = 9,
                        .slot_bytes = layout.BlockBytes(),
                        .layout_fingerprint = "test"});
  ASSERT_THAT(host, IsOk());
  HostTier& tier = **host;
  std::vector<uint32_t> reset;
  Coordinator c =
      Coordinator::Create(
          {.layout = layout,
           .host_slots = tier.num_slots(),
           .max_tenants = 3,
           .assign_slot = [&tier](BlockId slot, uint32_t segment) -> Status {
             TIERKV_RETURN_IF_ERROR(tier.EnsureSegment(segment));
             return tier.AssignSlot(slot, segment);
           },
           .trim_segment = [&tier](uint32_t segment) { tier.Trim(segment); },
           .reset_segment =
               [&](uint32_t segment) {
                 reset.push_back(segment);
                 return tier.ResetSegment(segment);
               }})
          .value();
  auto reg = [&](const std::string& tenant) {
    return c.RegisterWorker({.layout = layout,
                             .num_device_blocks = 8,
                             .tenant = tenant,
                             .pid = 1,
                             .uid = 1000,
                             .name = tenant});
  };
  // Stores two blocks through `w`, their slots filled with `fill`; returns
  // the slots.
  auto store = [&](WorkerId w, RequestId id, TokenId first, int fill) {
    const std::vector<TokenId> tokens = SequentialTokens(first, 32);
    EXPECT_THAT(c.Lookup(w, id, tokens, 0, {}), IsOk());
    const std::vector<BlockId> device = {1, 2, 3};
    EXPECT_THAT(c.Allocate(w, id, device, 0), IsOk());
    CommitResult commit = c.Commit(w, id, 32, device).value();
    std::vector<BlockId> slots;
    for (const TransferEvent& e : commit.stores) {
      for (BlockId slot : e.host_blocks) {
        std::memset(tier.slot(slot), fill, tier.slot_bytes());
        slots.push_back(slot);
      }
      const std::vector<CompletedEvent> done{{e.ref, true}};
      EXPECT_THAT(c.Complete(w, done), IsOk());
    }
    EXPECT_THAT(c.Finish(w, id), IsOk());
    return slots;
  };
  auto hit_tokens = [&](WorkerId w, RequestId id, TokenId first) {
    const int32_t hit =
        c.Lookup(w, id, SequentialTokens(first, 33), 0, {}).value().hit_tokens;
    EXPECT_THAT(c.Finish(w, id), IsOk());
    return hit;
  };

  const WorkerId a = reg("tenant-a").value();  // Segment 0.
  const WorkerId b = reg("tenant-b").value();  // Segment 1.
  const WorkerId d = reg("tenant-d").value();  // Segment 2.
  ASSERT_EQ(store(a, 1, 100, 0x11).size(), 2u);
  ASSERT_EQ(store(b, 2, 200, 0x22).size(), 2u);
  ASSERT_EQ(store(d, 3, 300, 0x33).size(), 2u);
  // What a process of tenant B maps, and keeps mapping after it leaves.
  StatusOr<ShmSegment> old_view =
      ShmSegment::MapSealed(dup(tier.segment_fd(1)), /*writable=*/true);
  ASSERT_THAT(old_view, IsOk());

  // Every tenant has a worker: a fourth is refused.
  StatusOr<WorkerId> refused = reg("tenant-c");
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("(max_tenants)"));
  EXPECT_THAT(refused.status().message(), HasSubstr("worker registered"));
  // Tenant A's segment 0 is never given away, idle or not.
  ASSERT_THAT(c.DropWorker(a), IsOk());
  EXPECT_EQ(reg("tenant-c").status().code(), StatusCode::kResourceExhausted);

  // B, then D leave: B has been idle longer, so C takes segment 1.
  ASSERT_THAT(c.DropWorker(b), IsOk());
  ASSERT_THAT(c.DropWorker(d), IsOk());
  const CoordinatorStats before = c.stats();
  const WorkerId cw = reg("tenant-c").value();
  EXPECT_EQ(c.SegmentOf(cw).value(), 1u);
  EXPECT_THAT(reset, ::testing::ElementsAre(1u));
  const CoordinatorStats after = c.stats();
  EXPECT_EQ(after.host.tenants_reclaimed, 1u);
  EXPECT_EQ(after.host.cached_slots, before.host.cached_slots - 2);
  // Lost, but no lower tier: evicted_unspilled counts only what one lacks.
  EXPECT_EQ(after.host.evicted_unspilled, 0u);
  EXPECT_EQ(after.host.quota_registration_refusals, 2u);
  // Tenant D, idle but not chosen, keeps its segment and its blocks.
  const WorkerId d2 = reg("tenant-d").value();
  EXPECT_EQ(hit_tokens(d2, 4, 300), 32);
  ASSERT_THAT(c.DropWorker(d2), IsOk());

  // C's blocks live in the segment's new memory: B's old mapping neither
  // sees them nor reaches them.
  const std::vector<BlockId> slots = store(cw, 5, 500, 0x55);
  ASSERT_EQ(slots.size(), 2u);
  const std::span<std::byte> old_bytes(old_view->data(), old_view->size());
  EXPECT_LT(std::ranges::count(old_bytes, std::byte{0x55}),
            static_cast<std::ptrdiff_t>(tier.slot_bytes()));
  std::ranges::fill(old_bytes, std::byte{0xEE});
  for (const BlockId slot : slots) {
    const std::span<const std::byte> bytes(tier.slot(slot), tier.slot_bytes());
    EXPECT_EQ(std::ranges::count(bytes, std::byte{0x55}),
              static_cast<std::ptrdiff_t>(tier.slot_bytes()))
        << "slot " << slot;
  }
  EXPECT_EQ(hit_tokens(cw, 6, 500), 32);
}

// An idle tenant whose slots a copy still uses (here: promotions its
// worker started before it left) keeps its segment until the copy ends;
// then it passes, and its uid may bring another tenant again.
TEST(WorkerQuotaTenantsTest, AnIdleTenantWithACopyRunningKeepsItsSegment) {
  ManualLowerTier lower;
  std::vector<uint32_t> reset;
  Coordinator c = Coordinator::Create({.layout = TestLayout(),
                                       .host_slots = 11,
                                       .lower = &lower,
                                       .caps = {.max_tenants_per_uid = 2},
                                       .max_tenants = 2,
                                       .reset_segment =
                                           [&reset](uint32_t segment) {
                                             reset.push_back(segment);
                                             return Status::Ok();
                                           }})
                      .value();
  auto reg = [&](uint32_t uid, const std::string& tenant) {
    return c.RegisterWorker({.layout = TestLayout(),
                             .num_device_blocks = 8,
                             .tenant = tenant,
                             .pid = 1,
                             .uid = uid,
                             .name = tenant});
  };
  const WorkerId a = reg(1000, "a").value();  // Segment 0.
  const WorkerId b = reg(1000, "b").value();  // Segment 1.
  // The lower tier holds every block: B's load promotes two into its
  // segment, and leaves before they land.
  const std::vector<TokenId> tokens = SequentialTokens(1, 33);
  ASSERT_EQ(c.Lookup(b, 1, tokens, 0, {}).value().disk_hit_tokens, 32);
  ASSERT_TRUE(c.Allocate(b, 1, Range(1, 3), 32).value().load_pending);
  ASSERT_EQ(lower.promotions.size(), 2u);
  ASSERT_THAT(c.DropWorker(b), IsOk());

  StatusOr<WorkerId> refused = reg(1001, "c");
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("a copy running"));
  EXPECT_THAT(reset, IsEmpty());

  for (auto& done : lower.promotions) done(uint64_t{0});
  ASSERT_EQ(c.PumpLowerTier(), 0u);  // The load itself was released.
  const WorkerId cw = reg(1001, "c").value();
  EXPECT_EQ(c.SegmentOf(cw).value(), 1u);
  EXPECT_THAT(reset, ::testing::ElementsAre(1u));
  const CoordinatorStats s = c.stats();
  EXPECT_EQ(s.host.tenants_reclaimed, 1u);
  EXPECT_EQ(s.host.evicted_unspilled, 0u);  // The lower tier holds them.
  EXPECT_EQ(s.host.cached_slots, 0);

  // Uid 1000 brought two tenants, its cap; B's segment went, so it may
  // bring one more, which takes C's once C is idle.
  ASSERT_THAT(c.DropWorker(cw), IsOk());
  const WorkerId d = reg(1000, "d").value();
  EXPECT_EQ(c.SegmentOf(d).value(), 1u);
  EXPECT_EQ(c.stats().host.tenants_reclaimed, 2u);
  EXPECT_THAT(c.DropWorker(a), IsOk());
}

TEST(WorkerQuotaOptionsTest, BadCapsAreInvalid) {
  for (double share : {0.0, -1.0, 1.5}) {
    EXPECT_EQ(Coordinator::Create({.layout = TestLayout(),
                                   .host_slots = 10,
                                   .caps = {.worker_pin_share = share}})
                  .status()
                  .code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(Coordinator::Create({.layout = TestLayout(),
                                   .host_slots = 10,
                                   .caps = {.uid_pin_share = share}})
                  .status()
                  .code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Coordinator::Create({.layout = TestLayout(),
                                 .host_slots = 10,
                                 .caps = {.max_tenants_per_uid = 0}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Coordinator::Create({.layout = TestLayout(),
                                 .host_slots = 10,
                                 .caps = {.max_requests_per_worker = 0}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      Coordinator::Create(
          {.layout = TestLayout(), .host_slots = 10, .verify_on_load = true})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
  // A share smaller than one slot still lets a worker store one block.
  EXPECT_THAT(Coordinator::Create({.layout = TestLayout(),
                                   .host_slots = 3,
                                   .caps = {.worker_pin_share = 0.01}}),
              IsOk());
}

// ---- Through tierkvd and worker processes ----------------------------------

class WorkerQuotaTierkvdTest : public TierkvdFixture {
 protected:
  // A host of `slots` usable slots (no disk tier).
  void StartWithSlots(int slots, const std::vector<std::string>& more = {}) {
    StartDaemon(std::to_string((slots + 1) * TestLayout().BlockBytes()), more);
  }
  // The stats of the worker named `name`, once it has `pinned` pins.
  static WorkerStats WaitForPins(Client& observer, const std::string& name,
                                 int64_t pinned) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    for (;;) {
      StatusOr<CoordinatorStats> s = observer.Stats();
      EXPECT_THAT(s, IsOk());
      if (!s.ok()) return {};
      for (const WorkerStats& w : s->workers) {
        if (w.name == name &&
            (w.pinned_slots == pinned || Clock::now() > deadline)) {
          return w;
        }
      }
      if (Clock::now() > deadline) return {};
      std::this_thread::yield();
    }
  }
};

TEST_F(WorkerQuotaTierkvdTest, AStoreNeverCompletedLeavesOthersTheirShare) {
  StartWithSlots(16);  // A worker's share: 8.
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  // Commits 12 blocks and never completes them.
  auto hog = Worker("hang-store", 9, 12);
  ASSERT_TRUE(hog->WaitForOutput("READY")) << hog->output();
  const WorkerStats held = WaitForPins(*observer, "hang-store-9", 8);
  EXPECT_EQ(held.pinned_slots, 8);
  EXPECT_EQ(held.uid, getuid());
  EXPECT_EQ(observer->Stats().value().host.quota_pin_refusals, 4u);

  // Stopped, it still holds no more than its share; the others store and
  // load in the rest.
  hog->Freeze();
  for (int seed : {7, 11}) {
    auto store = Worker("store", seed, 8);
    ASSERT_EQ(store->Wait(), 0) << store->output();
    auto load = Worker("load", seed, 8);
    ASSERT_EQ(load->Wait(), 0) << load->output();
    EXPECT_THAT(load->output(), HasSubstr("hit 128 "));
  }
  EXPECT_EQ(WaitForPins(*observer, "hang-store-9", 8).pinned_slots, 8);
  hog->Thaw();
  hog->Signal(SIGKILL);
  hog->Wait();
  EXPECT_EQ(SettledStats(*observer).host.pinned_slots, 0);
}

TEST_F(WorkerQuotaTierkvdTest, OpenLookupsPastTheCapsAreRefused) {
  StartDaemon("1M", {"--max-requests-per-worker", "16",
                     "--max-request-bytes-per-worker", "4M"});
  std::unique_ptr<Client> c = Attach("looker");
  ASSERT_NE(c, nullptr);
  // 200k tokens keep 800 KB of token ids and 12.5k blocks of keys and
  // hits: three fit in 4 MiB. Lookups never finished stay bounded.
  const std::vector<TokenId> big = SequentialTokens(1, 200'000);
  int refused = 0;
  for (RequestId id = 1; id <= 50; ++id) {
    StatusOr<LookupResult> r = c->Lookup(id, big);
    if (r.ok()) continue;
    ++refused;
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    EXPECT_THAT(r.status().message(),
                HasSubstr("max_request_bytes_per_worker"));
  }
  EXPECT_EQ(refused, 47);
  CoordinatorStats s = c->Stats().value();
  EXPECT_EQ(s.host.request_state_bytes, 3u * (200'000 * 4 + 12'500 * 20));
  EXPECT_EQ(s.host.quota_request_bytes_refusals, 47u);
  // Small lookups count against the open requests: 16 in all.
  for (RequestId id = 100; id < 113; ++id) {
    ASSERT_THAT(c->Lookup(id, SequentialTokens(id * 100, 20)), IsOk());
  }
  StatusOr<LookupResult> r = c->Lookup(200, SequentialTokens(1, 20));
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("max_requests_per_worker"));
  s = c->Stats().value();
  EXPECT_EQ(s.host.quota_request_refusals, 1u);
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].requests, 16u);
  EXPECT_EQ(s.workers[0].request_state_bytes, s.host.request_state_bytes);
  c.reset();  // Detaching drops every request's state.
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  EXPECT_EQ(SettledStats(*observer).host.request_state_bytes, 0u);
}

TEST_F(WorkerQuotaTierkvdTest, RegistrationsPerUidAreCapped) {
  StartDaemon("1M", {"--max-workers-per-uid", "2"});
  std::unique_ptr<Client> a = Attach("a");
  std::unique_ptr<Client> b = Attach("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const ClientOptions options = ClientOptionsFor("c");
  StatusOr<std::unique_ptr<Client>> c = Client::Open(options);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("max_workers_per_uid"));
  EXPECT_EQ(a->Stats().value().host.quota_registration_refusals, 1u);
  b.reset();
  // Once tierkvd has seen b's socket close, c attaches.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (a->Stats().value().workers.size() != 1 && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_THAT(Client::Open(options), IsOk());
}

// ---- Host slots overwritten by a worker that did not own them --------------

class TenantIsolationTest : public TierkvdFixture {
 protected:
  // The test process as a hostile worker: registers, maps the host slots
  // tierkvd passes it and writes 0xAA over every one of them, then detaches
  // (its mapping stays).
  void OverwriteEverySlot(Client& observer) {
    const CoordinatorStats s = observer.Stats().value();
    std::unique_ptr<RawWorker> hostile = RawAttach("hostile");
    ASSERT_NE(hostile, nullptr);
    StatusOr<std::unique_ptr<HostTier>> host = HostTier::Attach(
        hostile->host.release(), StoreFingerprint(TestLayout(), ""),
        TestLayout().BlockBytes(),
        static_cast<int32_t>(s.host.capacity_slots + 1));
    ASSERT_THAT(host, IsOk());
    for (BlockId slot = 1; slot < (*host)->num_slots(); ++slot) {
      std::memset((*host)->slot(slot), 0xAA, (*host)->slot_bytes());
    }
  }
  // "blocks B hit H missed M wrong W" from a verify worker of `seed`.
  std::string Verify(int seed, int requests) {
    auto verify = Worker("verify", seed, requests);
    EXPECT_EQ(verify->Wait(), 0) << verify->output();
    return verify->output();
  }
};

TEST_F(TenantIsolationTest, AnOverwrittenBlockIsDroppedNeverSpilled) {
  // Spills past 8 slots in use, down to 4. No write-behind: it could copy
  // the blocks to disk before they are overwritten, and the point here is
  // a spill of a block overwritten on host.
  StartDaemonWithDisk(16, {"--write-behind-spills", "0"});
  auto first = Worker("fill", 7, 2);
  ASSERT_EQ(first->Wait(), 0) << first->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  OverwriteEverySlot(*observer);

  // Another worker fills the host past its high watermark: the two
  // overwritten blocks, least recently used, are the first to spill.
  auto more = Worker("fill", 9, 8);
  ASSERT_EQ(more->Wait(), 0) << more->output();
  const CoordinatorStats s = SettledStats(*observer);
  EXPECT_EQ(s.host.corrupt_slots_dropped, 2u);
  EXPECT_GT(s.host.spills, 0u);
  EXPECT_EQ(s.host.spill_failures, 0u);
  ASSERT_TRUE(s.disk.has_value());
  // The disk holds what spilled, and nothing of the overwritten blocks:
  // they are gone from every tier.
  EXPECT_EQ(s.disk->keys, s.host.spills);
  EXPECT_EQ(s.disk->puts, s.host.spills);
  EXPECT_THAT(Verify(7, 2), HasSubstr("blocks 2 hit 0 missed 2 wrong 0"));
  EXPECT_THAT(Verify(9, 8), HasSubstr("hit 8 missed 0 wrong 0"));
  EXPECT_EQ(SettledStats(*observer).disk->checksum_failures, 0u);
}

TEST_F(TenantIsolationTest, VerifyOnLoadMakesAnOverwrittenBlockAMiss) {
  StartDaemon("1M", {"--verify-loads"});
  auto fill = Worker("fill", 7, 2);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  OverwriteEverySlot(*observer);
  EXPECT_THAT(Verify(7, 2), HasSubstr("blocks 2 hit 0 missed 2 wrong 0"));
  EXPECT_EQ(observer->Stats().value().host.corrupt_slots_dropped, 2u);
  // Dropped: a second reader misses them at lookup, nothing more counted.
  EXPECT_THAT(Verify(7, 2), HasSubstr("blocks 2 hit 0 missed 2 wrong 0"));
  const CoordinatorStats s = observer->Stats().value();
  EXPECT_EQ(s.host.corrupt_slots_dropped, 2u);
  EXPECT_EQ(s.host.cached_slots, 0);
  // Stored again, they load whole.
  auto refill = Worker("fill", 7, 2);
  ASSERT_EQ(refill->Wait(), 0) << refill->output();
  EXPECT_THAT(Verify(7, 2), HasSubstr("blocks 2 hit 2 missed 0 wrong 0"));
}

TEST_F(TenantIsolationTest, WithoutVerifyOnLoadTheOverwriteIsWhatLoads) {
  // What --verify-loads guards against: by default a load copies whatever
  // the slot holds (the spill check above still keeps it off the disk).
  StartDaemon("1M");
  auto fill = Worker("fill", 7, 2);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  OverwriteEverySlot(*observer);
  EXPECT_THAT(Verify(7, 2), HasSubstr("blocks 2 hit 2 missed 0 wrong 2"));
  EXPECT_EQ(observer->Stats().value().host.corrupt_slots_dropped, 0u);
}

}  // namespace
}  // namespace tierkv
