#include "src/ghost_keys.h"

#include <algorithm>
#include <cassert>

namespace tierkv {

GhostKeys::GhostKeys(int32_t capacity)
    : generation_capacity_(
          std::max(1, (capacity + kGenerations - 2) / (kGenerations - 1))),
      // At most three quarters full, plus one slot so a probe always ends.
      num_slots_(static_cast<size_t>(generation_capacity_) +
                 static_cast<size_t>(generation_capacity_) / 3 + 1),
      slots_(num_slots_ * kGenerations, kEmpty) {}

size_t GhostKeys::MemoryBytes() const {
  return slots_.size() * sizeof(uint32_t);
}

void GhostKeys::EraseSlot(int32_t g, size_t slot) {
  // Backward shift: pull later entries of the cluster into the hole when
  // their home does not lie between the hole and them, so every entry
  // stays reachable from its home without tombstones.
  Generation& gen = generations_[static_cast<size_t>(g)];
  --gen.counts[TagOf(At(g, slot))];
  --gen.size;
  size_t hole = slot;
  for (size_t next = Next(hole); At(g, next) != kEmpty; next = Next(next)) {
    const size_t home = Home(At(g, next));
    const bool between = hole <= next ? (hole < home && home <= next)
                                      : (hole < home || home <= next);
    if (!between) {
      At(g, hole) = At(g, next);
      hole = next;
    }
  }
  At(g, hole) = kEmpty;
}

void GhostKeys::Add(const BlockKey& key, uint8_t tag) {
  assert(tag >= 1 && tag <= kMaxTag);
  if (adds_to_newest_ == generation_capacity_) {
    // The oldest generation's keys have been remembered for at least
    // (kGenerations - 1) generations' Adds: forget them, and take Adds
    // there from now on.
    newest_ = (newest_ + 1) % kGenerations;
    for (size_t slot = 0; slot < num_slots_; ++slot) At(newest_, slot) = kEmpty;
    generations_[static_cast<size_t>(newest_)] = Generation{};
    adds_to_newest_ = 0;
  }
  ++adds_to_newest_;
  const uint32_t entry = Fingerprint(key) | tag;
  size_t slot = Home(entry);
  while (At(newest_, slot) != kEmpty) slot = Next(slot);
  At(newest_, slot) = entry;
  Generation& gen = generations_[static_cast<size_t>(newest_)];
  ++gen.counts[tag];
  ++gen.size;
}

uint8_t GhostKeys::Take(const BlockKey& key) {
  const uint32_t fingerprint = Fingerprint(key);
  // All generations from the same home slot, side by side; the newest
  // match wins (a key added again is its newest entry).
  uint32_t probing = (1u << kGenerations) - 1;  // Generations not yet done.
  int32_t found = -1;
  size_t found_slot = 0;
  int32_t found_age = kGenerations;
  for (size_t slot = Home(fingerprint); probing != 0; slot = Next(slot)) {
    for (int32_t g = 0; g < kGenerations; ++g) {
      if ((probing & (1u << g)) == 0) continue;
      const uint32_t at = At(g, slot);
      if (at == kEmpty) {
        probing &= ~(1u << g);
      } else if ((at & ~uint32_t{kMaxTag}) == fingerprint) {
        probing &= ~(1u << g);
        const int32_t age = (newest_ - g + kGenerations) % kGenerations;
        if (age < found_age) {
          found = g;
          found_slot = slot;
          found_age = age;
        }
      }
    }
  }
  if (found < 0) return 0;
  const uint8_t tag = TagOf(At(found, found_slot));
  EraseSlot(found, found_slot);
  return tag;
}

}  // namespace tierkv
