#include "src/printable.h"

#include <cstdio>

namespace tierkv {

std::string PrintableName(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (const char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out.push_back(c);
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    }
    if (out.size() > kMaxPrintableName) {
      out.resize(kMaxPrintableName - 3);
      out += "...";
      break;
    }
  }
  return out;
}

}  // namespace tierkv
