#include "ipc/output_queue.h"

#include <cerrno>
#include <cstring>
#include <span>
#include <string>

namespace tierkv::ipc {

Status OutputQueue::Push(Outgoing out) {
  if (out.bytes.empty()) {
    return Status::InvalidArgument("an outgoing frame needs at least a byte");
  }
  if (out.fds.size() > kMaxPassedFds) {
    return Status::InvalidArgument(
        std::to_string(out.fds.size()) + " descriptors exceed the " +
        std::to_string(kMaxPassedFds) + " one message may pass");
  }
  bytes_ += out.bytes.size();
  entries_.push_back(std::move(out));
  return Status::Ok();
}

Status OutputQueue::Flush(int fd) {
  std::vector<int> passed;
  while (!entries_.empty()) {
    Outgoing& front = entries_.front();
    passed.clear();
    if (front_written_ == 0) {
      for (const UniqueFd& f : front.fds) passed.push_back(f.get());
    }
    const ssize_t n =
        SendWithFds(fd, std::span(front.bytes).subspan(front_written_), passed);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) return Status::Unavailable(std::string(std::strerror(errno)));
    if (n == 0) break;
    front.fds.clear();  // The peer holds them now.
    front_written_ += static_cast<size_t>(n);
    bytes_ -= static_cast<size_t>(n);
    if (front_written_ == front.bytes.size()) {
      entries_.pop_front();
      front_written_ = 0;
    }
  }
  return Status::Ok();
}

}  // namespace tierkv::ipc
