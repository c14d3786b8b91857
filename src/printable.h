// PrintableName: a name a peer chose (a worker's), made safe to print in a
// log line or on an operator's terminal: no newline can forge a log line and
// no escape sequence reaches the terminal.
// Thread-safety: a pure function.
#ifndef TIERKV_SRC_PRINTABLE_H_
#define TIERKV_SRC_PRINTABLE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace tierkv {

// The longest name kept; longer ones are cut and end in "...".
inline constexpr size_t kMaxPrintableName = 64;

// `name` with every byte outside printable ASCII (0x20..0x7e) written as
// \xNN, cut to kMaxPrintableName characters. Idempotent: a name escaped
// once (by tierkvd) shows the same when escaped again (by tierkv-admin).
std::string PrintableName(std::string_view name);

}  // namespace tierkv

#endif  // TIERKV_SRC_PRINTABLE_H_
