// The disk tier's in-memory index (DiskIndex, declared in disk_internal.h):
// which keys the tier holds, their sizes, tokens, value locations and
// eviction order, and the byte bound; and the value file's slots
// (SlotAllocator).
#include <algorithm>
#include <string>
#include <utility>

#include "tiers/disk_internal.h"

namespace tierkv::disk_internal {

DiskIndex::DiskIndex(uint64_t capacity, CacheEventSink* events,
                     int32_t block_size, EvictionPolicy policy,
                     uint64_t value_bytes)
    : capacity_(capacity),
      events_(events),
      block_size_(block_size),
      policy_(policy == EvictionPolicy::kLru ? EvictionPolicy::kLru
                                             : EvictionPolicy::kArc),
      recent_target_(capacity) {
  if (policy_ == EvictionPolicy::kArc) {
    // As many ghosts as the tier holds values (ARC's |B1| + |B2| <= c), up
    // to kMaxGhosts: their tables (8 bytes a ghost) are allocated at once.
    // Past that, a ghost is remembered for fewer evictions than ARC's.
    const uint64_t values = capacity / std::max<uint64_t>(1, value_bytes);
    ghosts_.emplace(
        static_cast<int32_t>(std::clamp<uint64_t>(values, 1, kMaxGhosts)));
  }
}

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
  // Room is what is stored (it can be evicted) and what is free; values
  // being written stay, the key's own one but for its rewrite. Checked
  // before anything changes: a Reserve that cannot succeed evicts nothing
  // and leaves the key's entry, its ghost and ARC's target as they were.
  const uint64_t own_writing =
      existing != entries_.end() && !existing->second.stored
          ? existing->second.bytes
          : 0;
  const uint64_t writing =
      bytes_ - list_bytes_[0] - list_bytes_[1] - own_writing;
  if (writing + bytes > capacity_) {
    return Status::ResourceExhausted(
        "disk tier full: its capacity is taken by writes in flight");
  }
  // A rewrite keeps the key's standing with the policy; a key stored again
  // soon after its eviction earns it (a second use).
  const uint8_t ghost =
      existing != entries_.end() ? 0 : TakeEvicted(key, bytes);
  const bool reused =
      existing != entries_.end() ? existing->second.reused : ghost != 0;
  Erase(key);
  // Stored values remain while the bound does not hold (checked above).
  while (bytes_ + bytes > capacity_) EvictOne(victims, evicted);
  // The key's old value, if any, is overwritten rather than deleted.
  Entry& entry = entries_[key];
  entry.reused = reused;
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

std::vector<std::pair<uint64_t, uint64_t>> SlotAllocator::FreeRuns() const {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (const uint64_t slot : free_) {
    if (!runs.empty() && runs.back().first + runs.back().second == slot) {
      ++runs.back().second;
    } else {
      runs.emplace_back(slot, 1);
    }
  }
  return runs;
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
  Link(key, &it->second);
  ReportStored(key, it->second);
  return true;
}

void DiskIndex::Link(const BlockKey& key, Entry* entry) {
  const bool frequent = policy_ == EvictionPolicy::kArc && entry->reused;
  std::list<BlockKey>& list = frequent ? frequent_ : recent_;
  entry->lru = list.insert(list.end(), key);
  entry->used_at = ++clock_;
  list_bytes_[frequent ? 1 : 0] += entry->bytes;
}

void DiskIndex::Unlink(const Entry& entry) {
  const bool frequent = policy_ == EvictionPolicy::kArc && entry.reused;
  (frequent ? frequent_ : recent_).erase(entry.lru);
  list_bytes_[frequent ? 1 : 0] -= entry.bytes;
}

void DiskIndex::Touch(const BlockKey& key) { Relink(key, /*used=*/true); }

void DiskIndex::Renew(const BlockKey& key) { Relink(key, /*used=*/false); }

void DiskIndex::Relink(const BlockKey& key, bool used) {
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.stored) return;
  Unlink(it->second);
  if (used) it->second.reused = true;
  Link(key, &it->second);
}

uint8_t DiskIndex::TakeEvicted(const BlockKey& key, uint64_t bytes) {
  if (!ghosts_.has_value()) return 0;
  const double recent_ghosts = std::max(1, ghosts_->count(kRecentGhost));
  const double frequent_ghosts = std::max(1, ghosts_->count(kFrequentGhost));
  const uint8_t list = ghosts_->Take(key);
  if (list == 0) return 0;
  // ARC's adaptation, in bytes: a key back soon after leaving the recent
  // list says that list was too short, one from the frequent list that the
  // frequent one was; each moves the target by the ratio of the ghost
  // lists' sizes, at least one value.
  const auto step = [&](double ratio) {
    return static_cast<uint64_t>(static_cast<double>(bytes) *
                                 std::max(1.0, ratio));
  };
  if (list == kRecentGhost) {
    recent_target_ = std::min(
        capacity_, recent_target_ + step(frequent_ghosts / recent_ghosts));
  } else {
    const uint64_t down = step(recent_ghosts / frequent_ghosts);
    recent_target_ = recent_target_ > down ? recent_target_ - down : 0;
  }
  return list;
}

bool DiskIndex::EvictFromRecent() const {
  if (frequent_.empty()) return true;
  if (recent_.empty()) return false;
  if (list_bytes_[0] > recent_target_) return true;
  // Under the target: the older of the two oldest goes (the host pool's
  // ARC, BlockPool::ArcVictimList).
  return entries_.at(recent_.front()).used_at <
         entries_.at(frequent_.front()).used_at;
}

std::vector<BlockKey> DiskIndex::StoredKeys() const {
  std::vector<BlockKey> keys;
  keys.reserve(stored_keys());
  std::merge(recent_.begin(), recent_.end(), frequent_.begin(), frequent_.end(),
             std::back_inserter(keys),
             [this](const BlockKey& a, const BlockKey& b) {
               return entries_.at(a).used_at < entries_.at(b).used_at;
             });
  return keys;
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
  Link(key, &entry);
  bytes_ += bytes;
  ReportStored(key, entry);
}

void DiskIndex::EvictToCapacity(std::vector<BlockKey>* victims,
                                std::vector<Evicted>* evicted) {
  while (bytes_ > capacity_ && stored_keys() > 0) EvictOne(victims, evicted);
}

void DiskIndex::EvictOne(std::vector<BlockKey>* victims,
                         std::vector<Evicted>* evicted) {
  const bool from_recent = EvictFromRecent();
  const BlockKey key = from_recent ? recent_.front() : frequent_.front();
  Entry& entry = entries_.at(key);
  if (evicted != nullptr) {
    evicted->push_back({.key = key,
                        .tokens = std::move(entry.tokens),
                        .location = entry.location});
  }
  victims->push_back(key);
  Erase(key);
  if (ghosts_.has_value()) {
    ghosts_->Add(key, from_recent ? kRecentGhost : kFrequentGhost);
  }
  ++evictions_;
}

const DiskIndex::Entry* DiskIndex::FindStored(const BlockKey& key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.stored ? &it->second : nullptr;
}

bool DiskIndex::Erase(const BlockKey& key_ref) {
  // A copy: callers pass a list's front, which the erase below frees.
  const BlockKey key = key_ref;
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  if (it->second.stored) {
    Unlink(it->second);
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
