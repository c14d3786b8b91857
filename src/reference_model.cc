#include "src/reference_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "src/chunk_parser.h"
#include "src/kv_cache_manager_internal.h"

namespace tierkv {
namespace {

constexpr float kRmsEps = 1e-5f;
// Query/key projection gain: attention scores get a spread of about
// kQkGain^4, so heads attend selectively rather than uniformly, which makes
// cross-chunk attention (what CacheBlend restores) matter.
constexpr float kQkGain = 1.25f;

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("reference model: " + what);
}

// ---------------------------------------------------------------------------
// Weights: uniform in [-scale, scale) from the top 24 bits of each
// std::mt19937_64 draw (the engine's output is fixed by the standard; the
// std distributions are not). 2u - 1 is exact in float; one rounding for
// the scale.

class UniformSource {
 public:
  explicit UniformSource(uint64_t seed) : rng_(seed) {}

  float Next(float scale) {
    const float unit = static_cast<float>(rng_() >> 40) * 0x1p-24f;
    return (2.0f * unit - 1.0f) * scale;
  }
  std::vector<float> Fill(size_t n, float scale) {
    std::vector<float> out(n);
    for (float& x : out) x = Next(scale);
    return out;
  }
  // An input-to-output matrix with variance gain^2 / fan_in.
  std::vector<float> Matrix(int32_t fan_in, int32_t fan_out, float gain = 1) {
    const float scale = gain * std::sqrt(3.0f / static_cast<float>(fan_in));
    return Fill(static_cast<size_t>(fan_in) * fan_out, scale);
  }
  std::vector<float> NormWeights(int32_t n) {
    std::vector<float> out = Fill(static_cast<size_t>(n), 0.1f);
    for (float& x : out) x += 1.0f;
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------------------
// Kernels. Every output is its own chain of separately rounded products and
// sums in a fixed order; vectorisation (GCC/Clang vector extensions, plain
// SSE/NEON lanes) runs only across independent outputs, so a value never
// depends on how many outputs are computed or where their run starts.

using Float4 = float __attribute__((vector_size(16)));

inline Float4 Load4(const float* p) {
  Float4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void Store4(float* p, Float4 v) { std::memcpy(p, &v, sizeof(v)); }

// Sixteen outputs in four registers (named, so they stay in registers).
void MatVec16(const float* x, int64_t n_in, const float* w, int64_t stride,
              float* y) {
  Float4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (int64_t i = 0; i < n_in; ++i) {
    const Float4 xi = {x[i], x[i], x[i], x[i]};
    const float* row = w + i * stride;
    a0 += xi * Load4(row);
    a1 += xi * Load4(row + 4);
    a2 += xi * Load4(row + 8);
    a3 += xi * Load4(row + 12);
  }
  Store4(y, a0);
  Store4(y + 4, a1);
  Store4(y + 8, a2);
  Store4(y + 12, a3);
}

void MatVec4(const float* x, int64_t n_in, const float* w, int64_t stride,
             float* y) {
  Float4 a = {};
  for (int64_t i = 0; i < n_in; ++i) {
    const Float4 xi = {x[i], x[i], x[i], x[i]};
    a += xi * Load4(w + i * stride);
  }
  Store4(y, a);
}

// y[o] = sum over i = 0, 1, ... of x[i] * w[i * stride + o], o < n_out.
void MatVec(const float* x, int64_t n_in, const float* w, int64_t stride,
            int64_t n_out, float* y) {
  int64_t o = 0;
  for (; o + 16 <= n_out; o += 16) MatVec16(x, n_in, w + o, stride, y + o);
  for (; o + 4 <= n_out; o += 4) MatVec4(x, n_in, w + o, stride, y + o);
  for (; o < n_out; ++o) {
    float acc = 0;
    for (int64_t i = 0; i < n_in; ++i) acc += x[i] * w[i * stride + o];
    y[o] = acc;
  }
}

void RmsNorm(const float* x, const float* weight, int64_t n, float* out) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + kRmsEps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

void AddTo(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// ---------------------------------------------------------------------------
// Input checks.

Status CheckPositive(const char* field, int64_t value) {
  if (value > 0) return Status::Ok();
  return Invalid(std::string(field) + " must be positive, got " +
                 std::to_string(value));
}

// Per query, the keys [begin, end) it attends to, causality applied.
StatusOr<std::vector<TokenRange>> KeyRangesPerQuery(
    std::span<const AttentionSpan> spans, int64_t n) {
  std::vector<TokenRange> out(static_cast<size_t>(n), TokenRange{0, -1});
  if (spans.empty()) {
    for (int64_t q = 0; q < n; ++q) out[static_cast<size_t>(q)] = {0, q + 1};
    return out;
  }
  for (const AttentionSpan& s : spans) {
    if (s.queries.begin < 0 || s.queries.end > n ||
        s.queries.begin > s.queries.end || s.keys.begin < 0 ||
        s.keys.begin > s.keys.end) {
      return Invalid("attention span out of [0, " + std::to_string(n) + ")");
    }
    for (int64_t q = s.queries.begin; q < s.queries.end; ++q) {
      TokenRange& r = out[static_cast<size_t>(q)];
      if (r.end >= 0) {
        return Invalid("query " + std::to_string(q) +
                       " is in two attention spans; one span per query");
      }
      r = {s.keys.begin, std::min(s.keys.end, q + 1)};
      if (r.begin >= r.end) {
        return Invalid("query " + std::to_string(q) + " attends to no key");
      }
    }
  }
  for (int64_t q = 0; q < n; ++q) {
    if (out[static_cast<size_t>(q)].end < 0) {
      return Invalid("query " + std::to_string(q) + " is in no attention span");
    }
  }
  return out;
}

// Per token, 1 if it is in a cached range; checks the ranges.
StatusOr<std::vector<uint8_t>> CachedFlags(std::span<const TokenRange> cached,
                                           int64_t n, int32_t num_logits) {
  std::vector<uint8_t> flags(static_cast<size_t>(n), 0);
  int64_t previous_end = 0;
  for (const TokenRange& r : cached) {
    if (r.begin < previous_end || r.end <= r.begin || r.end > n) {
      return Invalid(
          "cached ranges must be sorted, disjoint, non-empty and "
          "inside [0, " +
          std::to_string(n) + ")");
    }
    std::fill(flags.begin() + r.begin, flags.begin() + r.end, 1);
    previous_end = r.end;
  }
  if (previous_end > n - num_logits) {
    return Invalid("the last " + std::to_string(num_logits) +
                   " tokens need logits, so they cannot be cached");
  }
  return flags;
}

Status CheckTokensAndSlots(const ReferenceModelConfig& config,
                           const PrefillInput& in, const PagedKvCache& cache) {
  const size_t n = in.tokens.size();
  if (n == 0) return Invalid("no tokens");
  for (size_t i = 0; i < n; ++i) {
    if (in.tokens[i] >= static_cast<TokenId>(config.vocab_size)) {
      return Invalid("token " + std::to_string(i) + " has id " +
                     std::to_string(in.tokens[i]) + ", past the vocabulary");
    }
  }
  if (in.slots.size() != n) {
    return Invalid(std::to_string(in.slots.size()) + " slots for " +
                   std::to_string(n) + " tokens");
  }
  for (size_t i = 0; i < n; ++i) {
    if (in.slots[i] < 0 || in.slots[i] >= cache.num_slots()) {
      return Invalid("slot " + std::to_string(in.slots[i]) + " of token " +
                     std::to_string(i) + " is outside the cache");
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> Positions(const PrefillInput& in) {
  const auto n = static_cast<int64_t>(in.tokens.size());
  if (!in.positions.empty() && in.positions.size() != in.tokens.size()) {
    return Invalid(std::to_string(in.positions.size()) + " positions for " +
                   std::to_string(n) + " tokens");
  }
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = in.positions.empty()
                          ? in.start_position + i
                          : in.positions[static_cast<size_t>(i)];
    if (p < 0 || p >= kMaxRopePosition || in.start_position < 0) {
      return Invalid("position of token " + std::to_string(i) +
                     " is negative or past 2^48");
    }
    out[static_cast<size_t>(i)] = p;
  }
  return out;
}

Status CheckCacheShape(const ReferenceModelConfig& config,
                       const PagedKvCache& cache) {
  const KvLayout& l = cache.layout();
  if (l.num_layers != config.num_layers ||
      l.num_kv_heads != config.num_kv_heads || l.head_dim != config.head_dim) {
    return Invalid("cache layout " + l.ToString() + " does not fit the model");
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------
// Config.

Status ReferenceModelConfig::Validate() const {
  TIERKV_RETURN_IF_ERROR(CheckPositive("vocab_size", vocab_size));
  TIERKV_RETURN_IF_ERROR(CheckPositive("hidden_size", hidden_size));
  TIERKV_RETURN_IF_ERROR(CheckPositive("num_layers", num_layers));
  TIERKV_RETURN_IF_ERROR(CheckPositive("num_heads", num_heads));
  TIERKV_RETURN_IF_ERROR(CheckPositive("num_kv_heads", num_kv_heads));
  TIERKV_RETURN_IF_ERROR(CheckPositive("head_dim", head_dim));
  TIERKV_RETURN_IF_ERROR(CheckPositive("ffn_size", ffn_size));
  if (num_heads % num_kv_heads != 0) {
    return Invalid("num_kv_heads must divide num_heads");
  }
  // A test model: every size below 2^16 and at most 2^28 weights (1 GiB),
  // so no size computation overflows.
  for (int32_t size :
       {vocab_size, hidden_size, num_layers, num_heads, head_dim, ffn_size}) {
    if (size >= (1 << 16)) return Invalid("a size is 2^16 or more");
  }
  const int64_t h = hidden_size;
  const int64_t per_layer = h * (num_heads + 2 * num_kv_heads) * head_dim +
                            num_heads * head_dim * h + 3 * h * ffn_size;
  if (2 * vocab_size * h + num_layers * per_layer > (int64_t{1} << 28)) {
    return Invalid("more than 2^28 weights; this is a test model");
  }
  return Rope().Validate();
}

RopeConfig ReferenceModelConfig::Rope() const {
  RopeConfig rope;
  rope.head_dim = head_dim;
  rope.rotary_dim = head_dim;
  rope.theta = rope_theta;
  rope.style = rope_style;
  return rope;
}

KvLayout ReferenceModelConfig::CacheLayout(int32_t block_size,
                                           DType dtype) const {
  return KvLayout{.num_layers = num_layers,
                  .num_kv_heads = num_kv_heads,
                  .head_dim = head_dim,
                  .block_size = block_size,
                  .dtype = dtype};
}

// ---------------------------------------------------------------------------
// PagedKvCache.

StatusOr<PagedKvCache> PagedKvCache::Create(const KvLayout& layout,
                                            int64_t num_blocks) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  if (num_blocks < 1 ||
      num_blocks > kMaxBytes / static_cast<int64_t>(layout.BlockBytes())) {
    return Status::InvalidArgument("KV cache of " + std::to_string(num_blocks) +
                                   " blocks: need at least 1, at most 1 TiB");
  }
  return PagedKvCache(layout, num_blocks);
}

PagedKvCache::PagedKvCache(const KvLayout& layout, int64_t num_blocks)
    : layout_(layout),
      num_blocks_(num_blocks),
      bytes_(static_cast<size_t>(num_blocks) * layout.BlockBytes()) {}

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

// ---------------------------------------------------------------------------
// ReferenceModel.

StatusOr<ReferenceModel> ReferenceModel::Create(
    const ReferenceModelConfig& config) {
  TIERKV_RETURN_IF_ERROR(config.Validate());
  return ReferenceModel(config, RandomWeights(config));
}

ReferenceModel::ReferenceModel(const ReferenceModelConfig& config,
                               Weights weights)
    : config_(config),
      rope_(config.Rope()),
      inv_freq_(InverseFrequencies(rope_)),
      weights_(std::move(weights)) {}

ReferenceModel::Weights ReferenceModel::RandomWeights(
    const ReferenceModelConfig& c) {
  UniformSource rng(c.seed);
  const int32_t h = c.hidden_size;
  const int32_t q_width = c.num_heads * c.head_dim;
  const int32_t kv_width = c.num_kv_heads * c.head_dim;
  Weights w;
  w.embedding = rng.Fill(static_cast<size_t>(c.vocab_size) * h, 1.0f);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = rng.NormWeights(h);
    lw.wq = rng.Matrix(h, q_width, kQkGain);
    lw.wk = rng.Matrix(h, kv_width, kQkGain);
    lw.wv = rng.Matrix(h, kv_width);
    lw.wo = rng.Matrix(q_width, h);
    lw.mlp_norm = rng.NormWeights(h);
    lw.w_gate = rng.Matrix(h, c.ffn_size);
    lw.w_up = rng.Matrix(h, c.ffn_size);
    lw.w_down = rng.Matrix(c.ffn_size, h);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = rng.NormWeights(h);
  w.lm_head = rng.Matrix(h, c.vocab_size);
  return w;
}

// One Prefill: per layer, the active tokens' K/V are projected and stored,
// every token's K/V is gathered back from the cache, and the active tokens
// attend and run the MLP. Arrays are indexed by sequence position.
class ReferenceModel::Forward {
 public:
  Forward(const ReferenceModel& model, const PrefillInput& in,
          PagedKvCache* cache)
      : m_(model),
        c_(model.config_),
        in_(in),
        cache_(cache),
        n_(static_cast<int64_t>(in.tokens.size())),
        q_width_(c_.num_heads * c_.head_dim),
        kv_width_(c_.num_kv_heads * c_.head_dim) {}

  StatusOr<PrefillOutput> Run();

 private:
  Status Prepare();
  void Embed();
  Status RunLayer(int32_t layer);
  Status ProjectKv(int32_t layer);
  Status SelectRecompute();
  void StoreKv(int32_t layer);
  void RecordKv();
  void GatherKv(int32_t layer);
  Status Attend(int32_t layer, int64_t t);
  void AttendHead(int64_t t, int32_t head, const float* q, float* out);
  void Mlp(int32_t layer, int64_t t);
  void Logits();

  float* Row(std::vector<float>& v, int64_t t, int64_t width) {
    return v.data() + t * width;
  }

  const ReferenceModel& m_;
  const ReferenceModelConfig& c_;
  const PrefillInput& in_;
  PagedKvCache* cache_;
  const int64_t n_;
  const int32_t q_width_;
  const int32_t kv_width_;

  std::vector<int64_t> positions_;
  std::vector<TokenRange> key_ranges_;
  std::vector<uint8_t> cached_;
  std::vector<int64_t> active_;       // Tokens computed in the current layer.
  std::vector<float> hidden_;         // n x hidden.
  std::vector<float> normed_;         // n x hidden.
  std::vector<float> k_, k_raw_, v_;  // n x kv width, this layer.
  std::vector<float> kt_;             // [kv head][dim][token]: K gathered.
  std::vector<float> vg_;             // [token][kv width]: V gathered.
  std::vector<float> scores_;         // n.
  PrefillOutput out_;
};

Status ReferenceModel::Forward::Prepare() {
  TIERKV_RETURN_IF_ERROR(CheckCacheShape(c_, *cache_));
  TIERKV_RETURN_IF_ERROR(CheckTokensAndSlots(c_, in_, *cache_));
  if (in_.num_logits < 0 || in_.num_logits > n_) {
    return Invalid("num_logits " + std::to_string(in_.num_logits) + " for " +
                   std::to_string(n_) + " tokens");
  }
  if (in_.blend.has_value()) {
    TIERKV_RETURN_IF_ERROR(in_.blend->Validate(c_.num_layers));
  }
  TIERKV_ASSIGN_OR_RETURN(positions_, Positions(in_));
  TIERKV_ASSIGN_OR_RETURN(key_ranges_, KeyRangesPerQuery(in_.spans, n_));
  TIERKV_ASSIGN_OR_RETURN(cached_, CachedFlags(in_.cached, n_, in_.num_logits));
  for (int64_t t = 0; t < n_; ++t) {
    // CacheBlend recomputes every token until its check layer.
    if (in_.blend.has_value() || !cached_[static_cast<size_t>(t)]) {
      active_.push_back(t);
    }
  }
  const auto n = static_cast<size_t>(n_);
  hidden_.assign(n * c_.hidden_size, 0.0f);
  normed_.assign(n * c_.hidden_size, 0.0f);
  k_.assign(n * kv_width_, 0.0f);
  k_raw_.assign(n * kv_width_, 0.0f);
  v_.assign(n * kv_width_, 0.0f);
  kt_.assign(n * kv_width_, 0.0f);
  vg_.assign(n * kv_width_, 0.0f);
  scores_.assign(n, 0.0f);
  return Status::Ok();
}

StatusOr<PrefillOutput> ReferenceModel::Forward::Run() {
  TIERKV_RETURN_IF_ERROR(Prepare());
  Embed();
  for (int32_t layer = 0; layer < c_.num_layers; ++layer) {
    TIERKV_RETURN_IF_ERROR(RunLayer(layer));
  }
  Logits();
  out_.computed_tokens = static_cast<int64_t>(active_.size());
  return std::move(out_);
}

void ReferenceModel::Forward::Embed() {
  const int32_t h = c_.hidden_size;
  for (int64_t t : active_) {
    const float* e = m_.weights_.embedding.data() + size_t{in_.tokens[t]} * h;
    std::copy(e, e + h, Row(hidden_, t, h));
  }
}

Status ReferenceModel::Forward::RunLayer(int32_t layer) {
  TIERKV_RETURN_IF_ERROR(ProjectKv(layer));
  if (in_.blend.has_value() && in_.blend->check_layer == layer) {
    TIERKV_RETURN_IF_ERROR(SelectRecompute());
  }
  StoreKv(layer);
  if (in_.return_kv) RecordKv();
  GatherKv(layer);
  for (int64_t t : active_) {
    TIERKV_RETURN_IF_ERROR(Attend(layer, t));
    Mlp(layer, t);
  }
  return Status::Ok();
}

Status ReferenceModel::Forward::ProjectKv(int32_t layer) {
  const LayerWeights& w = m_.weights_.layers[static_cast<size_t>(layer)];
  const int32_t h = c_.hidden_size;
  for (int64_t t : active_) {
    float* x = Row(normed_, t, h);
    RmsNorm(Row(hidden_, t, h), w.attn_norm.data(), h, x);
    float* k = Row(k_, t, kv_width_);
    MatVec(x, h, w.wk.data(), kv_width_, kv_width_, Row(k_raw_, t, kv_width_));
    MatVec(x, h, w.wv.data(), kv_width_, kv_width_, Row(v_, t, kv_width_));
    std::copy_n(Row(k_raw_, t, kv_width_), kv_width_, k);
    for (int32_t g = 0; g < c_.num_kv_heads; ++g) {
      TIERKV_RETURN_IF_ERROR(
          ApplyRope(m_.rope_, m_.inv_freq_, positions_[t],
                    std::span<float>(k + g * c_.head_dim, c_.head_dim)));
    }
  }
  return Status::Ok();
}

// CacheBlend at the check layer: fresh K of the cached tokens against the K
// in the cache; the picked ones stay active with the uncached tokens.
Status ReferenceModel::Forward::SelectRecompute() {
  std::vector<int64_t> candidates;
  for (int64_t t : active_) {
    if (cached_[static_cast<size_t>(t)]) candidates.push_back(t);
  }
  const size_t width = static_cast<size_t>(kv_width_);
  std::vector<float> fresh(candidates.size() * width);
  std::vector<float> stored(candidates.size() * width);
  const int32_t layer = in_.blend->check_layer;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int64_t t = candidates[i];
    std::copy_n(Row(k_, t, kv_width_), width, fresh.data() + i * width);
    cache_->Read(in_.slots[t], layer, KvPlane::kKey,
                 std::span<float>(stored.data() + i * width, width));
  }
  TIERKV_ASSIGN_OR_RETURN(std::vector<double> deviation,
                          KeyDeviations(fresh, stored, kv_width_));
  TIERKV_ASSIGN_OR_RETURN(
      std::vector<int64_t> picked,
      SelectRecomputeTokens(deviation, in_.blend->recompute_ratio));
  std::vector<uint8_t> keep(static_cast<size_t>(n_), 0);
  for (int64_t i : picked) {
    out_.recomputed.push_back(candidates[static_cast<size_t>(i)]);
    keep[static_cast<size_t>(candidates[static_cast<size_t>(i)])] = 1;
  }
  std::erase_if(active_, [&](int64_t t) {
    return cached_[static_cast<size_t>(t)] && !keep[static_cast<size_t>(t)];
  });
  return Status::Ok();
}

void ReferenceModel::Forward::StoreKv(int32_t layer) {
  for (int64_t t : active_) {
    cache_->Write(in_.slots[t], layer, KvPlane::kKey,
                  std::span<const float>(Row(k_, t, kv_width_), kv_width_));
    cache_->Write(in_.slots[t], layer, KvPlane::kValue,
                  std::span<const float>(Row(v_, t, kv_width_), kv_width_));
  }
}

void ReferenceModel::Forward::RecordKv() {
  LayerKv record;
  record.tokens = active_;
  for (int64_t t : active_) {
    auto append = [&](std::vector<float>& from, std::vector<float>& to) {
      const float* row = Row(from, t, kv_width_);
      to.insert(to.end(), row, row + kv_width_);
    };
    append(k_, record.k);
    append(k_raw_, record.k_unrotated);
    append(v_, record.v);
  }
  out_.layers.push_back(std::move(record));
}

void ReferenceModel::Forward::GatherKv(int32_t layer) {
  std::vector<float> k(static_cast<size_t>(kv_width_));
  for (int64_t t = 0; t < n_; ++t) {
    cache_->Read(in_.slots[t], layer, KvPlane::kKey, k);
    cache_->Read(in_.slots[t], layer, KvPlane::kValue,
                 std::span<float>(Row(vg_, t, kv_width_), kv_width_));
    for (int32_t e = 0; e < kv_width_; ++e) kt_[e * n_ + t] = k[e];
  }
}

Status ReferenceModel::Forward::Attend(int32_t layer, int64_t t) {
  const LayerWeights& w = m_.weights_.layers[static_cast<size_t>(layer)];
  const int32_t h = c_.hidden_size;
  std::vector<float> q(static_cast<size_t>(q_width_));
  std::vector<float> attn(static_cast<size_t>(q_width_));
  std::vector<float> o(static_cast<size_t>(h));
  MatVec(Row(normed_, t, h), h, w.wq.data(), q_width_, q_width_, q.data());
  for (int32_t head = 0; head < c_.num_heads; ++head) {
    std::span<float> qh(q.data() + head * c_.head_dim, c_.head_dim);
    TIERKV_RETURN_IF_ERROR(
        ApplyRope(m_.rope_, m_.inv_freq_, positions_[t], qh));
    AttendHead(t, head, qh.data(), attn.data() + head * c_.head_dim);
  }
  MatVec(attn.data(), q_width_, w.wo.data(), h, h, o.data());
  AddTo(o.data(), h, Row(hidden_, t, h));
  return Status::Ok();
}

// Softmax(q K^T / sqrt(d)) V over the query's key range, one head.
void ReferenceModel::Forward::AttendHead(int64_t t, int32_t head,
                                         const float* q, float* out) {
  const int32_t d = c_.head_dim;
  const int32_t g = head / (c_.num_heads / c_.num_kv_heads);
  const TokenRange keys = key_ranges_[static_cast<size_t>(t)];
  const int64_t len = keys.size();
  float* s = scores_.data();
  MatVec(q, d, kt_.data() + static_cast<int64_t>(g) * d * n_ + keys.begin, n_,
         len, s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < len; ++j) {
    s[j] *= scale;
    max = std::max(max, s[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < len; ++j) {
    s[j] = std::exp(s[j] - max);
    sum += s[j];
  }
  MatVec(s, len, vg_.data() + keys.begin * kv_width_ + g * d, kv_width_, d,
         out);
  for (int32_t e = 0; e < d; ++e) out[e] /= sum;
}

void ReferenceModel::Forward::Mlp(int32_t layer, int64_t t) {
  const LayerWeights& w = m_.weights_.layers[static_cast<size_t>(layer)];
  const int32_t h = c_.hidden_size;
  const int32_t f = c_.ffn_size;
  std::vector<float> x(static_cast<size_t>(h)), down(static_cast<size_t>(h));
  std::vector<float> gate(static_cast<size_t>(f)), up(static_cast<size_t>(f));
  RmsNorm(Row(hidden_, t, h), w.mlp_norm.data(), h, x.data());
  MatVec(x.data(), h, w.w_gate.data(), f, f, gate.data());
  MatVec(x.data(), h, w.w_up.data(), f, f, up.data());
  for (int32_t i = 0; i < f; ++i) {
    gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];  // SiLU * up.
  }
  MatVec(gate.data(), f, w.w_down.data(), h, h, down.data());
  AddTo(down.data(), h, Row(hidden_, t, h));
}

void ReferenceModel::Forward::Logits() {
  const int32_t h = c_.hidden_size;
  const int32_t v = c_.vocab_size;
  out_.logits.assign(static_cast<size_t>(in_.num_logits) * v, 0.0f);
  std::vector<float> x(static_cast<size_t>(h));
  for (int64_t i = 0; i < in_.num_logits; ++i) {
    const int64_t t = n_ - in_.num_logits + i;
    RmsNorm(Row(hidden_, t, h), m_.weights_.final_norm.data(), h, x.data());
    MatVec(x.data(), h, m_.weights_.lm_head.data(), v, v,
           out_.logits.data() + i * v);
  }
}

StatusOr<PrefillOutput> ReferenceModel::Prefill(const PrefillInput& input,
                                                PagedKvCache* cache) const {
  if (cache == nullptr) return Invalid("no KV cache");
  return Forward(*this, input, cache).Run();
}

// ---------------------------------------------------------------------------
// Prefix caching.

StatusOr<PrefillOutput> PrefixCachedPrefill(const ReferenceModel& model,
                                            KVCacheManager* manager,
                                            const Request& request,
                                            PagedKvCache* pool_cache,
                                            int32_t num_logits,
                                            int32_t* hit_tokens) {
  const BlockPool& pool = PoolOf(*manager);
  if (pool_cache->num_blocks() < pool.num_blocks() ||
      pool_cache->layout().block_size != pool.block_size()) {
    return Invalid("the pool's KV cache must have one block per pool block");
  }
  const ComputedBlocks computed = manager->GetComputedBlocks(request);
  TIERKV_RETURN_IF_ERROR(
      manager
          ->AllocateSlots(request, request.num_tokens() - computed.num_tokens,
                          computed)
          .status());
  std::span<const BlockId> blocks = manager->blocks(request.id());
  TIERKV_ASSIGN_OR_RETURN(
      std::vector<int64_t> slots,
      SlotMappingForBlocks(blocks, pool.block_size(), 0, request.num_tokens()));
  std::vector<TokenRange> cached;
  if (computed.num_tokens > 0) cached.push_back({0, computed.num_tokens});
  if (hit_tokens != nullptr) *hit_tokens = computed.num_tokens;
  PrefillInput in{.tokens = request.tokens(),
                  .slots = slots,
                  .cached = cached,
                  .num_logits = num_logits};
  return model.Prefill(in, pool_cache);
}

// ---------------------------------------------------------------------------
// Chunks.

StatusOr<AssembledPrompt> AssemblePrompt(std::span<const TokenId> prompt,
                                         std::span<const TokenId> separator) {
  TIERKV_ASSIGN_OR_RETURN(PromptSplit split, SplitPrompt(prompt, separator));
  AssembledPrompt out;
  out.layout = AssembledLayout(split);
  TIERKV_ASSIGN_OR_RETURN(out.spans, BuildAttentionSpans(out.layout));
  for (const PromptSegment& segment : split.segments()) {
    const auto begin = static_cast<int64_t>(out.tokens.size());
    std::span<const TokenId> tokens = SegmentTokens(prompt, segment);
    out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
    const TokenRange range{begin, static_cast<int64_t>(out.tokens.size())};
    if (segment.kind == SegmentKind::kQuestion) {
      out.question = range;
    } else {
      out.chunks.push_back(range);
    }
  }
  return out;
}

StatusOr<ChunkKvStore> ChunkKvStore::Create(
    const ReferenceModel& model, const ChunkKvStoreOptions& options) {
  const KvLayout layout =
      model.config().CacheLayout(options.block_size, options.dtype);
  if (options.virtual_start < 0 || options.virtual_start >= kMaxRopePosition) {
    return Status::InvalidArgument("chunk store: virtual_start " +
                                   std::to_string(options.virtual_start) +
                                   " is negative or past 2^48");
  }
  TIERKV_ASSIGN_OR_RETURN(
      BlockPool pool, BlockPool::Create({.num_blocks = options.num_blocks,
                                         .block_size = options.block_size}));
  TIERKV_ASSIGN_OR_RETURN(PagedKvCache cache,
                          PagedKvCache::Create(layout, options.num_blocks));
  TIERKV_ASSIGN_OR_RETURN(RopeRemap remap,
                          RopeRemap::Create(layout, model.config().Rope()));
  return ChunkKvStore(model, options, std::move(pool), std::move(cache),
                      std::move(remap));
}

ChunkKvStore::ChunkKvStore(const ReferenceModel& model,
                           const ChunkKvStoreOptions& options, BlockPool pool,
                           PagedKvCache cache, RopeRemap remap)
    : model_(&model),
      hasher_(options.key_namespace),
      virtual_start_(options.virtual_start),
      pool_(std::move(pool)),
      cache_(std::move(cache)),
      remap_(std::move(remap)) {}

namespace {

// Tokens of block j of a chunk.
std::span<const TokenId> ChunkBlockTokens(std::span<const TokenId> chunk,
                                          int32_t block_size, size_t j) {
  const size_t begin = j * static_cast<size_t>(block_size);
  return chunk.subspan(
      begin, std::min(chunk.size() - begin, static_cast<size_t>(block_size)));
}

}  // namespace

bool ChunkKvStore::Contains(std::span<const TokenId> chunk) const {
  const int32_t bs = pool_.block_size();
  const std::vector<BlockKey> keys = hasher_.ChunkKeys(chunk, bs);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!pool_.GetCachedBlock(keys[j], ChunkBlockTokens(chunk, bs, j))) {
      return false;
    }
  }
  return !keys.empty();
}

std::vector<BlockId> ChunkKvStore::Acquire(std::span<const TokenId> chunk) {
  const int32_t bs = pool_.block_size();
  const std::vector<BlockKey> keys = hasher_.ChunkKeys(chunk, bs);
  std::vector<BlockId> blocks;
  for (size_t j = 0; j < keys.size(); ++j) {
    std::optional<BlockId> hit =
        pool_.GetCachedBlock(keys[j], ChunkBlockTokens(chunk, bs, j));
    if (!hit.has_value()) return FetchFromTier(chunk, keys);
    blocks.push_back(*hit);
  }
  pool_.Touch(blocks);
  ++stats_.pool_hits;
  return blocks;
}

std::vector<BlockId> ChunkKvStore::FetchFromTier(
    std::span<const TokenId> chunk, std::span<const BlockKey> keys) {
  if (tier_ == nullptr || keys.empty()) return {};
  std::vector<BlockId> blocks;
  bool pool_full = false;
  const ChunkSource::AllocateBlocks allocate =
      [&](int32_t n) -> StatusOr<std::vector<BlockId>> {
    if (n != static_cast<int32_t>(keys.size())) {
      return Status::Internal("chunk tier asked for " + std::to_string(n) +
                              " blocks for a chunk of " +
                              std::to_string(keys.size()));
    }
    if (Status got = pool_.GetNewBlocks(n, &blocks); !got.ok()) {
      pool_full = true;
      return got;
    }
    return blocks;
  };
  StatusOr<bool> fetched = tier_->Fetch(chunk, allocate);
  const int32_t bs = pool_.block_size();
  Status status = fetched.status();
  if (status.ok() && *fetched) {
    // Keyed only now: a lookup never sees a block still being copied.
    for (size_t j = 0; j < keys.size() && status.ok(); ++j) {
      status =
          pool_.CacheBlock(blocks[j], keys[j], ChunkBlockTokens(chunk, bs, j));
    }
  }
  if (status.ok() && *fetched) {
    ++stats_.tier_hits;
    return blocks;
  }
  // A miss, or blocks whose contents are unknown: back to the pool unkeyed.
  Release(blocks);
  if (pool_full) {
    ++stats_.pool_full;  // The tier below did its part.
  } else if (!status.ok()) {
    CountTierError(std::move(status));
  }
  return {};
}

void ChunkKvStore::CountTierError(Status status) {
  ++stats_.tier_errors;
  last_tier_error_ = std::move(status);
}

ChunkStoreStats ChunkKvStore::stats() const {
  ChunkStoreStats out = stats_;
  out.evictions = pool_.stats().evictions;
  return out;
}

StatusOr<std::vector<BlockId>> ChunkKvStore::ComputeAndInsert(
    std::span<const TokenId> chunk) {
  if (chunk.empty()) return Status::InvalidArgument("chunk store: empty chunk");
  const int32_t bs = pool_.block_size();
  const std::vector<BlockKey> keys = hasher_.ChunkKeys(chunk, bs);
  std::vector<BlockId> blocks;
  TIERKV_RETURN_IF_ERROR(
      pool_.GetNewBlocks(static_cast<int32_t>(keys.size()), &blocks));
  const auto n = static_cast<int32_t>(chunk.size());
  StatusOr<std::vector<int64_t>> slots = SlotMappingForBlocks(blocks, bs, 0, n);
  Status status = slots.status();
  if (status.ok()) {
    PrefillInput in{.tokens = chunk,
                    .slots = *slots,
                    .start_position = virtual_start_,
                    .num_logits = 0};
    status = model_->Prefill(in, &cache_).status();
  }
  for (size_t j = 0; j < keys.size() && status.ok(); ++j) {
    status =
        pool_.CacheBlock(blocks[j], keys[j], ChunkBlockTokens(chunk, bs, j));
  }
  if (!status.ok()) {
    Release(blocks);
    return status;
  }
  ++stats_.computed;
  if (tier_ != nullptr) {
    if (Status published = tier_->Publish(chunk, blocks); published.ok()) {
      ++stats_.published;
    } else {
      CountTierError(std::move(published));
    }
  }
  return blocks;
}

void ChunkKvStore::Release(std::span<const BlockId> blocks) {
  std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  pool_.FreeBlocks(reversed);
}

Status ChunkKvStore::Place(std::span<const BlockId> blocks, int32_t num_tokens,
                           std::span<const int64_t> dst_slots,
                           int64_t real_start, PagedKvCache* dst) const {
  if (dst->layout() != cache_.layout()) {
    return Status::InvalidArgument("chunk store: destination layout " +
                                   dst->layout().ToString() +
                                   " != " + cache_.layout().ToString());
  }
  std::vector<const std::byte*> src;
  for (BlockId id : blocks) {
    if (id < 0 || id >= cache_.num_blocks()) {
      return Status::InvalidArgument("chunk store: no block " +
                                     std::to_string(id));
    }
    src.push_back(cache_.block(id));
  }
  RemapRequest r;
  r.src_blocks = src;
  r.num_tokens = num_tokens;
  r.virtual_start = virtual_start_;
  r.dst_base = dst->base();
  r.dst_num_blocks = dst->num_blocks();
  r.dst_slots = dst_slots;
  r.real_start = real_start;
  return remap_.Remap(r);
}

namespace {

// Fetches or computes one chunk and places it at its range of `dst`.
Status PlaceChunk(ChunkKvStore* store, std::span<const TokenId> tokens,
                  const TokenRange& range, std::span<const int64_t> slots,
                  PagedKvCache* dst, ChunkedPrefillResult* result) {
  std::span<const TokenId> chunk = std::span(tokens).subspan(
      static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
  std::vector<BlockId> blocks = store->Acquire(chunk);
  if (blocks.empty()) {
    ++result->chunk_misses;
    TIERKV_ASSIGN_OR_RETURN(blocks, store->ComputeAndInsert(chunk));
  } else {
    ++result->chunk_hits;
  }
  Status status = store->Place(blocks, static_cast<int32_t>(range.size()),
                               slots.subspan(static_cast<size_t>(range.begin),
                                             static_cast<size_t>(range.size())),
                               range.begin, dst);
  store->Release(blocks);
  return status;
}

}  // namespace

namespace {

// Places every chunk of result->prompt at `slots` of `dst`, then prefills
// the question there.
Status PrefillAssembled(const ReferenceModel& model, ChunkKvStore* store,
                        std::span<const int64_t> slots,
                        const ChunkedPrefillOptions& options, PagedKvCache* dst,
                        ChunkedPrefillResult* result) {
  const AssembledPrompt& p = result->prompt;
  for (const TokenRange& range : p.chunks) {
    TIERKV_RETURN_IF_ERROR(
        PlaceChunk(store, p.tokens, range, slots, dst, result));
  }
  const std::vector<TokenRange> cached = {{0, p.question.begin}};
  PrefillInput in{.tokens = p.tokens,
                  .slots = slots,
                  .cached = cached,
                  .blend = options.blend,
                  .num_logits = options.num_logits,
                  .return_kv = options.return_kv};
  // CacheBlend recomputes toward full causal attention; seed 000 keeps the
  // chunks isolated.
  if (!options.blend.has_value()) in.spans = p.spans;
  TIERKV_ASSIGN_OR_RETURN(result->output, model.Prefill(in, dst));
  return Status::Ok();
}

}  // namespace

StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, PagedKvCache* dst) {
  ChunkedPrefillResult result;
  TIERKV_ASSIGN_OR_RETURN(result.prompt, AssemblePrompt(prompt, separator));
  const auto n = static_cast<int64_t>(result.prompt.tokens.size());
  if (dst->num_slots() < n) {
    return Status::InvalidArgument("chunked prefill: " + std::to_string(n) +
                                   " tokens do not fit the destination");
  }
  std::vector<int64_t> slots(static_cast<size_t>(n));
  std::iota(slots.begin(), slots.end(), 0);
  TIERKV_RETURN_IF_ERROR(
      PrefillAssembled(model, store, slots, options, dst, &result));
  return result;
}

StatusOr<ChunkedPrefillResult> ChunkedPrefill(
    const ReferenceModel& model, ChunkKvStore* store,
    std::span<const TokenId> prompt, std::span<const TokenId> separator,
    const ChunkedPrefillOptions& options, MainKvPool main) {
  if (main.manager == nullptr || main.memory == nullptr ||
      main.memory->num_blocks() < PoolOf(*main.manager).num_blocks() ||
      main.memory->layout().block_size != PoolOf(*main.manager).block_size()) {
    return Status::InvalidArgument(
        "chunked prefill: the main pool's memory must hold one block of its "
        "block size per pool block");
  }
  ChunkedPrefillResult result;
  TIERKV_ASSIGN_OR_RETURN(result.prompt, AssemblePrompt(prompt, separator));
  const int32_t bs = main.memory->layout().block_size;
  const auto n = static_cast<int32_t>(result.prompt.tokens.size());
  TIERKV_ASSIGN_OR_RETURN(result.main_blocks,
                          main.manager->AllocateRemapBlocks((n + bs - 1) / bs));
  StatusOr<std::vector<int64_t>> slots =
      SlotMappingForBlocks(result.main_blocks, bs, 0, n);
  Status status = slots.status();
  if (status.ok()) {
    status =
        PrefillAssembled(model, store, *slots, options, main.memory, &result);
  }
  if (!status.ok()) {
    main.manager->ReleaseRemappedBlocks(result.main_blocks);
    return status;
  }
  return result;
}

}  // namespace tierkv
