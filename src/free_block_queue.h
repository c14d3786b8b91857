// FreeBlockQueue: the order of a BlockPool's free blocks (seed 002,
// FreeKVCacheBlockQueue, generalised). Intrusive doubly-linked lists
// threaded through per-block prev/next indices, so popleft, remove and
// append are O(1) and nothing is allocated after construction. Links are
// block ids, not pointers, so the same structure could live in shared
// memory.
//
// One list is vLLM's LRU queue. An eviction policy may keep a few lists
// over the same links (a probation and a protected list, say): a block is
// in at most one of them, and the calls without a list name list 0.
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
  // At most this many lists.
  static constexpr int32_t kMaxLists = 4;

  // Empty lists that can hold block ids [0, capacity). REQUIRES:
  // 1 <= num_lists <= kMaxLists.
  explicit FreeBlockQueue(int32_t capacity, int32_t num_lists = 1);

  // Blocks in all lists.
  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int32_t capacity() const { return capacity_; }
  // Bytes of the links, for memory accounting.
  size_t MemoryBytes() const {
    return (prev_.size() + next_.size()) * sizeof(int32_t) +
           list_of_.size() * sizeof(uint8_t);
  }
  bool Contains(BlockId id) const { return prev_[Index(id)] != kNotQueued; }

  int32_t size(int32_t list) const { return list_sizes_[Index(list)]; }
  // The list holding `id`. REQUIRES: Contains(id).
  int32_t ListOf(BlockId id) const { return list_of_[Index(id)]; }

  // The first block of list 0 (for LRU, the least recently freed).
  // REQUIRES: size(0) > 0.
  BlockId Front() const { return Front(0); }
  // REQUIRES: size(list) > 0.
  BlockId Front(int32_t list) const { return next_[Index(Sentinel(list))]; }

  // For walking one list: its first block, and the block after `id` in
  // the list holding it; kNone past the end. REQUIRES for After:
  // Contains(id).
  static constexpr BlockId kNone = -1;
  BlockId First(int32_t list) const {
    const int32_t id = next_[Index(Sentinel(list))];
    return id == Sentinel(list) ? kNone : id;
  }
  BlockId After(BlockId id) const {
    const int32_t next = next_[Index(id)];
    return next >= capacity_ ? kNone : next;
  }

  // Pops from list 0. REQUIRES: size(0) > 0.
  BlockId PopLeft();
  // Pops the n front blocks of list 0 into `out` (appended).
  // REQUIRES: n <= size(0).
  void PopLeftN(int32_t n, std::vector<BlockId>* out);
  // Unlinks a block from whichever list holds it. REQUIRES: Contains(id).
  void Remove(BlockId id);
  // Links a block at the tail of a list. REQUIRES: !Contains(id).
  void Append(BlockId id, int32_t list = 0);
  void AppendN(std::span<const BlockId> ids);
  // Links a block at the head of a list: the next to be popped from it.
  // REQUIRES: !Contains(id).
  void PushFront(BlockId id, int32_t list = 0);

  // Calls visit(id) for list 0 front to back, then list 1 and so on, until
  // it returns false. The queue must not change during the walk.
  template <typename Visit>
  void ForEach(Visit&& visit) const {
    for (int32_t list = 0; list < num_lists_; ++list) {
      if (!ForEachIn(list, visit)) return;
    }
  }

  // Calls visit(id) for one list, front to back, until it returns false;
  // false when it did.
  template <typename Visit>
  bool ForEachIn(int32_t list, Visit&& visit) const {
    const int32_t sentinel = Sentinel(list);
    for (int32_t id = next_[Index(sentinel)]; id != sentinel;
         id = next_[Index(id)]) {
      if (!visit(BlockId{id})) return false;
    }
    return true;
  }

  // The ForEach order; for tests, stats and debugging (O(size)).
  std::vector<BlockId> ToVector() const;

 private:
  static constexpr int32_t kNotQueued = -1;

  // Slots [capacity_, capacity_ + num_lists_) are the lists' sentinels:
  // next_[sentinel] is a list's head and prev_[sentinel] its tail.
  int32_t Sentinel(int32_t list) const { return capacity_ + list; }
  static size_t Index(int32_t i) { return static_cast<size_t>(i); }

  int32_t capacity_;
  int32_t num_lists_;
  int32_t size_ = 0;
  int32_t list_sizes_[kMaxLists] = {};
  // prev_[id] == kNotQueued marks a block that is in no list.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<uint8_t> list_of_;  // Meaningful while queued.
};

}  // namespace tierkv

#endif  // TIERKV_SRC_FREE_BLOCK_QUEUE_H_
