#include "tierkv/block_key.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <type_traits>

namespace tierkv {
namespace {

static_assert(sizeof(TokenId) == 4, "the key encoding stores token ids as u32");
static_assert(sizeof(BlockKey) == 16 && offsetof(BlockKey, hi) == 8,
              "BlockKey's bytes are its little-endian encoding on LE hosts");

// Root kinds: a chunk key and a prefix key can never mean the same thing.
constexpr uint8_t kRootSequence = 1;
constexpr uint8_t kRootChunk = 2;
constexpr char kRootMagic[] = "tierkv.root";
constexpr uint32_t kKeyFormatVersion = 1;

constexpr std::byte kTagLora{0x01};
constexpr std::byte kTagMultiModal{0x02};
constexpr std::byte kTagCacheSalt{0x03};

template <typename T>
T ByteSwap(T value) {
  static_assert(std::is_integral_v<T>);
  if constexpr (sizeof(T) == 1) return value;
  if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(value));
  if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(value));
}

template <typename T>
void PutLe(T value, std::byte* dst) {
  if constexpr (std::endian::native == std::endian::big) {
    value = ByteSwap(value);
  }
  std::memcpy(dst, &value, sizeof(T));
}

template <typename T>
void AppendLe(T value, std::vector<std::byte>* out) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  PutLe(value, out->data() + at);
}

void AppendBytes(std::string_view s, std::vector<std::byte>* out) {
  AppendLe(static_cast<uint32_t>(s.size()), out);
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out->insert(out->end(), p, p + s.size());
}

BlockKey FromXxh(XXH128_hash_t h) { return BlockKey{h.low64, h.high64}; }

BlockKey MakeRoot(uint8_t kind, const KeyNamespace& ns) {
  std::vector<std::byte> buf;
  AppendBytes(kRootMagic, &buf);
  AppendLe(kKeyFormatVersion, &buf);
  AppendLe(kind, &buf);
  AppendBytes(ns.model_fingerprint, &buf);
  AppendBytes(ns.tenant, &buf);
  return FromXxh(XXH3_128bits(buf.data(), buf.size()));
}

// Writes parent | count | tokens into dst, which has room for
// 20 + 4 * tokens.size() bytes. Returns the bytes written.
size_t EncodeHead(const BlockKey& parent, std::span<const TokenId> tokens,
                  std::byte* dst) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst, &parent, sizeof(parent));  // See AppendPlainKeysImpl.
  } else {
    PutLe(parent.lo, dst);
    PutLe(parent.hi, dst + 8);
  }
  PutLe(static_cast<uint32_t>(tokens.size()), dst + 16);
  std::byte* p = dst + 20;
  if constexpr (std::endian::native == std::endian::little) {
    // No tokens (a chunk's virtual start) may come with no pointer at all.
    if (!tokens.empty()) std::memcpy(p, tokens.data(), tokens.size_bytes());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) PutLe(tokens[i], p + 4 * i);
  }
  return 20 + tokens.size_bytes();
}

}  // namespace

std::string BlockKey::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx",
                static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

StatusOr<BlockKey> BlockKey::FromHex(std::string_view hex) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(
        "block key '" + std::string(hex.substr(0, 64)) + "': " + why);
  };
  if (hex.size() != 32) {
    return bad("expected 32 hex digits, got " + std::to_string(hex.size()) +
               " characters");
  }
  uint64_t words[2] = {0, 0};  // hi, lo
  for (size_t i = 0; i < hex.size(); ++i) {
    const char c = hex[i];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) {
      return bad("'" + std::string(1, c) + "' at position " +
                 std::to_string(i) + " is not a hex digit");
    }
    words[i / 16] = words[i / 16] << 4 | static_cast<uint64_t>(digit);
  }
  return BlockKey{.lo = words[1], .hi = words[0]};
}

KeyHasher::KeyHasher(const KeyNamespace& ns)
    : sequence_root_(MakeRoot(kRootSequence, ns)),
      chunk_root_(MakeRoot(kRootChunk, ns)) {}

BlockKey KeyHasher::HashBlock(const BlockKey& parent,
                              std::span<const TokenId> tokens,
                              std::span<const std::byte> extra_encoding) {
  // Blocks of up to 120 tokens with small extras hash from the stack; the
  // encoding is hashed in one call, which is what makes keying nearly as
  // fast as hashing the raw token bytes.
  constexpr size_t kStackBytes = 512;
  const size_t total = 20 + tokens.size_bytes() + extra_encoding.size();
  if (total <= kStackBytes) {
    std::array<std::byte, kStackBytes> buf;
    size_t n = EncodeHead(parent, tokens, buf.data());
    if (!extra_encoding.empty()) {
      std::memcpy(buf.data() + n, extra_encoding.data(), extra_encoding.size());
      n += extra_encoding.size();
    }
    return FromXxh(XXH3_128bits(buf.data(), n));
  }
  std::vector<std::byte> buf(total);
  size_t n = EncodeHead(parent, tokens, buf.data());
  if (!extra_encoding.empty()) {
    std::memcpy(buf.data() + n, extra_encoding.data(), extra_encoding.size());
  }
  return FromXxh(XXH3_128bits(buf.data(), buf.size()));
}

namespace {

// The items in order of their start, then length, then content (the order
// keys list them in, so the order a caller lists them in does not matter,
// even for items that start together, such as a video's frames and its
// audio): `items` itself when it is in that order already, else a sorted
// copy kept in `sorted`.
std::span<const MultiModalItem> ByStart(std::span<const MultiModalItem> items,
                                        std::vector<MultiModalItem>* sorted) {
  const auto earlier = [](const MultiModalItem& a, const MultiModalItem& b) {
    return std::tie(a.start, a.length, a.hash.hi, a.hash.lo) <
           std::tie(b.start, b.length, b.hash.hi, b.hash.lo);
  };
  if (std::ranges::is_sorted(items, earlier)) return items;
  sorted->assign(items.begin(), items.end());
  std::ranges::sort(*sorted, earlier);
  return *sorted;
}

// EncodeExtraKeys over `items`, sorted by start: those that overlap the
// block are encoded, in that order.
void EncodeBlockExtras(const RequestExtras& extras,
                       std::span<const MultiModalItem> items,
                       int64_t block_index, int64_t block_start,
                       int64_t block_len, std::vector<std::byte>* out) {
  if (extras.lora_id.has_value()) {
    out->push_back(kTagLora);
    AppendLe(*extras.lora_id, out);
  }
  const int64_t block_end = block_start + block_len;
  for (const MultiModalItem& item : items) {
    if (item.start >= block_end) break;
    if (item.start + item.length <= block_start) continue;
    out->push_back(kTagMultiModal);
    AppendLe(item.hash.lo, out);
    AppendLe(item.hash.hi, out);
    AppendLe(item.start - block_start, out);
  }
  if (block_index == 0 && !extras.cache_salt.empty()) {
    out->push_back(kTagCacheSalt);
    AppendBytes(extras.cache_salt, out);
  }
}

}  // namespace

void KeyHasher::EncodeExtraKeys(const RequestExtras& extras,
                                int64_t block_index, int64_t block_start,
                                int64_t block_len,
                                std::vector<std::byte>* out) {
  std::vector<MultiModalItem> sorted;
  EncodeBlockExtras(extras, ByStart(extras.mm_items, &sorted), block_index,
                    block_start, block_len, out);
}

void KeyHasher::AppendPrefixKeys(std::span<const TokenId> tokens,
                                 int32_t block_size,
                                 const RequestExtras& extras,
                                 std::vector<BlockKey>* keys) const {
  if (block_size < 1) return;  // No blocks, no keys.
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  if (keys->size() >= num_full) return;
  keys->reserve(num_full);
  const bool plain = !extras.lora_id.has_value() && extras.mm_items.empty() &&
                     extras.cache_salt.empty();
  if (plain && block_size <= kMaxFastBlockTokens) {
    AppendPlainKeys(tokens, block_size, num_full, keys);
    return;
  }
  std::vector<std::byte> extra;
  std::vector<MultiModalItem> sorted;
  const std::span<const MultiModalItem> items =
      ByStart(extras.mm_items, &sorted);
  // The items over the current block, in order of start: each item joins
  // once, at the first block it reaches, and leaves once it has ended, so
  // keying costs the items plus, per block, those over it (a few:
  // Coordinator::CheckItems bounds how many cover one token).
  std::vector<MultiModalItem> over;
  size_t next_item = 0;
  BlockKey parent = keys->empty() ? sequence_root_ : keys->back();
  for (size_t i = keys->size(); i < num_full; ++i) {
    const int64_t start = static_cast<int64_t>(i) * block_size;
    auto block = tokens.subspan(static_cast<size_t>(start), block_size);
    std::erase_if(over, [start](const MultiModalItem& item) {
      return item.start + item.length <= start;
    });
    for (; next_item < items.size() &&
           items[next_item].start < start + block_size;
         ++next_item) {
      if (items[next_item].start + items[next_item].length > start) {
        over.push_back(items[next_item]);
      }
    }
    extra.clear();
    EncodeBlockExtras(extras, over, static_cast<int64_t>(i), start, block_size,
                      &extra);
    parent = HashBlock(parent, block, extra);
    keys->push_back(parent);
  }
}

namespace {

// The hot path (no extra keys): one reusable buffer whose count field is
// written once; per block only the parent and the tokens are copied in.
// Produces exactly HashBlock's encoding. kTokens > 0 fixes the block size at
// compile time so the token copy is inlined (a libc memcpy call per block
// costs about a third of the keying time at 16 tokens).
template <size_t kTokens>
void AppendPlainKeysImpl(BlockKey parent, std::span<const TokenId> tokens,
                         size_t block_tokens, size_t num_full,
                         std::vector<BlockKey>* keys) {
  constexpr size_t kMaxTokens = kTokens > 0 ? kTokens : 256;
  std::array<std::byte, 20 + 4 * kMaxTokens> buf;
  const size_t n = kTokens > 0 ? kTokens : block_tokens;
  PutLe(static_cast<uint32_t>(n), buf.data() + 16);
  for (size_t i = keys->size(); i < num_full; ++i) {
    const TokenId* src = tokens.data() + i * n;
    if constexpr (std::endian::native == std::endian::little) {
      // One 16-byte copy of {lo, hi}: two 8-byte stores followed by the
      // 16-byte reload GCC emits cannot be store-forwarded, and that stall
      // sits on the chain's critical path (about 25% of the keying time).
      std::memcpy(buf.data(), &parent, sizeof(parent));
      std::memcpy(buf.data() + 20, src, n * sizeof(TokenId));
    } else {
      PutLe(parent.lo, buf.data());
      PutLe(parent.hi, buf.data() + 8);
      for (size_t t = 0; t < n; ++t) PutLe(src[t], buf.data() + 20 + 4 * t);
    }
    parent = FromXxh(XXH3_128bits(buf.data(), 20 + n * sizeof(TokenId)));
    keys->push_back(parent);
  }
}

}  // namespace

void KeyHasher::AppendPlainKeys(std::span<const TokenId> tokens,
                                int32_t block_size, size_t num_full,
                                std::vector<BlockKey>* keys) const {
  static_assert(kMaxFastBlockTokens == 256);
  const BlockKey parent = keys->empty() ? sequence_root_ : keys->back();
  const auto n = static_cast<size_t>(block_size);
  switch (block_size) {
    case 16:
      return AppendPlainKeysImpl<16>(parent, tokens, n, num_full, keys);
    case 32:
      return AppendPlainKeysImpl<32>(parent, tokens, n, num_full, keys);
    case 64:
      return AppendPlainKeysImpl<64>(parent, tokens, n, num_full, keys);
    default:
      return AppendPlainKeysImpl<0>(parent, tokens, n, num_full, keys);
  }
}

BlockKey ContentKey(std::string_view identifier) {
  return FromXxh(XXH3_128bits(identifier.data(), identifier.size()));
}

BlockKey ChunkVariant(std::string_view rope_config,
                      std::string_view engine_variant) {
  // Lengths first: no two pairs of strings encode alike.
  std::vector<std::byte> bytes;
  AppendLe(static_cast<uint64_t>(rope_config.size()), &bytes);
  AppendLe(static_cast<uint64_t>(engine_variant.size()), &bytes);
  for (std::string_view s : {rope_config, engine_variant}) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + s.size());
  }
  return FromXxh(XXH3_128bits(bytes.data(), bytes.size()));
}

std::vector<BlockKey> KeyHasher::ChunkKeys(std::span<const TokenId> tokens,
                                           int32_t block_size,
                                           int64_t virtual_start,
                                           const BlockKey& variant) const {
  std::vector<BlockKey> keys;
  if (block_size < 1) return keys;
  keys.reserve((tokens.size() + block_size - 1) / block_size);
  BlockKey parent = chunk_root_;
  const bool has_variant = variant != BlockKey{};
  if (virtual_start != 0 || has_variant) {
    // A block of no tokens, which no chunk block is (each has at least
    // one, and the count is encoded), carrying the position and then the
    // variant, if any (the length tells them apart).
    std::array<std::byte, sizeof(int64_t) + 2 * sizeof(uint64_t)> basis;
    PutLe(static_cast<uint64_t>(virtual_start), basis.data());
    PutLe(variant.lo, basis.data() + 8);
    PutLe(variant.hi, basis.data() + 16);
    parent = HashBlock(parent, {},
                       std::span(basis).first(has_variant ? basis.size() : 8));
  }
  for (size_t start = 0; start < tokens.size(); start += block_size) {
    const size_t len = std::min<size_t>(block_size, tokens.size() - start);
    parent = HashBlock(parent, tokens.subspan(start, len));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace tierkv
