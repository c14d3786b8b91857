#include "src/free_block_queue.h"

#include <cassert>

namespace tierkv {

FreeBlockQueue::FreeBlockQueue(int32_t capacity, int32_t num_lists)
    : capacity_(capacity),
      num_lists_(num_lists),
      prev_(static_cast<size_t>(capacity + num_lists), kNotQueued),
      next_(static_cast<size_t>(capacity + num_lists), kNotQueued),
      list_of_(static_cast<size_t>(capacity), 0) {
  assert(num_lists >= 1 && num_lists <= kMaxLists);
  for (int32_t list = 0; list < num_lists; ++list) {
    prev_[Index(Sentinel(list))] = Sentinel(list);
    next_[Index(Sentinel(list))] = Sentinel(list);
  }
}

BlockId FreeBlockQueue::PopLeft() {
  assert(size(0) > 0);
  const BlockId id = Front();
  Remove(id);
  return id;
}

void FreeBlockQueue::PopLeftN(int32_t n, std::vector<BlockId>* out) {
  assert(n <= size(0));
  for (int32_t i = 0; i < n; ++i) out->push_back(PopLeft());
}

void FreeBlockQueue::Remove(BlockId id) {
  assert(id >= 0 && id < capacity_ && Contains(id));
  const int32_t prev = prev_[Index(id)];
  const int32_t next = next_[Index(id)];
  next_[Index(prev)] = next;
  prev_[Index(next)] = prev;
  prev_[Index(id)] = kNotQueued;
  next_[Index(id)] = kNotQueued;
  --list_sizes_[list_of_[Index(id)]];
  --size_;
}

void FreeBlockQueue::Append(BlockId id, int32_t list) {
  assert(id >= 0 && id < capacity_ && !Contains(id));
  assert(list >= 0 && list < num_lists_);
  const int32_t sentinel = Sentinel(list);
  const int32_t tail = prev_[Index(sentinel)];
  next_[Index(tail)] = id;
  prev_[Index(id)] = tail;
  next_[Index(id)] = sentinel;
  prev_[Index(sentinel)] = id;
  list_of_[Index(id)] = static_cast<uint8_t>(list);
  ++list_sizes_[Index(list)];
  ++size_;
}

void FreeBlockQueue::AppendN(std::span<const BlockId> ids) {
  for (BlockId id : ids) Append(id);
}

void FreeBlockQueue::PushFront(BlockId id, int32_t list) {
  assert(id >= 0 && id < capacity_ && !Contains(id));
  assert(list >= 0 && list < num_lists_);
  const int32_t sentinel = Sentinel(list);
  const int32_t head = next_[Index(sentinel)];
  prev_[Index(id)] = sentinel;
  next_[Index(id)] = head;
  prev_[Index(head)] = id;
  next_[Index(sentinel)] = id;
  list_of_[Index(id)] = static_cast<uint8_t>(list);
  ++list_sizes_[Index(list)];
  ++size_;
}

std::vector<BlockId> FreeBlockQueue::ToVector() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(size_));
  ForEach([&](BlockId id) {
    out.push_back(id);
    return true;
  });
  return out;
}

}  // namespace tierkv
