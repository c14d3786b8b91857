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
//            in reverse block order and cancels its loads that were not
//            handed to the worker yet (PROMOTING or READY): their device
//            blocks may belong to another request by now, so no copy ever
//            starts into them. Events the worker is copying outlive it.
// DropWorker releases every pin a dead worker held; a slot it was writing
// goes back to the free queue without a key, so it is never served.
//
// Split roles (WorkerRegistration::ranks, scheduler, rank): a scheduler
// makes the calls above but copies nothing; each of its `ranks` rank
// workers (tensor-parallel workers, one shard of the heads each) copies
// every event the scheduler hands out and completes it for itself. An event
// completes once every rank has completed it, failed if any rank failed; a
// rank that is dropped fails its part of every event it has not completed
// (a load still waiting for promotions included, unless a new rank attaches
// in its place before the load is handed out), so no event handed out
// before the drop waits on a dead rank; an event handed out while a rank's
// place is empty waits for the rank that takes it (vLLM's workers attach
// on their first step, after the scheduler). A scheduler dropped while ranks
// may still copy its events keeps those events' slots pinned (its requests and
// untaken loads go at once) until the ranks complete them or are dropped:
// no slot a live rank may still read or write is reused.
//
// A scheduler registered with an attachment tag (vLLM's connector: one per
// epoch) ends its attachment when it loses a rank: from then on Lookup,
// LookupAgain, LookupChunk, Allocate, Commit and TakeReadyLoads answer
// Unavailable (Finish still releases), and no rank attaches in the lost
// one's place (FailedPrecondition). The engine attaches anew. An engine's
// events travel to its ranks outside tierkvd, so a rank that attached
// again could be handed one failed at the drop, whose slots may be another
// event's by now; with the attachment over, no event outlives the ranks
// that were to copy it. Without a tag a new rank may take the place.
//
// With a lower tier (the disk tier, options.lower):
//   Lookup   also reports blocks the lower tier holds (disk hits), after
//            and between host hits, without touching the disk.
//   Allocate gives each disk hit it uses a pinned, unkeyed host slot and
//            starts a promotion into it. The load event is then pending:
//            TakeReadyLoads hands it out once every promotion is done (as
//            vLLM's connector reports asynchronous loads). A promotion that
//            fails (value gone or corrupt, or no free slot) cuts the load
//            before that block: failed_blocks says how many the engine
//            recomputes. A promoted block is keyed on host like a stored one.
//   Spills   past the high watermark (slots keyed or being written), the
//            least recently used unpinned host blocks are spilled: pinned
//            while the lower tier copies them, then dropped from host, until
//            the low watermark is reached. A block the lower tier holds
//            already is dropped at once.
//   Write-behind (options.write_behind_spills): each block a store keys
//            is also copied to the lower tier soon after and stays on host,
//            pinned only while its copy runs (lookups hit it as ever), so
//            that the free queue's head is mostly blocks the lower tier
//            holds: evicting one loses nothing, and the watermark drops it
//            without waiting for I/O. Spilling at the watermark alone lags
//            a burst: stores and promotions take slots from the free
//            queue's head, evicting blocks whose spills have not started.
//            A finished copy's block goes back to the free queue's back
//            (as a hit's would; a copy that waited behind others thus makes
//            an older block look recent), or to its front when the front
//            is a block no tier holds: the next eviction then takes a block
//            the lower tier holds. Copies rest after a failed spill as
//            spills do. The host never waits for them: a block whose copy
//            has not run (the disk is slow, refusing or degraded; the queue
//            of blocks waiting for one is bounded by the host slots) or
//            failed is evicted when its slot is needed, and counted
//            (evicted_unspilled) when no tier holds it.
//   Either way, an operator's Evict or Clear of a block only its spill pins
//            discards the spill: lookups miss the block at once, and when
//            the spill finishes its host slot is dropped and whatever it
//            wrote is removed from the lower tier.
// Lower-tier results arrive on the lower tier's threads and wait in a
// thread-safe inbox until the owner calls PumpLowerTier (the wakeup option
// says when); every other call stays on the owner's thread.
//
// A transfer event in flight (events() lists them, oldest first):
//   PROMOTING  a load waiting for promotions from the lower tier
//   READY      a load whose promotions are done, not yet taken by the worker
//              (TakeReadyLoads)
//   COPYING    handed to the worker, which has not completed it yet
// Each is timestamped when Allocate or Commit creates it; Complete records
// its latency per kind (CoordinatorStats::load_latency, store_latency).
//
// Worker caps (CoordinatorOptions): one worker, however hostile or
// stopped, holds at most its share of the host slots (worker_pin_share: a
// Lookup's hits are cut at the share; a Commit's blocks past it are
// skipped and a promotion past it fails, and Allocate's or Commit's
// store_status is ResourceExhausted naming the cap), at most
// max_requests_per_worker open requests and max_request_bytes_per_worker
// bytes of their state (a Lookup past either is refused with
// ResourceExhausted, nothing kept), and at most max_events_per_worker
// events in flight (a Commit stores nothing more; an Allocate that would
// load is refused with ResourceExhausted, nothing kept). One uid registers at
// most max_workers_per_uid workers. Every check is O(1) per call. A pin is
// never taken away: a slot a live worker may still read or write is not
// reused.
//
// Slot checksums (CoordinatorOptions::slot_checksum): a completed store
// keys its slots with the checksum of their bytes. A spill passes it to the
// lower tier, which writes nothing when the bytes no longer match; the
// coordinator then drops the block (corrupt_slots_dropped). With
// verify_on_load, a load is checked the same way before it is handed out.
//
// Chunks in one call each (FetchChunk, PublishChunk), with single flight: a
// worker whose fetch misses a chunk no one computes takes the chunk's
// compute lease (keyed by the chunk's last block key, so per tenant); a
// fetch of another worker then finds it busy, and its caller (TieredStore::
// FetchChunk) waits for the lease to end before looking again. A lease:
//   HELD     from the miss; a worker holds one at a time (its FetchChunk or
//            PublishChunk of another chunk ends it), and Finish of the
//            fetch's request ends it (computed nothing, publishes nothing)
//   STORING  the holder published the chunk: until that store completes
//            (or fails), so that a waiter looks again once the chunk is
//            keyed; ended at once when the publish stores nothing
// DropWorker ends a worker's lease; a restart forgets them all. Every end
// calls options.chunk_lease_released.
//
// Host slot states (the null slot 0 is none of these):
//   FREE / CACHED-FREE (ref 0, in the LRU free queue)
//   PINNED by a lookup or a load (ref > 0, keyed)
//   BEING WRITTEN by a store or a promotion (ref 1, unkeyed)
//   BEING SPILLED (ref >= 1, keyed: lookups still hit it, unless an
//                 operator discarded the spill)
#ifndef TIERKV_SRC_COORDINATOR_H_
#define TIERKV_SRC_COORDINATOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/block_pool.h"
#include "src/cache_event_sink.h"
#include "src/coordinator_types.h"
#include "src/lower_tier.h"
#include "src/mutex.h"
#include "tierkv/block_key.h"
#include "tierkv/kv_layout.h"
#include "tierkv/request.h"
#include "tierkv/stats.h"
#include "tierkv/status.h"
#include "tierkv/transfer.h"

namespace tierkv {

// What one worker may hold of a store, so that a worker that stops or
// misbehaves cannot take what the others need (CoordinatorOptions::caps,
// and the same in TieredStoreOptions and ServerOptions).
struct WorkerCaps {
  // The share of the usable host slots one worker may pin at once (lookup
  // hits, loads, stores being written, promotions for its loads): at least
  // one slot, at most all. Half by default, so a worker that stops (or
  // never completes its stores) leaves the other half to the rest. 0 <
  // share <= 1. Default: 0.5.
  double worker_pin_share = 0.5;
  // The share of the usable host slots all workers of one uid may pin at
  // once, so that a user with several workers cannot pin what other users
  // need. An operator's uid (WorkerRegistration::operator_uid) is not held
  // to it. 0 < share <= 1. Default: 1 (each worker's share alone); tierkvd
  // sets 0.75 (ServerOptions).
  double uid_pin_share = 1.0;
  // Requests a worker may have open (looked up, not finished). A vLLM
  // worker has its running and waiting requests open; 4096 leaves room for
  // any scheduler's batch. Default: 4096.
  uint32_t max_requests_per_worker = 4096;
  // Bytes of request state a worker's open requests may keep in tierkvd:
  // each request's token ids, block keys and pinned hits, 4 + 20/block_size
  // bytes per token. Default: 256 MiB, e.g. 48 requests of the largest size
  // (max_request_tokens, 1Mi) or 1000 of 50k tokens.
  size_t max_request_bytes_per_worker = size_t{256} << 20;
  // Transfer events (loads and stores) a worker may have in flight: a
  // Commit stores nothing more until some complete. Default: 4096.
  uint32_t max_events_per_worker = 4096;
  // Workers one user (the uid the kernel reports for the worker's socket)
  // may have registered at once. Default: 64.
  uint32_t max_workers_per_uid = 64;
  // Tenants one uid may bring to a store with tenant isolation
  // (CoordinatorOptions::max_tenants): a tenant counts against the uid of
  // the worker that first registered it for as long as the tenant holds
  // its segment. So no one user can take every tenant segment. An
  // operator's uid (WorkerRegistration::operator_uid) is not held to it.
  // Default: 4.
  uint32_t max_tenants_per_uid = 4;
};

struct CoordinatorOptions {
  KvLayout layout;  // The one layout this store serves.
  // The one model this store serves (ValidateModelName); its keys are in
  // StoreFingerprint(layout, model). Default: "" (the unnamed model).
  std::string model = {};
  int32_t host_slots = 0;  // Including the null slot 0. Required, >= 2.
  size_t max_request_tokens = 1 << 20;  // Default: 1Mi tokens.
  // The tier below host DRAM. Not owned; it must outlive the coordinator's
  // use of it (stop its I/O before destroying the host slots). Default:
  // none: a block evicted from host is gone.
  LowerTier* lower = nullptr;
  // Spill watermarks, as fractions of the usable host slots that are keyed
  // or being written. 0 < spill_low <= spill_high <= 1. Defaults: 0.9, 0.7.
  double spill_high = 0.9;
  double spill_low = 0.7;
  // Write-behind ("Spills" above): at most this many copies of completed
  // stores to the lower tier in flight at once; the blocks past it wait,
  // oldest store first. 0 turns write-behind off: blocks reach the lower
  // tier only past the high watermark, so a burst of stores or promotions
  // can evict blocks no tier holds. Default: 0 (TieredStore turns it on).
  int32_t write_behind_spills = 0;
  // The host pool's eviction policy (BlockPoolOptions::eviction). Blocks
  // holding no key are reused first under every policy. Default: kLru
  // (TieredStore picks kDefaultTierEviction).
  EvictionPolicy host_eviction = EvictionPolicy::kLru;
  // Called on a lower-tier thread when results wait for PumpLowerTier.
  // Default: none (the owner pumps on its own schedule).
  std::function<void()> lower_tier_wakeup = {};
  // Called when a worker's loads that waited for promotions become ready
  // (or fail) and TakeReadyLoads has something for it where it had
  // nothing: once per such change, so a worker that sleeps until told wakes
  // for each batch. Called on the owner's thread with its lock held (from
  // PumpLowerTier): it must only signal, never call back in. Default: none.
  std::function<void(WorkerId)> loads_ready = {};
  // The clock events are timestamped with (and spills rest by), called on
  // the owner's thread. Default: std::chrono::steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> clock = {};

  // Per-worker caps ("Worker caps" above). Each refusal is a clear status
  // naming the cap and is counted in HostTierStats (quota_*).
  WorkerCaps caps = {};

  // XXH3-64 of a host slot's bytes. With it the coordinator keeps a
  // checksum of each block a store completes (or a promotion lands) and
  // checks the block against it before spilling it and, with
  // verify_on_load, before handing out a load of it: a block whose bytes
  // changed since (a worker wrote into a slot it did not own) is dropped
  // from host, never spilled or loaded, and counted
  // (corrupt_slots_dropped). Called on the owner's thread with its lock
  // held; Complete takes checksums computed outside it. Default: none (no
  // checksums, nothing verified).
  std::function<uint64_t(BlockId)> slot_checksum = {};
  // Re-check each host block's checksum before a load of it is handed to a
  // worker (Allocate, TakeReadyLoads); a mismatch cuts the load there
  // (failed_blocks), as a miss. Costs one checksum of every block loaded,
  // under the lock. Needs slot_checksum. Default: false.
  bool verify_on_load = false;

  // Tenant isolation. With max_tenants > 0 every tenant (WorkerRegistration
  // ::tenant) gets a host segment of its own, numbered from 0 in the order
  // tenants first register (SegmentOf): its workers map that segment only,
  // so no writable memory is shared across tenants. A slot's bytes are in
  // the segment of the worker whose store or load filled it: before the
  // slot is handed out, assign_slot(slot, segment) says which (it moves
  // the slot there; the owner releases the memory the slot had in another
  // segment). When assign_slot fails (the memory cannot be reserved in the
  // new segment), the slot goes back to the free queue unkeyed and the
  // block is not stored or promoted, as if no slot were free
  // (slot_reserve_failures). Tenants never share blocks (keys include the
  // tenant), so a block stays in one segment for as long as it is cached. A
  // tenant past its uid's max_tenants_per_uid (caps) is refused
  // (ResourceExhausted). A new tenant past max_tenants takes the segment of
  // the tenant idle longest (no worker registered) whose host slots are
  // all unpinned, other than segment 0's: that tenant's host blocks are
  // dropped (on the lower tier still, if spilled), its slots move to
  // segment 0, and reset_segment gives the segment new memory; it is
  // refused when no tenant is so idle. Default: 0, one segment (0) for
  // every tenant (embedded mode: one process).
  uint32_t max_tenants = 0;
  std::function<Status(BlockId slot, uint32_t segment)> assign_slot = {};
  // Called when a tenant's last worker is dropped: the owner gives back
  // what its workers wrote into their segment outside their own blocks.
  std::function<void(uint32_t segment)> trim_segment = {};
  // Called when an idle tenant's segment passes to a new tenant, once no
  // slot is assigned to it any more: the owner replaces the segment's
  // memory with new memory, so that a process of the old tenant that still
  // maps the old memory sees nothing of the new tenant's. An error refuses
  // the new tenant. Default: none (nothing maps segments).
  std::function<Status(uint32_t segment)> reset_segment = {};

  // Called, when set, each time a chunk's compute lease ends (see "Chunks
  // in one call"), on the owner's thread with its lock held, so that
  // fetches waiting for the lease look again. Default: none.
  std::function<void()> chunk_lease_released = {};

  // Called, when set, with each block the host tier gains or loses:
  // "stored" (a store completed), "promoted", "spilled" (on the lower tier
  // now, dropped from host), "dropped (on disk already)", "evicted" (its
  // slot reused for capacity), so that an operator can find the keys
  // tierkv-admin evict takes. Called on the
  // owner's thread with its lock held: it must be cheap when it has
  // nothing to do (tierkvd logs at debug level). Default: none.
  std::function<void(const char* what, const BlockKey& key, BlockId slot)>
      block_trace = {};

  // Told of each block the host tier starts or stops serving (medium
  // kCpu), in the order of the host index's changes: BlockStored when a
  // store or promotion keys a slot (with the request's previous block as
  // parent, its tokens and LoRA id), BlockRemoved when the host pool drops
  // a key (eviction for reuse, a spill that left host, an operator's clear
  // or evict, a slot found corrupt), and AllBlocksCleared after a Clear of
  // every tier that left nothing. Not owned; must outlive the coordinator.
  // Called on the owner's thread with its lock held. Default: none.
  CacheEventSink* cache_events = nullptr;
};

// A store's host slot and the checksum of its bytes when the store
// completed (CoordinatorOptions::slot_checksum), computed by the caller.
struct SlotChecksum {
  BlockId slot = 0;
  uint64_t checksum = 0;
};

// Drops from `stats` the workers of users other than `uid`: what stats a
// user who is not an operator sees. The tiers' figures stay; another user's
// workers' names, pids and requests are theirs.
void KeepWorkersOfUid(uint32_t uid, CoordinatorStats* stats);

class Coordinator {
 public:
  static StatusOr<Coordinator> Create(const CoordinatorOptions& options);

  // FailedPrecondition naming both layouts, or both models, when the
  // worker's differs from the store's; InvalidArgument for a malformed
  // registration.
  StatusOr<WorkerId> RegisterWorker(const WorkerRegistration& registration);
  // How a worker leaves (DropWorker).
  enum class Departure : uint8_t {
    kGone,  // It detached or was lost.
    // RegisterWorker admitted it, then the transport could not serve it (no
    // channel, pipe or thread): a rank of a scheduler with an attachment
    // tag leaves its place vacant, as before, and does not end the
    // attachment, since it never copied anything; it may try again.
    kRefused,
  };
  // The worker is gone: releases all its pins (a scheduler's events that
  // its ranks may still be copying: once they are done, see "Split roles").
  // NotFound if unknown.
  Status DropWorker(WorkerId worker, Departure departure = Departure::kGone);
  // The host segment the worker's tenant uses (CoordinatorOptions::
  // max_tenants): 0 without tenant isolation. NotFound if unknown.
  StatusOr<uint32_t> SegmentOf(WorkerId worker) const;

  // Longest run of consecutive full blocks of `tokens`, starting at block
  // num_computed_tokens / block_size (the engine's own prefix hits), found
  // on host; at most num_tokens - 1 tokens in all. Pins what it reports. A
  // repeated Lookup for the same request first drops the earlier pins.
  StatusOr<LookupResult> Lookup(WorkerId worker, RequestId request,
                                std::span<const TokenId> tokens,
                                int32_t num_computed_tokens,
                                const RequestExtras& extras);
  // Lookup of a request asked before, sent as what changed (an engine asks
  // again, every step, for a request still waiting): its tokens are the
  // first `kept_tokens` of those its last Lookup or LookupAgain left, named
  // `tag` (TokensTag), followed by `appended`; otherwise as Lookup. Aborted,
  // nothing changed, when the request keeps no tokens of `tag` (it was
  // looked up again since, finished, or never asked): the caller then sends
  // all its tokens in a Lookup. InvalidArgument when kept_tokens exceeds
  // the tokens kept.
  StatusOr<LookupResult> LookupAgain(WorkerId worker, RequestId request,
                                     uint32_t kept_tokens, uint64_t tag,
                                     std::span<const TokenId> appended,
                                     int32_t num_computed_tokens,
                                     const RequestExtras& extras);
  // Names the tokens the request's last Lookup or LookupAgain left (for a
  // later LookupAgain); 0 for none (unknown, or a chunk lookup since).
  uint64_t TokensTag(WorkerId worker, RequestId request) const;
  // Lookup for a position-independent chunk: its blocks are keyed by
  // content and virtual start alone (KeyHasher::ChunkKeys), apart from every
  // prefix key, and its last block may be partial. Every token may hit. The
  // request then goes on as any other: Allocate may load the whole chunk
  // (num_external_tokens = the hit, partial block included) and Commit
  // stores the chunk's blocks once all of a block's tokens are computed.
  // `virtual_start` is the RoPE position the chunk's KV is computed at
  // (0 .. 2^48 - 1) and `variant` what else it depends on (ChunkVariant):
  // both part of its keys, so KV computed at one position, or with another
  // RoPE config, is never served to a worker that computes otherwise.
  StatusOr<LookupResult> LookupChunk(WorkerId worker, RequestId request,
                                     std::span<const TokenId> tokens,
                                     int64_t virtual_start = 0,
                                     const BlockKey& variant = {});
  // A chunk fetch in one call: LookupChunk, then with every block on host
  // Allocate of the whole chunk and Finish, so the result's load (its
  // device_blocks empty: the worker copies into blocks of its choosing)
  // is the request's last word. With a block only on the disk tier the
  // request stays open, its hits pinned, for Allocate. On a miss the
  // request is finished and the worker takes the chunk's compute lease,
  // unless another worker holds it: then `busy`, nothing kept.
  struct ChunkFetch {
    ChunkFetchResult result;
    bool busy = false;
  };
  StatusOr<ChunkFetch> FetchChunk(WorkerId worker, RequestId request,
                                  std::span<const TokenId> tokens,
                                  int64_t virtual_start = 0,
                                  const BlockKey& variant = {});
  // A chunk publish in one call: LookupChunk, Allocate (no load), Commit of
  // the whole chunk from `device_blocks` and Finish. A lease the worker
  // holds on this chunk lasts until the store completes.
  StatusOr<CommitResult> PublishChunk(WorkerId worker, RequestId request,
                                      std::span<const TokenId> tokens,
                                      std::span<const BlockId> device_blocks,
                                      int64_t virtual_start = 0,
                                      const BlockKey& variant = {});
  // Chunk compute leases held (see "Chunks in one call").
  size_t chunk_leases() const { return chunk_leases_.size(); }

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
  // A rank worker completes its part of its scheduler's events; an event
  // is applied once every rank has. FailedPrecondition for a scheduler
  // with ranks (they complete its events).
  // A finished store's slots keep the checksum of their bytes: from
  // `checksums` when it names the slot (computed outside the owner's lock,
  // over CompletedStoreSlots), otherwise from options.slot_checksum.
  Status Complete(WorkerId worker, std::span<const CompletedEvent> events,
                  std::span<const SlotChecksum> checksums = {});
  // The host slots of the successful stores among `events` that are in
  // flight for the worker: what Complete would checksum. Empty without
  // slot checksums. The slots stay pinned until Complete applies the
  // events or the worker is dropped.
  std::vector<BlockId> CompletedStoreSlots(
      WorkerId worker, std::span<const CompletedEvent> events) const;
  Status Finish(WorkerId worker, RequestId request);

  // Applies the lower tier's finished spills and promotions, then spills
  // if the host is past its high watermark. Returns how many loads became
  // ready. Cheap when nothing waits.
  size_t PumpLowerTier();
  // The worker's pending loads whose promotions are done, in the order
  // they became ready; from now on each is an ordinary load in flight.
  // With `fits`, asked for each load in turn (and counting what it is
  // asked: a reply has room for so many), loads are handed out until it
  // refuses one, the first whatever it answers; the others stay ready, and
  // options.loads_ready is called again for them.
  StatusOr<std::vector<TransferEvent>> TakeReadyLoads(
      WorkerId worker,
      const std::function<bool(const TransferEvent&)>& fits = {});

  // A graceful stop: starts a spill of every keyed host block nothing pins
  // (the free queue's) that the lower tier does not hold yet, whatever the
  // watermarks and even while spilling rests after a failure; those it
  // holds already leave host at once. Returns how many spills it started;
  // PumpLowerTier applies their results as ever. 0 without a lower tier.
  int64_t SpillAll();
  // Keyed host blocks the lower tier does not hold (all of them without
  // one): what stopping now would lose. O(host slots).
  int64_t HostOnlyBlocks() const;

  // An operator's order: drops every block of `tiers` that nothing pins
  // (host: keyed slots in the free queue; disk: every stored block, a
  // promotion reading one then fails cleanly) and counts the host blocks
  // kept because pinned. A host block only its spill pins is dropped from
  // host and disk both (the spill is discarded, see "Spills" above); kDisk
  // alone leaves spills in flight to land. Drops are not evictions.
  // FailedPrecondition for kDisk without a lower tier; kAll then clears
  // the host only.
  StatusOr<ClearResult> Clear(TierSelection tiers);
  // Drops each of `keys` from host (unless a worker pins it there) and
  // from the lower tier, wherever it is held; a block being spilled is
  // dropped from both as Clear drops it. One result per key, in order. A
  // key no tier holds comes back with every flag false.
  std::vector<EvictedBlock> Evict(std::span<const BlockKey> keys);

  CoordinatorStats stats() const;
  // stats() as `worker` may see them (KeepWorkersOfUid unless it is an
  // operator's, WorkerRegistration::operator_uid). NotFound if unknown.
  StatusOr<CoordinatorStats> StatsSeenBy(WorkerId worker) const;
  // What a prefix lookup of `tokens` by a worker of `tenant` (as
  // WorkerRegistration::tenant records it) with `extras` would find now,
  // and the tenant's workers attached now; pins nothing and counts nothing.
  // InvalidArgument for more than max_request_tokens tokens or a multimodal
  // item outside them.
  StatusOr<RouteResult> Route(const std::string& tenant,
                              std::span<const TokenId> tokens,
                              const RequestExtras& extras) const;
  // Route for the tenant of `worker` (NotFound if unknown).
  StatusOr<RouteResult> Route(WorkerId worker, std::span<const TokenId> tokens,
                              const RequestExtras& extras) const;
  // The keys the host tier and the lower tier serve now, at most
  // `max_per_tier` of each: what the cache_events sink has been told.
  HeldKeys HeldKeysNow(size_t max_per_tier) const;
  // Every transfer event in flight, oldest first (ties: by worker, kind,
  // id); with `uid`, only those of that user's workers (what a user who
  // does not operate tierkvd may see, as KeepWorkersOfUid).
  std::vector<EventInfo> events(
      std::optional<uint32_t> uid = std::nullopt) const;
  const BlockPool& host_pool() const { return host_pool_; }
  // Nothing in flight on the lower tier: every spill and promotion
  // started has finished and PumpLowerTier applied its result.
  bool lower_tier_idle() const { return lower_ops_.empty(); }
  const KvLayout& layout() const { return options_.layout; }
  size_t num_workers() const { return workers_.size(); }

 private:
  struct RequestState {
    size_t state_bytes = 0;  // Counted in the worker's request_bytes.
    std::vector<TokenId> tokens;
    // Names `tokens` as a prefix lookup left them (LookupAgain); 0 after a
    // chunk lookup or before any lookup finished.
    uint64_t tokens_tag = 0;
    // Prefix: one per full block. Chunk: one per block, the last one
    // possibly partial.
    std::vector<BlockKey> keys;
    // The keys are a prefix lookup's without extra keys (LoRA, multimodal,
    // cache salt): a repeated such lookup keeps those of unchanged blocks.
    bool plain_prefix = false;
    // Its LoRA (RequestExtras::lora_id), reported with the blocks it stores.
    std::optional<uint64_t> lora_id;
    int32_t first_hit_block = 0;
    std::vector<BlockId> pending_hits;  // Pinned host slots, in block order.
    bool allocated = false;
    int32_t next_store_block = 0;  // Blocks before it were handled.
  };
  // What a load holds of each host slot it names.
  enum class LoadSlot : uint8_t { kHeld, kPromoting, kReleased };
  struct InFlight {
    TransferEvent event;
    std::vector<BlockKey> keys;  // Store: the keys its slots will get.
    std::vector<std::vector<TokenId>> tokens;  // Store: each slot's tokens.
    // Store: each block's parent in its request (none for the first block).
    std::vector<std::optional<BlockKey>> parents;
    std::optional<uint64_t> lora_id;  // Store: the request's.
    std::vector<LoadSlot> slots;      // Load: one per block.
    int32_t promoting = 0;            // Load: promotions not finished.
    bool pending = false;             // Load: not handed to the worker yet.
    // A scheduler's event: the ranks that completed (or were dropped
    // before completing) it, one bit per rank, and whether any failed.
    uint64_t ranks_done = 0;
    bool rank_failed = false;
    std::chrono::steady_clock::time_point started;  // Allocate or Commit.
  };
  // A spill or promotion the lower tier is running.
  struct LowerOp {
    bool spill = false;
    BlockId slot = 0;
    BlockKey key;
    std::vector<TokenId> tokens;  // Promotion: what the slot is keyed with.
    // Promotion: the block's parent in the load's request, and its LoRA,
    // for the host tier's BlockStored.
    std::optional<BlockKey> parent;
    std::optional<uint64_t> lora_id;
    // Promotion: its slot counts in this worker's pins; 0 once the worker
    // is gone.
    WorkerId worker = 0;
    uint64_t load = 0;
    size_t index = 0;  // The block's place in the load.
    // Spill: an operator dropped the block meanwhile (DiscardSpill).
    bool discard = false;
    // Spill: a write-behind copy, the block stays on host.
    bool keep = false;
    // Spill: an operator cleared the lower tier (or evicted the block)
    // while it ran, perhaps after it wrote: the host keeps the block unless
    // the tier holds it.
    bool lower_cleared = false;
    std::chrono::steady_clock::time_point started = {};  // StartLowerOp.
  };
  struct LowerResult {
    uint64_t op = 0;
    Status status;
    uint64_t checksum = 0;  // Promotion: of the slot's bytes.
  };
  // Filled on lower-tier threads, drained by PumpLowerTier.
  struct LowerInbox {
    Mutex mu;
    std::vector<LowerResult> results TIERKV_GUARDED_BY(mu);
    std::function<void()> wakeup;
  };
  // Lookup's marker for a hit only the lower tier holds.
  static constexpr BlockId kOnLowerTier = -1;
  struct WorkerState {
    // A constructor, not an aggregate: Clang 14 cannot emplace an aggregate
    // from parentheses (C++20's P0960).
    WorkerState(const WorkerRegistration& r, KeyHasher h)
        : registration(r), hasher(std::move(h)) {}

    WorkerRegistration registration;
    KeyHasher hasher;
    uint64_t next_load_id = 0;
    uint64_t next_store_id = 0;
    std::unordered_map<RequestId, RequestState> requests;
    std::map<uint64_t, InFlight> loads;
    std::map<uint64_t, InFlight> stores;
    std::deque<uint64_t> ready_loads;  // Pending loads now ready.
    // Host slot pins held for it: lookup hits, loads, stores, promotions.
    int64_t pinned_slots = 0;
    size_t request_bytes = 0;  // Sum of its requests' state_bytes.
    uint32_t segment = 0;      // Its tenant's host segment.
    // A scheduler: its rank workers by rank (0 while a rank is vacant).
    std::vector<WorkerId> rank_workers;
    // A scheduler with an attachment tag: the first rank it lost, or -1.
    // Its attachment hands out no more events (see "Split roles").
    int32_t lost_rank = -1;
    // A scheduler dropped while ranks still copy its events: it stays for
    // those events only (see "Split roles").
    bool dropped = false;
    // The chunk whose compute lease it holds.
    std::optional<BlockKey> lease;
  };
  // A chunk's compute lease (see "Chunks in one call").
  struct ChunkLease {
    WorkerId worker = 0;
    RequestId request = 0;          // The fetch that took it.
    std::optional<uint64_t> store;  // STORING: the publish's store event.
  };
  // What the coordinator knows of a host slot's bytes.
  struct SlotCheck {
    bool has_checksum = false;  // Since its store or promotion finished.
    // Found changed while something pinned it: lookups miss it, and it is
    // dropped when the last pin goes.
    bool corrupt = false;
    uint64_t checksum = 0;
    bool spilling = false;  // A spill or write-behind copy of it runs.
  };

  Coordinator(const CoordinatorOptions& options, BlockPool host_pool);

  StatusOr<WorkerState*> FindWorker(WorkerId worker);
  // FindWorker for a call that makes or changes requests: a rank worker
  // makes none (FailedPrecondition naming its scheduler).
  StatusOr<WorkerState*> FindRequestWorker(WorkerId worker);
  // FindRequestWorker for a call that may hand out events (lookups pin
  // what Allocate loads): Unavailable for a tagged scheduler that lost a
  // rank.
  StatusOr<WorkerState*> FindIssuingWorker(WorkerId worker);
  // Split roles (src/coordinator_ranks.cc).
  // OK, or why `registration`'s roles cannot be registered.
  Status CheckRoles(const WorkerRegistration& registration) const;
  // The scheduler's rank events that every rank has completed now:
  // `rank`'s completion of `events` (validated) marked done, or, with
  // `events` empty and `dropped_rank`, everything it had not completed
  // failed. Applies them; forgets a dropped scheduler with nothing left.
  void MarkRanksDone(WorkerId scheduler, int32_t rank,
                     std::span<const CompletedEvent> events, bool dropped_rank,
                     std::span<const SlotChecksum> checksums);
  // Validates each completion of a worker's own events: in flight, handed
  // out, none twice.
  Status CheckCompletions(WorkerId worker, const WorkerState& w,
                          std::span<const CompletedEvent> events) const;
  // Applies completions (checked) of `w`'s events. `checksums`: sorted by
  // slot.
  void ApplyCompletions(WorkerState* w, std::span<const CompletedEvent> events,
                        std::span<const SlotChecksum> checksums);
  // For people: WorkerStats::role.
  static std::string RoleOf(const WorkerState& w);
  // One bit per rank of a scheduler with `ranks` ranks (1 to kMaxRanks).
  static uint64_t AllRanks(int32_t ranks);
  // A rank worker attached at `rank` (the place of a dropped one, maybe).
  void RankAttached(WorkerState* scheduler, int32_t rank);
  // Whether `store` becomes a successful completion when `rank` completes
  // it with `ok`.
  static bool RankCompletesOk(const WorkerState& scheduler,
                              const InFlight& store, int32_t rank, bool ok);
  // The request's state for a new lookup: fresh, or a stale lookup's with
  // its pins dropped (keep_hits: its pins and keys kept, for the caller to
  // trim). FailedPrecondition once allocated. ResourceExhausted, and
  // nothing changed, past the worker's caps on open requests or their
  // state bytes (`state_bytes`: the new state's).
  StatusOr<RequestState*> BeginLookup(WorkerId worker, WorkerState* w,
                                      RequestId request, size_t state_bytes,
                                      bool keep_hits = false);
  // InvalidArgument unless a prefix lookup of `num_tokens` tokens with
  // these arguments is well formed.
  Status CheckLookup(size_t num_tokens, int32_t num_computed_tokens,
                     const RequestExtras& extras) const;
  // InvalidArgument unless every multimodal item of `extras` lies within
  // `num_tokens` tokens (so that its key's encoding cannot overflow).
  static Status CheckItems(size_t num_tokens, const RequestExtras& extras);
  // Multimodal items over one token at most (CheckItems).
  static constexpr int kMaxItemsOverAToken = 4;
  // The leading full blocks of `tokens` whose keys `r` keeps from its
  // previous plain prefix lookup with the same tokens there.
  size_t UnchangedBlocks(const RequestState& r,
                         std::span<const TokenId> tokens) const;
  // A repeated plain prefix lookup of `r` from block `first` whose leading
  // `same` full blocks did not change (an engine asks again for a request
  // that is still waiting): keeps their keys and the pins of the host hits
  // among them (at most max_blocks), which stay cached while pinned; drops
  // the rest of both.
  void KeepUnchangedHits(WorkerState* w, RequestState* r, size_t same,
                         int32_t first, int32_t max_blocks);
  // The end of Lookup and LookupAgain, with r->tokens the request's tokens:
  // keys what is not kept, names the tokens, finds the hits.
  LookupResult EndLookup(WorkerState* w, RequestState* r, bool plain,
                         const RequestExtras& extras, int32_t first,
                         int32_t max_blocks);
  // Pins and reports the run of hits from block `first`, at most
  // max_blocks blocks (r->keys must cover them), cut where the worker's
  // share of the host slots is pinned. r->pending_hits may hold host hits
  // kept from the request's previous lookup (KeepUnchangedHits): the run
  // goes on after them.
  LookupResult FindHits(WorkerState* w, RequestState* r, int32_t first,
                        int32_t max_blocks);
  // Each of `blocks` is one of the worker's device blocks.
  Status CheckDeviceBlocks(const WorkerState& w,
                           std::span<const BlockId> blocks) const;
  // And none is named twice (a commit's): a store from one device block
  // under two keys would serve one block's KV for the other's tokens.
  // O(blocks log blocks).
  Status CheckDistinctDeviceBlocks(const WorkerState& w,
                                   std::span<const BlockId> blocks) const;
  std::span<const TokenId> BlockTokens(const RequestState& r, int32_t b) const;
  void ReleasePendingHits(WorkerState* w, RequestState* r);
  // Unpins slots pinned for `w` (null: its pins are no longer counted).
  void ReleaseWorkerSlots(WorkerState* w, std::span<const BlockId> slots);
  // Host slots `w` may still pin under its share.
  int64_t PinRoom(const WorkerState& w) const;
  // What the worker's uid may still pin (uid_pin_share).
  int64_t UidPinRoom(const WorkerState& w) const;
  // Counts `n` (negative: fewer) more pins for the worker and its uid.
  void AddPins(WorkerState* w, int64_t n);
  // Forgets a worker, and the pins its uid counted for it.
  void EraseWorker(std::map<WorkerId, WorkerState>::iterator it);
  Status PinCapStatus(WorkerId worker, const WorkerState& w) const;
  void ForgetRequest(WorkerState* w, RequestState* r);
  // A slot pinned for a store or a promotion: nothing known of its bytes.
  void ResetSlotCheck(BlockId slot);
  // Whether keyed `slot`'s bytes still match its checksum (true without
  // one).
  bool SlotIntact(BlockId slot) const;
  // `slot`'s bytes changed since they were checksummed: counts it and drops
  // it from host now, or, while pinned, when the last pin goes.
  void DropCorruptSlot(BlockId slot);
  bool HostHas(const BlockKey& key, std::span<const TokenId> tokens) const;
  // The host slot holding `key` with exactly `tokens`, or none.
  std::optional<BlockId> FindHostBlock(const BlockKey& key,
                                       std::span<const TokenId> tokens) const;
  // Keys pinned, unkeyed `slot` in the host pool and records its tokens
  // (host_tokens_), then tells options.cache_events (with `parent` and
  // `lora_id`). As BlockPool::CacheBlock otherwise.
  Status KeyHostSlot(BlockId slot, const BlockKey& key,
                     std::span<const TokenId> tokens,
                     const std::optional<BlockKey>& parent,
                     std::optional<uint64_t> lora_id);
  // The parent of block `b` of `r` in its key chain: none for block 0.
  static std::optional<BlockKey> ParentOf(const RequestState& r, int32_t b);
  // The token ids keyed `slot` was stored with; empty for an unkeyed slot.
  std::span<const TokenId> HostSlotTokens(BlockId slot) const;
  // `checksums`: sorted by slot.
  void FinishStore(WorkerState* w, InFlight* store, bool ok,
                   std::span<const SlotChecksum> checksums);
  // Before the host drops keyed `slot`'s block: whether it is lost to
  // every tier (evicted_unspilled), which needs a lower tier that does not
  // hold it; one that does renews it.
  bool LostBelow(BlockId slot);
  // Appends a free host slot (GetNewBlocks), tracing the block it evicts;
  // false when none is free.
  bool TakeFreeSlot(std::vector<BlockId>* slot);
  void ReleaseSlots(std::span<const BlockId> slots);
  void ReleaseLoad(WorkerState* w, InFlight* load);
  // Finish's part for loads: drops the request's pending loads (PROMOTING
  // or READY), which the worker never copies.
  void CancelUntakenLoads(WorkerState* w, RequestId request);
  // Cuts a load whose promotions are done before its first missing block
  // (with verify_on_load, before its first block whose bytes changed).
  void FinishPromotions(WorkerState* w, InFlight* load);
  void StartLowerOp(LowerOp op);
  // Unpins a finished spill's slot and drops it from host if it is now on
  // the lower tier, or, when discarded, from host and the lower tier both.
  void FinishSpill(const LowerOp& op, const Status& status);
  // The spill in flight from keyed `slot` when nothing else pins the slot;
  // null otherwise.
  LowerOp* OnlyPinIsSpill(BlockId slot);
  // Whether a promotion of `key` is in flight (it keys a host slot when it
  // lands).
  bool PromotionOf(const BlockKey& key) const;
  // Whether the disk tier takes no writes until restart (DiskTierStats::
  // writes_stopped): what it drops then is forgotten, not deleted.
  bool DiskWritesStopped() const;
  // An operator drops a block being spilled: lookups miss it from now on,
  // and FinishSpill drops both its host slot and what the spill wrote.
  void DiscardSpill(LowerOp* spill);
  int64_t UsedSlots() const;
  // Spills past the high watermark, then starts write-behind copies.
  void MaybeSpill();
  // Starts write-behind copies of the blocks waiting for one, up to
  // options.write_behind_spills in flight.
  void StartWriteBehind();
  // Whether the free queue's front is a keyed block the lower tier does not
  // hold: the next slot taken would lose it.
  bool NextEvictionLoses() const;
  // Spills `victims` (keyed, unpinned), or drops from host those the lower
  // tier holds already. Returns the spills started.
  int64_t SpillBlocks(std::span<const BlockId> victims);
  // Ends the worker's compute lease, if it holds one.
  void EndLease(WorkerState* w);
  // The chunk's last block key, after LookupChunk of `request`.
  const BlockKey& ChunkKeyOf(const WorkerState& w, RequestId request) const;
  // A new slot for worker `w`'s store or promotion: from the free queue,
  // moved to the worker's segment (assign_slot), its check reset and
  // counted in the worker's pins. Nullopt when none is free or its memory
  // cannot be reserved (counted).
  std::optional<BlockId> NewWorkerSlot(WorkerState* w);
  // Frees a segment for a new tenant past max_tenants: the segment of the
  // tenant idle longest whose slots are all unpinned (its blocks dropped,
  // its slots moved to segment 0, its memory reset). ResourceExhausted,
  // naming why, when no tenant can give its segment up.
  StatusOr<uint32_t> ReclaimIdleSegment(const std::string& for_tenant);
  // ReclaimIdleSegment's work on one idle tenant's segment: its slots back
  // to segment 0 (their blocks dropped), then reset_segment. False, with
  // nothing changed, while a copy pins one of its slots; the error of a
  // slot that could not move (it and the rest stay) or of the reset.
  StatusOr<bool> EmptySegment(uint32_t segment);
  std::chrono::steady_clock::time_point Now() const { return options_.clock(); }
  void RecordLatency(EventKind kind,
                     std::chrono::steady_clock::time_point started);
  void RecordLatency(EventLatency* latency,
                     std::chrono::steady_clock::time_point started);
  void TraceBlock(const char* what, const BlockKey& key, BlockId slot) const {
    if (options_.block_trace) options_.block_trace(what, key, slot);
  }

  CoordinatorOptions options_;
  BlockPool host_pool_;
  std::map<WorkerId, WorkerState> workers_;
  WorkerId next_worker_id_ = 1;
  std::unordered_map<uint32_t, uint32_t> workers_per_uid_;
  // Tenant -> host segment, with max_tenants (CoordinatorOptions), and the
  // workers registered per segment.
  // The last tokens tag given (RequestState::tokens_tag).
  uint64_t last_tokens_tag_ = 0;
  std::map<std::string, uint32_t> tenant_segments_;
  std::unordered_map<uint32_t, uint32_t> segment_workers_;
  std::unordered_map<uint32_t, uint32_t> tenants_per_uid_;  // Who made them.
  // The uid each tenant counts against (tenants_per_uid_).
  std::map<std::string, uint32_t> tenant_uid_;
  // Segments with no worker registered, by when their last one left (a
  // count of such departures): the oldest passes first to a new tenant.
  std::unordered_map<uint32_t, uint64_t> segment_idle_since_;
  uint64_t segment_departures_ = 0;
  // The segment each host slot was last assigned to (max_tenants > 0).
  std::vector<uint32_t> slot_segment_;
  int64_t worker_pin_cap_ = 1;  // worker_pin_share of the usable slots.
  int64_t uid_pin_cap_ = 1;     // uid_pin_share of them.
  // Slots pinned by each uid's workers together (operators' uids too).
  std::unordered_map<uint32_t, int64_t> uid_pinned_;
  size_t request_bytes_ = 0;            // Every worker's request_bytes.
  std::vector<SlotCheck> slot_checks_;  // One per host slot.
  // host_slots x block_size: the token ids each keyed host slot was stored
  // with, beside its KV bytes. The host pool keeps only a check of them (its
  // metadata stays small); spills and the lower tier need the tokens.
  std::vector<TokenId> host_tokens_;
  // Compute leases by chunk (the chunk's last block key).
  std::unordered_map<BlockKey, ChunkLease, BlockKeyHash> chunk_leases_;
  // Keys some store event is writing: a second store of one is skipped.
  std::unordered_set<BlockKey, BlockKeyHash> keys_being_stored_;
  HostTierStats stats_;
  EventLatency load_latency_;
  EventLatency store_latency_;
  EventLatency spill_latency_;
  EventLatency promotion_latency_;
  // The lower tier's side (unused without one).
  std::shared_ptr<LowerInbox> inbox_;
  std::unordered_map<uint64_t, LowerOp> lower_ops_;
  uint64_t next_lower_op_ = 1;
  int32_t spills_in_flight_ = 0;
  // Of spills_in_flight_, write-behind copies (the block stays on host).
  int32_t copies_in_flight_ = 0;
  // Blocks whose stores completed, waiting for a write-behind copy, oldest
  // first; an entry whose slot no longer holds its key is skipped.
  std::deque<std::pair<BlockId, BlockKey>> write_behind_;
  // Keys of discarded spills in flight. Their slots stay keyed (so no store
  // writes the key meanwhile) but no lookup hits them on any tier.
  std::unordered_set<BlockKey, BlockKeyHash> discarded_spills_;
  int32_t promotions_in_flight_ = 0;
  // After a failed spill, spilling rests a while instead of retrying hot.
  std::chrono::steady_clock::time_point spill_resume_{};
  // How long spills pause after the next failure: 100 ms, doubling while
  // they keep failing (a full or stopped lower tier) up to 5 s; a spill
  // that lands starts it over.
  std::chrono::milliseconds spill_backoff_{kFirstSpillBackoff};
  static constexpr std::chrono::milliseconds kFirstSpillBackoff{100};
  static constexpr std::chrono::milliseconds kMaxSpillBackoff{5000};
};

}  // namespace tierkv

#endif  // TIERKV_SRC_COORDINATOR_H_
