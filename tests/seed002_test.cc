// Seed 002 §4.3, step by step: 10 blocks of 4 tokens, no null block,
// requests 0, 1 and 2 over times 1 to 7. Block ids, hits, keys and free
// queue orders are the ones the seed states (with its time-6 figure as
// corrected in the text).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/kv_cache_manager_internal.h"
#include "tests/status_matchers.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// "ABCD" -> token ids; letters are tokens, case matters (seed: IJkl, mn).
std::vector<TokenId> Tokens(const std::string& s) {
  return std::vector<TokenId>(s.begin(), s.end());
}

class Seed002Timeline : public ::testing::Test {
 protected:
  Seed002Timeline()
      : hasher_(KeyNamespace{"seed002", ""}),
        manager_(KVCacheManager::Create({.pool = {.num_blocks = 10,
                                                  .block_size = 4,
                                                  .reserve_null_block = false}})
                     .value()) {}

  std::vector<BlockId> FreeQueue() const {
    return PoolOf(manager_).FreeQueueSnapshot();
  }
  const BlockPool::Block& Block(BlockId id) const {
    return PoolOf(manager_).block(id);
  }
  void ExpectKey(BlockId id, const BlockKey& key) const {
    EXPECT_TRUE(Block(id).has_key()) << "block " << id;
    EXPECT_EQ(Block(id).key, key) << "block " << id;
  }

  KeyHasher hasher_;
  KVCacheManager manager_;
};

TEST_F(Seed002Timeline, Times1To7) {
  // Time 1: request 0 (ABCD|EFGH|IJKL|MNO), all 15 tokens scheduled.
  Request r0(0, Tokens("ABCDEFGHIJKLMNO"), 4, hasher_);
  ComputedBlocks c0 = manager_.GetComputedBlocks(r0);
  EXPECT_TRUE(c0.blocks.empty());
  auto new0 = manager_.AllocateSlots(r0, 15, c0);
  ASSERT_THAT(new0, IsOk());
  EXPECT_THAT(*new0, ElementsAre(0, 1, 2, 3));
  ExpectKey(0, r0.block_keys()[0]);  // A-D
  ExpectKey(1, r0.block_keys()[1]);  // A-H
  ExpectKey(2, r0.block_keys()[2]);  // A-L
  EXPECT_FALSE(Block(3).has_key());  // MNO: partial, never keyed.
  EXPECT_THAT(FreeQueue(), ElementsAre(4, 5, 6, 7, 8, 9));

  // Times 2-3: the prefill samples P, whose decode fills block 3 (keyed
  // A-P); the next token Q needs a new block: block 4.
  r0.AppendToken('P');
  ASSERT_TRUE(manager_.CanAppend(r0));
  ASSERT_THAT(manager_.MayAppend(r0), IsOk());
  ExpectKey(3, r0.block_keys()[3]);  // A-P
  r0.AppendToken('Q');
  ASSERT_TRUE(manager_.CanAppend(r0));
  ASSERT_THAT(manager_.MayAppend(r0), IsOk());
  EXPECT_THAT(manager_.blocks(0), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_FALSE(Block(4).has_key());
  EXPECT_THAT(FreeQueue(), ElementsAre(5, 6, 7, 8, 9));

  // Time 4: request 1 (ABCD|EFGH|IJkl|mn), 14 tokens. Only the first two
  // blocks hit: the third matches just 2 of its 4 tokens.
  Request r1(1, Tokens("ABCDEFGHIJklmn"), 4, hasher_);
  ComputedBlocks c1 = manager_.GetComputedBlocks(r1);
  EXPECT_THAT(c1.blocks, ElementsAre(0, 1));
  EXPECT_EQ(c1.num_tokens, 8);
  auto new1 = manager_.AllocateSlots(r1, 14 - c1.num_tokens, c1);
  ASSERT_THAT(new1, IsOk());
  EXPECT_THAT(*new1, ElementsAre(5, 6));
  EXPECT_THAT(manager_.blocks(1), ElementsAre(0, 1, 5, 6));
  EXPECT_EQ(Block(0).ref_cnt, 2);
  EXPECT_EQ(Block(1).ref_cnt, 2);
  ExpectKey(5, r1.block_keys()[2]);  // A-H + IJkl: full, so keyed.
  EXPECT_FALSE(Block(6).has_key());  // mn
  EXPECT_THAT(FreeQueue(), ElementsAre(7, 8, 9));

  // Time 5: request 0 finishes. Blocks 4, 3, 2 are appended in reverse;
  // 0 and 1 stay with request 1. Blocks 2 and 3 keep their keys.
  ASSERT_THAT(manager_.Free(0), IsOk());
  EXPECT_THAT(FreeQueue(), ElementsAre(7, 8, 9, 4, 3, 2));
  EXPECT_EQ(Block(0).ref_cnt, 1);
  EXPECT_EQ(Block(1).ref_cnt, 1);
  ExpectKey(2, r0.block_keys()[2]);
  ExpectKey(3, r0.block_keys()[3]);

  // Time 6: request 1 finishes.
  ASSERT_THAT(manager_.Free(1), IsOk());
  EXPECT_THAT(FreeQueue(), ElementsAre(7, 8, 9, 4, 3, 2, 6, 5, 1, 0));
  EXPECT_EQ(PoolOf(manager_).num_cached_blocks(), 5u);  // 0, 1, 2, 3, 5.

  // Time 7: request 2 (ABCD|EFGH|IJKL|0-3|4-7|8-11|12-15|16), 29 tokens.
  std::vector<TokenId> t2 = Tokens("ABCDEFGHIJKL");
  for (TokenId t = 0; t <= 16; ++t) t2.push_back(1000 + t);
  Request r2(2, t2, 4, hasher_);
  ComputedBlocks c2 = manager_.GetComputedBlocks(r2);
  EXPECT_THAT(c2.blocks, ElementsAre(0, 1, 2));
  EXPECT_EQ(c2.num_tokens, 12);

  // The seed's intermediate state: after the three hits are touched, the
  // queue is 7 8 9 4 3 6 5. AllocateSlots touches and pops in one call, so
  // replay the touch on a copy of the same pool.
  BlockPool touched = PoolOf(manager_);
  touched.Touch(c2.blocks);
  EXPECT_THAT(touched.FreeQueueSnapshot(), ElementsAre(7, 8, 9, 4, 3, 6, 5));

  const uint64_t evictions_before = manager_.stats().evictions;
  auto new2 = manager_.AllocateSlots(r2, 29 - c2.num_tokens, c2);
  ASSERT_THAT(new2, IsOk());
  EXPECT_THAT(*new2, ElementsAre(7, 8, 9, 4, 3));
  EXPECT_THAT(manager_.blocks(2), ElementsAreArray({0, 1, 2, 7, 8, 9, 4, 3}));
  EXPECT_THAT(FreeQueue(), ElementsAre(6, 5));
  // Block 3 held A-P: it is the only evicted key (7, 8, 9 and 4 had none).
  EXPECT_EQ(manager_.stats().evictions - evictions_before, 1u);
  EXPECT_FALSE(PoolOf(manager_)
                   .GetCachedBlock(r0.block_keys()[3], r0.block_tokens(3))
                   .has_value());
  for (int i = 3; i < 7; ++i) {
    ExpectKey(manager_.blocks(2)[static_cast<size_t>(i)], r2.block_keys()[i]);
  }
  EXPECT_FALSE(Block(3).has_key());  // Now holds token 16 only.
  ExpectKey(5, r1.block_keys()[2]);  // Still cached, still hittable.
  EXPECT_THAT(PoolOf(manager_).CheckInvariants(), IsOk());
}

TEST_F(Seed002Timeline, FreedBlocksStayHittableUntilPopped) {
  Request r0(0, Tokens("ABCDEFGHIJKLMNO"), 4, hasher_);
  ASSERT_THAT(manager_.AllocateSlots(r0, 15), IsOk());
  ASSERT_THAT(manager_.Free(0), IsOk());
  // A request with the same 12-token prefix still hits all three blocks.
  Request again(1, Tokens("ABCDEFGHIJKLxyz"), 4, hasher_);
  EXPECT_THAT(manager_.GetComputedBlocks(again).blocks, ElementsAre(0, 1, 2));
}

TEST_F(Seed002Timeline, SameMiddleDifferentPrefixMisses) {
  // Seed §4.4.3: DCAB|EFGH cannot reuse ABCD|EFGH's second block.
  Request a(0, Tokens("ABCDEFGHx"), 4, hasher_);
  ASSERT_THAT(manager_.AllocateSlots(a, a.num_tokens()), IsOk());
  Request b(1, Tokens("DCABEFGHx"), 4, hasher_);
  EXPECT_TRUE(manager_.GetComputedBlocks(b).blocks.empty());
}

}  // namespace
}  // namespace tierkv
