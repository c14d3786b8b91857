// Transfer events and the results of a worker's calls (tierkv/client.h).
// tierkv decides what moves between the engine's device blocks and the
// store's host slots; the worker copies it and reports completion, as vLLM's
// SimpleCPUOffloadConnector does with its load and store events.
#ifndef TIERKV_INCLUDE_TIERKV_TRANSFER_H_
#define TIERKV_INCLUDE_TIERKV_TRANSFER_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

// The most rank clients (tensor-parallel workers) that copy the events of
// one scheduler (ClientOptions::ranks in tierkv/client.h).
inline constexpr int32_t kMaxRanks = 64;

enum class EventKind : uint8_t { kLoad = 1, kStore = 2 };
const char* EventKindName(EventKind kind);  // "load", "store"

// Loads and stores are numbered separately per worker from 0.
struct EventRef {
  EventKind kind = EventKind::kStore;
  uint64_t id = 0;
  friend bool operator==(const EventRef&, const EventRef&) = default;
};

// A copy the worker must run: device_blocks[i] <-> host_blocks[i].
struct TransferEvent {
  EventRef ref;
  RequestId request = 0;
  std::vector<BlockId> device_blocks;  // Store: sources. Load: destinations.
  std::vector<BlockId> host_blocks;    // Store: destinations. Load: sources.
  // Load: blocks after these that are not loaded (their promotion from the
  // disk tier failed); the engine recomputes them.
  int32_t failed_blocks = 0;
};

struct LookupResult {
  // Tokens after num_computed_tokens found on host or the disk tier.
  int32_t hit_tokens = 0;
  // Of hit_tokens, those in blocks only the disk tier holds: loading them
  // waits for a promotion.
  int32_t disk_hit_tokens = 0;
};

// Where a prompt's prefix is cached on one tierkvd (Client::Route,
// tierkv-admin route), for a router choosing the node to send it to.
struct RouteWorker {
  WorkerId id = 0;
  std::string name;
  int32_t pid = 0;
  friend bool operator==(const RouteWorker&, const RouteWorker&) = default;
};
struct RouteResult {
  // The prompt's full blocks, in tokens (a lookup reports at most one
  // token fewer: the last is always computed).
  int32_t prompt_tokens = 0;
  // Of those, the run cached from the first block on, in tokens: what a
  // lookup by a worker of the tenant would find now.
  int32_t cached_tokens = 0;
  // Of cached_tokens, those in blocks only the lower tier (disk, remote)
  // holds: a load waits for their promotion to host.
  int32_t lower_tokens = 0;
  // The workers of the tenant attached now: any of them can load the run
  // (the host tier is the tenant's, shared by its workers on this node).
  std::vector<RouteWorker> workers = {};
  friend bool operator==(const RouteResult&, const RouteResult&) = default;
};

// One lookup of a batch (Client::LookupBatch): Lookup's arguments. The
// tokens are the caller's; they must stay valid during the call.
struct LookupQuery {
  RequestId request = 0;
  std::span<const TokenId> tokens = {};
  int32_t num_computed_tokens = 0;
  RequestExtras extras = {};
};

struct AllocateResult {
  std::optional<TransferEvent> load;
  // The load waits for promotions from the disk tier: do not copy it yet.
  // It is handed out (possibly cut short) when they are done.
  bool load_pending = false;
  // OK, or ResourceExhausted when every host slot is pinned, or this
  // worker's share of them (the message names the cap): the request runs,
  // but nothing it computes can be stored now.
  Status store_status;
};

struct CommitResult {
  std::vector<TransferEvent> stores;  // Zero or one event.
  // Full blocks not stored: no slot was free, the worker was at one of its
  // caps (see store_status), or an operator dropped the key while its spill
  // runs (Evict, Clear).
  int32_t skipped_blocks = 0;
  // OK, or ResourceExhausted naming the cap that skipped blocks: the
  // worker's share of the host slots is pinned, or it has its cap of
  // transfer events in flight. It stores more once its transfers complete.
  Status store_status;
};

// A chunk fetch (Client::FetchChunk): the chunk looked up by content and,
// when host DRAM holds every block of it, its slots pinned and handed out in
// the same round trip.
struct ChunkFetchResult {
  LookupResult lookup;  // hit_tokens == the chunk's tokens: every block held.
  // Every block on host: the load of the whole chunk (its device_blocks the
  // caller's, filled in by Client::FetchChunk). Absent on a miss, and when
  // some block is only on the disk tier: the request then stays open with
  // its hits pinned, for Allocate to start promotions as for any lookup.
  std::optional<TransferEvent> load;
  // A miss that makes this worker the one to compute the chunk (single
  // flight): another worker missing it meanwhile waits for this worker's
  // publish. The lease ends when the publish's store completes, when this
  // worker finishes the fetch's request, fetches or publishes another
  // chunk, or goes away.
  bool lease = false;
  // The fetch waited for another worker's lease: either that worker's
  // publish is what `load` loads, or the wait ran out (or the other worker
  // left) and this is a miss.
  bool waited = false;
};

struct CompletedEvent {
  EventRef ref;
  bool ok = true;  // False: the copy failed; a store's slots stay unkeyed.
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_TRANSFER_H_
