// Internal to the disk tier's sources (tiers/disk_*.cc), not part of tierkv's
// API: the declarations they share. Format limits and scratch buffers, the
// codecs' argument check (disk_codec.cc), storage keys and the value header
// (disk_value.cc), and the in-memory index (disk_index.cc). The value format
// itself is described in disk_tier.h.
#ifndef TIERKV_TIERS_DISK_INTERNAL_H_
#define TIERKV_TIERS_DISK_INTERNAL_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tiers/disk_tier.h"

namespace tierkv {

// Headers, keys and token ids are written in host order and read back with
// memcpy; the on-disk format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "the disk tier's value format assumes a little-endian host");

namespace disk_internal {

inline constexpr size_t kMaxPayloadBytes = size_t{1} << 30;
inline constexpr uint32_t kMaxTokens = 1 << 16;

inline std::string_view AsChars(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A growable buffer that is never zero-filled: codecs overwrite it whole.
class ScratchBuffer {
 public:
  std::byte* Get(size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(new std::byte[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t capacity_ = 0;
};

// ---------------------------------------------------------------------------
// Payload codecs (disk_codec.cc).

// Checks a codec's arguments against a payload of `payload_bytes`.
Status CheckCodecArgs(DiskCodec codec, int32_t element_bytes,
                      size_t payload_bytes);

// ---------------------------------------------------------------------------
// Storage keys and the value header (disk_value.cc).

// The block key of a storage key written by DiskStorageKey; nullopt for any
// other key.
std::optional<BlockKey> ParseStorageKey(std::string_view key);

struct ValueFields {
  DiskCodec codec = DiskCodec::kNone;
  int32_t element_bytes = 0;
  uint64_t sequence = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  uint64_t stored_checksum = 0;
  std::string_view fingerprint;
  std::string_view token_bytes;  // num_tokens u32s, little-endian.
  std::string_view stored;
};

// XXH3-64 of `bytes`.
uint64_t Checksum(std::string_view bytes);

// The header of a value, its checksum included; the stored bytes follow.
std::string EncodeHeader(const ValueFields& f);

// Parses and verifies the header; the stored bytes are VerifyStored's.
StatusOr<ValueFields> ParseHeader(std::string_view value);

// Verifies the stored bytes against their checksum.
Status VerifyStored(const ValueFields& f);

// Verifies the stored bytes and decodes them into `out` (the payload size),
// verifying the payload checksum.
Status VerifyAndDecode(const ValueFields& f, std::span<std::byte> out);

// Whether a header's token bytes are `tokens`.
bool SameTokens(std::string_view token_bytes, std::span<const TokenId> tokens);

// ---------------------------------------------------------------------------
// The index (disk_index.cc): which keys the tier holds, their sizes, tokens
// and LRU order, and the byte bound. Not thread-safe; DiskTierImpl guards it
// with mu_.
class DiskIndex {
 public:
  struct Entry {
    uint64_t generation = 0;  // The Put it belongs to (0: found by Open).
    uint64_t bytes = 0;
    bool stored = false;  // false: WRITING.
    std::vector<TokenId> tokens;
    std::list<BlockKey>::iterator lru;  // Valid iff stored.
  };

  explicit DiskIndex(uint64_t capacity) : capacity_(capacity) {}

  // Records `key` as WRITING `bytes` for the Put numbered `generation`,
  // replacing any entry of the key, after evicting least recently used
  // STORED keys until the bound holds. False (nothing changed) when the
  // key's entry belongs to a later Put: this one is stale. `victims` gets
  // every key that left the index (also on failure, when the key itself may
  // be one): their values must be deleted.
  StatusOr<bool> Reserve(const BlockKey& key, uint64_t generation,
                         uint64_t bytes, std::span<const TokenId> tokens,
                         std::vector<BlockKey>* victims);

  // WRITING -> STORED (most recently used). False if `generation` is no
  // longer the key's: the write was superseded or removed.
  bool Commit(const BlockKey& key, uint64_t generation);

  bool IsCurrent(const BlockKey& key, uint64_t generation) const;

  // Adds a STORED key found on disk as the most recently used; Open inserts
  // in write order. Ignores the bound (EvictToCapacity restores it).
  void InsertStored(const BlockKey& key, uint64_t bytes,
                    std::vector<TokenId> tokens);

  void EvictToCapacity(std::vector<BlockKey>* victims);

  const Entry* FindStored(const BlockKey& key) const;

  void Touch(const Entry& entry) { lru_.splice(lru_.end(), lru_, entry.lru); }

  // Any state. True if the key was there.
  bool Erase(const BlockKey& key);

  bool EraseIf(const BlockKey& key, uint64_t generation);

  bool Contains(const BlockKey& key) const { return entries_.contains(key); }

  uint64_t bytes() const { return bytes_; }
  uint64_t stored_keys() const { return lru_.size(); }
  std::vector<BlockKey> StoredKeys() const {
    return {lru_.begin(), lru_.end()};
  }
  uint64_t evictions() const { return evictions_; }

 private:
  const uint64_t capacity_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_;
  std::list<BlockKey> lru_;  // STORED keys, least recently used first.
};

}  // namespace disk_internal
}  // namespace tierkv

#endif  // TIERKV_TIERS_DISK_INTERNAL_H_
