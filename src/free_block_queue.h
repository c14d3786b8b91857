// FreeBlockQueue: the LRU order of a BlockPool's free blocks (seed 002,
// FreeKVCacheBlockQueue). An intrusive doubly-linked list threaded through
// per-block prev/next indices, so popleft, remove and append are O(1) and
// nothing is allocated after construction. Links are block ids, not
// pointers, so the same structure could live in shared memory.
// Not thread-safe; owned by its BlockPool.
#ifndef TIERKV_SRC_FREE_BLOCK_QUEUE_H_
#define TIERKV_SRC_FREE_BLOCK_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/types.h"

namespace tierkv {

class FreeBlockQueue {
 public:
  // An empty queue that can hold block ids [0, capacity).
  explicit FreeBlockQueue(int32_t capacity);

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int32_t capacity() const { return capacity_; }
  // Bytes of the links, for memory accounting.
  size_t MemoryBytes() const {
    return (prev_.size() + next_.size()) * sizeof(int32_t);
  }
  bool Contains(BlockId id) const { return prev_[Index(id)] != kNotQueued; }

  // The least recently freed block. REQUIRES: !empty().
  BlockId Front() const { return next_[Sentinel()]; }

  // REQUIRES: !empty().
  BlockId PopLeft();
  // Pops the n front blocks into `out` (appended). REQUIRES: n <= size().
  void PopLeftN(int32_t n, std::vector<BlockId>* out);
  // Unlinks a block from anywhere in the queue. REQUIRES: Contains(id).
  void Remove(BlockId id);
  // Links a block at the tail. REQUIRES: !Contains(id).
  void Append(BlockId id);
  void AppendN(std::span<const BlockId> ids);
  // Links a block at the head: it is the next to be popped.
  // REQUIRES: !Contains(id).
  void PushFront(BlockId id);

  // Calls visit(id) front to back until it returns false. The queue must
  // not change during the walk.
  template <typename Visit>
  void ForEach(Visit&& visit) const {
    for (int32_t id = next_[Index(Sentinel())]; id != Sentinel();
         id = next_[Index(id)]) {
      if (!visit(BlockId{id})) return;
    }
  }

  // Front to back; for tests, stats and debugging (O(size)).
  std::vector<BlockId> ToVector() const;

 private:
  static constexpr int32_t kNotQueued = -1;

  int32_t Sentinel() const { return capacity_; }
  static size_t Index(BlockId id) { return static_cast<size_t>(id); }

  int32_t capacity_;
  int32_t size_ = 0;
  // Slot `capacity_` is the sentinel: next_[sentinel] is the head and
  // prev_[sentinel] the tail. prev_[id] == kNotQueued marks a block that is
  // not in the queue.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_FREE_BLOCK_QUEUE_H_
