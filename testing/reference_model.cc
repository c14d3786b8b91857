#include "testing/reference_model.h"

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>

#include "testing/reference_model_internal.h"

namespace tierkv {
namespace reference_internal {

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("reference model: " + what);
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return Status::Internal("cannot read " + path);
  return std::move(bytes).str();
}

}  // namespace reference_internal

namespace {

using reference_internal::Invalid;

// Query/key projection gain: attention scores get a spread of about
// kQkGain^4, so heads attend selectively rather than uniformly, which makes
// cross-chunk attention (what CacheBlend restores) matter.
constexpr float kQkGain = 1.25f;

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

Status CheckPositive(const char* field, int64_t value) {
  if (value > 0) return Status::Ok();
  return Invalid(std::string(field) + " must be positive, got " +
                 std::to_string(value));
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
  if (context_length < 0) return Invalid("context_length is negative");
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

}  // namespace tierkv
