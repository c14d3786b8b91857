// GhostKeys: the keys of the last N blocks a pool evicted, each with a
// small tag (which list it left), for an eviction policy that adapts when
// an evicted key comes back (ARC's ghost lists). Holds 30-bit
// fingerprints, not keys: a false match only sends a block to the wrong
// list, never serves anything, and four bytes a ghost keep a pool's
// metadata small. A ring of entries in eviction order, found
// through an open-addressing table with linear probing and backward-shift
// deletion: every call is O(1) on average and nothing is allocated after
// construction. Not thread-safe; owned by its BlockPool.
#ifndef TIERKV_SRC_GHOST_KEYS_H_
#define TIERKV_SRC_GHOST_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tierkv/block_key.h"

namespace tierkv {

class GhostKeys {
 public:
  // Tags are 1..kMaxTag; 0 means "no ghost".
  static constexpr uint8_t kMaxTag = 3;

  // Remembers up to `capacity` keys (at least 1).
  explicit GhostKeys(int32_t capacity);

  // Remembers `key` with `tag` (1..kMaxTag) as the newest of the last
  // `capacity` Adds, forgetting the oldest Add's key if it is still held.
  // A key remembered already is remembered again, as the newest.
  void Add(const BlockKey& key, uint8_t tag);
  // The tag `key` was remembered with, forgetting it; 0 when it is not
  // remembered (never was, or forgotten since).
  uint8_t Take(const BlockKey& key);
  // Keys remembered with `tag`.
  int32_t count(uint8_t tag) const { return counts_[tag]; }
  int32_t size() const { return size_; }
  // The ring and the table, in bytes.
  size_t MemoryBytes() const;

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;

  // A ring entry: the fingerprint above the tag's two bits; 0 is a free
  // slot (a tag is never 0).
  static uint32_t Fingerprint(const BlockKey& key) {
    return static_cast<uint32_t>(key.lo ^ key.hi) & ~uint32_t{kMaxTag};
  }
  static uint8_t TagOf(uint32_t entry) { return entry & kMaxTag; }
  // The fingerprint's 30 bits scaled to [0, table size): uniform, with no
  // power-of-two rounding of the table.
  size_t Home(uint32_t entry) const {
    return static_cast<size_t>((uint64_t{entry >> 2} * table_.size()) >> 30);
  }
  // The table slot holding ring position `pos`, or the one whose entry has
  // `fingerprint` (when pos is kEmpty); table_.size() when none.
  size_t Find(uint32_t fingerprint, uint32_t pos) const;
  size_t Next(size_t slot) const {
    return slot + 1 == table_.size() ? 0 : slot + 1;
  }
  void EraseSlot(size_t slot);
  void Forget(uint32_t pos);

  std::vector<uint32_t> ring_;
  std::vector<uint32_t> table_;  // Ring positions, or kEmpty.
  uint32_t head_ = 0;            // The next ring position to write.
  int32_t size_ = 0;
  int32_t counts_[kMaxTag + 1] = {};
};

}  // namespace tierkv

#endif  // TIERKV_SRC_GHOST_KEYS_H_
