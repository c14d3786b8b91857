// tierkvd's Server: its options checked, Start and Stop, the accessors and
// CheckProgress, and the tier and stats threads. The socket is in
// server_listener.cc, tierkv-admin's orders in server_admin.cc.
#include "ipc/server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "ipc/server_impl.h"
#include "tierkv/version.h"
#include "tiers/remote_tier.h"

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

// Whether this process may chown a file it owns to `group`: root, or a
// member of it.
bool MayGiveToGroup(gid_t group) {
  if (geteuid() == 0 || getegid() == group) return true;
  const int n = getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = getgroups(n, groups.data());
  return got > 0 && std::ranges::find(groups.begin(), groups.begin() + got,
                                      group) != groups.begin() + got;
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
  // RocksDB makes the directory itself but not its parents: a typo in the
  // parent would otherwise surface as an I/O error.
  const std::filesystem::path dir =
      std::filesystem::path(options.disk_path).lexically_normal();
  const std::filesystem::path parent =
      dir.has_filename() ? dir.parent_path() : dir.parent_path().parent_path();
  std::error_code error;
  if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
    const bool unreadable = error &&
                            error != std::errc::no_such_file_or_directory &&
                            error != std::errc::not_a_directory;
    return Status::InvalidArgument(
        "--disk-dir " + options.disk_path + ": its parent directory " +
        parent.string() +
        (unreadable ? " cannot be read (" + error.message() + ")"
                    : " does not exist") +
        "; create it first (tierkvd creates only the last directory)");
  }
  DiskTierOptions disk{
      .storage = DiskStorageOptions(options),
      .capacity_bytes = options.disk_capacity_bytes,
      .eviction = options.eviction,
      .layout_fingerprint = StoreFingerprint(options.layout, options.model),
      .reset = options.disk_reset,
      .on_degraded = LogDegraded,
      .block_bytes = options.layout.BlockBytes(),
      .element_bytes = static_cast<int32_t>(options.layout.ElementSize()),
      .codec = options.disk_codec,
      .io_threads = options.disk_io_threads,
      .cancelled = options.cancelled,
      .cache_events = options.cache_events,
      .block_size = options.layout.block_size};
  // --disk-capacity counts what RocksDB writes besides the blocks, and
  // leaves room for at least one block's value (header included).
  const uint64_t reserve = RocksDbReservedBytes(disk.storage);
  const uint64_t value =
      DiskValueBytes(disk.block_bytes, disk.layout_fingerprint.size(),
                     static_cast<size_t>(options.layout.block_size));
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (options.disk_capacity_bytes < reserve + value) {
    const uint64_t minimum_mib = (reserve + value + kMiB - 1) / kMiB;
    return Status::InvalidArgument(
        "--disk-capacity " + std::to_string(options.disk_capacity_bytes) +
        " bytes is too small: RocksDB's log and memtables take " +
        std::to_string(reserve) + " bytes of it and one block's value " +
        std::to_string(value) + " bytes; give --disk-capacity at least " +
        std::to_string(minimum_mib) + "M");
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
      "disk tier: {} blocks, {} of {} bytes, evicting in {} order; dropped "
      "{} bad values ({} of another layout or model)",
      stats.keys, stats.bytes, stats.capacity_bytes,
      EvictionPolicyName(options.eviction), stats.dropped_on_open,
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

// Opens the remote tier --remote-redis asks for, over the store's host
// slots.
std::function<StatusOr<std::unique_ptr<LowerTier>>(
    std::function<std::span<std::byte>(BlockId)>)>
RemoteTierFactory(const ServerOptions& options) {
  RemoteTierOptions remote;
  remote.redis.seeds = options.remote_redis;
  remote.store_fingerprint = StoreFingerprint(options.layout, options.model);
  remote.tenant = options.remote_tenant;
  remote.block_bytes = options.layout.BlockBytes();
  remote.ttl = options.remote_ttl;
  remote.capacity_bytes = options.remote_capacity_bytes;
  remote.scan_interval = options.remote_scan_interval;
  remote.cache_events = options.cache_events;
  remote.block_size = options.layout.block_size;
  return [remote](std::function<std::span<std::byte>(BlockId)> slot_memory)
             -> StatusOr<std::unique_ptr<LowerTier>> {
    RemoteTierOptions o = remote;
    o.slot_memory = std::move(slot_memory);
    spdlog::info("remote tier: Redis Cluster {}, tenant {}", o.redis.seeds,
                 o.tenant);
    StatusOr<std::unique_ptr<RemoteTier>> tier = RemoteTier::Open(o);
    if (!tier.ok()) {
      return Status(tier.status().code(), "remote tier (--remote-redis " +
                                              o.redis.seeds +
                                              "): " + tier.status().message());
    }
    return std::unique_ptr<LowerTier>(std::move(*tier));
  };
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
  return Status::InvalidArgument(
      "--socket " + socket_path + ": cannot use directory " + dir + " (" + why +
      "); create it, set XDG_RUNTIME_DIR to a directory of your own, or "
      "pass --socket");
}

// The first number in `path` (a one-line file of /proc or /sys); nullopt
// when it cannot be read or holds none ("max").
std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

// MemAvailable in /proc/meminfo, in bytes.
std::optional<uint64_t> MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  constexpr std::string_view kKey = "MemAvailable:";
  while (std::getline(in, line)) {
    if (!line.starts_with(kKey)) continue;
    // "MemAvailable:   22737688 kB"
    return std::strtoull(line.c_str() + kKey.size(), nullptr, 10) << 10;
  }
  return std::nullopt;
}

// The machine's physical memory (sysinfo(2)), in bytes: the bound where
// /proc/meminfo cannot be read (systemd's ProcSubset=pid hides it).
std::optional<uint64_t> PhysicalMemory() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return std::nullopt;
  return uint64_t{si.totalram} * si.mem_unit;
}

// The room left under this process's memory cgroup limit (cgroup v2's
// memory.max or v1's memory.limit_in_bytes), in bytes; nullopt without a
// limit. Looked up by the path /proc/self/cgroup gives, then at the root
// of the mount (inside a cgroup namespace, the process's own).
std::optional<uint64_t> CgroupRoom() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::vector<std::pair<std::string, std::string>> tries;  // limit, usage
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (controllers.empty()) {  // v2
      for (const std::string& dir :
           {"/sys/fs/cgroup" + path, std::string("/sys/fs/cgroup")}) {
        tries.emplace_back(dir + "/memory.max", dir + "/memory.current");
      }
    } else if (controllers == "memory") {  // v1
      for (const std::string& dir : {"/sys/fs/cgroup/memory" + path,
                                     std::string("/sys/fs/cgroup/memory")}) {
        tries.emplace_back(dir + "/memory.limit_in_bytes",
                           dir + "/memory.usage_in_bytes");
      }
    }
  }
  for (const auto& [limit_path, usage_path] : tries) {
    const std::optional<uint64_t> limit = ReadNumber(limit_path);
    if (!limit.has_value()) continue;
    // v1 says "no limit" with a page-rounded LONG_MAX.
    if (*limit >= (uint64_t{1} << 62)) return std::nullopt;
    const uint64_t usage = ReadNumber(usage_path).value_or(0);
    return *limit > usage ? *limit - usage : 0;
  }
  return std::nullopt;
}

std::string Mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

Status CheckHostMemory(size_t bytes) {
  const std::optional<uint64_t> available = MemAvailable();
  // 0: not looked at (MemAvailable was read) or unknown.
  const uint64_t physical =
      available.has_value() ? 0 : PhysicalMemory().value_or(0);
  const std::optional<uint64_t> room = CgroupRoom();
  std::string over;
  if (available.has_value() && bytes > *available) {
    over = Mib(*available) + " available (MemAvailable in /proc/meminfo)";
  } else if (physical > 0 && bytes > physical) {
    over = Mib(physical) +
           " of physical memory (sysinfo; /proc/meminfo cannot be read)";
  } else if (room.has_value() && bytes > *room) {
    over = Mib(*room) + " left under this process's memory cgroup limit";
  }
  if (over.empty()) return Status::Ok();
  return Status::ResourceExhausted(
      "--host-capacity of " + Mib(bytes) + " is more than the " + over +
      "; lower --host-capacity (the host tier is reserved whole at start)");
}

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

namespace {

// A stop's last duty to the disk tier: the host blocks go down to it, and
// everything written (spills started before too) is made durable. Both run
// whatever the other did; the first error wins.
Status SpillAndFlush(TieredStore& store, std::chrono::milliseconds spill_time) {
  if (store.disk() == nullptr) return Status::Ok();
  const int64_t host_blocks = store.stats().host.cached_slots;
  spdlog::info("disk tier: spilling {} host blocks before stopping",
               host_blocks);
  Status spilled = store.SpillAll(spill_time);
  // Waits for every spill still queued, past the deadline too.
  Status flushed = store.Flush();
  if (spilled.code() == StatusCode::kDeadlineExceeded && flushed.ok()) {
    // Slow, not failed: what the flush waited for may have been the rest.
    if (const int64_t left = store.HostOnlyBlocks(); left == 0) {
      spdlog::info("disk tier: the spill finished during the final flush");
      spilled = Status::Ok();
    } else {
      spilled = Status::Unavailable(
          std::to_string(left) +
          " host blocks are not on disk: " + spilled.message());
    }
  }
  if (!spilled.ok()) {
    spdlog::error("disk tier: spill on stop failed: {}", spilled.ToString());
  }
  if (!flushed.ok()) {
    spdlog::error("disk tier: flush on stop failed: {}", flushed.ToString());
  }
  return !spilled.ok() ? spilled : flushed;
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { (void)Stop(); }

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
  if (options.group.has_value() && !MayGiveToGroup(*options.group)) {
    return Status::PermissionDenied(
        "--group " + std::to_string(*options.group) +
        ": tierkvd's user is not in that group, so it cannot give the "
        "socket to it; add the user to the group (the systemd unit: "
        "SupplementaryGroups=) or pick one of its groups");
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
    return Status::InvalidArgument(
        "--host-capacity of " + std::to_string(options.host_capacity_bytes) +
        " bytes holds fewer than 2 blocks of " + std::to_string(slot_bytes) +
        " bytes (this layout's block; one slot is reserved)");
  }
  // Before anything is taken: a host tier larger than the memory left
  // would otherwise be reserved until the machine runs out.
  TIERKV_RETURN_IF_ERROR(
      CheckHostMemory(static_cast<size_t>(slots) * slot_bytes));
  // One lock per name tierkvd claims: the store (its segments) and the
  // socket path. Held, they make whatever is left under those names stale.
  TIERKV_RETURN_IF_ERROR(CheckSocketDirectory(options.socket_path));
  TIERKV_ASSIGN_OR_RETURN(
      StoreLock store_lock,
      StoreLock::Acquire(StoreLockPath(options.store, options.socket_path)));
  TIERKV_ASSIGN_OR_RETURN(StoreLock socket_lock,
                          StoreLock::Acquire(options.socket_path + ".lock"));
  if (options.locked) TIERKV_RETURN_IF_ERROR(options.locked());
  std::unique_ptr<DiskTier> disk;
  if (!options.disk_path.empty()) {
    TIERKV_ASSIGN_OR_RETURN(disk, OpenDisk(options));
  }
  // Reserving takes about a third of a second per GiB.
  spdlog::info("host tier: reserving {} MiB for {} slots",
               (static_cast<size_t>(slots) * slot_bytes) >> 20, slots - 1);
  TieredStoreOptions store;
  store.layout = options.layout;
  store.model = options.model;
  store.host = {
      .shared = true,
      .max_segments = options.max_tenants,
      .num_slots = slots,
      .slot_bytes = slot_bytes,
      .layout_fingerprint = StoreFingerprint(options.layout, options.model),
      .cancelled = options.cancelled};
  store.disk = std::move(disk);
  if (!options.remote_redis.empty()) {
    store.remote = RemoteTierFactory(options);
    if (store.disk != nullptr) {
      spdlog::info("remote tier: {} the disk tier",
                   options.remote_placement == RemotePlacement::kUnder
                       ? "under (it takes what the disk evicts)"
                       : "beside (spills are written to both)");
    }
  }
  store.remote_placement = options.remote_placement;
  store.spill_high = options.spill_high;
  store.spill_low = options.spill_low;
  store.write_behind_spills = options.write_behind_spills;
  store.eviction = options.eviction;
  store.caps = options.caps;
  store.verify_on_load = options.verify_on_load;
  store.cache_events = options.cache_events;
  // Keys at debug level, so that an operator can evict a block by name.
  store.block_trace = [trace = options.block_trace](
                          const char* what, const BlockKey& key, BlockId slot) {
    if (trace) trace(what, key, slot);
    if (!spdlog::should_log(spdlog::level::debug)) return;
    spdlog::debug("block {}: {} (host slot {})", key.ToHex(), what, slot);
  };
  auto ready_signals = std::make_shared<ReadySignals>();
  // The store holds a reference: its tier thread may signal until the
  // store is gone, after the server's own.
  store.loads_ready = [signals = ready_signals](WorkerId worker) {
    signals->Signal(worker);
  };
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> tiered,
                          TieredStore::Open(std::move(store)));
  // Without a page (its name taken by another user's file, /dev/shm
  // full), tierkv-admin reads stats over the socket: not a reason to stop.
  // The page lists every user's workers, so only those who operate read
  // it (tierkvd's user, root, --admin-group); other members of --group ask
  // the socket, which shows them their own workers only.
  StatsPageOptions page{.name = StatsPageName(options.store),
                        .socket_path = options.socket_path,
                        .max_workers = options.max_workers,
                        .mode = static_cast<mode_t>(options.mode & 0400),
                        .group = std::nullopt,
                        .interval = options.stats_interval};
  StatsPageOptions admins = page;
  if (options.admin_group.has_value()) {
    admins.mode = static_cast<mode_t>(options.mode & 0440);
    admins.group = options.admin_group;
  }
  StatusOr<StatsPageWriter> stats_page = StatsPageWriter::Create(admins);
  if (options.admin_group.has_value() &&
      stats_page.status().code() == StatusCode::kPermissionDenied) {
    // tierkvd's user is not in --admin-group.
    spdlog::warn("stats page: {}; only tierkvd's user and root read it",
                 stats_page.status().ToString());
    stats_page = StatsPageWriter::Create(page);
  }
  if (!stats_page.ok()) {
    spdlog::warn("stats page: {}; tierkv-admin reads stats over the socket",
                 stats_page.status().ToString());
  }
  auto impl = std::make_unique<Impl>(
      options, std::move(store_lock), std::move(socket_lock), std::move(tiered),
      std::move(ready_signals),
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
    const int err = errno;
    Status s = Errno("set permissions of " + options.socket_path);
    unlink(options.socket_path.c_str());  // Nobody may attach to it.
    if (err == EPERM || err == EACCES)
      return Status::PermissionDenied(s.message());
    return s;
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

Status Server::Stop(std::chrono::milliseconds spill_time) {
  Impl& s = *impl_;
  MutexLock guard(&s.stop_mu);
  if (s.stopped) return Status::Ok();
  s.stopped = true;
  s.stopping.store(true);
  const char byte = 1;
  if (write(s.wake_pipe[1], &byte, 1) < 0) {
    // The listener also polls with a timeout; it will notice.
  }
  if (s.listener.joinable()) s.listener.join();
  // Every session stops serving before any is closed: closing one drops
  // its worker (pins, chunk leases), and a session still serving could
  // answer what that drop freed, a lease handed over mid-stop, with a
  // request served after the stop began.
  for (auto& [fd, connection] : s.connections) {
    if (connection.session) connection.session->StopServing();
  }
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
  const Status result = SpillAndFlush(*s.store, spill_time);
  if (s.listen_fd >= 0) close(s.listen_fd);
  for (int fd : s.wake_pipe) {
    if (fd >= 0) close(fd);
  }
  unlink(s.options.socket_path.c_str());
  // The names go last, so no other tierkvd takes them while this one still
  // has its socket.
  s.socket_lock.Release();
  s.store_lock.Release();
  spdlog::info("tierkvd stopped serving store '{}'", s.options.store);
  return result;
}

const std::string& Server::socket_path() const {
  return impl_->options.socket_path;
}
int32_t Server::host_slots() const { return impl_->store->host().num_slots(); }

CoordinatorStats Server::stats() const { return impl_->Stats(); }

CoordinatorStats Server::Impl::Stats() const {
  CoordinatorStats out = store->stats();
  out.store = options.store;
  AttachStats& a = out.attach;
  a.attached = attached.load(std::memory_order_relaxed);
  a.detached = detached.load(std::memory_order_relaxed);
  a.refused_access = refused_access.load(std::memory_order_relaxed);
  a.refused_mismatch = refused_mismatch.load(std::memory_order_relaxed);
  a.refused_limit = refused_limit.load(std::memory_order_relaxed);
  a.refused_malformed = refused_malformed.load(std::memory_order_relaxed);
  a.refused = a.refused_access + a.refused_mismatch + a.refused_limit +
              a.refused_malformed;
  return out;
}

CoordinatorStats Server::Impl::StatsSeenBy(uint32_t uid, bool operates) const {
  CoordinatorStats out = Stats();
  if (!operates) KeepWorkersOfUid(uid, &out);
  return out;
}

void Server::Impl::CountRefusal(StatusCode code) {
  std::atomic<uint64_t>* counter = &refused_malformed;
  if (code == StatusCode::kPermissionDenied) {
    counter = &refused_access;
  } else if (code == StatusCode::kFailedPrecondition) {
    counter = &refused_mismatch;
  } else if (code == StatusCode::kResourceExhausted) {
    counter = &refused_limit;
  }
  counter->fetch_add(1, std::memory_order_relaxed);
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
  TIERKV_RETURN_IF_ERROR(s.store->CheckProgress(timeout, kStalledAfter));
  // After the mutex, which the stats thread waits for: a stuck mutex is the
  // better name for that. It beats once per snapshot and sleeps an interval
  // between them.
  return stalled("the stats thread", s.stats_heartbeat,
                 s.options.stats_interval);
}

void Server::Impl::PublishStats() {
  bool warned = false;
  bool reserve_warned = false;
  while (!stopping.load()) {
    stats_heartbeat.Beat();
    CoordinatorStats snapshot;
    { snapshot = Stats(); }
    if (snapshot.host.slot_reserve_failures > 0 && !reserve_warned) {
      // Once: each later one is counted (slot_reserve_failures).
      spdlog::warn(
          "host tier: the memory of a slot could not be reserved in a "
          "tenant's segment ({} so far); those blocks are not stored or "
          "promoted. The machine or tierkvd's memory cgroup is short of "
          "memory",
          snapshot.host.slot_reserve_failures);
      reserve_warned = true;
    }
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
