#include "src/rope_remap.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#endif

namespace tierkv {
namespace internal {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    // Inf, or NaN with its payload kept and the quiet bit set (as F16C).
    bits = sign | 0x7f800000 | (mant << 13) | (mant != 0 ? 0x400000 : 0);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // Subnormal: normalise.
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7fffffff;
  if (x > 0x7f800000) return sign | 0x7e00 | ((x >> 13) & 0x3ff);  // NaN.
  if (x >= 0x47800000) return sign | 0x7c00;  // >= 2^16: inf.
  if (x >= 0x38800000) {                      // Normal half (or rounds to inf).
    uint32_t mant_odd = (x >> 13) & 1;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + mant_odd;
    return sign | (x >> 13);
  }
  uint32_t exp = x >> 23;
  if (exp < 102) return sign;  // Below 2^-25: rounds to zero.
  // Subnormal half: the value in units of 2^-24, rounded to nearest even.
  uint32_t mant = (x & 0x7fffff) | 0x800000;
  uint32_t shift = 126 - exp;
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1) != 0)) ++q;
  return static_cast<uint16_t>(sign | q);
}

float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  return std::bit_cast<float>(bits);
}

uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return (x >> 16) | 0x0040;  // Quiet NaN.
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Stops the compiler from fusing a product into the following add or
// subtract (FMA contraction is on by default for C++ in GCC): every product
// is rounded, exactly as in the vector kernels.
inline float Rounded(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#endif
  return v;
}

template <DType D>
float LoadElem(const std::byte* p) {
  if constexpr (D == DType::kF32) {
    float f;
    std::memcpy(&f, p, sizeof(f));
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, p, sizeof(h));
    return D == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
}

template <DType D>
void StoreElem(std::byte* p, float f) {
  if constexpr (D == DType::kF32) {
    std::memcpy(p, &f, sizeof(f));
  } else {
    uint16_t h = D == DType::kF16 ? FloatToHalf(f) : FloatToBf16(f);
    std::memcpy(p, &h, sizeof(h));
  }
}

template <DType D, RopeStyle S>
void RotateHead(const RotateArgs& args, const std::byte* src, std::byte* dst,
                int32_t first_pair) {
  constexpr size_t kElem = D == DType::kF32 ? 4 : 2;
  const int32_t half = args.rotary_dim / 2;
  for (int32_t p = first_pair; p < half; ++p) {
    size_t xi = S == RopeStyle::kNeoX ? p : 2 * p;
    size_t yi = S == RopeStyle::kNeoX ? p + half : 2 * p + 1;
    float x = LoadElem<D>(src + xi * kElem);
    float y = LoadElem<D>(src + yi * kElem);
    float c = args.cos[p], s = args.sin[p];
    StoreElem<D>(dst + xi * kElem, Rounded(x * c) - Rounded(y * s));
    StoreElem<D>(dst + yi * kElem, Rounded(x * s) + Rounded(y * c));
  }
  size_t rotated = static_cast<size_t>(args.rotary_dim) * kElem;
  std::memcpy(dst + rotated, src + rotated,
              static_cast<size_t>(args.head_dim) * kElem - rotated);
}

template <DType D, RopeStyle S>
void RotateToken(const RotateArgs& args, const std::byte* src, std::byte* dst) {
  const size_t head_bytes = static_cast<size_t>(args.head_dim) * DTypeSize(D);
  for (int32_t h = 0; h < args.num_heads; ++h) {
    RotateHead<D, S>(args, src + h * head_bytes, dst + h * head_bytes, 0);
  }
}

template <RopeStyle S>
RotateTokenFn ScalarKernelFor(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return &RotateToken<DType::kF32, S>;
    case DType::kF16:
      return &RotateToken<DType::kF16, S>;
    case DType::kBF16:
      return &RotateToken<DType::kBF16, S>;
  }
  return nullptr;
}

template <RopeStyle S>
void TailFor(DType dtype, const RotateArgs& args, const std::byte* src,
             std::byte* dst, int32_t first_pair) {
  switch (dtype) {
    case DType::kF32:
      return RotateHead<DType::kF32, S>(args, src, dst, first_pair);
    case DType::kF16:
      return RotateHead<DType::kF16, S>(args, src, dst, first_pair);
    case DType::kBF16:
      return RotateHead<DType::kBF16, S>(args, src, dst, first_pair);
  }
}

}  // namespace

RotateTokenFn ScalarRotateKernel(DType dtype, RopeStyle style) {
  return style == RopeStyle::kNeoX ? ScalarKernelFor<RopeStyle::kNeoX>(dtype)
                                   : ScalarKernelFor<RopeStyle::kGptJ>(dtype);
}

void RotateHeadTail(DType dtype, RopeStyle style, const RotateArgs& args,
                    const std::byte* src_head, std::byte* dst_head,
                    int32_t first_pair) {
  if (style == RopeStyle::kNeoX) {
    TailFor<RopeStyle::kNeoX>(dtype, args, src_head, dst_head, first_pair);
  } else {
    TailFor<RopeStyle::kGptJ>(dtype, args, src_head, dst_head, first_pair);
  }
}

}  // namespace internal

// cos/sin of every distinct position delta, rounded to float once; runs of
// tokens with the same delta (the usual case: one) share a row.
struct RopeRemap::AngleTable {
  std::vector<float> cos;
  std::vector<float> sin;
  std::vector<int32_t> token_row;
};

namespace {

int64_t RealPosition(const RemapRequest& r, int32_t i) {
  return r.real_positions.empty() ? r.real_start + i : r.real_positions[i];
}

Status CheckPosition(const char* what, int64_t position, int64_t span) {
  if (position >= 0 && position <= kMaxRopePosition - span) {
    return Status::Ok();
  }
  return Status::InvalidArgument(std::string("remap: ") + what + " " +
                                 std::to_string(position) +
                                 " is negative or past 2^48");
}

}  // namespace

RopeRemap::RopeRemap(const KvLayout& layout, const RopeConfig& rope)
    : layout_(layout), rope_(rope), inv_freq_(InverseFrequencies(rope)) {}

StatusOr<RopeRemap> RopeRemap::Create(const KvLayout& layout,
                                      const RopeConfig& rope) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  TIERKV_RETURN_IF_ERROR(rope.Validate());
  if (layout.head_dim != rope.head_dim) {
    return Status::InvalidArgument(
        "remap: KV layout head_dim " + std::to_string(layout.head_dim) +
        " != RoPE head_dim " + std::to_string(rope.head_dim));
  }
  return RopeRemap(layout, rope);
}

namespace internal {

bool CpuHasF16c() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  // CPUID, not __builtin_cpu_supports("f16c"), which Clang 14 does not
  // know. F16C's instructions are VEX-encoded: they also need the OS to
  // save the AVX state, which "avx" checks.
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") &&
         __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
  return false;
#endif
}

}  // namespace internal

bool RopeRemap::VectorizedAvailable() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && internal::CpuHasF16c() &&
         __builtin_cpu_supports("fma") &&
         internal::Avx2RotateKernel(DType::kF32, RopeStyle::kNeoX) != nullptr;
#else
  return false;
#endif
}

Status RopeRemap::ValidateRequest(const RemapRequest& r) const {
  const int32_t bs = layout_.block_size;
  if (r.num_tokens <= 0) return Status::InvalidArgument("remap: no tokens");
  size_t needed = (static_cast<size_t>(r.num_tokens) + bs - 1) / bs;
  if (r.src_blocks.size() < needed) {
    return Status::InvalidArgument("remap: " + std::to_string(r.num_tokens) +
                                   " tokens need " + std::to_string(needed) +
                                   " source blocks, got " +
                                   std::to_string(r.src_blocks.size()));
  }
  for (size_t j = 0; j < needed; ++j) {
    if (r.src_blocks[j] == nullptr) {
      return Status::InvalidArgument("remap: source block " +
                                     std::to_string(j) + " is null");
    }
  }
  if (r.dst_base == nullptr || r.dst_num_blocks <= 0 ||
      r.dst_num_blocks > std::numeric_limits<int64_t>::max() /
                             static_cast<int64_t>(layout_.BlockBytes())) {
    return Status::InvalidArgument(
        "remap: null destination or bad destination block count " +
        std::to_string(r.dst_num_blocks));
  }
  if (r.dst_slots.size() != static_cast<size_t>(r.num_tokens)) {
    return Status::InvalidArgument(
        "remap: " + std::to_string(r.dst_slots.size()) + " slots for " +
        std::to_string(r.num_tokens) + " tokens");
  }
  const int64_t num_slots = r.dst_num_blocks * bs;
  for (int32_t i = 0; i < r.num_tokens; ++i) {
    int64_t slot = r.dst_slots[i];
    if (slot < -1 || slot >= num_slots) {
      return Status::InvalidArgument(
          "remap: token " + std::to_string(i) + " slot " +
          std::to_string(slot) + " outside [0, " + std::to_string(num_slots) +
          ") and not -1");
    }
  }
  TIERKV_RETURN_IF_ERROR(
      CheckPosition("virtual start", r.virtual_start, r.num_tokens));
  if (r.real_positions.empty()) {
    return CheckPosition("real start", r.real_start, r.num_tokens);
  }
  if (r.real_positions.size() != static_cast<size_t>(r.num_tokens)) {
    return Status::InvalidArgument("remap: real position count != tokens");
  }
  for (int64_t p : r.real_positions) {
    TIERKV_RETURN_IF_ERROR(CheckPosition("real position", p, 1));
  }
  return Status::Ok();
}

RopeRemap::AngleTable RopeRemap::BuildAngleTable(const RemapRequest& r) const {
  AngleTable table;
  table.token_row.resize(r.num_tokens);
  int64_t previous = 0;
  int32_t rows = 0;
  for (int32_t i = 0; i < r.num_tokens; ++i) {
    int64_t delta = RealPosition(r, i) - (r.virtual_start + i);
    if (rows == 0 || delta != previous) {
      for (double w : inv_freq_) {
        double angle = static_cast<double>(delta) * w;
        table.cos.push_back(static_cast<float>(std::cos(angle)));
        table.sin.push_back(static_cast<float>(std::sin(angle)));
      }
      previous = delta;
      ++rows;
    }
    table.token_row[i] = rows - 1;
  }
  return table;
}

// Layer `layer` of chunk tokens [first, end), all in one source block:
// K turned by each token's angles, then V copied, plane by plane so that
// reads and writes stream. Tokens on consecutive slots share one V copy.
void RopeRemap::PlaceLayer(const RemapRequest& r, const AngleTable& table,
                           internal::RotateTokenFn rotate, int32_t layer,
                           int32_t first, int32_t end) const {
  const int32_t bs = layout_.block_size;
  const size_t half = inv_freq_.size();
  const std::byte* src = r.src_blocks[first / bs];
  auto dst_block = [&](int64_t slot) {
    return r.dst_base + (slot / bs) * layout_.BlockBytes();
  };
  internal::RotateArgs args{layout_.num_kv_heads, layout_.head_dim,
                            rope_.rotary_dim, nullptr, nullptr};
  for (int32_t i = first; i < end; ++i) {
    const int64_t slot = r.dst_slots[i];
    if (slot < 0) continue;
    args.cos = table.cos.data() + table.token_row[i] * half;
    args.sin = table.sin.data() + table.token_row[i] * half;
    rotate(args, src + layout_.Offset(layer, KvPlane::kKey, i - first),
           dst_block(slot) + layout_.Offset(layer, KvPlane::kKey,
                                            static_cast<int32_t>(slot % bs)));
  }
  for (int32_t i = first; i < end;) {
    const int64_t slot = r.dst_slots[i];
    int32_t run = 1;
    while (slot >= 0 && i + run < end && r.dst_slots[i + run] == slot + run &&
           (slot + run) % bs != 0) {
      ++run;
    }
    if (slot >= 0) {
      std::memcpy(
          dst_block(slot) + layout_.Offset(layer, KvPlane::kValue,
                                           static_cast<int32_t>(slot % bs)),
          src + layout_.Offset(layer, KvPlane::kValue, i - first),
          run * layout_.TokenStride());
    }
    i += run;
  }
}

Status RopeRemap::Remap(const RemapRequest& r, RemapPath path) const {
  TIERKV_RETURN_IF_ERROR(ValidateRequest(r));
  bool vectorized = path != RemapPath::kScalar && VectorizedAvailable();
  if (path == RemapPath::kVectorized && !vectorized) {
    return Status::Unimplemented(
        "remap: the vectorised path needs AVX2, F16C and FMA");
  }
  internal::RotateTokenFn rotate =
      vectorized ? internal::Avx2RotateKernel(layout_.dtype, rope_.style)
                 : internal::ScalarRotateKernel(layout_.dtype, rope_.style);
  const AngleTable table = BuildAngleTable(r);
  // Source block by source block, so that reads stream through each block.
  const int32_t bs = layout_.block_size;
  for (int32_t first = 0; first < r.num_tokens; first += bs) {
    const int32_t end = std::min(first + bs, r.num_tokens);
    for (int32_t layer = 0; layer < layout_.num_layers; ++layer) {
      PlaceLayer(r, table, rotate, layer, first, end);
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> SlotMappingForBlocks(
    std::span<const int32_t> block_ids, int32_t block_size,
    int32_t first_offset, int32_t num_tokens) {
  if (block_size <= 0 || first_offset < 0 || first_offset >= block_size ||
      num_tokens <= 0) {
    return Status::InvalidArgument(
        "slot mapping: need block_size > 0, 0 <= first_offset < block_size "
        "and num_tokens > 0");
  }
  int64_t needed =
      (int64_t{first_offset} + num_tokens + block_size - 1) / block_size;
  if (static_cast<int64_t>(block_ids.size()) < needed) {
    return Status::InvalidArgument(
        "slot mapping: " + std::to_string(num_tokens) + " tokens from offset " +
        std::to_string(first_offset) + " need " + std::to_string(needed) +
        " blocks, got " + std::to_string(block_ids.size()));
  }
  std::vector<int64_t> slots(num_tokens);
  for (int32_t i = 0; i < num_tokens; ++i) {
    int64_t t = int64_t{first_offset} + i;
    int32_t block = block_ids[t / block_size];
    if (block < 0) return Status::InvalidArgument("slot mapping: negative id");
    slots[i] = int64_t{block} * block_size + t % block_size;
  }
  return slots;
}

}  // namespace tierkv
