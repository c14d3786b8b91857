// Coordinator: the state machine tierkvd runs (and embedded mode runs
// in-process): the host tier's BlockPool (index, ref counts, LRU), each
// attached worker's requests, pins and in-flight transfer events, following
// vLLM's SimpleCPUOffloadConnector (seed 004). It decides what to copy; the
// workers do the copying and report completion.
// Not thread-safe: one owner serialises every call (tierkvd holds a mutex
// that only its own threads take; workers never touch it).
//
// A request's life, per worker (seed 004's connector calls in brackets):
//   Lookup   [get_num_new_matched_tokens] pins the host blocks it reports.
//   Allocate [update_state_after_alloc]   turns the pins it uses into a load
//            event (host slots -> device blocks), drops the rest, registers
//            the request for eager store.
//   Commit   [build_connector_meta]       gives each newly computed full
//            block a host slot, pinned and unkeyed, in a store event.
//   Complete [update_connector_output]    a finished store keys its slots
//            (only now can a lookup see them) and unpins them; a finished
//            load unpins its source slots.
//   Finish   [request_finished]           drops the request's unused pins
//            in reverse block order. Events in flight outlive it.
// DropWorker releases every pin a dead worker held; a slot it was writing
// goes back to the free queue without a key, so it is never served.
//
// Host slot states (the null slot 0 is none of these):
//   FREE / CACHED-FREE (ref 0, in the LRU free queue)
//   PINNED by a lookup or a load (ref > 0, keyed)
//   BEING WRITTEN by a store (ref 1, unkeyed, key held by the event)
#ifndef TIERKV_SRC_COORDINATOR_H_
#define TIERKV_SRC_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "src/block_key.h"
#include "src/block_pool.h"
#include "src/kv_layout.h"
#include "src/request.h"
#include "src/status.h"

namespace tierkv {

using WorkerId = uint32_t;

enum class EventKind : uint8_t { kLoad = 1, kStore = 2 };

// Loads and stores are numbered separately per worker from 0, as seed 004
// numbers load_event and store_event.
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
};

struct WorkerRegistration {
  KvLayout layout;
  int32_t num_device_blocks = 0;  // Block ids the worker may name: [0, n).
  std::string tenant;             // Tenants never share keys.
  int32_t pid = 0;
  std::string name;  // For people: shown by tierkv-admin.
};

struct CoordinatorOptions {
  KvLayout layout;         // The one layout this store serves.
  int32_t host_slots = 0;  // Including the null slot 0. Required, >= 2.
  size_t max_request_tokens = 1 << 20;  // Default: 1Mi tokens.
};

struct LookupResult {
  int32_t hit_tokens = 0;  // Tokens after num_computed_tokens found on host.
};

struct AllocateResult {
  std::optional<TransferEvent> load;
  // OK, or ResourceExhausted when every host slot is pinned: the request runs,
  // but nothing it computes can be stored now.
  Status store_status;
};

struct CommitResult {
  std::vector<TransferEvent> stores;  // Zero or one event.
  int32_t skipped_blocks = 0;         // Full blocks no slot was free for.
};

struct CompletedEvent {
  EventRef ref;
  bool ok = true;  // False: the copy failed; a store's slots stay unkeyed.
};

struct WorkerStats {
  WorkerId id = 0;
  int32_t pid = 0;
  std::string name;
  uint32_t requests = 0;
  uint32_t loads_in_flight = 0;
  uint32_t stores_in_flight = 0;
};

struct HostTierStats {
  uint64_t slot_bytes = 0;     // One KV block.
  int64_t capacity_slots = 0;  // Usable slots (the null slot excluded).
  int64_t free_slots = 0;      // In the free queue (cached or not).
  int64_t used_slots = 0;      // Keyed, or being written by a store.
  int64_t cached_slots = 0;    // Keyed: visible to lookups.
  int64_t pinned_slots = 0;    // Ref count > 0 (hits, loads, stores).
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;  // Blocks a lookup could have hit.
  uint64_t hit_blocks = 0;
  uint64_t miss_blocks = 0;
  uint64_t evictions = 0;
  uint64_t stores_completed = 0;  // Blocks.
  uint64_t loads_completed = 0;   // Blocks.
  uint64_t stores_failed = 0;     // Blocks whose store failed or was lost.
  uint64_t store_skipped = 0;     // Blocks not stored: no free slot.
  uint64_t events_in_flight = 0;
};

struct CoordinatorStats {
  HostTierStats host;
  std::vector<WorkerStats> workers;
};

class Coordinator {
 public:
  static StatusOr<Coordinator> Create(const CoordinatorOptions& options);

  // FailedPrecondition naming both layouts when the worker's differs from
  // the store's; InvalidArgument for a malformed registration.
  StatusOr<WorkerId> RegisterWorker(const WorkerRegistration& registration);
  // The worker is gone: releases all its pins. NotFound if unknown.
  Status DropWorker(WorkerId worker);

  // Longest run of consecutive full blocks of `tokens`, starting at block
  // num_computed_tokens / block_size (the engine's own prefix hits), found
  // on host; at most num_tokens - 1 tokens in all. Pins what it reports. A
  // repeated Lookup for the same request first drops the earlier pins.
  StatusOr<LookupResult> Lookup(WorkerId worker, RequestId request,
                                std::span<const TokenId> tokens,
                                int32_t num_computed_tokens,
                                const RequestExtras& extras);
  // `device_blocks`: the request's blocks in order, as the engine allocated
  // them. num_external_tokens (a multiple of the block size, at most the
  // hit) of the lookup's hit are loaded into them.
  StatusOr<AllocateResult> Allocate(WorkerId worker, RequestId request,
                                    std::span<const BlockId> device_blocks,
                                    int32_t num_external_tokens);
  // Tokens [0, num_computed_tokens) now have KV in the device blocks
  // (`device_blocks` again, possibly grown). Stores the prompt's full blocks
  // that the host does not hold yet and no event is storing already.
  StatusOr<CommitResult> Commit(WorkerId worker, RequestId request,
                                int32_t num_computed_tokens,
                                std::span<const BlockId> device_blocks);
  // Validates every ref (in flight, this worker's) before applying any.
  Status Complete(WorkerId worker, std::span<const CompletedEvent> events);
  Status Finish(WorkerId worker, RequestId request);

  CoordinatorStats stats() const;
  const BlockPool& host_pool() const { return host_pool_; }
  const KvLayout& layout() const { return options_.layout; }
  size_t num_workers() const { return workers_.size(); }

 private:
  struct RequestState {
    std::vector<TokenId> tokens;
    std::vector<BlockKey> keys;  // Full blocks of tokens.
    int32_t first_hit_block = 0;
    std::vector<BlockId> pending_hits;  // Pinned host slots, in block order.
    bool allocated = false;
    int32_t next_store_block = 0;  // Blocks before it were handled.
  };
  struct InFlight {
    TransferEvent event;
    std::vector<BlockKey> keys;   // Store: the keys its slots will get.
    std::vector<TokenId> tokens;  // Store: block_size tokens per slot.
  };
  struct WorkerState {
    WorkerRegistration registration;
    KeyHasher hasher;
    uint64_t next_load_id = 0;
    uint64_t next_store_id = 0;
    std::unordered_map<RequestId, RequestState> requests;
    std::map<uint64_t, InFlight> loads;
    std::map<uint64_t, InFlight> stores;
  };

  Coordinator(const CoordinatorOptions& options, BlockPool host_pool)
      : options_(options), host_pool_(std::move(host_pool)) {}

  StatusOr<WorkerState*> FindWorker(WorkerId worker);
  Status CheckDeviceBlocks(const WorkerState& w,
                           std::span<const BlockId> blocks) const;
  std::span<const TokenId> BlockTokens(const RequestState& r, int32_t b) const;
  void ReleasePendingHits(RequestState* r);
  bool HostHas(const BlockKey& key, std::span<const TokenId> tokens) const;
  void FinishStore(InFlight* store, bool ok);
  void ReleaseSlots(std::span<const BlockId> slots);

  CoordinatorOptions options_;
  BlockPool host_pool_;
  std::map<WorkerId, WorkerState> workers_;
  WorkerId next_worker_id_ = 1;
  // Keys some store event is writing: a second store of one is skipped.
  std::unordered_set<BlockKey, BlockKeyHash> keys_being_stored_;
  HostTierStats stats_;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_COORDINATOR_H_
