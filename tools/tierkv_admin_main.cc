// tierkv-admin: inspect a running tierkvd. Parses flags and calls RunAdmin;
// everything else is in tools/admin/admin.h.
#include <iostream>

#include "tierkv/version.h"
#include "tools/admin/admin.h"

int main(int argc, char** argv) {
  if (tierkv::WantsVersion(argc, argv)) {
    std::cout << "tierkv-admin " << tierkv::Version() << "\n";
    return 0;
  }
  auto command = tierkv::admin::ParseAdminFlags(argc, argv);
  if (!command.ok()) {
    std::cerr << "tierkv-admin: " << command.status().message()
              << "\n(tierkv-admin --help lists the commands)\n";
    return 2;
  }
  if (command->show_help) {
    std::cout << command->help_text;
    return 0;
  }
  return tierkv::admin::RunAdmin(*command, std::cout, std::cerr, std::cin);
}
