// The tierkv release this build is (CMake's project version), for
// --version, tierkvd's stats and the tierkv_build_info metric.
// Thread-safe: a constant.
#ifndef TIERKV_INCLUDE_TIERKV_VERSION_H_
#define TIERKV_INCLUDE_TIERKV_VERSION_H_

#include <string_view>

namespace tierkv {

// "MAJOR.MINOR.PATCH", e.g. "0.1.0".
std::string_view Version();

// Whether a command line asks for --version (its mains print
// "<program> <Version()>" and exit 0 before parsing anything else).
bool WantsVersion(int argc, char** argv);

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_VERSION_H_
