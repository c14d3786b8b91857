#include "ipc/output_queue.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
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
  std::vector<std::byte> control;
  while (!entries_.empty()) {
    Outgoing& front = entries_.front();
    iovec iov{.iov_base = front.bytes.data() + front_written_,
              .iov_len = front.bytes.size() - front_written_};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (front_written_ == 0 && !front.fds.empty()) {
      const size_t fd_bytes = front.fds.size() * sizeof(int);
      control.assign(CMSG_SPACE(fd_bytes), std::byte{0});
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* header = CMSG_FIRSTHDR(&msg);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(fd_bytes);
      std::byte* data = reinterpret_cast<std::byte*>(CMSG_DATA(header));
      for (size_t i = 0; i < front.fds.size(); ++i) {
        const int passed = front.fds[i].get();
        std::memcpy(data + i * sizeof(int), &passed, sizeof(int));
      }
    }
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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
