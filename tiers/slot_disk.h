// SlotDisk: the disk tier as the coordinator's LowerTier. Blocks move
// between host slots (HostTier) and DiskTier values, named by slot id.
// Thread-safety: as DiskTier; the slot memory is guarded by the
// coordinator's pins (see LowerTier).
#ifndef TIERKV_TIERS_SLOT_DISK_H_
#define TIERKV_TIERS_SLOT_DISK_H_

#include <cstddef>
#include <span>

#include "src/lower_tier.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace tierkv {

class SlotDisk : public LowerTier {
 public:
  // Neither is owned; both must outlive every callback this one started
  // (destroy `disk`, which waits for its I/O, before `host`).
  SlotDisk(DiskTier* disk, const HostTier* host) : disk_(disk), host_(host) {}

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    return disk_->Contains(key, tokens);
  }
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             Done done) override {
    disk_->Put(key, tokens, Slot(slot), std::move(done));
  }
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, Done done) override {
    disk_->Get(key, tokens, Slot(slot), std::move(done));
  }
  bool Remove(const BlockKey& key) override { return disk_->Remove(key); }
  uint64_t RemoveAll() override { return disk_->RemoveAll(); }
  DiskTierStats stats() const override { return disk_->stats(); }

 private:
  std::span<std::byte> Slot(BlockId slot) const {
    return {host_->slot(slot), host_->slot_bytes()};
  }

  DiskTier* disk_;
  const HostTier* host_;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_SLOT_DISK_H_
