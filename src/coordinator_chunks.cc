// Coordinator: chunks in one call each, and their compute leases (see
// "Chunks in one call" in coordinator.h).
#include <vector>

#include "src/coordinator.h"

namespace tierkv {

const BlockKey& Coordinator::ChunkKeyOf(const WorkerState& w,
                                        RequestId request) const {
  // LookupChunk keyed it: a chunk has at least one token, so one key.
  return w.requests.at(request).keys.back();
}

void Coordinator::EndLease(WorkerState* w) {
  if (!w->lease.has_value()) return;
  chunk_leases_.erase(*w->lease);
  w->lease.reset();
  if (options_.chunk_lease_released) options_.chunk_lease_released();
}

StatusOr<Coordinator::ChunkFetch> Coordinator::FetchChunk(
    WorkerId worker, RequestId request, std::span<const TokenId> tokens,
    int64_t virtual_start, const BlockKey& variant) {
  TIERKV_ASSIGN_OR_RETURN(
      LookupResult hit,
      LookupChunk(worker, request, tokens, virtual_start, variant));
  WorkerState* w = &workers_.at(worker);
  const BlockKey key = ChunkKeyOf(*w, request);
  if (w->lease.has_value() && *w->lease != key) EndLease(w);
  ChunkFetch out;
  out.result.lookup = hit;
  const auto n = static_cast<int32_t>(tokens.size());
  if (hit.hit_tokens == n && hit.disk_hit_tokens > 0) {
    return out;  // Allocate starts the promotions.
  }
  if (hit.hit_tokens == n) {
    // The load's device blocks are the worker's business: it fills them in.
    const std::vector<BlockId> unnamed(w->requests.at(request).keys.size(), 0);
    StatusOr<AllocateResult> load = Allocate(worker, request, unnamed, n);
    (void)Finish(worker, request);
    // Found whole: this worker computes nothing, loaded or not.
    if (w->lease == key) EndLease(w);
    TIERKV_RETURN_IF_ERROR(load.status());
    if (load->load.has_value()) {
      load->load->device_blocks.clear();
      out.result.load = std::move(load->load);
    }
    return out;
  }
  (void)Finish(worker, request);  // Drops the pins of a partial hit.
  auto [it, taken] =
      chunk_leases_.try_emplace(key, ChunkLease{worker, request, {}});
  if (!taken && it->second.worker != worker) {
    out.busy = true;
    return out;
  }
  // This worker's own lease while its publish is being stored: a miss
  // without the lease (its store ends it); waiting here would only hold
  // up the worker that is to complete that store.
  if (!taken && it->second.store) return out;
  it->second.request = request;
  w->lease = key;
  out.result.lease = true;
  return out;
}

StatusOr<CommitResult> Coordinator::PublishChunk(
    WorkerId worker, RequestId request, std::span<const TokenId> tokens,
    std::span<const BlockId> device_blocks, int64_t virtual_start,
    const BlockKey& variant) {
  TIERKV_RETURN_IF_ERROR(
      LookupChunk(worker, request, tokens, virtual_start, variant).status());
  WorkerState* w = &workers_.at(worker);
  const BlockKey key = ChunkKeyOf(*w, request);
  if (w->lease.has_value() && *w->lease != key) EndLease(w);
  const Status allocated = Allocate(worker, request, device_blocks, 0).status();
  StatusOr<CommitResult> commit =
      allocated.ok()
          ? Commit(worker, request, static_cast<int32_t>(tokens.size()),
                   device_blocks)
          : StatusOr<CommitResult>(allocated);
  if (w->lease == key) {
    ChunkLease& lease = chunk_leases_.at(key);
    if (commit.ok() && !commit->stores.empty()) {
      lease.store = commit->stores.front().ref.id;
    } else if (!lease.store) {
      EndLease(w);  // Nothing to wait for: stored already, or refused.
    }  // Else an earlier publish of it is still being stored: it ends then.
  }
  // After the lease turned STORING: finishing its fetch's request (a
  // worker may reuse the id) does not end it then.
  (void)Finish(worker, request);
  return commit;
}

}  // namespace tierkv
