// Eviction policies of BlockPool: ARC's lists and ghosts, blocks holding no
// key reused first, pins that are not uses, and GhostKeys on its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "src/block_pool.h"
#include "src/ghost_keys.h"
#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;

BlockKey Key(uint64_t n) { return {n * 0x9e3779b97f4a7c15ULL + 1, n}; }
const std::vector<TokenId> kTokens{1, 2, 3, 4};

BlockPool MakePool(int32_t n, EvictionPolicy policy,
                   bool uncached_first = false) {
  return BlockPool::Create({.num_blocks = n,
                            .block_size = 4,
                            .reserve_null_block = false,
                            .eviction = policy,
                            .free_uncached_first = uncached_first})
      .value();
}

// Allocates one block, keys it with Key(n) and frees it; returns it.
BlockId Store(BlockPool* pool, uint64_t n) {
  std::vector<BlockId> got;
  EXPECT_THAT(pool->GetNewBlocks(1, &got), IsOk());
  EXPECT_THAT(pool->CacheBlock(got[0], Key(n), kTokens), IsOk());
  pool->FreeBlocks(got);
  return got[0];
}

// Hits Key(n) (touch, then free) as a lookup does.
void Hit(BlockPool* pool, uint64_t n) {
  const std::optional<BlockId> id = pool->GetCachedBlock(Key(n), kTokens);
  ASSERT_TRUE(id.has_value()) << n;
  const BlockId ids[] = {*id};
  pool->Touch(ids);
  pool->FreeBlocks(ids);
}

bool Cached(const BlockPool& pool, uint64_t n) {
  return pool.GetCachedBlock(Key(n), kTokens).has_value();
}

TEST(EvictionPolicy, NamesParseBackAndBadOnesAreRefused) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    auto parsed = ParseEvictionPolicy(EvictionPolicyName(p));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = ParseEvictionPolicy("lfu");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("lru or arc"));
}

// ARC starts in LRU order: a block used twice goes first when it is the
// oldest, until a frequent block's ghost says frequency pays (the next
// test).
TEST(EvictionPolicy, ArcStartsInLruOrder) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    BlockPool pool = MakePool(3, policy);
    Store(&pool, 1);
    Hit(&pool, 1);
    Store(&pool, 2);
    Store(&pool, 3);
    Store(&pool, 4);  // Needs room.
    EXPECT_FALSE(Cached(pool, 1)) << EvictionPolicyName(policy);
    EXPECT_TRUE(Cached(pool, 2)) << EvictionPolicyName(policy);
    EXPECT_TRUE(Cached(pool, 3));
    EXPECT_THAT(pool.CheckInvariants(), IsOk());
  }
}

// A hot key used once every few requests among keys used once, further
// apart than the pool holds: LRU never keeps it; under ARC its ghost sends
// it to the frequent list, whose returns then lower the recent list's
// target until the hot key outlives the keys used once.
TEST(EvictionPolicy, ArcLearnsToKeepAKeyThatComesBack) {
  constexpr uint64_t kHot = 0;
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    BlockPool pool = MakePool(4, policy);
    uint64_t next = 1;
    int hits = 0;
    for (int round = 0; round < 50; ++round) {
      if (Cached(pool, kHot)) {
        Hit(&pool, kHot);
        ++hits;
      } else {
        Store(&pool, kHot);
      }
      for (int i = 0; i < 5; ++i) Store(&pool, next++);
    }
    EXPECT_THAT(pool.CheckInvariants(), IsOk());
    if (policy == EvictionPolicy::kLru) {
      EXPECT_EQ(hits, 0);
    } else {
      EXPECT_GE(hits, 40);
    }
  }
}

// Until a block of the frequent list comes back from its ghost, ARC takes
// exactly LRU's victims, whatever the hits (a recent block's ghost only
// raises the target, which starts at the whole pool).
TEST(EvictionPolicy, ArcMatchesLruUntilAFrequentBlockComesBack) {
  BlockPool lru = MakePool(12, EvictionPolicy::kLru, /*uncached_first=*/true);
  BlockPool arc = MakePool(12, EvictionPolicy::kArc);
  std::mt19937 rng(11);
  uint64_t next = 0;
  std::vector<uint64_t> seen;  // Keys stored so far, never stored again.
  for (int step = 0; step < 20000; ++step) {
    if (!seen.empty() && rng() % 3 != 0) {
      const uint64_t n = seen[rng() % seen.size()];
      ASSERT_EQ(Cached(lru, n), Cached(arc, n)) << step;
      if (Cached(lru, n)) {
        Hit(&lru, n);
        Hit(&arc, n);
      }
    } else {
      ASSERT_EQ(lru.NextFreeBlock(), arc.NextFreeBlock()) << step;
      Store(&lru, next);
      Store(&arc, next);
      seen.push_back(next++);
    }
  }
  EXPECT_THAT(arc.CheckInvariants(), IsOk());
}

// In a pool large enough that a free tick spans several frees (4096
// blocks: 4 frees a tick), ARC with no ghost returns still never evicts a
// block used again while a block used once, freed no later, stays cached:
// two blocks freed within one tick tie, and the block used once goes.
TEST(EvictionPolicy, ArcNeverEvictsAReusedBlockBeforeAnOlderOnceUsedOne) {
  constexpr int32_t kBlocks = 4096;
  BlockPool arc = MakePool(kBlocks, EvictionPolicy::kArc);
  std::mt19937 rng(12);
  uint64_t next = 0, clock = 0;
  std::vector<uint64_t> seen;       // Keys stored so far, never again.
  std::vector<uint64_t> last_free;  // By key: when it was last freed.
  std::vector<bool> reused;         // By key: hit since it was stored.
  std::vector<uint64_t> key_in(kBlocks, UINT64_MAX);  // By block.
  for (int step = 0; step < 40000; ++step) {
    if (!seen.empty() && rng() % 3 != 0) {
      const uint64_t n = seen[rng() % seen.size()];
      if (Cached(arc, n)) {
        Hit(&arc, n);
        last_free[n] = ++clock;
        reused[n] = true;
      }
      continue;
    }
    const std::optional<BlockId> victim = arc.NextFreeBlock();
    ASSERT_TRUE(victim.has_value());
    const uint64_t gone = key_in[static_cast<size_t>(*victim)];
    if (gone != UINT64_MAX && reused[gone]) {
      for (uint64_t n : seen) {
        if (n == gone || reused[n] || !Cached(arc, n)) continue;
        ASSERT_GT(last_free[n], last_free[gone])
            << "step " << step << ": reused key " << gone
            << " evicted before once-used key " << n;
      }
    }
    const BlockId id = Store(&arc, next);
    key_in[static_cast<size_t>(id)] = next;
    seen.push_back(next++);
    last_free.push_back(++clock);
    reused.push_back(false);
  }
  EXPECT_THAT(arc.CheckInvariants(), IsOk());
}

// Free blocks keep their order however long they wait: a block freed
// long before tens of thousands of others is still the older one (the
// free clock's 15-bit ticks are clamped, never compared across a wrap).
TEST(EvictionPolicy, ArcOrderSurvivesTheFreeClockWrapping) {
  // Frees that put the two blocks' raw ticks in either half of 2^15 apart.
  for (const int frees : {20000, 50000, 70000}) {
    BlockPool pool = MakePool(4, EvictionPolicy::kArc);
    Store(&pool, 1);  // Recent, and the oldest block from here on.
    Store(&pool, 2);
    for (int i = 0; i < frees; ++i) Hit(&pool, 2);  // Frequent, ever newer.
    Store(&pool, 3);
    Store(&pool, 4);
    Store(&pool, 5);  // Needs room: 1, the oldest.
    EXPECT_FALSE(Cached(pool, 1)) << frees;
    EXPECT_TRUE(Cached(pool, 2)) << frees;
    EXPECT_THAT(pool.CheckInvariants(), IsOk());
  }
}

// A key keyed again soon after its eviction is a second use: its block
// joins the frequent list and outlives newer blocks used once.
TEST(EvictionPolicy, ArcKeyComputedAgainAfterItsEvictionIsKeptAsReused) {
  BlockPool pool = MakePool(3, EvictionPolicy::kArc);
  Store(&pool, 1);
  Store(&pool, 2);
  Store(&pool, 3);
  Store(&pool, 4);  // Evicts 1, the oldest used once: a ghost now.
  ASSERT_FALSE(Cached(pool, 1));
  Store(&pool, 1);  // Evicts 2; 1 comes back from its ghost.
  Store(&pool, 5);  // Evicts 3.
  Store(&pool, 6);  // Evicts 4, not 1.
  EXPECT_TRUE(Cached(pool, 1));
  EXPECT_FALSE(Cached(pool, 4));
  EXPECT_TRUE(Cached(pool, 5));
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

// Copies to a lower tier pin blocks without using them: a pinned block
// stays in the recent list; a block promoted from a lower tier counts as
// used again.
TEST(EvictionPolicy, PinIsNotAUseAndAPromotionIs) {
  BlockPool pool = MakePool(4, EvictionPolicy::kArc);
  const BlockId one = Store(&pool, 1);
  const BlockId two = Store(&pool, 2);
  const BlockId pinned[] = {one};
  pool.Pin(pinned);
  pool.FreeBlocks(pinned);
  EXPECT_TRUE(pool.MarkReused(two));  // Free: it moves lists at once.
  std::vector<BlockId> unkeyed;
  ASSERT_THAT(pool.GetNewBlocks(1, &unkeyed), IsOk());
  EXPECT_FALSE(pool.MarkReused(unkeyed[0]));
  EXPECT_FALSE(pool.MarkReused(99));
  pool.FreeBlocks(unkeyed);
  Store(&pool, 3);
  Store(&pool, 4);
  Store(&pool, 5);  // Evicts 1: pinned, never used again.
  EXPECT_FALSE(Cached(pool, 1));
  EXPECT_TRUE(Cached(pool, 2));
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

// A freed block holding no key goes first under ARC, and under LRU when
// asked; LRU's default keeps vLLM's order (appended).
TEST(EvictionPolicy, AFreedBlockWithoutAKeyIsReusedFirstWhenAsked) {
  for (const bool first : {false, true}) {
    BlockPool pool = MakePool(3, EvictionPolicy::kLru, first);
    Store(&pool, 1);
    Store(&pool, 2);
    std::vector<BlockId> partial;
    ASSERT_THAT(pool.GetNewBlocks(1, &partial), IsOk());
    pool.FreeBlocks(partial);  // Never keyed.
    if (first) {
      EXPECT_EQ(pool.FreeQueueSnapshot().front(), partial[0]);
    } else {
      EXPECT_EQ(pool.FreeQueueSnapshot().back(), partial[0]);
    }
  }
  BlockPool arc = MakePool(3, EvictionPolicy::kArc);
  Store(&arc, 1);
  Store(&arc, 2);
  std::vector<BlockId> partial;
  ASSERT_THAT(arc.GetNewBlocks(1, &partial), IsOk());
  arc.FreeBlocks(partial);
  EXPECT_EQ(arc.NextFreeBlock(), partial[0]);
  std::vector<BlockId> next;
  ASSERT_THAT(arc.GetNewBlocks(1, &next), IsOk());
  EXPECT_EQ(next[0], partial[0]);
  EXPECT_TRUE(Cached(arc, 1));
  EXPECT_TRUE(Cached(arc, 2));
}

// A free block whose key a newer copy takes holds nothing that can be hit:
// with free_uncached_first it goes to the front under LRU too, and the next
// allocation takes it rather than evict a block that can still be hit.
TEST(EvictionPolicy, AFreeBlockThatLostItsKeyIsReusedFirstWhenAsked) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    SCOPED_TRACE(policy == EvictionPolicy::kLru ? "lru" : "arc");
    BlockPool pool = MakePool(4, policy, /*uncached_first=*/true);
    const BlockId one = Store(&pool, 1);
    Store(&pool, 2);
    const BlockId three = Store(&pool, 3);
    // A second copy of key 3 takes the key from the free block `three`.
    std::vector<BlockId> copy;
    ASSERT_THAT(pool.GetNewBlocks(1, &copy), IsOk());
    ASSERT_NE(copy[0], three);
    ASSERT_THAT(pool.CacheBlock(copy[0], Key(3), kTokens), IsOk());
    pool.FreeBlocks(copy);
    EXPECT_EQ(pool.NextFreeBlock(), three);
    std::vector<BlockId> next;
    ASSERT_THAT(pool.GetNewBlocks(1, &next), IsOk());
    EXPECT_EQ(next[0], three);
    EXPECT_TRUE(Cached(pool, 1)) << "block " << one << " was evicted";
    EXPECT_THAT(pool.CheckInvariants(), IsOk());
  }
}

// NextFreeBlock names the block GetNewBlocks takes, whatever the lists.
TEST(EvictionPolicy, NextFreeBlockIsTheNextVictimUnderRandomUse) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    BlockPool pool = MakePool(16, policy);
    std::mt19937 rng(7);
    for (int step = 0; step < 4000; ++step) {
      const uint64_t n = rng() % 40;
      if (Cached(pool, n)) {
        Hit(&pool, n);
      } else {
        const std::optional<BlockId> next = pool.NextFreeBlock();
        ASSERT_TRUE(next.has_value());
        ASSERT_EQ(Store(&pool, n), *next) << step;
      }
      if (step % 97 == 0) {
        ASSERT_THAT(pool.CheckInvariants(), IsOk()) << step;
        // The walk a spill picks victims by is the order GetNewBlocks
        // takes them in.
        std::vector<BlockId> walk;
        pool.VisitFreeQueue([&](BlockId id) {
          walk.push_back(id);
          return true;
        });
        BlockPool copy = pool;
        std::vector<BlockId> taken;
        ASSERT_THAT(copy.GetNewBlocks(copy.num_free_blocks(), &taken), IsOk());
        ASSERT_EQ(walk, taken) << step;
      }
    }
  }
}

TEST(GhostKeys, RemembersEachKeyForAtLeastItsCapacityInAdds) {
  GhostKeys ghosts(4);  // Generations of two Adds; the last 4 to 6 Adds.
  ASSERT_EQ(ghosts.generation_capacity(), 2);
  ghosts.Add(Key(1), 1);
  ghosts.Add(Key(2), 2);
  ghosts.Add(Key(3), 1);
  EXPECT_EQ(ghosts.count(1), 2);
  EXPECT_EQ(ghosts.count(2), 1);
  EXPECT_EQ(ghosts.Take(Key(2)), 2);
  EXPECT_EQ(ghosts.Take(Key(2)), 0);  // Taken once.
  ghosts.Add(Key(4), 2);
  ghosts.Add(Key(5), 3);
  ghosts.Add(Key(6), 1);
  EXPECT_EQ(ghosts.size(), 5);  // 1 and 3 to 6: 1 is 5 Adds old.
  ghosts.Add(Key(7), 1);        // A fourth generation: forgets 1 (and 2).
  EXPECT_EQ(ghosts.Take(Key(1)), 0);
  EXPECT_EQ(ghosts.count(1), 3);
  EXPECT_EQ(ghosts.Take(Key(3)), 1);
  EXPECT_EQ(ghosts.Take(Key(4)), 2);
  EXPECT_EQ(ghosts.Take(Key(5)), 3);
  EXPECT_EQ(ghosts.Take(Key(6)), 1);
  EXPECT_EQ(ghosts.Take(Key(7)), 1);
  EXPECT_EQ(ghosts.size(), 0);
  EXPECT_EQ(ghosts.count(1), 0);
}

// Keys that share their home slot, forgotten out of order, stay findable
// (the table's deletion shifts the cluster back, leaving no holes).
TEST(GhostKeys, CollidingKeysSurviveDeletionsInTheirCluster) {
  GhostKeys ghosts(16);
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 8; ++i) {
    // Fingerprints (the low 32 bits of lo ^ hi) that differ only below the
    // bits that pick the home slot.
    keys.push_back({(i << 2) | 0x40000000, 0});
    ghosts.Add(keys.back(), 1);
  }
  for (size_t i : {3u, 0u, 6u}) EXPECT_EQ(ghosts.Take(keys[i]), 1) << i;
  for (size_t i : {1u, 2u, 4u, 5u, 7u}) {
    EXPECT_EQ(ghosts.Take(keys[i]), 1) << i;
  }
  EXPECT_EQ(ghosts.size(), 0);
}

// The model: the Adds of the last kGenerations generations (each of
// generation_capacity() Adds), the newest maybe part full; a key taken
// leaves a hole. Keys are added only when not remembered, as a pool does.
TEST(GhostKeys, MatchesAModelUnderRandomUse) {
  for (const int32_t capacity : {1, 7, 50}) {
    struct Add {
      uint64_t n;
      uint8_t tag;
      bool live;
    };
    GhostKeys ghosts(capacity);
    const int32_t generation = ghosts.generation_capacity();
    std::deque<Add> model;
    int64_t adds = 0;
    std::mt19937 rng(3);
    for (int step = 0; step < 20000; ++step) {
      const uint64_t n = rng() % 200;
      auto it = std::find_if(model.begin(), model.end(),
                             [&](const Add& a) { return a.live && a.n == n; });
      if (rng() % 2 == 0 && it == model.end()) {
        const auto tag = static_cast<uint8_t>(1 + rng() % 3);
        if (adds % generation == 0 &&
            adds >= GhostKeys::kGenerations * generation) {
          // A new generation: the oldest one's Adds are forgotten.
          model.erase(model.begin(), model.begin() + generation);
        }
        model.push_back({n, tag, true});
        ++adds;
        ghosts.Add(Key(n), tag);
      } else {
        const uint8_t want = it == model.end() ? 0 : it->tag;
        if (it != model.end()) it->live = false;
        ASSERT_EQ(ghosts.Take(Key(n)), want) << capacity << " " << step;
      }
      int32_t live[4] = {};
      for (const Add& a : model) live[a.tag] += a.live ? 1 : 0;
      ASSERT_EQ(ghosts.size(), live[1] + live[2] + live[3]) << step;
      for (uint8_t tag = 1; tag <= 3; ++tag) {
        ASSERT_EQ(ghosts.count(tag), live[tag]) << step;
      }
    }
  }
}

}  // namespace
}  // namespace tierkv
