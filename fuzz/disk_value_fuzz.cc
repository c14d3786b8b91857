// The disk tier's value format (tiers/disk_internal.h) over arbitrary
// bytes: what tierkvd reads back from a RocksDB directory that a crash, a
// bad disk or another local user may have written. The first input byte
// picks the mode (its value modulo 3):
//   0: the rest is a block's record: ParseHeader must refuse it or accept
//      it, never crash; a header that parses re-encodes (EncodeHeader) to
//      exactly the bytes read, and VerifyStored and VerifyAndDecode refuse
//      or accept the input's tail as its stored bytes (as read from the
//      value file). The rest is also a storage key: ParseStorageKey accepts
//      only what DiskStorageKey writes.
//   1: the rest describes a value whose checksums are right (codec, element
//      size, payload size, fingerprint, tokens, then the stored bytes), so
//      the codecs decode arbitrary stored bytes past the checksums, as they
//      would for a value a buggy writer wrote.
//   2: the rest is a payload, stored with a codec and read back: the codec
//      round trip gives the payload back bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "tiers/disk_internal.h"
#include "tiers/disk_tier.h"

namespace tierkv::disk_internal {
namespace {

// Payloads decoded here stay small: a disk tier decodes into one host slot.
constexpr uint64_t kMaxDecodedBytes = 1 << 16;

// Takes fixed-size fields from the front of the input; zero once it is
// used up.
class Input {
 public:
  explicit Input(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  T Take() {
    T value{};
    const size_t n = std::min(sizeof(T), bytes_.size());
    std::memcpy(&value, bytes_.data(), n);
    bytes_.remove_prefix(n);
    return value;
  }
  std::string_view Bytes(size_t n) {
    n = std::min(n, bytes_.size());
    std::string_view out = bytes_.substr(0, n);
    bytes_.remove_prefix(n);
    return out;
  }
  std::string_view rest() const { return bytes_; }

 private:
  std::string_view bytes_;
};

void Decode(const ValueFields& f) {
  (void)VerifyStored(f);
  if (f.payload_bytes > kMaxDecodedBytes) return;
  std::vector<std::byte> out(f.payload_bytes);
  const Status decoded = VerifyAndDecode(f, out);
  if (decoded.ok() && f.codec == DiskCodec::kNone) {
    FUZZ_CHECK(AsChars(out) == f.stored, "a raw payload decoded changed");
  }
  if (decoded.ok()) {
    FUZZ_CHECK(Checksum(AsChars(out)) == f.payload_checksum,
               "a payload accepted against another checksum");
  }
}

void RunValue(std::string_view value) {
  StatusOr<ValueFields> f = ParseHeader(value);
  if (f.ok()) {
    FUZZ_CHECK(
        f->token_bytes.size() % sizeof(TokenId) == 0 && !f->token_bytes.empty(),
        "%zu token bytes", f->token_bytes.size());
    FUZZ_CHECK(EncodeHeader(*f) == value,
               "a parsed record re-encodes differently");
    // The tail of the input stands for the bytes read from the slot.
    f->stored = value.substr(value.size() -
                             std::min<size_t>(value.size(), f->stored_bytes));
    Decode(*f);
  }
  const std::optional<BlockKey> key = ParseStorageKey(value);
  if (key) {
    FUZZ_CHECK(DiskStorageKey(*key) == value,
               "ParseStorageKey accepted a key DiskStorageKey never writes");
  }
}

void RunChecksummed(Input in) {
  ValueFields f;
  f.codec = static_cast<DiskCodec>(in.Take<uint8_t>() % 4);
  f.element_bytes = in.Take<uint8_t>();
  f.sequence = in.Take<uint64_t>();
  f.payload_bytes = in.Take<uint16_t>();
  f.payload_checksum = in.Take<uint64_t>();
  f.fingerprint = in.Bytes(in.Take<uint8_t>());
  const size_t num_tokens = 1 + in.Take<uint8_t>() % 16;
  const std::string tokens(num_tokens * sizeof(TokenId), 'T');
  f.token_bytes = tokens;
  f.stored = in.rest();
  f.stored_bytes = f.stored.size();
  f.stored_checksum = Checksum(f.stored);
  if (f.codec == DiskCodec::kNone) {
    f.payload_checksum = f.stored_checksum;
    f.payload_bytes = f.stored_bytes;
  }
  const std::string value = EncodeHeader(f);
  StatusOr<ValueFields> parsed = ParseHeader(value);
  if (parsed.ok()) parsed->stored = f.stored;  // As read from its slot.
  if (f.codec > DiskCodec::kLz4BytePlanes) {
    FUZZ_CHECK(!parsed.ok(), "a value of an unknown codec parsed");
    return;
  }
  if (f.stored_bytes > SlotBytes(f.payload_bytes)) {
    FUZZ_CHECK(!parsed.ok(), "stored bytes beyond their slot parsed");
    return;
  }
  FUZZ_CHECK(parsed.ok(), "a well-formed value does not parse: %s",
             parsed.status().ToString().c_str());
  FUZZ_CHECK(
      parsed->codec == f.codec && parsed->element_bytes == f.element_bytes &&
          parsed->sequence == f.sequence &&
          parsed->payload_bytes == f.payload_bytes &&
          parsed->stored_bytes == f.stored_bytes && parsed->slot == f.slot &&
          parsed->payload_checksum == f.payload_checksum &&
          parsed->stored_checksum == f.stored_checksum &&
          parsed->fingerprint == f.fingerprint &&
          parsed->token_bytes == f.token_bytes && parsed->stored == f.stored,
      "a value's header does not read back as written");
  FUZZ_CHECK(VerifyStored(*parsed).ok(), "stored bytes fail their checksum");
  Decode(*parsed);
}

void RunCodec(Input in) {
  const auto codec = static_cast<DiskCodec>(in.Take<uint8_t>() % 3);
  const int32_t element_bytes = 1 + in.Take<uint8_t>() % 16;
  const std::string_view text = in.rest();
  const std::span payload(reinterpret_cast<const std::byte*>(text.data()),
                          text.size());
  std::vector<std::byte> stored(
      MaxEncodedBytes(codec, element_bytes, payload.size()));
  StatusOr<EncodedPayload> encoded =
      EncodePayload(codec, element_bytes, payload, stored);
  if (!encoded.ok()) {
    FUZZ_CHECK(codec == DiskCodec::kLz4BytePlanes &&
                   payload.size() % element_bytes != 0,
               "EncodePayload refused: %s",
               encoded.status().ToString().c_str());
    return;
  }
  const std::string_view bytes =
      encoded->codec == DiskCodec::kNone
          ? text
          : AsChars(std::span(stored).first(encoded->bytes));
  std::vector<std::byte> out(payload.size());
  const Status decoded =
      DecodePayload(encoded->codec, element_bytes, bytes, out);
  FUZZ_CHECK(decoded.ok(), "a payload encoded does not decode: %s",
             decoded.ToString().c_str());
  FUZZ_CHECK(AsChars(out) == text, "the codec round trip changed the payload");
}

}  // namespace
}  // namespace tierkv::disk_internal

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace disk = tierkv::disk_internal;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1,
                              size - 1);
  switch (data[0] % 3) {
    case 0:
      disk::RunValue(rest);
      break;
    case 1:
      disk::RunChecksummed(disk::Input(rest));
      break;
    default:
      disk::RunCodec(disk::Input(rest));
      break;
  }
  return 0;
}
