// ReferenceModel::LoadLlama2c: trained weights from a llama2.c checkpoint.
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "testing/reference_model.h"
#include "testing/reference_model_internal.h"

namespace tierkv {
namespace {

using reference_internal::ReadWholeFile;

constexpr int kHeaderInts = 7;

// The file's fp32 tensors, read in order.
class TensorReader {
 public:
  explicit TensorReader(const std::string& bytes)
      : bytes_(bytes), pos_(kHeaderInts * sizeof(int32_t)) {}

  // The next rows x cols matrix ([out][in] in the file) transposed to the
  // reference model's [in][out].
  std::vector<float> Transposed(int64_t rows, int64_t cols) {
    const std::vector<float> m = Plain(rows * cols);
    std::vector<float> out(m.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = m[r * cols + c];
    }
    return out;
  }
  std::vector<float> Plain(int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    std::memcpy(out.data(), bytes_.data() + pos_, out.size() * sizeof(float));
    pos_ += out.size() * sizeof(float);
    return out;
  }
  void Skip(int64_t floats) { pos_ += static_cast<size_t>(floats) * 4; }
  size_t pos() const { return pos_; }

 private:
  const std::string& bytes_;
  size_t pos_;
};

}  // namespace

StatusOr<ReferenceModel> ReferenceModel::LoadLlama2c(const std::string& path) {
  TIERKV_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  auto invalid = [&](const std::string& what) {
    return reference_internal::Invalid(path + ": " + what);
  };
  if (bytes.size() < kHeaderInts * sizeof(int32_t)) {
    return invalid("shorter than a llama2.c header (" +
                   std::to_string(bytes.size()) + " bytes)");
  }
  int32_t h[kHeaderInts];
  std::memcpy(h, bytes.data(), sizeof(h));
  if (h[5] == 0 || h[5] == INT32_MIN) {
    return invalid("vocab_size " + std::to_string(h[5]));
  }
  const bool tied = h[5] > 0;
  ReferenceModelConfig c;
  c.hidden_size = h[0];
  c.ffn_size = h[1];
  c.num_layers = h[2];
  c.num_heads = h[3];
  c.num_kv_heads = h[4];
  c.vocab_size = tied ? h[5] : -h[5];
  c.context_length = h[6];
  c.rope_theta = 10000;
  c.rope_style = RopeStyle::kGptJ;
  if (c.num_heads <= 0 || c.hidden_size <= 0 ||
      c.hidden_size % c.num_heads != 0) {
    return invalid("dim " + std::to_string(c.hidden_size) +
                   " is not a positive multiple of n_heads " +
                   std::to_string(c.num_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (c.context_length <= 0) {
    return invalid("seq_len " + std::to_string(c.context_length));
  }
  if (Status s = c.Validate(); !s.ok()) {
    return invalid("header: " + std::string(s.message()));
  }
  // Validate bounds every size by 2^16 and the weights by 2^28, so these
  // products fit.
  const int64_t d = c.hidden_size, f = c.ffn_size, layers = c.num_layers;
  const int64_t v = c.vocab_size;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t rope_tables = int64_t{c.context_length} * c.head_dim;
  const int64_t floats = v * d +
                         layers * (2 * d + 2 * d * d + 2 * d * kv + 3 * d * f) +
                         d + rope_tables + (tied ? 0 : v * d);
  const int64_t want = kHeaderInts * 4 + floats * 4;
  if (static_cast<int64_t>(bytes.size()) != want) {
    return invalid(std::to_string(bytes.size()) +
                   " bytes, but its header implies " + std::to_string(want) +
                   "; not a llama2.c checkpoint of this shape");
  }

  TensorReader in(bytes);
  Weights w;
  w.embedding = in.Plain(v * d);
  w.layers.resize(static_cast<size_t>(layers));
  for (LayerWeights& l : w.layers) l.attn_norm = in.Plain(d);
  for (LayerWeights& l : w.layers) l.wq = in.Transposed(d, d);
  for (LayerWeights& l : w.layers) l.wk = in.Transposed(kv, d);
  for (LayerWeights& l : w.layers) l.wv = in.Transposed(kv, d);
  for (LayerWeights& l : w.layers) l.wo = in.Transposed(d, d);
  for (LayerWeights& l : w.layers) l.mlp_norm = in.Plain(d);
  for (LayerWeights& l : w.layers) l.w_gate = in.Transposed(f, d);
  for (LayerWeights& l : w.layers) l.w_down = in.Transposed(d, f);
  for (LayerWeights& l : w.layers) l.w_up = in.Transposed(f, d);
  w.final_norm = in.Plain(d);
  in.Skip(rope_tables);
  if (tied) {
    w.lm_head = std::vector<float>(static_cast<size_t>(v * d));
    for (int64_t t = 0; t < v; ++t) {
      for (int64_t i = 0; i < d; ++i) {
        w.lm_head[i * v + t] = w.embedding[t * d + i];
      }
    }
  } else {
    w.lm_head = in.Transposed(v, d);
  }
  return ReferenceModel(c, std::move(w));
}

}  // namespace tierkv
