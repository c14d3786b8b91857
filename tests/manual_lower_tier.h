// ManualLowerTier: a lower tier for coordinator tests that holds every
// block and finishes a promotion only when the test says so.
#ifndef TIERKV_TESTS_MANUAL_LOWER_TIER_H_
#define TIERKV_TESTS_MANUAL_LOWER_TIER_H_

#include <optional>
#include <span>
#include <vector>

#include "src/lower_tier.h"

namespace tierkv {

class ManualLowerTier : public LowerTier {
 public:
  bool Contains(const BlockKey&, std::span<const TokenId>) const override {
    return true;
  }
  void Spill(const BlockKey&, std::span<const TokenId>, BlockId,
             std::optional<uint64_t>, Done done) override {
    done(Status::Ok());
  }
  void Promote(const BlockKey&, std::span<const TokenId>, BlockId,
               PromoteDone done) override {
    promotions.push_back(std::move(done));
  }
  LowerRemoval Remove(const BlockKey&) override { return {}; }
  LowerRemoval RemoveAll() override { return {}; }
  std::vector<BlockKey> StoredKeys(size_t, uint64_t* total) const override {
    *total = 0;  // It claims every block, but lists none.
    return {};
  }
  DiskTierStats stats() const override { return {}; }
  void HostDropped(const BlockKey& key) override {
    host_dropped.push_back(key);
  }

  std::vector<PromoteDone> promotions;
  // The keys the host told it it dropped, in order.
  std::vector<BlockKey> host_dropped;
};

}  // namespace tierkv

#endif  // TIERKV_TESTS_MANUAL_LOWER_TIER_H_
