#include "src/coordinator.h"

#include <algorithm>
#include <utility>

namespace tierkv {
namespace {

std::string EventName(const EventRef& ref) {
  return std::string(EventKindName(ref.kind)) + " event " +
         std::to_string(ref.id);
}

std::string RequestName(RequestId request) {
  return "request " + std::to_string(request);
}

}  // namespace

StatusOr<Coordinator> Coordinator::Create(const CoordinatorOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (!(options.spill_low > 0 && options.spill_low <= options.spill_high &&
        options.spill_high <= 1)) {
    return Status::InvalidArgument(
        "spill watermarks must satisfy 0 < low <= high <= 1, got low " +
        std::to_string(options.spill_low) + ", high " +
        std::to_string(options.spill_high));
  }
  if (options.host_slots < 2) {
    return Status::InvalidArgument(
        "host tier needs at least 2 slots (slot 0 is the null block), got " +
        std::to_string(options.host_slots));
  }
  TIERKV_ASSIGN_OR_RETURN(
      BlockPool pool,
      BlockPool::Create({.num_blocks = options.host_slots,
                         .block_size = options.layout.block_size,
                         .reserve_null_block = true}));
  return Coordinator(options, std::move(pool));
}

Coordinator::Coordinator(const CoordinatorOptions& options, BlockPool host_pool)
    : options_(options),
      host_pool_(std::move(host_pool)),
      inbox_(std::make_shared<LowerInbox>()) {
  inbox_->wakeup = options_.lower_tier_wakeup;
  if (!options_.clock) options_.clock = std::chrono::steady_clock::now;
}

StatusOr<WorkerId> Coordinator::RegisterWorker(
    const WorkerRegistration& registration) {
  if (Status s = registration.layout.Validate(); !s.ok()) {
    return Status::InvalidArgument("worker layout: " + s.message());
  }
  if (registration.layout.Fingerprint() != options_.layout.Fingerprint()) {
    return Status::FailedPrecondition(
        "this store serves layout " + options_.layout.ToString() +
        "; the worker registered " + registration.layout.ToString());
  }
  if (Status s = ValidateModelName(registration.model); !s.ok()) {
    return Status::InvalidArgument("worker " + s.message());
  }
  if (registration.model != options_.model) {
    return Status::FailedPrecondition(
        "this store serves model " + ModelDisplayName(options_.model) +
        "; the worker registered model " +
        ModelDisplayName(registration.model) +
        " (KV of one model is never served to another)");
  }
  if (registration.num_device_blocks < 1) {
    return Status::InvalidArgument("worker has no device blocks");
  }
  const WorkerId id = next_worker_id_++;
  const KeyNamespace ns{
      .model_fingerprint = StoreFingerprint(options_.layout, options_.model),
      .tenant = registration.tenant};
  workers_.emplace(std::piecewise_construct, std::forward_as_tuple(id),
                   std::forward_as_tuple(registration, KeyHasher(ns)));
  return id;
}

Status Coordinator::DropWorker(WorkerId worker) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  for (auto& [id, request] : w->requests) ReleasePendingHits(&request);
  for (auto& [id, load] : w->loads) ReleaseLoad(&load);
  // Promotions still writing into its slots release them when they finish.
  for (auto& [id, op] : lower_ops_) {
    if (!op.spill && op.worker == worker) op.worker = 0;
  }
  for (auto& [id, store] : w->stores) FinishStore(&store, /*ok=*/false);
  stats_.events_in_flight -= w->loads.size() + w->stores.size();
  workers_.erase(worker);
  return Status::Ok();
}

StatusOr<Coordinator::WorkerState*> Coordinator::FindWorker(WorkerId worker) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) {
    return Status::NotFound("worker " + std::to_string(worker) +
                            " is not registered");
  }
  return &it->second;
}

Status Coordinator::CheckDeviceBlocks(const WorkerState& w,
                                      std::span<const BlockId> blocks) const {
  for (BlockId b : blocks) {
    if (b < 0 || b >= w.registration.num_device_blocks) {
      return Status::OutOfRange(
          "device block " + std::to_string(b) + " is outside the worker's " +
          std::to_string(w.registration.num_device_blocks) + " blocks");
    }
  }
  return Status::Ok();
}

std::span<const TokenId> Coordinator::BlockTokens(const RequestState& r,
                                                  int32_t b) const {
  const size_t bs = static_cast<size_t>(options_.layout.block_size);
  const size_t start = static_cast<size_t>(b) * bs;
  return std::span<const TokenId>(r.tokens).subspan(
      start, std::min(bs, r.tokens.size() - start));
}

bool Coordinator::HostHas(const BlockKey& key,
                          std::span<const TokenId> tokens) const {
  return host_pool_.GetCachedBlock(key, tokens).has_value();
}

void Coordinator::ReleaseSlots(std::span<const BlockId> slots) {
  std::vector<BlockId> reversed(slots.rbegin(), slots.rend());
  host_pool_.FreeBlocks(reversed);
}

void Coordinator::ReleasePendingHits(RequestState* r) {
  std::erase(r->pending_hits, kOnLowerTier);
  ReleaseSlots(r->pending_hits);
  r->pending_hits.clear();
}

void Coordinator::ReleaseLoad(InFlight* load) {
  std::vector<BlockId> held;
  for (size_t i = 0; i < load->slots.size(); ++i) {
    if (load->slots[i] != LoadSlot::kHeld) continue;
    held.push_back(load->event.host_blocks[i]);
    load->slots[i] = LoadSlot::kReleased;
  }
  ReleaseSlots(held);
}

StatusOr<LookupResult> Coordinator::Lookup(WorkerId worker, RequestId request,
                                           std::span<const TokenId> tokens,
                                           int32_t num_computed_tokens,
                                           const RequestExtras& extras) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  const int32_t bs = options_.layout.block_size;
  if (tokens.empty() || tokens.size() > options_.max_request_tokens) {
    return Status::InvalidArgument("lookup of " +
                                   std::to_string(tokens.size()) +
                                   " tokens; a request has 1.." +
                                   std::to_string(options_.max_request_tokens));
  }
  if (num_computed_tokens < 0 || num_computed_tokens % bs != 0 ||
      static_cast<size_t>(num_computed_tokens) >= tokens.size()) {
    return Status::InvalidArgument(
        "num_computed_tokens " + std::to_string(num_computed_tokens) +
        " must be a multiple of the block size (" + std::to_string(bs) +
        ") below the request's " + std::to_string(tokens.size()) + " tokens");
  }
  for (const MultiModalItem& item : extras.mm_items) {
    if (item.start < 0 || item.length < 1 ||
        item.start > static_cast<int64_t>(tokens.size()) - item.length) {
      return Status::InvalidArgument(
          "multimodal item at " + std::to_string(item.start) + " of length " +
          std::to_string(item.length) + " is outside the request's " +
          std::to_string(tokens.size()) + " tokens");
    }
  }
  TIERKV_ASSIGN_OR_RETURN(RequestState * r, BeginLookup(w, request));
  r->tokens.assign(tokens.begin(), tokens.end());
  w->hasher.AppendPrefixKeys(r->tokens, bs, extras, &r->keys);
  const int32_t first = num_computed_tokens / bs;
  return FindHits(
      r, first,
      static_cast<int32_t>(tokens.size() - 1 - num_computed_tokens) / bs);
}

StatusOr<LookupResult> Coordinator::LookupChunk(
    WorkerId worker, RequestId request, std::span<const TokenId> tokens) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  if (tokens.empty() || tokens.size() > options_.max_request_tokens) {
    return Status::InvalidArgument("chunk lookup of " +
                                   std::to_string(tokens.size()) +
                                   " tokens; a chunk has 1.." +
                                   std::to_string(options_.max_request_tokens));
  }
  TIERKV_ASSIGN_OR_RETURN(RequestState * r, BeginLookup(w, request));
  r->tokens.assign(tokens.begin(), tokens.end());
  r->keys = w->hasher.ChunkKeys(r->tokens, options_.layout.block_size);
  return FindHits(r, 0, static_cast<int32_t>(r->keys.size()));
}

StatusOr<Coordinator::RequestState*> Coordinator::BeginLookup(
    WorkerState* w, RequestId request) {
  auto [it, inserted] = w->requests.try_emplace(request);
  RequestState& r = it->second;
  if (!inserted) {
    if (r.allocated) {
      return Status::FailedPrecondition(RequestName(request) +
                                        " is already allocated");
    }
    ReleasePendingHits(&r);  // A stale lookup's pins (seed 004 step 3).
  }
  r.keys.clear();
  return &r;
}

LookupResult Coordinator::FindHits(RequestState* r, int32_t first,
                                   int32_t max_blocks) {
  r->first_hit_block = first;
  std::vector<BlockId> host_hits;
  int32_t disk_hits = 0;
  LookupResult result;
  for (int32_t b = first; b < first + max_blocks; ++b) {
    // Dropped by an operator, though its spill has not finished.
    if (!discarded_spills_.empty() && discarded_spills_.contains(r->keys[b])) {
      break;
    }
    const std::span<const TokenId> tokens = BlockTokens(*r, b);
    std::optional<BlockId> slot = host_pool_.GetCachedBlock(r->keys[b], tokens);
    if (slot.has_value()) {
      host_hits.push_back(*slot);
      r->pending_hits.push_back(*slot);
    } else if (options_.lower != nullptr &&
               options_.lower->Contains(r->keys[b], tokens)) {
      ++disk_hits;
      r->pending_hits.push_back(kOnLowerTier);
      result.disk_hit_tokens += static_cast<int32_t>(tokens.size());
    } else {
      break;
    }
    result.hit_tokens += static_cast<int32_t>(tokens.size());
  }
  host_pool_.Touch(host_hits);
  const auto hits = static_cast<int32_t>(r->pending_hits.size());
  ++stats_.lookups;
  stats_.lookup_blocks += max_blocks;
  stats_.hit_blocks += hits - disk_hits;
  stats_.disk_hit_blocks += disk_hits;
  stats_.miss_blocks += max_blocks - hits;
  return result;
}

StatusOr<AllocateResult> Coordinator::Allocate(
    WorkerId worker, RequestId request, std::span<const BlockId> device_blocks,
    int32_t num_external_tokens) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  auto it = w->requests.find(request);
  if (it == w->requests.end()) {
    return Status::FailedPrecondition(RequestName(request) +
                                      " was not looked up first");
  }
  RequestState& r = it->second;
  if (r.allocated) {
    return Status::FailedPrecondition(RequestName(request) +
                                      " is already allocated");
  }
  TIERKV_RETURN_IF_ERROR(CheckDeviceBlocks(*w, device_blocks));
  const int32_t bs = options_.layout.block_size;
  // The hit, up to the end of the tokens (a chunk's last block is partial).
  const int64_t after_first = static_cast<int64_t>(r.tokens.size()) -
                              static_cast<int64_t>(r.first_hit_block) * bs;
  const auto hit_tokens = static_cast<int32_t>(std::min<int64_t>(
      static_cast<int64_t>(r.pending_hits.size()) * bs, after_first));
  if (num_external_tokens < 0 || num_external_tokens > hit_tokens ||
      (num_external_tokens % bs != 0 && num_external_tokens != after_first)) {
    return Status::InvalidArgument(
        "num_external_tokens " + std::to_string(num_external_tokens) +
        " must be a multiple of " + std::to_string(bs) +
        " (or the whole chunk) up to the hit (" + std::to_string(hit_tokens) +
        " tokens)");
  }
  const int32_t used = (num_external_tokens + bs - 1) / bs;
  if (static_cast<int64_t>(device_blocks.size()) < r.first_hit_block + used) {
    return Status::InvalidArgument("the load needs device blocks up to block " +
                                   std::to_string(r.first_hit_block + used) +
                                   ", got " +
                                   std::to_string(device_blocks.size()));
  }
  // Hits the engine does not take are released now, tail first.
  std::vector<BlockId> unused(r.pending_hits.begin() + used,
                              r.pending_hits.end());
  std::erase(unused, kOnLowerTier);
  ReleaseSlots(unused);
  r.pending_hits.resize(used);

  AllocateResult result;
  if (used > 0) {
    // The lookup's pins become the load's (seed 004 step 5 frees and
    // re-touches; the ref count is the same).
    InFlight in_flight;
    in_flight.started = Now();
    TransferEvent& load = in_flight.event;
    load = {.ref = {EventKind::kLoad, w->next_load_id++},
            .request = request,
            .device_blocks = {},
            .host_blocks = std::move(r.pending_hits)};
    load.device_blocks.assign(device_blocks.begin() + r.first_hit_block,
                              device_blocks.begin() + r.first_hit_block + used);
    r.pending_hits.clear();
    in_flight.slots.assign(used, LoadSlot::kHeld);
    // Disk hits get a slot to be promoted into.
    std::vector<LowerOp> promotions;
    for (int32_t i = 0; i < used; ++i) {
      if (load.host_blocks[i] != kOnLowerTier) continue;
      std::vector<BlockId> slot;
      if (!host_pool_.GetNewBlocks(1, &slot).ok()) {
        load.host_blocks[i] = 0;
        in_flight.slots[i] = LoadSlot::kReleased;
        ++stats_.promotion_failures;
        continue;
      }
      load.host_blocks[i] = slot[0];
      in_flight.slots[i] = LoadSlot::kPromoting;
      const std::span<const TokenId> tokens =
          BlockTokens(r, r.first_hit_block + i);
      promotions.push_back(LowerOp{.spill = false,
                                   .slot = slot[0],
                                   .key = r.keys[r.first_hit_block + i],
                                   .tokens = {tokens.begin(), tokens.end()},
                                   .worker = worker,
                                   .load = load.ref.id,
                                   .index = static_cast<size_t>(i)});
    }
    in_flight.promoting = static_cast<int32_t>(promotions.size());
    if (in_flight.promoting == 0) FinishPromotions(&in_flight);
    in_flight.pending = in_flight.promoting > 0;
    result.load = in_flight.event;
    result.load_pending = in_flight.pending;
    const uint64_t id = load.ref.id;
    w->loads.emplace(id, std::move(in_flight));
    ++stats_.events_in_flight;
    for (LowerOp& op : promotions) StartLowerOp(std::move(op));
  }
  r.allocated = true;
  if (host_pool_.num_free_blocks() == 0) {
    result.store_status = Status::ResourceExhausted(
        "host tier: all " + std::to_string(host_pool_.num_blocks() - 1) +
        " slots are pinned; nothing can be stored now");
  }
  MaybeSpill();
  return result;
}

StatusOr<CommitResult> Coordinator::Commit(
    WorkerId worker, RequestId request, int32_t num_computed_tokens,
    std::span<const BlockId> device_blocks) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  auto it = w->requests.find(request);
  if (it == w->requests.end() || !it->second.allocated) {
    return Status::FailedPrecondition(RequestName(request) +
                                      " is not allocated");
  }
  RequestState& r = it->second;
  TIERKV_RETURN_IF_ERROR(CheckDeviceBlocks(*w, device_blocks));
  if (num_computed_tokens < 0) {
    return Status::InvalidArgument("negative num_computed_tokens");
  }
  const int32_t bs = options_.layout.block_size;
  // Only the prompt's tokens are known here; later blocks are not stored.
  // A chunk's partial last block is stored once the whole chunk is.
  const auto full = static_cast<int32_t>(
      static_cast<size_t>(num_computed_tokens) >= r.tokens.size()
          ? r.keys.size()
          : static_cast<size_t>(num_computed_tokens / bs));
  if (full > static_cast<int64_t>(device_blocks.size())) {
    return Status::InvalidArgument(
        std::to_string(full) + " full blocks computed but only " +
        std::to_string(device_blocks.size()) + " device blocks given");
  }
  CommitResult result;
  InFlight store;
  store.started = Now();
  store.event.ref.kind = EventKind::kStore;
  store.event.request = request;
  for (int32_t b = r.next_store_block; b < full; ++b) {
    const BlockKey& key = r.keys[b];
    std::span<const TokenId> tokens = BlockTokens(r, b);
    if (!discarded_spills_.empty() && discarded_spills_.contains(key)) {
      // Its slot stays keyed until the discarded spill finishes; storing
      // the key again then would need a second slot under one key.
      ++result.skipped_blocks;
      continue;
    }
    if (HostHas(key, tokens) || keys_being_stored_.contains(key)) continue;
    std::vector<BlockId> slot;
    if (!host_pool_.GetNewBlocks(1, &slot).ok()) {
      ++result.skipped_blocks;
      continue;
    }
    keys_being_stored_.insert(key);
    store.event.device_blocks.push_back(device_blocks[b]);
    store.event.host_blocks.push_back(slot[0]);
    store.keys.push_back(key);
    store.tokens.emplace_back(tokens.begin(), tokens.end());
  }
  r.next_store_block = std::max(r.next_store_block, full);
  stats_.store_skipped += result.skipped_blocks;
  if (!store.keys.empty()) {
    store.event.ref.id = w->next_store_id++;
    result.stores.push_back(store.event);
    w->stores.emplace(store.event.ref.id, std::move(store));
    ++stats_.events_in_flight;
  }
  MaybeSpill();
  return result;
}

void Coordinator::FinishStore(InFlight* store, bool ok) {
  const std::vector<BlockId>& slots = store->event.host_blocks;
  for (size_t i = 0; i < slots.size(); ++i) {
    keys_being_stored_.erase(store->keys[i]);
    if (!ok) continue;
    // Cannot fail: the slot is pinned and unkeyed, with 1..block_size tokens.
    if (host_pool_.CacheBlock(slots[i], store->keys[i], store->tokens[i])
            .ok()) {
      ++stats_.stores_completed;
    }
  }
  if (!ok) stats_.stores_failed += slots.size();
  ReleaseSlots(slots);
}

Status Coordinator::Complete(WorkerId worker,
                             std::span<const CompletedEvent> events) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  for (size_t i = 0; i < events.size(); ++i) {
    const EventRef& ref = events[i].ref;
    const auto& in_flight = ref.kind == EventKind::kLoad ? w->loads : w->stores;
    auto found = in_flight.find(ref.id);
    if (found == in_flight.end()) {
      return Status::NotFound(EventName(ref) + " is not in flight for worker " +
                              std::to_string(worker));
    }
    if (found->second.pending) {
      return Status::FailedPrecondition(
          EventName(ref) +
          " is still waiting for promotions; it cannot have been copied");
    }
    for (size_t j = 0; j < i; ++j) {
      if (events[j].ref == ref) {
        return Status::InvalidArgument(EventName(ref) + " completed twice");
      }
    }
  }
  for (const CompletedEvent& done : events) {
    if (done.ref.kind == EventKind::kLoad) {
      auto it = w->loads.find(done.ref.id);
      RecordLatency(EventKind::kLoad, it->second.started);
      ReleaseLoad(&it->second);
      if (done.ok)
        stats_.loads_completed += it->second.event.host_blocks.size();
      w->loads.erase(it);
    } else {
      auto it = w->stores.find(done.ref.id);
      RecordLatency(EventKind::kStore, it->second.started);
      FinishStore(&it->second, done.ok);
      w->stores.erase(it);
    }
    --stats_.events_in_flight;
  }
  MaybeSpill();
  return Status::Ok();
}

Status Coordinator::Finish(WorkerId worker, RequestId request) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  auto it = w->requests.find(request);
  if (it == w->requests.end()) {
    return Status::NotFound(RequestName(request) + " is not known");
  }
  ReleasePendingHits(&it->second);
  CancelUntakenLoads(w, request);
  w->requests.erase(it);
  return Status::Ok();
}

void Coordinator::CancelUntakenLoads(WorkerState* w, RequestId request) {
  for (auto it = w->loads.begin(); it != w->loads.end();) {
    InFlight& load = it->second;
    if (load.event.request != request || !load.pending) {
      ++it;
      continue;
    }
    // Slots still being promoted are released by PumpLowerTier when their
    // promotion lands (keyed on host if it succeeded): the load is gone.
    ReleaseLoad(&load);
    std::erase(w->ready_loads, it->first);
    ++stats_.loads_cancelled;
    --stats_.events_in_flight;
    it = w->loads.erase(it);
  }
}

int64_t Coordinator::UsedSlots() const {
  return static_cast<int64_t>(host_pool_.num_cached_blocks() +
                              keys_being_stored_.size()) +
         promotions_in_flight_;
}

}  // namespace tierkv
