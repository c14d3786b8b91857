// What tierkv does with its Unix socket beyond bytes: who is on the other
// end (SO_PEERCRED, SO_PEERGROUPS) and file descriptors passed with a frame
// (SCM_RIGHTS), which is how tierkvd hands a worker its sealed segments.
// Thread-safety: free functions over a caller's socket; no shared state.
#ifndef TIERKV_IPC_UNIX_SOCKET_H_
#define TIERKV_IPC_UNIX_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ipc/unique_fd.h"
#include "tierkv/status.h"

namespace tierkv::ipc {

// The most descriptors one message may pass (the kernel's SCM_MAX_FD).
inline constexpr size_t kMaxPassedFds = 253;

// The process on the other end of a connected Unix socket, as the kernel
// recorded it when the connection was made.
struct PeerIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;  // Primary group.
  // Supplementary groups (SO_PEERGROUPS; empty on kernels without it).
  std::vector<gid_t> groups;

  // The primary group or one of the supplementary groups is `group`.
  bool InGroup(gid_t group) const;
};

// Unavailable when the kernel cannot say (the socket is not connected).
StatusOr<PeerIdentity> PeerOf(int socket_fd);

// Whether a worker may trust `daemon_uid` as the tierkvd behind
// `socket_path`: it is this process's user, root, `expected` when given,
// or the owner of the socket's directory when only that owner and root
// could have made the socket's path (the directory, and every directory
// above it, belong to that user or root and are not writable by others,
// sticky ones such as /tmp apart), so no one else could have put the
// socket in place.
// PermissionDenied naming the uid and how to trust it otherwise.
Status CheckDaemonUser(uid_t daemon_uid, const std::string& socket_path,
                       std::optional<uid_t> expected);

// send(2) of `bytes` (MSG_NOSIGNAL | MSG_DONTWAIT) with `fds` attached to
// the first byte sent (SCM_RIGHTS); at most kMaxPassedFds. Returns as send
// does; errno as sendmsg's (EINVAL for too many descriptors).
ssize_t SendWithFds(int socket_fd, std::span<const std::byte> bytes,
                    std::span<const int> fds);

// recv(2) that also takes up to `max_fds` descriptors the peer attached
// (close-on-exec) into `fds`; descriptors beyond `max_fds` are closed, and
// so are any when `fds` is null. Returns as recv does; errno as recvmsg's.
ssize_t RecvWithFds(int socket_fd, std::byte* buffer, size_t bytes,
                    std::vector<UniqueFd>* fds, size_t max_fds);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_UNIX_SOCKET_H_
