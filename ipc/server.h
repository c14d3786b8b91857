// Server: tierkvd's process-level machinery around the Coordinator. It holds
// the store lock, opens the disk tier (rebuilding its index, with progress in
// the log), creates the host tier segment, listens on the Unix socket
// (registration, liveness, tierkv-admin) with one thread that never waits
// on a peer, and runs one session thread per attached worker that serves
// the worker's shared-memory control channel, a reaper thread that retires
// the sessions of workers that left, a tier thread that applies finished
// spills and promotions, and a stats thread that publishes a snapshot to
// the stats page every stats_interval.
// Thread-safety: Start/Stop/stats/CheckProgress from any thread. Internally
// the coordinator is guarded by one mutex that only tierkvd's own threads
// take; a worker never holds anything the server waits for.
#ifndef TIERKV_IPC_SERVER_H_
#define TIERKV_IPC_SERVER_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ipc/channel.h"
#include "src/coordinator.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/kv_layout.h"
#include "tierkv/status.h"
#include "tiers/disk_tier.h"
#include "tiers/tiered_store.h"

namespace tierkv::ipc {

struct ServerOptions {
  // Names the stats page (/tierkv.<store>.stats) and the lock file; the
  // host and channel segments have no names (sealed memfds).
  // [A-Za-z0-9_-], 1..64 characters. Default: "default".
  std::string store = "default";
  // Default (empty): DefaultSocketPath(store).
  std::string socket_path;
  // Bytes of host DRAM for KV slots; rounded down to whole blocks.
  // Default: 1 GiB.
  size_t host_capacity_bytes = size_t{1} << 30;
  KvLayout layout;  // Required: the one layout this store serves.
  // The one model this store serves (ValidateModelName): only workers of
  // this model attach, and its keys, host segment and disk values are in
  // StoreFingerprint(layout, model). Default: "" (the unnamed model).
  std::string model = {};
  // Permission bits of the socket and the stats page. Default: 0600.
  mode_t mode = 0600;
  // Workers whose primary or supplementary groups include this one may
  // attach and read stats too. Requires mode to give the group read and
  // write (e.g. 0660): Start refuses it otherwise.
  std::optional<gid_t> group;
  // Peers of this group (primary or supplementary) may also give operator
  // orders (tierkv-admin clear, evict), and read stats. The socket's mode
  // and group must still let them connect (make them members of `group`
  // too). Default: none; only tierkvd's user and root may.
  std::optional<gid_t> admin_group;
  // The disk tier: a RocksDB directory (created if missing) under the host
  // slots. Default (empty): none; blocks evicted from host are gone.
  std::string disk_path;
  // Bound on the disk tier's bytes on disk (evicting as `eviction` says):
  // its values and what RocksDB writes besides (write-ahead log, memtables,
  // about 1/8 of it). At least 4 MiB. Default: 16 GiB.
  uint64_t disk_capacity_bytes = uint64_t{16} << 30;
  // Start with an empty disk tier when the one at disk_path holds another
  // model's or layout's blocks, or RocksDB cannot open it; without it
  // tierkvd refuses to start, naming both. A usable store is kept either
  // way. Default: false.
  bool disk_reset = false;
  // How blocks are stored on disk. Default: none (see DiskTierOptions).
  DiskCodec disk_codec = DiskCodec::kNone;
  // The disk tier's I/O threads (DiskTierOptions::io_threads), 1 to 64.
  // Default: 2.
  int32_t disk_io_threads = 2;
  // The remote tier (tiers/remote_tier.h) on a Redis Cluster that several
  // tierkvds share: its seeds, "host:port,host:port,...". With disk_path
  // too, it sits beside or under the disk tier (remote_placement) and
  // promotions read disk first (TieredStoreOptions::remote). Default
  // (empty): none.
  std::string remote_redis;
  // With disk_path: spills written to both tiers (kBeside), or to disk only
  // with the disk tier's evictions going on to the remote tier (kUnder).
  // Default: kBeside.
  RemotePlacement remote_placement = RemotePlacement::kBeside;
  // Expiry of each value written there; 0: none. Default: none.
  std::chrono::milliseconds remote_ttl{0};
  // Bound on the value bytes this tierkvd keeps there (LRU over the blocks
  // it wrote); 0: none. Default: none.
  uint64_t remote_capacity_bytes = 0;
  // Part of every Redis key: tierkvds share blocks only within one tenant
  // (and one model and layout). Default: "default".
  std::string remote_tenant = "default";
  // Between scans of the cluster for blocks other tierkvds wrote
  // (RemoteTierOptions::scan_interval); 0: none. Default: 1 s.
  std::chrono::milliseconds remote_scan_interval{1000};
  // Host watermarks for spilling to disk (CoordinatorOptions). Defaults:
  // 0.9 and 0.7.
  double spill_high = 0.9;
  double spill_low = 0.7;
  // Write-behind copies to disk in flight at most (TieredStoreOptions::
  // write_behind_spills); 0 turns write-behind off. Default: 16.
  int32_t write_behind_spills = 16;
  // The host and disk tiers' eviction policy (TieredStoreOptions::eviction,
  // DiskTierOptions::eviction). Default: kDefaultTierEviction.
  EvictionPolicy eviction = kDefaultTierEviction;
  uint32_t max_workers = 64;  // Default: 64.
  // Tenants (ClientOptions::tenant) this store holds host segments for
  // (past it, a new tenant takes the segment of the one idle longest:
  // CoordinatorOptions::max_tenants). Each
  // gets a host segment of its own, mapped by its workers alone; a slot's
  // memory is in one of them at a time, so RAM use stays that of the host
  // capacity, but a worker can fault in up to the whole capacity in its
  // own tenant's segment (charged to that worker's memory). 1..
  // kMaxTenants. Default: 16.
  uint32_t max_tenants = 16;
  // Per-worker caps (WorkerCaps, src/coordinator.h). Defaults: a share of
  // 0.5 of the host slots, 0.75 for all the workers of one uid (operators'
  // apart), 4096 requests, 256 MiB of request state, 4096 events in
  // flight, 64 workers per uid.
  WorkerCaps caps = {.uid_pin_share = 0.75};
  // Check each host block's checksum (taken when its store completed)
  // before a load of it is handed to a worker, as well as before it is
  // spilled (always): a block a worker changed since is a miss, dropped.
  // Default: false.
  bool verify_on_load = false;
  // Also called with each block the host tier gains or loses
  // (CoordinatorOptions::block_trace), with the store's mutex held; tierkvd
  // logs them at debug level either way. Default: none.
  std::function<void(const char* what, const BlockKey& key, BlockId slot)>
      block_trace = {};
  // Told of every block the host and disk tiers start or stop serving
  // (CoordinatorOptions::cache_events, DiskTierOptions::cache_events): the
  // disk tier's blocks found at start included. Not owned; must outlive the
  // server. Default: none.
  CacheEventSink* cache_events = nullptr;
  // Called once Start holds the store's and the socket's locks, before any
  // tier is opened; an error ends the start with it. Default: none.
  std::function<Status()> locked = {};
  uint32_t channel_bytes = kDefaultChannelBytes;  // Per direction.
  // Socket connections not registered as workers (workers about to
  // register, tierkv-admin's calls, peers that never will) open at once:
  // past it, a new connection closes the one idle longest. 0: 4 ×
  // max_workers + 16. Default: 0.
  uint32_t max_pending_connections = 0;
  // An unregistered connection closes once it has gone this long without a
  // request answered; a registered worker's may idle (it is its liveness).
  // 10 ms..10 min. Default: 5 s.
  std::chrono::milliseconds pending_timeout{5000};
  // Between snapshots in the stats page (ipc/stats_page.h). 10 ms..60 s.
  // Default: 100 ms.
  std::chrono::milliseconds stats_interval{100};
  // Checked by Start's long steps between units of their work (each
  // 64 MiB of host memory reserved, each record of the disk tier's index
  // rebuild): once it says true, Start undoes what it did and returns
  // Unavailable. tierkvd sets it on SIGTERM, and tells systemd from it that
  // the start is still making progress. Default: never.
  std::function<bool()> cancelled = {};
};

// The most a Server::Stop spends spilling host blocks by default.
inline constexpr std::chrono::milliseconds kDefaultStopSpillTime{7500};

// OK when `bytes` of host tier fit in the memory this process may take:
// MemAvailable in /proc/meminfo (where it cannot be read, as under
// systemd's ProcSubset=pid, the machine's physical memory), and the room
// left under its memory cgroup's limit (v2 memory.max, v1
// memory.limit_in_bytes) when one is set. ResourceExhausted giving the
// number and naming --host-capacity otherwise.
Status CheckHostMemory(size_t bytes);

// The tenant a worker of `uid` that asked for `tenant` is put in. A name is
// only a claim, so another user's worker is confined to tenants of its
// own: "uid<uid>/<tenant>". Its keys, host segment and disk values can then
// never be another user's, across restarts too. Workers of tierkvd's own
// user and root get the tenant they name.
std::string EffectiveTenant(const std::string& tenant, uid_t uid);

// Where tierkvd's socket goes without XDG_RUNTIME_DIR (never /tmp, where
// another user could put a socket of their own in its place).
inline constexpr char kSystemRuntimeDir[] = "/run/tierkv";

// "$XDG_RUNTIME_DIR/tierkv-<store>.sock", or
// "/run/tierkv/tierkv-<store>.sock" without XDG_RUNTIME_DIR.
std::string DefaultSocketPath(const std::string& store);

// The lock file that claims a store name for the tierkvd serving it:
// "tierkv-<store>.store-lock" in the socket's directory, which only its
// user should be able to write. (The stats page, global, checks for a live
// publisher itself.)
std::string StoreLockPath(const std::string& store,
                          const std::string& socket_path);

// The most tenants one store may serve (ServerOptions::max_tenants).
inline constexpr uint32_t kMaxTenants = 1024;

class Server {
 public:
  // AlreadyExists when a live tierkvd already serves the store;
  // InvalidArgument for bad options; ResourceExhausted when the host
  // capacity does not fit in memory (CheckHostMemory) or cannot be
  // reserved; Unavailable when options.cancelled said to stop; the failing
  // step's Status otherwise.
  static StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Stop(), its Status dropped.

  // Stops accepting and disconnects workers (dropping their pins); spills
  // every host block the disk tier does not hold yet, for at most
  // `spill_time` (TieredStore::SpillAll); lets the disk tier finish its
  // writes and syncs it; joins every thread and removes the socket, its
  // lock files and the stats page. The stop completes either way; the
  // Status says whether the host tier's blocks are all on disk and durable:
  // the spill's or the flush's error otherwise. Idempotent (a second call
  // returns OK at once); thread-safe.
  Status Stop(std::chrono::milliseconds spill_time = kDefaultStopSpillTime);

  const std::string& socket_path() const;
  int32_t host_slots() const;
  CoordinatorStats stats() const;

  // OK while the server makes progress: its listener, stats (and tier) threads
  // have gone round their loops in the last 10 s, and the coordinator's
  // mutex can be taken within `timeout`. Unavailable naming what is stuck
  // otherwise. For a watchdog; meaningful only between Start and Stop.
  Status CheckProgress(std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SERVER_H_
