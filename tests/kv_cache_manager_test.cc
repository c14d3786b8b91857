// KVCacheManager beyond the seed timelines: the num_tokens - 1 cap, caching
// off, all-or-nothing allocation, stale lookups, chunked prefill, stats.
#include "tierkv/kv_cache_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <vector>

#include "src/kv_cache_manager_internal.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;

class KVCacheManagerTest : public ::testing::Test {
 protected:
  KVCacheManager Make(int32_t blocks, bool caching = true) {
    return KVCacheManager::Create(
               {.pool = {.num_blocks = blocks, .block_size = 4},
                .enable_caching = caching})
        .value();
  }
  KeyHasher hasher_{KeyNamespace{"manager-test", ""}};
};

TEST_F(KVCacheManagerTest, HitNeverCoversTheLastToken) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  // Identical 8-token prompt: both blocks are cached, but the last token must
  // be computed for logits, so only the first block counts.
  Request same(2, SequentialTokens(1, 8), 4, hasher_);
  ComputedBlocks c = m.GetComputedBlocks(same);
  EXPECT_THAT(c.blocks, ElementsAre(1));
  EXPECT_EQ(c.num_tokens, 4);
  Request longer(3, SequentialTokens(1, 9), 4, hasher_);
  EXPECT_THAT(m.GetComputedBlocks(longer).blocks, ElementsAre(1, 2));
}

TEST_F(KVCacheManagerTest, CachingDisabledNeverHitsOrKeys) {
  KVCacheManager m = Make(10, /*caching=*/false);
  Request a(1, SequentialTokens(1, 9), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 9), IsOk());
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 0u);
  EXPECT_TRUE(m.GetComputedBlocks(a).blocks.empty());
  EXPECT_EQ(m.stats().queries, 0u);
}

TEST_F(KVCacheManagerTest, AllocationIsAllOrNothing) {
  KVCacheManager m = Make(4);  // Null block + 3 usable.
  Request a(1, SequentialTokens(1, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  Request b(2, SequentialTokens(100, 8), 4, hasher_);
  auto r = m.AllocateSlots(b, 8);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(m.num_requests(), 1u);
  EXPECT_TRUE(m.blocks(2).empty());
  EXPECT_EQ(PoolOf(m).num_free_blocks(), 1);
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

TEST_F(KVCacheManagerTest, FreeHitsDoNotCountAsAvailableNewBlocks) {
  KVCacheManager m = Make(5);  // 4 usable.
  Request a(1, SequentialTokens(1, 9), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 9), IsOk());
  ASSERT_THAT(m.Free(1), IsOk());
  // Another request holds one block: 3 free, two of them a's cached
  // blocks.
  Request other(3, SequentialTokens(500, 4), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(other, 4), IsOk());
  // b hits a's two cached blocks (both free) and needs 2 new ones: 3 free
  // blocks minus the 2 hits it will pin leave 1, so it must be refused,
  // for now (it fits the pool).
  Request b(2, SequentialTokens(1, 16), 4, hasher_);
  ComputedBlocks c = m.GetComputedBlocks(b);
  ASSERT_EQ(c.blocks.size(), 2u);
  auto r = m.AllocateSlots(b, 8, c);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(PoolOf(m).num_free_blocks(), 3);
}

TEST_F(KVCacheManagerTest, StaleComputedBlocksAreRefused) {
  KVCacheManager m = Make(3);  // 2 usable.
  Request a(1, SequentialTokens(1, 5), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 5), IsOk());
  ASSERT_THAT(m.Free(1), IsOk());
  Request b(2, SequentialTokens(1, 5), 4, hasher_);
  ComputedBlocks c = m.GetComputedBlocks(b);
  ASSERT_EQ(c.blocks.size(), 1u);
  // Another request evicts the hit before b allocates.
  Request x(3, SequentialTokens(50, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(x, 8), IsOk());
  auto r = m.AllocateSlots(b, 1, c);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(KVCacheManagerTest, ChunkedPrefillKeysBlocksAsTheyFill) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 10), 4, hasher_);
  auto first = m.AllocateSlots(a, 6);  // Tokens 0-5: one full block.
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(*first, ElementsAre(1, 2));
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 1u);
  auto second = m.AllocateSlots(a, 4);  // Tokens 6-9: block 2 fills.
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT(*second, ElementsAre(3));
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 2u);
  EXPECT_THAT(m.blocks(1), ElementsAre(1, 2, 3));
}

TEST_F(KVCacheManagerTest, StatsCountQueriesHitsAndEvictions) {
  KVCacheManager m = Make(4);  // 3 usable.
  Request a(1, SequentialTokens(1, 9), 4, hasher_);
  (void)m.GetComputedBlocks(a);
  ASSERT_THAT(m.AllocateSlots(a, 9), IsOk());
  ASSERT_THAT(m.Free(1), IsOk());
  Request b(2, SequentialTokens(1, 9), 4, hasher_);
  ComputedBlocks c = m.GetComputedBlocks(b);
  ASSERT_THAT(m.AllocateSlots(b, 1, c), IsOk());
  ASSERT_THAT(m.Free(2), IsOk());
  Request x(3, SequentialTokens(70, 12), 4, hasher_);
  (void)m.GetComputedBlocks(x);
  ASSERT_THAT(m.AllocateSlots(x, 12), IsOk());  // Reuses every block.
  const PrefixCacheStats s = m.stats();
  EXPECT_EQ(s.queries, 3u);
  EXPECT_EQ(s.query_tokens, 9u + 9u + 12u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.hit_tokens, 8u);
  EXPECT_EQ(s.evictions, 2u);  // a's two keyed blocks.
}

// The hits sit at the head of the free queue: they must be taken out of the
// queue before new blocks are popped, or a hit would be handed out (and its
// key evicted) as a new block.
TEST_F(KVCacheManagerTest, HitsAtTheQueueHeadAreTouchedBeforePopping) {
  KVCacheManager m =
      KVCacheManager::Create({.pool = {.num_blocks = 6,
                                       .block_size = 4,
                                       .reserve_null_block = false}})
          .value();
  Request a(1, SequentialTokens(1, 9), 4, hasher_);  // Blocks 0, 1, 2.
  ASSERT_THAT(m.AllocateSlots(a, 9), IsOk());
  Request x(2, SequentialTokens(100, 4), 4, hasher_);  // Block 3.
  ASSERT_THAT(m.AllocateSlots(x, 4), IsOk());
  ASSERT_THAT(m.Free(1), IsOk());
  ASSERT_THAT(m.Free(2), IsOk());
  Request y(3, SequentialTokens(200, 12), 4, hasher_);  // Pops 4, 5, 2.
  ASSERT_THAT(m.AllocateSlots(y, 12), IsOk());
  ASSERT_THAT(PoolOf(m).FreeQueueSnapshot(), ElementsAre(1, 0, 3));

  Request b(4, SequentialTokens(1, 9), 4, hasher_);
  ComputedBlocks c = m.GetComputedBlocks(b);
  ASSERT_THAT(c.blocks, ElementsAre(0, 1));
  auto fresh = m.AllocateSlots(b, 1, c);
  ASSERT_THAT(fresh, IsOk());
  EXPECT_THAT(*fresh, ElementsAre(3));
  EXPECT_THAT(m.blocks(4), ElementsAre(0, 1, 3));
  EXPECT_TRUE(PoolOf(m).block(1).has_key());
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

TEST_F(KVCacheManagerTest, HugeRequestsAreRefusedWithoutOverflow) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 8), 4, hasher_);
  auto r = m.AllocateSlots(a, std::numeric_limits<int32_t>::max() - 4);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("whole pool"));
  EXPECT_EQ(m.num_requests(), 0u);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  r = m.AllocateSlots(a, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(m.blocks(1), ElementsAre(1, 2));
}

// The null block is never handed out: a request of every block, null
// included, can never fit (InvalidArgument), not "try later"
// (ResourceExhausted). One block fewer fits.
TEST_F(KVCacheManagerTest, ARequestOfEveryBlockNeverFits) {
  KVCacheManager m = Make(4);  // The null block and 3 of 4 tokens.
  Request a(1, SequentialTokens(1, 16), 4, hasher_);
  auto r = m.AllocateSlots(a, 16);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("3 usable blocks"));
  Request b(2, SequentialTokens(1, 12), 4, hasher_);
  EXPECT_THAT(m.AllocateSlots(b, 12), IsOk());
}

// A pool holding more than 2^31 tokens: a request past int32 tokens is
// refused, not counted wrapped.
TEST_F(KVCacheManagerTest, ARequestPastInt32TokensIsRefusedInAHugePool) {
  KVCacheManager m = KVCacheManager::Create({.pool = {.num_blocks = 40000,
                                                      .block_size = 65535,
                                                      .keep_tokens = false}})
                         .value();
  Request a(1, SequentialTokens(1, 8), 65535, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  auto r = m.AllocateSlots(a, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.blocks(1).size(), 1u);
  EXPECT_EQ(m.num_free_blocks(), 40000 - 2);
}

// A transfer's pin is not a use: under ARC a block pinned for a copy and
// unpinned stays in the recent list, where a hit would move it.
TEST_F(KVCacheManagerTest, TransferPinsAreNotUsesUnderArc) {
  KVCacheManager m =
      KVCacheManager::Create({.pool = {.num_blocks = 10,
                                       .block_size = 4,
                                       .eviction = EvictionPolicy::kArc}})
          .value();
  Request a(1, SequentialTokens(1, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  const std::vector<BlockId> blocks(m.blocks(1).begin(), m.blocks(1).end());
  ASSERT_THAT(m.Free(1), IsOk());
  m.PinBlocks(blocks);  // Copied to a lower tier.
  m.UnpinBlocks(blocks);
  for (BlockId id : blocks) EXPECT_FALSE(PoolOf(m).block(id).reused()) << id;
  Request b(2, SequentialTokens(1, 8), 4, hasher_);
  const ComputedBlocks hit = m.GetComputedBlocks(b);
  ASSERT_EQ(hit.blocks.size(), 1u);  // The last token is computed.
  ASSERT_THAT(m.AllocateSlots(b, 8 - hit.num_tokens, hit), IsOk());
  EXPECT_TRUE(PoolOf(m).block(blocks[0]).reused());  // A hit is a use.
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

TEST_F(KVCacheManagerTest, RequestsKeyedForAnotherBlockSizeAreRefused) {
  KVCacheManager m = Make(10);  // 4-token blocks.
  Request eight(1, SequentialTokens(1, 17), 8, hasher_);
  EXPECT_TRUE(m.GetComputedBlocks(eight).blocks.empty());
  auto r = m.AllocateSlots(eight, 17);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("8-token blocks"));
  Request zero(2, SequentialTokens(1, 5), 0, hasher_);  // Must not crash.
  EXPECT_TRUE(zero.block_keys().empty());
  zero.AppendToken(9);
  EXPECT_EQ(m.AllocateSlots(zero, 5).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KVCacheManagerTest, UnknownRequestsAreErrors) {
  KVCacheManager m = Make(4);
  EXPECT_EQ(m.Free(42).code(), StatusCode::kNotFound);
  Request a(1, SequentialTokens(1, 5), 4, hasher_);
  EXPECT_EQ(m.MayAppend(a).code(), StatusCode::kNotFound);
  EXPECT_EQ(m.AllocateSlots(a, -1).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KVCacheManagerTest, DifferentLoraNeverShares) {
  KVCacheManager m = Make(10);
  RequestExtras lora;
  lora.lora_id = 3;
  Request a(1, SequentialTokens(1, 9), 4, hasher_, lora);
  ASSERT_THAT(m.AllocateSlots(a, 9), IsOk());
  Request base(2, SequentialTokens(1, 9), 4, hasher_);
  EXPECT_TRUE(m.GetComputedBlocks(base).blocks.empty());
  Request same_lora(3, SequentialTokens(1, 9), 4, hasher_, lora);
  EXPECT_EQ(m.GetComputedBlocks(same_lora).blocks.size(), 2u);
}

TEST(RequestTest, BlockTokensPastTheEndIsEmpty) {
  const KeyHasher hasher(KeyNamespace{"request-test", ""});
  Request r(1, SequentialTokens(1, 6), 4, hasher);
  EXPECT_THAT(r.block_tokens(1), ElementsAre(5, 6));
  EXPECT_TRUE(r.block_tokens(2).empty());
  EXPECT_TRUE(r.block_tokens(-1).empty());
}

// An external load's blocks are no prefix hits before their bytes land
// (vLLM's delay_cache_blocks): a second request on the engine misses them.
TEST_F(KVCacheManagerTest, DelayedCachingHidesBlocksWaitingForALoad) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 13), 4, hasher_);
  // Blocks 1-2 come from tierkv (8 tokens), block 3 and the last token's
  // block are computed.
  ASSERT_THAT(m.AllocateSlots(a, 13, {}, /*num_external_tokens=*/8).value(),
              ElementsAre(1, 2, 3, 4));
  EXPECT_TRUE(m.IsLoading(1));
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 0u);
  Request b(2, SequentialTokens(1, 13), 4, hasher_);
  EXPECT_TRUE(m.GetComputedBlocks(b).blocks.empty());
  // Nothing more is allocated for a request while its load runs.
  EXPECT_EQ(m.AllocateSlots(a, 1).status().code(),
            StatusCode::kFailedPrecondition);

  a.AppendToken(99);
  EXPECT_EQ(m.MayAppend(a).code(), StatusCode::kFailedPrecondition);

  ExternalLoadResult done = m.CompleteExternalLoad(a, 8).value();
  EXPECT_EQ(done.num_computed_tokens, 8);
  EXPECT_TRUE(done.failed_blocks.empty());
  EXPECT_FALSE(m.IsLoading(1));
  // The loaded blocks are keyed now; the rest once the engine schedules
  // its computation (in blocks it holds already).
  EXPECT_THAT(m.GetComputedBlocks(b).blocks, ElementsAre(1, 2));
  EXPECT_EQ(m.MayAppend(a).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m.AllocateSlots(a, 5).value().empty());
  EXPECT_THAT(m.GetComputedBlocks(b).blocks, ElementsAre(1, 2, 3));
  EXPECT_THAT(m.MayAppend(a), IsOk());
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

// A load cut short (a promotion failed, tierkvd died): the blocks it did
// not fill are never keyed, are reported to recompute, and are keyed only
// once the engine schedules their recompute.
TEST_F(KVCacheManagerTest, DelayedCachingReportsBlocksOfACutLoad) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 17), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 17, {}, /*num_external_tokens=*/12).value(),
              ElementsAre(1, 2, 3, 4, 5));
  // Only the first block loaded.
  ExternalLoadResult cut = m.CompleteExternalLoad(a, 4).value();
  EXPECT_EQ(cut.num_computed_tokens, 4);
  EXPECT_THAT(cut.failed_blocks, ElementsAre(2, 3));
  Request b(2, SequentialTokens(1, 17), 4, hasher_);
  EXPECT_THAT(m.GetComputedBlocks(b).blocks, ElementsAre(1));
  // The engine recomputes tokens 4..16 in the blocks it already holds.
  EXPECT_TRUE(m.AllocateSlots(a, 13).value().empty());
  EXPECT_THAT(m.GetComputedBlocks(b).blocks, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

TEST_F(KVCacheManagerTest, DelayedCachingFailedLoadKeysNothing) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 9), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 9, {}, 8), IsOk());
  ExternalLoadResult failed = m.CompleteExternalLoad(a, 0).value();
  EXPECT_EQ(failed.num_computed_tokens, 0);
  EXPECT_THAT(failed.failed_blocks, ElementsAre(1, 2));
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 0u);
  // An aborted request's blocks go back unkeyed: nothing half-filled is
  // ever a hit.
  ASSERT_THAT(m.Free(1), IsOk());
  EXPECT_EQ(PoolOf(m).num_cached_blocks(), 0u);
  Request b(2, SequentialTokens(1, 9), 4, hasher_);
  EXPECT_TRUE(m.GetComputedBlocks(b).blocks.empty());
}

TEST_F(KVCacheManagerTest, DelayedCachingAfterADeviceHit) {
  KVCacheManager m = Make(10);
  Request a(1, SequentialTokens(1, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, 8), IsOk());
  ASSERT_THAT(m.Free(1), IsOk());
  // b hits block 1 on the device, loads the next from tierkvd.
  Request b(2, SequentialTokens(1, 13), 4, hasher_);
  ComputedBlocks hit = m.GetComputedBlocks(b);
  ASSERT_THAT(hit.blocks, ElementsAre(1, 2));
  hit.blocks.pop_back();  // Say the engine takes one block only.
  hit.num_tokens = 4;
  ASSERT_THAT(m.AllocateSlots(b, 9, hit, 4), IsOk());
  EXPECT_EQ(m.CompleteExternalLoad(b, 5).status().code(),
            StatusCode::kInvalidArgument);
  // A whole-block count for a partial last block counts as the whole load.
  Request chunk(4, SequentialTokens(70, 7), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(chunk, 7, {}, 7), IsOk());
  EXPECT_EQ(m.CompleteExternalLoad(chunk, 8).value().num_computed_tokens, 7);
  EXPECT_EQ(m.CompleteExternalLoad(b, 4).value().num_computed_tokens, 8);
  EXPECT_EQ(m.CompleteExternalLoad(b, 4).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.CompleteExternalLoad(a, 0).status().code(),
            StatusCode::kNotFound);
  // A load must start at a block boundary.
  Request c(3, SequentialTokens(50, 9), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(c, 2), IsOk());
  EXPECT_EQ(m.AllocateSlots(c, 6, {}, 4).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv
