#include "tiers/disk_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack.
#include <lz4.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <xxhash.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tierkv {

// Headers, keys and token ids are written in host order and read back with
// memcpy; the on-disk format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "the disk tier's value format assumes a little-endian host");

std::string_view DiskCodecName(DiskCodec codec) {
  switch (codec) {
    case DiskCodec::kNone:
      return "none";
    case DiskCodec::kLz4:
      return "lz4";
    case DiskCodec::kLz4BytePlanes:
      return "lz4-byte-planes";
  }
  return "unknown";
}

namespace {

constexpr size_t kMaxPayloadBytes = size_t{1} << 30;
constexpr int32_t kMaxElementBytes = 16;
constexpr uint32_t kMaxTokens = 1 << 16;
constexpr uint32_t kMagic = 0x44564b54;  // "TKVD" read as little-endian.
constexpr uint16_t kFormatVersion = 1;
constexpr char kBlockKeyPrefix = 'b';
constexpr size_t kStorageKeyBytes = 17;

std::string_view AsChars(std::span<const std::byte> bytes) {
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
// Byte planes.

void SplitPlanes(const uint8_t* src, size_t elements, int32_t k,
                 uint8_t* planes) {
  size_t i = 0;
  if (k == 2) {
    uint8_t* p0 = planes;
    uint8_t* p1 = planes + elements;
#if defined(__SSE2__)
    const __m128i mask = _mm_set1_epi16(0x00ff);
    for (; i + 16 <= elements; i += 16) {
      const __m128i a =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      const __m128i b =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16));
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(p0 + i),
          _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask)));
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(p1 + i),
          _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
#endif
    for (; i < elements; ++i) {
      p0[i] = src[2 * i];
      p1[i] = src[2 * i + 1];
    }
    return;
  }
  for (int32_t b = 0; b < k; ++b) {
    uint8_t* plane = planes + b * elements;
    for (i = 0; i < elements; ++i) plane[i] = src[i * k + b];
  }
}

void MergePlanes(const uint8_t* const* planes, size_t elements, int32_t k,
                 uint8_t* dst) {
  size_t i = 0;
  if (k == 2) {
    const uint8_t* p0 = planes[0];
    const uint8_t* p1 = planes[1];
#if defined(__SSE2__)
    for (; i + 16 <= elements; i += 16) {
      const __m128i lo =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
      const __m128i hi =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                       _mm_unpacklo_epi8(lo, hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16),
                       _mm_unpackhi_epi8(lo, hi));
    }
#endif
    for (; i < elements; ++i) {
      dst[2 * i] = p0[i];
      dst[2 * i + 1] = p1[i];
    }
    return;
  }
  for (int32_t b = 0; b < k; ++b) {
    const uint8_t* plane = planes[b];
    for (i = 0; i < elements; ++i) dst[i * k + b] = plane[i];
  }
}

// ---------------------------------------------------------------------------
// Payload codecs. Byte-plane stored format: one u32 per plane (its stored
// size; equal to the plane size when the plane is kept raw), then the
// planes in order.

Status CheckCodecArgs(DiskCodec codec, int32_t element_bytes,
                      size_t payload_bytes) {
  if (payload_bytes >= kMaxPayloadBytes) {
    return Status::InvalidArgument("payload of 1 GiB or more");
  }
  switch (codec) {
    case DiskCodec::kNone:
    case DiskCodec::kLz4:
      return Status::Ok();
    case DiskCodec::kLz4BytePlanes:
      if (element_bytes < 1 || element_bytes > kMaxElementBytes) {
        return Status::InvalidArgument("element_bytes must be in [1, 16]");
      }
      if (payload_bytes % element_bytes != 0) {
        return Status::InvalidArgument(
            "element_bytes does not divide the payload size");
      }
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown disk codec");
}

StatusOr<EncodedPayload> EncodeBytePlanes(int32_t k,
                                          std::span<const std::byte> payload,
                                          std::span<std::byte> out) {
  thread_local ScratchBuffer planes_scratch;
  const size_t elements = payload.size() / k;
  auto* planes = reinterpret_cast<uint8_t*>(planes_scratch.Get(payload.size()));
  SplitPlanes(reinterpret_cast<const uint8_t*>(payload.data()), elements, k,
              planes);
  const size_t table_bytes = sizeof(uint32_t) * k;
  char* dst = reinterpret_cast<char*>(out.data());
  size_t pos = table_bytes;
  for (int32_t b = 0; b < k; ++b) {
    const char* plane = reinterpret_cast<const char*>(planes + b * elements);
    const int n = static_cast<int>(elements);
    int written = LZ4_compress_default(plane, dst + pos, n,
                                       static_cast<int>(out.size() - pos));
    if (written <= 0 || written >= n) {  // Incompressible: keep it raw.
      std::memcpy(dst + pos, plane, elements);
      written = n;
    }
    const uint32_t size = static_cast<uint32_t>(written);
    std::memcpy(dst + sizeof(uint32_t) * b, &size, sizeof(size));
    pos += size;
  }
  if (pos >= payload.size()) return EncodedPayload{DiskCodec::kNone, 0};
  return EncodedPayload{DiskCodec::kLz4BytePlanes, pos};
}

Status DecodeBytePlanes(int32_t k, std::string_view stored,
                        std::span<std::byte> out) {
  thread_local ScratchBuffer planes_scratch;
  const size_t elements = out.size() / k;
  const size_t table_bytes = sizeof(uint32_t) * k;
  if (stored.size() < table_bytes) {
    return Status::DataLoss("byte-plane table truncated");
  }
  auto* scratch = reinterpret_cast<uint8_t*>(planes_scratch.Get(out.size()));
  std::array<const uint8_t*, kMaxElementBytes> planes{};
  size_t pos = table_bytes;
  for (int32_t b = 0; b < k; ++b) {
    uint32_t size = 0;
    std::memcpy(&size, stored.data() + sizeof(uint32_t) * b, sizeof(size));
    if (size > stored.size() - pos || size > elements) {
      return Status::DataLoss("byte-plane size out of bounds");
    }
    const char* src = stored.data() + pos;
    if (size == elements) {
      planes[b] = reinterpret_cast<const uint8_t*>(src);
    } else {
      char* dst = reinterpret_cast<char*>(scratch + b * elements);
      const int n = LZ4_decompress_safe(src, dst, static_cast<int>(size),
                                        static_cast<int>(elements));
      if (n != static_cast<int>(elements)) {
        return Status::DataLoss("byte plane does not decompress");
      }
      planes[b] = scratch + b * elements;
    }
    pos += size;
  }
  if (pos != stored.size()) return Status::DataLoss("byte planes too short");
  MergePlanes(planes.data(), elements, k,
              reinterpret_cast<uint8_t*>(out.data()));
  return Status::Ok();
}

}  // namespace

size_t MaxEncodedBytes(DiskCodec codec, int32_t element_bytes,
                       size_t payload_bytes) {
  if (payload_bytes >= kMaxPayloadBytes) return 0;
  const int n = static_cast<int>(payload_bytes);
  switch (codec) {
    case DiskCodec::kNone:
      return 0;
    case DiskCodec::kLz4:
      return static_cast<size_t>(LZ4_compressBound(n));
    case DiskCodec::kLz4BytePlanes: {
      // Every plane is at most its own size (kept raw otherwise), but LZ4
      // needs its bound as room to try.
      const int32_t k = std::clamp(element_bytes, 1, kMaxElementBytes);
      return sizeof(uint32_t) * k + payload_bytes +
             static_cast<size_t>(LZ4_compressBound(n / k));
    }
  }
  return 0;
}

StatusOr<EncodedPayload> EncodePayload(DiskCodec codec, int32_t element_bytes,
                                       std::span<const std::byte> payload,
                                       std::span<std::byte> out) {
  TIERKV_RETURN_IF_ERROR(CheckCodecArgs(codec, element_bytes, payload.size()));
  if (out.size() < MaxEncodedBytes(codec, element_bytes, payload.size())) {
    return Status::InvalidArgument("output shorter than MaxEncodedBytes");
  }
  switch (codec) {
    case DiskCodec::kNone:
      return EncodedPayload{DiskCodec::kNone, 0};
    case DiskCodec::kLz4: {
      const int written = LZ4_compress_default(
          reinterpret_cast<const char*>(payload.data()),
          reinterpret_cast<char*>(out.data()), static_cast<int>(payload.size()),
          static_cast<int>(out.size()));
      if (written <= 0 || static_cast<size_t>(written) >= payload.size()) {
        return EncodedPayload{DiskCodec::kNone, 0};
      }
      return EncodedPayload{DiskCodec::kLz4, static_cast<size_t>(written)};
    }
    case DiskCodec::kLz4BytePlanes:
      return EncodeBytePlanes(element_bytes, payload, out);
  }
  return Status::InvalidArgument("unknown disk codec");
}

Status DecodePayload(DiskCodec codec, int32_t element_bytes,
                     std::string_view stored, std::span<std::byte> out) {
  Status args = CheckCodecArgs(codec, element_bytes, out.size());
  if (!args.ok()) return Status::DataLoss("stored " + args.message());
  switch (codec) {
    case DiskCodec::kNone:
      if (stored.size() != out.size()) {
        return Status::DataLoss("raw payload of the wrong size");
      }
      std::memcpy(out.data(), stored.data(), out.size());
      return Status::Ok();
    case DiskCodec::kLz4: {
      const int n = LZ4_decompress_safe(
          stored.data(), reinterpret_cast<char*>(out.data()),
          static_cast<int>(stored.size()), static_cast<int>(out.size()));
      if (n != static_cast<int>(out.size())) {
        return Status::DataLoss("LZ4 payload does not decompress");
      }
      return Status::Ok();
    }
    case DiskCodec::kLz4BytePlanes:
      return DecodeBytePlanes(element_bytes, stored, out);
  }
  return Status::DataLoss("unknown disk codec");
}

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

namespace {

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

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

uint64_t Checksum(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

// The header of a value, its checksum included; the stored bytes follow.
std::string EncodeHeader(const ValueFields& f) {
  std::string out;
  out.reserve(64 + f.fingerprint.size() + f.token_bytes.size());
  Append(&out, kMagic);
  Append(&out, kFormatVersion);
  Append(&out, static_cast<uint8_t>(f.codec));
  Append(&out, static_cast<uint8_t>(f.element_bytes));
  Append(&out, f.sequence);
  Append(&out, f.payload_bytes);
  Append(&out, static_cast<uint64_t>(f.stored.size()));
  Append(&out, f.payload_checksum);
  Append(&out, f.stored_checksum);
  Append(&out, static_cast<uint16_t>(f.fingerprint.size()));
  out.append(f.fingerprint);
  Append(&out, static_cast<uint32_t>(f.token_bytes.size() / sizeof(TokenId)));
  out.append(f.token_bytes);
  Append(&out, Checksum(out));
  return out;
}

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

// Parses and verifies the header; the stored bytes are VerifyStored's.
StatusOr<ValueFields> ParseHeader(std::string_view value) {
  FieldReader r(value);
  ValueFields f;
  const uint32_t magic = r.Read<uint32_t>();
  const uint16_t version = r.Read<uint16_t>();
  if (!r.ok() || magic != kMagic) return Status::DataLoss("bad magic");
  if (version != kFormatVersion) {
    return Status::DataLoss("unknown format version " +
                            std::to_string(version));
  }
  f.codec = static_cast<DiskCodec>(r.Read<uint8_t>());
  f.element_bytes = r.Read<uint8_t>();
  f.sequence = r.Read<uint64_t>();
  f.payload_bytes = r.Read<uint64_t>();
  const uint64_t stored_bytes = r.Read<uint64_t>();
  f.payload_checksum = r.Read<uint64_t>();
  f.stored_checksum = r.Read<uint64_t>();
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
  if (f.payload_bytes >= kMaxPayloadBytes) {
    return Status::DataLoss("payload size out of range");
  }
  if (f.codec == DiskCodec::kNone && f.payload_checksum != f.stored_checksum) {
    return Status::DataLoss("raw payload with two checksums");
  }
  if (stored_bytes != value.size() - r.pos()) {
    return Status::DataLoss("stored size does not match the value size");
  }
  f.stored = value.substr(r.pos());
  return f;
}

Status VerifyStored(const ValueFields& f) {
  if (Checksum(f.stored) != f.stored_checksum) {
    return Status::DataLoss("stored bytes checksum mismatch");
  }
  return Status::Ok();
}

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

// Verifies the stored bytes and decodes them into `out` (the payload size),
// verifying the payload checksum.
Status VerifyAndDecode(const ValueFields& f, std::span<std::byte> out) {
  if (f.codec == DiskCodec::kNone) {
    // The stored checksum is the payload checksum: one pass does both.
    if (f.stored.size() != out.size()) {
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

// ---------------------------------------------------------------------------
// RocksDB storage.

// RocksDB's Status, as a tierkv Status saying what to do about it.
Status FromRocks(const rocksdb::Status& s, std::string_view what,
                 const std::string& path) {
  if (s.ok()) return Status::Ok();
  std::string msg =
      std::string(what) + " in RocksDB store " + path + ": " + s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) {
    return Status::DataLoss(msg +
                            "; the store's files are damaged: remove the "
                            "directory to start with an empty disk tier");
  }
  if (s.IsNoSpace()) {
    return Status::ResourceExhausted(
        msg + "; free disk space or lower the disk tier's capacity");
  }
  if (s.IsIOError()) {
    if (msg.find("lock") != std::string::npos) {
      return Status::FailedPrecondition(
          msg + "; another process (a running tierkvd?) has this store open");
    }
    if (msg.find("ermission denied") != std::string::npos) {
      return Status::PermissionDenied(msg +
                                      "; check the directory's owner and mode");
    }
    return Status::Unavailable(msg + "; check the disk and the filesystem");
  }
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(msg));
  if (s.IsNotSupported()) return Status::Unimplemented(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut() || s.IsIncomplete()) {
    return Status::Unavailable(std::move(msg) + "; retrying may help");
  }
  return Status::Internal(std::move(msg));
}

// Runs `fn` (returning rocksdb::Status) and converts its result; RocksDB's
// C++ API reports through Status, but allocation can still throw.
template <typename Fn>
Status CallRocks(std::string_view what, const std::string& path, Fn&& fn) {
  try {
    return FromRocks(fn(), what, path);
  } catch (const std::exception& e) {
    return Status::Internal(std::string(what) + " in RocksDB store " + path +
                            " threw: " + e.what());
  }
}

rocksdb::Slice ToSlice(std::string_view s) { return {s.data(), s.size()}; }

class RocksDbStorage final : public DiskStorage {
 public:
  RocksDbStorage(std::string path, rocksdb::DB* db, bool wal)
      : path_(std::move(path)), db_(db) {
    // See RocksDbStorageOptions::write_ahead_log.
    write_options_.disableWAL = !wal;
    // Every value carries its own checksums (verified by the tier), so
    // RocksDB's block and blob checksums would be a second pass over the
    // same bytes. Large values bypass the block cache.
    read_options_.verify_checksums = false;
    read_options_.fill_cache = false;
  }
  ~RocksDbStorage() override {
    // Close flushes memtables; with nobody to report to, a failure here
    // only loses unflushed blocks, which the next Open does not miss.
    rocksdb::Status ignored = db_->Close();
    (void)ignored;
  }

  Status Put(std::string_view key,
             std::span<const std::string_view> value_parts) override {
    return CallRocks("writing a block", path_, [&] {
      std::vector<rocksdb::Slice> parts;
      size_t bytes = key.size();
      for (std::string_view part : value_parts) {
        parts.push_back(ToSlice(part));
        bytes += part.size();
      }
      const rocksdb::Slice k = ToSlice(key);
      rocksdb::WriteBatch batch(bytes + 64);
      rocksdb::Status s = batch.Put(
          rocksdb::SliceParts(&k, 1),
          rocksdb::SliceParts(parts.data(), static_cast<int>(parts.size())));
      return s.ok() ? db_->Write(write_options_, &batch) : s;
    });
  }

  Status Get(std::string_view key, const ValueReader& read) override {
    rocksdb::PinnableSlice value;
    Status s = CallRocks("reading a block", path_, [&] {
      return db_->Get(read_options_, db_->DefaultColumnFamily(), ToSlice(key),
                      &value);
    });
    if (!s.ok()) return s;
    return read(std::string_view(value.data(), value.size()));
  }

  Status Delete(std::string_view key) override {
    return CallRocks("deleting a block", path_,
                     [&] { return db_->Delete(write_options_, ToSlice(key)); });
  }

  Status ForEach(const Visitor& visit) override {
    rocksdb::ReadOptions options = read_options_;
    options.readahead_size = size_t{4} << 20;
    std::unique_ptr<rocksdb::Iterator> it;
    Status status = CallRocks("scanning the store", path_, [&] {
      it.reset(db_->NewIterator(options));
      it->SeekToFirst();
      return it->status();
    });
    while (status.ok() && it->Valid()) {
      status = visit(std::string_view(it->key().data(), it->key().size()),
                     std::string_view(it->value().data(), it->value().size()));
      if (!status.ok()) return status;
      status = CallRocks("scanning the store", path_, [&] {
        it->Next();
        return it->status();
      });
    }
    return status;
  }

  Status Flush() override {
    return CallRocks("flushing memtables", path_, [&] {
      rocksdb::FlushOptions options;
      options.wait = true;
      return db_->Flush(options);
    });
  }

  uint64_t FileBytes() override {
    return IntProperty(rocksdb::DB::Properties::kLiveSstFilesSize) +
           IntProperty(rocksdb::DB::Properties::kLiveBlobFileSize);
  }

 private:
  uint64_t IntProperty(const std::string& name) {
    uint64_t value = 0;
    return db_->GetIntProperty(name, &value) ? value : 0;
  }

  const std::string path_;
  const std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
};

rocksdb::Options RocksOptions(const RocksDbStorageOptions& o) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // Payloads arrive compressed by the tier's own codec.
  options.compression = rocksdb::kNoCompression;
  options.write_buffer_size = o.write_buffer_bytes;
  options.max_write_buffer_number = 2;
  options.keep_log_file_num = 4;
  options.enable_blob_files = o.blob_files;
  options.min_blob_size = 4096;  // Every block; never the tiny ones.
  options.blob_compression_type = rocksdb::kNoCompression;
  // Deleted (evicted) blocks' blob files are reclaimed by compaction.
  options.enable_blob_garbage_collection = true;
  rocksdb::BlockBasedTableOptions table;
  table.checksum = rocksdb::kXXH3;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

}  // namespace

StatusOr<std::unique_ptr<DiskStorage>> OpenRocksDbStorage(
    const RocksDbStorageOptions& options) {
  if (options.path.empty()) {
    return Status::InvalidArgument("disk tier: storage path is empty");
  }
  if (options.write_buffer_bytes < (size_t{1} << 20)) {
    return Status::InvalidArgument(
        "disk tier: write_buffer_bytes must be at least 1 MiB");
  }
  rocksdb::DB* db = nullptr;
  TIERKV_RETURN_IF_ERROR(CallRocks("opening", options.path, [&] {
    return rocksdb::DB::Open(RocksOptions(options), options.path, &db);
  }));
  return std::unique_ptr<DiskStorage>(std::make_unique<RocksDbStorage>(
      options.path, db, options.write_ahead_log));
}

namespace {

// ---------------------------------------------------------------------------
// The index: which keys the tier holds, their sizes, tokens and LRU order,
// and the byte bound. Not thread-safe; DiskTierImpl guards it with mu_.
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
                         std::vector<BlockKey>* victims) {
    auto existing = entries_.find(key);
    if (existing != entries_.end() &&
        existing->second.generation > generation) {
      return false;
    }
    if (bytes > capacity_) {
      return Status::ResourceExhausted(
          "a " + std::to_string(bytes) +
          "-byte value is larger than the disk tier's capacity of " +
          std::to_string(capacity_) + " bytes");
    }
    const bool replaced = Erase(key);
    while (bytes_ + bytes > capacity_) {
      if (lru_.empty()) {
        if (replaced) victims->push_back(key);
        return Status::ResourceExhausted(
            "disk tier full: its capacity is taken by writes in flight");
      }
      victims->push_back(lru_.front());
      Erase(lru_.front());
      ++evictions_;
    }
    // The key's old value, if any, is overwritten rather than deleted.
    Entry& entry = entries_[key];
    entry.generation = generation;
    entry.bytes = bytes;
    entry.tokens.assign(tokens.begin(), tokens.end());
    bytes_ += bytes;
    return true;
  }

  // WRITING -> STORED (most recently used). False if `generation` is no
  // longer the key's: the write was superseded or removed.
  bool Commit(const BlockKey& key, uint64_t generation) {
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.generation != generation) {
      return false;
    }
    it->second.stored = true;
    it->second.lru = lru_.insert(lru_.end(), key);
    return true;
  }

  bool IsCurrent(const BlockKey& key, uint64_t generation) const {
    auto it = entries_.find(key);
    return it != entries_.end() && it->second.generation == generation;
  }

  // Adds a STORED key found on disk as the most recently used; Open inserts
  // in write order. Ignores the bound (EvictToCapacity restores it).
  void InsertStored(const BlockKey& key, uint64_t bytes,
                    std::vector<TokenId> tokens) {
    Erase(key);
    Entry& entry = entries_[key];
    entry.generation = 0;  // Older than every Put of this run.
    entry.bytes = bytes;
    entry.tokens = std::move(tokens);
    entry.stored = true;
    entry.lru = lru_.insert(lru_.end(), key);
    bytes_ += bytes;
  }

  void EvictToCapacity(std::vector<BlockKey>* victims) {
    while (bytes_ > capacity_ && !lru_.empty()) {
      victims->push_back(lru_.front());
      Erase(lru_.front());
      ++evictions_;
    }
  }

  const Entry* FindStored(const BlockKey& key) const {
    auto it = entries_.find(key);
    return it != entries_.end() && it->second.stored ? &it->second : nullptr;
  }

  void Touch(const Entry& entry) { lru_.splice(lru_.end(), lru_, entry.lru); }

  // Any state. True if the key was there.
  bool Erase(const BlockKey& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    if (it->second.stored) lru_.erase(it->second.lru);
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    return true;
  }

  bool EraseIf(const BlockKey& key, uint64_t generation) {
    return IsCurrent(key, generation) && Erase(key);
  }

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

// ---------------------------------------------------------------------------
// A fixed pool of threads running queued tasks in FIFO order.
class IoThreads {
 public:
  explicit IoThreads(int32_t count) {
    for (int32_t i = 0; i < count; ++i)
      threads_.emplace_back([this] { Run(); });
  }
  // Runs what is queued, then joins.
  ~IoThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    work_cv_.notify_one();
  }

  // Waits until no task is queued or running (tasks queued by running tasks
  // included). REQUIRES: not called from a task.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // Stopping, and nothing left.
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
      lock.unlock();
      task();
      task = nullptr;  // Destroy captures outside the lock.
      lock.lock();
      --running_;
      if (queue_.empty() && running_ == 0) idle_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  int32_t running_ = 0;                      // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

struct Counters {
  uint64_t puts = 0;
  uint64_t put_failures = 0;
  uint64_t gets = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t checksum_failures = 0;
  uint64_t token_mismatches = 0;
  uint64_t dropped_on_open = 0;
  uint64_t layout_mismatches = 0;
  uint64_t payload_bytes_written = 0;
  uint64_t stored_bytes_written = 0;
};

// ---------------------------------------------------------------------------
// The tier.
//
// Concurrency: mu_ guards the index and counters and is never held across
// disk I/O. A storage write or delete of a key happens under the key's
// stripe lock, after checking under mu_ that the index still wants it
// (the writer's generation is current; a deleted key is still absent). So a
// delete of an evicted key never lands after a newer Put of the same key,
// and a superseded write never lands after the newer one. Reads take no
// stripe: RocksDB returns either value whole, and both verify.
// Lock order: a stripe, then mu_.
class DiskTierImpl final : public DiskTier {
 public:
  DiskTierImpl(const DiskTierOptions& options,
               std::unique_ptr<DiskStorage> storage)
      : options_(options),
        storage_(std::move(storage)),
        index_(options.capacity_bytes) {}

  ~DiskTierImpl() override {
    if (io_ == nullptr) return;  // Open failed before starting threads.
    // Nobody to report a failed final flush to: the blocks it loses are
    // simply absent next time.
    Status ignored = Flush();
    (void)ignored;
    io_.reset();  // Joins before the members the tasks use go away.
  }

  Status Rebuild();
  void Start() { io_ = std::make_unique<IoThreads>(options_.io_threads); }

  void Put(const BlockKey& key, std::span<const TokenId> tokens,
           std::span<const std::byte> payload, Done done) override {
    // Numbered here, so that of two Puts of a key in flight together the
    // one queued later wins.
    const uint64_t generation = next_generation_.fetch_add(1);
    std::vector<TokenId> owned(tokens.begin(), tokens.end());
    io_->Submit([this, key, generation, owned = std::move(owned), payload,
                 done = std::move(done)] {
      done(PutNow(key, generation, owned, payload));
    });
  }

  void Get(const BlockKey& key, std::span<const TokenId> tokens,
           std::span<std::byte> out, Done done) override {
    std::vector<TokenId> owned(tokens.begin(), tokens.end());
    io_->Submit([this, key, owned = std::move(owned), out,
                 done = std::move(done)] { done(GetNow(key, owned, out)); });
  }

  bool Contains(const BlockKey& key) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return index_.FindStored(key) != nullptr;
  }

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const DiskIndex::Entry* entry = index_.FindStored(key);
    return entry != nullptr && std::ranges::equal(entry->tokens, tokens);
  }

  bool Remove(const BlockKey& key) override {
    bool stored = false;
    bool erased = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stored = index_.FindStored(key) != nullptr;
      erased = index_.Erase(key);
    }
    if (erased) io_->Submit([this, key] { DeleteIfAbsent(key); });
    return stored;
  }

  uint64_t RemoveAll() override {
    std::vector<BlockKey> keys;
    {
      std::lock_guard<std::mutex> lock(mu_);
      keys = index_.StoredKeys();
      for (const BlockKey& key : keys) index_.Erase(key);
    }
    const uint64_t removed = keys.size();
    // One task: a large tier must not flood the I/O queue.
    if (removed > 0) {
      io_->Submit([this, keys = std::move(keys)] {
        for (const BlockKey& key : keys) DeleteIfAbsent(key);
      });
    }
    return removed;
  }

  Status Flush() override {
    io_->Drain();
    return storage_->Flush();
  }

  DiskTierStats stats() const override;

 private:
  Status PutNow(const BlockKey& key, uint64_t generation,
                std::span<const TokenId> tokens,
                std::span<const std::byte> payload);
  Status WriteReserved(const BlockKey& key, uint64_t generation,
                       std::string_view header, std::string_view stored);
  Status GetNow(const BlockKey& key, std::span<const TokenId> tokens,
                std::span<std::byte> out);
  Status ReadValue(const BlockKey& key, std::span<const TokenId> tokens,
                   std::span<std::byte> out);
  Status CheckLayout(const ValueFields& fields) const;
  // Deletes `key` from storage unless the index holds it again.
  void DeleteIfAbsent(const BlockKey& key);
  // Forgets and deletes `key` if its entry is still `generation`.
  void DropIfCurrent(const BlockKey& key, uint64_t generation);
  void DeleteVictims(const std::vector<BlockKey>& victims) {
    for (const BlockKey& victim : victims) DeleteIfAbsent(victim);
  }
  std::mutex& StripeFor(const BlockKey& key) {
    return stripes_[key.lo % stripes_.size()];
  }

  const DiskTierOptions options_;
  const std::unique_ptr<DiskStorage> storage_;
  std::array<std::mutex, 16> stripes_;
  std::atomic<uint64_t> next_generation_{1};
  std::atomic<uint64_t> next_sequence_{1};
  mutable std::mutex mu_;
  DiskIndex index_;    // GUARDED_BY(mu_)
  Counters counters_;  // GUARDED_BY(mu_)
  std::unique_ptr<IoThreads> io_;
};

Status DiskTierImpl::PutNow(const BlockKey& key, uint64_t generation,
                            std::span<const TokenId> tokens,
                            std::span<const std::byte> payload) {
  if (payload.size() != options_.block_bytes) {
    return Status::InvalidArgument(
        "disk tier Put: payload is " + std::to_string(payload.size()) +
        " bytes, a block is " + std::to_string(options_.block_bytes));
  }
  if (tokens.empty() || tokens.size() > kMaxTokens) {
    return Status::InvalidArgument("disk tier Put: 1 to 65536 token ids");
  }
  thread_local ScratchBuffer scratch;
  const size_t max_stored =
      MaxEncodedBytes(options_.codec, options_.element_bytes, payload.size());
  std::span<std::byte> out(scratch.Get(max_stored), max_stored);
  TIERKV_ASSIGN_OR_RETURN(
      EncodedPayload encoded,
      EncodePayload(options_.codec, options_.element_bytes, payload, out));
  const std::string_view stored = encoded.codec == DiskCodec::kNone
                                      ? AsChars(payload)
                                      : AsChars(out.first(encoded.bytes));
  const uint64_t payload_checksum = Checksum(AsChars(payload));
  const std::string header = EncodeHeader(ValueFields{
      .codec = encoded.codec,
      .element_bytes = options_.element_bytes,
      .sequence = next_sequence_.fetch_add(1),
      .payload_bytes = payload.size(),
      .payload_checksum = payload_checksum,
      // Raw payloads (the common case for incompressible data) hash once.
      .stored_checksum = encoded.codec == DiskCodec::kNone ? payload_checksum
                                                           : Checksum(stored),
      .fingerprint = options_.layout_fingerprint,
      .token_bytes = AsChars(std::as_bytes(tokens)),
      .stored = stored,
  });

  const uint64_t bytes = header.size() + stored.size();
  std::vector<BlockKey> victims;
  StatusOr<bool> reserved = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved = index_.Reserve(key, generation, bytes, tokens, &victims);
    if (!reserved.ok()) ++counters_.put_failures;
  }
  DeleteVictims(victims);
  if (!reserved.ok()) return reserved.status();
  if (!*reserved) return Status::Ok();  // A later Put of the key won.
  return WriteReserved(key, generation, header, stored);
}

Status DiskTierImpl::WriteReserved(const BlockKey& key, uint64_t generation,
                                   std::string_view header,
                                   std::string_view stored) {
  std::lock_guard<std::mutex> stripe(StripeFor(key));
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Superseded by a newer Put or removed: the newer state wins.
    if (!index_.IsCurrent(key, generation)) return Status::Ok();
  }
  const std::string storage_key = DiskStorageKey(key);
  const std::string_view parts[2] = {header, stored};
  Status s = storage_->Put(storage_key, parts);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok()) {
      index_.Commit(key, generation);
      ++counters_.puts;
      counters_.payload_bytes_written += options_.block_bytes;
      counters_.stored_bytes_written += header.size() + stored.size();
      return s;
    }
    index_.EraseIf(key, generation);
    ++counters_.put_failures;
  }
  // Whatever is left under the key must not outlive its index entry. A
  // failing disk may fail this too; the next Open verifies every value.
  Status ignored = storage_->Delete(storage_key);
  (void)ignored;
  return s;
}

Status DiskTierImpl::GetNow(const BlockKey& key,
                            std::span<const TokenId> tokens,
                            std::span<std::byte> out) {
  if (out.size() != options_.block_bytes) {
    return Status::InvalidArgument(
        "disk tier Get: buffer is " + std::to_string(out.size()) +
        " bytes, a block is " + std::to_string(options_.block_bytes));
  }
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.gets;
    const DiskIndex::Entry* entry = index_.FindStored(key);
    if (entry == nullptr) {
      ++counters_.misses;
      return Status::NotFound("block " + key.ToHex() + " is not on disk");
    }
    if (!std::ranges::equal(entry->tokens, tokens)) {
      ++counters_.misses;
      ++counters_.token_mismatches;
      return Status::NotFound("block " + key.ToHex() +
                              " is on disk for other token ids");
    }
    index_.Touch(*entry);
    generation = entry->generation;
  }
  Status s = ReadValue(key, tokens, out);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok()) {
      ++counters_.hits;
    } else if (s.code() == StatusCode::kNotFound) {
      ++counters_.misses;  // Evicted, removed or rewritten meanwhile.
    } else if (s.code() == StatusCode::kDataLoss) {
      ++counters_.checksum_failures;
    }
  }
  if (s.code() == StatusCode::kDataLoss) DropIfCurrent(key, generation);
  return s;
}

Status DiskTierImpl::ReadValue(const BlockKey& key,
                               std::span<const TokenId> tokens,
                               std::span<std::byte> out) {
  return storage_->Get(DiskStorageKey(key), [&](std::string_view value) {
    StatusOr<ValueFields> fields = ParseHeader(value);
    Status s = fields.ok() ? CheckLayout(*fields) : fields.status();
    if (s.ok() && !SameTokens(fields->token_bytes, tokens)) {
      // Rewritten for other tokens since the index check: a miss.
      return Status::NotFound("block " + key.ToHex() +
                              " was rewritten for other token ids");
    }
    if (s.ok()) s = VerifyAndDecode(*fields, out);
    if (!s.ok()) {
      return Status::DataLoss("disk tier block " + key.ToHex() +
                              " failed verification (" + s.message() +
                              "); deleted");
    }
    return s;
  });
}

Status DiskTierImpl::CheckLayout(const ValueFields& fields) const {
  if (fields.fingerprint != options_.layout_fingerprint) {
    return Status::FailedPrecondition("written for layout \"" +
                                      std::string(fields.fingerprint) + "\"");
  }
  if (fields.payload_bytes != options_.block_bytes) {
    return Status::FailedPrecondition(
        "block of " + std::to_string(fields.payload_bytes) + " bytes");
  }
  return Status::Ok();
}

void DiskTierImpl::DeleteIfAbsent(const BlockKey& key) {
  std::lock_guard<std::mutex> stripe(StripeFor(key));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.Contains(key)) return;  // Put again: its writer owns it.
  }
  // A failed delete leaves a value the index does not know: it takes disk
  // space until the next Open verifies and indexes it again.
  Status ignored = storage_->Delete(DiskStorageKey(key));
  (void)ignored;
}

void DiskTierImpl::DropIfCurrent(const BlockKey& key, uint64_t generation) {
  std::lock_guard<std::mutex> stripe(StripeFor(key));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!index_.EraseIf(key, generation)) return;
  }
  Status ignored = storage_->Delete(DiskStorageKey(key));
  (void)ignored;
}

DiskTierStats DiskTierImpl::stats() const {
  DiskTierStats out;
  out.capacity_bytes = options_.capacity_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.bytes = index_.bytes();
    out.keys = index_.stored_keys();
    out.evictions = index_.evictions();
    const Counters& c = counters_;
    out.puts = c.puts;
    out.put_failures = c.put_failures;
    out.gets = c.gets;
    out.hits = c.hits;
    out.misses = c.misses;
    out.checksum_failures = c.checksum_failures;
    out.token_mismatches = c.token_mismatches;
    out.dropped_on_open = c.dropped_on_open;
    out.layout_mismatches = c.layout_mismatches;
    out.payload_bytes_written = c.payload_bytes_written;
    out.stored_bytes_written = c.stored_bytes_written;
  }
  out.file_bytes = storage_->FileBytes();
  return out;
}

// One value found by Open's scan.
struct FoundValue {
  BlockKey key;
  uint64_t sequence = 0;
  uint64_t bytes = 0;
  std::vector<TokenId> tokens;
};

// Reports a rebuild's progress at least every 1% of the bytes to read.
class Progress {
 public:
  Progress(std::function<void(const RebuildProgress&)> fn, uint64_t total)
      : fn_(std::move(fn)), step_(std::max<uint64_t>(1, total / 100)) {
    p_.total_bytes = total;
  }
  void Step(uint64_t bytes) {
    ++p_.values;
    p_.bytes_read += bytes;
    p_.total_bytes = std::max(p_.total_bytes, p_.bytes_read);
    if (fn_ && p_.bytes_read >= next_) {
      next_ = p_.bytes_read + step_;
      fn_(p_);
    }
  }
  void Finish() {
    p_.done = true;
    p_.total_bytes = p_.bytes_read;
    if (fn_) fn_(p_);
  }

 private:
  std::function<void(const RebuildProgress&)> fn_;
  RebuildProgress p_;
  uint64_t step_;
  uint64_t next_ = 0;
};

// Runs on the Open thread before the I/O threads start: no lock contention,
// but the index is still only touched under mu_.
Status DiskTierImpl::Rebuild() {
  std::vector<FoundValue> found;
  std::vector<std::string> bad;
  uint64_t layout_mismatches = 0;
  Progress progress(options_.progress, storage_->FileBytes());
  TIERKV_RETURN_IF_ERROR(storage_->ForEach(
      [&](std::string_view key, std::string_view value) -> Status {
        progress.Step(key.size() + value.size());
        std::optional<BlockKey> block_key = ParseStorageKey(key);
        StatusOr<ValueFields> fields = ParseHeader(value);
        if (fields.ok() && !VerifyStored(*fields).ok()) {
          fields = Status::DataLoss("stored bytes checksum mismatch");
        }
        if (!block_key || !fields.ok()) {
          bad.emplace_back(key);
          return Status::Ok();
        }
        if (!CheckLayout(*fields).ok()) {
          bad.emplace_back(key);
          ++layout_mismatches;
          return Status::Ok();
        }
        FoundValue v{.key = *block_key,
                     .sequence = fields->sequence,
                     .bytes = value.size(),
                     .tokens = {}};
        v.tokens.resize(fields->token_bytes.size() / sizeof(TokenId));
        std::memcpy(v.tokens.data(), fields->token_bytes.data(),
                    fields->token_bytes.size());
        found.push_back(std::move(v));
        return Status::Ok();
      }));
  for (const std::string& key : bad) {
    TIERKV_RETURN_IF_ERROR(storage_->Delete(key));
  }
  std::sort(found.begin(), found.end(),
            [](const FoundValue& a, const FoundValue& b) {
              return a.sequence < b.sequence;
            });
  std::vector<BlockKey> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (FoundValue& v : found) {
      index_.InsertStored(v.key, v.bytes, std::move(v.tokens));
    }
    index_.EvictToCapacity(&victims);
    counters_.dropped_on_open = bad.size();
    counters_.layout_mismatches = layout_mismatches;
  }
  for (const BlockKey& victim : victims) {
    TIERKV_RETURN_IF_ERROR(storage_->Delete(DiskStorageKey(victim)));
  }
  next_sequence_ = found.empty() ? 1 : found.back().sequence + 1;
  progress.Finish();
  return Status::Ok();
}

Status ValidateOptions(const DiskTierOptions& o) {
  if (o.capacity_bytes == 0) {
    return Status::InvalidArgument("disk tier: capacity_bytes is 0");
  }
  if (o.layout_fingerprint.empty() || o.layout_fingerprint.size() > 4096) {
    return Status::InvalidArgument(
        "disk tier: layout_fingerprint must be 1 to 4096 bytes");
  }
  if (o.block_bytes == 0) {
    return Status::InvalidArgument("disk tier: block_bytes is 0");
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return Status::InvalidArgument("disk tier: io_threads must be 1 to 64");
  }
  Status codec = CheckCodecArgs(o.codec, o.element_bytes, o.block_bytes);
  if (!codec.ok()) {
    return Status::InvalidArgument("disk tier: " + codec.message());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options) {
  TIERKV_RETURN_IF_ERROR(ValidateOptions(options));
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<DiskStorage> storage,
                          OpenRocksDbStorage(options.storage));
  return Open(options, std::move(storage));
}

StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options, std::unique_ptr<DiskStorage> storage) {
  TIERKV_RETURN_IF_ERROR(ValidateOptions(options));
  if (storage == nullptr) {
    return Status::InvalidArgument("disk tier: storage is null");
  }
  auto tier = std::make_unique<DiskTierImpl>(options, std::move(storage));
  TIERKV_RETURN_IF_ERROR(tier->Rebuild());
  tier->Start();
  return std::unique_ptr<DiskTier>(std::move(tier));
}

}  // namespace tierkv
