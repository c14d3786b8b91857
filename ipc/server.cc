// tierkvd's Server: its options checked, Start and Stop, the accessors and
// CheckProgress, and the tier and stats threads. The socket is in
// server_listener.cc, tierkv-admin's orders in server_admin.cc.
#include "ipc/server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ipc/server_impl.h"
#include "tierkv/version.h"

namespace tierkv::ipc {
namespace {

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

// The disk tier's storage for --disk-capacity: memtables of 1/16 of it
// (1 to 64 MiB), so that RocksDB's reserve (two of them and their log)
// stays a small share of small tiers too.
RocksDbStorageOptions DiskStorageOptions(const ServerOptions& options) {
  RocksDbStorageOptions storage{.path = options.disk_path};
  storage.write_buffer_bytes = static_cast<size_t>(std::clamp<uint64_t>(
      options.disk_capacity_bytes / 16, uint64_t{1} << 20, uint64_t{64} << 20));
  return storage;
}

void LogDegraded(const Status& why) {
  if (why.ok()) {
    spdlog::info("disk tier: spilling again: its filesystem has space");
  } else {
    spdlog::error("{}", why.message());
  }
}

// Opens the disk tier, logging the index rebuild every 10%.
StatusOr<std::unique_ptr<DiskTier>> OpenDisk(const ServerOptions& options) {
  DiskTierOptions disk{
      .storage = DiskStorageOptions(options),
      .capacity_bytes = options.disk_capacity_bytes,
      .layout_fingerprint = StoreFingerprint(options.layout, options.model),
      .reset = options.disk_reset,
      .on_degraded = LogDegraded,
      .block_bytes = options.layout.BlockBytes(),
      .element_bytes = static_cast<int32_t>(options.layout.ElementSize()),
      .codec = options.disk_codec};
  // --disk-capacity counts what RocksDB writes besides the blocks, and
  // leaves the blocks at least 1 MiB.
  const uint64_t reserve = RocksDbReservedBytes(disk.storage);
  const uint64_t minimum = reserve + (uint64_t{1} << 20);
  if (options.disk_capacity_bytes < minimum) {
    return Status::InvalidArgument(
        "--disk-capacity " + std::to_string(options.disk_capacity_bytes) +
        " bytes is too small: RocksDB's log and memtables take " +
        std::to_string(reserve) + " bytes of it; give it at least " +
        std::to_string(minimum) + " bytes (4M)");
  }
  disk.reserved_bytes = reserve;
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
  if (stats.damaged_files > 0) {
    std::string files;
    for (const std::string& file : tier->damaged_files()) {
      files += (files.empty() ? "" : ", ") + file;
    }
    spdlog::warn("disk tier: damaged files found, their blocks dropped: {}",
                 files);
  }
  if (options.disk_reset && stats.layout_mismatches > 0) {
    spdlog::warn(
        "disk tier: --disk-reset dropped {} blocks of another model or "
        "layout",
        stats.layout_mismatches);
  }
  return tier;
}

// The socket's directory must exist; /run/tierkv, the default without
// XDG_RUNTIME_DIR, is made when missing (as root; the systemd unit makes it
// with RuntimeDirectory=). Never /tmp: anyone can put a socket there.
Status CheckSocketDirectory(const std::string& socket_path) {
  const std::string dir =
      std::filesystem::path(socket_path).parent_path().string();
  if (dir.empty() || dir == "/") return Status::Ok();
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return Status::InvalidArgument("--socket " + socket_path + ": " + dir +
                                     " is not a directory");
    }
    return Status::Ok();
  }
  if (dir == kSystemRuntimeDir && mkdir(dir.c_str(), 0755) == 0) {
    return Status::Ok();
  }
  const std::string why = std::strerror(errno);
  return Status::FailedPrecondition(
      "--socket " + socket_path + ": cannot use directory " + dir + " (" + why +
      "); create it, set XDG_RUNTIME_DIR to a directory of your own, or "
      "pass --socket");
}

}  // namespace

std::string StoreLockPath(const std::string& store,
                          const std::string& socket_path) {
  // ".store-lock": never the "<socket>.lock" of any socket path.
  return std::filesystem::path(socket_path)
      .replace_filename("tierkv-" + store + ".store-lock")
      .string();
}

std::string DefaultSocketPath(const std::string& store) {
  const char* dir = std::getenv("XDG_RUNTIME_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : kSystemRuntimeDir) +
         "/tierkv-" + store + ".sock";
}

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
  if (options.group.has_value() && (options.mode & 0060) != 0060) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", options.mode & 07777);
    return Status::InvalidArgument(
        std::string("--group lets a group attach, but --mode ") + mode +
        " gives it no read and write access to the socket: use a mode such "
        "as 0660");
  }
  if (options.max_tenants < 1 || options.max_tenants > kMaxTenants) {
    return Status::InvalidArgument("--max-tenants " +
                                   std::to_string(options.max_tenants) +
                                   ": use 1 to " + std::to_string(kMaxTenants));
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
  if (options.pending_timeout < std::chrono::milliseconds(10) ||
      options.pending_timeout > std::chrono::minutes(10)) {
    return Status::InvalidArgument(
        "pending timeout of " +
        std::to_string(options.pending_timeout.count()) +
        " ms: use 10 ms to 10 min");
  }
  if (options.max_pending_connections == 0) {
    options.max_pending_connections = 4 * options.max_workers + 16;
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
  TIERKV_RETURN_IF_ERROR(CheckSocketDirectory(options.socket_path));
  TIERKV_ASSIGN_OR_RETURN(
      StoreLock store_lock,
      StoreLock::Acquire(StoreLockPath(options.store, options.socket_path)));
  TIERKV_ASSIGN_OR_RETURN(StoreLock socket_lock,
                          StoreLock::Acquire(options.socket_path + ".lock"));
  std::unique_ptr<DiskTier> disk;
  if (!options.disk_path.empty()) {
    TIERKV_ASSIGN_OR_RETURN(disk, OpenDisk(options));
  }
  TieredStoreOptions store;
  store.layout = options.layout;
  store.model = options.model;
  store.host = {
      .shared = true,
      .max_segments = options.max_tenants,
      .num_slots = slots,
      .slot_bytes = slot_bytes,
      .layout_fingerprint = StoreFingerprint(options.layout, options.model)};
  store.disk = std::move(disk);
  store.spill_high = options.spill_high;
  store.spill_low = options.spill_low;
  store.caps = options.caps;
  store.verify_on_load = options.verify_on_load;
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> tiered,
                          TieredStore::Open(std::move(store)));
  // Without a page (its name taken by another user's file, /dev/shm
  // full), tierkv-admin reads stats over the socket: not a reason to stop.
  StatusOr<StatsPageWriter> stats_page =
      StatsPageWriter::Create({.name = StatsPageName(options.store),
                               .socket_path = options.socket_path,
                               .max_workers = options.max_workers,
                               .mode = options.mode,
                               .group = options.group,
                               .interval = options.stats_interval});
  if (!stats_page.ok()) {
    spdlog::warn("stats page: {}; tierkv-admin reads stats over the socket",
                 stats_page.status().ToString());
  }
  auto impl = std::make_unique<Impl>(
      options, std::move(store_lock), std::move(socket_lock), std::move(tiered),
      stats_page.ok() ? std::optional(std::move(*stats_page)) : std::nullopt);

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
  impl->reaper = std::thread([raw] { raw->Reap(); });
  impl->stats_thread = std::thread([raw] { raw->PublishStats(); });
  spdlog::info(
      "tierkvd serving store '{}' on {}: model {}, layout {}, {} host slots "
      "of {} bytes; version {}",
      options.store, options.socket_path, ModelDisplayName(options.model),
      options.layout.ToString(), slots - 1, slot_bytes, Version());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::Stop() {
  Impl& s = *impl_;
  MutexLock guard(&s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.stopping.store(true);
  const char byte = 1;
  if (write(s.wake_pipe[1], &byte, 1) < 0) {
    // The listener also polls with a timeout; it will notice.
  }
  if (s.listener.joinable()) s.listener.join();
  while (!s.connections.empty()) s.Close(s.connections.begin()->first);
  {
    MutexLock reap(&s.reap_mu);
    s.reaper_stop = true;
    s.reap_wake.NotifyAll();
  }
  if (s.reaper.joinable()) s.reaper.join();  // Once every session is reaped.
  {
    std::lock_guard<std::mutex> wake(s.stats_wake_mu);
    s.stats_wake.notify_all();
  }
  if (s.stats_thread.joinable()) s.stats_thread.join();
  s.stats_page.reset();  // Removes the page: no stale stats after a stop.
  // Spills already started finish; then what is on disk is durable.
  if (Status flushed = s.store->Flush(); !flushed.ok()) {
    spdlog::error("disk tier: flush on stop failed: {}", flushed.ToString());
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
int32_t Server::host_slots() const { return impl_->store->host().num_slots(); }

CoordinatorStats Server::stats() const { return impl_->store->stats(); }

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
  TIERKV_RETURN_IF_ERROR(s.store->CheckProgress(timeout, kStalledAfter));
  // After the mutex, which the stats thread waits for: a stuck mutex is the
  // better name for that. It beats once per snapshot and sleeps an interval
  // between them.
  return stalled("the stats thread", s.stats_heartbeat,
                 s.options.stats_interval);
}

void Server::Impl::PublishStats() {
  bool warned = false;
  while (!stopping.load()) {
    stats_heartbeat.Beat();
    CoordinatorStats snapshot;
    { snapshot = store->stats(); }
    // Encoding and copying happen outside the coordinator's mutex.
    if (!stats_page.has_value()) {
      // No page: the heartbeat still says this thread goes round.
    } else if (Status s = stats_page->Publish(snapshot,
                                              std::chrono::system_clock::now());
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

}  // namespace tierkv::ipc
