// SocketCall: one request and its reply over tierkvd's Unix socket, on a
// fresh connection (tierkv-admin's path; workers use their channel), and
// the steps every socket client takes: Connect, SendAll, ReadFrame, each
// bounded by one deadline.
// Thread-safe: no shared state.
#ifndef TIERKV_IPC_SOCKET_CALL_H_
#define TIERKV_IPC_SOCKET_CALL_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/unique_fd.h"

namespace tierkv::ipc {

using Clock = std::chrono::steady_clock;

// A non-blocking socket connected to tierkvd by `deadline`. Unavailable
// when no one listens; DeadlineExceeded when tierkvd's listen queue stays
// full (it does not accept); PermissionDenied when this user may not
// connect, or the listener is not a user this process trusts
// (CheckDaemonUser, ipc/unix_socket.h, with `daemon_uid`): nothing has
// been sent to it then.
StatusOr<int> Connect(const std::string& path, Clock::time_point deadline,
                      std::optional<uid_t> daemon_uid = std::nullopt);

// Sends all of `bytes` on Connect's socket by `deadline`.
Status SendAll(int fd, std::span<const std::byte> bytes,
               Clock::time_point deadline);

// Reads exactly one frame from Connect's socket by `deadline`; descriptors
// passed with it (at most `max_fds`) go to `fds`, any others are closed.
StatusOr<Message> ReadFrame(int fd, Clock::time_point deadline,
                            std::vector<UniqueFd>* fds = nullptr,
                            size_t max_fds = 0);

// Unavailable when no tierkvd answers; PermissionDenied when this user may
// not connect; DeadlineExceeded when the call (connecting included) takes
// longer than `timeout`. The reply may itself be an ErrorReply.
StatusOr<Message> SocketCall(
    const std::string& socket_path, const Message& request,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SOCKET_CALL_H_
