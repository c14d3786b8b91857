#include "ipc/server.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/service.h"
#include "ipc/stats_page.h"
#include "src/version.h"
#include "tiers/host_tier.h"
#include "tiers/slot_disk.h"

namespace tierkv::ipc {
namespace {

// Socket messages (registration, stats) are small; anything larger is
// hostile or broken.
constexpr uint32_t kMaxSocketPayload = 64 * 1024;

// The listener wakes at least this often, even with nothing to do.
constexpr int kListenerPollMs = 1000;
// A server thread that has not gone round its loop for this long is stuck:
// the listener's slowest honest round (peers that take a second each to
// read a reply) stays well below it.
constexpr std::chrono::seconds kStalledAfter{10};

// When a thread last went round its loop; read by CheckProgress.
class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;

  Heartbeat() { Beat(); }
  void Beat() {
    last_.store(Clock::now().time_since_epoch().count(),
                std::memory_order_relaxed);
  }
  Clock::duration Age() const {
    return Clock::now() - Clock::time_point(Clock::duration(
                              last_.load(std::memory_order_relaxed)));
  }

 private:
  std::atomic<Clock::rep> last_;
};

Status ValidateStoreName(const std::string& store) {
  if (store.empty() || store.size() > 64) {
    return Status::InvalidArgument("store name must be 1..64 characters");
  }
  for (char c : store) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') {
      return Status::InvalidArgument("store name '" + store +
                                     "' may only use [A-Za-z0-9_-]");
    }
  }
  return Status::Ok();
}

Status Errno(const std::string& what) {
  return Status::Unavailable(what + ": " + std::strerror(errno));
}

// Sends a whole frame on a non-blocking socket. A peer that does not take
// it within a second is treated as gone.
bool SendFrame(int fd, const Message& message) {
  const std::vector<std::byte> bytes = Encode(message);
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n =
        send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
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

// One attached worker: its control channel and the thread serving it.
struct Session {
  Session(WorkerId id, ControlChannel ch)
      : worker(id), channel(std::move(ch)) {}

  WorkerId worker = 0;
  ControlChannel channel;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// Wakes the tier thread: lower-tier results are waiting.
struct TierSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool wanted = false;  // GUARDED_BY(mu)

  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu);
      wanted = true;
    }
    cv.notify_one();
  }
};

// Opens the disk tier, logging the index rebuild every 10%.
StatusOr<std::unique_ptr<DiskTier>> OpenDisk(const ServerOptions& options) {
  DiskTierOptions disk{
      .storage = {.path = options.disk_path},
      .capacity_bytes = options.disk_capacity_bytes,
      .layout_fingerprint = StoreFingerprint(options.layout, options.model),
      .block_bytes = options.layout.BlockBytes(),
      .element_bytes = static_cast<int32_t>(options.layout.ElementSize()),
      .codec = options.disk_codec};
  auto last_decile = std::make_shared<int>(-1);
  disk.progress = [last_decile](const RebuildProgress& p) {
    const int decile = p.Percent() / 10;
    if (decile == *last_decile) return;
    *last_decile = decile;
    constexpr double kMiB = 1 << 20;
    spdlog::info(
        "disk tier: rebuilding the index: {} values, {:.1f} of {:.1f} MiB "
        "read ({}%)",
        p.values, double(p.bytes_read) / kMiB, double(p.total_bytes) / kMiB,
        p.Percent());
  };
  spdlog::info("disk tier: opening {}", options.disk_path);
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier, DiskTier::Open(disk));
  const DiskTierStats stats = tier->stats();
  spdlog::info(
      "disk tier: {} blocks, {} of {} bytes; dropped {} bad values ({} of "
      "another layout or model)",
      stats.keys, stats.bytes, stats.capacity_bytes, stats.dropped_on_open,
      stats.layout_mismatches);
  return tier;
}

// tierkv-admin's view of the events in flight: the oldest ones, with worker
// names cut short, so the reply stays small however many there are.
EventsReply ListEvents(std::vector<EventInfo> events) {
  constexpr size_t kMaxName = 64;
  EventsReply reply;
  reply.in_flight = events.size();
  if (events.size() > kMaxEventsListed) events.resize(kMaxEventsListed);
  for (EventInfo& e : events) {
    if (e.worker_name.size() > kMaxName) e.worker_name.resize(kMaxName);
  }
  reply.events = std::move(events);
  return reply;
}

struct Connection {
  ucred peer{};
  std::vector<std::byte> input;
  std::unique_ptr<Session> session;  // Set once the peer registered.
};

}  // namespace

std::string StoreLockPath(const std::string& store) {
  return "/dev/shm/tierkv." + store + ".lock";
}

std::string DefaultSocketPath(const std::string& store) {
  if (const char* dir = std::getenv("XDG_RUNTIME_DIR"); dir && *dir) {
    return std::string(dir) + "/tierkv-" + store + ".sock";
  }
  return "/tmp/tierkv-" + std::to_string(getuid()) + "-" + store + ".sock";
}

struct Server::Impl {
  ServerOptions options;
  StoreLock store_lock;   // Guards the segment names.
  StoreLock socket_lock;  // Guards the socket path.
  std::unique_ptr<HostTier> host;
  // Declared after `host`: destroyed first, it waits for I/O into slots.
  std::unique_ptr<DiskTier> disk;
  std::unique_ptr<SlotDisk> slot_disk;
  std::shared_ptr<TierSignal> tier_signal;
  // Timed: CheckProgress tries it with a deadline.
  mutable std::timed_mutex mu;
  Coordinator coordinator;  // GUARDED_BY(mu)
  std::thread tier_thread;
  Heartbeat tier_heartbeat;  // Each round of the tier thread.
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
  std::mutex stop_mu;
  bool stopped = false;  // GUARDED_BY(stop_mu)

  Impl(ServerOptions opts, StoreLock store, StoreLock socket,
       std::unique_ptr<HostTier> host_tier, std::unique_ptr<DiskTier> disk_tier,
       std::unique_ptr<SlotDisk> slots_on_disk,
       std::shared_ptr<TierSignal> signal, Coordinator coord,
       StatsPageWriter page)
      : options(std::move(opts)),
        store_lock(std::move(store)),
        socket_lock(std::move(socket)),
        host(std::move(host_tier)),
        disk(std::move(disk_tier)),
        slot_disk(std::move(slots_on_disk)),
        tier_signal(std::move(signal)),
        coordinator(std::move(coord)),
        stats_page(std::move(page)) {}

  void RunTiers();
  // Publishes a snapshot every options.stats_interval until Stop.
  void PublishStats();

  void Listen();
  void Accept();
  // False when the connection must be closed.
  bool ReadFrom(int fd, Connection* conn);
  bool Handle(int fd, Connection* conn, const Message& message);
  bool Register(int fd, Connection* conn, const RegisterRequest& request);
  // tierkv-admin's operator orders; each leaves a line in the log.
  Message Clear(pid_t pid, TierSelection tiers);
  Message Evict(pid_t pid, const std::vector<BlockKey>& keys);
  void Close(int fd);
  void Serve(Session* session);
  std::string ChannelName(WorkerId worker) const {
    return "/tierkv." + options.store + ".w" + std::to_string(worker);
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }

StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& in) {
  ServerOptions options = in;
  TIERKV_RETURN_IF_ERROR(ValidateStoreName(options.store));
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.socket_path.empty()) {
    options.socket_path = DefaultSocketPath(options.store);
  }
  sockaddr_un addr{};
  if (options.socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path too long: " +
                                   options.socket_path);
  }
  if (options.max_workers < 1 || options.max_workers > kMaxWorkersListed) {
    return Status::InvalidArgument(
        "max workers of " + std::to_string(options.max_workers) +
        ": use 1 to " + std::to_string(kMaxWorkersListed) +
        " (the most a stats reply lists)");
  }
  if (options.stats_interval < std::chrono::milliseconds(10) ||
      options.stats_interval > std::chrono::minutes(1)) {
    return Status::InvalidArgument(
        "stats interval of " + std::to_string(options.stats_interval.count()) +
        " ms: use 10 ms to 60 s");
  }
  const size_t slot_bytes = options.layout.BlockBytes();
  const int32_t slots =
      HostTier::SlotsFor(options.host_capacity_bytes, slot_bytes);
  if (slots < 2) {
    return Status::InvalidArgument("host capacity of " +
                                   std::to_string(options.host_capacity_bytes) +
                                   " bytes holds fewer than 2 blocks of " +
                                   std::to_string(slot_bytes) + " bytes");
  }
  // One lock per name tierkvd claims: the store (its segments) and the
  // socket path. Held, they make whatever is left under those names stale.
  TIERKV_ASSIGN_OR_RETURN(StoreLock store_lock,
                          StoreLock::Acquire(StoreLockPath(options.store)));
  TIERKV_ASSIGN_OR_RETURN(StoreLock socket_lock,
                          StoreLock::Acquire(options.socket_path + ".lock"));
  std::unique_ptr<DiskTier> disk;
  if (!options.disk_path.empty()) {
    TIERKV_ASSIGN_OR_RETURN(disk, OpenDisk(options));
  }
  TIERKV_ASSIGN_OR_RETURN(
      std::unique_ptr<HostTier> host,
      HostTier::Create({.segment_name = "/tierkv." + options.store + ".host",
                        .num_slots = slots,
                        .slot_bytes = slot_bytes,
                        .layout_fingerprint =
                            StoreFingerprint(options.layout, options.model),
                        .mode = options.mode,
                        .group = options.group}));
  std::unique_ptr<SlotDisk> slot_disk;
  if (disk != nullptr) {
    slot_disk = std::make_unique<SlotDisk>(disk.get(), host.get());
  }
  auto signal = std::make_shared<TierSignal>();
  TIERKV_ASSIGN_OR_RETURN(Coordinator coordinator,
                          Coordinator::Create({.layout = options.layout,
                                               .model = options.model,
                                               .host_slots = slots,
                                               .lower = slot_disk.get(),
                                               .spill_high = options.spill_high,
                                               .spill_low = options.spill_low,
                                               .lower_tier_wakeup = [signal] {
                                                 signal->Notify();
                                               }}));
  TIERKV_ASSIGN_OR_RETURN(
      StatsPageWriter stats_page,
      StatsPageWriter::Create({.name = StatsPageName(options.store),
                               .socket_path = options.socket_path,
                               .max_workers = options.max_workers,
                               .mode = options.mode,
                               .group = options.group,
                               .interval = options.stats_interval}));
  auto impl = std::make_unique<Impl>(
      options, std::move(store_lock), std::move(socket_lock), std::move(host),
      std::move(disk), std::move(slot_disk), signal, std::move(coordinator),
      std::move(stats_page));

  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket");
  impl->listen_fd = fd;
  unlink(options.socket_path.c_str());
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options.socket_path.c_str(),
              options.socket_path.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("bind " + options.socket_path);
  }
  if (chmod(options.socket_path.c_str(), options.mode) != 0 ||
      (options.group.has_value() &&
       chown(options.socket_path.c_str(), static_cast<uid_t>(-1),
             *options.group) != 0)) {
    return Errno("set permissions of " + options.socket_path);
  }
  if (listen(fd, 64) != 0) return Errno("listen");
  if (pipe2(impl->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Errno("pipe");
  }
  Impl* raw = impl.get();
  impl->listener = std::thread([raw] { raw->Listen(); });
  if (raw->disk != nullptr) {
    impl->tier_thread = std::thread([raw] { raw->RunTiers(); });
  }
  impl->stats_thread = std::thread([raw] { raw->PublishStats(); });
  spdlog::info(
      "tierkvd serving store '{}' on {}: model {}, layout {}, {} host slots "
      "of {} bytes ({}); version {}",
      options.store, options.socket_path, ModelDisplayName(options.model),
      options.layout.ToString(), slots - 1, slot_bytes,
      impl->host->segment_name(), Version());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::Stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> guard(s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.stopping.store(true);
  const char byte = 1;
  if (write(s.wake_pipe[1], &byte, 1) < 0) {
    // The listener also polls with a timeout; it will notice.
  }
  if (s.listener.joinable()) s.listener.join();
  while (!s.connections.empty()) s.Close(s.connections.begin()->first);
  s.tier_signal->Notify();
  if (s.tier_thread.joinable()) s.tier_thread.join();
  {
    std::lock_guard<std::mutex> wake(s.stats_wake_mu);
    s.stats_wake.notify_all();
  }
  if (s.stats_thread.joinable()) s.stats_thread.join();
  s.stats_page.reset();  // Removes the page: no stale stats after a stop.
  if (s.disk != nullptr) {
    // Spills already started finish; then what is on disk is durable.
    if (Status flushed = s.disk->Flush(); !flushed.ok()) {
      spdlog::error("disk tier: flush on stop failed: {}", flushed.ToString());
    }
    std::lock_guard<std::timed_mutex> guard(s.mu);
    s.coordinator.PumpLowerTier();
  }
  if (s.listen_fd >= 0) close(s.listen_fd);
  for (int fd : s.wake_pipe) {
    if (fd >= 0) close(fd);
  }
  unlink(s.options.socket_path.c_str());
  spdlog::info("tierkvd stopped serving store '{}'", s.options.store);
}

const std::string& Server::socket_path() const {
  return impl_->options.socket_path;
}
const std::string& Server::host_segment() const {
  return impl_->host->segment_name();
}
int32_t Server::host_slots() const { return impl_->host->num_slots(); }

CoordinatorStats Server::stats() const {
  std::lock_guard<std::timed_mutex> guard(impl_->mu);
  return impl_->coordinator.stats();
}

Status Server::CheckProgress(std::chrono::milliseconds timeout) const {
  const Impl& s = *impl_;
  auto stalled = [](const char* thread, const Heartbeat& heartbeat,
                    std::chrono::milliseconds sleeps = {}) {
    const auto age =
        std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat.Age());
    if (age < kStalledAfter + sleeps) return Status::Ok();
    return Status::Unavailable(std::string(thread) + " has been stuck for " +
                               std::to_string(age.count()) + " ms");
  };
  TIERKV_RETURN_IF_ERROR(stalled("the listener thread", s.listener_heartbeat));
  if (s.disk != nullptr) {  // Only then is there a tier thread.
    TIERKV_RETURN_IF_ERROR(stalled("the tier thread", s.tier_heartbeat));
  }
  {
    std::unique_lock<std::timed_mutex> lock(s.mu, std::defer_lock);
    if (!lock.try_lock_for(timeout)) {
      return Status::Unavailable(
          "the coordinator's mutex was not free within " +
          std::to_string(timeout.count()) + " ms");
    }
  }
  // After the mutex, which the stats thread waits for: a stuck mutex is the
  // better name for that. It beats once per snapshot and sleeps an interval
  // between them.
  return stalled("the stats thread", s.stats_heartbeat,
                 s.options.stats_interval);
}

void Server::Impl::RunTiers() {
  while (!stopping.load()) {
    tier_heartbeat.Beat();
    {
      std::unique_lock<std::mutex> lock(tier_signal->mu);
      // The timeout lets a spill that rested after a failure try again.
      tier_signal->cv.wait_for(lock, std::chrono::milliseconds(100), [this] {
        return tier_signal->wanted || stopping.load();
      });
      tier_signal->wanted = false;
    }
    std::lock_guard<std::timed_mutex> guard(mu);
    coordinator.PumpLowerTier();
  }
}

void Server::Impl::PublishStats() {
  bool warned = false;
  while (!stopping.load()) {
    stats_heartbeat.Beat();
    CoordinatorStats snapshot;
    {
      std::lock_guard<std::timed_mutex> guard(mu);
      snapshot = coordinator.stats();
    }
    // Encoding and copying happen outside the coordinator's mutex.
    if (Status s =
            stats_page->Publish(snapshot, std::chrono::system_clock::now());
        !s.ok() && !warned) {
      spdlog::warn("stats page: {}; tierkv-admin falls back to the socket",
                   s.ToString());
      warned = true;
    }
    std::unique_lock<std::mutex> lock(stats_wake_mu);
    stats_wake.wait_for(lock, options.stats_interval,
                        [this] { return stopping.load(); });
  }
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
    socklen_t len = sizeof(conn.peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &conn.peer, &len) != 0) {
      close(fd);
      continue;
    }
    const bool allowed =
        conn.peer.uid == geteuid() || conn.peer.uid == 0 ||
        (options.group.has_value() && conn.peer.gid == *options.group);
    if (!allowed) {
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

bool Server::Impl::Handle(int fd, Connection* conn, const Message& message) {
  spdlog::debug("pid {}: {} on the socket", conn->peer.pid,
                MessageTypeName(TypeOf(message)));
  if (const auto* reg = std::get_if<RegisterRequest>(&message)) {
    return Register(fd, conn, *reg);
  }
  if (std::holds_alternative<StatsRequest>(message)) {
    std::lock_guard<std::timed_mutex> guard(mu);
    return SendFrame(fd, StatsReply{coordinator.stats()});
  }
  if (std::holds_alternative<EventsRequest>(message)) {
    std::vector<EventInfo> events;
    {
      std::lock_guard<std::timed_mutex> guard(mu);
      events = coordinator.events();
    }
    return SendFrame(fd, ListEvents(std::move(events)));
  }
  if (const auto* clear = std::get_if<ClearRequest>(&message)) {
    return SendFrame(fd, Clear(conn->peer.pid, clear->tiers));
  }
  if (const auto* evict = std::get_if<EvictRequest>(&message)) {
    return SendFrame(fd, Evict(conn->peer.pid, evict->keys));
  }
  SendFrame(fd, ErrorReply{Status::InvalidArgument(
                    std::string(MessageTypeName(TypeOf(message))) +
                    " is not accepted on the socket")});
  return false;
}

Message Server::Impl::Clear(pid_t pid, TierSelection tiers) {
  StatusOr<ClearResult> result = Status::Internal("unreached");
  {
    std::lock_guard<std::timed_mutex> guard(mu);
    result = coordinator.Clear(tiers);
  }
  if (!result.ok()) {
    spdlog::warn("pid {}: clear {} refused: {}", pid, TierSelectionName(tiers),
                 result.status().ToString());
    return ErrorReply{result.status()};
  }
  spdlog::info(
      "pid {}: clear {}: dropped {} host blocks ({} kept: pinned) and {} "
      "disk blocks{}",
      pid, TierSelectionName(tiers), result->host_dropped,
      result->host_kept_pinned, result->disk_dropped,
      result->disk_cleared ? "" : " (no disk tier)");
  return ClearReply{*result};
}

Message Server::Impl::Evict(pid_t pid, const std::vector<BlockKey>& keys) {
  std::vector<EvictedBlock> blocks;
  {
    std::lock_guard<std::timed_mutex> guard(mu);
    blocks = coordinator.Evict(keys);
  }
  // Every key of a short list; a summary of any list.
  constexpr size_t kKeysLogged = 32;
  size_t host = 0, disk = 0, pinned = 0, absent = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const EvictedBlock& b = blocks[i];
    host += b.host_dropped;
    disk += b.disk_dropped;
    pinned += b.host_pinned;
    absent += !b.host_dropped && !b.disk_dropped && !b.host_pinned;
    if (i < kKeysLogged) {
      spdlog::info("pid {}: evict {}: {}", pid, b.key.ToHex(),
                   EvictedBlockSummary(b));
    }
  }
  spdlog::info(
      "pid {}: evict of {} keys: {} dropped from host, {} from disk, {} "
      "pinned on host (kept), {} not cached",
      pid, blocks.size(), host, disk, pinned, absent);
  return EvictReply{std::move(blocks)};
}

bool Server::Impl::Register(int fd, Connection* conn,
                            const RegisterRequest& request) {
  if (conn->session != nullptr) {
    SendFrame(fd, ErrorReply{Status::AlreadyExists("already registered")});
    return false;
  }
  WorkerRegistration reg = request.registration;
  reg.pid = conn->peer.pid;  // The kernel's word, not the message's.
  StatusOr<WorkerId> worker = Status::ResourceExhausted(
      std::to_string(options.max_workers) + " workers are attached already");
  {
    std::lock_guard<std::timed_mutex> guard(mu);
    if (coordinator.num_workers() < options.max_workers) {
      worker = coordinator.RegisterWorker(reg);
    }
  }
  if (!worker.ok()) {
    spdlog::warn("refused worker pid {}: {}", reg.pid,
                 worker.status().ToString());
    SendFrame(fd, ErrorReply{worker.status()});
    return false;
  }
  StatusOr<ControlChannel> channel =
      ControlChannel::Create({.name = ChannelName(*worker),
                              .bytes = 0,
                              .mode = options.mode,
                              .group = options.group},
                             options.channel_bytes);
  if (!channel.ok()) {
    {
      std::lock_guard<std::timed_mutex> guard(mu);
      (void)coordinator.DropWorker(*worker);
    }
    SendFrame(fd, ErrorReply{channel.status()});
    return false;
  }
  auto session = std::make_unique<Session>(*worker, std::move(*channel));
  Session* raw = session.get();
  session->thread = std::thread([this, raw] { Serve(raw); });
  conn->session = std::move(session);
  spdlog::info("worker {} attached: pid {}, '{}', {} device blocks", *worker,
               reg.pid, reg.name, reg.num_device_blocks);
  return SendFrame(fd, RegisterReply{.worker_id = *worker,
                                     .host_segment = host->segment_name(),
                                     .host_slots = host->num_slots(),
                                     .slot_bytes = host->slot_bytes(),
                                     .control_segment = ChannelName(*worker),
                                     .store_fingerprint = StoreFingerprint(
                                         options.layout, options.model)});
}

void Server::Impl::Close(int fd) {
  auto it = connections.find(fd);
  if (it == connections.end()) return;
  if (Session* session = it->second.session.get()) {
    session->stop.store(true);
    session->channel.WakeReceiver();
    session->thread.join();
    std::lock_guard<std::timed_mutex> guard(mu);
    (void)coordinator.DropWorker(session->worker);
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
      std::lock_guard<std::timed_mutex> guard(mu);
      reply = Dispatch(coordinator, session->worker, *message);
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
