// The orders tierkvd answers on its socket: a registration goes to Register
// (server_listener.cc); tierkv-admin's stats, events, held, route, clear
// and evict are answered here, and each clear and evict leaves a line in the
// log.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <string>

#include "ipc/server_impl.h"

namespace tierkv::ipc {
namespace {

// tierkv-admin's view of the events in flight: the oldest ones, with worker
// names cut short, so the reply stays small however many there are.
EventsReply ListEvents(std::vector<EventInfo> events) {
  constexpr size_t kMaxName = 64;
  EventsReply reply;
  reply.in_flight = events.size();
  if (events.size() > kMaxEventsListed) events.resize(kMaxEventsListed);
  for (EventInfo& e : events) {
    if (e.worker_name.size() > kMaxName) e.worker_name.resize(kMaxName);
  }
  reply.events = std::move(events);
  return reply;
}

}  // namespace

bool Server::Impl::Handle(Connection* conn, const Message& message) {
  spdlog::debug("pid {}: {} on the socket", conn->peer.pid,
                MessageTypeName(TypeOf(message)));
  if (const auto* reg = std::get_if<RegisterRequest>(&message)) {
    return Register(conn, *reg);
  }
  if (std::holds_alternative<StatsRequest>(message)) {
    // A member of --group sees every tier, and its own workers only.
    return Reply(
        conn, StatsReply{StatsSeenBy(conn->peer.uid, MayOperate(conn->peer))});
  }
  if (std::holds_alternative<EventsRequest>(message)) {
    // A member of --group sees its own workers' events only.
    const std::optional<uint32_t> of_uid =
        MayOperate(conn->peer) ? std::nullopt
                               : std::optional<uint32_t>(conn->peer.uid);
    std::vector<EventInfo> events;
    { events = store->Lock()->events(of_uid); }
    return Reply(conn, ListEvents(std::move(events)));
  }
  if (std::holds_alternative<HeldKeysRequest>(message)) {
    // Every tenant's keys (a user could test them for another tenant's
    // prompts), and a walk of every tier's index under the store's lock:
    // an operator's.
    if (!MayOperate(conn->peer)) {
      spdlog::warn("pid {} (uid {}): held refused: not an operator",
                   conn->peer.pid, conn->peer.uid);
      return Reply(conn, ErrorReply{Status::PermissionDenied(
                             "uid " + std::to_string(conn->peer.uid) +
                             " may read this store but not list every "
                             "tenant's keys (held): that takes tierkvd's "
                             "user, root or its --admin-group")});
    }
    HeldKeys held;
    { held = store->Lock()->HeldKeysNow(kMaxHeldKeysListed); }
    return Reply(conn, HeldKeysReply{std::move(held)});
  }
  if (const auto* route = std::get_if<RouteRequest>(&message)) {
    // Another user asks about its own tenants only, as its workers are
    // confined to them; an operator names any tenant as tierkvd records it.
    const std::string tenant =
        MayOperate(conn->peer) ? route->tenant
                               : EffectiveTenant(route->tenant, conn->peer.uid);
    StatusOr<RouteResult> result = Status::Internal("unreached");
    { result = store->Lock()->Route(tenant, route->tokens, route->extras); }
    if (!result.ok()) return Reply(conn, ErrorReply{result.status()});
    if (result->workers.size() > kMaxWorkersListed) {
      result->workers.resize(kMaxWorkersListed);
    }
    return Reply(conn, RouteReply{std::move(*result)});
  }
  if (std::holds_alternative<ClearRequest>(message) ||
      std::holds_alternative<EvictRequest>(message)) {
    if (!MayOperate(conn->peer)) {
      spdlog::warn("pid {} (uid {}): {} refused: not an operator",
                   conn->peer.pid, conn->peer.uid,
                   MessageTypeName(TypeOf(message)));
      return Reply(conn, ErrorReply{Status::PermissionDenied(
                             "uid " + std::to_string(conn->peer.uid) +
                             " may read this store but not clear or evict "
                             "it: that takes tierkvd's user, root or its "
                             "--admin-group")});
    }
  }
  if (const auto* clear = std::get_if<ClearRequest>(&message)) {
    return Reply(conn, Clear(conn->peer.pid, clear->tiers));
  }
  if (const auto* evict = std::get_if<EvictRequest>(&message)) {
    return Reply(conn, Evict(conn->peer.pid, evict->keys));
  }
  return Refuse(conn, Status::InvalidArgument(
                          std::string(MessageTypeName(TypeOf(message))) +
                          " is not accepted on the socket"));
}

Message Server::Impl::Clear(pid_t pid, TierSelection tiers) {
  StatusOr<ClearResult> result = Status::Internal("unreached");
  { result = store->Lock()->Clear(tiers); }
  if (!result.ok()) {
    spdlog::warn("pid {}: clear {} refused: {}", pid, TierSelectionName(tiers),
                 result.status().ToString());
    return ErrorReply{result.status()};
  }
  // The tiers asked for and present.
  std::string dropped;
  if (tiers != TierSelection::kDisk) {
    dropped = fmt::format("{} host blocks ({} kept: pinned)",
                          result->host_dropped, result->host_kept_pinned);
  }
  if (result->disk_cleared) {
    dropped += fmt::format("{}{} disk blocks", dropped.empty() ? "" : ", ",
                           result->disk_dropped);
  }
  if (result->remote_cleared) {
    dropped += fmt::format("{}{} remote keys", dropped.empty() ? "" : ", ",
                           result->remote_dropped);
  }
  spdlog::info("pid {}: clear {}: dropped {}", pid, TierSelectionName(tiers),
               dropped.empty() ? "nothing (no such tier)" : dropped);
  if (result->disk_undeleted) {
    spdlog::warn(
        "pid {}: clear {}: the disk tier takes no writes until restart: its "
        "{} blocks were forgotten, not deleted, and the next start serves "
        "them again",
        pid, TierSelectionName(tiers), result->disk_dropped);
  }
  return ClearReply{*result};
}

Message Server::Impl::Evict(pid_t pid, const std::vector<BlockKey>& keys) {
  std::vector<EvictedBlock> blocks;
  { blocks = store->Lock()->Evict(keys); }
  // Every key of a short list; a summary of any list.
  constexpr size_t kKeysLogged = 32;
  size_t host = 0, disk = 0, undeleted = 0, remote = 0, pinned = 0, absent = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const EvictedBlock& b = blocks[i];
    host += b.host_dropped;
    disk += b.disk_dropped;
    undeleted += b.disk_undeleted;
    remote += b.remote_dropped;
    pinned += b.host_pinned;
    absent += !b.host_dropped && !b.disk_dropped && !b.remote_dropped &&
              !b.host_pinned;
    if (i < kKeysLogged) {
      spdlog::info("pid {}: evict {}: {}", pid, b.key.ToHex(),
                   EvictedBlockSummary(b));
    }
  }
  spdlog::info(
      "pid {}: evict of {} keys: {} dropped from host, {} from disk, {} "
      "from remote, {} pinned on host (kept), {} not cached",
      pid, blocks.size(), host, disk, remote, pinned, absent);
  if (undeleted > 0) {
    spdlog::warn(
        "pid {}: evict: the disk tier takes no writes until restart: {} "
        "blocks were forgotten, not deleted, and the next start serves them "
        "again",
        pid, undeleted);
  }
  return EvictReply{std::move(blocks)};
}

}  // namespace tierkv::ipc
