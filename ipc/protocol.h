// The messages between workers (and tierkv-admin) and tierkvd, and their
// byte encoding: a 16-byte frame header (magic, protocol version, type,
// payload length) and a little-endian payload. Decode validates everything
// (magic, version, known type, exact length, counts within limits, enum
// values) and returns a Status instead of trusting the sender: tierkvd
// decodes bytes a buggy or hostile worker wrote.
// Stateless functions; safe from any thread.
#ifndef TIERKV_IPC_PROTOCOL_H_
#define TIERKV_IPC_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "src/coordinator.h"
#include "tierkv/block_key.h"
#include "tierkv/kv_layout.h"
#include "tierkv/status.h"

namespace tierkv::ipc {

inline constexpr uint32_t kFrameMagic = 0x4D564B54;  // "TKVM"
// 4: RegisterRequest and StatsReply carry the model.
// 5: StatsReply counts loads a Finish cancelled and names tierkv's version.
// 6: StatsReply carries each stats struct in its field table's order;
//    WaitIdle.
// 7: RegisterReply passes the host and channel segments as sealed memfds
//    instead of naming them; CommitReply carries a store status; StatsReply
//    the caps' refusals, corrupt slots dropped and each worker's uid, pins
//    and request state.
// 8: StatsReply carries spill and promotion latencies, the attach counters,
//    the store's name, its key fingerprint and block size, slot reservation
//    failures, and the disk tier's degraded state, write errors, space
//    refusals and damaged files.
// 9: RegisterRequest carries the copy roles: a scheduler's rank count, a
//    rank client's scheduler and rank.
// 10: RegisterReply passes the readiness pipe as its third descriptor;
//    LookupBatch;
//    one round trip per chunk: FetchChunk (lookup, pin and load, or a
//    compute lease, waiting for another worker's), PublishChunk (lookup,
//    allocate and commit), and ChunkDone (complete and finish, sent one-way).
// 11: StatsReply carries the host blocks evicted unspilled and the
//     write-behind copies kept on host (spills_kept).
// 12: a LookupRequest may send only what changed since the request's last
//     lookup (kept_tokens, kept_tag); LookupReply names the tokens kept;
//     Route and RouteReply; StatsReply carries the remote tier's stats; a
//     Status may be Aborted.
// 13: HeldKeysReply lists the remote tier's keys apart from the disk
//     tier's.
// 14: LookupChunkRequest, FetchChunkRequest and PublishChunkRequest carry
//     the chunk's virtual start, part of its keys.
// 15: ClearReply and EvictReply say what the remote tier dropped apart
//     from the disk tier.
// 16: LookupChunkRequest, FetchChunkRequest and PublishChunkRequest carry
//     the chunk's variant (its RoPE config and engine variant), part of
//     its keys; RegisterRequest carries the attachment tag.
// 17: A scheduler with an attachment tag that loses a rank ends its
//     attachment: its calls that hand out events answer Unavailable, and
//     no rank attaches for it (vLLM's ranks rely on it: a lost rank no
//     longer attaches again to decline the epoch's events). DiskTierStats
//     carries read_errors.
// 18: DiskTierStats carries writes_stopped and undeleted_removals;
//     ClearReply and EvictReply say when the disk tier's blocks were
//     forgotten, not deleted (its writes stopped until restart).
// 19: HostTierStats carries tenants_reclaimed.
inline constexpr uint16_t kProtocolVersion = 19;
inline constexpr size_t kFrameHeaderBytes = 16;
// Upper bounds a decoder enforces before allocating anything.
inline constexpr uint32_t kMaxTokens = 1 << 20;
inline constexpr uint32_t kMaxBlocks = 1 << 20;
inline constexpr uint32_t kMaxEvents = 1 << 16;
inline constexpr uint32_t kMaxString = 4096;
// A chunk's virtual start is a RoPE position tierkv can remap from.
inline constexpr int64_t kMaxChunkVirtualStart = int64_t{1} << 48;
// Lookups in one LookupBatchRequest: a scheduler step's waiting requests
// (a worker has at most max_requests_per_worker open, 4096 by default).
inline constexpr uint32_t kMaxBatchLookups = 4096;
// A batched lookup's error message is cut to this many bytes, so one
// result of a LookupBatchReply takes at most kMaxBatchResultBytes.
inline constexpr size_t kMaxBatchErrorBytes = 200;
inline constexpr size_t kMaxBatchResultBytes = 1 + 4 + kMaxBatchErrorBytes;
inline constexpr uint32_t kMaxWorkersListed = 4096;
inline constexpr uint32_t kMaxEventsListed = 1024;
// Keys listed per tier by a HeldKeysReply: 16 bytes each, so that a reply
// of three tiers' lists stays under the 1 MiB a client reads.
inline constexpr uint32_t kMaxHeldKeysListed = 16384;

enum class MessageType : uint16_t {
  kError = 1,
  kOk = 2,
  kRegister = 3,
  kRegisterReply = 4,
  kLookup = 5,
  kLookupReply = 6,
  kAllocate = 7,
  kAllocateReply = 8,
  kCommit = 9,
  kCommitReply = 10,
  kComplete = 11,
  kFinish = 12,
  kStats = 13,
  kStatsReply = 14,
  kReadyLoads = 15,
  kReadyLoadsReply = 16,
  kLookupChunk = 17,  // Answered by a LookupReply.
  kEvents = 18,
  kEventsReply = 19,
  kClear = 20,
  kClearReply = 21,
  kEvict = 22,
  kEvictReply = 23,
  kWaitIdle = 24,
  kWaitIdleReply = 25,
  kHeldKeys = 26,
  kHeldKeysReply = 27,
  kRoute = 28,
  kRouteReply = 29,
  kFetchChunk = 40,
  kFetchChunkReply = 41,
  kPublishChunk = 42,  // Answered by a CommitReply.
  kChunkDone = 43,     // Answered by an Ok.
  kLookupBatch = 44,
  kLookupBatchReply = 45,
};

// A failed call: the Status travels back to the caller.
struct ErrorReply {
  Status status;
};
struct OkReply {};

// Over the Unix socket: the first message of a worker.
struct RegisterRequest {
  WorkerRegistration registration;
};
// Sent with three file descriptors (SCM_RIGHTS, on the frame's bytes): the
// host tier's sealed segment, this worker's control channel's, and the read
// end of a pipe tierkvd writes a byte to when loads of the worker that
// waited for promotions are ready (ReadyLoadsRequest then returns them).
inline constexpr int kRegisterReplyFds = 3;
struct RegisterReply {
  WorkerId worker_id = 0;
  int32_t host_slots = 0;  // Including the null slot.
  uint64_t slot_bytes = 0;
  // StoreFingerprint(layout, model) of the store, as its host segment's
  // header records it.
  std::string store_fingerprint;
};

// With kept_tokens > 0, the request's tokens are the first kept_tokens of
// those its last lookup left in tierkvd (named kept_tag by that lookup's
// reply) followed by `tokens`: an engine asking again for a waiting request
// sends only what changed (Coordinator::LookupAgain).
struct LookupRequest {
  RequestId request = 0;
  int32_t num_computed_tokens = 0;
  std::vector<TokenId> tokens;
  RequestExtras extras;
  uint32_t kept_tokens = 0;
  uint64_t kept_tag = 0;
};
// A position-independent chunk, keyed by content (Coordinator::LookupChunk).
struct LookupChunkRequest {
  RequestId request = 0;
  std::vector<TokenId> tokens;
  // The RoPE position the chunk's KV is computed at, and what else it
  // depends on (ChunkVariant): part of its keys.
  int64_t virtual_start = 0;
  BlockKey variant = {};
};
struct LookupReply {
  LookupResult result;
  // Names the tokens tierkvd now keeps for the request (a later lookup's
  // kept_tag); 0 for a chunk lookup, which keeps none to build on.
  uint64_t tokens_tag = 0;
};
struct AllocateRequest {
  RequestId request = 0;
  int32_t num_external_tokens = 0;
  std::vector<BlockId> device_blocks;
};
struct AllocateReply {
  AllocateResult result;
};
struct CommitRequest {
  RequestId request = 0;
  int32_t num_computed_tokens = 0;
  std::vector<BlockId> device_blocks;
};
struct CommitReply {
  CommitResult result;
};
struct CompleteRequest {
  std::vector<CompletedEvent> events;
};
struct FinishRequest {
  RequestId request = 0;
};
// The worker's pending loads whose promotions are done.
struct ReadyLoadsRequest {};
struct ReadyLoadsReply {
  std::vector<TransferEvent> loads;
};
// Over the Unix socket from tierkv-admin, or a worker's channel.
struct StatsRequest {};
struct StatsReply {
  CoordinatorStats stats;
};
// Over the Unix socket from tierkv-admin: the transfer events in flight.
struct EventsRequest {};
struct EventsReply {
  uint64_t in_flight = 0;  // Events in flight, all of them.
  // The oldest of them, oldest first; at most kMaxEventsListed.
  std::vector<EventInfo> events;
};

// Over the Unix socket from tierkv-admin: an operator drops cached blocks
// (Coordinator::Clear, Coordinator::Evict).
struct ClearRequest {
  TierSelection tiers = TierSelection::kAll;
};
struct ClearReply {
  ClearResult result;
};
struct EvictRequest {
  std::vector<BlockKey> keys;  // At most kMaxBlocks.
};
struct EvictReply {
  std::vector<EvictedBlock> blocks;  // One per key, in order.
};

// Over the Unix socket from tierkv-admin: the keys each tier serves now
// (Coordinator::HeldKeys), what the KV cache events a router follows
// describe.
struct HeldKeysRequest {};
struct HeldKeysReply {
  HeldKeys keys;  // At most kMaxHeldKeysListed per tier.
};

// Where a prompt's prefix is cached on this tierkvd (Coordinator::Route),
// for a router: over the Unix socket (tierkv-admin route) for `tenant`, or
// on a worker's channel (Client::Route) for the worker's own tenant, when
// `tenant` is ignored.
struct RouteRequest {
  std::string tenant;
  std::vector<TokenId> tokens;
  RequestExtras extras;
};
struct RouteReply {
  RouteResult result;  // At most kMaxWorkersListed workers.
};

// A worker's channel: wait, at most timeout_ms, until the store's disk tier
// has nothing in flight (TieredStore::WaitIdle).
struct WaitIdleRequest {
  uint32_t timeout_ms = 0;
};
struct WaitIdleReply {
  bool idle = false;  // False: still busy when the timeout passed.
};

// A worker's chunk fetch in one round trip (Coordinator::FetchChunk): a
// miss while another worker holds the chunk's compute lease waits, at most
// wait_ms (and never past kMaxChunkWaitMs), for that worker's publish.
struct FetchChunkRequest {
  RequestId request = 0;
  uint32_t wait_ms = 0;
  std::vector<TokenId> tokens;
  int64_t virtual_start = 0;  // As in LookupChunkRequest.
  BlockKey variant = {};      // As in LookupChunkRequest.
};
struct FetchChunkReply {
  ChunkFetchResult result;  // result.load's device_blocks are empty.
};
// A worker's chunk publish in one round trip (Coordinator::PublishChunk):
// the request is finished by the time the CommitReply comes back.
struct PublishChunkRequest {
  RequestId request = 0;
  std::vector<TokenId> tokens;
  std::vector<BlockId> device_blocks;
  int64_t virtual_start = 0;  // As in LookupChunkRequest.
  BlockKey variant = {};      // As in LookupChunkRequest.
};
// The end of a chunk fetch or publish, which the worker sends without
// waiting for its answer: Complete(events), then Finish(finish) unless it
// is 0. Each applies whatever the other answers; the reply is the first
// error, so an error from the Finish comes back with the events completed.
struct ChunkDoneRequest {
  std::vector<CompletedEvent> events;
  RequestId finish = 0;
};

// A scheduler step's lookups in one message, looked up in order, each as
// its own LookupRequest would be: one failing does not stop the others.
struct LookupBatchRequest {
  std::vector<LookupRequest> lookups;  // At most kMaxBatchLookups.
};
struct LookupBatchReply {
  std::vector<StatusOr<LookupResult>> results;  // One per lookup, in order.
};

using Message = std::variant<
    ErrorReply, OkReply, RegisterRequest, RegisterReply, LookupRequest,
    LookupReply, AllocateRequest, AllocateReply, CommitRequest, CommitReply,
    CompleteRequest, FinishRequest, StatsRequest, StatsReply, ReadyLoadsRequest,
    ReadyLoadsReply, LookupChunkRequest, EventsRequest, EventsReply,
    ClearRequest, ClearReply, EvictRequest, EvictReply, WaitIdleRequest,
    WaitIdleReply, FetchChunkRequest, FetchChunkReply, PublishChunkRequest,
    ChunkDoneRequest, LookupBatchRequest, LookupBatchReply, HeldKeysRequest,
    HeldKeysReply, RouteRequest, RouteReply>;

MessageType TypeOf(const Message& message);
const char* MessageTypeName(MessageType type);

// Appends one frame (header + payload) to `out`.
void Encode(const Message& message, std::vector<std::byte>* out);
std::vector<std::byte> Encode(const Message& message);
// Appends the frame of LookupRequest{request, num_computed_tokens, tokens,
// extras, kept_tokens, kept_tag} (the same bytes) without copying the
// tokens into one first: a worker's most frequent request.
void EncodeLookup(RequestId request, int32_t num_computed_tokens,
                  std::span<const TokenId> tokens, const RequestExtras& extras,
                  uint32_t kept_tokens, uint64_t kept_tag,
                  std::vector<std::byte>* out);
// Appends the frame of a LookupBatchRequest of `queries`, likewise.
void EncodeLookupBatch(std::span<const LookupQuery> queries,
                       std::vector<std::byte>* out);
// The bytes `query` takes in a LookupBatchRequest.
size_t LookupBatchEntryBytes(const LookupQuery& query);

// Payload length announced by a frame header; InvalidArgument when the
// header is not a tierkv frame of this version or announces more than
// `max_payload` bytes. For stream transports that read the header first.
StatusOr<uint32_t> PeekPayloadLength(std::span<const std::byte> header,
                                     uint32_t max_payload);

// Exactly one frame; trailing bytes are an error.
StatusOr<Message> Decode(std::span<const std::byte> frame);
// As Decode, into *out (unspecified after an error). A LookupRequest
// already in *out keeps its token buffer for the next, so a session that
// decodes one request after another allocates nothing for lookups.
Status DecodeInto(std::span<const std::byte> frame, Message* out);

// The Status an ErrorReply carries, or OK for any other message.
Status StatusOf(const Message& message);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_PROTOCOL_H_
