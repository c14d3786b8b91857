// TieredStore: one store's tiers and the coordinator that drives them, owned
// together: the host tier (shared-memory or private slots), the disk tier
// and a remote tier under it (each optional), the coordinator (index, ref
// counts, LRU, transfer events) and the tier thread that applies the lower
// tiers' finished spills and promotions. tierkvd serves one (ipc/server.h); an
// embedded client (tierkv/embedded.h) runs one in the engine's process; tests
// open their own. Teardown happens in one place, in one order (see
// ~TieredStore). Thread-safety: every method may be called from any thread. The
// coordinator is reached only through WithCoordinator, under the store's
// mutex.
#ifndef TIERKV_TIERS_TIERED_STORE_H_
#define TIERKV_TIERS_TIERED_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "ipc/unique_fd.h"
#include "src/coordinator.h"
#include "src/heartbeat.h"
#include "src/lower_tier.h"
#include "src/mutex.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/kv_layout.h"
#include "tierkv/stats.h"
#include "tierkv/status.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace tierkv {

// Where a remote tier sits when the store has a disk tier too.
enum class RemotePlacement {
  // Beside the disk tier: each spill is written to both, so another machine
  // can load a block as soon as this one spills it from host.
  kBeside,
  // Under the disk tier: spills go to disk only, and the blocks the disk
  // tier evicts for room go on to the remote tier (LowerTier::Demote), so
  // the shared tier holds what this machine's disk gave up and takes only
  // that traffic.
  kUnder,
};

struct TieredStoreOptions {
  KvLayout layout;  // Required: the one layout the store serves.
  // The one model it serves (ValidateModelName). Default: "" (unnamed).
  std::string model = {};
  // The host slots. num_slots is required (>= 2, the null slot included);
  // slot_bytes and layout_fingerprint are the layout's and the store's and
  // are filled in when left empty. shared: one sealed segment per tenant,
  // up to max_segments tenants; otherwise private memory for all.
  HostTierOptions host;
  // The disk tier under the host slots, opened by the caller (its rebuild
  // can take long and report progress). Default: none, a block evicted from
  // host is gone.
  std::unique_ptr<DiskTier> disk = nullptr;
  // Opens the remote tier (tiers/remote_tier.h) once the host slots exist,
  // given the memory of each host slot; a factory, so that this library
  // does not link the Redis client. Alone, it is the coordinator's lower
  // tier. With a disk tier, the two are stacked as remote_placement says:
  // a promotion reads disk first and the remote tier when disk misses or
  // fails, Contains is either's, Remove and RemoveAll go to both. Default:
  // none.
  std::function<StatusOr<std::unique_ptr<LowerTier>>(
      std::function<std::span<std::byte>(BlockId)> slot_memory)>
      remote = {};
  // Beside: a spill is written to both tiers (done once both are, OK when
  // either is). Under: a spill is written to disk only, and each block the
  // disk tier evicts for room is written to the remote tier unless it holds
  // the block already. Only with both tiers. Default: kBeside.
  RemotePlacement remote_placement = RemotePlacement::kBeside;
  // Spill watermarks (CoordinatorOptions). Defaults: 0.9 and 0.7.
  double spill_high = 0.9;
  double spill_low = 0.7;
  // Write-behind copies to the disk tier in flight at most
  // (CoordinatorOptions::write_behind_spills); 0 turns write-behind off.
  // Default: 16, enough to keep the disk tier's I/O threads busy while
  // leaving promotions a short queue.
  int32_t write_behind_spills = 16;
  // Which block the host tier evicts first (CoordinatorOptions::
  // host_eviction). Default: kDefaultTierEviction.
  EvictionPolicy eviction = kDefaultTierEviction;
  // The coordinator's clock (CoordinatorOptions::clock). Default: steady.
  std::function<std::chrono::steady_clock::time_point()> clock = {};
  // Per-worker caps (WorkerCaps, src/coordinator.h). Defaults: a share of
  // 0.5 of the host slots, 4096 requests, 256 MiB of request state, 4096
  // events in flight, 64 workers per uid.
  WorkerCaps caps = {};
  // Keep an XXH3-64 checksum of each host block when its store completes
  // (taken outside the store's mutex, see Complete) or its promotion
  // lands, and check it before the block is spilled: a block whose bytes a
  // worker changed since is dropped, never written to disk
  // (corrupt_slots_dropped). Default: true.
  bool slot_checksums = true;
  // Also check it before a load of the block is handed to a worker
  // (CoordinatorOptions::verify_on_load): a mismatch is a miss. Costs one
  // checksum of each block loaded, under the store's mutex. Needs
  // slot_checksums. Default: false.
  bool verify_on_load = false;
  // Each block the host tier gains or loses, by key
  // (CoordinatorOptions::block_trace). Default: none.
  std::function<void(const char* what, const BlockKey& key, BlockId slot)>
      block_trace = {};
  // A worker's pending loads became ready (CoordinatorOptions::
  // loads_ready): called with the store's mutex held. Default: none.
  std::function<void(WorkerId)> loads_ready = {};
  // The host tier's block events (CoordinatorOptions::cache_events); the
  // disk tier reports its own (DiskTierOptions::cache_events). Default:
  // none.
  CacheEventSink* cache_events = nullptr;
  // Run the tier thread that applies the disk tier's results as they come.
  // False: they wait until the owner applies them (Lock()->PumpLowerTier(),
  // WaitIdle, Flush), so a test can hold spills and promotions in flight
  // at a point of its choosing. Default: true.
  bool tier_thread = true;
};

class TieredStore {
 public:
  // InvalidArgument for bad options; the failing tier's Status otherwise.
  static StatusOr<std::unique_ptr<TieredStore>> Open(
      TieredStoreOptions options);
  // Stops the tier thread, lets the disk tier finish and sync its writes
  // and applies their results, then closes the disk tier (which waits for
  // its I/O into host slots), the coordinator and the host tier, in that
  // order.
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // Runs fn(Coordinator&) with the store's mutex held and returns what it
  // returns. fn must not call back into the store.
  template <typename F>
  decltype(auto) WithCoordinator(F&& fn) TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return std::forward<F>(fn)(*coordinator_);
  }

  // The coordinator with the store's mutex held for as long as the
  // returned object lives, e.g. for one call: store.Lock()->Lookup(...).
  // Never hold two at once on one thread (the mutex is not recursive).
  class Locked {
   public:
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    ~Locked() TIERKV_NO_THREAD_SAFETY_ANALYSIS { store_->mu_.Unlock(); }
    Coordinator* operator->() const TIERKV_NO_THREAD_SAFETY_ANALYSIS {
      return &*store_->coordinator_;
    }
    Coordinator& operator*() const { return *operator->(); }

   private:
    friend class TieredStore;
    explicit Locked(TieredStore* store) TIERKV_NO_THREAD_SAFETY_ANALYSIS
        : store_(store) {
      store_->mu_.Lock();
    }
    TieredStore* store_;
  };
  Locked Lock() { return Locked(this); }

  // Waits until the disk tier has nothing in flight: every spill and
  // promotion started (including the spills the host's watermark calls for
  // now) has finished and its result is applied; then true. False when
  // that has not happened within `timeout`. Lookups and stats then see a
  // settled store. True at once without a disk tier. Without a tier thread
  // it applies the results itself.
  bool WaitIdle(std::chrono::milliseconds timeout) TIERKV_EXCLUDES(mu_);

  // Coordinator::Complete, with the checksums of finished stores' slots
  // taken outside the store's mutex (the slots stay pinned for the events
  // until they are applied), so other workers' calls do not wait for them.
  Status Complete(WorkerId worker, std::span<const CompletedEvent> events)
      TIERKV_EXCLUDES(mu_);

  // Finished disk I/O made durable (DiskTier::Flush), the remote tier's
  // queued I/O finished, and both applied. OK without either.
  Status Flush() TIERKV_EXCLUDES(mu_);

  // For a graceful stop, once no worker pins anything: spills every host
  // block the disk tier does not hold yet (Coordinator::SpillAll) and waits
  // for the spills, at most `timeout`. DeadlineExceeded when they have not
  // finished by then; Unavailable naming how many blocks stayed on host
  // only when some spills failed (the disk tier's errors are logged and
  // counted where they happen). OK at once without a disk tier. Follow it
  // with Flush to make the spills durable. With a remote tier too, host
  // blocks go there as well (alone: only there).
  Status SpillAll(std::chrono::milliseconds timeout) TIERKV_EXCLUDES(mu_);
  // Host blocks the disk tier does not hold (Coordinator::HostOnlyBlocks).
  int64_t HostOnlyBlocks() const TIERKV_EXCLUDES(mu_);

  CoordinatorStats stats() const TIERKV_EXCLUDES(mu_);

  // OK while the store makes progress: the tier thread has gone round its
  // loop within `stalled_after` and the mutex can be taken within
  // `timeout`; Unavailable naming what is stuck otherwise (for a watchdog).
  Status CheckProgress(std::chrono::milliseconds timeout,
                       std::chrono::milliseconds stalled_after) const
      TIERKV_EXCLUDES(mu_);

  // Coordinator::FetchChunk with single flight: while another worker holds
  // the chunk's compute lease, waits for the lease to end and looks again,
  // at most `wait` in all and no longer once *stop is set (checked at
  // least every 100 ms; null: never). When the wait runs out the fetch is
  // a miss without a lease (waited set): the caller computes the chunk.
  StatusOr<ChunkFetchResult> FetchChunk(WorkerId worker, RequestId request,
                                        std::span<const TokenId> tokens,
                                        int64_t virtual_start,
                                        const BlockKey& variant,
                                        std::chrono::milliseconds wait,
                                        const std::atomic<bool>* stop)
      TIERKV_EXCLUDES(mu_);

  // The host segment `worker` maps, made if its tenant is new (with a
  // shared host tier, one segment per tenant: HostTierOptions::
  // max_segments, CoordinatorOptions::max_tenants): a copy of its fd, made
  // under the store's lock, for the worker (a segment passed to a new
  // tenant closes the old fd: CoordinatorOptions::reset_segment). NotFound
  // for an unknown worker; ResourceExhausted when the segment cannot be
  // made or its fd copied.
  StatusOr<ipc::UniqueFd> HostSegmentFd(WorkerId worker) TIERKV_EXCLUDES(mu_);

  const KvLayout& layout() const { return layout_; }
  const HostTier& host() const { return *host_; }
  // Null without a disk tier.
  DiskTier* disk() const { return disk_.get(); }
  // Whether the store has a tier under host (disk, remote or both).
  bool has_lower() const { return lower_ != nullptr; }

 private:
  TieredStore(const TieredStoreOptions& options, std::unique_ptr<HostTier> host,
              std::unique_ptr<DiskTier> disk);
  void RunTierThread();
  // Without a tier thread: waits for the disk tier's queued I/O and
  // applies its results until nothing is in flight (true) or `deadline`
  // passes (false). True at once when Open failed before the coordinator.
  bool DrainWithoutThread(std::chrono::steady_clock::time_point deadline)
      TIERKV_EXCLUDES(mu_);
  void WakeTierThread();

  const KvLayout layout_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  // disk_ as a LowerTier, moving blocks to and from host slots; null
  // without a disk tier.
  std::unique_ptr<LowerTier> disk_lower_;
  std::unique_ptr<LowerTier> remote_;  // Null without a remote tier.
  // The coordinator's LowerTier: disk_lower_, remote_, or both stacked.
  // Null without either.
  std::unique_ptr<LowerTier> stack_;
  LowerTier* lower_ = nullptr;
  // Timed: CheckProgress tries it with a deadline.
  mutable Mutex mu_;
  std::optional<Coordinator> coordinator_ TIERKV_GUARDED_BY(mu_);
  // Signalled, under mu_, when a chunk's compute lease ends (FetchChunk
  // waits on it).
  CondVar lease_ended_;
  // HostTierStats::chunk_lease_waits and chunk_fetches_waiting.
  uint64_t chunk_lease_waits_ TIERKV_GUARDED_BY(mu_) = 0;
  uint64_t chunk_fetches_waiting_ TIERKV_GUARDED_BY(mu_) = 0;
  // Signalled after each round of the tier thread (WaitIdle waits on it).
  std::condition_variable_any applied_;

  // The tier thread: woken by the disk tier's results (and every 100 ms, so
  // that a spill that rested after a failure tries again).
  Mutex wake_mu_;
  CondVar wake_;
  bool wanted_ TIERKV_GUARDED_BY(wake_mu_) = false;
  bool stopping_ TIERKV_GUARDED_BY(wake_mu_) = false;
  Heartbeat tier_heartbeat_;  // Each round of the tier thread.
  std::thread tier_thread_;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_TIERED_STORE_H_
