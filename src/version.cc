#include "tierkv/version.h"

#include <string_view>

namespace tierkv {

// TIERKV_VERSION is defined for this file alone, so a new version
// recompiles nothing else.
std::string_view Version() { return TIERKV_VERSION; }

bool WantsVersion(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version") return true;
  }
  return false;
}

}  // namespace tierkv
