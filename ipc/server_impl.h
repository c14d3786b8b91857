// Internal to ipc/: Server::Impl, the state of a running tierkvd, and what
// its parts share. server.cc starts and stops it (with the tier and stats
// threads), server_listener.cc runs the Unix socket (accept, registration,
// worker sessions and their reaper) and server_admin.cc answers
// tierkv-admin's orders.
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
#include <string>
#include <thread>
#include <vector>

#include "ipc/channel.h"
#include "ipc/output_queue.h"
#include "ipc/protocol.h"
#include "ipc/server.h"
#include "ipc/stats_page.h"
#include "ipc/unique_fd.h"
#include "ipc/unix_socket.h"
#include "src/heartbeat.h"
#include "src/mutex.h"
#include "tiers/host_tier.h"
#include "tiers/tiered_store.h"

namespace tierkv::ipc {

// Socket messages (registration, stats) are small; anything larger is
// hostile or broken.
constexpr uint32_t kMaxSocketPayload = 64 * 1024;
// A peer with this many bytes of replies unread that asks for another is
// disconnected (it would hold the listener's memory hostage otherwise).
// One reply of any size is always queued.
constexpr size_t kMaxQueuedReplyBytes = 256 * 1024;

// Requests of one peer the listener answers per round before it turns to
// the others.
constexpr int kFramesPerRound = 4;
// The listener wakes at least this often, even with nothing to do.
constexpr int kListenerPollMs = 1000;
// While accept fails for want of descriptors or memory, the listener stops
// accepting for this long at a time rather than retrying at once.
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// While poll itself fails (out of memory, or more descriptors to watch
// than a lowered RLIMIT_NOFILE allows), the listener tries again this often.
constexpr std::chrono::milliseconds kPollRetry{100};
// A server thread that has not gone round its loop for this long is stuck:
// the listener never waits on a peer, so its rounds take milliseconds.
constexpr std::chrono::seconds kStalledAfter{10};

using Clock = std::chrono::steady_clock;

// At most one log line a second for one kind of complaint, saying how many
// were left out since: a peer that repeats a mistake in a loop (malformed
// frames, refused registrations) cannot flood the journal. Thread-safe.
class LogLimit {
 public:
  // Whether to log now; if so, *left_out is how many were not logged since
  // the last line.
  bool Allow(uint64_t* left_out) {
    const Clock::time_point now = Clock::now();
    MutexLock lock(&mu_);
    if (logged_ && now - last_ < std::chrono::seconds(1)) {
      ++left_out_;
      return false;
    }
    logged_ = true;
    last_ = now;
    *left_out = left_out_;
    left_out_ = 0;
    return true;
  }
  // ", N more since the last such line", or "" for none.
  static std::string Since(uint64_t left_out) {
    return left_out == 0 ? std::string()
                         : " (" + std::to_string(left_out) +
                               " more since the last such line)";
  }

 private:
  Mutex mu_;
  bool logged_ TIERKV_GUARDED_BY(mu_) = false;
  Clock::time_point last_ TIERKV_GUARDED_BY(mu_);
  uint64_t left_out_ TIERKV_GUARDED_BY(mu_) = 0;
};

// Each attached worker's readiness pipe (its write end, tierkvd's alone),
// by worker id: the store's loads_ready callback (called with the store's
// mutex held, on the tier thread) writes a byte to the worker's, and the
// worker, which has the read end, wakes from its wait for pending loads.
// Sessions add theirs on registration and remove it before they close it.
class ReadySignals {
 public:
  void Add(WorkerId worker, int fd) TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    fds_[worker] = fd;
  }
  void Remove(WorkerId worker) TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    fds_.erase(worker);
  }
  // Never blocks: the write end is non-blocking and no worker holds it. A
  // worker that never reads its pipe only misses its own wake-ups.
  void Signal(WorkerId worker) TIERKV_EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::map<WorkerId, int> fds_ TIERKV_GUARDED_BY(mu_);
};

// One attached worker: its control channel and the thread serving it.
struct Session {
  Session(WorkerId id, ControlChannel ch)
      : worker(id), channel(std::move(ch)) {}

  WorkerId worker = 0;
  pid_t pid = 0;
  // The worker's user, and whether it may operate (stats it may see).
  uint32_t uid = 0;
  bool operator_uid = false;
  ControlChannel channel;
  // The readiness pipe: tierkvd writes `ready` when loads of the worker
  // waiting for promotions become ready (ReadySignals); the worker was
  // passed a copy of `ready_reader`, which tierkvd keeps open so that a
  // write never fails on a pipe without readers.
  UniqueFd ready, ready_reader;
  std::atomic<bool> stop{false};
  std::thread thread;

  // Serves nothing more: a request being served ends, and Receive takes no
  // other (the receiver is woken to see the flag).
  void StopServing() {
    stop.store(true);
    channel.WakeReceiver();
  }
};

// One peer of the socket, non-blocking, served by the listener thread.
struct Connection {
  UniqueFd fd;
  PeerIdentity peer;
  std::vector<std::byte> input;  // Bytes of frames not handled yet.
  // Whole frames wait in `input` beyond this round's share (HandleFrames):
  // the listener comes back to them without waiting for the socket.
  bool backlog = false;
  OutputQueue output;  // Replies the peer has not read yet.
  // Until it registers: closed at this time unless a request of it is
  // answered first (which moves it options.pending_timeout on).
  Clock::time_point deadline = Clock::time_point::max();
  uint64_t serial = 0;               // Accept order, among equal deadlines.
  std::unique_ptr<Session> session;  // Set once the peer registered.
};

struct Server::Impl {
  ServerOptions options;
  StoreLock store_lock;   // Guards the segment names.
  StoreLock socket_lock;  // Guards the socket path.
  // The host tier, disk tier, coordinator and tier thread.
  std::unique_ptr<TieredStore> store;
  // Shared with the store's loads_ready callback, made before the store.
  std::shared_ptr<ReadySignals> ready_signals;
  int listen_fd = -1;
  int wake_pipe[2] = {-1, -1};
  std::thread listener;
  Heartbeat listener_heartbeat;  // Each round of the listener.
  // The listener thread's alone (and Stop's once it is joined):
  std::map<int, Connection> connections;  // By descriptor.
  size_t pending_connections = 0;         // Of those, not registered.
  uint64_t accepted = 0;                  // Connections ever accepted.
  // Accepting paused (out of descriptors) until then; logged once per
  // episode.
  Clock::time_point accept_paused_until;
  bool accept_failing = false;
  // poll has failed since the last round that polled; logged once per
  // episode.
  bool poll_failing = false;
  // Refusals of other users' connections: logged at most once a second,
  // with how many went unlogged, so a flood of them cannot flood the log.
  Clock::time_point refusal_logged_at;
  uint64_t refusals_unlogged = 0;
  // Malformed frames and requests, and refused registrations.
  LogLimit malformed_log;
  LogLimit refused_worker_log;
  // Connections closed to make room since the pending ones reached
  // options.max_pending_connections; logged once per episode.
  size_t crowded_out = 0;
  // Sessions of workers that left, on their way out: the reaper thread
  // joins each (its thread may be in the middle of a request) and drops
  // its worker, so the listener never waits for one.
  Mutex reap_mu;
  CondVar reap_wake;
  std::vector<std::unique_ptr<Session>> retired TIERKV_GUARDED_BY(reap_mu);
  bool reaper_stop TIERKV_GUARDED_BY(reap_mu) = false;
  std::thread reaper;
  // The stats page and the thread that publishes to it; the page is the
  // stats thread's alone until Stop joins it.
  std::optional<StatsPageWriter> stats_page;
  std::thread stats_thread;
  Heartbeat stats_heartbeat;  // Each snapshot.
  std::mutex stats_wake_mu;   // With stats_wake: ends the wait on Stop.
  std::condition_variable stats_wake;
  // Workers coming and going, for AttachStats: the listener counts
  // registrations and refusals, the reaper departures.
  std::atomic<uint64_t> attached{0};
  std::atomic<uint64_t> detached{0};
  std::atomic<uint64_t> refused_access{0};
  std::atomic<uint64_t> refused_mismatch{0};
  std::atomic<uint64_t> refused_limit{0};
  std::atomic<uint64_t> refused_malformed{0};
  std::atomic<bool> stopping{false};
  Mutex stop_mu;  // Held through Stop: a second call waits, then returns.
  bool stopped TIERKV_GUARDED_BY(stop_mu) = false;

  Impl(ServerOptions opts, StoreLock store_name, StoreLock socket,
       std::unique_ptr<TieredStore> tiered,
       std::shared_ptr<ReadySignals> signals,
       std::optional<StatsPageWriter> page)
      : options(std::move(opts)),
        store_lock(std::move(store_name)),
        socket_lock(std::move(socket)),
        store(std::move(tiered)),
        ready_signals(std::move(signals)),
        stats_page(std::move(page)) {}

  // The store's statistics, with the store's name and the attach counters.
  CoordinatorStats Stats() const;
  // Stats() as a peer of `uid` may see them: with every user's workers
  // only for one who operates tierkvd (KeepWorkersOfUid).
  CoordinatorStats StatsSeenBy(uint32_t uid, bool operates) const;
  // Counts a refused registration or request under its reason, from the
  // refusal's code (PermissionDenied: access, FailedPrecondition: a layout
  // or model mismatch, ResourceExhausted: a limit, else malformed).
  void CountRefusal(StatusCode code);
  // Publishes a snapshot every options.stats_interval until Stop.
  void PublishStats();

  void Listen();
  // How long the listener may sleep in poll: until the nearest deadline.
  int PollTimeoutMs(Clock::time_point now) const;
  void Accept(Clock::time_point now);
  // Whether `peer` may attach or read stats: an operator (MayOperate), or
  // a member (primary or supplementary) of options.group.
  bool MayUse(const PeerIdentity& peer) const;
  // Whether `peer` may give operator orders (clear, evict): tierkvd's user,
  // root, or a member of options.admin_group.
  bool MayOperate(const PeerIdentity& peer) const;
  // Makes room for one more unregistered connection.
  void CrowdOut();
  // Closes the unregistered connections whose deadline has passed, and
  // ends an episode of crowding out once there is room.
  void CloseExpired(Clock::time_point now);
  // Each false when the connection must be closed.
  bool ReadFrom(Connection* conn);
  // Handles at most kFramesPerRound whole frames of conn->input, so a peer
  // that sends many requests at once delays the others by a few replies at
  // most; sets conn->backlog when more wait.
  bool HandleFrames(Connection* conn);
  bool Flush(Connection* conn, Clock::time_point now);
  bool Handle(Connection* conn, const Message& message);
  bool Register(Connection* conn, const RegisterRequest& request);
  // Queues `reply` for the peer, with `fds` passed on its first byte;
  // false (logged) when the peer has left kMaxQueuedReplyBytes unread
  // already.
  bool Reply(Connection* conn, const Message& reply,
             std::vector<UniqueFd> fds = {});
  // Answers `why` as the peer's last reply (as far as its socket takes it
  // now) before it is closed; always false.
  bool Refuse(Connection* conn, const Status& why);
  // Refuses a registration with `why`: drops the worker if the coordinator
  // had `registered` it (Departure::kRefused), logs it (at most a line a
  // second: LogLimit), counts it and answers it; always false.
  bool RefuseWorker(Connection* conn, pid_t pid,
                    std::optional<WorkerId> registered, const Status& why);
  // tierkv-admin's operator orders; each leaves a line in the log.
  Message Clear(pid_t pid, TierSelection tiers);
  Message Evict(pid_t pid, const std::vector<BlockKey>& keys);
  // Closes the connection; a worker's session goes to the reaper.
  void Close(int fd);
  void Serve(Session* session);
  // The reaper thread: joins retired sessions and drops their workers
  // until Stop.
  void Reap();
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SERVER_IMPL_H_
