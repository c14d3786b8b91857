// OutputQueue: what tierkvd still owes one socket peer, written as the
// socket takes it and never waited for, so one thread serves every peer
// however slowly each reads. An entry may carry file descriptors, passed
// (SCM_RIGHTS) together with its first byte.
// Not thread-safe: the listener thread's alone.
#ifndef TIERKV_IPC_OUTPUT_QUEUE_H_
#define TIERKV_IPC_OUTPUT_QUEUE_H_

#include <cstddef>
#include <deque>
#include <vector>

#include "ipc/unique_fd.h"
#include "ipc/unix_socket.h"
#include "tierkv/status.h"

namespace tierkv::ipc {

// One frame for a peer, and the descriptors that go with it.
struct Outgoing {
  std::vector<std::byte> bytes;
  // Passed with bytes[0]; this side's copies close once they are sent.
  std::vector<UniqueFd> fds;
};

class OutputQueue {
 public:
  // Queues `out` behind what is queued already. An entry with no bytes (no
  // byte to pass descriptors with) or over kMaxPassedFds (unix_socket.h)
  // descriptors is
  // InvalidArgument and queues nothing.
  Status Push(Outgoing out);
  // Writes what the non-blocking socket `fd` takes now: OK when the queue
  // is empty or the socket full (poll for POLLOUT, then flush again);
  // Unavailable when the peer is gone.
  Status Flush(int fd);

  bool empty() const { return entries_.empty(); }
  size_t bytes() const { return bytes_; }  // Queued and not yet written.

 private:
  std::deque<Outgoing> entries_;
  size_t front_written_ = 0;  // Of entries_.front().bytes.
  size_t bytes_ = 0;
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_OUTPUT_QUEUE_H_
