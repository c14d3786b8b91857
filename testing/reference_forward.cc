// ReferenceModel::Prefill: the checks of its input and one forward pass
// (ReferenceModel::Forward).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "src/rope_remap.h"
#include "testing/reference_model.h"
#include "testing/reference_model_internal.h"

namespace tierkv {
namespace {

using reference_internal::Invalid;

constexpr float kRmsEps = 1e-5f;

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

StatusOr<std::vector<int64_t>> Positions(const PrefillInput& in,
                                         int32_t context_length) {
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
    if (context_length > 0 && p >= context_length) {
      return Invalid("position " + std::to_string(p) + " of token " +
                     std::to_string(i) + " is past the model's context of " +
                     std::to_string(context_length));
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
  TIERKV_ASSIGN_OR_RETURN(positions_, Positions(in_, c_.context_length));
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

}  // namespace tierkv
