// The reference model and the chunk cache around it (issue 5): the model is
// deterministic and checks its inputs; a remapped chunk's K equals K computed
// at its real position within the stated bounds; prefix hits reproduce a full
// prefill bit for bit; reused chunks reproduce a chunk-isolated prefill; a
// partly hit request stores every chunk it computed.
#include "testing/reference_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "src/chunk_kv_store_internal.h"
#include "src/kv_cache_manager_internal.h"
#include "src/rope_remap.h"
#include "testing/cached_prefill.h"
#include "tests/kv_element.h"
#include "tests/status_matchers.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/request.h"

namespace tierkv {
namespace {

constexpr TokenId kSep = 255;  // Never drawn by RandomTokens.

ReferenceModelConfig SmallConfig(int32_t layers = 3) {
  ReferenceModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = layers;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_size = 128;
  c.seed = 42;
  return c;
}

ReferenceModel SmallModel(int32_t layers = 3) {
  return ReferenceModel::Create(SmallConfig(layers)).value();
}

std::vector<TokenId> RandomTokens(std::mt19937& rng, int n) {
  std::vector<TokenId> out(static_cast<size_t>(n));
  for (TokenId& t : out) t = rng() % kSep;
  return out;
}

std::vector<int64_t> Iota(int64_t n, int64_t first = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<uint32_t> Bits(std::span<const float> v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

PagedKvCache Cache(const ReferenceModel& m, int64_t tokens,
                   DType dtype = DType::kF32, int32_t block_size = 16) {
  return PagedKvCache::Create(m.config().CacheLayout(block_size, dtype),
                              (tokens + block_size - 1) / block_size)
      .value();
}

// `chunks` joined by the separator: system prompt, documents, question.
std::vector<TokenId> Join(const std::vector<std::vector<TokenId>>& parts) {
  std::vector<TokenId> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back(kSep);
    out.insert(out.end(), parts[i].begin(), parts[i].end());
  }
  return out;
}

// max |a - b| / max |b|.
double RelativeMaxError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

// ---------------------------------------------------------------------------
// The model itself.

TEST(ReferenceModel, ConfigErrorsNameTheField) {
  ReferenceModelConfig c = SmallConfig();
  c.num_kv_heads = 3;
  EXPECT_NE(ReferenceModel::Create(c).status().message().find("num_kv_heads"),
            std::string::npos);
  c = SmallConfig();
  c.head_dim = 15;  // RoPE needs an even rotary dim.
  EXPECT_NE(ReferenceModel::Create(c).status().message().find("rotary_dim"),
            std::string::npos);
  c = SmallConfig();
  c.ffn_size = 0;
  EXPECT_NE(ReferenceModel::Create(c).status().message().find("ffn_size"),
            std::string::npos);
  c = SmallConfig();
  c.vocab_size = 60000;
  c.hidden_size = 4096;  // 491 M embedding and LM-head weights.
  EXPECT_NE(ReferenceModel::Create(c).status().message().find("2^28 weights"),
            std::string::npos);
}

// Same seed and inputs: the same bits; another seed: other weights.
TEST(ReferenceModel, DeterministicPerSeed) {
  std::mt19937 rng(1);
  const std::vector<TokenId> tokens = RandomTokens(rng, 40);
  const std::vector<int64_t> slots = Iota(40);
  auto run = [&](uint64_t seed) {
    ReferenceModelConfig c = SmallConfig();
    c.seed = seed;
    ReferenceModel m = ReferenceModel::Create(c).value();
    PagedKvCache cache = Cache(m, 40);
    return m
        .Prefill({.tokens = tokens, .slots = slots, .num_logits = 40}, &cache)
        .value()
        .logits;
  };
  const std::vector<float> a = run(7);
  EXPECT_EQ(Bits(a), Bits(run(7)));
  EXPECT_NE(Bits(a), Bits(run(8)));
  // Not degenerate: finite, and the last token's logits are spread out.
  EXPECT_TRUE(std::all_of(a.begin(), a.end(),
                          [](float x) { return std::isfinite(x); }));
  auto [lo, hi] = std::minmax_element(a.end() - 256, a.end());
  EXPECT_GT(*hi - *lo, 1.0f);
}

// The cache holds each token's K (after RoPE) and V where KvLayout says,
// rounded once to the storage dtype.
TEST(ReferenceModel, CacheFollowsKvLayout) {
  const ReferenceModel m = SmallModel();
  std::mt19937 rng(2);
  const std::vector<TokenId> tokens = RandomTokens(rng, 21);
  const std::vector<int64_t> slots = {40, 3,  4,  5,  6,  7,  8,
                                      9,  10, 11, 12, 13, 14, 15,
                                      16, 17, 18, 19, 20, 21, 1};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    PagedKvCache cache = Cache(m, 48, dtype);
    PrefillOutput out = m.Prefill({.tokens = tokens,
                                   .slots = slots,
                                   .num_logits = 0,
                                   .return_kv = true},
                                  &cache)
                            .value();
    const KvLayout& layout = cache.layout();
    ASSERT_EQ(out.layers.size(), 3u);
    for (int32_t l = 0; l < 3; ++l) {
      for (size_t t = 0; t < tokens.size(); ++t) {
        for (int32_t e = 0; e < 32; ++e) {
          const float k = out.layers[l].k[t * 32 + e];
          const std::byte* p = cache.block(slots[t] / 16) +
                               layout.Offset(l, KvPlane::kKey, slots[t] % 16) +
                               e * layout.ElementSize();
          if (dtype == DType::kF32) {
            float stored;
            std::memcpy(&stored, p, 4);
            ASSERT_EQ(std::bit_cast<uint32_t>(stored),
                      std::bit_cast<uint32_t>(k));
          } else {
            uint16_t stored;
            std::memcpy(&stored, p, 2);
            ASSERT_EQ(stored, dtype == DType::kBF16 ? internal::FloatToBf16(k)
                                                    : internal::FloatToHalf(k));
          }
        }
      }
    }
  }
}

TEST(ReferenceModel, PrefillRejectsMalformedInput) {
  const ReferenceModel m = SmallModel();
  PagedKvCache cache = Cache(m, 32);
  const std::vector<TokenId> tokens = {1, 2, 3, 4};
  const std::vector<TokenId> bad_token = {1, 2, 256, 4};
  const std::vector<int64_t> slots = Iota(4);
  const std::vector<int64_t> far_slot = {0, 1, 2, 32};
  const std::vector<TokenRange> cached_last = {{2, 4}};
  const std::vector<TokenRange> unsorted = {{2, 3}, {0, 1}};
  const std::vector<AttentionSpan> gap = {{{0, 2}, {0, 2}}};
  const std::vector<AttentionSpan> overlap = {{{0, 3}, {0, 3}},
                                              {{2, 4}, {0, 4}}};
  auto code = [&](PrefillInput in) {
    return m.Prefill(in, &cache).status().code();
  };
  const StatusCode kBad = StatusCode::kInvalidArgument;
  EXPECT_EQ(code({.tokens = {}, .slots = {}}), kBad);
  EXPECT_EQ(code({.tokens = bad_token, .slots = slots}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = far_slot}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = std::span(slots).first(3)}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .start_position = -1}),
            kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .spans = gap}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .spans = overlap}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .cached = cached_last}),
            kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .cached = unsorted}), kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots, .num_logits = 5}), kBad);
  PagedKvCache other =
      PagedKvCache::Create(SmallConfig(2).CacheLayout(16, DType::kF32), 2)
          .value();
  EXPECT_EQ(
      m.Prefill({.tokens = tokens, .slots = slots}, &other).status().code(),
      kBad);
  EXPECT_EQ(code({.tokens = tokens, .slots = slots}), StatusCode::kOk);
}

// ---------------------------------------------------------------------------
// 1. Remap is exact.

// Spacing of `d` around magnitude `mag` (normal range; subnormals clamp).
double UlpAt(DType d, double mag) {
  const int mantissa = d == DType::kF32 ? 23 : d == DType::kF16 ? 10 : 7;
  const int min_exp = d == DType::kF16 ? -14 : -126;
  const int e =
      mag > 0 ? static_cast<int>(std::floor(std::log2(mag))) : min_exp;
  return std::ldexp(1.0, std::max(e, min_exp) - mantissa);
}

// fp32 arithmetic noise of one rotation, relative to the pair's norm: cos
// and sin rounded to float (2^-24 each), two products and their sum rounded
// (2^-24 each, weighted by |x c| + |y s| <= sqrt(2) |pair|): under 6 units
// of 2^-24; 8 leaves margin. The same constant as rope_remap_test.
constexpr double kFp32Noise = 8.0 / (1 << 24);

struct RemapCheck {
  double own = 0;       // Worst |remapped - exact rotation| / bound.
  double direct = 0;    // Worst |remapped - RoPE(k, real)| / bound.
  double deep_rel = 0;  // Worst per-token relative L2 vs the model at real.
};

class ReferenceModelRemap : public testing::TestWithParam<DType> {};

// A chunk computed by the model in isolation at virtual positions and
// remapped to real position 1237 (unaligned, scattered blocks) against the
// same chunk computed there directly.
//  - own error: remapped K vs the exact (double) rotation of the cached K:
//    0.5 ULP of the storage dtype plus fp32 noise; for fp32 storage the
//    noise bound alone (8 * 2^-24 of the pair's norm) since cos/sin are
//    rounded to float;
//  - direct: remapped K vs RoPE(pre-RoPE K, real) as the model computes it:
//    bf16/fp16 within 1.25 ULP of the pair's norm (the cached K was already
//    rounded once at its virtual position; the rotation mixes that error
//    across the pair, up to u/sqrt(2), then the remap rounds again, u/2:
//    1.21u, see rope_remap.h); fp32 within 8 * 2^-24 of the pair's norm
//    (6.3 units: sqrt(2) for the virtual rounding carried through the
//    rotation, sqrt(2) + sqrt(2) + 1 for the remap's fp32 arithmetic and 1
//    for the direct rounding);
//  - layer 0's pre-RoPE K and V do not depend on position, so there the
//    "direct" K above is literally the model's K at the real position
//    (checked bit for bit). Deeper layers see attention computed at other
//    absolute positions (same relative angles, other rounding; for bf16/fp16
//    also K/V rounded at other positions), so the model's own K at the real
//    position differs by that noise: bounded separately, per token.
//  - V is copied byte for byte.
TEST_P(ReferenceModelRemap, RemappedChunkMatchesDirectComputation) {
  const DType dtype = GetParam();
  const ReferenceModel m = SmallModel();
  const RopeConfig rope = m.config().Rope();
  const KvLayout layout = m.config().CacheLayout(16, dtype);
  constexpr int32_t kTokens = 37, kWidth = 32, kLayers = 3;
  constexpr int64_t kVirtual = 5, kReal = 1237;
  std::mt19937 rng(3);
  const std::vector<TokenId> chunk = RandomTokens(rng, kTokens);
  const std::vector<int64_t> slots = Iota(kTokens);
  auto compute = [&](int64_t start, PagedKvCache* cache) {
    return m
        .Prefill({.tokens = chunk,
                  .slots = slots,
                  .start_position = start,
                  .num_logits = 0,
                  .return_kv = true},
                 cache)
        .value();
  };
  PagedKvCache at_virtual = Cache(m, kTokens, dtype);
  PagedKvCache at_real = Cache(m, kTokens, dtype);
  const PrefillOutput v_out = compute(kVirtual, &at_virtual);
  const PrefillOutput r_out = compute(kReal, &at_real);

  PagedKvCache dst = PagedKvCache::Create(layout, 8).value();
  const std::vector<int64_t> dst_slots =
      SlotMappingForBlocks(std::vector<int32_t>{4, 1, 6}, 16, 7, kTokens)
          .value();
  const RopeRemap remap = RopeRemap::Create(layout, rope).value();
  std::vector<const std::byte*> src = {at_virtual.block(0), at_virtual.block(1),
                                       at_virtual.block(2)};
  RemapRequest request;
  request.src_blocks = src;
  request.num_tokens = kTokens;
  request.virtual_start = kVirtual;
  request.dst_base = dst.base();
  request.dst_num_blocks = dst.num_blocks();
  request.dst_slots = dst_slots;
  request.real_start = kReal;
  ASSERT_THAT(remap.Remap(request), IsOk());

  // Layer 0 does not depend on position before RoPE.
  EXPECT_EQ(Bits(v_out.layers[0].k_unrotated),
            Bits(r_out.layers[0].k_unrotated));
  EXPECT_EQ(Bits(v_out.layers[0].v), Bits(r_out.layers[0].v));

  const std::vector<double>& w = m.inverse_frequencies();
  const size_t es = layout.ElementSize();
  const double delta = static_cast<double>(kReal - kVirtual);
  RemapCheck worst;
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t t = 0; t < kTokens; ++t) {
      const std::byte* got_k = dst.token(dst_slots[t], l, KvPlane::kKey);
      const std::byte* cached_k = at_virtual.token(t, l, KvPlane::kKey);
      EXPECT_EQ(std::memcmp(dst.token(dst_slots[t], l, KvPlane::kValue),
                            at_virtual.token(t, l, KvPlane::kValue),
                            layout.TokenStride()),
                0);
      // RoPE(pre-RoPE K computed at the virtual position, real position).
      std::vector<float> direct(
          v_out.layers[l].k_unrotated.begin() + t * kWidth,
          v_out.layers[l].k_unrotated.begin() + (t + 1) * kWidth);
      double diff2 = 0, norm2 = 0;
      for (int32_t g = 0; g < 2; ++g) {
        std::span<float> head(direct.data() + g * 16, 16);
        ASSERT_THAT(ApplyRope(rope, w, kReal + t, head), IsOk());
        for (int32_t p = 0; p < 8; ++p) {
          const int32_t xi = g * 16 + p, yi = xi + 8;  // NeoX pairs.
          const double x = LoadKvElement(dtype, cached_k + xi * es);
          const double y = LoadKvElement(dtype, cached_k + yi * es);
          const double c = std::cos(delta * w[p]), s = std::sin(delta * w[p]);
          const double exact[2] = {x * c - y * s, x * s + y * c};
          const double got[2] = {LoadKvElement(dtype, got_k + xi * es),
                                 LoadKvElement(dtype, got_k + yi * es)};
          const double want[2] = {direct[xi], direct[yi]};
          const double norm = std::hypot(want[0], want[1]);
          for (int i = 0; i < 2; ++i) {
            const double own_bound =
                (dtype == DType::kF32
                     ? 0
                     : 0.5 * UlpAt(dtype, std::abs(exact[i]))) +
                kFp32Noise * std::hypot(x, y);
            const double direct_bound = dtype == DType::kF32
                                            ? kFp32Noise * norm
                                            : 1.25 * UlpAt(dtype, norm);
            worst.own =
                std::max(worst.own, std::abs(got[i] - exact[i]) / own_bound);
            worst.direct = std::max(worst.direct,
                                    std::abs(got[i] - want[i]) / direct_bound);
          }
        }
      }
      if (l == 0) {
        // Here the model's own K at the real position is that same value.
        EXPECT_EQ(
            Bits(direct),
            Bits(std::span(r_out.layers[0].k).subspan(t * kWidth, kWidth)));
      }
      for (int32_t e = 0; e < kWidth; ++e) {
        const double model = r_out.layers[l].k[t * kWidth + e];
        diff2 += std::pow(LoadKvElement(dtype, got_k + e * es) - model, 2);
        norm2 += model * model;
      }
      worst.deep_rel = std::max(worst.deep_rel, std::sqrt(diff2 / norm2));
    }
  }
  std::printf(
      "[%s] own error %.3f of bound, vs RoPE at real %.3f of bound, "
      "vs the model at real (all layers) %.3g relative\n",
      std::string(DTypeName(dtype)).c_str(), worst.own, worst.direct,
      worst.deep_rel);
  EXPECT_LE(worst.own, 1.0);
  EXPECT_LE(worst.direct, 1.0);
  // Against the model's own K at the real position (every layer): storage
  // rounding of the K/V that deeper layers attended to (about one storage
  // epsilon: 2^-7 bf16, 2^-10 fp16) plus fp32 noise carried through the
  // layers (measured about 8 fp32 epsilons). Bound: 2 storage epsilons plus
  // 16 fp32 epsilons; measured at 40-45% of it for each dtype.
  const double storage_eps = dtype == DType::kF32   ? 0x1p-23
                             : dtype == DType::kF16 ? 0x1p-10
                                                    : 0x1p-7;
  EXPECT_LE(worst.deep_rel, 2 * storage_eps + 16 * 0x1p-23);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReferenceModelRemap,
                         testing::Values(DType::kF32, DType::kF16,
                                         DType::kBF16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// 2. Prefix hits change nothing.

class ReferenceModelPrefix : public testing::TestWithParam<DType> {};

// Request A fills the pool; request B shares A's first 48 tokens (three
// blocks) and request C its first 40 (two full blocks hit, the third is
// partial). Their prefixes come from A's blocks; logits and the KV they
// compute are bit-identical to a full prefill in a fresh cache.
TEST_P(ReferenceModelPrefix, PrefixHitIsBitIdentical) {
  const DType dtype = GetParam();
  const ReferenceModel m = SmallModel();
  KVCacheManager manager =
      KVCacheManager::Create({.pool = {.num_blocks = 32, .block_size = 16}})
          .value();
  PagedKvCache pool_cache =
      PagedKvCache::Create(m.config().CacheLayout(16, dtype), 32).value();
  const KeyHasher hasher(KeyNamespace{"reference-model-test", ""});
  std::mt19937 rng(4);
  const std::vector<TokenId> prefix = RandomTokens(rng, 48);
  auto with = [&](std::span<const TokenId> head, int tail) {
    std::vector<TokenId> out(head.begin(), head.end());
    for (TokenId t : RandomTokens(rng, tail)) out.push_back(t);
    return out;
  };
  const Request a(1, with(prefix, 20), 16, hasher);
  int32_t hit = -1;
  ASSERT_THAT(PrefixCachedPrefill(m, &manager, a, &pool_cache, 1, &hit),
              IsOk());
  EXPECT_EQ(hit, 0);
  ASSERT_THAT(manager.Free(a.id()), IsOk());

  struct Case {
    Request request;
    int32_t want_hit;
  };
  const std::vector<Case> cases = {
      {Request(2, with(prefix, 25), 16, hasher), 48},
      {Request(3, with(std::span(prefix).first(40), 30), 16, hasher), 32}};
  for (const Case& c : cases) {
    const int32_t n = c.request.num_tokens();
    const int32_t computed = n - c.want_hit;
    PrefillOutput out =
        PrefixCachedPrefill(m, &manager, c.request, &pool_cache, computed, &hit)
            .value();
    EXPECT_EQ(hit, c.want_hit);
    EXPECT_EQ(out.computed_tokens, computed);

    PagedKvCache fresh = Cache(m, n, dtype);
    const std::vector<int64_t> slots = Iota(n);
    PrefillOutput full = m.Prefill({.tokens = c.request.tokens(),
                                    .slots = slots,
                                    .num_logits = computed},
                                   &fresh)
                             .value();
    EXPECT_EQ(Bits(out.logits), Bits(full.logits));
    std::span<const BlockId> blocks = manager.blocks(c.request.id());
    for (int32_t t = 0; t < n; ++t) {
      const int64_t slot = int64_t{blocks[t / 16]} * 16 + t % 16;
      for (int32_t l = 0; l < 3; ++l) {
        for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
          ASSERT_EQ(std::memcmp(pool_cache.token(slot, l, plane),
                                fresh.token(t, l, plane),
                                fresh.layout().TokenStride()),
                    0)
              << "token " << t << " layer " << l;
        }
      }
    }
    ASSERT_THAT(manager.Free(c.request.id()), IsOk());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReferenceModelPrefix,
                         testing::Values(DType::kF32, DType::kBF16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------------------
// 3. Chunk reuse under chunk-isolated attention.

struct ChunkFixture {
  ChunkFixture(int64_t virtual_start = 1000)
      : model(SmallModel()),
        store(CreateChunkKvStore(model, {.num_blocks = 64,
                                         .block_size = 16,
                                         .virtual_start = virtual_start})
                  .value()) {}

  ChunkedPrefillResult Run(const std::vector<TokenId>& prompt,
                           int32_t num_logits,
                           ChunkedPrefillOptions options = {}) {
    options.num_logits = num_logits;
    PagedKvCache dst = Cache(model, static_cast<int64_t>(prompt.size()));
    const std::vector<TokenId> sep = {kSep};
    return ChunkedPrefill(model, &store, prompt, sep, options, &dst).value();
  }

  // Everything computed in one prefill under the chunk-isolated mask.
  PrefillOutput FullIsolated(const AssembledPrompt& p, int32_t num_logits) {
    const auto n = static_cast<int64_t>(p.tokens.size());
    PagedKvCache cache = Cache(model, n);
    const std::vector<int64_t> slots = Iota(n);
    return model
        .Prefill({.tokens = p.tokens,
                  .slots = slots,
                  .spans = p.spans,
                  .num_logits = num_logits},
                 &cache)
        .value();
  }

  ReferenceModel model;
  ChunkKvStore store;
};

// Remapped chunks give the logits of a full prefill under the same
// chunk-isolated mask, up to rounding: each chunk's K was rounded at its
// virtual position and turned by the remap (a few 2^-24 relative, test 1),
// and inside a chunk the deeper layers saw attention at other absolute
// positions (same relative angles, other rounding). Both are fp32 noise of
// order 2^-24 relative, amplified by three layers and the LM head (measured
// about 8e-7 of the largest logit); we allow 2^-16 (1.5e-5). A chunk placed
// without re-rotation is about 1.0 off (checked below), so the bound has
// teeth.
constexpr double kChunkReuseTolerance = 0x1p-16;

TEST(ReferenceModelChunks, ReuseMatchesChunkIsolatedPrefill) {
  ChunkFixture f;
  std::mt19937 rng(5);
  const auto sys = RandomTokens(rng, 20), a = RandomTokens(rng, 33),
             b = RandomTokens(rng, 40), c = RandomTokens(rng, 29);
  const auto q1 = RandomTokens(rng, 7), q2 = RandomTokens(rng, 9);

  ChunkedPrefillResult first = f.Run(Join({sys, a, b, c, q1}), 7);
  EXPECT_EQ(first.chunk_hits, 0);
  EXPECT_EQ(first.chunk_misses, 4);
  EXPECT_EQ(first.output.computed_tokens, 7);
  PrefillOutput want = f.FullIsolated(first.prompt, 7);
  const double err_first = RelativeMaxError(first.output.logits, want.logits);

  // Every chunk a hit, in another order, behind another question.
  ChunkedPrefillResult second = f.Run(Join({sys, c, a, b, q2}), 9);
  EXPECT_EQ(second.chunk_hits, 4);
  EXPECT_EQ(second.chunk_misses, 0);
  want = f.FullIsolated(second.prompt, 9);
  const double err_second = RelativeMaxError(second.output.logits, want.logits);
  std::printf(
      "chunk reuse vs full chunk-isolated prefill: %.3g (misses), "
      "%.3g (all hits, reordered); tolerance %.3g\n",
      err_first, err_second, kChunkReuseTolerance);
  EXPECT_LE(err_first, kChunkReuseTolerance);
  EXPECT_LE(err_second, kChunkReuseTolerance);

  // Negative control: the same cached chunks copied without re-rotation.
  const AssembledPrompt& p = second.prompt;
  const auto n = static_cast<int64_t>(p.tokens.size());
  PagedKvCache dst = Cache(f.model, n);
  const std::vector<int64_t> slots = Iota(n);
  for (const TokenRange& r : p.chunks) {
    std::span<const TokenId> chunk =
        std::span(p.tokens).subspan(r.begin, r.size());
    const std::vector<BlockId> blocks = f.store.Acquire(chunk);
    ASSERT_FALSE(blocks.empty());
    ASSERT_TRUE(f.store
                    .Place(blocks, static_cast<int32_t>(r.size()),
                           std::span(slots).subspan(r.begin, r.size()),
                           f.store.virtual_start(), dst.memory())
                    .ok());
    EXPECT_THAT(f.store.Release(blocks), IsOk());
  }
  const std::vector<TokenRange> cached = {{0, p.question.begin}};
  PrefillOutput unrotated = f.model
                                .Prefill({.tokens = p.tokens,
                                          .slots = slots,
                                          .spans = p.spans,
                                          .cached = cached,
                                          .num_logits = 9},
                                         &dst)
                                .value();
  const double err_unrotated = RelativeMaxError(unrotated.logits, want.logits);
  std::printf("without re-rotation: %.3g\n", err_unrotated);
  EXPECT_GT(err_unrotated, 1000 * kChunkReuseTolerance);
}

// A chunk placed at its own virtual position turns by zero (cos 1, sin 0:
// exact), so with the system prompt computed at virtual position 0 a
// `sys <sep> question` request is bit-identical to the full prefill: the
// only differences above come from positions.
TEST(ReferenceModelChunks, ChunkAtItsVirtualPositionIsBitIdentical) {
  ChunkFixture f(/*virtual_start=*/0);
  std::mt19937 rng(6);
  const auto sys = RandomTokens(rng, 45), q = RandomTokens(rng, 6);
  ChunkedPrefillResult cold = f.Run(Join({sys, q}), 6);
  ChunkedPrefillResult hit = f.Run(Join({sys, q}), 6);
  EXPECT_EQ(hit.chunk_hits, 1);
  const PrefillOutput want = f.FullIsolated(hit.prompt, 6);
  EXPECT_EQ(Bits(cold.output.logits), Bits(want.logits));
  EXPECT_EQ(Bits(hit.output.logits), Bits(want.logits));
}

// ---------------------------------------------------------------------------
// 5. A request that hits some chunks still stores the ones it computed.

TEST(ReferenceModelChunks, PartialHitStoresEveryChunk) {
  ChunkFixture f;
  std::mt19937 rng(7);
  const auto sys = RandomTokens(rng, 16), a = RandomTokens(rng, 30),
             b = RandomTokens(rng, 17), d = RandomTokens(rng, 35),
             e = RandomTokens(rng, 5);
  ChunkedPrefillResult r1 = f.Run(Join({sys, a, b, RandomTokens(rng, 4)}), 1);
  EXPECT_EQ(r1.chunk_misses, 3);
  EXPECT_FALSE(f.store.Contains(d));

  ChunkedPrefillResult r2 =
      f.Run(Join({sys, b, d, e, RandomTokens(rng, 4)}), 1);
  EXPECT_EQ(r2.chunk_hits, 2);    // sys, b.
  EXPECT_EQ(r2.chunk_misses, 2);  // d, e: computed and stored.
  for (const auto* chunk : {&sys, &a, &b, &d, &e}) {
    EXPECT_TRUE(f.store.Contains(*chunk));
  }
  EXPECT_THAT(PoolOf(f.store).CheckInvariants(), IsOk());
  // Nothing stays pinned after a request.
  EXPECT_EQ(f.store.num_free_blocks(), f.store.num_blocks() - 1);

  // What was stored for d is d's KV computed in isolation at the virtual
  // positions, byte for byte.
  const std::vector<BlockId> blocks = f.store.Acquire(d);
  ASSERT_EQ(blocks.size(), 3u);
  PagedKvCache own = Cache(f.model, 35);
  const PagedKvCache pool = ChunkPoolView(&f.store).value();
  const std::vector<int64_t> slots = Iota(35);
  ASSERT_THAT(f.model.Prefill({.tokens = d,
                               .slots = slots,
                               .start_position = f.store.virtual_start(),
                               .num_logits = 0},
                              &own),
              IsOk());
  for (int32_t t = 0; t < 35; ++t) {
    for (int32_t l = 0; l < 3; ++l) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        ASSERT_EQ(
            std::memcmp(
                pool.token(int64_t{blocks[t / 16]} * 16 + t % 16, l, plane),
                own.token(t, l, plane), own.layout().TokenStride()),
            0);
      }
    }
  }
  EXPECT_THAT(f.store.Release(blocks), IsOk());

  ChunkedPrefillResult r3 = f.Run(Join({e, d, sys, RandomTokens(rng, 3)}), 1);
  EXPECT_EQ(r3.chunk_hits, 3);
  EXPECT_EQ(r3.chunk_misses, 0);
}

// The chunk pool is a BlockPool: when full, the least recently used chunk
// goes; a store too small for a chunk says so.
TEST(ReferenceModelChunks, StoreEvictsAndReportsExhaustion) {
  const ReferenceModel m = SmallModel();
  ChunkKvStore store =
      CreateChunkKvStore(m, {.num_blocks = 5, .block_size = 16}).value();
  std::mt19937 rng(8);
  const auto a = RandomTokens(rng, 32), b = RandomTokens(rng, 20),
             c = RandomTokens(rng, 20), big = RandomTokens(rng, 80);
  for (const auto* chunk : {&a, &b}) {
    std::vector<BlockId> blocks = store.ComputeAndInsert(*chunk).value();
    EXPECT_THAT(store.Release(blocks), IsOk());
  }
  std::vector<BlockId> blocks = store.ComputeAndInsert(c).value();
  EXPECT_THAT(store.Release(blocks), IsOk());
  EXPECT_FALSE(store.Contains(a));  // Least recently used: evicted.
  EXPECT_TRUE(store.Contains(b));
  EXPECT_TRUE(store.Contains(c));
  EXPECT_EQ(store.ComputeAndInsert(big).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// ---------------------------------------------------------------------------
// 6. Into the engine's main pool: the remap's blocks are released unkeyed
// when the request finishes (seed 000's cleanup_remapped_blocks).

TEST(ReferenceModelChunks, MainPoolRemapBlocksAreReleasedUnkeyed) {
  ChunkFixture f;
  std::mt19937 rng(9);
  const std::vector<TokenId> prompt = Join(
      {RandomTokens(rng, 20), RandomTokens(rng, 33), RandomTokens(rng, 7)});
  const std::vector<TokenId> sep = {kSep};
  KVCacheManager main =
      KVCacheManager::Create({.pool = {.num_blocks = 12, .block_size = 16}})
          .value();
  PagedKvCache memory =
      PagedKvCache::Create(f.store.layout(), PoolOf(main).num_blocks()).value();
  const int32_t free_before = PoolOf(main).num_free_blocks();

  ChunkedPrefillResult r =
      ChunkedPrefill(f.model, &f.store, prompt, sep, {.num_logits = 7},
                     MainKvPool{.manager = &main, .memory = &memory})
          .value();
  const auto n = static_cast<int32_t>(r.prompt.tokens.size());
  ASSERT_EQ(r.main_blocks.size(), static_cast<size_t>((n + 15) / 16));
  EXPECT_EQ(PoolOf(main).num_free_blocks(),
            free_before - static_cast<int32_t>(r.main_blocks.size()));
  EXPECT_EQ(PoolOf(main).num_cached_blocks(), 0u);
  // The same logits as into a private cache: where a slot lives changes
  // nothing.
  ChunkedPrefillResult own = f.Run(prompt, 7);
  EXPECT_EQ(Bits(r.output.logits), Bits(own.output.logits));

  main.ReleaseRemappedBlocks(r.main_blocks);
  EXPECT_EQ(PoolOf(main).num_free_blocks(), free_before);
  EXPECT_EQ(PoolOf(main).num_cached_blocks(), 0u);
  EXPECT_THAT(PoolOf(main).CheckInvariants(), IsOk());
  // Chunk-isolated KV is never a prefix hit.
  const KeyHasher hasher(KeyNamespace{});
  const Request again(1, r.prompt.tokens, 16, hasher);
  EXPECT_EQ(main.GetComputedBlocks(again).num_tokens, 0);

  // A main pool too small for the sequence: an error, nothing held.
  KVCacheManager tiny =
      KVCacheManager::Create({.pool = {.num_blocks = 3, .block_size = 16}})
          .value();
  PagedKvCache tiny_memory = PagedKvCache::Create(f.store.layout(), 3).value();
  EXPECT_EQ(ChunkedPrefill(f.model, &f.store, prompt, sep, {},
                           MainKvPool{.manager = &tiny, .memory = &tiny_memory})
                .status()
                .code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(PoolOf(tiny).num_free_blocks(), 2);
}

}  // namespace
}  // namespace tierkv
