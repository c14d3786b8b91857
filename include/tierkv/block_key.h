// Block keys: the 128-bit identity of a KV block's content and context.
// A key is XXH3-128 over a canonical little-endian encoding of
// (parent key, block token ids, typed extra keys), chained from a root that
// depends only on the namespace (model/layout fingerprint, tenant). Keys are
// therefore identical across processes, hosts and restarts.
// KeyHasher is immutable after construction and safe to share between threads.
//
// Canonical encoding of one block (all integers little-endian):
//   parent.lo u64 | parent.hi u64 | num_tokens u32 | token ids u32 x num_tokens
//   | extra keys, each a tag byte and a fixed or length-prefixed payload:
//     0x01 LoRA id        u64
//     0x02 multimodal     item hash (lo u64, hi u64) | item start relative to
//                         the block start, i64 (negative: began earlier)
//     0x03 cache salt     u32 length | bytes (first block of a sequence only)
// Every field is fixed-size or length-prefixed, so two different inputs never
// encode to the same bytes. This is the on-disk identity of a block: changing
// it invalidates every persisted key (KeyFormat.GoldenKeys guards it).
#ifndef TIERKV_INCLUDE_TIERKV_BLOCK_KEY_H_
#define TIERKV_INCLUDE_TIERKV_BLOCK_KEY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

struct BlockKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
  // The inverse of ToHex (either case). InvalidArgument, naming the text,
  // for anything but exactly 32 hex digits.
  static StatusOr<BlockKey> FromHex(std::string_view hex);
};

// The key is already a uniform hash; its low word is a good bucket index.
struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const noexcept {
    return static_cast<size_t>(key.lo);
  }
};

// Everything that must separate two caches. Tenants never share keys, and
// stores for different models or KV layouts never agree on a key.
struct KeyNamespace {
  std::string model_fingerprint;  // Model name plus KV layout fingerprint.
  std::string tenant;             // Default: "" (the shared tenant).
};

// A multimodal input (image, audio clip) occupying placeholder tokens
// [start, start + length) of the sequence.
struct MultiModalItem {
  BlockKey hash;  // Content hash of the item, computed by the engine.
  int64_t start = 0;
  int64_t length = 0;
};

// Per-request inputs that change what a block's KV means beyond its tokens.
struct RequestExtras {
  std::optional<uint64_t> lora_id;  // Applies to every block.
  // Any order (keys list them by start); at most four may cover one token
  // (tierkvd refuses more, InvalidArgument).
  std::vector<MultiModalItem> mm_items;
  std::string cache_salt;  // Folded into the first block only.
};

// An engine's own identifier of content (vLLM's multimodal item
// identifier, a hash string) as a MultiModalItem::hash: XXH3-128 of its
// bytes.
BlockKey ContentKey(std::string_view identifier);

// The variant of ChunkKeys for chunks computed with `rope_config` (a
// RopeConfig::ToString()) and `engine_variant`, what else the engine says
// changes their KV (a LoRA adapter, a cache salt; empty: nothing).
BlockKey ChunkVariant(std::string_view rope_config,
                      std::string_view engine_variant);

class KeyHasher {
 public:
  explicit KeyHasher(const KeyNamespace& ns);

  const BlockKey& sequence_root() const { return sequence_root_; }
  const BlockKey& chunk_root() const { return chunk_root_; }

  // Key of one block. `extra_encoding` is the already encoded extra keys
  // (EncodeExtraKeys), empty for plain text blocks.
  static BlockKey HashBlock(const BlockKey& parent,
                            std::span<const TokenId> tokens,
                            std::span<const std::byte> extra_encoding = {});

  // Appends the extra keys that apply to block `block_index` (token range
  // [block_start, block_start + block_len)) to `out`.
  static void EncodeExtraKeys(const RequestExtras& extras, int64_t block_index,
                              int64_t block_start, int64_t block_len,
                              std::vector<std::byte>* out);

  // Extends `keys` (the keys of the first keys->size() full blocks of
  // `tokens`) with the keys of the remaining full blocks, chained from the
  // sequence root. Partial trailing blocks get no key; block_size < 1 keys
  // nothing.
  void AppendPrefixKeys(std::span<const TokenId> tokens, int32_t block_size,
                        const RequestExtras& extras,
                        std::vector<BlockKey>* keys) const;

  // Keys of a position-independent chunk: chained from the chunk root, by
  // content, the virtual position its KV was computed at (its first
  // token's RoPE position; the same chunk computed elsewhere holds other
  // keys) and `variant`, a fingerprint of whatever else its KV depends on
  // that the namespace does not name (ChunkVariant: the RoPE config, a
  // LoRA adapter); including the trailing partial block (its token count
  // is part of the encoding). Virtual start 0 with no variant chains from
  // the chunk root itself.
  std::vector<BlockKey> ChunkKeys(std::span<const TokenId> tokens,
                                  int32_t block_size, int64_t virtual_start = 0,
                                  const BlockKey& variant = {}) const;

 private:
  // Blocks up to this many tokens take the allocation-free fast path.
  static constexpr int32_t kMaxFastBlockTokens = 256;

  void AppendPlainKeys(std::span<const TokenId> tokens, int32_t block_size,
                       size_t num_full, std::vector<BlockKey>* keys) const;

  BlockKey sequence_root_;
  BlockKey chunk_root_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_BLOCK_KEY_H_
