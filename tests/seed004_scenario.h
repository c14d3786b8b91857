// Seed 004's two-request flow (SimpleCPUOffloadConnector), step by step,
// through the worker Client against a real tierkvd (tierkvd_test), two
// engines sharing its host tier. coordinator_test checks the host side of
// the same flow in-process, down to the free-queue order.
//
// Where this differs from the seed, and why:
//  - The seed keys a 3-token partial block ("Hello, world!"). tierkv keys
//    full blocks only, so A is one full block of 16 tokens and B is A's
//    block plus a second full block (32 tokens).
//  - The seed's request B misses the GPU cache although GPU[1] still holds
//    A's key; that only happens when B runs in another engine. So B runs on
//    a second worker with its own 100 device blocks: B's device blocks are
//    [1, 2] (the seed's single GPU[2] holds both halves of its prompt).
//  - The seed prepares the store (step 6) before the forward pass (step
//    7); Commit reports blocks after the engine has filled them.
//  - Free queues are shown in the seed in id order; vLLM's queue (and
//    ours) appends freed blocks at the tail, so never-used blocks stay
//    ahead of them. The relative order the seed states (1 older than 2)
//    holds.
#ifndef TIERKV_TESTS_SEED004_SCENARIO_H_
#define TIERKV_TESTS_SEED004_SCENARIO_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "src/kv_cache_manager_internal.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tierkv/device_tier.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {

inline KvLayout Seed004Layout() { return TestLayout(); }

// One engine: its main pool (100 device blocks, null block 0), its device
// memory and its tierkv client.
struct Seed004Engine {
  // On the heap: the client keeps a pointer to it across moves.
  std::unique_ptr<KVCacheManager> manager_ptr;
  KVCacheManager& manager;
  std::unique_ptr<EmulatedDeviceTier> device;
  std::unique_ptr<Client> client;

  static Seed004Engine Open(const std::string& socket_path,
                            const std::string& name) {
    auto manager = std::make_unique<KVCacheManager>(
        KVCacheManager::Create({.pool = {.num_blocks = 100,
                                         .block_size = 16,
                                         .reserve_null_block = true}})
            .value());
    KVCacheManager& ref = *manager;
    Seed004Engine e{
        std::move(manager), ref,
        EmulatedDeviceTier::Create(100, Seed004Layout().BlockBytes()).value(),
        nullptr};
    ClientOptions options;
    options.socket_path = socket_path;
    options.layout = Seed004Layout();
    options.num_device_blocks = 100;
    options.name = name;
    options.device = e.device.get();
    options.engine = &ref;
    auto client = Client::Open(options);
    EXPECT_THAT(client, IsOk()) << client.status().ToString();
    if (client.ok()) e.client = std::move(*client);
    return e;
  }

  int32_t Ref(BlockId id) const { return PoolOf(manager).block(id).ref_cnt; }
  std::vector<BlockId> FreeQueue() const {
    return PoolOf(manager).FreeQueueSnapshot();
  }
  void Fill(BlockId id, uint8_t seed) {
    std::span<std::byte> b = device->block(id);
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
    }
  }
  // Waits for exactly one finished transfer (the test's only one in flight).
  FinishedTransfer WaitOne() {
    std::vector<FinishedTransfer> done;
    while (done.empty()) {
      done = client->WaitEvents(std::chrono::seconds(10));
    }
    EXPECT_EQ(done.size(), 1u);
    return done.front();
  }
};

inline std::vector<BlockId> Range(BlockId first, BlockId last) {
  std::vector<BlockId> v;
  for (BlockId b = first; b <= last; ++b) v.push_back(b);
  return v;
}

// Runs the flow. `host_stats` reads the host tier's stats (through a
// client, or tierkv-admin's socket path).
inline void RunSeed004(Seed004Engine& w1, Seed004Engine& w2) {
  using ::testing::ElementsAre;
  using ::testing::ElementsAreArray;
  auto host = [&w1] { return w1.client->Stats().value().host; };
  ASSERT_EQ(host().capacity_slots, 49);  // Blocks 1..49; 0 is null.
  KeyHasher hasher(KeyNamespace{"unused by the engine", ""});

  // ---- Request A: one full block, on worker 1 ----
  const std::vector<TokenId> a_tokens = SequentialTokens(1, 16);
  Request a(/*id=*/1, a_tokens, 16, hasher);
  // Steps 2-3: neither the device cache nor the host has it.
  EXPECT_EQ(w1.manager.GetComputedBlocks(a).num_tokens, 0);
  ASSERT_EQ(w1.client->Lookup(1, a_tokens).value().hit_tokens, 0);
  // Step 4: device block 1, ref 1; free queue [2..99].
  EXPECT_THAT(w1.manager.AllocateSlots(a, 16).value(), ElementsAre(1));
  EXPECT_EQ(w1.Ref(1), 1);
  EXPECT_THAT(w1.FreeQueue(), ElementsAreArray(Range(2, 99)));
  // Step 5: nothing to load; registered for eager store.
  AllocateResult a_alloc = w1.client->Allocate(1, {{1}}, 0).value();
  EXPECT_FALSE(a_alloc.load.has_value());
  EXPECT_THAT(a_alloc.store_status, IsOk());
  // Step 7, then 6: the forward pass fills block 1; the store event 0 copies
  // device 1 -> host 1 and pins device 1 (ref 2) for the transfer.
  w1.Fill(1, 0xA);
  CommitResult a_commit = w1.client->Commit(1, 16, {{1}}).value();
  ASSERT_EQ(a_commit.stores.size(), 1u);
  EXPECT_EQ(a_commit.stores[0].ref, (EventRef{EventKind::kStore, 0}));
  EXPECT_THAT(a_commit.stores[0].device_blocks, ElementsAre(1));
  EXPECT_THAT(a_commit.stores[0].host_blocks, ElementsAre(1));
  EXPECT_EQ(w1.Ref(1), 2);
  // Until the store completes, the slot is invisible: a lookup misses.
  EXPECT_EQ(host().cached_slots, 0);
  EXPECT_EQ(host().pinned_slots, 1);
  // A finishes; the transfer pin keeps device block 1 out of the queue.
  ASSERT_THAT(w1.client->Finish(1), IsOk());
  ASSERT_THAT(w1.manager.Free(1), IsOk());
  EXPECT_EQ(w1.Ref(1), 1);
  // Steps 8-9: the copy finishes; completion keys host 1 and unpins both.
  FinishedTransfer a_done = w1.WaitOne();
  EXPECT_EQ(a_done.event.ref, (EventRef{EventKind::kStore, 0}));
  ASSERT_THAT(a_done.status, IsOk());
  ASSERT_THAT(w1.client->Complete({&a_done, 1}), IsOk());
  EXPECT_EQ(w1.Ref(1), 0);
  std::vector<BlockId> w1_queue = Range(2, 99);
  w1_queue.push_back(1);
  EXPECT_THAT(w1.FreeQueue(), ElementsAreArray(w1_queue));
  EXPECT_TRUE(PoolOf(w1.manager).block(1).has_key());  // Device hash stays.
  EXPECT_EQ(host().cached_slots, 1);
  EXPECT_EQ(host().pinned_slots, 0);
  EXPECT_EQ(host().free_slots, 49);

  // ---- Request B: A's block plus one more, on worker 2 ----
  std::vector<TokenId> b_tokens = a_tokens;
  const std::vector<TokenId> tail = SequentialTokens(101, 16);
  b_tokens.insert(b_tokens.end(), tail.begin(), tail.end());
  Request b(/*id=*/2, b_tokens, 16, hasher);
  // Step 2: worker 2's device cache is its own: a miss.
  EXPECT_EQ(w2.manager.GetComputedBlocks(b).num_tokens, 0);
  // Step 3: host hit of one block (16 tokens; at most 31 may hit), pinned.
  ASSERT_EQ(w2.client->Lookup(2, b_tokens).value().hit_tokens, 16);
  EXPECT_EQ(host().pinned_slots, 1);
  EXPECT_EQ(host().free_slots, 48);
  // Step 4: device blocks [1, 2].
  EXPECT_THAT(w2.manager.AllocateSlots(b, 32).value(), ElementsAre(1, 2));
  EXPECT_THAT(w2.FreeQueue(), ElementsAreArray(Range(3, 99)));
  // Step 5: load event 0, host 1 -> device 1; the hit's pin carries over.
  AllocateResult b_alloc = w2.client->Allocate(2, {{1, 2}}, 16).value();
  ASSERT_TRUE(b_alloc.load.has_value());
  EXPECT_EQ(b_alloc.load->ref, (EventRef{EventKind::kLoad, 0}));
  EXPECT_THAT(b_alloc.load->device_blocks, ElementsAre(1));
  EXPECT_THAT(b_alloc.load->host_blocks, ElementsAre(1));
  EXPECT_EQ(w2.Ref(1), 2);
  EXPECT_EQ(host().pinned_slots, 1);
  // Step 7: the load finishes; device block 1 now holds A's bytes.
  FinishedTransfer b_load = w2.WaitOne();
  EXPECT_EQ(b_load.event.ref, (EventRef{EventKind::kLoad, 0}));
  ASSERT_THAT(b_load.status, IsOk());
  EXPECT_EQ(std::memcmp(w2.device->block(1).data(), w1.device->block(1).data(),
                        Seed004Layout().BlockBytes()),
            0);
  // Step 8: the forward pass fills block 2; step 6's store event 0 takes
  // device 2 -> host 2 (block 1 is on host already and is not stored again).
  w2.Fill(2, 0xB);
  CommitResult b_commit = w2.client->Commit(2, 32, {{1, 2}}).value();
  ASSERT_EQ(b_commit.stores.size(), 1u);
  EXPECT_EQ(b_commit.stores[0].ref, (EventRef{EventKind::kStore, 0}));
  EXPECT_THAT(b_commit.stores[0].device_blocks, ElementsAre(2));
  EXPECT_THAT(b_commit.stores[0].host_blocks, ElementsAre(2));
  EXPECT_EQ(w2.Ref(2), 2);
  // Step 10: the load's completion unpins host 1 and device 1 ...
  ASSERT_THAT(w2.client->Complete({&b_load, 1}), IsOk());
  EXPECT_EQ(w2.Ref(1), 1);
  FinishedTransfer b_store = w2.WaitOne();
  EXPECT_EQ(b_store.event.ref, (EventRef{EventKind::kStore, 0}));
  // ... and the store's keys host 2 and unpins it and device 2.
  ASSERT_THAT(w2.client->Complete({&b_store, 1}), IsOk());
  EXPECT_EQ(w2.Ref(2), 1);
  ASSERT_THAT(w2.client->Finish(2), IsOk());
  ASSERT_THAT(w2.manager.Free(2), IsOk());
  std::vector<BlockId> w2_queue = Range(3, 99);
  w2_queue.push_back(2);  // Reverse order: the tail block first.
  w2_queue.push_back(1);
  EXPECT_THAT(w2.FreeQueue(), ElementsAreArray(w2_queue));

  // Final host state: slots 1 and 2 cached, nothing pinned.
  const HostTierStats final_host = host();
  EXPECT_EQ(final_host.cached_slots, 2);
  EXPECT_EQ(final_host.pinned_slots, 0);
  EXPECT_EQ(final_host.free_slots, 49);
  EXPECT_EQ(final_host.stores_completed, 2u);
  EXPECT_EQ(final_host.loads_completed, 1u);
  EXPECT_EQ(final_host.events_in_flight, 0u);
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_SEED004_SCENARIO_H_
