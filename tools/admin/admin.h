// tierkv-admin: flags, the stats query and its table / JSON rendering. Kept
// out of main so tests can run the same code. Stateless; thread-safe.
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
  std::string verb;         // "stats".
  std::string socket_path;  // Resolved (default from --store).
  bool json = false;
};

StatusOr<AdminCommand> ParseAdminFlags(int argc, const char* const* argv);

// Runs the command; returns the process exit code (0 ok, 1 failed, 3 no
// tierkvd running).
int RunAdmin(const AdminCommand& command, std::ostream& out, std::ostream& err);

std::string FormatStatsTable(const CoordinatorStats& stats);
std::string FormatStatsJson(const CoordinatorStats& stats);

}  // namespace tierkv::admin

#endif  // TIERKV_TOOLS_ADMIN_ADMIN_H_
