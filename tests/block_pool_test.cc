// BlockPool: creation errors, lazy eviction, touch, duplicate keys, explicit
// eviction and the invariant checker itself.
#include "src/block_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;

const std::vector<TokenId> kTokensA{1, 2, 3, 4};
const std::vector<TokenId> kTokensB{5, 6, 7, 8};
constexpr BlockKey kKeyA{1, 1};
constexpr BlockKey kKeyB{2, 2};

BlockPool MakePool(int32_t n, bool null_block = false) {
  return BlockPool::Create({.num_blocks = n,
                            .block_size = 4,
                            .reserve_null_block = null_block})
      .value();
}

TEST(BlockPool, RejectsBadOptions) {
  auto none = BlockPool::Create({.num_blocks = 1, .block_size = 4});
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), ::testing::HasSubstr("at least 2"));
  EXPECT_FALSE(BlockPool::Create({.num_blocks = 4, .block_size = 0}).ok());
}

TEST(BlockPool, NullBlockIsNeverHandedOutOrFreed) {
  BlockPool pool = MakePool(3, /*null_block=*/true);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(2, &got), IsOk());
  EXPECT_THAT(got, ElementsAre(1, 2));
  const BlockId null_then_real[] = {0, 1};
  pool.FreeBlocks(null_then_real);  // Freeing the null block is a no-op.
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1));
  EXPECT_EQ(pool.CacheBlock(0, kKeyA, kTokensA).code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

TEST(BlockPoolDeathTest, FreeingAFreeBlockStopsInEveryBuild) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  pool.FreeBlocks(got);
  // Queued twice, the block could be handed to two users at once.
  EXPECT_DEATH(pool.FreeBlocks(got), "block 0 freed while free");
}

TEST(BlockPool, NotEnoughFreeBlocksChangesNothing) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  Status s = pool.GetNewBlocks(4, &got);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "need 4 free blocks, 3 available");
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(pool.num_free_blocks(), 3);
}

TEST(BlockPool, LazyEvictionDropsKeyOnlyWhenPopped) {
  BlockPool pool = MakePool(2);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, kTokensA), IsOk());
  pool.FreeBlocks(got);
  EXPECT_EQ(pool.GetCachedBlock(kKeyA, kTokensA), 0);  // Free yet hittable.
  EXPECT_EQ(pool.stats().evictions, 0u);

  got.clear();
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());  // Pops block 1: no key.
  EXPECT_EQ(pool.GetCachedBlock(kKeyA, kTokensA), 0);
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());  // Pops block 0: evicts A.
  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, kTokensA).has_value());
  EXPECT_EQ(pool.stats().evictions, 1u);
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

TEST(BlockPool, TouchPinsAFreeCachedBlock) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, kTokensA), IsOk());
  pool.FreeBlocks(got);
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1, 2, 0));
  const BlockId hit[] = {0};
  pool.Touch(hit);
  pool.Touch(hit);
  EXPECT_EQ(pool.block(0).ref_cnt, 2);
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1, 2));
  pool.FreeBlocks(hit);
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1, 2));  // Still held.
  pool.FreeBlocks(hit);
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1, 2, 0));
}

TEST(BlockPool, NewerBlockTakesADuplicateKey) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(2, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, kTokensA), IsOk());
  ASSERT_THAT(pool.CacheBlock(1, kKeyA, kTokensA), IsOk());
  EXPECT_EQ(pool.GetCachedBlock(kKeyA, kTokensA), 1);
  EXPECT_FALSE(pool.block(0).has_key());
  EXPECT_EQ(pool.num_cached_blocks(), 1u);
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

TEST(BlockPool, CacheBlockRejectsMisuse) {
  BlockPool pool = MakePool(3);
  EXPECT_EQ(pool.CacheBlock(0, kKeyA, kTokensA).code(),
            StatusCode::kInvalidArgument);  // Free block.
  EXPECT_EQ(pool.CacheBlock(7, kKeyA, kTokensA).code(),
            StatusCode::kInvalidArgument);  // Out of range.
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  const std::vector<TokenId> five{1, 2, 3, 4, 5};
  EXPECT_EQ(pool.CacheBlock(0, kKeyA, five).code(),
            StatusCode::kInvalidArgument);  // More than block_size.
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, kTokensA), IsOk());
  EXPECT_EQ(pool.CacheBlock(0, kKeyB, kTokensB).code(),
            StatusCode::kInvalidArgument);  // Already keyed.
}

TEST(BlockPool, PartialBlocksAreKeyedWithTheirTokenCount) {
  // Chunk caches key a chunk's trailing partial block.
  BlockPool pool = MakePool(2);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  const std::vector<TokenId> partial{1, 2};
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, partial), IsOk());
  EXPECT_EQ(pool.GetCachedBlock(kKeyA, partial), 0);
  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, kTokensA).has_value());
  EXPECT_THAT(pool.block_tokens(0), ElementsAre(1, 2));
}

TEST(BlockPool, EvictCachedBlockOnlyTouchesFreeKeyedBlocks) {
  BlockPool pool = MakePool(2);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(1, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(0, kKeyA, kTokensA), IsOk());
  EXPECT_FALSE(pool.EvictCachedBlock(0));  // In use.
  pool.FreeBlocks(got);
  EXPECT_TRUE(pool.EvictCachedBlock(0));
  EXPECT_FALSE(pool.EvictCachedBlock(0));  // No key left.
  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, kTokensA).has_value());
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(1, 0));  // Position kept.
  EXPECT_EQ(pool.stats().evictions, 1u);
}

TEST(BlockPool, DemoteCachedBlockDropsTheKeyAndQueuesTheBlockFirst) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(3, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(1, kKeyA, kTokensA), IsOk());
  ASSERT_THAT(pool.CacheBlock(2, kKeyB, kTokensB), IsOk());
  EXPECT_FALSE(pool.DemoteCachedBlock(2));  // In use.
  pool.FreeBlocks(got);
  EXPECT_FALSE(pool.DemoteCachedBlock(0));  // No key.
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(0, 1, 2));
  EXPECT_TRUE(pool.DemoteCachedBlock(2));
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(2, 0, 1));
  EXPECT_FALSE(pool.GetCachedBlock(kKeyB, kTokensB).has_value());
  EXPECT_TRUE(pool.GetCachedBlock(kKeyA, kTokensA).has_value());
  EXPECT_EQ(pool.stats().evictions, 0u);  // Moved down, not lost.
  std::vector<BlockId> reused;
  ASSERT_THAT(pool.GetNewBlocks(1, &reused), IsOk());
  EXPECT_THAT(reused, ElementsAre(2));
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

TEST(BlockPool, MoveToFrontKeepsTheKeyAndQueuesTheBlockFirst) {
  BlockPool pool = MakePool(3);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(3, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(2, kKeyB, kTokensB), IsOk());
  EXPECT_FALSE(pool.MoveToFront(2));  // In use.
  pool.FreeBlocks(got);
  EXPECT_EQ(pool.NextFreeBlock(), 0);
  EXPECT_TRUE(pool.MoveToFront(2));
  EXPECT_THAT(pool.FreeQueueSnapshot(), ElementsAre(2, 0, 1));
  EXPECT_EQ(pool.NextFreeBlock(), 2);
  EXPECT_EQ(pool.GetCachedBlock(kKeyB, kTokensB), 2);  // Still a hit.
  std::vector<BlockId> reused;
  ASSERT_THAT(pool.GetNewBlocks(3, &reused), IsOk());
  EXPECT_THAT(reused, ElementsAre(2, 0, 1));
  EXPECT_EQ(pool.stats().evictions, 1u);
  EXPECT_FALSE(pool.NextFreeBlock().has_value());
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

TEST(BlockPool, CacheFullBlocksKeysTheGivenRange) {
  BlockPool pool = MakePool(4);
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(3, &got), IsOk());
  const std::vector<BlockKey> keys{kKeyA, kKeyB, {3, 3}};
  const std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_THAT(pool.CacheFullBlocks(got, keys, tokens, 1, 2), IsOk());
  EXPECT_FALSE(pool.block(got[0]).has_key());  // Below num_cached_blocks.
  EXPECT_EQ(pool.GetCachedBlock(kKeyB, kTokensB), got[1]);
  EXPECT_FALSE(pool.block(got[2]).has_key());  // Past num_full_blocks.
  // A third full block would need 12 tokens.
  Status s = pool.CacheFullBlocks(got, keys, tokens, 2, 3);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_FALSE(pool.block(got[2]).has_key());
}

// Without keep_tokens, a key another block holds is a hit only for the same
// tokens: a forged key (equal key, other tokens) misses, as does a prefix or
// an extension of the stored tokens.
TEST(BlockPool, CheckModeMissesAForgedKeyWithOtherTokens) {
  BlockPool pool = BlockPool::Create({.num_blocks = 3,
                                      .block_size = 4,
                                      .reserve_null_block = false,
                                      .keep_tokens = false})
                       .value();
  EXPECT_FALSE(pool.keeps_tokens());
  std::vector<BlockId> got;
  ASSERT_THAT(pool.GetNewBlocks(2, &got), IsOk());
  ASSERT_THAT(pool.CacheBlock(got[0], kKeyA, kTokensA), IsOk());
  const std::vector<TokenId> partial{1, 2};
  ASSERT_THAT(pool.CacheBlock(got[1], kKeyB, partial), IsOk());
  EXPECT_EQ(pool.GetCachedBlock(kKeyA, kTokensA), got[0]);
  EXPECT_EQ(pool.GetCachedBlock(kKeyB, partial), got[1]);

  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, kTokensB).has_value());
  const std::vector<TokenId> one_off{1, 2, 3, 5};
  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, one_off).has_value());
  const std::vector<TokenId> shorter{1, 2, 3};
  EXPECT_FALSE(pool.GetCachedBlock(kKeyA, shorter).has_value());
  EXPECT_FALSE(pool.GetCachedBlock(kKeyB, kTokensA).has_value());
  // The operator's lookup by key alone still finds the block.
  EXPECT_EQ(pool.FindKeyedBlock(kKeyA), got[0]);
  EXPECT_THAT(pool.CheckInvariants(), IsOk());
}

// Without keep_tokens the pool holds no token ids: block_tokens is empty for
// every block, keyed or not, and no per-block row of tokens is allocated.
TEST(BlockPool, CheckModeKeepsNoTokens) {
  constexpr int32_t kBlocks = 100;
  BlockPoolOptions options{.num_blocks = kBlocks, .block_size = 512};
  BlockPool with_tokens = BlockPool::Create(options).value();
  options.keep_tokens = false;
  BlockPool check_only = BlockPool::Create(options).value();
  std::vector<BlockId> got;
  ASSERT_THAT(check_only.GetNewBlocks(1, &got), IsOk());
  const std::vector<TokenId> tokens(512, 7);
  ASSERT_THAT(check_only.CacheBlock(got[0], kKeyA, tokens), IsOk());
  EXPECT_EQ(check_only.block(got[0]).num_tokens, 512);
  EXPECT_TRUE(check_only.block_tokens(got[0]).empty());
  EXPECT_EQ(check_only.GetCachedBlock(kKeyA, tokens), got[0]);

  // Per block: the block itself, two queue links, two index slots; the
  // token copy (2 KiB at 512 tokens) only with keep_tokens.
  const size_t compact = check_only.MetadataBytes();
  EXPECT_LE(compact, kBlocks * size_t{64} + 64);
  EXPECT_EQ(with_tokens.MetadataBytes(),
            compact + kBlocks * 512 * sizeof(TokenId));
}

TEST(BlockPool, RejectsBlocksTooLargeToCount) {
  const auto too_big = BlockPool::Create(
      {.num_blocks = 4, .block_size = BlockPool::kMaxBlockSize + 1});
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(BlockPool::Create({.num_blocks = 4,
                                 .block_size = BlockPool::kMaxBlockSize,
                                 .keep_tokens = false})
                  .status(),
              IsOk());
}

}  // namespace
}  // namespace tierkv
