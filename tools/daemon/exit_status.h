// tierkvd's exit statuses: one per class of error, the table --help and
// the README show, and the one mapping from a failed start's Status to its
// class. Constants and a pure function; thread-safe.
#ifndef TIERKV_TOOLS_DAEMON_EXIT_STATUS_H_
#define TIERKV_TOOLS_DAEMON_EXIT_STATUS_H_

#include "tierkv/status.h"

namespace tierkv::daemon {

// tierkvd's exit statuses, one per class of error (listed in --help and
// the README, kExitStatusHelp).
enum ExitStatus : int {
  kExitStopped = 0,         // Stopped cleanly (also: stopped while starting).
  kExitInternal = 1,        // Anything else, or not stopped in --stop-timeout.
  kExitUsage = 2,           // Bad flags, config file or option values.
  kExitBusy = 3,            // Another live tierkvd serves the store.
  kExitNoResources = 4,     // Not enough memory or disk.
  kExitPermission = 5,      // A file, directory or group refused.
  kExitStoreUnusable = 6,   // The disk store cannot be used as it is.
  kExitStopIncomplete = 7,  // Host blocks not all spilled, or flush failed.
};

// The exit status for a start that failed with `status`: by its code
// (InvalidArgument, OutOfRange: kExitUsage; AlreadyExists: kExitBusy;
// ResourceExhausted: kExitNoResources; PermissionDenied: kExitPermission;
// FailedPrecondition, DataLoss: kExitStoreUnusable; others: kExitInternal).
int ExitStatusFor(const Status& status);

// The table of exit statuses, as --help shows it.
extern const char kExitStatusHelp[];

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_EXIT_STATUS_H_
