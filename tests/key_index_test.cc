// KeyIndex: insert, find, erase and replace; probing across the table's end;
// backward-shift deletion inside clusters; keys that share a home slot or a
// tag; and a randomized run against std::unordered_map.
#include "src/key_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

namespace tierkv {
namespace {

// Blocks [0, n) and the key each holds: the key store an index reads keys
// from, as a BlockPool's block array is.
class IndexedBlocks {
 public:
  explicit IndexedBlocks(int32_t n)
      : index_(n), keys_(static_cast<size_t>(n)) {}

  KeyIndex& index() { return index_; }
  size_t num_slots() const { return index_.num_slots(); }

  std::optional<BlockId> Find(const BlockKey& key) const {
    return index_.Find(key, KeyOf());
  }
  std::optional<BlockId> Insert(const BlockKey& key, BlockId id) {
    keys_[static_cast<size_t>(id)] = key;
    return index_.Insert(key, id, KeyOf());
  }
  bool Erase(BlockId id) {
    return index_.Erase(keys_[static_cast<size_t>(id)], id);
  }

  // A key whose home slot is `home`; `n` tells keys with one home apart.
  BlockKey KeyAt(size_t home, uint64_t n) const {
    // The smallest tag that fast range maps to `home`, plus n: each home
    // owns 2^32 / num_slots tags, far more than the n a test uses.
    const uint64_t first =
        ((uint64_t{home} << 32) + num_slots() - 1) / num_slots();
    return BlockKey{.lo = first + n, .hi = 0x5eed'0000 + n};
  }

 private:
  struct KeyOfBlock {
    const std::vector<BlockKey>* keys;
    const BlockKey& operator()(BlockId id) const {
      return (*keys)[static_cast<size_t>(id)];
    }
  };
  KeyOfBlock KeyOf() const { return KeyOfBlock{&keys_}; }

  KeyIndex index_;
  std::vector<BlockKey> keys_;
};

TEST(KeyIndex, InsertFindEraseReplace) {
  IndexedBlocks b(8);
  EXPECT_EQ(b.num_slots(), 16u);
  const BlockKey a{.lo = 11, .hi = 1};
  const BlockKey c{.lo = 22, .hi = 2};
  EXPECT_EQ(b.Find(a), std::nullopt);
  EXPECT_EQ(b.Insert(a, 3), std::nullopt);
  EXPECT_EQ(b.Insert(c, 4), std::nullopt);
  EXPECT_EQ(b.Find(a), 3);
  EXPECT_EQ(b.Find(c), 4);
  EXPECT_EQ(b.index().size(), 2u);

  // A second block takes the key: the first is reported and unmapped.
  EXPECT_EQ(b.Insert(a, 5), 3);
  EXPECT_EQ(b.Find(a), 5);
  EXPECT_EQ(b.index().size(), 2u);

  EXPECT_FALSE(b.index().Erase(a, 3));  // No longer a's block.
  EXPECT_TRUE(b.Erase(5));
  EXPECT_EQ(b.Find(a), std::nullopt);
  EXPECT_FALSE(b.Erase(5));
  EXPECT_EQ(b.Find(c), 4);
  EXPECT_EQ(b.index().size(), 1u);
}

TEST(KeyIndex, KeysSharingATagAreDifferentEntries) {
  IndexedBlocks b(4);
  const BlockKey a{.lo = 7, .hi = 1};
  const BlockKey c{.lo = 7, .hi = 2};  // Same low word, other key.
  EXPECT_EQ(b.Insert(a, 0), std::nullopt);
  EXPECT_EQ(b.Insert(c, 1), std::nullopt);
  EXPECT_EQ(b.Find(a), 0);
  EXPECT_EQ(b.Find(c), 1);
  EXPECT_EQ(b.Find(BlockKey{.lo = 7, .hi = 3}), std::nullopt);
  EXPECT_TRUE(b.Erase(0));
  EXPECT_EQ(b.Find(a), std::nullopt);
  EXPECT_EQ(b.Find(c), 1);
}

TEST(KeyIndex, ProbesWrapAroundTheTableEnd) {
  IndexedBlocks b(4);  // 8 slots.
  const size_t last = b.num_slots() - 1;
  // Three keys homed at the last slot fill it, then slots 0 and 1; a fourth
  // homed at slot 0 lands behind them at slot 2.
  for (uint64_t n = 0; n < 3; ++n) {
    ASSERT_EQ(b.Insert(b.KeyAt(last, n), static_cast<BlockId>(n)),
              std::nullopt);
  }
  ASSERT_EQ(b.Insert(b.KeyAt(0, 9), 3), std::nullopt);
  for (uint64_t n = 0; n < 3; ++n) {
    EXPECT_EQ(b.Find(b.KeyAt(last, n)), static_cast<BlockId>(n));
  }
  EXPECT_EQ(b.Find(b.KeyAt(0, 9)), 3);

  // Erasing the entry at the last slot shifts the wrapped ones back across
  // the end; all stay findable.
  EXPECT_TRUE(b.Erase(0));
  EXPECT_EQ(b.Find(b.KeyAt(last, 0)), std::nullopt);
  EXPECT_EQ(b.Find(b.KeyAt(last, 1)), 1);
  EXPECT_EQ(b.Find(b.KeyAt(last, 2)), 2);
  EXPECT_EQ(b.Find(b.KeyAt(0, 9)), 3);
  EXPECT_TRUE(b.Erase(1));
  EXPECT_TRUE(b.Erase(2));
  EXPECT_EQ(b.Find(b.KeyAt(0, 9)), 3);
  EXPECT_EQ(b.index().size(), 1u);
}

TEST(KeyIndex, EraseInsideAClusterKeepsLaterKeysFindable) {
  IndexedBlocks b(8);  // 16 slots.
  // One cluster over slots 2..7: two keys at home 2, one at 3, one at 4,
  // one at 6 and one at 2 again, in that order.
  const std::vector<BlockKey> keys = {b.KeyAt(2, 0), b.KeyAt(2, 1),
                                      b.KeyAt(3, 0), b.KeyAt(4, 0),
                                      b.KeyAt(6, 0), b.KeyAt(2, 2)};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(b.Insert(keys[i], static_cast<BlockId>(i)), std::nullopt);
  }
  // Erase from the middle (home 2's second key), then the cluster's head.
  EXPECT_TRUE(b.Erase(1));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 1) continue;
    EXPECT_EQ(b.Find(keys[i]), static_cast<BlockId>(i)) << "key " << i;
  }
  EXPECT_TRUE(b.Erase(0));
  for (size_t i = 2; i < keys.size(); ++i) {
    EXPECT_EQ(b.Find(keys[i]), static_cast<BlockId>(i)) << "key " << i;
  }
  EXPECT_EQ(b.Find(keys[0]), std::nullopt);
  EXPECT_EQ(b.Find(keys[1]), std::nullopt);
}

TEST(KeyIndex, ManyKeysWithOneHomeSlot) {
  constexpr int32_t kBlocks = 64;
  IndexedBlocks b(kBlocks);
  // Every key homed at one slot near the end: a single cluster of the
  // index's full capacity that wraps around.
  const size_t home = b.num_slots() - 5;
  for (int32_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(b.Insert(b.KeyAt(home, static_cast<uint64_t>(i)), i),
              std::nullopt);
  }
  EXPECT_EQ(b.index().size(), static_cast<size_t>(kBlocks));
  EXPECT_EQ(b.Find(b.KeyAt(home, kBlocks)), std::nullopt);
  for (int32_t i = 0; i < kBlocks; i += 2) EXPECT_TRUE(b.Erase(i));
  for (int32_t i = 0; i < kBlocks; ++i) {
    const std::optional<BlockId> want =
        i % 2 == 0 ? std::nullopt : std::optional<BlockId>(i);
    EXPECT_EQ(b.Find(b.KeyAt(home, static_cast<uint64_t>(i))), want) << i;
  }
}

// Random inserts, replacements, erases and lookups over keys drawn from a
// small set of home slots (long clusters), checked against a model.
TEST(KeyIndex, MatchesUnorderedMapUnderRandomOperations) {
  constexpr int32_t kBlocks = 200;
  IndexedBlocks b(kBlocks);
  std::mt19937_64 rng(17);
  std::vector<BlockKey> universe;
  for (uint64_t n = 0; n < 300; ++n) {
    universe.push_back(b.KeyAt(rng() % 12 * 31 % b.num_slots(), n));
  }
  std::unordered_map<BlockKey, BlockId, BlockKeyHash> model;
  std::vector<std::optional<BlockKey>> held(kBlocks);  // Key per block.
  for (int step = 0; step < 20'000; ++step) {
    const BlockKey key = universe[rng() % universe.size()];
    const auto id = static_cast<BlockId>(rng() % kBlocks);
    const uint64_t op = rng() % 3;
    if (op == 0 && !held[static_cast<size_t>(id)].has_value()) {
      const auto it = model.find(key);
      const std::optional<BlockId> before =
          it == model.end() ? std::nullopt : std::optional<BlockId>(it->second);
      ASSERT_EQ(b.Insert(key, id), before) << "step " << step;
      if (before) held[static_cast<size_t>(*before)].reset();
      model[key] = id;
      held[static_cast<size_t>(id)] = key;
    } else if (op == 1 && held[static_cast<size_t>(id)].has_value()) {
      ASSERT_TRUE(b.Erase(id)) << "step " << step;
      model.erase(*held[static_cast<size_t>(id)]);
      held[static_cast<size_t>(id)].reset();
    } else {
      const auto it = model.find(key);
      const std::optional<BlockId> want =
          it == model.end() ? std::nullopt : std::optional<BlockId>(it->second);
      ASSERT_EQ(b.Find(key), want) << "step " << step;
    }
    ASSERT_EQ(b.index().size(), model.size());
  }
  size_t visited = 0;
  b.index().ForEach([&](BlockId id) {
    ++visited;
    EXPECT_TRUE(held[static_cast<size_t>(id)].has_value());
  });
  EXPECT_EQ(visited, model.size());
}

}  // namespace
}  // namespace tierkv
