// The disk tier's index (tiers/disk_internal.h) against a model of its
// eviction order written from the rule alone: random Reserves, Commits,
// reads, rewrites and erases of values of random sizes, every victim
// checked against the victim the rule names, and the byte counts against
// the model's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tiers/disk_internal.h"

namespace tierkv::disk_internal {
namespace {

BlockKey Key(int i) {
  return BlockKey{.lo = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15u,
                  .hi = static_cast<uint64_t>(i) + 1};
}

struct ModelEntry {
  bool stored = false;
  uint64_t bytes = 0;
  uint64_t used_at = 0;
  bool reused = false;
};

class Model {
 public:
  explicit Model(EvictionPolicy policy) : policy_(policy) {}

  // The victim the rule names: under LRU the least recently stored or read;
  // under ARC the recent list's oldest while its bytes exceed the target,
  // else the older of the two lists' oldest.
  std::optional<int> Victim(uint64_t target) const {
    std::optional<int> recent;
    std::optional<int> frequent;
    uint64_t recent_bytes = 0;
    for (const auto& [key, e] : entries_) {
      if (!e.stored) continue;
      const bool is_frequent = policy_ == EvictionPolicy::kArc && e.reused;
      std::optional<int>& oldest = is_frequent ? frequent : recent;
      if (!oldest || e.used_at < entries_.at(*oldest).used_at) oldest = key;
      if (!is_frequent) recent_bytes += e.bytes;
    }
    if (!frequent) return recent;
    if (!recent) return frequent;
    if (recent_bytes > target) return recent;
    return entries_.at(*recent).used_at < entries_.at(*frequent).used_at
               ? recent
               : frequent;
  }

  std::optional<int> LeastRecentlyUsed() const {
    std::optional<int> oldest;
    for (const auto& [key, e] : entries_) {
      if (e.stored && (!oldest || e.used_at < entries_.at(*oldest).used_at)) {
        oldest = key;
      }
    }
    return oldest;
  }

  std::map<int, ModelEntry> entries_;
  uint64_t clock_ = 0;

 private:
  EvictionPolicy policy_;
};

int KeyIndexOf(const BlockKey& key) { return static_cast<int>(key.hi) - 1; }

void RandomOpsMatchTheModel(EvictionPolicy policy, uint32_t seed) {
  SCOPED_TRACE(std::string(EvictionPolicyName(policy)) + " seed " +
               std::to_string(seed));
  constexpr uint64_t kValue = 1000;
  constexpr uint64_t kCapacity = 12 * kValue;
  DiskIndex index(kCapacity, nullptr, 16, policy, kValue);
  Model model(policy);
  std::mt19937 rng(seed);
  // A small key space, so keys come back after their eviction (ghosts) and
  // are read while stored.
  std::uniform_int_distribution<int> key_of(0, 39);
  std::uniform_int_distribution<uint64_t> bytes_of(kValue / 2, 2 * kValue);
  std::uniform_int_distribution<int> op_of(0, 9);
  uint64_t generation = 0;
  int evictions = 0;
  int reused_evicted = 0;  // Keys read, or back from a ghost, evicted.
  int not_lru = 0;         // Victims LRU would not have chosen.
  // Keys WRITING, with their Put's generation.
  std::vector<std::pair<int, uint64_t>> writing;
  for (int step = 0; step < 4000; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = op_of(rng);
    if (op < 5) {  // Reserve a key, and mostly commit it at once.
      const int k = key_of(rng);
      const uint64_t bytes = bytes_of(rng);
      std::vector<BlockKey> victims;
      const StatusOr<bool> reserved =
          index.Reserve(Key(k), ++generation, bytes, {}, &victims);
      // The target the victims were chosen under: set before any eviction.
      const uint64_t target = index.recent_target();
      if (model.entries_.contains(k)) {
        model.entries_.erase(k);  // Replaced (a rewrite), or left on failure.
        std::erase_if(writing, [k](const auto& w) { return w.first == k; });
      }
      for (const BlockKey& v : victims) {
        const int got = KeyIndexOf(v);
        if (got == k) continue;  // Only on failure: the key itself.
        const std::optional<int> want = model.Victim(target);
        ASSERT_TRUE(want.has_value());
        ASSERT_EQ(got, *want);
        ++evictions;
        if (model.entries_.at(got).reused) ++reused_evicted;
        // LRU would have taken another: the least recently used of all.
        const std::optional<int> lru = model.LeastRecentlyUsed();
        if (*lru != got) ++not_lru;
        model.entries_.erase(got);
      }
      if (!reserved.ok()) {
        ASSERT_EQ(reserved.status().code(), StatusCode::kResourceExhausted);
        continue;
      }
      ASSERT_TRUE(*reserved);
      model.entries_[k] = {.stored = false, .bytes = bytes};
      if (op < 4) {
        ASSERT_TRUE(index.Commit(Key(k), generation, {}));
        const DiskIndex::Entry* e = index.FindStored(Key(k));
        ASSERT_NE(e, nullptr);
        // Whether it came back from a ghost is the index's to say (the
        // ghosts are GhostKeys'); the order that follows is checked here.
        model.entries_[k] = {.stored = true,
                             .bytes = bytes,
                             .used_at = ++model.clock_,
                             .reused = e->reused};
      } else {
        writing.emplace_back(k, generation);  // Lands later, or is replaced.
      }
    } else if (op < 6 && !writing.empty()) {  // A write in flight lands.
      const auto [k, gen] = writing.back();
      writing.pop_back();
      ASSERT_TRUE(index.Commit(Key(k), gen, {}));
      const DiskIndex::Entry* e = index.FindStored(Key(k));
      ASSERT_NE(e, nullptr);
      model.entries_[k].stored = true;
      model.entries_[k].used_at = ++model.clock_;
      model.entries_[k].reused = e->reused;
    } else if (op < 9) {  // A read (a promotion).
      const int k = key_of(rng);
      index.Touch(Key(k));
      auto it = model.entries_.find(k);
      if (it != model.entries_.end() && it->second.stored) {
        it->second.used_at = ++model.clock_;
        it->second.reused = true;
      }
    } else {  // A remove.
      const int k = key_of(rng);
      EXPECT_EQ(index.Erase(Key(k)), model.entries_.erase(k) > 0);
      std::erase_if(writing, [k](const auto& w) { return w.first == k; });
    }
    // The byte counts and the key list agree with the model.
    uint64_t bytes = 0;
    uint64_t recent = 0;
    uint64_t frequent = 0;
    std::vector<std::pair<uint64_t, int>> stored;
    for (const auto& [k, e] : model.entries_) {
      bytes += e.bytes;
      if (!e.stored) continue;
      stored.emplace_back(e.used_at, k);
      (policy == EvictionPolicy::kArc && e.reused ? frequent : recent) +=
          e.bytes;
    }
    ASSERT_EQ(index.bytes(), bytes);
    ASSERT_LE(index.bytes(), kCapacity);
    ASSERT_EQ(index.recent_bytes(), recent);
    ASSERT_EQ(index.frequent_bytes(), frequent);
    std::sort(stored.begin(), stored.end());
    std::vector<int> want_keys;
    for (const auto& [used_at, k] : stored) want_keys.push_back(k);
    std::vector<int> got_keys;
    for (const BlockKey& key : index.StoredKeys()) {
      got_keys.push_back(KeyIndexOf(key));
    }
    ASSERT_EQ(got_keys, want_keys);
    ASSERT_LE(index.recent_target(), kCapacity);
  }
  // The run went where the rule matters: many evictions, of reused keys
  // too, and under ARC (once ghosts came back) victims LRU would have kept.
  EXPECT_GT(evictions, 500);
  EXPECT_GT(reused_evicted, 100);
  if (policy == EvictionPolicy::kLru) {
    EXPECT_EQ(not_lru, 0);
  } else {
    EXPECT_GT(not_lru, 20);
  }
}

TEST(DiskIndex, LruEvictsAsTheModelSays) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    RandomOpsMatchTheModel(EvictionPolicy::kLru, seed);
  }
}

TEST(DiskIndex, ArcEvictsAsTheModelSays) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    RandomOpsMatchTheModel(EvictionPolicy::kArc, seed);
  }
}

}  // namespace
}  // namespace tierkv::disk_internal
