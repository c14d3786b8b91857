// KvLayout: the shape of the KV cache a store serves, and the byte geometry of
// one block as every tier stores it. Plain value type, owned by whoever
// configures the store; immutable use is safe to share between threads.
//
// StoreFingerprint names what a store's keys and stored values belong to: the
// layout plus the model whose KV it holds.
//
// Block geometry: for each layer, the K plane then the V plane; each plane is
// [block_size tokens][num_kv_heads][head_dim] elements of `dtype`, densely
// packed. A token's K (or V) for one layer is therefore one contiguous run of
// TokenStride() bytes.
#ifndef TIERKV_INCLUDE_TIERKV_KV_LAYOUT_H_
#define TIERKV_INCLUDE_TIERKV_KV_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv {

enum class DType : uint8_t { kF32, kF16, kBF16 };

// "f32", "f16", "bf16"; "unknown" for a value outside the enum.
std::string_view DTypeName(DType dtype);
// Bytes per element; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);

enum class KvPlane : uint8_t { kKey = 0, kValue = 1 };

struct KvLayout {
  int32_t num_layers = 0;      // Required.
  int32_t num_kv_heads = 0;    // Required.
  int32_t head_dim = 0;        // Required.
  int32_t block_size = 16;     // Tokens per block. Default: 16.
  DType dtype = DType::kBF16;  // Default: bf16.

  // OK, or InvalidArgument naming the bad field. A valid layout's block is
  // at most kMaxBlockBytes, so every offset below fits comfortably in size_t.
  Status Validate() const;
  // "layers=32 kv_heads=8 head_dim=128 block=16 dtype=bf16".
  std::string ToString() const;
  // Stable text naming every field, for key namespaces and on-disk headers:
  // "kv1:layers=32,kv_heads=8,head_dim=128,block=16,dtype=bf16". Changing
  // its format invalidates every persisted key.
  std::string Fingerprint() const;

  size_t ElementSize() const { return DTypeSize(dtype); }
  // Bytes between consecutive tokens within one K or V plane.
  size_t TokenStride() const {
    return static_cast<size_t>(num_kv_heads) * head_dim * ElementSize();
  }
  size_t PlaneBytes() const { return block_size * TokenStride(); }
  size_t BlockBytes() const { return 2 * num_layers * PlaneBytes(); }
  // Byte offset of (layer, plane, token_in_block) from the block's start.
  // REQUIRES: a valid layout and indices in range.
  size_t Offset(int32_t layer, KvPlane plane, int32_t token_in_block) const {
    size_t plane_index =
        2 * static_cast<size_t>(layer) + static_cast<size_t>(plane);
    return plane_index * PlaneBytes() + token_in_block * TokenStride();
  }

  friend bool operator==(const KvLayout&, const KvLayout&) = default;

  static constexpr size_t kMaxBlockBytes = size_t{1} << 32;
};

// A model name: what separates the KV of two models that share a layout
// (two fine-tunes of one base model, or one model under another RoPE
// scaling). "" is the unnamed model. At most kMaxModelNameBytes of printable
// ASCII without spaces, e.g. "meta-llama/Llama-3.1-8B-Instruct@5206a32".
inline constexpr size_t kMaxModelNameBytes = 128;
// OK, or InvalidArgument saying what is wrong with `model`.
Status ValidateModelName(std::string_view model);
// `"name"` in quotes, or "(unnamed)" for "": for messages naming a model.
std::string ModelDisplayName(std::string_view model);

// The namespace of a store's keys and stored values (host segment header,
// disk values): layout.Fingerprint(), then ",model=<name>" for a named model.
// The unnamed model's is the layout fingerprint alone, so stores that never
// named a model keep their keys and their disk tier. Changing its format
// invalidates every persisted key.
std::string StoreFingerprint(const KvLayout& layout, std::string_view model);

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_KV_LAYOUT_H_
