#include "src/ghost_keys.h"

#include <algorithm>
#include <cassert>

namespace tierkv {

GhostKeys::GhostKeys(int32_t capacity)
    : ring_(static_cast<size_t>(std::max(capacity, 1)), 0),
      // At most half full: short probes.
      table_(2 * ring_.size(), kEmpty) {}

size_t GhostKeys::MemoryBytes() const {
  return (ring_.size() + table_.size()) * sizeof(uint32_t);
}

size_t GhostKeys::Find(uint32_t fingerprint, uint32_t pos) const {
  for (size_t slot = Home(fingerprint);; slot = Next(slot)) {
    const uint32_t at = table_[slot];
    if (at == kEmpty) return table_.size();
    if (pos == kEmpty ? (ring_[at] & ~uint32_t{kMaxTag}) == fingerprint
                      : at == pos) {
      return slot;
    }
  }
}

void GhostKeys::EraseSlot(size_t slot) {
  // Backward shift: pull later entries of the cluster into the hole when
  // their home does not lie between the hole and them, so every entry
  // stays reachable from its home without tombstones.
  size_t hole = slot;
  for (size_t next = Next(hole); table_[next] != kEmpty; next = Next(next)) {
    const size_t home = Home(ring_[table_[next]]);
    const bool between = hole <= next ? (hole < home && home <= next)
                                      : (hole < home || home <= next);
    if (!between) {
      table_[hole] = table_[next];
      hole = next;
    }
  }
  table_[hole] = kEmpty;
}

void GhostKeys::Forget(uint32_t pos) {
  const uint32_t entry = ring_[pos];
  if (entry == 0) return;
  const size_t slot = Find(entry, pos);
  assert(slot < table_.size());
  EraseSlot(slot);
  --counts_[TagOf(entry)];
  --size_;
  ring_[pos] = 0;
}

void GhostKeys::Add(const BlockKey& key, uint8_t tag) {
  assert(tag >= 1 && tag <= kMaxTag);
  const uint32_t fingerprint = Fingerprint(key);
  if (const size_t slot = Find(fingerprint, kEmpty); slot < table_.size()) {
    Forget(table_[slot]);
  }
  Forget(head_);  // The oldest, when the ring is full.
  ring_[head_] = fingerprint | tag;
  size_t slot = Home(fingerprint);
  while (table_[slot] != kEmpty) slot = Next(slot);
  table_[slot] = head_;
  ++counts_[tag];
  ++size_;
  head_ = static_cast<uint32_t>((head_ + 1) % ring_.size());
}

uint8_t GhostKeys::Take(const BlockKey& key) {
  const size_t slot = Find(Fingerprint(key), kEmpty);
  if (slot == table_.size()) return 0;
  const uint32_t pos = table_[slot];
  const uint8_t tag = TagOf(ring_[pos]);
  Forget(pos);
  return tag;
}

}  // namespace tierkv
