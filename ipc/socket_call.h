// SocketCall: one request and its reply over tierkvd's Unix socket, on a
// fresh connection (tierkv-admin's path; workers use their channel).
// Thread-safe: no shared state.
#ifndef TIERKV_IPC_SOCKET_CALL_H_
#define TIERKV_IPC_SOCKET_CALL_H_

#include <chrono>
#include <string>

#include "ipc/protocol.h"

namespace tierkv::ipc {

// Unavailable when no tierkvd answers; PermissionDenied when this user may
// not connect; DeadlineExceeded when the call (connecting included) takes
// longer than `timeout`. The reply may itself be an ErrorReply.
StatusOr<Message> SocketCall(
    const std::string& socket_path, const Message& request,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SOCKET_CALL_H_
