#include "src/free_block_queue.h"

#include <cassert>

namespace tierkv {

FreeBlockQueue::FreeBlockQueue(int32_t capacity)
    : capacity_(capacity),
      prev_(static_cast<size_t>(capacity) + 1, kNotQueued),
      next_(static_cast<size_t>(capacity) + 1, kNotQueued) {
  prev_[Index(Sentinel())] = Sentinel();
  next_[Index(Sentinel())] = Sentinel();
}

BlockId FreeBlockQueue::PopLeft() {
  assert(!empty());
  const BlockId id = Front();
  Remove(id);
  return id;
}

void FreeBlockQueue::PopLeftN(int32_t n, std::vector<BlockId>* out) {
  assert(n <= size_);
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
  --size_;
}

void FreeBlockQueue::Append(BlockId id) {
  assert(id >= 0 && id < capacity_ && !Contains(id));
  const int32_t tail = prev_[Index(Sentinel())];
  next_[Index(tail)] = id;
  prev_[Index(id)] = tail;
  next_[Index(id)] = Sentinel();
  prev_[Index(Sentinel())] = id;
  ++size_;
}

void FreeBlockQueue::AppendN(std::span<const BlockId> ids) {
  for (BlockId id : ids) Append(id);
}

void FreeBlockQueue::PushFront(BlockId id) {
  assert(id >= 0 && id < capacity_ && !Contains(id));
  const int32_t head = next_[Index(Sentinel())];
  prev_[Index(id)] = Sentinel();
  next_[Index(id)] = head;
  prev_[Index(head)] = id;
  next_[Index(Sentinel())] = id;
  ++size_;
}

std::vector<BlockId> FreeBlockQueue::ToVector() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(size_));
  for (int32_t id = next_[Index(Sentinel())]; id != Sentinel();
       id = next_[Index(id)]) {
    out.push_back(id);
  }
  return out;
}

}  // namespace tierkv
