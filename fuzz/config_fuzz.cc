// tierkvd's configuration (tools/daemon/daemon_flags.h) over arbitrary
// text: the input is the file given with --config (written to a temporary
// file), parsed once alone and once under a command line that sets the
// required layout flags, so the file's other keys are reached too. A
// command that parses must hold what ParseDaemonFlags promises (a valid
// layout, mode, spill fractions, log level, stop timeout and worker
// bound), and RereadConfig, which SIGHUP runs on the same file, must
// agree with it. The input is also given to ParseBytes as a size: what it
// accepts is digits and a unit, and worth that many bytes.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ipc/protocol.h"
#include "tools/daemon/daemon_flags.h"

namespace tierkv::daemon {
namespace {

// The temporary file that holds the input; removed at exit.
class ConfigFile {
 public:
  ConfigFile() {
    const char* tmp = getenv("TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") +
            "/tierkv-config-fuzz.XXXXXX";
    const int fd = mkstemp(path_.data());
    FUZZ_CHECK(fd >= 0, "mkstemp %s", path_.c_str());
    close(fd);
  }
  ~ConfigFile() { unlink(path_.c_str()); }

  const std::string& Write(const uint8_t* data, size_t size) {
    const int fd = open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "open %s", path_.c_str());
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd, data + done, size - done);
      FUZZ_CHECK(n > 0, "write %s", path_.c_str());
      done += static_cast<size_t>(n);
    }
    close(fd);
    return path_;
  }

 private:
  std::string path_;
};

void CheckCommand(const std::vector<const char*>& argv) {
  StatusOr<DaemonCommand> command =
      ParseDaemonFlags(static_cast<int>(argv.size()), argv.data());
  if (!command.ok()) return;
  const ipc::ServerOptions& s = command->server;
  FUZZ_CHECK(s.layout.Validate().ok(), "accepted layout %s",
             s.layout.ToString().c_str());
  FUZZ_CHECK(ValidateModelName(s.model).ok(), "accepted model '%s'",
             s.model.c_str());
  FUZZ_CHECK((s.mode & 0600) == 0600 && (s.mode & ~mode_t{0770}) == 0,
             "accepted mode %o", static_cast<unsigned>(s.mode));
  FUZZ_CHECK(
      s.spill_low > 0 && s.spill_low <= s.spill_high && s.spill_high <= 1,
      "accepted spill-low %g, spill-high %g", s.spill_low, s.spill_high);
  FUZZ_CHECK(s.max_workers >= 1 && s.max_workers <= ipc::kMaxWorkersListed,
             "accepted max-workers %d", static_cast<int>(s.max_workers));
  FUZZ_CHECK(command->stop_timeout.count() >= 1, "accepted stop-timeout %lld",
             static_cast<long long>(command->stop_timeout.count()));
  // The file has not changed since: the same level, nothing to restart.
  StatusOr<ConfigReread> reread = RereadConfig(*command);
  FUZZ_CHECK(reread.ok() && reread->log_level == command->log_level &&
                 reread->needs_restart.empty(),
             "log level '%s' at start, re-read as %s (%zu keys changed)",
             command->log_level.c_str(),
             reread.ok() ? reread->log_level.c_str()
                         : reread.status().ToString().c_str(),
             reread.ok() ? reread->needs_restart.size() : size_t{0});
}

void CheckBytes(const std::string& text) {
  StatusOr<size_t> bytes = ParseBytes(text);
  if (!bytes.ok()) return;
  size_t digits = 0;
  while (digits < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  std::string unit = text.substr(digits);
  for (char& c : unit) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  int shift = -1;
  const char* kUnits[] = {"K", "M", "G", "T"};
  if (unit.empty() || unit == "B") shift = 0;
  for (int i = 0; i < 4; ++i) {
    const std::string u = kUnits[i];
    if (unit == u || unit == u + "B" || unit == u + "IB") shift = 10 * (i + 1);
  }
  FUZZ_CHECK(digits >= 1 && digits <= 18 && shift >= 0,
             "ParseBytes accepted '%s'", text.c_str());
  const uint64_t value = std::stoull(text.substr(0, digits));
  FUZZ_CHECK(
      (*bytes >> shift) == value && (*bytes & ((1ull << shift) - 1)) == 0,
      "'%s' parsed as %zu bytes", text.c_str(), *bytes);
}

}  // namespace
}  // namespace tierkv::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tierkv::daemon::ConfigFile file;
  const std::string& path = file.Write(data, size);
  tierkv::daemon::CheckCommand({"tierkvd", "--config", path.c_str()});
  tierkv::daemon::CheckCommand({"tierkvd", "--layers", "2", "--kv-heads", "2",
                                "--head-dim", "64", "--config", path.c_str()});
  tierkv::daemon::CheckBytes(
      std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
