// tierkvd's Unix socket: the listener thread accepts peers of the store's
// user or group (supplementary groups included), reads their frames, registers
// workers and runs a session thread per worker that serves its control channel.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ipc/server_impl.h"
#include "ipc/service.h"
#include "ipc/unix_socket.h"
#include "src/printable.h"

namespace tierkv::ipc {

bool SendFrame(int fd, const Message& message, std::span<const int> fds) {
  const std::vector<std::byte> bytes = Encode(message);
  size_t sent = 0;
  while (sent < bytes.size()) {
    // The descriptors go with the first byte.
    const ssize_t n =
        SendWithFds(fd, std::span<const std::byte>(bytes).subspan(sent),
                    sent == 0 ? fds : std::span<const int>());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, 1000) <= 0) return false;
      continue;
    }
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

void Server::Impl::Listen() {
  std::vector<pollfd> fds;
  while (!stopping.load()) {
    listener_heartbeat.Beat();
    fds.clear();
    fds.push_back({wake_pipe[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (const auto& [fd, conn] : connections) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), kListenerPollMs) < 0 && errno != EINTR) {
      spdlog::error("poll: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) Accept();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      if (!ReadFrom(fds[i].fd, &it->second)) Close(fds[i].fd);
    }
  }
}

void Server::Impl::Accept() {
  for (;;) {
    const int fd =
        accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN: none left.
    Connection conn;
    StatusOr<PeerIdentity> peer = PeerOf(fd);
    if (!peer.ok()) {
      close(fd);
      continue;
    }
    conn.peer = std::move(*peer);
    if (!MayUse(conn.peer)) {
      spdlog::warn("refused pid {} (uid {}): not this store's user or group",
                   conn.peer.pid, conn.peer.uid);
      SendFrame(fd, ErrorReply{Status::PermissionDenied(
                        "uid " + std::to_string(conn.peer.uid) +
                        " may not use this tierkv store")});
      close(fd);
      continue;
    }
    connections.emplace(fd, std::move(conn));
  }
}

bool Server::Impl::MayUse(const PeerIdentity& peer) const {
  return peer.uid == geteuid() || peer.uid == 0 ||
         (options.group.has_value() && peer.InGroup(*options.group));
}

bool Server::Impl::MayOperate(const PeerIdentity& peer) const {
  return peer.uid == geteuid() || peer.uid == 0 ||
         (options.admin_group.has_value() &&
          peer.InGroup(*options.admin_group));
}

bool Server::Impl::ReadFrom(int fd, Connection* conn) {
  std::byte buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return false;  // The peer closed: a worker is gone.
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    conn->input.insert(conn->input.end(), buf, buf + n);
    if (conn->input.size() > 2 * (kFrameHeaderBytes + kMaxSocketPayload)) {
      break;  // Parse what is here; an oversized frame is refused below.
    }
  }
  while (conn->input.size() >= kFrameHeaderBytes) {
    StatusOr<uint32_t> len = PeekPayloadLength(conn->input, kMaxSocketPayload);
    if (!len.ok()) {
      spdlog::warn("pid {}: {}; disconnecting", conn->peer.pid,
                   len.status().ToString());
      SendFrame(fd, ErrorReply{len.status()});
      return false;
    }
    const size_t frame = kFrameHeaderBytes + *len;
    if (conn->input.size() < frame) break;
    StatusOr<Message> message =
        Decode(std::span<const std::byte>(conn->input).first(frame));
    conn->input.erase(conn->input.begin(), conn->input.begin() + frame);
    if (!message.ok()) {
      spdlog::warn("pid {}: {}; disconnecting", conn->peer.pid,
                   message.status().ToString());
      SendFrame(fd, ErrorReply{message.status()});
      return false;
    }
    if (!Handle(fd, conn, *message)) return false;
  }
  return true;
}

bool Server::Impl::Register(int fd, Connection* conn,
                            const RegisterRequest& request) {
  if (conn->session != nullptr) {
    SendFrame(fd, ErrorReply{Status::AlreadyExists("already registered")});
    return false;
  }
  WorkerRegistration reg = request.registration;
  reg.pid = conn->peer.pid;  // The kernel's word, not the message's.
  reg.uid = conn->peer.uid;
  // Shown in the log and by tierkv-admin: no control characters.
  reg.name = PrintableName(reg.name);
  StatusOr<WorkerId> worker = Status::ResourceExhausted(
      std::to_string(options.max_workers) + " workers are attached already");
  {
    TieredStore::Locked coordinator = store->Lock();
    if (coordinator->num_workers() < options.max_workers) {
      worker = coordinator->RegisterWorker(reg);
    }
  }
  if (!worker.ok()) {
    spdlog::warn("refused worker pid {}: {}", reg.pid,
                 worker.status().ToString());
    SendFrame(fd, ErrorReply{worker.status()});
    return false;
  }
  StatusOr<ControlChannel> channel = ControlChannel::Create(
      options.channel_bytes, options.store + ".w" + std::to_string(*worker));
  if (!channel.ok()) {
    { (void)store->Lock()->DropWorker(*worker); }
    SendFrame(fd, ErrorReply{channel.status()});
    return false;
  }
  auto session = std::make_unique<Session>(*worker, std::move(*channel));
  Session* raw = session.get();
  session->thread = std::thread([this, raw] { Serve(raw); });
  conn->session = std::move(session);
  spdlog::info("worker {} attached: pid {}, '{}', {} device blocks", *worker,
               reg.pid, reg.name, reg.num_device_blocks);
  // The worker maps its segments from the descriptors passed with the
  // reply: neither has a name anyone could open.
  const int segments[kRegisterReplyFds] = {store->host().segment_fd(),
                                           conn->session->channel.segment_fd()};
  return SendFrame(fd,
                   RegisterReply{.worker_id = *worker,
                                 .host_slots = store->host().num_slots(),
                                 .slot_bytes = store->host().slot_bytes(),
                                 .store_fingerprint = StoreFingerprint(
                                     options.layout, options.model)},
                   segments);
}

void Server::Impl::Close(int fd) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  if (Session* session = it->second.session.get()) {
    session->stop.store(true);
    session->channel.WakeReceiver();
    session->thread.join();
    (void)store->Lock()->DropWorker(session->worker);
    spdlog::info("worker {} (pid {}) detached; its pins are released",
                 session->worker, it->second.peer.pid);
  }
  close(fd);
  connections.erase(it);  // Removes the channel segment with the session.
}

void Server::Impl::Serve(Session* session) {
  std::vector<std::byte> request;
  std::vector<std::byte> response;
  while (session->channel.Receive(&request, session->stop)) {
    StatusOr<Message> message = Decode(request);
    Message reply;
    if (!message.ok()) {
      spdlog::warn("worker {}: {}", session->worker,
                   message.status().ToString());
      reply = ErrorReply{message.status()};
    } else {
      reply = DispatchToStore(*store, session->worker, *message);
    }
    response.clear();
    Encode(reply, &response);
    if (!session->channel.Respond(response).ok()) {
      response.clear();
      Encode(ErrorReply{Status::ResourceExhausted(
                 "reply exceeds the control channel")},
             &response);
      (void)session->channel.Respond(response);
    }
  }
}

}  // namespace tierkv::ipc
