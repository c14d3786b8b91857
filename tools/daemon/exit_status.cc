#include "tools/daemon/exit_status.h"

namespace tierkv::daemon {

const char kExitStatusHelp[] =
    "Exit status:\n"
    "  0  stopped cleanly (SIGTERM or SIGINT), also while starting\n"
    "  1  internal error, or the stop took longer than --stop-timeout\n"
    "  2  bad flags, --config file or option values (a --disk-dir without\n"
    "     its parent, a --metrics-listen address that cannot be taken)\n"
    "  3  the store is busy: another tierkvd serves it\n"
    "  4  not enough memory or disk (--host-capacity, /dev/shm, the disk)\n"
    "  5  permission refused (a file, directory, or --group)\n"
    "  6  the disk store cannot be used as it is (another model or layout,\n"
    "     damaged beyond opening)\n"
    "  7  the stop could not spill every host block or flush the disk tier\n";

int ExitStatusFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitStopped;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return kExitUsage;
    case StatusCode::kAlreadyExists:
      return kExitBusy;
    case StatusCode::kResourceExhausted:
      return kExitNoResources;
    case StatusCode::kPermissionDenied:
      return kExitPermission;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
      return kExitStoreUnusable;
    default:
      return kExitInternal;
  }
}

}  // namespace tierkv::daemon
