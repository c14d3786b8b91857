// tierkvd: the tierkv coordinator daemon. Parses flags (and --config) and
// runs the daemon; everything else is in tools/daemon/daemon.h and
// ipc/server.h.
#include <iostream>

#include "tierkv/version.h"
#include "tools/daemon/daemon.h"
#include "tools/daemon/daemon_flags.h"
#include "tools/daemon/exit_status.h"

int main(int argc, char** argv) {
  if (tierkv::WantsVersion(argc, argv)) {
    std::cout << "tierkvd " << tierkv::Version() << "\n";
    return 0;
  }
  auto command = tierkv::daemon::ParseDaemonFlags(argc, argv);
  if (!command.ok()) {
    std::cerr << "tierkvd: " << command.status().message()
              << "\n(tierkvd --help lists the flags)\n";
    return tierkv::daemon::kExitUsage;
  }
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  return tierkv::daemon::RunDaemon(*command);
}
