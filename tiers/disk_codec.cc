// The disk tier's payload codecs: byte planes (splitting a payload of
// k-byte elements into k planes and merging them back), LZ4 over the whole
// payload or over each byte plane, and the codecs' argument checks.
#include <lz4.h>

#include "tiers/disk_tier.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>

#include "tiers/disk_internal.h"

namespace tierkv {

using disk_internal::CheckCodecArgs;
using disk_internal::kMaxPayloadBytes;
using disk_internal::ScratchBuffer;

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

constexpr int32_t kMaxElementBytes = 16;

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

}  // namespace

// ---------------------------------------------------------------------------
// Payload codecs. Byte-plane stored format: one u32 per plane (its stored
// size; equal to the plane size when the plane is kept raw), then the
// planes in order.

namespace disk_internal {

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

}  // namespace disk_internal

namespace {

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
  // Nothing to compress (and an empty span's data() may be null, which
  // neither memcpy nor LZ4 may be given).
  if (payload.empty()) return EncodedPayload{DiskCodec::kNone, 0};
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
      if (!out.empty()) std::memcpy(out.data(), stored.data(), out.size());
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

}  // namespace tierkv
