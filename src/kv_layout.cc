#include "tierkv/kv_layout.h"

#include <string>

namespace tierkv {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

namespace {

Status CheckPositive(std::string_view field, int32_t value) {
  if (value > 0) return Status::Ok();
  return Status::InvalidArgument("KV layout: " + std::string(field) +
                                 " must be positive, got " +
                                 std::to_string(value));
}

}  // namespace

Status KvLayout::Validate() const {
  TIERKV_RETURN_IF_ERROR(CheckPositive("num_layers", num_layers));
  TIERKV_RETURN_IF_ERROR(CheckPositive("num_kv_heads", num_kv_heads));
  TIERKV_RETURN_IF_ERROR(CheckPositive("head_dim", head_dim));
  TIERKV_RETURN_IF_ERROR(CheckPositive("block_size", block_size));
  if (DTypeSize(dtype) == 0) {
    return Status::InvalidArgument("KV layout: unknown dtype value " +
                                   std::to_string(static_cast<int>(dtype)));
  }
  // Each factor is below 2^31, so the product of two fits in 64 bits; check
  // the running product before every multiplication.
  uint64_t bytes = 2 * DTypeSize(dtype);
  for (int32_t factor : {num_layers, num_kv_heads, head_dim, block_size}) {
    bytes *= static_cast<uint64_t>(factor);
    if (bytes > kMaxBlockBytes) {
      return Status::InvalidArgument("KV layout: one block of " + ToString() +
                                     " exceeds the 4 GiB limit");
    }
  }
  return Status::Ok();
}

std::string KvLayout::ToString() const {
  return "layers=" + std::to_string(num_layers) +
         " kv_heads=" + std::to_string(num_kv_heads) +
         " head_dim=" + std::to_string(head_dim) +
         " block=" + std::to_string(block_size) +
         " dtype=" + std::string(DTypeName(dtype));
}

std::string KvLayout::Fingerprint() const {
  return "kv1:layers=" + std::to_string(num_layers) +
         ",kv_heads=" + std::to_string(num_kv_heads) +
         ",head_dim=" + std::to_string(head_dim) +
         ",block=" + std::to_string(block_size) +
         ",dtype=" + std::string(DTypeName(dtype));
}

Status ValidateModelName(std::string_view model) {
  if (model.size() > kMaxModelNameBytes) {
    return Status::InvalidArgument(
        "model name of " + std::to_string(model.size()) +
        " bytes is longer than " + std::to_string(kMaxModelNameBytes));
  }
  for (char c : model) {
    if (c <= ' ' || c > '~' || c == '#') {
      return Status::InvalidArgument(
          "model name '" + std::string(model) +
          "' may hold printable ASCII only, without spaces or '#' (which "
          "starts a comment in tierkvd's config file)");
    }
  }
  return Status::Ok();
}

std::string ModelDisplayName(std::string_view model) {
  if (model.empty()) return "(unnamed)";
  return "\"" + std::string(model) + "\"";
}

std::string StoreFingerprint(const KvLayout& layout, std::string_view model) {
  // Appended last: the layout fingerprint holds no ",model=", so the result
  // names exactly one (layout, model) pair.
  if (model.empty()) return layout.Fingerprint();
  return layout.Fingerprint() + ",model=" + std::string(model);
}

}  // namespace tierkv
