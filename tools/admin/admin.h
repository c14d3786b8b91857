// tierkv-admin: flags, the stats and events queries and their renderings
// (table, JSON, workers, Prometheus metrics, a live view, events by age), and
// the operator orders clear and evict. Kept out of main so tests can run the
// same code. Stateless; thread-safe.
#ifndef TIERKV_TOOLS_ADMIN_ADMIN_H_
#define TIERKV_TOOLS_ADMIN_ADMIN_H_

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "src/coordinator.h"
#include "tierkv/status.h"

namespace tierkv::admin {

struct AdminCommand {
  bool show_help = false;
  std::string help_text;
  // "stats", "workers", "metrics", "watch", "events", "clear", "evict",
  // "keys", "held" or "route".
  std::string verb;
  std::string socket_path;    // Resolved (default from --store).
  bool socket_given = false;  // --socket named it (not derived from --store).
  std::string stats_page;     // StatsPageName(--store).
  // stats, workers, metrics, watch: "auto", "page" or "socket" (--source).
  std::string source = "auto";
  bool json = false;
  bool all = false;  // stats: every field of every table, with its help.
  double interval_seconds = 1.0;              // watch: between refreshes.
  int64_t count = 0;                          // watch: refreshes, 0 for no end.
  TierSelection tiers = TierSelection::kAll;  // clear: --tier.
  std::vector<BlockKey> keys;                 // evict: the keys named.
  // keys: the prompt's token ids (none given: read from standard input),
  // its tenant as tierkvd records it, and its extra keys.
  std::vector<TokenId> tokens;
  bool tokens_from_stdin = false;
  std::string tenant;
  RequestExtras extras;
  // route: the tierkvd asked, as NAME=SOCKET (--node); none: the one at
  // socket_path, named "local".
  std::vector<std::pair<std::string, std::string>> nodes;
};

// route: one tierkvd's answer, or why it has none.
struct NodeRoute {
  std::string node;
  std::string socket;
  StatusOr<RouteResult> route = Status::Unavailable("not asked");
};

StatusOr<AdminCommand> ParseAdminFlags(int argc, const char* const* argv);

// Runs the command; returns the process exit code (0 ok, 1 failed, 3 no
// tierkvd running). keys reads token ids from `in` when none were given. stats,
// workers, metrics and watch read tierkvd's stats page when it is fresh and
// belongs to the tierkvd at socket_path (--source auto), so reading them costs
// tierkvd nothing; else they ask the socket.
int RunAdmin(const AdminCommand& command, std::ostream& out, std::ostream& err,
             std::istream& in);

// "1 2 3", "1,2,3", "[1, 2, 3]": token ids. InvalidArgument naming the first
// word that is not one.
StatusOr<std::vector<TokenId>> ParseTokenIds(const std::string& text);
// `keys`: the store's key of each full block of `tokens` (what a worker of
// `tenant` stores them under, and evict takes), one per line, with the
// block's token range.
std::string FormatKeys(const CoordinatorStats& stats, const std::string& tenant,
                       const RequestExtras& extras,
                       const std::vector<TokenId>& tokens);

std::string FormatStatsTable(const CoordinatorStats& stats);
// `watch`: how fast the counters grew between two snapshots `seconds`
// apart, per second.
std::string FormatRates(const CoordinatorStats& before,
                        const CoordinatorStats& after, double seconds);
std::string FormatStatsJson(const CoordinatorStats& stats);
// Every field of the stats tables (tierkv/stats.h): name, value, help.
std::string FormatStatsFields(const CoordinatorStats& stats);
std::string FormatWorkers(const CoordinatorStats& stats);
// Prometheus text exposition format, version 0.0.4.
std::string FormatMetrics(const CoordinatorStats& stats);
// The labels every sample of FormatMetrics carries: store="...",model="...".
// For samples tierkvd adds beside them (its KV cache events' counters).
std::string MetricBaseLabels(const CoordinatorStats& stats);
// `events`: the oldest of the `in_flight` events in flight, oldest first.
std::string FormatEventsTable(const std::vector<EventInfo>& events,
                              uint64_t in_flight);
std::string FormatEventsJson(const std::vector<EventInfo>& events,
                             uint64_t in_flight);
// `clear` and `evict`: what tierkvd dropped.
std::string FormatClear(TierSelection tiers, const ClearResult& result);
std::string FormatClearJson(TierSelection tiers, const ClearResult& result);
std::string FormatEvict(const std::vector<EvictedBlock>& blocks);
std::string FormatEvictJson(const std::vector<EvictedBlock>& blocks);
// route: a row per node (tokens cached, on host, on the lower tier only,
// the tenant's workers there), then the node with the longest cached
// prefix; the first such node when several tie, none when nothing is
// cached anywhere.
std::string FormatRoute(const std::vector<NodeRoute>& nodes);
std::string FormatRouteJson(const std::vector<NodeRoute>& nodes);
// held: "CPU <key>", "DISK <key>" and "REMOTE <key>" lines, then a '#' line per
// tier whose list was cut.
std::string FormatHeldKeys(const HeldKeys& keys);
std::string FormatHeldKeysJson(const HeldKeys& keys);
// "850 us", "12.5 ms", "3.2 s", "4m05s", "2h07m".
std::string FormatAge(uint64_t age_us);
// "512 B", "32.0 KiB", "15.6 MiB": powers of 1024, one decimal.
std::string HumanBytes(double bytes);

}  // namespace tierkv::admin

#endif  // TIERKV_TOOLS_ADMIN_ADMIN_H_
