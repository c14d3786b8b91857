#include "src/cache_blend.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace tierkv {
namespace {

Status CheckRatio(double ratio) {
  if (ratio >= 0.0 && ratio <= 1.0) return Status::Ok();  // False for NaN.
  return Status::InvalidArgument(
      "CacheBlend recompute_ratio must be in [0, 1], got " +
      std::to_string(ratio));
}

}  // namespace

Status BlendOptions::Validate(int32_t num_layers) const {
  TIERKV_RETURN_IF_ERROR(CheckRatio(recompute_ratio));
  if (check_layer < 0 || check_layer >= num_layers) {
    return Status::InvalidArgument("CacheBlend check_layer must be in [0, " +
                                   std::to_string(num_layers) + "), got " +
                                   std::to_string(check_layer));
  }
  return Status::Ok();
}

StatusOr<int64_t> RecomputeCount(double ratio, int64_t num_tokens) {
  TIERKV_RETURN_IF_ERROR(CheckRatio(ratio));
  if (num_tokens < 0) {
    return Status::InvalidArgument("CacheBlend token count is negative: " +
                                   std::to_string(num_tokens));
  }
  const double exact = ratio * static_cast<double>(num_tokens);
  const auto count = static_cast<int64_t>(std::floor(exact + 1e-6));
  return std::min(count, num_tokens);
}

StatusOr<std::vector<double>> KeyDeviations(std::span<const float> fresh,
                                            std::span<const float> cached,
                                            int64_t token_width) {
  if (token_width < 1 || fresh.size() != cached.size() ||
      fresh.size() % static_cast<size_t>(token_width) != 0) {
    return Status::InvalidArgument(
        "KeyDeviations: fresh has " + std::to_string(fresh.size()) +
        " values, cached " + std::to_string(cached.size()) +
        "; both must be the same multiple of token_width " +
        std::to_string(token_width));
  }
  const size_t width = static_cast<size_t>(token_width);
  std::vector<double> out(fresh.size() / width, 0.0);
  for (size_t t = 0; t < out.size(); ++t) {
    double sum = 0;
    for (size_t e = t * width; e < (t + 1) * width; ++e) {
      const double d = static_cast<double>(fresh[e]) - cached[e];
      sum += d * d;
    }
    out[t] = sum;
  }
  return out;
}

StatusOr<std::vector<int64_t>> SelectRecomputeTokens(
    std::span<const double> deviations, double ratio) {
  const auto n = static_cast<int64_t>(deviations.size());
  TIERKV_ASSIGN_OR_RETURN(const int64_t count, RecomputeCount(ratio, n));
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(deviations[static_cast<size_t>(i)])) {
      return Status::InvalidArgument("CacheBlend deviation of token " +
                                     std::to_string(i) + " is NaN");
    }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // A strict total order (larger deviation first, then lower index), so the
  // chosen set does not depend on the sort's implementation.
  auto first = [&](int64_t a, int64_t b) {
    const double da = deviations[static_cast<size_t>(a)];
    const double db = deviations[static_cast<size_t>(b)];
    return da != db ? da > db : a < b;
  };
  std::partial_sort(order.begin(), order.begin() + count, order.end(), first);
  order.resize(static_cast<size_t>(count));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace tierkv
