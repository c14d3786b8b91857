// FreeBlockQueue: O(1) popleft / remove / append keep LRU order exactly,
// in each of the lists an eviction policy keeps.
#include "src/free_block_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(FreeBlockQueue, AppendPopRemoveKeepOrder) {
  FreeBlockQueue q(6);
  EXPECT_TRUE(q.empty());
  const BlockId all[] = {0, 1, 2, 3, 4, 5};
  q.AppendN(all);
  EXPECT_EQ(q.size(), 6);
  EXPECT_EQ(q.Front(), 0);
  EXPECT_EQ(q.PopLeft(), 0);
  q.Remove(3);  // Middle.
  q.Remove(5);  // Tail.
  q.Remove(1);  // Head.
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 4));
  EXPECT_FALSE(q.Contains(3));
  EXPECT_TRUE(q.Contains(4));
  q.Append(3);
  q.Append(0);
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 4, 3, 0));
  std::vector<BlockId> popped;
  q.PopLeftN(3, &popped);
  EXPECT_THAT(popped, ElementsAre(2, 4, 3));
  EXPECT_THAT(q.ToVector(), ElementsAre(0));
  EXPECT_EQ(q.PopLeft(), 0);
  EXPECT_TRUE(q.empty());
  EXPECT_THAT(q.ToVector(), IsEmpty());
}

TEST(FreeBlockQueue, RemoveOnlyElementThenReuse) {
  FreeBlockQueue q(1);
  q.Append(0);
  q.Remove(0);
  EXPECT_TRUE(q.empty());
  q.Append(0);
  EXPECT_EQ(q.Front(), 0);
  EXPECT_EQ(q.size(), 1);
}

TEST(FreeBlockQueue, PushFrontIsPoppedFirstAndForEachWalksInOrder) {
  FreeBlockQueue q(4);
  q.PushFront(2);  // Into an empty queue.
  q.Append(0);
  q.PushFront(1);
  q.Append(3);
  EXPECT_THAT(q.ToVector(), ElementsAre(1, 2, 0, 3));
  std::vector<BlockId> seen;
  q.ForEach([&](BlockId id) {
    seen.push_back(id);
    return id != 0;  // Stops after 0.
  });
  EXPECT_THAT(seen, ElementsAre(1, 2, 0));
  EXPECT_EQ(q.PopLeft(), 1);
  q.Remove(3);
  EXPECT_THAT(q.ToVector(), ElementsAre(2, 0));
}

// Several lists over the same links: each keeps its own order and size, and
// a block is in one list at most, whichever call put it there.
TEST(FreeBlockQueue, ListsKeepTheirOwnOrderAndSizes) {
  FreeBlockQueue q(8, 3);
  q.Append(0, 1);
  q.Append(1, 2);
  q.Append(2, 1);
  q.PushFront(3, 1);
  q.Append(4);  // List 0.
  q.PushFront(5, 2);
  EXPECT_EQ(q.size(), 6);
  EXPECT_EQ(q.size(0), 1);
  EXPECT_EQ(q.size(1), 3);
  EXPECT_EQ(q.size(2), 2);
  EXPECT_EQ(q.Front(1), 3);
  EXPECT_EQ(q.Front(2), 5);
  EXPECT_EQ(q.ListOf(2), 1);
  EXPECT_THAT(q.ToVector(), ElementsAre(4, 3, 0, 2, 5, 1));
  q.Remove(0);  // From the middle of list 1.
  EXPECT_EQ(q.size(1), 2);
  EXPECT_EQ(q.PopLeft(), 4);
  EXPECT_EQ(q.size(0), 0);
  q.Append(0, 2);
  EXPECT_THAT(q.ToVector(), ElementsAre(3, 2, 5, 1, 0));
  std::vector<BlockId> second;
  EXPECT_TRUE(q.ForEachIn(2, [&](BlockId id) {
    second.push_back(id);
    return true;
  }));
  EXPECT_THAT(second, ElementsAre(5, 1, 0));
}

// Random operations against a model: a deque per list.
TEST(FreeBlockQueue, ListsMatchAModelUnderRandomOperations) {
  constexpr int32_t kBlocks = 64;
  constexpr int32_t kLists = 3;
  FreeBlockQueue q(kBlocks, kLists);
  std::vector<std::deque<BlockId>> model(kLists);
  std::mt19937 rng(17);
  for (int step = 0; step < 20000; ++step) {
    const auto id = static_cast<BlockId>(rng() % kBlocks);
    const auto list = static_cast<int32_t>(rng() % kLists);
    if (q.Contains(id)) {
      std::deque<BlockId>& d = model[static_cast<size_t>(q.ListOf(id))];
      d.erase(std::find(d.begin(), d.end(), id));
      q.Remove(id);
    } else if (rng() % 2 == 0) {
      q.Append(id, list);
      model[static_cast<size_t>(list)].push_back(id);
    } else {
      q.PushFront(id, list);
      model[static_cast<size_t>(list)].push_front(id);
    }
    std::vector<BlockId> want;
    for (int32_t l = 0; l < kLists; ++l) {
      const std::deque<BlockId>& d = model[static_cast<size_t>(l)];
      ASSERT_EQ(q.size(l), static_cast<int32_t>(d.size()));
      if (!d.empty()) {
        ASSERT_EQ(q.Front(l), d.front());
      }
      want.insert(want.end(), d.begin(), d.end());
    }
    ASSERT_EQ(q.ToVector(), want);
  }
}

}  // namespace
}  // namespace tierkv
