// tierkv-admin: flags, the stats query and its renderings (table, JSON,
// workers, Prometheus metrics, a live view). Kept out of main so tests can
// run the same code. Stateless; thread-safe.
#ifndef TIERKV_TOOLS_ADMIN_ADMIN_H_
#define TIERKV_TOOLS_ADMIN_ADMIN_H_

#include <ostream>
#include <string>

#include "src/coordinator.h"
#include "src/status.h"

namespace tierkv::admin {

struct AdminCommand {
  bool show_help = false;
  std::string help_text;
  std::string verb;         // "stats", "workers", "metrics" or "watch".
  std::string socket_path;  // Resolved (default from --store).
  bool json = false;
  double interval_seconds = 1.0;  // watch: between refreshes.
  int64_t count = 0;              // watch: refreshes, 0 for no end.
};

StatusOr<AdminCommand> ParseAdminFlags(int argc, const char* const* argv);

// Runs the command; returns the process exit code (0 ok, 1 failed, 3 no
// tierkvd running).
int RunAdmin(const AdminCommand& command, std::ostream& out, std::ostream& err);

std::string FormatStatsTable(const CoordinatorStats& stats);
std::string FormatStatsJson(const CoordinatorStats& stats);
std::string FormatWorkers(const CoordinatorStats& stats);
// Prometheus text exposition format, version 0.0.4.
std::string FormatMetrics(const CoordinatorStats& stats);

}  // namespace tierkv::admin

#endif  // TIERKV_TOOLS_ADMIN_ADMIN_H_
