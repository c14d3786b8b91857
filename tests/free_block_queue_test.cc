// FreeBlockQueue: O(1) popleft / remove / append keep LRU order exactly.
#include "src/free_block_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tierkv
