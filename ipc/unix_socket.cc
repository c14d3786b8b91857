#include "ipc/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tierkv::ipc {
namespace {

// Room for the descriptors a tierkv frame carries (RecvWithFds).
constexpr size_t kMaxReceivedFds = 8;

}  // namespace

bool PeerIdentity::InGroup(gid_t group) const {
  return gid == group ||
         std::find(groups.begin(), groups.end(), group) != groups.end();
}

StatusOr<PeerIdentity> PeerOf(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::Unavailable(std::string("SO_PEERCRED: ") +
                               std::strerror(errno));
  }
  PeerIdentity peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  // SO_PEERGROUPS says ERANGE, with the size it needs, when the buffer is
  // too small.
  std::vector<gid_t> groups(16);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(),
                   &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno != ERANGE) break;
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
  // A kernel before 4.13 has no SO_PEERGROUPS: the primary group alone.
  return peer;
}

namespace {

// Whether only `uid` and root can have put what is at `path` (a
// directory, symbolic links resolved): it and every directory above it
// belong to root or `uid`, and none of them lets others add or rename
// entries (group or other write) unless it is sticky (as /tmp is: there
// others cannot move what they do not own).
bool OnlyUserCanWrite(const std::filesystem::path& path, uid_t uid) {
  std::error_code error;
  const std::filesystem::path resolved =
      std::filesystem::canonical(path, error);
  if (error) return false;
  for (std::filesystem::path dir = resolved;; dir = dir.parent_path()) {
    const bool last = dir == resolved;  // The socket's own directory.
    struct stat st {};
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    if (last && st.st_uid != uid) return false;
    if (st.st_uid != uid && st.st_uid != 0) return false;
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (others_write && (last || (st.st_mode & S_ISVTX) == 0)) return false;
    if (dir == dir.root_path()) return true;
  }
}

}  // namespace

Status CheckDaemonUser(uid_t daemon_uid, const std::string& socket_path,
                       std::optional<uid_t> expected) {
  if (daemon_uid == geteuid() || daemon_uid == 0) return Status::Ok();
  if (expected.has_value() && daemon_uid == *expected) return Status::Ok();
  const std::filesystem::path dir =
      std::filesystem::path(socket_path).parent_path();
  if (OnlyUserCanWrite(dir.empty() ? "." : dir, daemon_uid)) {
    return Status::Ok();
  }
  return Status::PermissionDenied(
      "the process listening on " + socket_path + " runs as uid " +
      std::to_string(daemon_uid) +
      ", not this user, root or the owner of a directory only that owner "
      "could have made (it, and every directory above it, writable by that "
      "user and root alone); refusing to send it KV (set "
      "ClientOptions::daemon_uid to trust that user)");
}

ssize_t SendWithFds(int socket_fd, std::span<const std::byte> bytes,
                    std::span<const int> fds) {
  if (fds.size() > kMaxPassedFds) {
    errno = EINVAL;
    return -1;
  }
  std::vector<std::byte> control;
  iovec iov{.iov_base = const_cast<std::byte*>(bytes.data()),
            .iov_len = bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    const size_t fd_bytes = fds.size() * sizeof(int);
    control.assign(CMSG_SPACE(fd_bytes), std::byte{0});
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fd_bytes);
    std::memcpy(CMSG_DATA(c), fds.data(), fd_bytes);
  }
  return sendmsg(socket_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t RecvWithFds(int socket_fd, std::byte* buffer, size_t bytes,
                    std::vector<UniqueFd>* fds, size_t max_fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxReceivedFds)];
  iovec iov{.iov_base = buffer, .iov_len = bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      UniqueFd owned(fd);
      if (fds != nullptr && fds->size() < max_fds) {
        fds->push_back(std::move(owned));
      }
    }
  }
  return n;
}

}  // namespace tierkv::ipc
