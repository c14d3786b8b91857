// Seed 003 (nano-vllm BlockManager): a shared prefix block with ref count 2,
// reverse deallocation, the three may_append cases, token-id verification
// on a hit (a colliding key is a miss), and seed 004's starting pools.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "src/kv_cache_manager_internal.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::vector<TokenId> Concat(std::vector<TokenId> a,
                            const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KVCacheManager MakeManager(int32_t num_blocks, int32_t block_size) {
  // nano-vllm has no null block.
  return KVCacheManager::Create({.pool = {.num_blocks = num_blocks,
                                          .block_size = block_size,
                                          .reserve_null_block = false}})
      .value();
}

class Seed003 : public ::testing::Test {
 protected:
  KeyHasher hasher_{KeyNamespace{"seed003", ""}};
};

// Seed §5.7.4: "你好，我是" (256 tokens) + "小明" / "小红" (50 tokens each).
TEST_F(Seed003, SharedPrefixBlockHasRefCountTwo) {
  KVCacheManager m = MakeManager(10, 256);
  const std::vector<TokenId> greeting =
      SequentialTokens(100, 256);  // 你好，我是
  Request seq1(1, Concat(greeting, SequentialTokens(5000, 50)), 256,
               hasher_);  // 小明
  Request seq2(2, Concat(greeting, SequentialTokens(6000, 50)), 256,
               hasher_);  // 小红

  ASSERT_THAT(m.AllocateSlots(seq1, seq1.num_tokens()), IsOk());
  EXPECT_THAT(m.blocks(1), ElementsAre(0, 1));

  ComputedBlocks hit = m.GetComputedBlocks(seq2);
  EXPECT_THAT(hit.blocks, ElementsAre(0));
  EXPECT_EQ(hit.num_tokens, 256);  // seq.num_cached_tokens
  ASSERT_THAT(m.AllocateSlots(seq2, seq2.num_tokens() - hit.num_tokens, hit),
              IsOk());
  EXPECT_THAT(m.blocks(2), ElementsAre(0, 2));
  EXPECT_EQ(PoolOf(m).block(0).ref_cnt, 2);
  EXPECT_EQ(PoolOf(m).block(1).ref_cnt, 1);
  EXPECT_EQ(PoolOf(m).block(2).ref_cnt, 1);
}

TEST_F(Seed003, DeallocateInReverseOnlyFreesUnsharedBlocks) {
  KVCacheManager m = MakeManager(10, 256);
  const std::vector<TokenId> greeting = SequentialTokens(100, 256);
  Request seq1(1, Concat(greeting, SequentialTokens(5000, 50)), 256, hasher_);
  Request seq2(2, Concat(greeting, SequentialTokens(6000, 50)), 256, hasher_);
  ASSERT_THAT(m.AllocateSlots(seq1, seq1.num_tokens()), IsOk());
  ComputedBlocks hit = m.GetComputedBlocks(seq2);
  ASSERT_THAT(m.AllocateSlots(seq2, seq2.num_tokens() - hit.num_tokens, hit),
              IsOk());

  ASSERT_THAT(m.Free(2), IsOk());
  EXPECT_EQ(PoolOf(m).block(0).ref_cnt, 1);  // Still held by seq1.
  EXPECT_THAT(PoolOf(m).FreeQueueSnapshot(),
              ElementsAre(3, 4, 5, 6, 7, 8, 9, 2));
  ASSERT_THAT(m.Free(1), IsOk());
  // Reversed: seq1's tail block 1 goes before its prefix block 0, so the
  // shared greeting is evicted last.
  EXPECT_THAT(PoolOf(m).FreeQueueSnapshot(),
              ElementsAre(3, 4, 5, 6, 7, 8, 9, 2, 1, 0));
  EXPECT_EQ(PoolOf(m).block(0).ref_cnt, 0);
  EXPECT_TRUE(PoolOf(m).block(0).has_key());  // Freed but still hittable.
}

TEST_F(Seed003, MayAppendThreeCases) {
  KVCacheManager m = MakeManager(4, 4);
  Request seq(1, SequentialTokens(1, 4), 4,
              hasher_);  // Exactly one full block.
  ASSERT_THAT(m.AllocateSlots(seq, 4), IsOk());
  ASSERT_THAT(m.blocks(1), ElementsAre(0));
  ASSERT_TRUE(PoolOf(m).block(0).has_key());

  // Case 1: len % block_size == 1 -> the last block is full; a new one.
  seq.AppendToken(5);
  EXPECT_TRUE(m.CanAppend(seq));
  ASSERT_THAT(m.MayAppend(seq), IsOk());
  EXPECT_THAT(m.blocks(1), ElementsAre(0, 1));
  EXPECT_FALSE(PoolOf(m).block(1).has_key());

  // Case 3: room left in the last block -> nothing changes.
  seq.AppendToken(6);
  ASSERT_THAT(m.MayAppend(seq), IsOk());
  seq.AppendToken(7);
  ASSERT_THAT(m.MayAppend(seq), IsOk());
  EXPECT_THAT(m.blocks(1), ElementsAre(0, 1));
  EXPECT_FALSE(PoolOf(m).block(1).has_key());
  EXPECT_EQ(PoolOf(m).num_free_blocks(), 2);

  // Case 2: len % block_size == 0 -> the last block is keyed, chained from
  // the previous block's key, exactly as a fresh request computes it.
  seq.AppendToken(8);
  ASSERT_THAT(m.MayAppend(seq), IsOk());
  ASSERT_TRUE(PoolOf(m).block(1).has_key());
  Request fresh(2, SequentialTokens(1, 8), 4, hasher_);
  EXPECT_EQ(PoolOf(m).block(1).key, fresh.block_keys()[1]);
  EXPECT_THAT(
      m.GetComputedBlocks(Request(3, SequentialTokens(1, 9), 4, hasher_))
          .blocks,
      ElementsAre(0, 1));
}

TEST_F(Seed003, CannotAppendWithoutAFreeBlock) {
  KVCacheManager m = MakeManager(2, 4);
  Request seq(1, SequentialTokens(1, 8), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(seq, 8), IsOk());
  ASSERT_EQ(PoolOf(m).num_free_blocks(), 0);
  seq.AppendToken(9);  // Needs a third block.
  EXPECT_FALSE(m.CanAppend(seq));
  Status s = m.MayAppend(seq);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(m.blocks(1), ElementsAre(0, 1));  // Nothing changed.
  EXPECT_THAT(PoolOf(m).CheckInvariants(), IsOk());
}

// Seed §5.7.2 compares token ids on a hash hit. A key that collides (forged
// here: request B carries request A's keys but other tokens) is a miss.
TEST_F(Seed003, CollidingKeyIsAMissNeverWrongData) {
  KVCacheManager m = MakeManager(8, 4);
  Request a(1, SequentialTokens(1, 9), 4, hasher_);
  ASSERT_THAT(m.AllocateSlots(a, a.num_tokens()), IsOk());

  Request b = Request::WithKeys(2, SequentialTokens(101, 9), 4, a.block_keys());
  ASSERT_EQ(b.block_keys(), a.block_keys());
  EXPECT_TRUE(m.GetComputedBlocks(b).blocks.empty());
  EXPECT_EQ(m.stats().hits, 0u);

  // Same keys and same tokens: a hit, so the seam itself is sound.
  Request c = Request::WithKeys(3, SequentialTokens(1, 9), 4, a.block_keys());
  EXPECT_THAT(m.GetComputedBlocks(c).blocks, ElementsAre(0, 1));

  // Only the second block collides: the hit stops before it.
  std::vector<TokenId> mixed = SequentialTokens(1, 4);
  for (TokenId t : SequentialTokens(201, 5)) mixed.push_back(t);
  Request d = Request::WithKeys(4, mixed, 4, a.block_keys());
  EXPECT_THAT(m.GetComputedBlocks(d).blocks, ElementsAre(0));
}

// Seed 004's starting state: 100 GPU blocks and 50 CPU blocks, each with
// the null block 0 reserved.
TEST(Seed004StartingState, NullBlockReservedFreeQueueOneToN) {
  for (int32_t n : {100, 50}) {
    auto pool = BlockPool::Create({.num_blocks = n, .block_size = 16});
    ASSERT_THAT(pool, IsOk());
    EXPECT_EQ(pool->null_block(), 0);
    std::vector<BlockId> expected(static_cast<size_t>(n - 1));
    std::iota(expected.begin(), expected.end(), 1);
    EXPECT_THAT(pool->FreeQueueSnapshot(), ElementsAreArray(expected));
    EXPECT_EQ(pool->num_free_blocks(), n - 1);
  }
}

}  // namespace
}  // namespace tierkv
