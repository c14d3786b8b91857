// RopeRemap: copies a position-independent chunk's KV from its cache blocks
// into destination slots at the chunk's real positions, turning K by the
// position delta (K' = R(real - virtual) K per rotary pair; V as is). Immutable
// after Create; Remap is const and safe to call from many threads at once.
//
// Arithmetic: per (token, pair) the angle (real - virtual) * w_i is taken in
// double and cos/sin rounded to float once, into a table both paths share.
// Each element is widened to fp32 exactly, turned with separately rounded
// products (x*c - y*s, x*s + y*c, never fused), and rounded to the storage
// dtype once (round to nearest even). The scalar and AVX2/F16C paths are
// therefore bit-identical for finite inputs. Dims past rotary_dim and all of
// V are copied byte for byte.
#ifndef TIERKV_SRC_ROPE_REMAP_H_
#define TIERKV_SRC_ROPE_REMAP_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "src/rope.h"
#include "tierkv/kv_layout.h"
#include "tierkv/status.h"

namespace tierkv {

enum class RemapPath : uint8_t {
  kAuto,        // Vectorised where the CPU has AVX2, F16C and FMA.
  kScalar,      // Portable C++.
  kVectorized,  // AVX2/F16C; Unimplemented on a CPU without them.
};

// One chunk to place. Source and destination memory must not overlap.
struct RemapRequest {
  // The chunk's blocks in order; block j holds chunk tokens
  // [j * block_size, (j + 1) * block_size), laid out per the KvLayout.
  std::span<const std::byte* const> src_blocks;
  int32_t num_tokens = 0;  // Required, > 0.
  // Position of chunk token 0 when its K was computed (the virtual start).
  int64_t virtual_start = 0;

  // Destination block b starts at dst_base + b * layout.BlockBytes().
  std::byte* dst_base = nullptr;
  int64_t dst_num_blocks = 0;
  // Per token: dst_block * block_size + offset_in_block, or -1 to skip the
  // token. Any start, not block aligned. Two tokens on one slot: last wins.
  std::span<const int64_t> dst_slots;

  // Real position per token; when empty, token i is at real_start + i.
  std::span<const int64_t> real_positions;
  int64_t real_start = 0;
};

namespace internal {

// The K rotation of one token in one layer, all heads. cos/sin hold the
// token's rotary_dim / 2 angles.
struct RotateArgs {
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
};
using RotateTokenFn = void (*)(const RotateArgs& args, const std::byte* src,
                               std::byte* dst);

// rope_remap.cc, portable.
RotateTokenFn ScalarRotateKernel(DType dtype, RopeStyle style);
// Pairs [first_pair, rotary_dim / 2) of one head, then the unrotated dims:
// the vector kernels' tail, with the scalar kernel's arithmetic.
void RotateHeadTail(DType dtype, RopeStyle style, const RotateArgs& args,
                    const std::byte* src_head, std::byte* dst_head,
                    int32_t first_pair);
// rope_remap_avx2.cc, built for AVX2/F16C/FMA: call only when
// RopeRemap::VectorizedAvailable().
RotateTokenFn Avx2RotateKernel(DType dtype, RopeStyle style);

// Whether this CPU (and OS) runs F16C's instructions. False off x86.
bool CpuHasF16c();

// Round-to-nearest-even conversions, bit-identical to F16C (fp16) and to the
// AVX2 kernel (bf16); NaN stays NaN (quieted).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

}  // namespace internal

// Positions at or past this are rejected; no model comes near, and it keeps
// start + i and the angle (exact in double) far from overflow.
inline constexpr int64_t kMaxRopePosition = int64_t{1} << 48;

class RopeRemap {
 public:
  // InvalidArgument when either config is invalid or they disagree on
  // head_dim.
  static StatusOr<RopeRemap> Create(const KvLayout& layout,
                                    const RopeConfig& rope);

  // Whether this CPU runs the vectorised path (AVX2, F16C and FMA).
  static bool VectorizedAvailable();

  // Writes every token whose slot is not -1. A malformed request (null or
  // missing blocks, slot count != num_tokens, slot out of range, negative
  // or too large positions) is InvalidArgument with nothing written.
  Status Remap(const RemapRequest& request,
               RemapPath path = RemapPath::kAuto) const;

  const KvLayout& layout() const { return layout_; }
  const RopeConfig& rope() const { return rope_; }
  const std::vector<double>& inverse_frequencies() const { return inv_freq_; }

 private:
  struct AngleTable;  // Per request; defined in rope_remap.cc.

  RopeRemap(const KvLayout& layout, const RopeConfig& rope);

  Status ValidateRequest(const RemapRequest& request) const;
  AngleTable BuildAngleTable(const RemapRequest& request) const;
  void PlaceLayer(const RemapRequest& request, const AngleTable& table,
                  internal::RotateTokenFn rotate, int32_t layer, int32_t first,
                  int32_t end) const;

  KvLayout layout_;
  RopeConfig rope_;
  std::vector<double> inv_freq_;
};

// The slot mapping that lays num_tokens tokens into `block_ids` (block ids
// of the destination), starting at offset `first_offset` of the first block.
// InvalidArgument when the blocks are too few or an argument is out of range.
StatusOr<std::vector<int64_t>> SlotMappingForBlocks(
    std::span<const int32_t> block_ids, int32_t block_size,
    int32_t first_offset, int32_t num_tokens);

}  // namespace tierkv

#endif  // TIERKV_SRC_ROPE_REMAP_H_
