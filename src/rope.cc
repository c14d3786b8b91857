#include "src/rope.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <locale>
#include <numbers>
#include <sstream>

namespace tierkv {

RopeScaling RopeScaling::Linear(double factor) {
  RopeScaling s;
  s.type = RopeScalingType::kLinear;
  s.factor = factor;
  return s;
}

RopeScaling RopeScaling::Ntk(double alpha) {
  RopeScaling s;
  s.type = RopeScalingType::kNtk;
  s.alpha = alpha;
  return s;
}

RopeScaling RopeScaling::Llama3(double factor, double low_freq_factor,
                                double high_freq_factor,
                                int64_t original_max_position) {
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = low_freq_factor;
  s.high_freq_factor = high_freq_factor;
  s.original_max_position = original_max_position;
  return s;
}

namespace {

Status Invalid(const std::string& what) {
  return Status::InvalidArgument("RoPE config: " + what);
}

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

Status ValidateScaling(const RopeScaling& s, int32_t rotary_dim) {
  switch (s.type) {
    case RopeScalingType::kNone:
      return Status::Ok();
    case RopeScalingType::kLinear:
      if (!PositiveFinite(s.factor))
        return Invalid("linear factor must be > 0");
      return Status::Ok();
    case RopeScalingType::kNtk:
      if (!PositiveFinite(s.alpha)) return Invalid("NTK alpha must be > 0");
      if (rotary_dim <= 2) return Invalid("NTK scaling needs rotary_dim > 2");
      return Status::Ok();
    case RopeScalingType::kLlama3:
      if (!PositiveFinite(s.factor))
        return Invalid("llama3 factor must be > 0");
      if (!PositiveFinite(s.low_freq_factor) ||
          !PositiveFinite(s.high_freq_factor) ||
          s.high_freq_factor <= s.low_freq_factor) {
        return Invalid("llama3 needs 0 < low_freq_factor < high_freq_factor");
      }
      if (s.original_max_position <= 0) {
        return Invalid("llama3 original_max_position must be > 0");
      }
      return Status::Ok();
  }
  return Invalid("unknown scaling type");
}

// HF transformers' _compute_llama3_parameters, in double.
double Llama3InverseFrequency(const RopeScaling& s, double inv_freq) {
  double old_context = static_cast<double>(s.original_max_position);
  double low_freq_wavelen = old_context / s.low_freq_factor;
  double high_freq_wavelen = old_context / s.high_freq_factor;
  double wavelen = 2 * std::numbers::pi / inv_freq;
  if (wavelen < high_freq_wavelen) return inv_freq;
  if (wavelen > low_freq_wavelen) return inv_freq / s.factor;
  double smooth = (old_context / wavelen - s.low_freq_factor) /
                  (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

std::string ScalingToString(const RopeScaling& s) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << std::setprecision(std::numeric_limits<double>::max_digits10);
  switch (s.type) {
    case RopeScalingType::kNone:
      out << "none";
      break;
    case RopeScalingType::kLinear:
      out << "linear(" << s.factor << ")";
      break;
    case RopeScalingType::kNtk:
      out << "ntk(" << s.alpha << ")";
      break;
    case RopeScalingType::kLlama3:
      out << "llama3(" << s.factor << "," << s.low_freq_factor << ","
          << s.high_freq_factor << "," << s.original_max_position << ")";
      break;
  }
  return out.str();
}

}  // namespace

Status RopeConfig::Validate() const {
  if (head_dim <= 0) return Invalid("head_dim must be positive");
  if (rotary_dim <= 0 || rotary_dim > head_dim || rotary_dim % 2 != 0) {
    return Invalid("rotary_dim must be even and in (0, head_dim=" +
                   std::to_string(head_dim) + "], got " +
                   std::to_string(rotary_dim));
  }
  if (!PositiveFinite(theta) || theta <= 1) return Invalid("theta must be > 1");
  if (style != RopeStyle::kNeoX && style != RopeStyle::kGptJ) {
    return Invalid("unknown style");
  }
  TIERKV_RETURN_IF_ERROR(ValidateScaling(scaling, rotary_dim));
  // Each positive and finite on its own, the values may still overflow
  // together (a factor of 1e-310, an NTK theta past 1e308): every angle
  // would be NaN or 0, and K rotated by it garbage.
  for (double w : InverseFrequencies(*this)) {
    if (!PositiveFinite(w)) {
      return Invalid(
          "its inverse frequencies are not all finite and "
          "positive (" +
          ToString() + "): a scaling value out of range");
    }
  }
  return Status::Ok();
}

std::string RopeConfig::ToString() const {
  std::ostringstream out;
  // Every digit, and no locale's digit grouping: the string keys chunks
  // (ChunkVariant), so two configs that rotate differently never print
  // alike, and one config prints alike in every process.
  out.imbue(std::locale::classic());
  out << std::setprecision(std::numeric_limits<double>::max_digits10);
  out << "head_dim=" << head_dim << " rotary_dim=" << rotary_dim
      << " theta=" << theta
      << " style=" << (style == RopeStyle::kNeoX ? "neox" : "gptj")
      << " scaling=" << ScalingToString(scaling);
  return out.str();
}

std::vector<double> InverseFrequencies(const RopeConfig& config) {
  const RopeScaling& s = config.scaling;
  double rot = config.rotary_dim;
  double theta = config.theta;
  if (s.type == RopeScalingType::kNtk) {
    theta *= std::pow(s.alpha, rot / (rot - 2));
  }
  std::vector<double> inv_freq(config.rotary_dim / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double w = 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / rot);
    if (s.type == RopeScalingType::kLinear) w /= s.factor;
    if (s.type == RopeScalingType::kLlama3) w = Llama3InverseFrequency(s, w);
    inv_freq[i] = w;
  }
  return inv_freq;
}

Status ApplyRope(const RopeConfig& config, std::span<const double> inv_freq,
                 int64_t position, std::span<float> head) {
  if (head.size() != static_cast<size_t>(config.head_dim) ||
      inv_freq.size() != static_cast<size_t>(config.rotary_dim / 2)) {
    return Status::InvalidArgument(
        "ApplyRope: head has " + std::to_string(head.size()) +
        " elements and inv_freq " + std::to_string(inv_freq.size()) +
        "; config wants " + config.ToString());
  }
  size_t half = inv_freq.size();
  for (size_t i = 0; i < half; ++i) {
    bool neox = config.style == RopeStyle::kNeoX;
    size_t xi = neox ? i : 2 * i;
    size_t yi = neox ? i + half : 2 * i + 1;
    double angle = static_cast<double>(position) * inv_freq[i];
    double c = std::cos(angle), s = std::sin(angle);
    double x = head[xi], y = head[yi];
    head[xi] = static_cast<float>(x * c - y * s);
    head[yi] = static_cast<float>(x * s + y * c);
  }
  return Status::Ok();
}

}  // namespace tierkv
