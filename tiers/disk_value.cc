// The disk tier's value format (described in disk_tier.h): storage keys, the
// value header (encoding, parsing and verifying it) and the verified decoding
// of a value's stored bytes into its payload.
#include "tiers/disk_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack.
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "tiers/disk_internal.h"

namespace tierkv {
namespace {

constexpr uint32_t kMagic = 0x44564b54;  // "TKVD" read as little-endian.
// 1: the stored bytes followed the header in RocksDB. 2: they are in the
// value file, at the slot the header names.
constexpr uint16_t kFormatVersion = 2;
constexpr char kBlockKeyPrefix = 'b';
constexpr size_t kStorageKeyBytes = 17;

}  // namespace

std::string DiskStorageKey(const BlockKey& key) {
  std::string out(kStorageKeyBytes, '\0');
  out[0] = kBlockKeyPrefix;
  const uint64_t words[2] = {key.hi, key.lo};
  for (int w = 0; w < 2; ++w) {
    for (int i = 0; i < 8; ++i) {
      out[1 + 8 * w + i] = static_cast<char>(words[w] >> (56 - 8 * i));
    }
  }
  return out;
}

std::string_view DiskFingerprintKey() {
  // Not a block key: 'f' differs from kBlockKeyPrefix.
  return "fingerprint";
}

namespace disk_internal {

std::optional<BlockKey> ParseStorageKey(std::string_view key) {
  if (key.size() != kStorageKeyBytes || key[0] != kBlockKeyPrefix) {
    return std::nullopt;
  }
  uint64_t words[2] = {0, 0};
  for (int w = 0; w < 2; ++w) {
    for (int i = 0; i < 8; ++i) {
      words[w] = (words[w] << 8) | static_cast<uint8_t>(key[1 + 8 * w + i]);
    }
  }
  return BlockKey{.lo = words[1], .hi = words[0]};
}

// ---------------------------------------------------------------------------
// Value header (format in disk_tier.h).

namespace {

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

}  // namespace

uint64_t Checksum(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

// The header of a value, its checksum included; the stored bytes follow.
}  // namespace disk_internal

uint64_t DiskValueBytes(size_t block_bytes, size_t fingerprint_bytes,
                        size_t tokens) {
  // magic, version, codec, element bytes, six u64s, the fingerprint's
  // length and bytes, the token count and ids, the header checksum; then
  // the block's slot in the value file.
  constexpr uint64_t kFixed = 4 + 2 + 1 + 1 + 6 * 8 + 2 + 4 + 8;
  return kFixed + fingerprint_bytes + tokens * sizeof(TokenId) +
         disk_internal::SlotBytes(block_bytes);
}

namespace disk_internal {

std::string EncodeHeader(const ValueFields& f) {
  std::string out;
  out.reserve(64 + f.fingerprint.size() + f.token_bytes.size());
  Append(&out, kMagic);
  Append(&out, kFormatVersion);
  Append(&out, static_cast<uint8_t>(f.codec));
  Append(&out, static_cast<uint8_t>(f.element_bytes));
  Append(&out, f.sequence);
  Append(&out, f.payload_bytes);
  Append(&out, f.stored_bytes);
  Append(&out, f.payload_checksum);
  Append(&out, f.stored_checksum);
  Append(&out, f.slot);
  Append(&out, static_cast<uint16_t>(f.fingerprint.size()));
  out.append(f.fingerprint);
  Append(&out, static_cast<uint32_t>(f.token_bytes.size() / sizeof(TokenId)));
  out.append(f.token_bytes);
  Append(&out, Checksum(out));
  return out;
}

namespace {

// Reads fixed-size fields with bounds checks; any overrun sticks.
class FieldReader {
 public:
  explicit FieldReader(std::string_view in) : in_(in) {}

  template <typename T>
  T Read() {
    T value{};
    if (sizeof(T) > in_.size() - pos_) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string_view Bytes(size_t n) {
    if (n > in_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

// Parses and verifies the header; the stored bytes are VerifyStored's.
StatusOr<ValueFields> ParseHeader(std::string_view value) {
  FieldReader r(value);
  ValueFields f;
  const uint32_t magic = r.Read<uint32_t>();
  const uint16_t version = r.Read<uint16_t>();
  if (!r.ok() || magic != kMagic) return Status::DataLoss("bad magic");
  if (version == 1) {
    return Status::DataLoss(
        "format version 1 (the block's bytes inside RocksDB, written before "
        "the value file)");
  }
  if (version != kFormatVersion) {
    return Status::DataLoss("unknown format version " +
                            std::to_string(version));
  }
  f.codec = static_cast<DiskCodec>(r.Read<uint8_t>());
  f.element_bytes = r.Read<uint8_t>();
  f.sequence = r.Read<uint64_t>();
  f.payload_bytes = r.Read<uint64_t>();
  f.stored_bytes = r.Read<uint64_t>();
  f.payload_checksum = r.Read<uint64_t>();
  f.stored_checksum = r.Read<uint64_t>();
  f.slot = r.Read<uint64_t>();
  f.fingerprint = r.Bytes(r.Read<uint16_t>());
  const uint32_t num_tokens = r.Read<uint32_t>();
  if (!r.ok() || num_tokens == 0 || num_tokens > kMaxTokens) {
    return Status::DataLoss("bad token count");
  }
  f.token_bytes = r.Bytes(size_t{num_tokens} * sizeof(TokenId));
  const size_t header_end = r.pos();
  const uint64_t header_checksum = r.Read<uint64_t>();
  if (!r.ok()) return Status::DataLoss("header truncated");
  if (header_checksum != Checksum(value.substr(0, header_end))) {
    return Status::DataLoss("header checksum mismatch");
  }
  // The fields below passed the checksum, so they were written so; the
  // checks guard against a writer bug, not against corruption.
  if (f.codec > DiskCodec::kLz4BytePlanes) {
    return Status::DataLoss("unknown codec");
  }
  if (f.payload_bytes >= kMaxPayloadBytes ||
      f.stored_bytes > SlotBytes(f.payload_bytes)) {
    return Status::DataLoss("payload size out of range");
  }
  if (f.codec == DiskCodec::kNone && (f.payload_checksum != f.stored_checksum ||
                                      f.stored_bytes != f.payload_bytes)) {
    return Status::DataLoss("raw payload with two checksums or sizes");
  }
  if (f.slot > kMaxSlot) return Status::DataLoss("slot out of range");
  if (r.pos() != value.size()) {
    return Status::DataLoss("bytes after the header");
  }
  return f;
}

Status VerifyStored(const ValueFields& f) {
  if (f.stored.size() != f.stored_bytes) {
    return Status::DataLoss("stored bytes of the wrong size");
  }
  if (Checksum(f.stored) != f.stored_checksum) {
    return Status::DataLoss("stored bytes checksum mismatch");
  }
  return Status::Ok();
}

namespace {

// Copies `src` to `dst` and returns XXH3-64 of the bytes, in one pass over
// memory: each chunk is hashed while it is still in cache.
uint64_t CopyAndChecksum(std::string_view src, std::byte* dst) {
  constexpr size_t kChunk = size_t{64} << 10;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t pos = 0; pos < src.size(); pos += kChunk) {
    const size_t n = std::min(kChunk, src.size() - pos);
    std::memcpy(dst + pos, src.data() + pos, n);
    XXH3_64bits_update(&state, dst + pos, n);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

// Verifies the stored bytes and decodes them into `out` (the payload size),
// verifying the payload checksum.
Status VerifyAndDecode(const ValueFields& f, std::span<std::byte> out) {
  if (f.codec == DiskCodec::kNone) {
    // The stored checksum is the payload checksum: one pass does both.
    if (f.stored.size() != out.size() || f.stored_bytes != out.size()) {
      return Status::DataLoss("raw payload of the wrong size");
    }
    if (CopyAndChecksum(f.stored, out.data()) != f.stored_checksum) {
      return Status::DataLoss("stored bytes checksum mismatch");
    }
    return Status::Ok();
  }
  TIERKV_RETURN_IF_ERROR(VerifyStored(f));
  TIERKV_RETURN_IF_ERROR(
      DecodePayload(f.codec, f.element_bytes, f.stored, out));
  if (Checksum(AsChars(out)) != f.payload_checksum) {
    return Status::DataLoss("payload checksum mismatch");
  }
  return Status::Ok();
}

bool SameTokens(std::string_view token_bytes, std::span<const TokenId> tokens) {
  return token_bytes.size() == tokens.size_bytes() &&
         std::memcmp(token_bytes.data(), tokens.data(), token_bytes.size()) ==
             0;
}

}  // namespace disk_internal
}  // namespace tierkv
