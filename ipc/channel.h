// ControlChannel: one worker's request/response channel to tierkvd in a
// sealed shared-memory segment of its own (passed over the socket): a request
// buffer the worker writes, a response buffer tierkvd writes, and a sequence
// word for each. The writer of a buffer bumps its sequence word (release) and
// wakes the other side with a futex; the reader spins briefly, then sleeps on
// the futex. One request is outstanding at a time, so the ring has depth one
// and neither side ever takes a lock. A request may be posted (sent without
// waiting); its response is then awaited before the next request goes.
// Thread-safety: one client thread and one server thread per channel.
#ifndef TIERKV_IPC_CHANNEL_H_
#define TIERKV_IPC_CHANNEL_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/status.h"
#include "tiers/shm_segment.h"

namespace tierkv::ipc {

// Default: 1 MiB per direction, enough for a lookup of 256Ki tokens.
inline constexpr uint32_t kDefaultChannelBytes = 1 << 20;

class ControlChannel {
 public:
  // tierkvd: creates the segment, a sealed memfd (ShmSegment::CreateSealed)
  // that a worker cannot shrink under tierkvd; `label` names it in
  // /proc/<pid>/fd. Its memory is reserved whole: ResourceExhausted when
  // the machine has not that much left, never SIGBUS on a later touch.
  static StatusOr<ControlChannel> Create(uint32_t capacity,
                                         const std::string& label);
  // Worker: maps the segment tierkvd passed as `segment_fd` (taken over) and
  // checks its header.
  static StatusOr<ControlChannel> Open(int segment_fd);

  uint32_t capacity() const;

  // Worker side. Sends `request` and waits for the response. `alive` is
  // asked whenever a wait times out (every `poll`): Unavailable as soon as
  // it says the peer is gone. DeadlineExceeded once `deadline` passes with
  // no response (a stopped or wedged tierkvd). After either, the channel
  // is out of step (a late response would answer the next call): the
  // caller must not call again.
  Status Call(std::span<const std::byte> request,
              std::vector<std::byte>* response,
              const std::function<bool()>& alive,
              std::chrono::steady_clock::time_point deadline =
                  std::chrono::steady_clock::time_point::max(),
              std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  // Worker side. Sends `request` without waiting for the response: the
  // caller must AwaitResponse before it posts or calls again (a second
  // request would overwrite the first before tierkvd has read it).
  // InvalidArgument when it exceeds the capacity (nothing sent).
  Status Post(std::span<const std::byte> request);
  // Worker side. Waits for the response to the request last posted, as
  // Call does.
  Status AwaitResponse(
      std::vector<std::byte>* response, const std::function<bool()>& alive,
      std::chrono::steady_clock::time_point deadline =
          std::chrono::steady_clock::time_point::max(),
      std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  // tierkvd side. Waits for the next request and copies it into `request`
  // (the worker cannot change it while it is decoded). Returns false when
  // `stop` is set, checked at least every `poll`. A request announcing more
  // bytes than the capacity is returned truncated to zero bytes (an empty
  // frame the decoder rejects).
  bool Receive(std::vector<std::byte>* request, const std::atomic<bool>& stop,
               std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  // Publishes the response to the request last received. InvalidArgument if
  // it does not fit (the caller then sends a short error instead).
  Status Respond(std::span<const std::byte> response);
  // Ends the server thread's Receive at once, whether it sleeps or is about
  // to; call it after setting the stop flag. It bumps the request sequence:
  // the channel is of no use for requests afterwards.
  void WakeReceiver();

  // The segment's fd, to pass to the worker (tierkvd's side; -1 on the
  // worker's, which closes it once mapped).
  int segment_fd() const { return segment_.fd(); }

 private:
  struct Header;
  ControlChannel(ShmSegment segment, uint32_t capacity);
  Header* header() const;
  std::byte* request_buffer() const;
  std::byte* response_buffer() const;

  ShmSegment segment_;
  // Read from the header once, checked against the mapping, and never
  // again: the other side can rewrite the shared header at any time.
  uint32_t capacity_;
  uint32_t last_request_seq_ = 0;  // Server: last request handled.
  // Worker: the response sequence before the request last posted.
  uint32_t response_seq_seen_ = 0;
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_CHANNEL_H_
