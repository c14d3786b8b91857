// tierkvd's Unix socket: one listener thread runs an event loop over
// non-blocking sockets. It accepts peers of the store's user or group
// (supplementary groups included), reads
// their frames and queues each reply in the peer's OutputQueue, written as
// the peer's socket takes it: the listener never waits on a peer, so one
// that never reads costs the others nothing. It registers workers and
// starts a session thread per worker that serves its control channel; when
// a worker's socket closes, the reaper thread joins its session and drops
// the worker. Unregistered connections are capped and time out.
#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <tuple>

#include "ipc/server_impl.h"
#include "ipc/service.h"
#include "ipc/unix_socket.h"
#include "src/printable.h"

namespace tierkv::ipc {
namespace {

// Accepts at most this many connections a round, so a flood of them cannot
// keep the listener from the peers it has.
constexpr int kAcceptsPerRound = 64;

}  // namespace

void Server::Impl::Listen() {
  std::vector<pollfd> fds;
  while (!stopping.load()) {
    // Not while poll fails: a failure that lasts shows as a stalled
    // listener (tierkv-admin health, systemd's watchdog).
    if (!poll_failing) listener_heartbeat.Beat();
    Clock::time_point now = Clock::now();
    CloseExpired(now);
    fds.clear();
    fds.push_back({wake_pipe[0], POLLIN, 0});
    // poll skips a negative descriptor: no accepting while paused.
    fds.push_back({now < accept_paused_until ? -1 : listen_fd, POLLIN, 0});
    for (const auto& [fd, conn] : connections) {
      const short events = conn.output.empty() ? POLLIN : POLLIN | POLLOUT;
      fds.push_back({fd, events, 0});
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(now)) < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      // ENOMEM, or EINVAL: more descriptors than RLIMIT_NOFILE, lowered
      // while tierkvd runs, allows. Neither is a peer's doing: the
      // connections stay, and the listener tries again until poll works.
      if (!poll_failing) {
        poll_failing = true;
        spdlog::error(
            "poll over {} descriptors: {}; the listener serves no one and "
            "tries again every {} ms",
            fds.size(), std::strerror(err), kPollRetry.count());
      }
      std::this_thread::sleep_for(kPollRetry);
      continue;
    }
    if (poll_failing) {
      poll_failing = false;
      spdlog::info("poll works again ({} connections open)",
                   connections.size());
    }
    if (fds[0].revents != 0) return;
    now = Clock::now();
    for (size_t i = 2; i < fds.size(); ++i) {
      const short revents = fds[i].revents;
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      Connection* conn = &it->second;
      if (revents == 0 && !conn->backlog) continue;
      bool open = true;
      if (revents & POLLOUT) open = Flush(conn, now);
      if (open && (revents & (POLLIN | POLLHUP | POLLERR))) {
        open = ReadFrom(conn);
      }
      if (open) open = HandleFrames(conn) && Flush(conn, now);
      if (!open) Close(fds[i].fd);
    }
    // After the connections: one closed above may lend its descriptor to a
    // new one, which must not take the old one's events.
    if (fds[1].revents & POLLIN) Accept(now);
  }
}

int Server::Impl::PollTimeoutMs(Clock::time_point now) const {
  for (const auto& [fd, conn] : connections) {
    if (conn.backlog) return 0;  // Frames wait: only look for news.
  }
  Clock::time_point wake = now + std::chrono::milliseconds(kListenerPollMs);
  if (accept_paused_until > now) wake = std::min(wake, accept_paused_until);
  if (pending_connections > 0) {
    for (const auto& [fd, conn] : connections) {
      if (conn.session == nullptr) wake = std::min(wake, conn.deadline);
    }
  }
  // Rounded up: waking before a deadline would only poll again at once.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now);
  return static_cast<int>(
      std::clamp<int64_t>(ms.count(), 0, int64_t{kListenerPollMs}));
}

void Server::Impl::Accept(Clock::time_point now) {
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    UniqueFd fd(
        accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      // Out of descriptors (EMFILE, ENFILE) or memory: trying again at once
      // would spin. Peers wait in the listen queue (or their connect times
      // out) until a connection closes and accepting resumes.
      accept_paused_until = now + kAcceptBackoff;
      if (!accept_failing) {
        accept_failing = true;
        spdlog::warn(
            "accept: {}; not accepting for {} ms at a time until it "
            "succeeds ({} connections open, {} of them workers)",
            std::strerror(err), kAcceptBackoff.count(), connections.size(),
            connections.size() - pending_connections);
      }
      return;
    }
    if (accept_failing) {
      accept_failing = false;
      spdlog::info("accepting connections again ({} open)", connections.size());
    }
    Connection conn;
    conn.fd = std::move(fd);
    StatusOr<PeerIdentity> peer = PeerOf(conn.fd.get());
    if (!peer.ok()) continue;
    conn.peer = std::move(*peer);
    if (!MayUse(conn.peer)) {
      if (now - refusal_logged_at >= std::chrono::seconds(1)) {
        spdlog::warn(
            "refused pid {} (uid {}): not this store's user or group{}",
            conn.peer.pid, conn.peer.uid,
            refusals_unlogged == 0
                ? std::string()
                : fmt::format(" ({} more refused since the last such line)",
                              refusals_unlogged));
        refusal_logged_at = now;
        refusals_unlogged = 0;
      } else {
        ++refusals_unlogged;
      }
      refused_access.fetch_add(1, std::memory_order_relaxed);
      Refuse(&conn,
             Status::PermissionDenied("uid " + std::to_string(conn.peer.uid) +
                                      " may not use this tierkv store"));
      continue;
    }
    if (pending_connections >= options.max_pending_connections) CrowdOut();
    conn.deadline = now + options.pending_timeout;
    conn.serial = ++accepted;
    const int key = conn.fd.get();
    connections.emplace(key, std::move(conn));
    ++pending_connections;
  }
}

void Server::Impl::CrowdOut() {
  // The one whose deadline is nearest: the longest without a reply.
  auto oldest = connections.end();
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    const Connection& c = it->second;
    if (c.session == nullptr &&
        (oldest == connections.end() ||
         std::tie(c.deadline, c.serial) <
             std::tie(oldest->second.deadline, oldest->second.serial))) {
      oldest = it;
    }
  }
  if (oldest == connections.end()) return;
  if (crowded_out++ == 0) {
    spdlog::warn(
        "{} connections have not registered (max_pending_connections): each "
        "new one closes the longest idle, starting with pid {}",
        pending_connections, oldest->second.peer.pid);
  }
  Close(oldest->first);
}

void Server::Impl::CloseExpired(Clock::time_point now) {
  if (pending_connections > 0) {
    std::vector<int> expired;
    pid_t pid = 0;
    for (const auto& [fd, conn] : connections) {
      if (conn.session == nullptr && conn.deadline <= now) {
        expired.push_back(fd);
        pid = conn.peer.pid;
      }
    }
    if (!expired.empty()) {
      spdlog::warn(
          "closing {} connections that had no request answered in {} ms "
          "(pid {}{})",
          expired.size(), options.pending_timeout.count(), pid,
          expired.size() > 1 ? " and others" : "");
      for (int fd : expired) Close(fd);
    }
  }
  if (crowded_out > 0 &&
      pending_connections < options.max_pending_connections) {
    spdlog::info("room for new connections again; {} were closed to make it",
                 crowded_out);
    crowded_out = 0;
  }
}

bool Server::Impl::ReadFrom(Connection* conn) {
  std::byte buf[4096];
  // Past this much unhandled input, the socket's buffer holds the rest.
  while (conn->input.size() <= 2 * (kFrameHeaderBytes + kMaxSocketPayload)) {
    const ssize_t n = recv(conn->fd.get(), buf, sizeof(buf), 0);
    if (n == 0) return false;  // The peer closed: a worker is gone.
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    conn->input.insert(conn->input.end(), buf, buf + n);
  }
  return true;
}

bool Server::Impl::HandleFrames(Connection* conn) {
  conn->backlog = false;
  for (int handled = 0; conn->input.size() >= kFrameHeaderBytes; ++handled) {
    if (handled == kFramesPerRound) {
      conn->backlog = true;  // Whole or not, the rest waits its turn.
      break;
    }
    StatusOr<uint32_t> len = PeekPayloadLength(conn->input, kMaxSocketPayload);
    if (!len.ok()) {
      if (uint64_t left_out = 0; malformed_log.Allow(&left_out)) {
        spdlog::warn("pid {}: {}; disconnecting{}", conn->peer.pid,
                     len.status().ToString(), LogLimit::Since(left_out));
      }
      refused_malformed.fetch_add(1, std::memory_order_relaxed);
      return Refuse(conn, len.status());
    }
    const size_t frame = kFrameHeaderBytes + *len;
    if (conn->input.size() < frame) break;
    StatusOr<Message> message =
        Decode(std::span<const std::byte>(conn->input).first(frame));
    conn->input.erase(conn->input.begin(), conn->input.begin() + frame);
    if (!message.ok()) {
      if (uint64_t left_out = 0; malformed_log.Allow(&left_out)) {
        spdlog::warn("pid {}: {}; disconnecting{}", conn->peer.pid,
                     message.status().ToString(), LogLimit::Since(left_out));
      }
      refused_malformed.fetch_add(1, std::memory_order_relaxed);
      return Refuse(conn, message.status());
    }
    if (!Handle(conn, *message)) return false;
  }
  return true;
}

bool Server::Impl::Flush(Connection* conn, Clock::time_point now) {
  if (conn->output.empty()) return true;
  if (Status s = conn->output.Flush(conn->fd.get()); !s.ok()) {
    spdlog::debug("pid {}: {}; disconnecting", conn->peer.pid, s.ToString());
    return false;
  }
  // Every request answered: an unregistered peer may ask again.
  if (conn->output.empty() && conn->session == nullptr) {
    conn->deadline = now + options.pending_timeout;
  }
  return true;
}

std::string EffectiveTenant(const std::string& tenant, uid_t uid) {
  if (uid == geteuid() || uid == 0) return tenant;
  return "uid" + std::to_string(uid) + "/" + tenant;
}

bool Server::Impl::MayUse(const PeerIdentity& peer) const {
  return MayOperate(peer) ||
         (options.group.has_value() && peer.InGroup(*options.group));
}

bool Server::Impl::MayOperate(const PeerIdentity& peer) const {
  return peer.uid == geteuid() || peer.uid == 0 ||
         (options.admin_group.has_value() &&
          peer.InGroup(*options.admin_group));
}

bool Server::Impl::Reply(Connection* conn, const Message& reply,
                         std::vector<UniqueFd> fds) {
  if (conn->output.bytes() > kMaxQueuedReplyBytes) {
    spdlog::warn(
        "pid {}: {} bytes of replies unread and asking for more; "
        "disconnecting",
        conn->peer.pid, conn->output.bytes());
    return false;
  }
  return conn->output.Push({.bytes = Encode(reply), .fds = std::move(fds)})
      .ok();
}

bool Server::Impl::Refuse(Connection* conn, const Status& why) {
  if (conn->output.Push({.bytes = Encode(ErrorReply{why}), .fds = {}}).ok()) {
    (void)conn->output.Flush(conn->fd.get());
  }
  return false;
}

bool Server::Impl::RefuseWorker(Connection* conn, pid_t pid,
                                std::optional<WorkerId> registered,
                                const Status& why) {
  if (registered.has_value()) {
    (void)store->Lock()->DropWorker(*registered,
                                    Coordinator::Departure::kRefused);
  }
  if (uint64_t left_out = 0; refused_worker_log.Allow(&left_out)) {
    spdlog::warn("refused worker pid {}: {}{}", pid, why.ToString(),
                 LogLimit::Since(left_out));
  }
  CountRefusal(why.code());
  return Refuse(conn, why);
}

bool Server::Impl::Register(Connection* conn, const RegisterRequest& request) {
  if (conn->session != nullptr) {
    refused_malformed.fetch_add(1, std::memory_order_relaxed);
    return Refuse(conn, Status::AlreadyExists("already registered"));
  }
  WorkerRegistration reg = request.registration;
  reg.pid = conn->peer.pid;  // The kernel's word, not the message's.
  reg.uid = conn->peer.uid;
  reg.operator_uid = MayOperate(conn->peer);
  reg.tenant = EffectiveTenant(reg.tenant, conn->peer.uid);
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
  // Its tenant's host segment, made for the tenant's first worker.
  StatusOr<UniqueFd> host_segment =
      worker.ok() ? store->HostSegmentFd(*worker) : worker.status();
  StatusOr<ControlChannel> channel =
      host_segment.ok() ? ControlChannel::Create(
                              options.channel_bytes,
                              options.store + ".w" + std::to_string(*worker))
                        : host_segment.status();
  if (!channel.ok()) {
    return RefuseWorker(conn, reg.pid,
                        worker.ok() ? std::optional(*worker) : std::nullopt,
                        channel.status());
  }
  // A pipe, not an eventfd: the worker gets the read end only, so it cannot
  // make tierkvd's writes block (an eventfd's O_NONBLOCK and counter are
  // shared with whoever holds it). tierkvd keeps a read end too, so a write
  // never meets a closed pipe; a full pipe (a worker that never reads) only
  // loses that worker's wake-ups.
  int ends[2];
  if (pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) {
    const Status why = Status::ResourceExhausted(
        std::string("cannot make the worker's readiness pipe: ") +
        std::strerror(errno));
    return RefuseWorker(conn, reg.pid, *worker, why);
  }
  auto session = std::make_unique<Session>(*worker, std::move(*channel));
  session->pid = reg.pid;
  session->uid = reg.uid;
  session->operator_uid = reg.operator_uid;
  session->ready_reader.reset(ends[0]);
  session->ready.reset(ends[1]);
  // The worker maps its segments from the descriptors passed with the
  // reply (copies: tierkvd keeps its own): neither has a name anyone could
  // open. The readiness pipe's read end follows them. Made before the
  // session is served, so that running out of descriptors (EMFILE) is a
  // refusal like any other, not the departure of an attached worker.
  std::vector<UniqueFd> passed;
  passed.push_back(std::move(*host_segment));
  for (const int fd :
       {session->channel.segment_fd(), session->ready_reader.get()}) {
    passed.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!passed.back().valid()) {
      const Status why = Status::ResourceExhausted(
          std::string("cannot pass a descriptor: ") + std::strerror(errno));
      return RefuseWorker(conn, reg.pid, *worker, why);
    }
  }
  Session* raw = session.get();
  try {
    session->thread = std::thread([this, raw] { Serve(raw); });
  } catch (const std::system_error& e) {
    // No thread to serve it (the unit's TasksMax, RLIMIT_NPROC): refused,
    // not std::terminate for every worker.
    const Status why = Status::ResourceExhausted(
        std::string("cannot start the worker's session thread: ") + e.what());
    return RefuseWorker(conn, reg.pid, *worker, why);
  }
  ready_signals->Add(*worker, session->ready.get());
  conn->session = std::move(session);
  conn->deadline = Clock::time_point::max();
  --pending_connections;
  attached.fetch_add(1, std::memory_order_relaxed);
  spdlog::info(
      "worker {} attached: pid {}, '{}', tenant '{}', {} device blocks",
      *worker, reg.pid, reg.name, PrintableName(reg.tenant),
      reg.num_device_blocks);
  return Reply(conn,
               RegisterReply{.worker_id = *worker,
                             .host_slots = store->host().num_slots(),
                             .slot_bytes = store->host().slot_bytes(),
                             .store_fingerprint = StoreFingerprint(
                                 options.layout, options.model)},
               std::move(passed));
}

void Server::Impl::Close(int fd) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  if (std::unique_ptr<Session>& session = it->second.session) {
    // Its thread may be in the middle of a request: the reaper waits for
    // it, not the listener.
    session->StopServing();
    MutexLock lock(&reap_mu);
    retired.push_back(std::move(session));
    reap_wake.NotifyOne();
  } else {
    --pending_connections;
  }
  connections.erase(it);  // Closes the socket.
}

void Server::Impl::Reap() {
  for (;;) {
    std::vector<std::unique_ptr<Session>> batch;
    {
      MutexLock lock(&reap_mu);
      while (retired.empty() && !reaper_stop) reap_wake.Wait(&reap_mu);
      if (retired.empty()) return;  // Stopped, and every session reaped.
      batch.swap(retired);
    }
    for (std::unique_ptr<Session>& session : batch) {
      session->thread.join();
      // Counted first: whoever sees the worker gone sees it counted.
      detached.fetch_add(1, std::memory_order_relaxed);
      ready_signals->Remove(session->worker);
      { (void)store->Lock()->DropWorker(session->worker); }
      spdlog::info("worker {} (pid {}) detached; its pins are released",
                   session->worker, session->pid);
      session.reset();  // Removes the channel segment.
    }
  }
}

void ReadySignals::Signal(WorkerId worker) {
  MutexLock lock(&mu_);
  const auto it = fds_.find(worker);
  const char byte = 1;
  if (it != fds_.end()) (void)write(it->second, &byte, 1);  // Non-blocking.
}

void Server::Impl::Serve(Session* session) {
  std::vector<std::byte> request;
  std::vector<std::byte> response;
  Message message;
  while (session->channel.Receive(&request, session->stop)) {
    // Into the message kept from the last request (DecodeInto).
    const Status decoded = DecodeInto(request, &message);
    Message reply;
    if (!decoded.ok()) {
      if (uint64_t left_out = 0; malformed_log.Allow(&left_out)) {
        spdlog::warn("worker {}: {}{}", session->worker, decoded.ToString(),
                     LogLimit::Since(left_out));
      }
      reply = ErrorReply{decoded};
    } else if (std::holds_alternative<StatsRequest>(message)) {
      // With what only the server counts.
      reply = StatsReply{StatsSeenBy(session->uid, session->operator_uid)};
    } else {
      reply = DispatchToStore(*store, session->worker, message, &session->stop,
                              session->channel.capacity());
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
