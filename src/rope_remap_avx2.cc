// The vectorised K rotation (AVX2 + F16C). This file is compiled with
// -mavx2 -mf16c -mfma; nothing here may run before the runtime CPU check in
// RopeRemap::VectorizedAvailable. It therefore uses raw pointers and
// intrinsics only: an inline std template instantiated here could be picked
// by the linker for baseline code too.
#include "src/rope_remap.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#include <cstdint>

namespace tierkv::internal {
namespace {

// Keeps a product rounded on its own: without this GCC fuses the
// _mm256_mul_ps into the following add (-ffp-contract=fast is its C++
// default and -mfma is on), and the scalar path would no longer match.
inline __m256 Rounded(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

template <DType D>
__m256 Load8(const std::byte* p) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (D == DType::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// fp32 -> bf16, round to nearest even, NaN quieted: as FloatToBf16.
__m128i ToBf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i upper = _mm256_srli_epi32(bits, 16);
  const __m256i bias = _mm256_add_epi32(
      _mm256_set1_epi32(0x7fff), _mm256_and_si256(upper, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i quiet_nan = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i out = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(out),
                          _mm256_extracti128_si256(out, 1));
}

template <DType D>
void Store8(std::byte* p, __m256 v) {
  if constexpr (D == DType::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  } else {
    __m128i h = D == DType::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)
                                 : ToBf16(v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
}

// Rotate-half: 8 pairs (x at i, y at i + half) per step. Returns the first
// pair not done.
template <DType D>
int32_t RotateNeoX(const RotateArgs& args, const std::byte* src,
                   std::byte* dst) {
  constexpr int64_t kElem = D == DType::kF32 ? 4 : 2;
  const int32_t half = args.rotary_dim / 2;
  const int64_t y_off = half * kElem;
  int32_t p = 0;
  for (; p + 8 <= half; p += 8) {
    const __m256 x = Load8<D>(src + p * kElem);
    const __m256 y = Load8<D>(src + p * kElem + y_off);
    const __m256 c = _mm256_loadu_ps(args.cos + p);
    const __m256 s = _mm256_loadu_ps(args.sin + p);
    const __m256 xc = Rounded(_mm256_mul_ps(x, c));
    const __m256 ys = Rounded(_mm256_mul_ps(y, s));
    const __m256 xs = Rounded(_mm256_mul_ps(x, s));
    const __m256 yc = Rounded(_mm256_mul_ps(y, c));
    Store8<D>(dst + p * kElem, _mm256_sub_ps(xc, ys));
    Store8<D>(dst + p * kElem + y_off, _mm256_add_ps(xs, yc));
  }
  return p;
}

// Interleaved: 4 pairs (x0 y0 x1 y1 ...) per step. Even lanes get
// x*c + y*(-s), bit-identical to x*c - y*s; odd lanes y*c + x*s.
template <DType D>
int32_t RotateGptJ(const RotateArgs& args, const std::byte* src,
                   std::byte* dst) {
  constexpr int64_t kElem = D == DType::kF32 ? 4 : 2;
  const int32_t half = args.rotary_dim / 2;
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256 negate_even = _mm256_castsi256_ps(_mm256_setr_epi32(
      INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0));
  int32_t p = 0;
  for (; p + 4 <= half; p += 4) {
    const __m256 v = Load8<D>(src + 2 * p * kElem);
    const __m256 swapped = _mm256_permute_ps(v, 0xb1);
    const __m256 c = _mm256_permutevar8x32_ps(
        _mm256_castps128_ps256(_mm_loadu_ps(args.cos + p)), dup);
    const __m256 s = _mm256_xor_ps(
        _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_loadu_ps(args.sin + p)), dup),
        negate_even);
    const __m256 vc = Rounded(_mm256_mul_ps(v, c));
    const __m256 ws = Rounded(_mm256_mul_ps(swapped, s));
    Store8<D>(dst + 2 * p * kElem, _mm256_add_ps(vc, ws));
  }
  return p;
}

template <DType D, RopeStyle S>
void RotateToken(const RotateArgs& args, const std::byte* src, std::byte* dst) {
  const int64_t head_bytes =
      int64_t{args.head_dim} * (D == DType::kF32 ? 4 : 2);
  for (int32_t h = 0; h < args.num_heads; ++h) {
    const std::byte* s = src + h * head_bytes;
    std::byte* d = dst + h * head_bytes;
    int32_t done = S == RopeStyle::kNeoX ? RotateNeoX<D>(args, s, d)
                                         : RotateGptJ<D>(args, s, d);
    if (done < args.rotary_dim / 2) {
      RotateHeadTail(D, S, args, s, d, done);
    } else if (args.rotary_dim < args.head_dim) {
      const int64_t rotated =
          int64_t{args.rotary_dim} * (head_bytes / args.head_dim);
      __builtin_memcpy(d + rotated, s + rotated, head_bytes - rotated);
    }
  }
}

template <RopeStyle S>
RotateTokenFn KernelFor(DType dtype) {
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

}  // namespace

RotateTokenFn Avx2RotateKernel(DType dtype, RopeStyle style) {
  return style == RopeStyle::kNeoX ? KernelFor<RopeStyle::kNeoX>(dtype)
                                   : KernelFor<RopeStyle::kGptJ>(dtype);
}

}  // namespace tierkv::internal

#else  // Not built for AVX2/F16C: no vectorised path.

namespace tierkv::internal {
RotateTokenFn Avx2RotateKernel(DType, RopeStyle) { return nullptr; }
}  // namespace tierkv::internal

#endif
