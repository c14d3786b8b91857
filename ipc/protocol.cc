// Frames (ipc/protocol.h): the message types, Encode, Decode and the frame
// header; the payloads are in protocol_worker.cc, protocol_stats.cc and
// protocol_admin.cc over the primitives of ipc/wire.h.
#include "ipc/protocol.h"

#include <string>
#include <utility>
#include <variant>

#include "ipc/wire.h"

namespace tierkv::ipc {
namespace wire {

// ---- Per message ---------------------------------------------------------

void PutPayload(Writer& w, const ErrorReply& m) { Put(w, m.status); }
void PutPayload(Writer&, const OkReply&) {}
void GetPayload(Reader& r, ErrorReply* m) {
  m->status = GetStatus(r);
  if (m->status.ok()) r.Fail("error reply carrying OK");
}
void GetPayload(Reader&, OkReply*) {}

}  // namespace wire

namespace {

using wire::Reader;
using wire::Writer;

constexpr MessageType kTypes[] = {
    MessageType::kError,
    MessageType::kOk,
    MessageType::kRegister,
    MessageType::kRegisterReply,
    MessageType::kLookup,
    MessageType::kLookupReply,
    MessageType::kAllocate,
    MessageType::kAllocateReply,
    MessageType::kCommit,
    MessageType::kCommitReply,
    MessageType::kComplete,
    MessageType::kFinish,
    MessageType::kStats,
    MessageType::kStatsReply,
    MessageType::kReadyLoads,
    MessageType::kReadyLoadsReply,
    MessageType::kLookupChunk,
    MessageType::kEvents,
    MessageType::kEventsReply,
    MessageType::kClear,
    MessageType::kClearReply,
    MessageType::kEvict,
    MessageType::kEvictReply,
    MessageType::kWaitIdle,
    MessageType::kWaitIdleReply,
    MessageType::kFetchChunk,
    MessageType::kFetchChunkReply,
    MessageType::kPublishChunk,
    MessageType::kChunkDone,
    MessageType::kLookupBatch,
    MessageType::kLookupBatchReply,
    MessageType::kHeldKeys,
    MessageType::kHeldKeysReply,
    MessageType::kRoute,
    MessageType::kRouteReply,
};
static_assert(std::size(kTypes) == std::variant_size_v<Message>);

// The variant alternative with index I, decoded.
template <size_t I>
Message DecodeAs(Reader& r) {
  std::variant_alternative_t<I, Message> m;
  GetPayload(r, &m);
  return m;
}

template <size_t... I>
Message DecodeIndex(size_t index, Reader& r, std::index_sequence<I...>) {
  Message out;
  ((index == I ? (out = DecodeAs<I>(r), 0) : 0), ...);
  return out;
}

StatusOr<size_t> IndexOfType(uint16_t type) {
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    if (static_cast<uint16_t>(kTypes[i]) == type) return i;
  }
  return Status::InvalidArgument("unknown message type " +
                                 std::to_string(type));
}

}  // namespace

MessageType TypeOf(const Message& message) { return kTypes[message.index()]; }

const char* MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kError:
      return "Error";
    case MessageType::kOk:
      return "Ok";
    case MessageType::kRegister:
      return "Register";
    case MessageType::kRegisterReply:
      return "RegisterReply";
    case MessageType::kLookup:
      return "Lookup";
    case MessageType::kLookupReply:
      return "LookupReply";
    case MessageType::kAllocate:
      return "Allocate";
    case MessageType::kAllocateReply:
      return "AllocateReply";
    case MessageType::kCommit:
      return "Commit";
    case MessageType::kCommitReply:
      return "CommitReply";
    case MessageType::kComplete:
      return "Complete";
    case MessageType::kFinish:
      return "Finish";
    case MessageType::kStats:
      return "Stats";
    case MessageType::kStatsReply:
      return "StatsReply";
    case MessageType::kWaitIdle:
      return "WaitIdle";
    case MessageType::kWaitIdleReply:
      return "WaitIdleReply";
    case MessageType::kReadyLoads:
      return "ReadyLoads";
    case MessageType::kReadyLoadsReply:
      return "ReadyLoadsReply";
    case MessageType::kLookupChunk:
      return "LookupChunk";
    case MessageType::kEvents:
      return "Events";
    case MessageType::kEventsReply:
      return "EventsReply";
    case MessageType::kClear:
      return "Clear";
    case MessageType::kClearReply:
      return "ClearReply";
    case MessageType::kEvict:
      return "Evict";
    case MessageType::kEvictReply:
      return "EvictReply";
    case MessageType::kFetchChunk:
      return "FetchChunk";
    case MessageType::kFetchChunkReply:
      return "FetchChunkReply";
    case MessageType::kPublishChunk:
      return "PublishChunk";
    case MessageType::kChunkDone:
      return "ChunkDone";
    case MessageType::kLookupBatch:
      return "LookupBatch";
    case MessageType::kLookupBatchReply:
      return "LookupBatchReply";
    case MessageType::kHeldKeys:
      return "HeldKeys";
    case MessageType::kHeldKeysReply:
      return "HeldKeysReply";
    case MessageType::kRoute:
      return "Route";
    case MessageType::kRouteReply:
      return "RouteReply";
  }
  return "?";
}

namespace {

// Appends a frame of `type` whose payload `put` writes.
template <typename Put>
void EncodeFrame(MessageType type, Put put, std::vector<std::byte>* out) {
  const size_t start = out->size();
  Writer w(out);
  w.Int<uint32_t>(kFrameMagic);
  w.Int<uint16_t>(kProtocolVersion);
  w.Int<uint16_t>(static_cast<uint16_t>(type));
  w.Int<uint32_t>(0);  // Payload length, patched below.
  w.Int<uint32_t>(0);  // Reserved.
  put(w);
  const auto len =
      static_cast<uint32_t>(out->size() - start - kFrameHeaderBytes);
  for (size_t i = 0; i < 4; ++i) {
    (*out)[start + 8 + i] = static_cast<std::byte>((len >> (8 * i)) & 0xFF);
  }
}

}  // namespace

void Encode(const Message& message, std::vector<std::byte>* out) {
  EncodeFrame(
      TypeOf(message),
      [&message](Writer& w) {
        std::visit([&w](const auto& m) { PutPayload(w, m); }, message);
      },
      out);
}

void EncodeLookup(RequestId request, int32_t num_computed_tokens,
                  std::span<const TokenId> tokens, const RequestExtras& extras,
                  uint32_t kept_tokens, uint64_t kept_tag,
                  std::vector<std::byte>* out) {
  EncodeFrame(
      MessageType::kLookup,
      [&](Writer& w) {
        PutLookup(w, request, num_computed_tokens, tokens, extras, kept_tokens,
                  kept_tag);
      },
      out);
}

void EncodeLookupBatch(std::span<const LookupQuery> queries,
                       std::vector<std::byte>* out) {
  EncodeFrame(
      MessageType::kLookupBatch,
      [&](Writer& w) {
        w.Int<uint32_t>(static_cast<uint32_t>(queries.size()));
        for (const LookupQuery& q : queries) {
          PutLookup(w, q.request, q.num_computed_tokens, q.tokens, q.extras,
                    /*kept_tokens=*/0, /*kept_tag=*/0);
        }
      },
      out);
}

size_t LookupBatchEntryBytes(const LookupQuery& query) {
  // PutLookup: request, computed tokens, token count and tokens, LoRA flag
  // and id, item count and items, salt length and salt, kept tokens and
  // their tag.
  return 8 + 4 + 4 + query.tokens.size_bytes() + 1 + 8 + 4 +
         query.extras.mm_items.size() * 32 + 4 +
         query.extras.cache_salt.size() + 4 + 8;
}

std::vector<std::byte> Encode(const Message& message) {
  std::vector<std::byte> out;
  Encode(message, &out);
  return out;
}

StatusOr<uint32_t> PeekPayloadLength(std::span<const std::byte> header,
                                     uint32_t max_payload) {
  if (header.size() < kFrameHeaderBytes) {
    return Status::InvalidArgument("truncated frame header (" +
                                   std::to_string(header.size()) + " bytes)");
  }
  Reader r(header.first(kFrameHeaderBytes));
  const auto magic = r.Int<uint32_t>();
  const auto version = r.Int<uint16_t>();
  r.Int<uint16_t>();
  const auto len = r.Int<uint32_t>();
  if (magic != kFrameMagic) {
    return Status::InvalidArgument("not a tierkv frame (bad magic)");
  }
  if (version != kProtocolVersion) {
    return Status::FailedPrecondition(
        "protocol version " + std::to_string(version) + "; this side speaks " +
        std::to_string(kProtocolVersion));
  }
  if (len > max_payload) {
    return Status::InvalidArgument("frame payload of " + std::to_string(len) +
                                   " bytes exceeds " +
                                   std::to_string(max_payload));
  }
  return len;
}

StatusOr<Message> Decode(std::span<const std::byte> frame) {
  Message m;
  TIERKV_RETURN_IF_ERROR(DecodeInto(frame, &m));
  return m;
}

Status DecodeInto(std::span<const std::byte> frame, Message* out) {
  TIERKV_ASSIGN_OR_RETURN(uint32_t len, PeekPayloadLength(frame, UINT32_MAX));
  if (frame.size() != kFrameHeaderBytes + len) {
    return Status::InvalidArgument("frame of " + std::to_string(frame.size()) +
                                   " bytes announces " + std::to_string(len) +
                                   " payload bytes");
  }
  Reader header(frame.first(kFrameHeaderBytes));
  header.Int<uint32_t>();
  header.Int<uint16_t>();
  const auto type = header.Int<uint16_t>();
  TIERKV_ASSIGN_OR_RETURN(size_t index, IndexOfType(type));
  Reader r(frame.subspan(kFrameHeaderBytes));
  auto* lookup = std::get_if<LookupRequest>(out);
  if (lookup != nullptr && kTypes[index] == MessageType::kLookup) {
    // The tokens' buffer is kept: a 4,096-token request is 16 KiB that
    // need not be allocated and zeroed again for every lookup.
    LookupRequest fresh;
    fresh.tokens = std::move(lookup->tokens);
    *lookup = std::move(fresh);
    GetPayload(r, lookup);
  } else {
    *out = DecodeIndex(
        index, r, std::make_index_sequence<std::variant_size_v<Message>>());
  }
  const char* name = MessageTypeName(kTypes[index]);
  if (!r.ok()) {
    return Status::InvalidArgument(std::string("malformed ") + name + ": " +
                                   r.error());
  }
  if (!r.at_end()) {
    return Status::InvalidArgument(std::string("malformed ") + name + ": " +
                                   "trailing bytes after byte " +
                                   std::to_string(r.pos()));
  }
  return Status::Ok();
}

Status StatusOf(const Message& message) {
  if (const auto* e = std::get_if<ErrorReply>(&message)) return e->status;
  return Status::Ok();
}

}  // namespace tierkv::ipc
