// tierkvd: the tierkv coordinator daemon. Parses flags, starts the Server,
// and waits for SIGINT or SIGTERM; everything else is in ipc/server.h.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "ipc/server.h"
#include "tools/daemon/daemon_flags.h"

int main(int argc, char** argv) {
  auto command = tierkv::daemon::ParseDaemonFlags(argc, argv);
  if (!command.ok()) {
    std::cerr << "tierkvd: " << command.status().message()
              << "\n(tierkvd --help lists the flags)\n";
    return 2;
  }
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(command->log_level));
  // Block the stop signals before any thread starts, then wait for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto server = tierkv::ipc::Server::Start(command->server);
  if (!server.ok()) {
    spdlog::error("cannot start: {}", server.status().ToString());
    return 1;
  }
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  spdlog::info("received {}, stopping", strsignal(signal_number));
  (*server)->Stop();
  return 0;
}
