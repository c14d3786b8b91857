// PagedKvCache: KV memory for the reference model (testing/reference_model.h),
// num_blocks blocks laid out per KvLayout, the same bytes a tier stores and
// RopeRemap reads and writes. A slot is block * block_size + offset. It owns
// its memory (Create) or is a view of memory someone else owns (CreateOver,
// e.g. a ChunkKvStore's pool). Move-only; not thread-safe.
#ifndef TIERKV_TESTING_PAGED_KV_CACHE_H_
#define TIERKV_TESTING_PAGED_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tierkv/kv_layout.h"
#include "tierkv/status.h"

namespace tierkv {

class PagedKvCache {
 public:
  // Zero-filled. InvalidArgument for an invalid layout or num_blocks < 1.
  static StatusOr<PagedKvCache> Create(const KvLayout& layout,
                                       int64_t num_blocks);
  // Over `memory`: its whole blocks, memory.size() / layout.BlockBytes() of
  // them. The memory must outlive the cache. InvalidArgument for an invalid
  // layout or memory smaller than one block.
  static StatusOr<PagedKvCache> CreateOver(const KvLayout& layout,
                                           std::span<std::byte> memory);
  PagedKvCache(PagedKvCache&&) noexcept = default;
  PagedKvCache& operator=(PagedKvCache&&) noexcept = default;
  PagedKvCache(const PagedKvCache&) = delete;
  PagedKvCache& operator=(const PagedKvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return num_blocks_ * layout_.block_size; }
  std::byte* base() { return base_; }
  const std::byte* base() const { return base_; }
  // Every block's bytes, e.g. the destination of ChunkKvStore::Place.
  std::span<std::byte> memory() {
    return {base_, static_cast<size_t>(num_blocks_) * layout_.BlockBytes()};
  }
  const std::byte* block(int64_t id) const {
    return base_ + static_cast<size_t>(id) * layout_.BlockBytes();
  }
  // One token's K or V of one layer (num_kv_heads * head_dim elements).
  // REQUIRES: slot, layer in range.
  const std::byte* token(int64_t slot, int32_t layer, KvPlane plane) const;

  // Stores `values` rounded to the storage dtype (to nearest even), or loads
  // them widened to fp32. REQUIRES: indices in range, a full token's values.
  void Write(int64_t slot, int32_t layer, KvPlane plane,
             std::span<const float> values);
  void Read(int64_t slot, int32_t layer, KvPlane plane,
            std::span<float> out) const;

 private:
  PagedKvCache(const KvLayout& layout, int64_t num_blocks,
               std::vector<std::byte> owned, std::byte* base);
  std::byte* mutable_token(int64_t slot, int32_t layer, KvPlane plane);

  KvLayout layout_;
  int64_t num_blocks_;
  std::vector<std::byte> owned_;  // Empty for a view; moving keeps base_.
  std::byte* base_;
};

}  // namespace tierkv

#endif  // TIERKV_TESTING_PAGED_KV_CACHE_H_
