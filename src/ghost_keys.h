// GhostKeys: the keys of a pool's recent evictions, each with a small tag
// (which list it left), for an eviction policy that adapts when an evicted
// key comes back (ARC's ghost lists). Holds 30-bit fingerprints, not keys:
// a false match only sends a block to the wrong list, never serves
// anything, and four bytes a ghost keep a pool's metadata small.
//
// Three generations of up to N/2 Adds each, each an open-addressing table
// of the fingerprints themselves (linear probing, backward-shift deletion,
// at most three quarters full): Adds go to the newest generation, and when it
// has taken N/2 the oldest one is emptied and becomes the newest. So a key
// is remembered while it is among the last N to 3N/2 Adds: at least as
// long as ARC's ghost lists remember it (the last N), and not exactly that
// long, as a ring of Adds would, because a ring's positions in the table
// need a read of the ring for every probe and every shifted entry. The
// three tables share their slot numbers and are interleaved slot by slot,
// so a lookup, which probes all three from the same home slot (most keys
// a pool looks up are in none), reads one cache line where it would read
// three. Every call is O(1) on average, probes read nothing but the
// tables, and nothing is allocated after construction. Not thread-safe;
// owned by its BlockPool.
#ifndef TIERKV_SRC_GHOST_KEYS_H_
#define TIERKV_SRC_GHOST_KEYS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tierkv/block_key.h"

namespace tierkv {

class GhostKeys {
 public:
  // Tags are 1..kMaxTag; 0 means "no ghost".
  static constexpr uint8_t kMaxTag = 3;

  // Remembers each key for at least `capacity` Adds after its own (at
  // least 1), and at most half as many more.
  explicit GhostKeys(int32_t capacity);

  // Remembers `key` with `tag` (1..kMaxTag) as the newest. REQUIRES: `key`
  // is not remembered (a pool adds the key it evicts, which it took from
  // here when the key was last keyed).
  void Add(const BlockKey& key, uint8_t tag);
  // The tag `key` was remembered with, forgetting it; 0 when it is not
  // remembered (never was, or forgotten since).
  uint8_t Take(const BlockKey& key);
  // Keys remembered with `tag`.
  int32_t count(uint8_t tag) const {
    int32_t n = 0;
    for (const Generation& g : generations_) n += g.counts[tag];
    return n;
  }
  int32_t size() const {
    int32_t n = 0;
    for (const Generation& g : generations_) n += g.size;
    return n;
  }
  // The Adds each generation takes.
  int32_t generation_capacity() const { return generation_capacity_; }
  static constexpr int32_t kGenerations = 3;
  // The tables of every generation, in bytes.
  size_t MemoryBytes() const;

 private:
  static constexpr uint32_t kEmpty = 0;  // A tag is never 0.

  struct Generation {
    int32_t size = 0;
    std::array<int32_t, kMaxTag + 1> counts{};
  };

  static uint32_t Fingerprint(const BlockKey& key) {
    return static_cast<uint32_t>(key.lo ^ key.hi) & ~uint32_t{kMaxTag};
  }
  static uint8_t TagOf(uint32_t entry) { return entry & kMaxTag; }
  // The fingerprint's 30 bits scaled to [0, slots): uniform, with no
  // power-of-two rounding of the table.
  size_t Home(uint32_t entry) const {
    return static_cast<size_t>((uint64_t{entry >> 2} * num_slots_) >> 30);
  }
  size_t Next(size_t slot) const {
    return slot + 1 == num_slots_ ? 0 : slot + 1;
  }
  // Generation g's entry in `slot`: the fingerprint above the tag's two
  // bits, or kEmpty.
  uint32_t& At(int32_t g, size_t slot) {
    return slots_[slot * kGenerations + static_cast<size_t>(g)];
  }
  uint32_t At(int32_t g, size_t slot) const {
    return slots_[slot * kGenerations + static_cast<size_t>(g)];
  }
  void EraseSlot(int32_t g, size_t slot);

  int32_t generation_capacity_;
  size_t num_slots_;
  std::vector<uint32_t> slots_;  // num_slots_ x kGenerations.
  std::array<Generation, kGenerations> generations_;
  int32_t newest_ = 0;          // The generation Adds go to.
  int32_t adds_to_newest_ = 0;  // Adds since it became the newest.
};

}  // namespace tierkv

#endif  // TIERKV_SRC_GHOST_KEYS_H_
