// Split roles (Coordinator, "Split roles"): a scheduler's events are copied
// by its rank workers and complete once every rank has completed them.
#include <string>
#include <vector>

#include "src/coordinator.h"

namespace tierkv {

uint64_t Coordinator::AllRanks(int32_t ranks) {
  return ranks >= 64 ? ~uint64_t{0} : (uint64_t{1} << ranks) - 1;
}

Status Coordinator::CheckRoles(const WorkerRegistration& reg) const {
  if (reg.ranks < 0 || reg.ranks > kMaxRanks) {
    return Status::InvalidArgument("a scheduler has 1 to " +
                                   std::to_string(kMaxRanks) + " ranks, not " +
                                   std::to_string(reg.ranks));
  }
  if (reg.scheduler == 0) return Status::Ok();
  if (reg.ranks > 0) {
    return Status::InvalidArgument(
        "a worker is either a scheduler with ranks or a rank of one, not "
        "both");
  }
  const auto s = workers_.find(reg.scheduler);
  if (s == workers_.end() || s->second.dropped) {
    return Status::NotFound("scheduler worker " +
                            std::to_string(reg.scheduler) +
                            " is not registered (has it reconnected as a new "
                            "worker?)");
  }
  const WorkerRegistration& sched = s->second.registration;
  if (!reg.attachment_tag.empty() &&
      reg.attachment_tag != sched.attachment_tag) {
    return Status::NotFound(
        "scheduler worker " + std::to_string(reg.scheduler) +
        " is not the attachment this rank names (another tag): it attached "
        "anew, or tierkvd restarted and the id is another scheduler's");
  }
  if (sched.ranks == 0) {
    return Status::FailedPrecondition(
        "worker " + std::to_string(reg.scheduler) +
        " copies its own events: it is not a scheduler with ranks "
        "(ClientOptions::copies = kRanks)");
  }
  if (reg.rank < 0 || reg.rank >= sched.ranks) {
    return Status::InvalidArgument(
        "rank " + std::to_string(reg.rank) + " is outside scheduler worker " +
        std::to_string(reg.scheduler) + "'s ranks [0, " +
        std::to_string(sched.ranks) + ")");
  }
  if (reg.uid != sched.uid) {
    return Status::PermissionDenied(
        "a rank worker runs as its scheduler's user (uid " +
        std::to_string(sched.uid) + "), not uid " + std::to_string(reg.uid));
  }
  if (reg.tenant != sched.tenant) {
    return Status::FailedPrecondition(
        "a rank worker belongs to its scheduler's tenant");
  }
  if (s->second.lost_rank >= 0) {
    return Status::FailedPrecondition(
        "scheduler worker " + std::to_string(reg.scheduler) + " lost rank " +
        std::to_string(s->second.lost_rank) +
        ", which ended its attachment: no rank attaches to it any more; its "
        "engine attaches anew");
  }
  const WorkerId holder = s->second.rank_workers[static_cast<size_t>(reg.rank)];
  if (holder != 0) {
    return Status::AlreadyExists(
        "rank " + std::to_string(reg.rank) + " of scheduler worker " +
        std::to_string(reg.scheduler) + " is attached already (worker " +
        std::to_string(holder) +
        "); a rank that just exited is dropped once tierkvd sees its socket "
        "close: retry then");
  }
  return Status::Ok();
}

void Coordinator::RankAttached(WorkerState* scheduler, int32_t rank) {
  // A load not handed out yet reaches the new rank with the engine's
  // metadata: it is the new rank's to copy, not the dropped one's to fail.
  const uint64_t bit = uint64_t{1} << rank;
  for (auto& [id, load] : scheduler->loads) {
    if (!load.pending) continue;
    load.ranks_done &= ~bit;
    // Nothing completes a pending load: only dropped ranks marked it.
    load.rank_failed = load.ranks_done != 0;
  }
}

bool Coordinator::RankCompletesOk(const WorkerState& scheduler,
                                  const InFlight& store, int32_t rank,
                                  bool ok) {
  const uint64_t bit = uint64_t{1} << rank;
  return ok && !store.rank_failed && (store.ranks_done & bit) == 0 &&
         (store.ranks_done | bit) == AllRanks(scheduler.registration.ranks);
}

void Coordinator::MarkRanksDone(WorkerId scheduler, int32_t rank,
                                std::span<const CompletedEvent> events,
                                bool dropped_rank,
                                std::span<const SlotChecksum> checksums) {
  const auto it = workers_.find(scheduler);
  if (it == workers_.end()) return;
  WorkerState& s = it->second;
  const uint64_t all = AllRanks(s.registration.ranks);
  const uint64_t bit = uint64_t{1} << rank;
  std::vector<CompletedEvent> done;
  auto mark = [&](InFlight& event, bool ok) {
    if ((event.ranks_done & bit) != 0) return;
    event.ranks_done |= bit;
    event.rank_failed |= !ok;
    // A load still waiting for promotions (a dropped rank marks those too)
    // is applied when it is handed out: TakeReadyLoads.
    if (event.ranks_done == all && !event.pending) {
      done.push_back({event.event.ref, !event.rank_failed});
    }
  };
  if (dropped_rank) {
    for (auto* in_flight : {&s.loads, &s.stores}) {
      for (auto& [id, event] : *in_flight) mark(event, /*ok=*/false);
    }
  } else {
    for (const CompletedEvent& c : events) {
      auto& in_flight = c.ref.kind == EventKind::kLoad ? s.loads : s.stores;
      mark(in_flight.at(c.ref.id), c.ok);
    }
  }
  ApplyCompletions(&s, done, checksums);
  if (s.dropped && s.loads.empty() && s.stores.empty()) EraseWorker(it);
}

}  // namespace tierkv
