// Coordinator's lower-tier side: promotions from the lower tier and the
// loads waiting for them, spills past the high watermark, the lower tier's
// results (PumpLowerTier), and the operator orders (Clear, Evict) that drop
// blocks from host and the lower tier, spills in flight included.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "src/coordinator.h"

namespace tierkv {

void Coordinator::FinishPromotions(WorkerState* w, InFlight* load) {
  TransferEvent& e = load->event;
  const size_t n = e.host_blocks.size();
  if (options_.verify_on_load) {
    // A block whose bytes changed since they were checksummed is a miss
    // from here on: the load is cut before it.
    for (size_t i = 0; i < n; ++i) {
      if (load->slots[i] != LoadSlot::kHeld || SlotIntact(e.host_blocks[i])) {
        continue;
      }
      load->slots[i] = LoadSlot::kReleased;
      const BlockId slot[] = {e.host_blocks[i]};
      DropCorruptSlot(slot[0]);
      ReleaseWorkerSlots(w, slot);
      break;
    }
  }
  size_t cut = 0;
  while (cut < n && load->slots[cut] == LoadSlot::kHeld) ++cut;
  // Blocks after a missing one are useless to the engine (it recomputes
  // from the first missing block): release them, tail first.
  std::vector<BlockId> unused;
  for (size_t i = cut; i < n; ++i) {
    if (load->slots[i] == LoadSlot::kHeld) unused.push_back(e.host_blocks[i]);
  }
  ReleaseWorkerSlots(w, unused);
  e.device_blocks.resize(cut);
  e.host_blocks.resize(cut);
  load->slots.resize(cut);
  e.failed_blocks = static_cast<int32_t>(n - cut);
}

void Coordinator::StartLowerOp(LowerOp op) {
  const uint64_t id = next_lower_op_++;
  op.started = Now();
  auto [it, inserted] = lower_ops_.emplace(id, std::move(op));
  const LowerOp& o = it->second;
  std::weak_ptr<LowerInbox> weak = inbox_;
  auto deliver = [weak, id](Status status, uint64_t checksum) {
    std::shared_ptr<LowerInbox> inbox = weak.lock();
    if (inbox == nullptr) return;  // The coordinator is gone.
    {
      MutexLock lock(&inbox->mu);
      inbox->results.push_back({id, std::move(status), checksum});
    }
    if (inbox->wakeup) inbox->wakeup();
  };
  if (o.spill) {
    ++spills_in_flight_;
    SlotCheck& check = slot_checks_[static_cast<size_t>(o.slot)];
    check.spilling = true;
    std::optional<uint64_t> checksum;
    if (check.has_checksum) checksum = check.checksum;
    options_.lower->Spill(
        o.key, HostSlotTokens(o.slot), o.slot, checksum,
        [deliver](Status status) { deliver(std::move(status), 0); });
  } else {
    ++promotions_in_flight_;
    options_.lower->Promote(o.key, o.tokens, o.slot,
                            [deliver](StatusOr<uint64_t> checksum) {
                              if (checksum.ok()) {
                                deliver(Status::Ok(), *checksum);
                              } else {
                                deliver(checksum.status(), 0);
                              }
                            });
  }
}

size_t Coordinator::PumpLowerTier() {
  if (options_.lower == nullptr) return 0;
  std::vector<LowerResult> results;
  {
    MutexLock lock(&inbox_->mu);
    results.swap(inbox_->results);
  }
  size_t ready = 0;
  for (const LowerResult& result : results) {
    const auto it = lower_ops_.find(result.op);
    if (it == lower_ops_.end()) continue;
    LowerOp op = std::move(it->second);
    lower_ops_.erase(it);
    const bool ok = result.status.ok();
    RecordLatency(op.spill ? &spill_latency_ : &promotion_latency_, op.started);
    if (op.spill) {
      FinishSpill(op, result.status);
      continue;
    }
    --promotions_in_flight_;
    if (ok) {
      // Cannot fail: the slot is pinned and unkeyed, with 1..block_size tokens.
      (void)KeyHostSlot(op.slot, op.key, op.tokens, op.parent, op.lora_id);
      // A hit on disk is a use: the policy keeps it as it keeps a host hit.
      (void)host_pool_.MarkReused(op.slot);
      ++stats_.promotions;
      TraceBlock("promoted", op.key, op.slot);
      if (options_.slot_checksum) {
        slot_checks_[static_cast<size_t>(op.slot)] = {
            .has_checksum = true, .checksum = result.checksum};
      }
    } else {
      ++stats_.promotion_failures;
    }
    auto w = workers_.find(op.worker);
    WorkerState* worker = w == workers_.end() ? nullptr : &w->second;
    InFlight* load = nullptr;
    if (worker != nullptr) {
      auto l = worker->loads.find(op.load);
      if (l != worker->loads.end()) load = &l->second;
    }
    if (load == nullptr || !ok) {
      const BlockId slot[] = {op.slot};
      // Unkeyed when it failed: never served.
      ReleaseWorkerSlots(worker, slot);
    }
    if (load == nullptr) continue;  // The worker or the load is gone.
    load->slots[op.index] = ok ? LoadSlot::kHeld : LoadSlot::kReleased;
    if (--load->promoting > 0) continue;
    FinishPromotions(worker, load);
    if (worker->ready_loads.empty() && options_.loads_ready) {
      options_.loads_ready(op.worker);
    }
    worker->ready_loads.push_back(op.load);
    ++ready;
  }
  MaybeSpill();
  return ready;
}

void Coordinator::FinishSpill(const LowerOp& op, const Status& status) {
  --spills_in_flight_;
  if (op.keep) --copies_in_flight_;
  slot_checks_[static_cast<size_t>(op.slot)].spilling = false;
  const bool ok = status.ok();
  // The lower tier took a write (a write-behind copy too): the next
  // failure rests briefly again.
  if (ok) spill_backoff_ = kFirstSpillBackoff;
  // Found changed while pinned: releasing the last pin drops it (and
  // forgets that it was corrupt).
  const bool found_corrupt = slot_checks_[static_cast<size_t>(op.slot)].corrupt;
  const BlockId slot[] = {op.slot};
  ReleaseSlots(slot);
  const BlockPool::Block& b = host_pool_.block(op.slot);
  const bool keyed = b.has_key() && b.key == op.key;
  // An operator cleared the lower tier after this spill may have written:
  // unless the tier holds the block still, the host copy is its last, and
  // stays, neither demoted nor first to go.
  if (ok && keyed && !op.discard && op.lower_cleared &&
      !options_.lower->Contains(op.key, HostSlotTokens(op.slot))) {
    return;
  }
  if (ok && keyed && op.keep && !op.discard) {
    ++stats_.spills;
    ++stats_.spills_kept;
    if (NextEvictionLoses()) (void)host_pool_.MoveToFront(op.slot);
    return;
  }
  if (!ok && status.code() == StatusCode::kDataLoss &&
      (found_corrupt || (keyed && !SlotIntact(op.slot)))) {
    // Its bytes changed since its store completed (a worker wrote into a
    // slot it did not own): the lower tier kept nothing, and host drops it
    // (counted once; not a failure of the lower tier).
    if (keyed) DropCorruptSlot(op.slot);
    if (op.discard) {
      discarded_spills_.erase(op.key);
      options_.lower->RemoveSpilled(op.key);
    }
    return;
  }
  // Aborted: an eviction removed the key from the lower tier before the
  // spill wrote it, so nothing was written. Not a failure, and the block
  // must not be demoted: no tier would hold it.
  const bool aborted = status.code() == StatusCode::kAborted;
  if (!ok && !aborted) {
    ++stats_.spill_failures;
    // A lower tier that keeps failing (full, stopped) is not asked again
    // for every block, nor at every pass.
    if (Now() >= spill_resume_) {
      spill_resume_ = Now() + spill_backoff_;
      spill_backoff_ = std::min(2 * spill_backoff_, kMaxSpillBackoff);
    }
  }
  if (op.discard) {
    discarded_spills_.erase(op.key);
    if (keyed) host_pool_.DropCachedBlock(op.slot);
    // The write has landed, been cancelled or failed by now, so this
    // removes whatever it left and cannot race it.
    options_.lower->RemoveSpilled(op.key);
  } else if (ok && keyed && host_pool_.DemoteCachedBlock(op.slot)) {
    ++stats_.spills;
    TraceBlock("spilled", op.key, op.slot);
  }
  // Otherwise it failed, was aborted, or a lookup hit it meanwhile: it
  // stays on host for now.
}

StatusOr<std::vector<TransferEvent>> Coordinator::TakeReadyLoads(
    WorkerId worker, const std::function<bool(const TransferEvent&)>& fits) {
  TIERKV_ASSIGN_OR_RETURN(WorkerState * w, FindIssuingWorker(worker));
  std::vector<TransferEvent> out;
  std::vector<CompletedEvent> unranked;
  while (!w->ready_loads.empty()) {
    InFlight& load = w->loads.at(w->ready_loads.front());
    // Every rank that was to copy it was dropped meanwhile: no one will.
    const bool no_rank = w->registration.ranks > 0 &&
                         load.ranks_done == AllRanks(w->registration.ranks);
    if (!no_rank && fits && !fits(load.event) && !out.empty()) break;
    w->ready_loads.pop_front();
    load.pending = false;
    if (no_rank) {
      unranked.push_back({load.event.ref, /*ok=*/false});
    } else {
      out.push_back(load.event);
    }
  }
  if (!w->ready_loads.empty() && options_.loads_ready) {
    options_.loads_ready(worker);  // The rest, in another reply.
  }
  ApplyCompletions(w, unranked, {});
  return out;
}

StatusOr<ClearResult> Coordinator::Clear(TierSelection tiers) {
  if (tiers == TierSelection::kDisk && options_.lower == nullptr) {
    return Status::FailedPrecondition("this store has no disk tier to clear");
  }
  ClearResult result;
  if (tiers != TierSelection::kDisk) {
    std::vector<BlockId> cached;
    host_pool_.VisitFreeQueue([&](BlockId id) {
      if (host_pool_.block(id).has_key()) cached.push_back(id);
      return true;
    });
    for (BlockId id : cached) {
      if (host_pool_.DropCachedBlock(id)) ++result.host_dropped;
    }
    for (auto& [id, op] : lower_ops_) {
      if (op.spill && !op.discard && host_pool_.block(op.slot).ref_cnt == 1) {
        DiscardSpill(&op);
        ++result.host_dropped;
      }
    }
    // What stays keyed is pinned (but for discarded spills, which keep
    // their key until they finish), and so is every slot being written.
    result.host_kept_pinned = static_cast<uint64_t>(
        UsedSlots() - static_cast<int64_t>(discarded_spills_.size()));
  }
  if (tiers != TierSelection::kHost && options_.lower != nullptr) {
    // RemoveAll leaves writes in flight alone. Those of spills discarded
    // above would land after the answer and be deleted only when they
    // finish: removing their keys now cancels them (or deletes what they
    // wrote) before the answer, so a crash in between cannot bring them
    // back. First, while a shared tier still knows which keys other
    // machines wrote (RemoveSpilled). Spills of blocks kept on host land
    // as usual; one whose write landed before RemoveAll leaves the block
    // on host (FinishSpill).
    for (auto& [id, op] : lower_ops_) {
      if (op.spill && op.discard) (void)options_.lower->RemoveSpilled(op.key);
      if (op.spill) op.lower_cleared = true;
    }
    const LowerRemoval removed = options_.lower->RemoveAll();
    result.disk_dropped = removed.disk;
    result.remote_dropped = removed.remote;
    result.disk_cleared = options_.lower->disk_stats().has_value();
    result.disk_undeleted = removed.disk > 0 && DiskWritesStopped();
    result.remote_cleared = options_.lower->remote_stats().has_value();
  }
  // The per-key removals went out already; a router may also take this as
  // the cue to drop what it keeps for the store. Only when it is true:
  // nothing kept on host and no spill in flight that could still land.
  if (tiers == TierSelection::kAll && options_.cache_events != nullptr &&
      host_pool_.num_cached_blocks() == 0 && lower_ops_.empty()) {
    options_.cache_events->AllBlocksCleared();
  }
  return result;
}

std::vector<EvictedBlock> Coordinator::Evict(std::span<const BlockKey> keys) {
  std::vector<EvictedBlock> out;
  out.reserve(keys.size());
  for (const BlockKey& key : keys) {
    EvictedBlock e{.key = key};
    // A store or a promotion of it keys a host slot when it completes: the
    // block stays on host whatever is dropped now, so nothing is, and the
    // answer says kept.
    const bool being_written =
        keys_being_stored_.contains(key) || PromotionOf(key);
    if (being_written) {
      e.host_pinned = true;
    } else if (std::optional<BlockId> slot = host_pool_.FindKeyedBlock(key)) {
      LowerOp* spill = OnlyPinIsSpill(*slot);
      if (spill != nullptr) DiscardSpill(spill);
      e.host_dropped = spill != nullptr || host_pool_.DropCachedBlock(*slot);
      e.host_pinned = !e.host_dropped;
    }
    if (options_.lower != nullptr) {
      const LowerRemoval removed = options_.lower->Remove(key);
      e.disk_dropped = removed.disk > 0;
      e.disk_undeleted = e.disk_dropped && DiskWritesStopped();
      e.remote_dropped = removed.remote > 0;
      // A spill of a block kept on host may have written what Remove just
      // deleted: once it lands, the host copy is the last, and stays
      // (FinishSpill), as after a Clear.
      for (auto& [id, op] : lower_ops_) {
        if (op.spill && op.key == key) op.lower_cleared = true;
      }
    }
    out.push_back(e);
  }
  return out;
}

bool Coordinator::DiskWritesStopped() const {
  const std::optional<DiskTierStats> disk =
      options_.lower == nullptr ? std::nullopt : options_.lower->disk_stats();
  return disk.has_value() && disk->writes_stopped != 0;
}

bool Coordinator::PromotionOf(const BlockKey& key) const {
  return std::ranges::any_of(lower_ops_, [&key](const auto& entry) {
    return !entry.second.spill && entry.second.key == key;
  });
}

Coordinator::LowerOp* Coordinator::OnlyPinIsSpill(BlockId slot) {
  if (host_pool_.block(slot).ref_cnt != 1) return nullptr;
  for (auto& [id, op] : lower_ops_) {
    if (op.spill && op.slot == slot) return &op;
  }
  return nullptr;
}

void Coordinator::DiscardSpill(LowerOp* spill) {
  spill->discard = true;
  discarded_spills_.insert(spill->key);
}

void Coordinator::MaybeSpill() {
  if (options_.lower == nullptr) return;
  StartWriteBehind();
  const int64_t usable = host_pool_.num_blocks() - 1;
  // Blocks being spilled leave host when their copy is done (write-behind
  // copies stay).
  const int64_t staying = UsedSlots() - (spills_in_flight_ - copies_in_flight_);
  if (staying <= static_cast<int64_t>(options_.spill_high * usable)) return;
  if (Now() < spill_resume_) return;
  const int64_t excess =
      staying - static_cast<int64_t>(options_.spill_low * usable);
  std::vector<BlockId> victims;
  host_pool_.VisitFreeQueue([&](BlockId id) {
    if (host_pool_.block(id).has_key()) victims.push_back(id);
    return static_cast<int64_t>(victims.size()) < excess;
  });
  SpillBlocks(victims);
}

bool Coordinator::NextEvictionLoses() const {
  const std::optional<BlockId> next = host_pool_.NextFreeBlock();
  if (!next.has_value()) return false;
  const BlockPool::Block& b = host_pool_.block(*next);
  return b.has_key() && !options_.lower->Contains(b.key, HostSlotTokens(*next));
}

void Coordinator::StartWriteBehind() {
  // Entries of slots reused since can pile up while copies lag: the oldest
  // go first, and their blocks are left to the watermark.
  const auto bound = static_cast<size_t>(host_pool_.num_blocks());
  while (write_behind_.size() > bound) write_behind_.pop_front();
  if (write_behind_.empty() || Now() < spill_resume_) return;
  while (copies_in_flight_ < options_.write_behind_spills &&
         !write_behind_.empty()) {
    const auto [slot, key] = write_behind_.front();
    write_behind_.pop_front();
    const BlockPool::Block& b = host_pool_.block(slot);
    // Reused or dropped since, already on its way down (a spill pins it; a
    // lookup's pin alone does not stop a copy), or found changed and
    // dropped once its pins go: never copied, the tier would keep the
    // changed bytes under the key.
    const SlotCheck& check = slot_checks_[static_cast<size_t>(slot)];
    if (!b.has_key() || !(b.key == key) || check.spilling || check.corrupt) {
      continue;
    }
    if (options_.lower->Covers(key, HostSlotTokens(slot))) continue;
    LowerOp op;
    op.spill = true;
    op.keep = true;
    op.slot = slot;
    op.key = key;
    const BlockId pin[] = {slot};
    host_pool_.Pin(pin);
    ++copies_in_flight_;
    StartLowerOp(std::move(op));
  }
}

int64_t Coordinator::SpillBlocks(std::span<const BlockId> victims) {
  int64_t started = 0;
  for (BlockId slot : victims) {
    const BlockPool::Block& b = host_pool_.block(slot);
    // Renewed there as it is found: the tier does not evict it before the
    // host has let it go.
    if (options_.lower->CoversThenRenew(b.key, HostSlotTokens(slot))) {
      const BlockKey key = b.key;  // Demoting drops it.
      if (host_pool_.DemoteCachedBlock(slot)) {
        ++stats_.spill_drops;
        TraceBlock("dropped (on disk already)", key, slot);
      }
      continue;
    }
    const BlockId pin[] = {slot};
    host_pool_.Pin(pin);
    LowerOp op;
    op.spill = true;
    op.slot = slot;
    op.key = b.key;
    StartLowerOp(std::move(op));
    ++started;
  }
  return started;
}

int64_t Coordinator::SpillAll() {
  if (options_.lower == nullptr) return 0;
  std::vector<BlockId> victims;
  host_pool_.VisitFreeQueue([&](BlockId id) {
    if (host_pool_.block(id).has_key()) victims.push_back(id);
    return true;
  });
  return SpillBlocks(victims);
}

int64_t Coordinator::HostOnlyBlocks() const {
  int64_t n = 0;
  for (BlockId id = 1; id < host_pool_.num_blocks(); ++id) {
    const BlockPool::Block& b = host_pool_.block(id);
    if (b.has_key() && (options_.lower == nullptr ||
                        !options_.lower->Contains(b.key, HostSlotTokens(id)))) {
      ++n;
    }
  }
  return n;
}

}  // namespace tierkv
