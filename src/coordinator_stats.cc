// Coordinator's introspection: the statistics (stats()), the transfer events
// in flight (events()) and the latency of finished events.
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "src/coordinator.h"
#include "tierkv/version.h"

namespace tierkv {
namespace {

uint64_t MicrosecondsSince(std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point now) {
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(now - start);
  return us.count() > 0 ? static_cast<uint64_t>(us.count()) : 0;
}

}  // namespace

std::string Coordinator::RoleOf(const WorkerState& w) {
  const WorkerRegistration& r = w.registration;
  if (r.scheduler != 0) {
    return "rank " + std::to_string(r.rank) + " of worker " +
           std::to_string(r.scheduler);
  }
  if (r.ranks == 0) return "";
  return "scheduler of " + std::to_string(r.ranks) + " ranks" +
         (w.dropped ? " (gone; its ranks finish its events)" : "");
}

CoordinatorStats Coordinator::stats() const {
  CoordinatorStats out;
  out.host = stats_;
  const int64_t usable = host_pool_.num_blocks() - 1;
  out.host.slot_bytes = options_.layout.BlockBytes();
  out.host.capacity_slots = usable;
  out.host.free_slots = host_pool_.num_free_blocks();
  out.host.cached_slots = static_cast<int64_t>(host_pool_.num_cached_blocks());
  out.host.pinned_slots = usable - host_pool_.num_free_blocks();
  out.host.used_slots = UsedSlots();
  out.host.evictions = host_pool_.stats().evictions;
  out.host.spills_in_flight = static_cast<uint64_t>(spills_in_flight_);
  out.host.promotions_in_flight = static_cast<uint64_t>(promotions_in_flight_);
  out.host.request_state_bytes = request_bytes_;
  out.host.chunk_leases = chunk_leases_.size();
  if (options_.lower != nullptr) {
    out.disk = options_.lower->disk_stats();
    out.remote = options_.lower->remote_stats();
  }
  out.model = options_.model;
  out.key_fingerprint = StoreFingerprint(options_.layout, options_.model);
  out.block_size = static_cast<uint32_t>(options_.layout.block_size);
  out.version = std::string(Version());
  out.load_latency = load_latency_;
  out.store_latency = store_latency_;
  out.spill_latency = spill_latency_;
  out.promotion_latency = promotion_latency_;
  const auto now = Now();
  for (const auto& [id, w] : workers_) {
    for (const auto* in_flight : {&w.loads, &w.stores}) {
      for (const auto& [event_id, e] : *in_flight) {
        out.oldest_event_age_us = std::max(out.oldest_event_age_us,
                                           MicrosecondsSince(e.started, now));
      }
    }
    out.workers.push_back(
        WorkerStats{.id = id,
                    .pid = w.registration.pid,
                    .name = w.registration.name,
                    .requests = static_cast<uint32_t>(w.requests.size()),
                    .loads_in_flight = static_cast<uint32_t>(w.loads.size()),
                    .stores_in_flight = static_cast<uint32_t>(w.stores.size()),
                    .uid = w.registration.uid,
                    .pinned_slots = w.pinned_slots,
                    .request_state_bytes = w.request_bytes,
                    .role = RoleOf(w)});
  }
  return out;
}

StatusOr<CoordinatorStats> Coordinator::StatsSeenBy(WorkerId worker) const {
  const auto viewer = workers_.find(worker);
  if (viewer == workers_.end()) {
    return Status::NotFound("worker " + std::to_string(worker) +
                            " is not registered");
  }
  CoordinatorStats out = stats();
  if (!viewer->second.registration.operator_uid) {
    KeepWorkersOfUid(viewer->second.registration.uid, &out);
  }
  return out;
}

void KeepWorkersOfUid(uint32_t uid, CoordinatorStats* stats) {
  std::erase_if(stats->workers,
                [uid](const WorkerStats& w) { return w.uid != uid; });
}

void Coordinator::RecordLatency(EventKind kind,
                                std::chrono::steady_clock::time_point started) {
  RecordLatency(kind == EventKind::kLoad ? &load_latency_ : &store_latency_,
                started);
}

void Coordinator::RecordLatency(EventLatency* latency,
                                std::chrono::steady_clock::time_point started) {
  latency->Record(MicrosecondsSince(started, Now()));
}

std::vector<EventInfo> Coordinator::events(std::optional<uint32_t> uid) const {
  const auto now = Now();
  std::vector<std::pair<std::chrono::steady_clock::time_point, EventInfo>>
      found;
  for (const auto& [worker, w] : workers_) {
    if (uid.has_value() && w.registration.uid != *uid) continue;
    for (const auto* in_flight : {&w.loads, &w.stores}) {
      for (const auto& [id, e] : *in_flight) {
        EventState state = EventState::kCopying;
        if (e.promoting > 0) {
          state = EventState::kPromoting;
        } else if (e.pending) {
          state = EventState::kReady;
        }
        found.emplace_back(
            e.started, EventInfo{.worker = worker,
                                 .worker_name = w.registration.name,
                                 .ref = e.event.ref,
                                 .request = e.event.request,
                                 .blocks = static_cast<uint32_t>(
                                     e.event.host_blocks.size()),
                                 .state = state,
                                 .age_us = MicrosecondsSince(e.started, now)});
      }
    }
  }
  // Workers, then loads before stores, then ids come in order already: a
  // stable sort by start time leaves ties in that order.
  std::stable_sort(
      found.begin(), found.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<EventInfo> out;
  out.reserve(found.size());
  for (auto& [started, info] : found) out.push_back(std::move(info));
  return out;
}

StatusOr<RouteResult> Coordinator::Route(const std::string& tenant,
                                         std::span<const TokenId> tokens,
                                         const RequestExtras& extras) const {
  if (tokens.size() > options_.max_request_tokens) {
    return Status::InvalidArgument("a route of " +
                                   std::to_string(tokens.size()) +
                                   " tokens; a request has at most " +
                                   std::to_string(options_.max_request_tokens));
  }
  TIERKV_RETURN_IF_ERROR(CheckItems(tokens.size(), extras));
  const auto bs = static_cast<size_t>(options_.layout.block_size);
  std::vector<BlockKey> keys;
  KeyHasher(
      {.model_fingerprint = StoreFingerprint(options_.layout, options_.model),
       .tenant = tenant})
      .AppendPrefixKeys(tokens, options_.layout.block_size, extras, &keys);
  RouteResult route;
  route.prompt_tokens = static_cast<int32_t>(keys.size() * bs);
  // As FindHits walks a lookup's blocks, without pinning.
  for (size_t b = 0; b < keys.size(); ++b) {
    if (!discarded_spills_.empty() && discarded_spills_.contains(keys[b])) {
      break;
    }
    const std::span<const TokenId> block = tokens.subspan(b * bs, bs);
    const std::optional<BlockId> slot = FindHostBlock(keys[b], block);
    if (slot.has_value()) {
      if (slot_checks_[static_cast<size_t>(*slot)].corrupt) break;
    } else if (options_.lower != nullptr &&
               options_.lower->Contains(keys[b], block)) {
      route.lower_tokens += static_cast<int32_t>(bs);
    } else {
      break;
    }
    route.cached_tokens += static_cast<int32_t>(bs);
  }
  for (const auto& [id, w] : workers_) {
    if (w.registration.tenant != tenant) continue;
    route.workers.push_back(
        {.id = id, .name = w.registration.name, .pid = w.registration.pid});
  }
  return route;
}

StatusOr<RouteResult> Coordinator::Route(WorkerId worker,
                                         std::span<const TokenId> tokens,
                                         const RequestExtras& extras) const {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) {
    return Status::NotFound("worker " + std::to_string(worker) +
                            " is not registered");
  }
  return Route(it->second.registration.tenant, tokens, extras);
}

HeldKeys Coordinator::HeldKeysNow(size_t max_per_tier) const {
  HeldKeys held;
  for (BlockId id = 1; id < host_pool_.num_blocks(); ++id) {
    const BlockPool::Block& b = host_pool_.block(id);
    if (!b.has_key()) continue;
    ++held.host_total;
    if (held.host.size() < max_per_tier) held.host.push_back(b.key);
  }
  if (options_.lower != nullptr) {
    held.disk = options_.lower->KeysOn(CacheMedium::kStorage, max_per_tier,
                                       &held.disk_total);
    held.remote = options_.lower->KeysOn(CacheMedium::kRemote, max_per_tier,
                                         &held.remote_total);
  }
  return held;
}

}  // namespace tierkv
