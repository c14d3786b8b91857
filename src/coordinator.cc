#include "src/coordinator.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "src/printable.h"
#include "src/rope_remap.h"

namespace tierkv {
namespace {

std::string EventName(const EventRef& ref) {
  return std::string(EventKindName(ref.kind)) + " event " +
         std::to_string(ref.id);
}

std::string RequestName(RequestId request) {
  return "request " + std::to_string(request);
}

std::string WorkerName(WorkerId worker) {
  return "worker " + std::to_string(worker);
}

// What a request's state keeps: its token ids, one key per block and at
// most one pinned hit per block.
size_t RequestStateBytes(size_t tokens, size_t blocks) {
  return tokens * sizeof(TokenId) +
         blocks * (sizeof(BlockKey) + sizeof(BlockId));
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
  if (options.write_behind_spills < 0) {
    return Status::InvalidArgument(
        "write_behind_spills must be at least 0 (0 turns write-behind off), "
        "got " +
        std::to_string(options.write_behind_spills));
  }
  if (options.host_slots < 2) {
    return Status::InvalidArgument(
        "host tier needs at least 2 slots (slot 0 is the null block), got " +
        std::to_string(options.host_slots));
  }
  if (!(options.caps.worker_pin_share > 0 &&
        options.caps.worker_pin_share <= 1)) {
    return Status::InvalidArgument(
        "a worker's share of the host slots must be in (0, 1], got " +
        std::to_string(options.caps.worker_pin_share));
  }
  if (!(options.caps.uid_pin_share > 0 && options.caps.uid_pin_share <= 1)) {
    return Status::InvalidArgument(
        "a uid's share of the host slots must be in (0, 1], got " +
        std::to_string(options.caps.uid_pin_share));
  }
  if (options.caps.max_requests_per_worker < 1 ||
      options.caps.max_request_bytes_per_worker < 1 ||
      options.caps.max_events_per_worker < 1 ||
      options.caps.max_workers_per_uid < 1 ||
      options.caps.max_tenants_per_uid < 1) {
    return Status::InvalidArgument(
        "per-worker caps (requests, request bytes, events, workers and "
        "tenants per uid) must be at least 1");
  }
  if (options.verify_on_load && !options.slot_checksum) {
    return Status::InvalidArgument("verify_on_load needs slot checksums");
  }
  TIERKV_ASSIGN_OR_RETURN(
      BlockPool pool,
      BlockPool::Create({.num_blocks = options.host_slots,
                         .block_size = options.layout.block_size,
                         .reserve_null_block = true,
                         .eviction = options.host_eviction,
                         .free_uncached_first = true,
                         .keep_tokens = false}));
  return Coordinator(options, std::move(pool));
}

Coordinator::Coordinator(const CoordinatorOptions& options, BlockPool host_pool)
    : options_(options),
      host_pool_(std::move(host_pool)),
      inbox_(std::make_shared<LowerInbox>()) {
  inbox_->wakeup = options_.lower_tier_wakeup;
  if (options_.cache_events != nullptr) {
    // The sink, not `this`: the coordinator moves after construction.
    host_pool_.set_key_dropped(
        [sink = options_.cache_events](const BlockKey& key) {
          sink->BlockRemoved(CacheMedium::kCpu, key);
        });
  }
  if (!options_.clock) options_.clock = std::chrono::steady_clock::now;
  const int64_t usable = options_.host_slots - 1;
  worker_pin_cap_ =
      std::clamp<int64_t>(static_cast<int64_t>(options_.caps.worker_pin_share *
                                               static_cast<double>(usable)),
                          1, usable);
  uid_pin_cap_ =
      std::clamp<int64_t>(static_cast<int64_t>(options_.caps.uid_pin_share *
                                               static_cast<double>(usable)),
                          1, usable);
  slot_checks_.resize(static_cast<size_t>(options_.host_slots));
  if (options_.max_tenants > 0) {
    slot_segment_.assign(static_cast<size_t>(options_.host_slots), 0);
  }
  host_tokens_.resize(static_cast<size_t>(options_.host_slots) *
                      static_cast<size_t>(options_.layout.block_size));
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
  TIERKV_RETURN_IF_ERROR(CheckRoles(registration));
  uint32_t segment = 0;
  bool new_tenant = false;
  if (options_.max_tenants > 0) {
    const auto known = tenant_segments_.find(registration.tenant);
    if (known != tenant_segments_.end()) {
      segment = known->second;
    } else if (const auto made = tenants_per_uid_.find(registration.uid);
               !registration.operator_uid && made != tenants_per_uid_.end() &&
               made->second >= options_.caps.max_tenants_per_uid) {
      ++stats_.quota_registration_refusals;
      return Status::ResourceExhausted(
          "uid " + std::to_string(registration.uid) + " brought " +
          std::to_string(made->second) +
          " tenants to this store, its cap (max_tenants_per_uid); tenant '" +
          PrintableName(registration.tenant) + "' would be one more");
    } else {
      new_tenant = true;
      segment = static_cast<uint32_t>(tenant_segments_.size());
    }
  }
  const auto of_uid = workers_per_uid_.find(registration.uid);
  if (of_uid != workers_per_uid_.end() &&
      of_uid->second >= options_.caps.max_workers_per_uid) {
    ++stats_.quota_registration_refusals;
    return Status::ResourceExhausted(
        "uid " + std::to_string(registration.uid) + " has " +
        std::to_string(of_uid->second) +
        " workers registered, its cap (max_workers_per_uid)");
  }
  if (new_tenant && tenant_segments_.size() >= options_.max_tenants) {
    StatusOr<uint32_t> freed = ReclaimIdleSegment(registration.tenant);
    if (!freed.ok()) {
      ++stats_.quota_registration_refusals;
      return freed.status();
    }
    segment = *freed;
  }
  ++workers_per_uid_[registration.uid];
  const WorkerId id = next_worker_id_++;
  const KeyNamespace ns{
      .model_fingerprint = StoreFingerprint(options_.layout, options_.model),
      .tenant = registration.tenant};
  WorkerState& w =
      workers_
          .emplace(std::piecewise_construct, std::forward_as_tuple(id),
                   std::forward_as_tuple(registration, KeyHasher(ns)))
          .first->second;
  w.segment = segment;
  w.rank_workers.assign(static_cast<size_t>(registration.ranks), 0);
  if (registration.scheduler != 0) {
    WorkerState& s = workers_.at(registration.scheduler);
    s.rank_workers[static_cast<size_t>(registration.rank)] = id;
    RankAttached(&s, registration.rank);
  }
  if (options_.max_tenants > 0) {
    if (tenant_segments_.emplace(registration.tenant, segment).second) {
      ++tenants_per_uid_[registration.uid];
      tenant_uid_[registration.tenant] = registration.uid;
    }
    ++segment_workers_[segment];
    segment_idle_since_.erase(segment);
  }
  return id;
}

StatusOr<uint32_t> Coordinator::ReclaimIdleSegment(
    const std::string& for_tenant) {
  // Idle tenants, the longest idle first; segment 0 keeps its tenant: its
  // memory is where every slot lives when no tenant holds it.
  std::vector<std::pair<uint64_t, std::string>> idle;
  for (const auto& [tenant, segment] : tenant_segments_) {
    const auto since = segment_idle_since_.find(segment);
    if (segment != 0 && since != segment_idle_since_.end()) {
      idle.emplace_back(since->second, tenant);
    }
  }
  std::ranges::sort(idle);
  const auto refused = [&](const std::string& why) {
    return Status::ResourceExhausted("this store has host segments for " +
                                     std::to_string(tenant_segments_.size()) +
                                     " tenants, its cap (max_tenants), " + why +
                                     "; tenant '" + PrintableName(for_tenant) +
                                     "' would be one more");
  };
  std::string last_error;
  for (const auto& [since, tenant] : idle) {
    const uint32_t segment = tenant_segments_.at(tenant);
    StatusOr<bool> emptied = EmptySegment(segment);
    if (!emptied.ok()) {
      last_error = "the segment of idle tenant '" + PrintableName(tenant) +
                   "' could not be freed: " + emptied.status().message();
    }
    if (!emptied.ok() || !*emptied) continue;
    if (const auto uid = tenant_uid_.find(tenant); uid != tenant_uid_.end()) {
      if (auto made = tenants_per_uid_.find(uid->second);
          made != tenants_per_uid_.end() && --made->second == 0) {
        tenants_per_uid_.erase(made);
      }
      tenant_uid_.erase(uid);
    }
    tenant_segments_.erase(tenant);
    segment_idle_since_.erase(segment);
    ++stats_.tenants_reclaimed;
    return segment;
  }
  if (!last_error.empty()) return refused("and " + last_error);
  return refused(idle.empty()
                     ? "each with a worker registered"
                     : "each with a worker registered or a copy running");
}

StatusOr<bool> Coordinator::EmptySegment(uint32_t segment) {
  std::vector<BlockId> slots;
  for (BlockId slot = 1; slot < host_pool_.num_blocks(); ++slot) {
    if (slot_segment_[static_cast<size_t>(slot)] != segment) continue;
    // Pinned by a copy still running (a spill, a promotion its worker
    // left, a rank's store): the tenant's memory is in use.
    if (host_pool_.block(slot).ref_cnt > 0) return false;
    slots.push_back(slot);
  }
  for (const BlockId slot : slots) {
    // Its memory in segment 0 is taken again (it was given back there when
    // the slot left): a slot that cannot have it stays as it is.
    if (options_.assign_slot) {
      TIERKV_RETURN_IF_ERROR(options_.assign_slot(slot, 0));
    }
    slot_segment_[static_cast<size_t>(slot)] = 0;
    // Its bytes stayed behind: the block is gone from host.
    const BlockPool::Block& b = host_pool_.block(slot);
    if (b.has_key()) {
      if (LostBelow(slot)) ++stats_.evicted_unspilled;
      TraceBlock("dropped (its tenant's segment reclaimed)", b.key, slot);
      host_pool_.DropCachedBlock(slot);
    }
  }
  if (options_.reset_segment) {
    TIERKV_RETURN_IF_ERROR(options_.reset_segment(segment));
  }
  return true;
}

StatusOr<uint32_t> Coordinator::SegmentOf(WorkerId worker) const {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) {
    return Status::NotFound("worker " + std::to_string(worker) +
                            " is not registered");
  }
  return it->second.segment;
}

Status Coordinator::DropWorker(WorkerId worker, Departure departure) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  EndLease(w);
  for (auto& [id, request] : w->requests) ForgetRequest(w, &request);
  w->requests.clear();
  // Events its ranks may be copying stay until they are done with them.
  const bool ranks_copy = std::ranges::any_of(
      w->rank_workers, [](WorkerId rank) { return rank != 0; });
  for (auto it = w->loads.begin(); it != w->loads.end();) {
    if (ranks_copy && !it->second.pending) {
      ++it;
      continue;
    }
    ReleaseLoad(w, &it->second);
    --stats_.events_in_flight;
    it = w->loads.erase(it);
  }
  w->ready_loads.clear();
  // Promotions still writing into its slots release them when they finish.
  for (auto& [id, op] : lower_ops_) {
    if (!op.spill && op.worker == worker) op.worker = 0;
  }
  if (!ranks_copy) {
    for (auto& [id, store] : w->stores) {
      FinishStore(w, &store, /*ok=*/false, {});
    }
    stats_.events_in_flight -= w->stores.size();
    w->stores.clear();
  }
  if (auto it = workers_per_uid_.find(w->registration.uid);
      it != workers_per_uid_.end() && --it->second == 0) {
    workers_per_uid_.erase(it);
  }
  if (auto it = segment_workers_.find(w->segment);
      it != segment_workers_.end() && --it->second == 0) {
    segment_workers_.erase(it);
    segment_idle_since_[w->segment] = ++segment_departures_;
    if (options_.trim_segment) options_.trim_segment(w->segment);
  }
  const WorkerId scheduler = w->registration.scheduler;
  const int32_t rank = w->registration.rank;
  if (!w->loads.empty() || !w->stores.empty()) {
    w->dropped = true;
    // A vacant rank copies nothing, and none can attach any more. (Marking
    // may forget the scheduler: `w` is not used after.)
    const std::vector<WorkerId> ranks = w->rank_workers;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r] == 0) {
        MarkRanksDone(worker, static_cast<int32_t>(r), {},
                      /*dropped_rank=*/true, {});
      }
    }
  } else {
    EraseWorker(workers_.find(worker));
  }
  if (scheduler != 0) {
    // A rank: it fails its part of every event it had not completed.
    const auto s = workers_.find(scheduler);
    if (s != workers_.end()) {
      WorkerState& sched = s->second;
      sched.rank_workers[static_cast<size_t>(rank)] = 0;
      const bool tagged = !sched.registration.attachment_tag.empty();
      const bool live = sched.lost_rank < 0 && !sched.dropped;
      // Vacant again, its part of the events still open: the rank that
      // attaches next declines what it missed, as after a failed attach.
      // (Once the attachment is over, no rank will: its part fails below.)
      if (tagged && live && departure == Departure::kRefused) {
        return Status::Ok();
      }
      const bool ends = tagged && live;
      if (ends) sched.lost_rank = rank;
      // The lost rank's part fails; once the attachment ends, so does that
      // of every rank not attached, which none will be any more.
      const std::vector<WorkerId> ranks = sched.rank_workers;
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (static_cast<int32_t>(r) == rank || (ends && ranks[r] == 0)) {
          // Marking may forget the scheduler: `sched` is not used after.
          MarkRanksDone(scheduler, static_cast<int32_t>(r), {},
                        /*dropped_rank=*/true, {});
        }
      }
    }
  }
  return Status::Ok();
}

StatusOr<Coordinator::WorkerState*> Coordinator::FindWorker(WorkerId worker) {
  auto it = workers_.find(worker);
  if (it == workers_.end() || it->second.dropped) {
    return Status::NotFound("worker " + std::to_string(worker) +
                            " is not registered");
  }
  return &it->second;
}

StatusOr<Coordinator::WorkerState*> Coordinator::FindIssuingWorker(
    WorkerId worker) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindRequestWorker(worker));
  if (w->lost_rank >= 0) {
    return Status::Unavailable(
        WorkerName(worker) + " lost rank " + std::to_string(w->lost_rank) +
        ", which ends its attachment (it has an attachment tag): it hands "
        "out no more events; attach anew with a new client and tag");
  }
  return w;
}

StatusOr<Coordinator::WorkerState*> Coordinator::FindRequestWorker(
    WorkerId worker) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  if (w->registration.scheduler != 0) {
    return Status::FailedPrecondition(
        WorkerName(worker) + " is rank " +
        std::to_string(w->registration.rank) + " of scheduler " +
        WorkerName(w->registration.scheduler) +
        ": it copies that scheduler's events and makes no requests");
  }
  return w;
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

Status Coordinator::CheckDistinctDeviceBlocks(
    const WorkerState& w, std::span<const BlockId> blocks) const {
  TIERKV_RETURN_IF_ERROR(CheckDeviceBlocks(w, blocks));
  // A sorted copy: O(blocks log blocks) and memory for the blocks named,
  // whatever number of device blocks the worker registered.
  std::vector<BlockId> sorted(blocks.begin(), blocks.end());
  std::ranges::sort(sorted);
  if (const auto twice = std::ranges::adjacent_find(sorted);
      twice != sorted.end()) {
    return Status::InvalidArgument(
        "device block " + std::to_string(*twice) +
        " is named twice: one device block holds one block of a request");
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
  return FindHostBlock(key, tokens).has_value();
}

std::optional<BlockId> Coordinator::FindHostBlock(
    const BlockKey& key, std::span<const TokenId> tokens) const {
  // By key alone, then the slot's own token ids (kept beside it) settle
  // it: a collision, chosen or not, is a miss, never another's KV. The
  // pool's keyed token check would only repeat that at a hash per block.
  const std::optional<BlockId> slot = host_pool_.FindKeyedBlock(key);
  if (!slot.has_value() || !std::ranges::equal(HostSlotTokens(*slot), tokens)) {
    return std::nullopt;
  }
  return slot;
}

Status Coordinator::KeyHostSlot(BlockId slot, const BlockKey& key,
                                std::span<const TokenId> tokens,
                                const std::optional<BlockKey>& parent,
                                std::optional<uint64_t> lora_id) {
  TIERKV_RETURN_IF_ERROR(host_pool_.CacheBlock(slot, key, tokens));
  std::ranges::copy(tokens,
                    host_tokens_.begin() +
                        static_cast<std::ptrdiff_t>(
                            static_cast<size_t>(slot) *
                            static_cast<size_t>(options_.layout.block_size)));
  if (options_.cache_events != nullptr) {
    options_.cache_events->BlockStored(
        {.medium = CacheMedium::kCpu,
         .key = key,
         .parent = parent,
         .tokens = tokens,
         .block_size = options_.layout.block_size,
         .lora_id = lora_id});
  }
  return Status::Ok();
}

std::optional<BlockKey> Coordinator::ParentOf(const RequestState& r,
                                              int32_t b) {
  if (b <= 0) return std::nullopt;
  return r.keys[static_cast<size_t>(b - 1)];
}

std::span<const TokenId> Coordinator::HostSlotTokens(BlockId slot) const {
  return std::span<const TokenId>(host_tokens_)
      .subspan(static_cast<size_t>(slot) *
                   static_cast<size_t>(options_.layout.block_size),
               host_pool_.block(slot).num_tokens);
}

void Coordinator::ReleaseSlots(std::span<const BlockId> slots) {
  std::vector<BlockId> reversed(slots.rbegin(), slots.rend());
  host_pool_.FreeBlocks(reversed);
  for (BlockId slot : slots) {
    SlotCheck& check = slot_checks_[static_cast<size_t>(slot)];
    if (!check.corrupt || host_pool_.block(slot).ref_cnt > 0) continue;
    check.corrupt = false;
    (void)host_pool_.DropCachedBlock(slot);
  }
}

void Coordinator::ReleaseWorkerSlots(WorkerState* w,
                                     std::span<const BlockId> slots) {
  ReleaseSlots(slots);
  if (w != nullptr) AddPins(w, -static_cast<int64_t>(slots.size()));
}

void Coordinator::EraseWorker(std::map<WorkerId, WorkerState>::iterator it) {
  // Pins it still counts go with it (a promotion in flight releases its
  // slot without a worker).
  AddPins(&it->second, -it->second.pinned_slots);
  workers_.erase(it);
}

void Coordinator::AddPins(WorkerState* w, int64_t n) {
  w->pinned_slots += n;
  // Kept at 0 too: one entry a uid ever attached, not a node freed and
  // allocated again as its pins come and go on every request.
  uid_pinned_[w->registration.uid] += n;
}

std::optional<BlockId> Coordinator::NewWorkerSlot(WorkerState* w) {
  std::vector<BlockId> slot;
  if (!TakeFreeSlot(&slot)) return std::nullopt;
  if (options_.assign_slot && !options_.assign_slot(slot[0], w->segment).ok()) {
    // Unkeyed: back to the front of the free queue, so the next attempt
    // takes this slot again instead of evicting another cached block.
    const bool returned = host_pool_.ReturnNewBlock(slot[0]);
    assert(returned);
    (void)returned;
    ++stats_.slot_reserve_failures;
    return std::nullopt;
  }
  if (options_.max_tenants > 0) {
    slot_segment_[static_cast<size_t>(slot[0])] = w->segment;
  }
  AddPins(w, 1);
  ResetSlotCheck(slot[0]);
  return slot[0];
}

int64_t Coordinator::UidPinRoom(const WorkerState& w) const {
  // No cap (share 1) or an operator's uid: what the pool has.
  if (options_.caps.uid_pin_share >= 1 || w.registration.operator_uid) {
    return host_pool_.num_blocks();
  }
  const auto it = uid_pinned_.find(w.registration.uid);
  return std::max<int64_t>(
      0, uid_pin_cap_ - (it == uid_pinned_.end() ? 0 : it->second));
}

int64_t Coordinator::PinRoom(const WorkerState& w) const {
  return std::min(std::max<int64_t>(0, worker_pin_cap_ - w.pinned_slots),
                  UidPinRoom(w));
}

Status Coordinator::PinCapStatus(WorkerId worker, const WorkerState& w) const {
  if (UidPinRoom(w) == 0) {
    return Status::ResourceExhausted(
        "uid " + std::to_string(w.registration.uid) + "'s workers pin " +
        std::to_string(uid_pin_cap_) +
        " host slots, its cap (uid_pin_share of " +
        std::to_string(host_pool_.num_blocks() - 1) + " slots); " +
        WorkerName(worker) + " stores more once their transfers complete");
  }
  return Status::ResourceExhausted(
      WorkerName(worker) + " pins " + std::to_string(w.pinned_slots) +
      " host slots, its cap (worker_pin_share of " +
      std::to_string(host_pool_.num_blocks() - 1) +
      " slots: " + std::to_string(worker_pin_cap_) +
      "); it stores more once its transfers complete");
}

void Coordinator::ReleasePendingHits(WorkerState* w, RequestState* r) {
  std::erase(r->pending_hits, kOnLowerTier);
  ReleaseWorkerSlots(w, r->pending_hits);
  r->pending_hits.clear();
}

void Coordinator::ForgetRequest(WorkerState* w, RequestState* r) {
  ReleasePendingHits(w, r);
  w->request_bytes -= r->state_bytes;
  request_bytes_ -= r->state_bytes;
  r->state_bytes = 0;
}

void Coordinator::ReleaseLoad(WorkerState* w, InFlight* load) {
  std::vector<BlockId> held;
  for (size_t i = 0; i < load->slots.size(); ++i) {
    if (load->slots[i] != LoadSlot::kHeld) continue;
    held.push_back(load->event.host_blocks[i]);
    load->slots[i] = LoadSlot::kReleased;
  }
  ReleaseWorkerSlots(w, held);
}

void Coordinator::ResetSlotCheck(BlockId slot) {
  slot_checks_[static_cast<size_t>(slot)] = SlotCheck{};
}

bool Coordinator::SlotIntact(BlockId slot) const {
  const SlotCheck& check = slot_checks_[static_cast<size_t>(slot)];
  if (check.corrupt) return false;
  if (!check.has_checksum || !options_.slot_checksum) return true;
  return options_.slot_checksum(slot) == check.checksum;
}

void Coordinator::DropCorruptSlot(BlockId slot) {
  SlotCheck& check = slot_checks_[static_cast<size_t>(slot)];
  if (check.corrupt) return;  // Counted already.
  ++stats_.corrupt_slots_dropped;
  check.has_checksum = false;
  if (host_pool_.block(slot).ref_cnt == 0) {
    (void)host_pool_.DropCachedBlock(slot);
  } else {
    check.corrupt = true;  // ReleaseSlots drops it.
  }
}

Status Coordinator::CheckLookup(size_t num_tokens, int32_t num_computed_tokens,
                                const RequestExtras& extras) const {
  const int32_t bs = options_.layout.block_size;
  if (num_tokens == 0 || num_tokens > options_.max_request_tokens) {
    return Status::InvalidArgument("lookup of " + std::to_string(num_tokens) +
                                   " tokens; a request has 1.." +
                                   std::to_string(options_.max_request_tokens));
  }
  if (num_computed_tokens < 0 || num_computed_tokens % bs != 0 ||
      static_cast<size_t>(num_computed_tokens) >= num_tokens) {
    return Status::InvalidArgument(
        "num_computed_tokens " + std::to_string(num_computed_tokens) +
        " must be a multiple of the block size (" + std::to_string(bs) +
        ") below the request's " + std::to_string(num_tokens) + " tokens");
  }
  return CheckItems(num_tokens, extras);
}

Status Coordinator::CheckItems(size_t num_tokens, const RequestExtras& extras) {
  for (const MultiModalItem& item : extras.mm_items) {
    if (item.start < 0 || item.length < 1 ||
        item.start > static_cast<int64_t>(num_tokens) - item.length) {
      return Status::InvalidArgument(
          "multimodal item at " + std::to_string(item.start) + " of length " +
          std::to_string(item.length) + " is outside the request's " +
          std::to_string(num_tokens) + " tokens");
    }
  }
  // An engine's items fill placeholder ranges of their own, or share a few
  // (a video's audio track over its frames). Keying a block encodes every
  // item over it, so a bound on how many cover one token keeps keying
  // linear in the blocks (KeyHasher::AppendPrefixKeys).
  std::vector<std::pair<int64_t, int>> edges;  // (token, +1 start, -1 end)
  edges.reserve(2 * extras.mm_items.size());
  for (const MultiModalItem& item : extras.mm_items) {
    edges.emplace_back(item.start, 1);
    edges.emplace_back(item.start + item.length, -1);
  }
  std::ranges::sort(edges);  // At one token, ends before starts.
  int depth = 0;
  for (const auto& [token, step] : edges) {
    depth += step;
    if (depth > kMaxItemsOverAToken) {
      return Status::InvalidArgument("more than " +
                                     std::to_string(kMaxItemsOverAToken) +
                                     " multimodal items cover token " +
                                     std::to_string(token) + " of the request");
    }
  }
  return Status::Ok();
}

namespace {
bool IsPlain(const RequestExtras& extras) {
  return !extras.lora_id.has_value() && extras.mm_items.empty() &&
         extras.cache_salt.empty();
}
}  // namespace

StatusOr<LookupResult> Coordinator::Lookup(WorkerId worker, RequestId request,
                                           std::span<const TokenId> tokens,
                                           int32_t num_computed_tokens,
                                           const RequestExtras& extras) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
  TIERKV_RETURN_IF_ERROR(
      CheckLookup(tokens.size(), num_computed_tokens, extras));
  const size_t bs = static_cast<size_t>(options_.layout.block_size);
  const bool plain = IsPlain(extras);
  TIERKV_ASSIGN_OR_RETURN(
      RequestState * r,
      BeginLookup(worker, w, request,
                  RequestStateBytes(tokens.size(), tokens.size() / bs),
                  /*keep_hits=*/plain));
  const int32_t first = num_computed_tokens / static_cast<int32_t>(bs);
  const auto max_blocks =
      static_cast<int32_t>((tokens.size() - 1 - num_computed_tokens) / bs);
  if (plain) {
    KeepUnchangedHits(w, r, UnchangedBlocks(*r, tokens), first, max_blocks);
  }
  if (r->keys.size() * bs != tokens.size() ||
      r->tokens.size() != tokens.size()) {
    r->tokens.assign(tokens.begin(), tokens.end());
  }  // Else every token was found the same.
  return EndLookup(w, r, plain, extras, first, max_blocks);
}

StatusOr<LookupResult> Coordinator::LookupAgain(
    WorkerId worker, RequestId request, uint32_t kept_tokens, uint64_t tag,
    std::span<const TokenId> appended, int32_t num_computed_tokens,
    const RequestExtras& extras) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
  const auto it = w->requests.find(request);
  if (it == w->requests.end() || tag == 0 || it->second.tokens_tag != tag) {
    return Status::Aborted(RequestName(request) +
                           " keeps no tokens of this lookup's base; send "
                           "all its tokens");
  }
  const RequestState& before = it->second;
  if (kept_tokens > before.tokens.size()) {
    return Status::InvalidArgument("a lookup keeping " +
                                   std::to_string(kept_tokens) + " tokens of " +
                                   RequestName(request) + ", which keeps " +
                                   std::to_string(before.tokens.size()));
  }
  const size_t num_tokens = kept_tokens + appended.size();
  TIERKV_RETURN_IF_ERROR(CheckLookup(num_tokens, num_computed_tokens, extras));
  const size_t bs = static_cast<size_t>(options_.layout.block_size);
  const bool plain = IsPlain(extras);
  // The kept tokens are the same by construction: no compare.
  const size_t same =
      before.plain_prefix ? std::min(before.keys.size(), kept_tokens / bs) : 0;
  TIERKV_ASSIGN_OR_RETURN(
      RequestState * r,
      BeginLookup(worker, w, request,
                  RequestStateBytes(num_tokens, num_tokens / bs),
                  /*keep_hits=*/plain));
  const int32_t first = num_computed_tokens / static_cast<int32_t>(bs);
  const auto max_blocks =
      static_cast<int32_t>((num_tokens - 1 - num_computed_tokens) / bs);
  if (plain) KeepUnchangedHits(w, r, same, first, max_blocks);
  r->tokens.resize(kept_tokens);
  r->tokens.insert(r->tokens.end(), appended.begin(), appended.end());
  return EndLookup(w, r, plain, extras, first, max_blocks);
}

LookupResult Coordinator::EndLookup(WorkerState* w, RequestState* r, bool plain,
                                    const RequestExtras& extras, int32_t first,
                                    int32_t max_blocks) {
  r->plain_prefix = plain;
  r->lora_id = extras.lora_id;
  r->tokens_tag = ++last_tokens_tag_;
  w->hasher.AppendPrefixKeys(r->tokens, options_.layout.block_size, extras,
                             &r->keys);
  return FindHits(w, r, first, max_blocks);
}

uint64_t Coordinator::TokensTag(WorkerId worker, RequestId request) const {
  const auto w = workers_.find(worker);
  if (w == workers_.end()) return 0;
  const auto r = w->second.requests.find(request);
  return r == w->second.requests.end() ? 0 : r->second.tokens_tag;
}

size_t Coordinator::UnchangedBlocks(const RequestState& r,
                                    std::span<const TokenId> tokens) const {
  if (!r.plain_prefix) return 0;
  const size_t bs = static_cast<size_t>(options_.layout.block_size);
  const size_t n = std::min(r.keys.size() * bs, tokens.size() / bs * bs);
  // memcmp first: the common case is no change at all, and it is several
  // times faster than an element-wise search.
  if (std::memcmp(r.tokens.data(), tokens.data(), n * sizeof(TokenId)) == 0) {
    return n / bs;
  }
  return static_cast<size_t>(std::mismatch(r.tokens.begin(),
                                           r.tokens.begin() + n, tokens.begin())
                                 .first -
                             r.tokens.begin()) /
         bs;
}

void Coordinator::KeepUnchangedHits(WorkerState* w, RequestState* r,
                                    size_t same, int32_t first,
                                    int32_t max_blocks) {
  r->keys.resize(same);
  size_t kept = 0;
  if (r->first_hit_block == first && same > static_cast<size_t>(first)) {
    const size_t limit =
        std::min({r->pending_hits.size(), same - static_cast<size_t>(first),
                  static_cast<size_t>(std::max(max_blocks, 0))});
    // A host hit stays cached while pinned; one whose bytes were found
    // changed meanwhile (corrupt) ends the run, as in FindHits. A disk hit
    // is looked up again.
    while (kept < limit && r->pending_hits[kept] != kOnLowerTier &&
           !slot_checks_[static_cast<size_t>(r->pending_hits[kept])].corrupt) {
      ++kept;
    }
  }
  std::vector<BlockId> dropped(r->pending_hits.begin() + kept,
                               r->pending_hits.end());
  std::erase(dropped, kOnLowerTier);
  ReleaseWorkerSlots(w, dropped);
  r->pending_hits.resize(kept);
}

StatusOr<LookupResult> Coordinator::LookupChunk(WorkerId worker,
                                                RequestId request,
                                                std::span<const TokenId> tokens,
                                                int64_t virtual_start,
                                                const BlockKey& variant) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
  if (tokens.empty() || tokens.size() > options_.max_request_tokens) {
    return Status::InvalidArgument("chunk lookup of " +
                                   std::to_string(tokens.size()) +
                                   " tokens; a chunk has 1.." +
                                   std::to_string(options_.max_request_tokens));
  }
  if (virtual_start < 0 || virtual_start >= kMaxRopePosition) {
    return Status::InvalidArgument("chunk lookup at virtual start " +
                                   std::to_string(virtual_start) +
                                   "; a chunk's virtual start is 0.." +
                                   std::to_string(kMaxRopePosition - 1));
  }
  const size_t bs = static_cast<size_t>(options_.layout.block_size);
  TIERKV_ASSIGN_OR_RETURN(
      RequestState * r,
      BeginLookup(
          worker, w, request,
          RequestStateBytes(tokens.size(), (tokens.size() + bs - 1) / bs)));
  r->tokens.assign(tokens.begin(), tokens.end());
  r->keys = w->hasher.ChunkKeys(r->tokens, options_.layout.block_size,
                                virtual_start, variant);
  return FindHits(w, r, 0, static_cast<int32_t>(r->keys.size()));
}

StatusOr<Coordinator::RequestState*> Coordinator::BeginLookup(
    WorkerId worker, WorkerState* w, RequestId request, size_t state_bytes,
    bool keep_hits) {
  auto it = w->requests.find(request);
  if (it != w->requests.end() && it->second.allocated) {
    return Status::FailedPrecondition(RequestName(request) +
                                      " is already allocated");
  }
  const size_t old_bytes = it == w->requests.end() ? 0 : it->second.state_bytes;
  if (it == w->requests.end() &&
      w->requests.size() >= options_.caps.max_requests_per_worker) {
    ++stats_.quota_request_refusals;
    return Status::ResourceExhausted(
        WorkerName(worker) + " has " + std::to_string(w->requests.size()) +
        " requests open, its cap (max_requests_per_worker); finish some "
        "first");
  }
  if (w->request_bytes - old_bytes + state_bytes >
      options_.caps.max_request_bytes_per_worker) {
    ++stats_.quota_request_bytes_refusals;
    return Status::ResourceExhausted(
        WorkerName(worker) + "'s open requests keep " +
        std::to_string(w->request_bytes) + " bytes of state; " +
        RequestName(request) + " needs " + std::to_string(state_bytes) +
        " more, past its cap of " +
        std::to_string(options_.caps.max_request_bytes_per_worker) +
        " (max_request_bytes_per_worker); finish some first");
  }
  if (it == w->requests.end()) it = w->requests.try_emplace(request).first;
  RequestState& r = it->second;
  r.tokens_tag = 0;  // Its tokens change: EndLookup names them anew.
  // A stale lookup's pins (seed 004 step 3) and state.
  if (keep_hits) {
    w->request_bytes -= r.state_bytes;
    request_bytes_ -= r.state_bytes;
  } else {
    ForgetRequest(w, &r);
    r.keys.clear();
    r.plain_prefix = false;
    r.lora_id.reset();  // A chunk lookup has none; Lookup sets its own.
  }
  r.state_bytes = state_bytes;
  w->request_bytes += state_bytes;
  request_bytes_ += state_bytes;
  return &r;
}

LookupResult Coordinator::FindHits(WorkerState* w, RequestState* r,
                                   int32_t first, int32_t max_blocks) {
  r->first_hit_block = first;
  std::vector<BlockId> host_hits;
  int32_t disk_hits = 0;
  LookupResult result;
  const int64_t room = PinRoom(*w);
  // Kept from the previous lookup, pinned and counted already: full
  // blocks of a prefix lookup.
  const auto kept = static_cast<int32_t>(r->pending_hits.size());
  result.hit_tokens = kept * options_.layout.block_size;
  for (int32_t b = first + kept; b < first + max_blocks; ++b) {
    // Dropped by an operator, though its spill has not finished.
    if (!discarded_spills_.empty() && discarded_spills_.contains(r->keys[b])) {
      break;
    }
    const std::span<const TokenId> tokens = BlockTokens(*r, b);
    std::optional<BlockId> slot = FindHostBlock(r->keys[b], tokens);
    if (slot.has_value() && slot_checks_[static_cast<size_t>(*slot)].corrupt) {
      break;  // Its bytes changed; it goes when its pins do.
    }
    if (slot.has_value()) {
      if (static_cast<int64_t>(host_hits.size()) >= room) {
        ++stats_.quota_pin_refusals;  // The worker's share is pinned.
        break;
      }
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
  AddPins(w, static_cast<int64_t>(host_hits.size()));
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
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
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
  // A load is an event in flight until completed, even one cut to no
  // blocks (its promotions failed): without this cap, a worker that never
  // completes its loads grows them without bound.
  if (const size_t events = w->loads.size() + w->stores.size();
      used > 0 && events >= options_.caps.max_events_per_worker) {
    ++stats_.quota_event_refusals;
    return Status::ResourceExhausted(
        WorkerName(worker) + " has " + std::to_string(events) +
        " transfer events in flight, its cap (max_events_per_worker): "
        "complete some before a load; nothing was changed");
  }
  // Hits the engine does not take are released now, tail first.
  std::vector<BlockId> unused(r.pending_hits.begin() + used,
                              r.pending_hits.end());
  std::erase(unused, kOnLowerTier);
  ReleaseWorkerSlots(w, unused);
  r.pending_hits.resize(used);
  bool pin_capped = false;

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
      if (PinRoom(*w) == 0) {
        pin_capped = true;
        ++stats_.quota_pin_refusals;
      }
      const std::optional<BlockId> slot =
          pin_capped ? std::nullopt : NewWorkerSlot(w);
      if (!slot.has_value()) {
        load.host_blocks[i] = 0;
        in_flight.slots[i] = LoadSlot::kReleased;
        ++stats_.promotion_failures;
        continue;
      }
      load.host_blocks[i] = *slot;
      in_flight.slots[i] = LoadSlot::kPromoting;
      const std::span<const TokenId> tokens =
          BlockTokens(r, r.first_hit_block + i);
      promotions.push_back(LowerOp{.spill = false,
                                   .slot = *slot,
                                   .key = r.keys[r.first_hit_block + i],
                                   .tokens = {tokens.begin(), tokens.end()},
                                   .parent = ParentOf(r, r.first_hit_block + i),
                                   .lora_id = r.lora_id,
                                   .worker = worker,
                                   .load = load.ref.id,
                                   .index = static_cast<size_t>(i)});
    }
    in_flight.promoting = static_cast<int32_t>(promotions.size());
    if (in_flight.promoting == 0) FinishPromotions(w, &in_flight);
    in_flight.pending = in_flight.promoting > 0;
    result.load = in_flight.event;
    result.load_pending = in_flight.pending;
    const uint64_t id = load.ref.id;
    w->loads.emplace(id, std::move(in_flight));
    ++stats_.events_in_flight;
    for (LowerOp& op : promotions) StartLowerOp(std::move(op));
  }
  r.allocated = true;
  if (pin_capped || PinRoom(*w) == 0) {
    result.store_status = PinCapStatus(worker, *w);
  } else if (host_pool_.num_free_blocks() == 0) {
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
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
  auto it = w->requests.find(request);
  if (it == w->requests.end() || !it->second.allocated) {
    return Status::FailedPrecondition(RequestName(request) +
                                      " is not allocated");
  }
  RequestState& r = it->second;
  TIERKV_RETURN_IF_ERROR(CheckDistinctDeviceBlocks(*w, device_blocks));
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
  store.lora_id = r.lora_id;
  const bool event_room =
      w->loads.size() + w->stores.size() < options_.caps.max_events_per_worker;
  int64_t pin_room = PinRoom(*w);
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
    if (!event_room) {
      ++result.skipped_blocks;
      ++stats_.quota_event_refusals;
      continue;
    }
    if (pin_room == 0) {
      ++result.skipped_blocks;
      ++stats_.quota_pin_refusals;
      continue;
    }
    const std::optional<BlockId> slot = NewWorkerSlot(w);
    if (!slot.has_value()) {
      ++result.skipped_blocks;
      continue;
    }
    --pin_room;
    keys_being_stored_.insert(key);
    store.event.device_blocks.push_back(device_blocks[b]);
    store.event.host_blocks.push_back(*slot);
    store.keys.push_back(key);
    store.tokens.emplace_back(tokens.begin(), tokens.end());
    store.parents.push_back(ParentOf(r, b));
  }
  r.next_store_block = std::max(r.next_store_block, full);
  stats_.store_skipped += result.skipped_blocks;
  if (!event_room) {
    result.store_status = Status::ResourceExhausted(
        WorkerName(worker) + " has " +
        std::to_string(w->loads.size() + w->stores.size()) +
        " transfer events in flight, its cap (max_events_per_worker); it "
        "stores more once some complete");
  } else if (result.skipped_blocks > 0 && pin_room == 0) {
    result.store_status = PinCapStatus(worker, *w);
  }
  if (!store.keys.empty()) {
    store.event.ref.id = w->next_store_id++;
    result.stores.push_back(store.event);
    w->stores.emplace(store.event.ref.id, std::move(store));
    ++stats_.events_in_flight;
  }
  MaybeSpill();
  return result;
}

bool Coordinator::LostBelow(BlockId slot) {
  const BlockPool::Block& b = host_pool_.block(slot);
  // A lower tier's copy is now the closest one, renewed there in the same
  // step.
  return options_.lower != nullptr &&
         !options_.lower->ContainsThenRenew(b.key, HostSlotTokens(slot));
}

bool Coordinator::TakeFreeSlot(std::vector<BlockId>* slot) {
  const std::optional<BlockId> front = host_pool_.NextFreeBlock();
  if (!front.has_value()) return false;
  const BlockPool::Block& b = host_pool_.block(*front);
  const std::optional<BlockKey> evicted =
      b.has_key() ? std::optional<BlockKey>(b.key) : std::nullopt;
  // Checked before the pool drops the key and its tokens.
  const bool lost = evicted.has_value() && LostBelow(*front);
  if (!host_pool_.GetNewBlocks(1, slot).ok()) return false;
  if (lost) ++stats_.evicted_unspilled;
  if (evicted.has_value()) TraceBlock("evicted", *evicted, slot->back());
  return true;
}

void Coordinator::FinishStore(WorkerState* w, InFlight* store, bool ok,
                              std::span<const SlotChecksum> checksums) {
  const std::vector<BlockId>& slots = store->event.host_blocks;
  for (size_t i = 0; i < slots.size(); ++i) {
    keys_being_stored_.erase(store->keys[i]);
    if (!ok) continue;
    // Cannot fail: the slot is pinned and unkeyed, with 1..block_size tokens.
    if (KeyHostSlot(slots[i], store->keys[i], store->tokens[i],
                    store->parents[i], store->lora_id)
            .ok()) {
      ++stats_.stores_completed;
      TraceBlock("stored", store->keys[i], slots[i]);
      if (options_.lower != nullptr && options_.write_behind_spills > 0) {
        write_behind_.emplace_back(slots[i], store->keys[i]);
      }
    }
    if (!options_.slot_checksum) continue;
    SlotCheck& check = slot_checks_[static_cast<size_t>(slots[i])];
    check.has_checksum = true;
    const auto given =
        std::ranges::lower_bound(checksums, slots[i], {}, &SlotChecksum::slot);
    check.checksum = given != checksums.end() && given->slot == slots[i]
                         ? given->checksum
                         : options_.slot_checksum(slots[i]);
  }
  if (!ok) stats_.stores_failed += slots.size();
  // Copies started while the store still pins its slots leave them at the
  // free queue's back, where a finished store puts them.
  StartWriteBehind();
  ReleaseWorkerSlots(w, slots);
  if (w->lease.has_value() &&
      chunk_leases_.at(*w->lease).store == store->event.ref.id) {
    EndLease(w);  // The published chunk is keyed now (or failed).
  }
}

std::vector<BlockId> Coordinator::CompletedStoreSlots(
    WorkerId worker, std::span<const CompletedEvent> events) const {
  std::vector<BlockId> out;
  if (!options_.slot_checksum) return out;
  auto w = workers_.find(worker);
  if (w == workers_.end()) return out;
  // A rank's completions complete its scheduler's events.
  const int32_t rank = w->second.registration.rank;
  const bool is_rank = w->second.registration.scheduler != 0;
  if (is_rank) w = workers_.find(w->second.registration.scheduler);
  if (w == workers_.end()) return out;
  for (const CompletedEvent& done : events) {
    if (done.ref.kind != EventKind::kStore || !done.ok) continue;
    const auto it = w->second.stores.find(done.ref.id);
    if (it == w->second.stores.end()) continue;
    if (is_rank && !RankCompletesOk(w->second, it->second, rank, done.ok)) {
      continue;
    }
    const std::vector<BlockId>& slots = it->second.event.host_blocks;
    out.insert(out.end(), slots.begin(), slots.end());
  }
  return out;
}

Status Coordinator::Complete(WorkerId worker,
                             std::span<const CompletedEvent> events,
                             std::span<const SlotChecksum> checksums) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindWorker(worker));
  std::vector<SlotChecksum> sorted(checksums.begin(), checksums.end());
  std::ranges::sort(sorted, {}, &SlotChecksum::slot);
  if (const WorkerId scheduler = w->registration.scheduler; scheduler != 0) {
    const int32_t rank = w->registration.rank;
    const auto s = workers_.find(scheduler);
    if (s == workers_.end()) {
      return Status::NotFound("the scheduler of " + WorkerName(worker) + ", " +
                              WorkerName(scheduler) + ", is gone");
    }
    TIERKV_RETURN_IF_ERROR(CheckCompletions(scheduler, s->second, events));
    for (const CompletedEvent& done : events) {
      const auto& in_flight = done.ref.kind == EventKind::kLoad
                                  ? s->second.loads
                                  : s->second.stores;
      if (in_flight.at(done.ref.id).ranks_done & (uint64_t{1} << rank)) {
        return Status::InvalidArgument("rank " + std::to_string(rank) +
                                       " completed " + EventName(done.ref) +
                                       " already");
      }
    }
    MarkRanksDone(scheduler, rank, events, /*dropped_rank=*/false, sorted);
    MaybeSpill();
    return Status::Ok();
  }
  if (w->registration.ranks > 0) {
    return Status::FailedPrecondition(WorkerName(worker) +
                                      " is a scheduler: its " +
                                      std::to_string(w->registration.ranks) +
                                      " rank workers complete its events");
  }
  TIERKV_RETURN_IF_ERROR(CheckCompletions(worker, *w, events));
  ApplyCompletions(w, events, sorted);
  MaybeSpill();
  return Status::Ok();
}

Status Coordinator::CheckCompletions(
    WorkerId worker, const WorkerState& w,
    std::span<const CompletedEvent> events) const {
  for (size_t i = 0; i < events.size(); ++i) {
    const EventRef& ref = events[i].ref;
    const auto& in_flight = ref.kind == EventKind::kLoad ? w.loads : w.stores;
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
  return Status::Ok();
}

void Coordinator::ApplyCompletions(WorkerState* w,
                                   std::span<const CompletedEvent> events,
                                   std::span<const SlotChecksum> sorted) {
  for (const CompletedEvent& done : events) {
    if (done.ref.kind == EventKind::kLoad) {
      auto it = w->loads.find(done.ref.id);
      RecordLatency(EventKind::kLoad, it->second.started);
      ReleaseLoad(w, &it->second);
      if (done.ok)
        stats_.loads_completed += it->second.event.host_blocks.size();
      w->loads.erase(it);
    } else {
      auto it = w->stores.find(done.ref.id);
      RecordLatency(EventKind::kStore, it->second.started);
      FinishStore(w, &it->second, done.ok, sorted);
      w->stores.erase(it);
    }
    --stats_.events_in_flight;
  }
}

Status Coordinator::Finish(WorkerId worker, RequestId request) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindRequestWorker(worker));
  bool ended_lease = false;
  if (w->lease.has_value()) {
    const ChunkLease& lease = chunk_leases_.at(*w->lease);
    if (lease.request == request && !lease.store.has_value()) {
      EndLease(w);  // Its holder gave up computing the chunk.
      ended_lease = true;
    }
  }
  auto it = w->requests.find(request);
  if (it == w->requests.end()) {
    if (ended_lease) return Status::Ok();
    return Status::NotFound(RequestName(request) + " is not known");
  }
  ForgetRequest(w, &it->second);
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
    ReleaseLoad(w, &load);
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
