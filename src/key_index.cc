#include "src/key_index.h"

#include <algorithm>

namespace tierkv {

KeyIndex::KeyIndex(int32_t max_entries, bool compact)
    : slots_(compact ? static_cast<size_t>(std::max(max_entries, 1)) * 7 / 4 + 1
                     : 2 * static_cast<size_t>(std::max(max_entries, 1)),
             Slot{.id = kEmpty, .tag = 0}) {}

bool KeyIndex::Erase(const BlockKey& key, BlockId id) {
  const uint32_t tag = Tag(key);
  const auto want = static_cast<uint32_t>(id);
  size_t hole = Home(tag);
  while (slots_[hole].id != want || slots_[hole].tag != tag) {
    if (slots_[hole].id == kEmpty) return false;
    hole = Next(hole);
  }
  // Backward shift: pull each later entry of the cluster into the hole when
  // the hole lies on its probe path (between its home and where it sits), so
  // every remaining key stays reachable from its home without tombstones.
  const size_t n = slots_.size();
  for (size_t i = Next(hole); slots_[i].id != kEmpty; i = Next(i)) {
    const size_t home = Home(slots_[i].tag);
    const size_t from_home = i >= home ? i - home : i + n - home;
    const size_t from_hole = i >= hole ? i - hole : i + n - hole;
    if (from_home >= from_hole) {
      slots_[hole] = slots_[i];
      hole = i;
    }
  }
  slots_[hole] = Slot{.id = kEmpty, .tag = 0};
  --size_;
  return true;
}

}  // namespace tierkv
