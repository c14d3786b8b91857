// The disk tier's index (tiers/disk_internal.h) against a model of its
// eviction order written from the rule alone: random Reserves, Commits,
// reads, renewals, rewrites and erases of values of random sizes. Every
// victim is checked against the victim the rule names, every key's
// standing (back from a ghost, kept through a rewrite) and ARC's target
// against ARC's adaptation, and the byte counts against the model's.
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

  // ARC's adaptation of the recent list's target when key `k` is stored
  // anew: the ghost list it left (0: none), after which it is forgotten.
  uint8_t TakeGhost(int k, uint64_t bytes, uint64_t capacity) {
    const auto it = ghosts_.find(k);
    if (it == ghosts_.end()) return 0;
    double recent = 0;
    double frequent = 0;
    for (const auto& [key, tag] : ghosts_) (tag == 1 ? recent : frequent) += 1;
    recent = std::max(1.0, recent);
    frequent = std::max(1.0, frequent);
    const uint8_t tag = it->second;
    ghosts_.erase(it);
    const auto step = [&](double ratio) {
      return static_cast<uint64_t>(static_cast<double>(bytes) *
                                   std::max(1.0, ratio));
    };
    if (tag == 1) {
      target_ = std::min(capacity, target_ + step(frequent / recent));
    } else {
      const uint64_t down = step(recent / frequent);
      target_ = target_ > down ? target_ - down : 0;
    }
    return tag;
  }

  std::map<int, ModelEntry> entries_;
  uint64_t clock_ = 0;
  // Under ARC: the keys evicted for room and not stored since, with the
  // list each left (1 recent, 2 frequent); the recent list's target.
  std::map<int, uint8_t> ghosts_;
  uint64_t target_ = 0;

 private:
  EvictionPolicy policy_;
};

int KeyIndexOf(const BlockKey& key) { return static_cast<int>(key.hi) - 1; }

void RandomOpsMatchTheModel(EvictionPolicy policy, uint32_t seed) {
  SCOPED_TRACE(std::string(EvictionPolicyName(policy)) + " seed " +
               std::to_string(seed));
  constexpr uint64_t kValue = 1000;
  constexpr uint64_t kCapacity = 12 * kValue;
  // Ghosts for a value of one byte: 12,000 of them, more than the run
  // evicts, so every evicted key is remembered until it comes back.
  DiskIndex index(kCapacity, nullptr, 16, policy, 1);
  Model model(policy);
  model.target_ = kCapacity;
  std::mt19937 rng(seed);
  // A small key space, so keys come back after their eviction (ghosts) and
  // are read while stored.
  std::uniform_int_distribution<int> key_of(0, 39);
  std::uniform_int_distribution<uint64_t> bytes_of(kValue / 2, 2 * kValue);
  std::uniform_int_distribution<int> op_of(0, 10);
  uint64_t generation = 0;
  int evictions = 0;
  int reused_evicted = 0;  // Keys read, or back from a ghost, evicted.
  int not_lru = 0;         // Victims LRU would not have chosen.
  int refused = 0;         // Reserves with no room beside the writes.
  // Keys WRITING, with their Put's generation.
  std::vector<std::pair<int, uint64_t>> writing;
  for (int step = 0; step < 4000; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = op_of(rng);
    // Now and then no write lands for a while: they pile up until a value
    // no longer fits beside them.
    const bool disk_slow = step % 1000 >= 700;
    if (op < 5) {  // Reserve a key, and mostly commit it at once.
      const int k = key_of(rng);
      const uint64_t bytes = bytes_of(rng);
      std::vector<BlockKey> victims;
      const StatusOr<bool> reserved =
          index.Reserve(Key(k), ++generation, bytes, {}, &victims);
      // It fits unless the values being written (the key's own aside: a
      // rewrite replaces it) leave too little room.
      uint64_t writing_bytes = 0;
      for (const auto& [key, e] : model.entries_) {
        if (!e.stored && key != k) writing_bytes += e.bytes;
      }
      if (writing_bytes + bytes > kCapacity) {
        // Refused before anything changed: no victim, the key's entry,
        // its ghost and the target as they were.
        ASSERT_FALSE(reserved.ok());
        ASSERT_EQ(reserved.status().code(), StatusCode::kResourceExhausted);
        ASSERT_TRUE(victims.empty());
        ASSERT_EQ(index.recent_target(), model.target_);
        ++refused;
        continue;
      }
      ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
      // A rewrite keeps the key's standing; a key back from its ghost
      // gains it and moves the target, before any eviction.
      bool reused = false;
      if (const auto it = model.entries_.find(k); it != model.entries_.end()) {
        reused = it->second.reused;
        model.entries_.erase(it);  // Replaced (a rewrite).
        std::erase_if(writing, [k](const auto& w) { return w.first == k; });
      } else if (policy == EvictionPolicy::kArc) {
        reused = model.TakeGhost(k, bytes, kCapacity) != 0;
      }
      auto model_bytes = [&model] {
        uint64_t n = 0;
        for (const auto& [key, e] : model.entries_) n += e.bytes;
        return n;
      };
      for (const BlockKey& v : victims) {
        const int got = KeyIndexOf(v);
        // Only while the new value does not fit.
        ASSERT_GT(model_bytes() + bytes, kCapacity);
        const std::optional<int> want = model.Victim(model.target_);
        ASSERT_TRUE(want.has_value());
        ASSERT_EQ(got, *want);
        ++evictions;
        const bool was_reused = model.entries_.at(got).reused;
        if (was_reused) ++reused_evicted;
        // LRU would have taken another: the least recently used of all.
        const std::optional<int> lru = model.LeastRecentlyUsed();
        if (*lru != got) ++not_lru;
        model.entries_.erase(got);
        if (policy == EvictionPolicy::kArc) {
          model.ghosts_[got] = was_reused ? 2 : 1;
        }
      }
      ASSERT_TRUE(*reserved);
      ASSERT_LE(model_bytes() + bytes, kCapacity);
      ASSERT_EQ(index.recent_target(), model.target_);
      model.entries_[k] = {.stored = false, .bytes = bytes, .reused = reused};
      if (op < 4) {
        ASSERT_TRUE(index.Commit(Key(k), generation, {}));
        const DiskIndex::Entry* e = index.FindStored(Key(k));
        ASSERT_NE(e, nullptr);
        ASSERT_EQ(e->reused, reused);
        model.entries_[k].stored = true;
        model.entries_[k].used_at = ++model.clock_;
      } else {
        writing.emplace_back(k, generation);  // Lands later, or is replaced.
      }
    } else if (op < 6 && !writing.empty() && !disk_slow) {
      // A write in flight lands.
      const auto [k, gen] = writing.back();
      writing.pop_back();
      ASSERT_TRUE(index.Commit(Key(k), gen, {}));
      const DiskIndex::Entry* e = index.FindStored(Key(k));
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(e->reused, model.entries_[k].reused);
      model.entries_[k].stored = true;
      model.entries_[k].used_at = ++model.clock_;
    } else if (op < 9) {  // A read (a promotion).
      const int k = key_of(rng);
      index.Touch(Key(k));
      auto it = model.entries_.find(k);
      if (it != model.entries_.end() && it->second.stored) {
        it->second.used_at = ++model.clock_;
        it->second.reused = true;
      }
    } else if (op == 9) {  // The host dropped its copy: renewed, not used.
      const int k = key_of(rng);
      index.Renew(Key(k));
      auto it = model.entries_.find(k);
      if (it != model.entries_.end() && it->second.stored) {
        it->second.used_at = ++model.clock_;
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
  EXPECT_GT(refused, 0);
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

// A value that cannot fit beside the writes in flight is refused before
// anything is evicted: a stored block is not deleted for a write that then
// fails (values of different sizes, as a codec makes them).
TEST(DiskIndex, AReserveThatCannotFitEvictsNothing) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    SCOPED_TRACE(EvictionPolicyName(policy));
    DiskIndex index(1000, nullptr, 16, policy, 500);
    std::vector<BlockKey> victims;
    ASSERT_TRUE(*index.Reserve(Key(1), 1, 600, {}, &victims));  // Writing.
    ASSERT_TRUE(*index.Reserve(Key(2), 2, 400, {}, &victims));
    ASSERT_TRUE(index.Commit(Key(2), 2, {}));
    const StatusOr<bool> refused = index.Reserve(Key(3), 3, 500, {}, &victims);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
    EXPECT_TRUE(victims.empty());
    EXPECT_NE(index.FindStored(Key(2)), nullptr);
    EXPECT_EQ(index.evictions(), 0u);
    // A rewrite of the stored key that cannot fit keeps its value too.
    EXPECT_FALSE(index.Reserve(Key(2), 4, 500, {}, &victims).ok());
    EXPECT_NE(index.FindStored(Key(2)), nullptr);
    EXPECT_TRUE(victims.empty());
  }
}

// Refused Reserves of a key with a ghost neither use its ghost nor age the
// others: with ghosts one value's worth (a generation of one key), three
// refusals must not make another key's ghost forgotten.
TEST(DiskIndex, RefusedReservesKeepEveryGhost) {
  for (int refusals : {0, 3}) {
    SCOPED_TRACE(refusals);
    DiskIndex index(2000, nullptr, 16, EvictionPolicy::kArc, 1000);
    std::vector<BlockKey> victims;
    uint64_t gen = 0;
    for (int k : {1, 2}) {
      ASSERT_TRUE(*index.Reserve(Key(k), ++gen, 1000, {}, &victims));
      ASSERT_TRUE(index.Commit(Key(k), gen, {}));
    }
    // Two writes in flight evict both: 1 and 2 are ghosts of the recent
    // list, and the capacity is all being written.
    const uint64_t c = ++gen;
    ASSERT_TRUE(*index.Reserve(Key(3), c, 1000, {}, &victims));
    const uint64_t d = ++gen;
    ASSERT_TRUE(*index.Reserve(Key(4), d, 1000, {}, &victims));
    const uint64_t target = index.recent_target();
    for (int i = 0; i < refusals; ++i) {
      EXPECT_FALSE(index.Reserve(Key(1), ++gen, 1000, {}, &victims).ok());
      EXPECT_EQ(index.recent_target(), target);
    }
    ASSERT_TRUE(index.Commit(Key(3), c, {}));
    ASSERT_TRUE(index.Commit(Key(4), d, {}));
    index.Erase(Key(3));
    // Key 2 comes back from its ghost: frequent.
    ASSERT_TRUE(*index.Reserve(Key(2), ++gen, 1000, {}, &victims));
    ASSERT_TRUE(index.Commit(Key(2), gen, {}));
    EXPECT_EQ(index.frequent_bytes(), 1000u);
  }
}

}  // namespace
}  // namespace tierkv::disk_internal
