#include "src/rope_remap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "src/rope.h"
#include "tests/kv_element.h"
#include "tests/status_matchers.h"
#include "tierkv/kv_layout.h"

namespace tierkv {
namespace {

constexpr std::byte kSentinel{0xa5};

RopeConfig Rope(int32_t head_dim, int32_t rotary_dim, double theta = 10000) {
  RopeConfig c;
  c.head_dim = head_dim;
  c.rotary_dim = rotary_dim;
  c.theta = theta;
  return c;
}

// ---------------------------------------------------------------------------
// Rope: configs, frequencies and the reference rotation.

TEST(Rope, ValidateNamesTheProblem) {
  RopeConfig ok = Rope(128, 64);
  EXPECT_THAT(ok.Validate(), IsOk());
  auto message = [](RopeConfig c) { return c.Validate().message(); };
  RopeConfig c = ok;
  c.rotary_dim = 63;
  EXPECT_NE(message(c).find("rotary_dim"), std::string::npos);
  c.rotary_dim = 130;
  EXPECT_NE(message(c).find("rotary_dim"), std::string::npos);
  c = ok;
  c.theta = 1;
  EXPECT_NE(message(c).find("theta"), std::string::npos);
  c = ok;
  c.scaling = RopeScaling::Linear(0);
  EXPECT_NE(message(c).find("linear"), std::string::npos);
  c.scaling = RopeScaling::Llama3(8, 4, 1, 8192);
  EXPECT_NE(message(c).find("low_freq_factor"), std::string::npos);
  c.scaling = RopeScaling::Ntk(2);
  c.rotary_dim = 2;
  EXPECT_NE(message(c).find("NTK"), std::string::npos);
  // Values fine on their own whose frequencies overflow.
  c = ok;
  c.scaling = RopeScaling::Linear(1e-310);
  EXPECT_NE(message(c).find("inverse frequencies"), std::string::npos);
  c.scaling = RopeScaling::Ntk(1e300);
  EXPECT_NE(message(c).find("inverse frequencies"), std::string::npos);
  c = ok;
  c.theta = 1e308;
  c.scaling = RopeScaling::Linear(1e300);
  EXPECT_NE(message(c).find("inverse frequencies"), std::string::npos);
}

TEST(Rope, ToStringKeepsEveryDigit) {
  RopeConfig a = Rope(128, 64, 500000);
  RopeConfig b = Rope(128, 64, 500000.25);
  EXPECT_NE(a.ToString(), b.ToString());
  EXPECT_NE(a.ToString().find("theta=500000 "), std::string::npos);
  a.scaling = RopeScaling::Linear(1.0000001);
  b.scaling = RopeScaling::Linear(1.0000002);
  EXPECT_NE(a.ToString(), b.ToString());
}

TEST(Rope, InverseFrequenciesPerScaling) {
  RopeConfig c = Rope(64, 32);
  std::vector<double> plain = InverseFrequencies(c);
  ASSERT_EQ(plain.size(), 16u);
  EXPECT_DOUBLE_EQ(plain[0], 1.0);
  EXPECT_DOUBLE_EQ(plain[8], 1.0 / 100.0);  // 10000^(-16/32).
  c.scaling = RopeScaling::Linear(4);
  std::vector<double> linear = InverseFrequencies(c);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_DOUBLE_EQ(linear[i], plain[i] / 4);
  }
  c.scaling = RopeScaling::Ntk(8);
  std::vector<double> ntk = InverseFrequencies(c);
  RopeConfig stretched = Rope(64, 32, 10000 * std::pow(8.0, 32.0 / 30.0));
  std::vector<double> want = InverseFrequencies(stretched);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_DOUBLE_EQ(ntk[i], want[i]);
}

TEST(Rope, Llama3MatchesTransformers) {
  // Llama 3.1 8B; expected values from transformers'
  // _compute_llama3_parameters evaluated in float64.
  RopeConfig c = Rope(128, 128, 500000);
  c.scaling = RopeScaling::Llama3(8, 1, 4, 8192);
  ASSERT_THAT(c.Validate(), IsOk());
  std::vector<double> w = InverseFrequencies(c);
  ASSERT_EQ(w.size(), 64u);
  EXPECT_DOUBLE_EQ(w[0], 1.0);                     // High frequency: kept.
  EXPECT_DOUBLE_EQ(w[20], 0.016560440080994446);   // High frequency: kept.
  EXPECT_DOUBLE_EQ(w[30], 0.0013718935677611381);  // Medium: interpolated.
  EXPECT_DOUBLE_EQ(w[40], 3.428102195952591e-05);  // Low: divided by 8.
  EXPECT_DOUBLE_EQ(w[63], 3.068925988914511e-07);
}

TEST(Rope, ApplyRopePairsPerStyle) {
  RopeConfig c = Rope(6, 4);
  std::vector<double> w = InverseFrequencies(c);
  std::vector<float> neox = {1, 0, 0, 0, 7, 8};
  ASSERT_THAT(ApplyRope(c, w, 1, neox), IsOk());
  EXPECT_EQ(neox,
            (std::vector<float>{std::cos(1.0f), 0, std::sin(1.0f), 0, 7, 8}));
  c.style = RopeStyle::kGptJ;
  std::vector<float> gptj = {1, 0, 0, 0, 7, 8};
  ASSERT_THAT(ApplyRope(c, w, 1, gptj), IsOk());
  EXPECT_EQ(gptj,
            (std::vector<float>{std::cos(1.0f), std::sin(1.0f), 0, 0, 7, 8}));
  std::vector<float> wrong_size(5);
  EXPECT_EQ(ApplyRope(c, w, 1, wrong_size).code(),
            StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Element conversions: bit-identical to the hardware (F16C) and to the
// reference bf16 rounding.

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("f16c"))) float HwHalfToFloat(uint16_t h) {
  return _cvtsh_ss(h);
}
// Not _cvtss_sh: Clang's is a macro with a compound literal, which
// -Wpedantic rejects in C++.
__attribute__((target("f16c"))) uint16_t HwFloatToHalf(float f) {
  return static_cast<uint16_t>(_mm_cvtsi128_si32(
      _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT)));
}
#endif

TEST(RopeRemap, HalfConversionsMatchF16c) {
#if defined(__x86_64__) || defined(__i386__)
  if (!internal::CpuHasF16c()) GTEST_SKIP() << "no F16C";
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(std::bit_cast<uint32_t>(internal::HalfToFloat(h)),
              std::bit_cast<uint32_t>(HwHalfToFloat(h)))
        << h;
  }
  std::vector<uint32_t> floats = {
      0,          0x80000000, 0x7f800000, 0xff800000, 0x7f800001,
      0x7fc00000, 0x477fe000, 0x477ff000, 0x477fefff, 0x47800000,
      0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x32ffffff,
      0x33800000, 0x00000001, 0x3f800000, 0x3f801000, 0x3f803000};
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) floats.push_back(rng());
  for (uint32_t f : floats) {
    ASSERT_EQ(internal::FloatToHalf(std::bit_cast<float>(f)),
              HwFloatToHalf(std::bit_cast<float>(f)))
        << std::hex << f;
  }
#else
  GTEST_SKIP() << "not x86";
#endif
}

TEST(RopeRemap, Bf16RoundsToNearestEven) {
  EXPECT_EQ(internal::FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0x3f808000)),
            0x3f80);  // Tie.
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0x3f818000)),
            0x3f82);  // Tie.
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0x3f808001)), 0x3f81);
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0x7f7fffff)),
            0x7f80);  // To inf.
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0xff800000)), 0xff80);
  EXPECT_EQ(internal::FloatToBf16(std::bit_cast<float>(0x7f800001)),
            0x7fc0);  // NaN.
  EXPECT_EQ(std::bit_cast<uint32_t>(internal::Bf16ToFloat(0xc049)),
            0xc0490000u);
  EXPECT_EQ(internal::Bf16ToFloat(0x4049), std::bit_cast<float>(0x40490000));
}

// ---------------------------------------------------------------------------
// Remap fixtures.

void Store(DType d, float f, std::byte* p) {
  if (d == DType::kF32) {
    std::memcpy(p, &f, 4);
    return;
  }
  uint16_t h =
      d == DType::kF16 ? internal::FloatToHalf(f) : internal::FloatToBf16(f);
  std::memcpy(p, &h, 2);
}

// The spacing of `d` around magnitude `mag`.
double UlpAt(DType d, double mag) {
  int mantissa = d == DType::kF32 ? 23 : d == DType::kF16 ? 10 : 7;
  int min_exp = d == DType::kF16 ? -14 : -126;
  int e = mag > 0 ? static_cast<int>(std::floor(std::log2(mag))) : min_exp;
  return std::ldexp(1.0, std::max(e, min_exp) - mantissa);
}

// A chunk's source blocks (scattered in one buffer, in a shuffled order)
// and a destination of `dst_blocks` blocks filled with kSentinel.
struct Buffers {
  Buffers(const KvLayout& layout, int32_t num_tokens, int64_t dst_blocks)
      : layout(layout), num_dst_blocks(dst_blocks) {
    int32_t n = (num_tokens + layout.block_size - 1) / layout.block_size;
    src.assign(n * layout.BlockBytes(), std::byte{0});
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin(), order.end());
    for (int32_t j : order) src_blocks.push_back(&src[j * layout.BlockBytes()]);
    dst.assign(dst_blocks * layout.BlockBytes(), kSentinel);
  }
  std::byte* Src(int32_t t, int32_t layer, KvPlane plane) {
    return const_cast<std::byte*>(src_blocks[t / layout.block_size]) +
           layout.Offset(layer, plane, t % layout.block_size);
  }
  std::byte* Dst(int64_t slot, int32_t layer, KvPlane plane) {
    return &dst[(slot / layout.block_size) * layout.BlockBytes() +
                layout.Offset(layer, plane,
                              static_cast<int32_t>(slot % layout.block_size))];
  }
  RemapRequest Request(int32_t num_tokens, std::span<const int64_t> slots) {
    RemapRequest r;
    r.src_blocks = src_blocks;
    r.num_tokens = num_tokens;
    r.dst_base = dst.data();
    r.dst_num_blocks = num_dst_blocks;
    r.dst_slots = slots;
    return r;
  }

  KvLayout layout;
  int64_t num_dst_blocks;
  std::vector<std::byte> src;
  std::vector<const std::byte*> src_blocks;
  std::vector<std::byte> dst;
};

struct Variant {
  RopeStyle style;
  bool partial;
  RopeScalingType scaling;
  DType dtype;
};

RopeConfig RopeFor(const Variant& v) {
  RopeConfig c;
  c.head_dim = v.partial ? 48 : 72;  // Tails in every vector loop.
  c.rotary_dim = v.partial ? 20 : 72;
  c.style = v.style;
  switch (v.scaling) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      c.scaling = RopeScaling::Linear(4);
      break;
    case RopeScalingType::kNtk:
      c.scaling = RopeScaling::Ntk(8);
      break;
    case RopeScalingType::kLlama3:
      c.theta = 500000;
      c.scaling = RopeScaling::Llama3(8, 1, 4, 8192);
      break;
  }
  return c;
}

KvLayout LayoutFor(const Variant& v) {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 3,
                  .head_dim = RopeFor(v).head_dim,
                  .block_size = 16,
                  .dtype = v.dtype};
}

std::string VariantName(const testing::TestParamInfo<Variant>& info) {
  const Variant& v = info.param;
  const char* scaling[] = {"None", "Linear", "Ntk", "Llama3"};
  const char* dtype[] = {"F32", "F16", "Bf16"};
  return std::string(v.style == RopeStyle::kNeoX ? "Neox" : "Gptj") +
         (v.partial ? "Partial" : "Full") +
         scaling[static_cast<int>(v.scaling)] +
         dtype[static_cast<int>(v.dtype)];
}

std::vector<Variant> AllVariants() {
  std::vector<Variant> out;
  for (RopeStyle style : {RopeStyle::kNeoX, RopeStyle::kGptJ}) {
    for (bool partial : {false, true}) {
      for (RopeScalingType s :
           {RopeScalingType::kNone, RopeScalingType::kLinear,
            RopeScalingType::kNtk, RopeScalingType::kLlama3}) {
        for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
          out.push_back({style, partial, s, d});
        }
      }
    }
  }
  return out;
}

class RopeRemapVariant : public testing::TestWithParam<Variant> {};

// Rotary pair (x, y) indices of pair p.
std::pair<int32_t, int32_t> PairOf(const RopeConfig& c, int32_t p) {
  if (c.style == RopeStyle::kNeoX) return {p, p + c.rotary_dim / 2};
  return {2 * p, 2 * p + 1};
}

// Bounds, per rotary pair of magnitude |K|, in units u of the storage dtype
// at |K| (for fp32 storage, the fp32 arithmetic dominates; see below):
//  - one rounding: the remapped K is the exact rotation of the cached K
//    rounded once: within u/2 of it, plus fp32 arithmetic noise (a few
//    2^-24 |K|: cos/sin, products and the sum, each rounded);
//  - against K rotated straight to its real position: the cached K already
//    carries up to u/2 per element, which the rotation mixes across the pair
//    (up to u/sqrt(2)), then the remap adds its u/2: 1.21u, not 1u.
constexpr double kFp32Noise = 8.0 / (1 << 24);
constexpr double kDirectUlps = 1.25;

// Checks one head of remapped K; `cached` is the stored chunk K, `direct` K0
// rotated to the real position in double. Returns the worst error as a
// fraction of its bound, so the test can report the margin.
double CheckHead(const RopeConfig& rope, std::span<const double> w, DType d,
                 int64_t delta, const std::byte* got, const std::byte* cached,
                 std::span<const float> direct) {
  const size_t es = DTypeSize(d);
  std::vector<float> exact(rope.head_dim);
  for (int32_t e = 0; e < rope.head_dim; ++e) {
    exact[e] = LoadKvElement(d, cached + e * es);
  }
  EXPECT_THAT(ApplyRope(rope, w, delta, exact), IsOk());
  double worst = 0;
  for (int32_t p = 0; p < rope.rotary_dim / 2; ++p) {
    auto [xi, yi] = PairOf(rope, p);
    double norm = std::hypot(direct[xi], direct[yi]);
    for (int32_t e : {xi, yi}) {
      double value = LoadKvElement(d, got + e * es);
      double once = 0.5 * UlpAt(d, std::abs(exact[e])) + kFp32Noise * norm;
      double straight =
          d == DType::kF32 ? 1e-6 * norm : kDirectUlps * UlpAt(d, norm);
      worst = std::max({worst, std::abs(value - exact[e]) / once,
                        std::abs(value - direct[e]) / straight});
    }
  }
  // Dims past the rotary ones: byte for byte.
  size_t rot = rope.rotary_dim * es;
  EXPECT_EQ(std::memcmp(got + rot, cached + rot, rope.head_dim * es - rot), 0);
  return worst;
}

// K computed at virtual positions (the chunk cached in isolation) and
// remapped to its real, unaligned position equals K computed there directly,
// within the bounds above; V and unrotated dims are copied bit for bit.
TEST_P(RopeRemapVariant, MatchesDirectRotation) {
  const Variant v = GetParam();
  const RopeConfig rope = RopeFor(v);
  const KvLayout layout = LayoutFor(v);
  StatusOr<RopeRemap> remap = RopeRemap::Create(layout, rope);
  ASSERT_THAT(remap, IsOk());
  const std::vector<double>& w = remap->inverse_frequencies();
  constexpr int32_t kTokens = 37, kVirtual = 5, kReal = 1237;
  const std::vector<int32_t> dst_ids = {4, 1, 6};
  std::vector<int64_t> slots =
      SlotMappingForBlocks(dst_ids, layout.block_size, 7, kTokens).value();
  Buffers buf(layout, kTokens, 8);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> value(-3, 3);
  const size_t es = layout.ElementSize();
  std::vector<std::vector<float>> direct;  // [t][layer][head] flattened.
  for (int32_t t = 0; t < kTokens; ++t) {
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        std::vector<float> k0(rope.head_dim), k;
        for (float& x : k0) x = value(rng);
        k = k0;
        ASSERT_THAT(ApplyRope(rope, w, kVirtual + t, k), IsOk());
        ASSERT_THAT(ApplyRope(rope, w, kReal + t, k0), IsOk());
        direct.push_back(k0);
        std::byte* src =
            buf.Src(t, layer, KvPlane::kKey) + h * rope.head_dim * es;
        for (int32_t e = 0; e < rope.head_dim; ++e) {
          Store(v.dtype, k[e], src + e * es);
        }
      }
      std::byte* vsrc = buf.Src(t, layer, KvPlane::kValue);
      for (size_t b = 0; b < layout.TokenStride(); ++b) {
        vsrc[b] = static_cast<std::byte>(rng());
      }
    }
  }
  RemapRequest r = buf.Request(kTokens, slots);
  r.virtual_start = kVirtual;
  r.real_start = kReal;
  ASSERT_THAT(remap->Remap(r), IsOk());

  double worst = 0;
  size_t next = 0;
  for (int32_t t = 0; t < kTokens; ++t) {
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        size_t head = h * rope.head_dim * es;
        worst = std::max(
            worst,
            CheckHead(rope, w, v.dtype, kReal - kVirtual,
                      buf.Dst(slots[t], layer, KvPlane::kKey) + head,
                      buf.Src(t, layer, KvPlane::kKey) + head, direct[next++]));
      }
      EXPECT_EQ(
          std::memcmp(buf.Dst(slots[t], layer, KvPlane::kValue),
                      buf.Src(t, layer, KvPlane::kValue), layout.TokenStride()),
          0);
    }
  }
  EXPECT_LE(worst, 1.0);
}

// Random stored values of every finite bit pattern (subnormals and huge
// values included; NaN and inf left out: their payloads are not promised).
void FillFinite(DType d, std::mt19937& rng, std::byte* p, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = rng();
    if (d == DType::kF32) {
      if ((bits & 0x7f800000) == 0x7f800000) bits &= 0xbfffffff;
      std::memcpy(p + 4 * i, &bits, 4);
      continue;
    }
    uint16_t h = static_cast<uint16_t>(bits);
    uint16_t exp_mask = d == DType::kF16 ? 0x7c00 : 0x7f80;
    if ((h & exp_mask) == exp_mask) h &= 0xbfff;  // Top exponent bit off.
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// The scalar and vectorised paths write the same bytes, for random data,
// per-token positions (deltas of both signs) and scattered slots.
TEST_P(RopeRemapVariant, ScalarAndVectorizedAgreeBitForBit) {
  if (!RopeRemap::VectorizedAvailable()) GTEST_SKIP() << "no AVX2/F16C/FMA";
  const Variant v = GetParam();
  const KvLayout layout = LayoutFor(v);
  StatusOr<RopeRemap> remap = RopeRemap::Create(layout, RopeFor(v));
  ASSERT_THAT(remap, IsOk());
  constexpr int32_t kTokens = 45;
  Buffers buf(layout, kTokens, 5);
  std::mt19937 rng(99);
  FillFinite(v.dtype, rng, buf.src.data(),
             buf.src.size() / layout.ElementSize());
  std::vector<int64_t> slots(5 * layout.block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(kTokens);
  slots[3] = -1;
  std::vector<int64_t> real(kTokens);
  for (int64_t& p : real) p = rng() % 200000;
  RemapRequest r = buf.Request(kTokens, slots);
  r.virtual_start = 100000;
  r.real_positions = real;
  ASSERT_THAT(remap->Remap(r, RemapPath::kScalar), IsOk());
  std::vector<std::byte> scalar = buf.dst;
  buf.dst.assign(buf.dst.size(), kSentinel);
  ASSERT_THAT(remap->Remap(r, RemapPath::kVectorized), IsOk());
  EXPECT_TRUE(scalar == buf.dst);
}

INSTANTIATE_TEST_SUITE_P(RopeRemap, RopeRemapVariant,
                         testing::ValuesIn(AllVariants()), VariantName);

KvLayout SmallLayout() {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 2,
                  .head_dim = 8,
                  .block_size = 4,
                  .dtype = DType::kBF16};
}

TEST(RopeRemap, CreateChecksBothConfigs) {
  EXPECT_THAT(RopeRemap::Create(SmallLayout(), Rope(8, 8)), IsOk());
  Status mismatch = RopeRemap::Create(SmallLayout(), Rope(16, 8)).status();
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("head_dim 8 != RoPE head_dim 16"),
            std::string::npos)
      << mismatch.message();
  KvLayout bad = SmallLayout();
  bad.num_layers = 0;
  EXPECT_EQ(RopeRemap::Create(bad, Rope(8, 8)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeRemap::Create(SmallLayout(), Rope(8, 3)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(RopeRemap, SlotMappingForBlocks) {
  std::vector<int32_t> ids = {7, 2};
  EXPECT_EQ(SlotMappingForBlocks(ids, 4, 3, 5).value(),
            (std::vector<int64_t>{31, 8, 9, 10, 11}));
  EXPECT_EQ(SlotMappingForBlocks(ids, 4, 3, 6).status().code(),
            StatusCode::kInvalidArgument);  // Needs a third block.
  EXPECT_EQ(SlotMappingForBlocks(ids, 4, 4, 1).status().code(),
            StatusCode::kInvalidArgument);
}

// Tokens land exactly where the slot mapping says; -1 skips a token and
// leaves its would-be place alone; per-token positions equal to
// real_start + i give the same bytes.
TEST(RopeRemap, ScatteredSlotsAndSkips) {
  const KvLayout layout = SmallLayout();
  StatusOr<RopeRemap> remap = RopeRemap::Create(layout, Rope(8, 8));
  ASSERT_THAT(remap, IsOk());
  constexpr int32_t kTokens = 10;
  Buffers contiguous(layout, kTokens, 4);
  std::mt19937 rng(5);
  FillFinite(layout.dtype, rng, contiguous.src.data(),
             contiguous.src.size() / 2);
  std::vector<int64_t> dense(kTokens);
  std::iota(dense.begin(), dense.end(), 3);
  RemapRequest r = contiguous.Request(kTokens, dense);
  r.virtual_start = 40;
  r.real_start = 9;
  ASSERT_THAT(remap->Remap(r), IsOk());

  Buffers scattered = contiguous;
  scattered.dst.assign(scattered.dst.size(), kSentinel);
  // A run of three, a run across a block boundary (3, 4), two skips.
  std::vector<int64_t> slots = {15, -1, 0, 1, 2, -1, 3, 4, 13, 7};
  std::vector<int64_t> real(kTokens);
  std::iota(real.begin(), real.end(), 9);
  RemapRequest s = scattered.Request(kTokens, slots);
  s.virtual_start = 40;
  s.real_positions = real;
  ASSERT_THAT(remap->Remap(s), IsOk());

  std::vector<bool> written(4 * layout.block_size, false);
  for (int32_t t = 0; t < kTokens; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        EXPECT_EQ(std::memcmp(scattered.Dst(slots[t], layer, plane),
                              contiguous.Dst(dense[t], layer, plane),
                              layout.TokenStride()),
                  0)
            << "token " << t;
      }
    }
  }
  for (int64_t slot = 0; slot < 4 * layout.block_size; ++slot) {
    if (written[slot]) continue;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        const std::byte* p = scattered.Dst(slot, layer, plane);
        EXPECT_TRUE(std::all_of(p, p + layout.TokenStride(),
                                [](std::byte b) { return b == kSentinel; }))
            << "slot " << slot;
      }
    }
  }
}

// Every malformed request is InvalidArgument and writes nothing.
TEST(RopeRemap, BadRequestsWriteNothing) {
  const KvLayout layout = SmallLayout();
  StatusOr<RopeRemap> remap = RopeRemap::Create(layout, Rope(8, 8));
  ASSERT_THAT(remap, IsOk());
  constexpr int32_t kTokens = 6;
  Buffers buf(layout, kTokens, 3);
  std::vector<int64_t> slots = {0, 1, 2, 3, 4, 5};
  std::vector<int64_t> real = {1, 2, 3, 4, 5, 6};
  std::vector<const std::byte*> null_block = {buf.src_blocks[0], nullptr};
  std::vector<int64_t> out_of_range = {0, 1, 2, 3, 4, 12};
  std::vector<int64_t> minus_two = {0, 1, -2, 3, 4, 5};
  std::vector<int64_t> negative_real = {1, 2, -3, 4, 5, 6};
  struct Case {
    const char* name;
    std::function<void(RemapRequest&)> edit;
  };
  std::vector<Case> cases = {
      {"no tokens", [](RemapRequest& r) { r.num_tokens = 0; }},
      {"null source block",
       [&](RemapRequest& r) { r.src_blocks = null_block; }},
      {"too few source blocks",
       [&](RemapRequest& r) { r.src_blocks = r.src_blocks.first(1); }},
      {"null destination", [](RemapRequest& r) { r.dst_base = nullptr; }},
      {"no destination blocks", [](RemapRequest& r) { r.dst_num_blocks = 0; }},
      {"slot count",
       [](RemapRequest& r) { r.dst_slots = r.dst_slots.first(5); }},
      {"slot past the blocks",
       [&](RemapRequest& r) { r.dst_slots = out_of_range; }},
      {"slot -2", [&](RemapRequest& r) { r.dst_slots = minus_two; }},
      {"negative virtual start", [](RemapRequest& r) { r.virtual_start = -1; }},
      {"negative real start", [](RemapRequest& r) { r.real_start = -4; }},
      {"huge real start",
       [](RemapRequest& r) { r.real_start = kMaxRopePosition - 2; }},
      {"negative real position",
       [&](RemapRequest& r) { r.real_positions = negative_real; }},
      {"real position count",
       [&](RemapRequest& r) { r.real_positions = std::span(real).first(2); }},
  };
  const std::vector<std::byte> before = buf.dst;
  for (const Case& c : cases) {
    RemapRequest r = buf.Request(kTokens, slots);
    c.edit(r);
    for (RemapPath path : {RemapPath::kAuto, RemapPath::kScalar}) {
      EXPECT_EQ(remap->Remap(r, path).code(), StatusCode::kInvalidArgument)
          << c.name;
    }
    EXPECT_TRUE(buf.dst == before) << c.name;
  }
  RemapRequest ok = buf.Request(kTokens, slots);
  EXPECT_THAT(remap->Remap(ok), IsOk());
}

TEST(RopeRemap, VectorizedPathNeedsTheCpu) {
  const KvLayout layout = SmallLayout();
  StatusOr<RopeRemap> remap = RopeRemap::Create(layout, Rope(8, 8));
  ASSERT_THAT(remap, IsOk());
  Buffers buf(layout, 1, 1);
  std::vector<int64_t> slots = {0};
  Status status = remap->Remap(buf.Request(1, slots), RemapPath::kVectorized);
  if (RopeRemap::VectorizedAvailable()) {
    EXPECT_THAT(status, IsOk());
  } else {
    EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace tierkv
