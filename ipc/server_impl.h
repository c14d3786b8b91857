// Internal to ipc/: Server::Impl, the state of a running tierkvd, and what
// its parts share. server.cc starts and stops it (with the tier and stats
// threads), server_listener.cc runs the Unix socket (accept, registration,
// worker sessions) and server_admin.cc answers tierkv-admin's orders.
#ifndef TIERKV_IPC_SERVER_IMPL_H_
#define TIERKV_IPC_SERVER_IMPL_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ipc/channel.h"
#include "ipc/protocol.h"
#include "ipc/server.h"
#include "ipc/stats_page.h"
#include "ipc/unix_socket.h"
#include "src/heartbeat.h"
#include "src/mutex.h"
#include "tiers/host_tier.h"
#include "tiers/tiered_store.h"

namespace tierkv::ipc {

// Socket messages (registration, stats) are small; anything larger is
// hostile or broken.
constexpr uint32_t kMaxSocketPayload = 64 * 1024;

// The listener wakes at least this often, even with nothing to do.
constexpr int kListenerPollMs = 1000;
// A server thread that has not gone round its loop for this long is stuck:
// the listener's slowest honest round (peers that take a second each to
// read a reply) stays well below it.
constexpr std::chrono::seconds kStalledAfter{10};

// Sends a whole frame on a non-blocking socket, with `fds` passed on its
// first byte (SCM_RIGHTS). A peer that does not take it within a second is
// treated as gone.
bool SendFrame(int fd, const Message& message, std::span<const int> fds = {});

// One attached worker: its control channel and the thread serving it.
struct Session {
  Session(WorkerId id, ControlChannel ch)
      : worker(id), channel(std::move(ch)) {}

  WorkerId worker = 0;
  ControlChannel channel;
  std::atomic<bool> stop{false};
  std::thread thread;
};

struct Connection {
  PeerIdentity peer;
  std::vector<std::byte> input;
  std::unique_ptr<Session> session;  // Set once the peer registered.
};

struct Server::Impl {
  ServerOptions options;
  StoreLock store_lock;   // Guards the segment names.
  StoreLock socket_lock;  // Guards the socket path.
  // The host tier, disk tier, coordinator and tier thread.
  std::unique_ptr<TieredStore> store;
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  std::thread listener;
  Heartbeat listener_heartbeat;           // Each round of the listener.
  std::map<int, Connection> connections;  // Listener thread only.
  // The stats page and the thread that publishes to it; the page is the
  // stats thread's alone until Stop joins it.
  std::optional<StatsPageWriter> stats_page;
  std::thread stats_thread;
  Heartbeat stats_heartbeat;  // Each snapshot.
  std::mutex stats_wake_mu;   // With stats_wake: ends the wait on Stop.
  std::condition_variable stats_wake;
  std::atomic<bool> stopping{false};
  Mutex stop_mu;  // Held through Stop: a second call waits, then returns.
  bool stopped TIERKV_GUARDED_BY(stop_mu) = false;

  Impl(ServerOptions opts, StoreLock store_name, StoreLock socket,
       std::unique_ptr<TieredStore> tiered, std::optional<StatsPageWriter> page)
      : options(std::move(opts)),
        store_lock(std::move(store_name)),
        socket_lock(std::move(socket)),
        store(std::move(tiered)),
        stats_page(std::move(page)) {}

  // Publishes a snapshot every options.stats_interval until Stop.
  void PublishStats();

  void Listen();
  void Accept();
  // Whether `peer` may attach or read stats: tierkvd's user, root, or a
  // member (primary or supplementary) of options.group.
  bool MayUse(const PeerIdentity& peer) const;
  // Whether `peer` may give operator orders (clear, evict): tierkvd's user,
  // root, or a member of options.admin_group.
  bool MayOperate(const PeerIdentity& peer) const;
  // False when the connection must be closed.
  bool ReadFrom(int fd, Connection* conn);
  bool Handle(int fd, Connection* conn, const Message& message);
  bool Register(int fd, Connection* conn, const RegisterRequest& request);
  // tierkv-admin's operator orders; each leaves a line in the log.
  Message Clear(pid_t pid, TierSelection tiers);
  Message Evict(pid_t pid, const std::vector<BlockKey>& keys);
  void Close(int fd);
  void Serve(Session* session);
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SERVER_IMPL_H_
