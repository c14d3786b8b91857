// The disk tier's in-memory index (DiskIndex, declared in disk_internal.h):
// which keys the tier holds, their sizes, tokens, value locations and LRU
// order, and the byte bound; and the value file's slots (SlotAllocator).
#include <algorithm>
#include <string>
#include <utility>

#include "tiers/disk_internal.h"

namespace tierkv::disk_internal {

StatusOr<bool> DiskIndex::Reserve(const BlockKey& key, uint64_t generation,
                                  uint64_t bytes,
                                  std::span<const TokenId> tokens,
                                  std::vector<BlockKey>* victims,
                                  std::vector<Evicted>* evicted) {
  auto existing = entries_.find(key);
  if (existing != entries_.end() && existing->second.generation > generation) {
    return false;
  }
  if (bytes > capacity_) {
    return Status::ResourceExhausted(
        "a " + std::to_string(bytes) +
        "-byte value is larger than the disk tier's capacity of " +
        std::to_string(capacity_) + " bytes");
  }
  const bool replaced = Erase(key);
  while (bytes_ + bytes > capacity_) {
    if (lru_.empty()) {
      if (replaced) victims->push_back(key);
      return Status::ResourceExhausted(
          "disk tier full: its capacity is taken by writes in flight");
    }
    EvictOldest(victims, evicted);
  }
  // The key's old value, if any, is overwritten rather than deleted.
  Entry& entry = entries_[key];
  entry.generation = generation;
  entry.bytes = bytes;
  entry.tokens.assign(tokens.begin(), tokens.end());
  bytes_ += bytes;
  return true;
}

uint64_t SlotAllocator::Take() {
  if (free_.empty()) return end_++;
  const uint64_t slot = *free_.begin();
  free_.erase(free_.begin());
  return slot;
}

void SlotAllocator::Give(uint64_t slot) {
  if (readers_.contains(slot)) {
    given_while_read_.insert(slot);
  } else {
    free_.insert(slot);
  }
}

void SlotAllocator::DropReader(uint64_t slot) {
  auto it = readers_.find(slot);
  if (it == readers_.end() || --it->second > 0) return;
  readers_.erase(it);
  if (given_while_read_.erase(slot) > 0) free_.insert(slot);
}

uint64_t SlotAllocator::TrimEnd() {
  while (end_ > 0 && free_.contains(end_ - 1)) {
    free_.erase(end_ - 1);
    --end_;
  }
  return end_;
}

void SlotAllocator::Restore(std::span<const uint64_t> used) {
  free_.clear();
  end_ = used.empty() ? 0 : *std::max_element(used.begin(), used.end()) + 1;
  std::vector<bool> taken(end_);
  for (uint64_t slot : used) taken[slot] = true;
  for (uint64_t slot = 0; slot < end_; ++slot) {
    if (!taken[slot]) free_.insert(slot);
  }
}

bool DiskIndex::Commit(const BlockKey& key, uint64_t generation,
                       const ValueLocation& location) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.generation != generation) {
    return false;
  }
  it->second.stored = true;
  it->second.location = location;
  it->second.lru = lru_.insert(lru_.end(), key);
  ReportStored(key, it->second);
  return true;
}

void DiskIndex::ReportStored(const BlockKey& key, const Entry& entry) const {
  if (events_ == nullptr) return;
  events_->BlockStored({.medium = CacheMedium::kStorage,
                        .key = key,
                        .parent = std::nullopt,
                        .tokens = entry.tokens,
                        .block_size = block_size_,
                        .lora_id = std::nullopt});
}

bool DiskIndex::IsCurrent(const BlockKey& key, uint64_t generation) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.generation == generation;
}

void DiskIndex::InsertStored(const BlockKey& key, uint64_t bytes,
                             std::vector<TokenId> tokens,
                             const ValueLocation& location) {
  Erase(key);
  Entry& entry = entries_[key];
  entry.generation = 0;  // Older than every Put of this run.
  entry.bytes = bytes;
  entry.tokens = std::move(tokens);
  entry.location = location;
  entry.stored = true;
  entry.lru = lru_.insert(lru_.end(), key);
  bytes_ += bytes;
  ReportStored(key, entry);
}

void DiskIndex::EvictToCapacity(std::vector<BlockKey>* victims,
                                std::vector<Evicted>* evicted) {
  while (bytes_ > capacity_ && !lru_.empty()) EvictOldest(victims, evicted);
}

void DiskIndex::EvictOldest(std::vector<BlockKey>* victims,
                            std::vector<Evicted>* evicted) {
  const BlockKey key = lru_.front();
  if (evicted != nullptr) {
    Entry& entry = entries_.at(key);
    evicted->push_back({.key = key,
                        .tokens = std::move(entry.tokens),
                        .location = entry.location});
  }
  victims->push_back(key);
  Erase(key);
  ++evictions_;
}

const DiskIndex::Entry* DiskIndex::FindStored(const BlockKey& key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.stored ? &it->second : nullptr;
}

bool DiskIndex::Erase(const BlockKey& key_ref) {
  // A copy: callers pass lru_.front(), which the erase below frees.
  const BlockKey key = key_ref;
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  if (it->second.stored) {
    lru_.erase(it->second.lru);
    if (events_ != nullptr) events_->BlockRemoved(CacheMedium::kStorage, key);
  }
  bytes_ -= it->second.bytes;
  entries_.erase(it);
  return true;
}

bool DiskIndex::EraseIf(const BlockKey& key, uint64_t generation) {
  return IsCurrent(key, generation) && Erase(key);
}

}  // namespace tierkv::disk_internal
