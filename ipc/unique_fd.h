// UniqueFd: a file descriptor with one owner, closed when the owner goes.
// Not thread-safe (as an int is not).
#ifndef TIERKV_IPC_UNIQUE_FD_H_
#define TIERKV_IPC_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace tierkv::ipc {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // The descriptor, no longer owned.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held, if any, and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_UNIQUE_FD_H_
