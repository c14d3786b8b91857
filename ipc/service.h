// Dispatch: runs one decoded worker message against the coordinator and
// returns the reply (an ErrorReply for any failure). The one place where
// messages meet the coordinator, shared by tierkvd's sessions and by
// embedded mode, so both behave alike.
// Not thread-safe: REQUIRES the caller serialises access to `coordinator`.
#ifndef TIERKV_IPC_SERVICE_H_
#define TIERKV_IPC_SERVICE_H_

#include "ipc/protocol.h"
#include "src/coordinator.h"

namespace tierkv::ipc {

Message Dispatch(Coordinator& coordinator, WorkerId worker,
                 const Message& request);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SERVICE_H_
