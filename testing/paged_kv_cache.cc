#include "testing/paged_kv_cache.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "src/chunk_kv_store_internal.h"
#include "src/rope_remap.h"

namespace tierkv {

StatusOr<PagedKvCache> PagedKvCache::Create(const KvLayout& layout,
                                            int64_t num_blocks) {
  TIERKV_RETURN_IF_ERROR(CheckKvMemorySize(layout, num_blocks));
  std::vector<std::byte> bytes(static_cast<size_t>(num_blocks) *
                               layout.BlockBytes());
  std::byte* base = bytes.data();
  return PagedKvCache(layout, num_blocks, std::move(bytes), base);
}

StatusOr<PagedKvCache> PagedKvCache::CreateOver(const KvLayout& layout,
                                                std::span<std::byte> memory) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  const auto num_blocks =
      static_cast<int64_t>(memory.size() / layout.BlockBytes());
  if (num_blocks < 1) {
    return Status::InvalidArgument("KV cache over " +
                                   std::to_string(memory.size()) +
                                   " bytes: need at least one block of " +
                                   std::to_string(layout.BlockBytes()));
  }
  return PagedKvCache(layout, num_blocks, {}, memory.data());
}

PagedKvCache::PagedKvCache(const KvLayout& layout, int64_t num_blocks,
                           std::vector<std::byte> owned, std::byte* base)
    : layout_(layout),
      num_blocks_(num_blocks),
      owned_(std::move(owned)),
      base_(base) {}

const std::byte* PagedKvCache::token(int64_t slot, int32_t layer,
                                     KvPlane plane) const {
  const int64_t bs = layout_.block_size;
  return block(slot / bs) +
         layout_.Offset(layer, plane, static_cast<int32_t>(slot % bs));
}

std::byte* PagedKvCache::mutable_token(int64_t slot, int32_t layer,
                                       KvPlane plane) {
  return const_cast<std::byte*>(token(slot, layer, plane));
}

void PagedKvCache::Write(int64_t slot, int32_t layer, KvPlane plane,
                         std::span<const float> values) {
  std::byte* p = mutable_token(slot, layer, plane);
  if (layout_.dtype == DType::kF32) {
    std::memcpy(p, values.data(), values.size_bytes());
    return;
  }
  const bool half = layout_.dtype == DType::kF16;
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = half ? internal::FloatToHalf(values[i])
                            : internal::FloatToBf16(values[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

void PagedKvCache::Read(int64_t slot, int32_t layer, KvPlane plane,
                        std::span<float> out) const {
  const std::byte* p = token(slot, layer, plane);
  if (layout_.dtype == DType::kF32) {
    std::memcpy(out.data(), p, out.size_bytes());
    return;
  }
  const bool half = layout_.dtype == DType::kF16;
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = half ? internal::HalfToFloat(h) : internal::Bf16ToFloat(h);
  }
}

}  // namespace tierkv
