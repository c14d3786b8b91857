// InProcessStore: a store that runs in the worker client's own process
// (embedded mode), as the client reaches it: each call is a message,
// dispatched as tierkvd dispatches a worker's (ipc/service.h), so both
// modes behave alike. The interface lives in the client library; the
// implementation, which needs the coordinator and the disk tier, in
// tierkv::embedded (ipc/embedded_client.cc).
#ifndef TIERKV_IPC_IN_PROCESS_STORE_H_
#define TIERKV_IPC_IN_PROCESS_STORE_H_

#include "ipc/protocol.h"
#include "src/coordinator_types.h"
#include "tierkv/status.h"
#include "tierkv/types.h"
#include "tiers/host_tier.h"

namespace tierkv::ipc {

class InProcessStore {
 public:
  virtual ~InProcessStore() = default;

  virtual StatusOr<WorkerId> RegisterWorker(
      const WorkerRegistration& registration) = 0;
  // The reply to one of the worker's messages (an ErrorReply on failure).
  virtual Message Call(WorkerId worker, const Message& request) = 0;
  // The slots copies read and write; valid as long as the store.
  virtual const HostTier& host() const = 0;
  // An eventfd the store writes when loads of its worker that waited for
  // promotions become ready (as tierkvd's readiness eventfd); valid as
  // long as the store.
  virtual int ready_fd() const = 0;
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_IN_PROCESS_STORE_H_
