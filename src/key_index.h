// KeyIndex: a BlockPool's map from block key to the block holding it, as a
// flat open-addressing table sized once for the pool's fixed block count.
// Not thread-safe; owned by its BlockPool.
//
// Layout: 2 x max_entries slots (load factor at most 0.5), or 1.75 x when
// compact (at most 0.57: about a tenth more probing for a hit, a quarter
// more for a miss), each 8 bytes: the
// block id and the low 32 bits of the key (the tag). The key itself lives in
// the owner's block array; lookups reach it through a `key_of(id)` callable
// only when a slot's tag matches, so a probe past other keys reads nothing
// but the table. A key's home slot comes from its tag by multiply-shift
// (Lemire's fast range), so any slot count works and the table need not be
// rounded up to a power of two; deleting uses the stored tags alone.
//
// Collisions: linear probing, and deletion shifts later entries of the
// cluster back (no tombstones), so probe lengths never grow with churn.
// Keys are XXH3-128 hashes, so home slots are uniform for honest traffic;
// keys chosen to share a home slot only lengthen probes, never change a
// result. With at most max_entries entries in more slots than that, a probe
// always reaches an empty slot.
#ifndef TIERKV_SRC_KEY_INDEX_H_
#define TIERKV_SRC_KEY_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/types.h"

namespace tierkv {

class KeyIndex {
 public:
  // An empty index for up to `max_entries` keys (at least 1); `compact`
  // trades 2 bytes an entry for longer probes.
  explicit KeyIndex(int32_t max_entries, bool compact = false);

  size_t size() const { return size_; }
  size_t num_slots() const { return slots_.size(); }
  // Bytes the table holds (its slots), for memory accounting.
  size_t MemoryBytes() const { return slots_.size() * sizeof(Slot); }

  // The block mapped to `key`. key_of(id) returns the key block `id` holds.
  template <typename KeyOf>
  std::optional<BlockId> Find(const BlockKey& key, const KeyOf& key_of) const {
    const uint32_t tag = Tag(key);
    for (size_t i = Home(tag);; i = Next(i)) {
      const Slot& s = slots_[i];
      if (s.id == kEmpty) return std::nullopt;
      if (s.tag == tag && key_of(static_cast<BlockId>(s.id)) == key) {
        return static_cast<BlockId>(s.id);
      }
    }
  }

  // Maps `key` to `id`. Returns the block the key was mapped to before, if
  // any (its entry now names `id`). REQUIRES: when the key is new, size() <
  // the max_entries given at construction.
  template <typename KeyOf>
  std::optional<BlockId> Insert(const BlockKey& key, BlockId id,
                                const KeyOf& key_of) {
    const uint32_t tag = Tag(key);
    for (size_t i = Home(tag);; i = Next(i)) {
      Slot& s = slots_[i];
      if (s.id == kEmpty) {
        s = {.id = static_cast<uint32_t>(id), .tag = tag};
        ++size_;
        return std::nullopt;
      }
      if (s.tag == tag && key_of(static_cast<BlockId>(s.id)) == key) {
        const auto previous = static_cast<BlockId>(s.id);
        s.id = static_cast<uint32_t>(id);
        return previous;
      }
    }
  }

  // Removes the entry mapping `key` to `id`. Needs no key_of: the entry is
  // found by its tag and id. Returns false when there is no such entry.
  bool Erase(const BlockKey& key, BlockId id);

  // Calls visit(id) for each mapped block, in slot order.
  template <typename Visit>
  void ForEach(const Visit& visit) const {
    for (const Slot& s : slots_) {
      if (s.id != kEmpty) visit(static_cast<BlockId>(s.id));
    }
  }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;

  struct Slot {
    uint32_t id;   // kEmpty: a free slot.
    uint32_t tag;  // Low 32 bits of the key; the home slot derives from it.
  };

  static uint32_t Tag(const BlockKey& key) {
    return static_cast<uint32_t>(key.lo);
  }
  // Fast range: the tag scaled to [0, num_slots), uniform for uniform tags.
  size_t Home(uint32_t tag) const {
    return static_cast<size_t>((uint64_t{tag} * slots_.size()) >> 32);
  }
  size_t Next(size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_KEY_INDEX_H_
