// SocketCall: one request and its reply over tierkvd's Unix socket, on a
// fresh connection (tierkv-admin's path; workers use their channel), and
// the two steps every socket client takes: Connect, ReadFrame.
// Thread-safe: no shared state.
#ifndef TIERKV_IPC_SOCKET_CALL_H_
#define TIERKV_IPC_SOCKET_CALL_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/unix_socket.h"

namespace tierkv::ipc {

// A blocking socket connected to tierkvd whose reads and writes give up
// after `timeout` (a daemon that never answers). Unavailable when no one
// listens; PermissionDenied when this user may not connect, or the
// listener is not a user this process trusts (CheckDaemonUser,
// ipc/unix_socket.h with `daemon_uid`): nothing has been sent to it.
StatusOr<int> Connect(const std::string& path,
                      std::chrono::milliseconds timeout,
                      std::optional<uid_t> daemon_uid = std::nullopt);

// Reads exactly one frame from `fd` (as Connect made it); descriptors
// passed with it (at most `max_fds`) go to `fds`, any others are closed.
// DeadlineExceeded when tierkvd does not answer in time.
StatusOr<Message> ReadFrame(int fd, std::vector<UniqueFd>* fds = nullptr,
                            size_t max_fds = 0);

// Unavailable when no tierkvd answers; PermissionDenied when this user may
// not connect. The reply may itself be an ErrorReply.
StatusOr<Message> SocketCall(const std::string& socket_path,
                             const Message& request);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SOCKET_CALL_H_
