#include "tiers/tiered_store.h"

#include <fcntl.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

// XXH3-64 of a host slot's bytes: the checksum the disk tier gives its
// values too.
uint64_t SlotChecksumOf(const HostTier& host, BlockId slot) {
  return XXH3_64bits(host.slot(slot), host.slot_bytes());
}

// The disk tier as the coordinator's LowerTier: blocks move between host
// slots and disk values, named by slot id. Neither tier is owned; the disk
// tier (which waits for its I/O when destroyed) goes before the host tier.
// Thread-safety: as DiskTier; the slot memory is guarded by the
// coordinator's pins (see LowerTier).
class DiskBelowHost final : public LowerTier {
 public:
  // Neither is owned; both must outlive every callback this one started
  // (destroy `disk`, which waits for its I/O, before `host`).
  DiskBelowHost(DiskTier* disk, const HostTier* host)
      : disk_(disk), host_(host) {}

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    return disk_->Contains(key, tokens);
  }
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             std::optional<uint64_t> checksum, Done done) override {
    if (checksum.has_value()) {
      disk_->PutChecked(key, tokens, Slot(slot), *checksum, std::move(done));
    } else {
      disk_->Put(key, tokens, Slot(slot), std::move(done));
    }
  }
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, PromoteDone done) override {
    // The checksum the disk tier verified the bytes against, not one taken
    // of the slot afterwards: a write into the slot in between is then
    // caught as any other change of a keyed slot.
    disk_->GetVerified(key, tokens, Slot(slot), std::move(done));
  }
  void HostDropped(const BlockKey& key) override { disk_->Renew(key); }
  bool ContainsThenRenew(const BlockKey& key,
                         std::span<const TokenId> tokens) override {
    return disk_->RenewIfStored(key, tokens);
  }
  bool CoversThenRenew(const BlockKey& key,
                       std::span<const TokenId> tokens) override {
    return disk_->RenewIfStored(key, tokens);
  }
  LowerRemoval Remove(const BlockKey& key) override {
    return {.disk = disk_->Remove(key) ? 1u : 0u};
  }
  LowerRemoval RemoveAll() override { return {.disk = disk_->RemoveAll()}; }
  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const override {
    return disk_->StoredKeys(max, total);
  }
  DiskTierStats stats() const override { return disk_->stats(); }

 private:
  std::span<std::byte> Slot(BlockId slot) const {
    return {host_->slot(slot), host_->slot_bytes()};
  }

  DiskTier* disk_;
  const HostTier* host_;
};

// A disk tier over a remote tier, as one LowerTier (see
// TieredStoreOptions::remote and remote_placement). Neither is owned.
// Thread-safety: as the two tiers; a spill's two halves finish on their
// tiers' threads and the later one calls `done`.
class DiskOverRemote final : public LowerTier {
 public:
  DiskOverRemote(LowerTier* disk, LowerTier* remote, RemotePlacement placement)
      : disk_(disk), remote_(remote), placement_(placement) {}

  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override {
    return disk_->Contains(key, tokens) || remote_->Contains(key, tokens);
  }
  // The disk tier's copy decides whether a spill would add one: a block
  // read from the remote tier goes to disk when the host evicts it.
  bool Covers(const BlockKey& key,
              std::span<const TokenId> tokens) const override {
    return disk_->Contains(key, tokens);
  }
  // Beside: both tiers read the slot, so `done` waits for both. OK when
  // either holds the block now (Contains is then true); else DataLoss when
  // either found the slot changed, else the disk tier's error. A block the
  // remote tier holds already (read from it, or written by another node)
  // goes to disk alone. Under: to disk alone (the disk tier's evictions go
  // on to the remote tier: see TieredStore::Open), and to the remote tier
  // only when the disk fails it for a reason of its own (full, degraded).
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             std::optional<uint64_t> checksum, Done done) override {
    if (placement_ == RemotePlacement::kUnder) {
      return disk_->Spill(
          key, tokens, slot, checksum,
          [remote = remote_, key, slot, checksum,
           tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
           done = std::move(done)](Status s) mutable {
            // Not for a slot that changed, nor a block removed meanwhile.
            if (s.ok() || s.code() == StatusCode::kDataLoss ||
                s.code() == StatusCode::kAborted) {
              return done(s);
            }
            remote->Spill(key, tokens, slot, checksum, std::move(done));
          });
    }
    if (remote_->Contains(key, tokens)) {
      return disk_->Spill(key, tokens, slot, checksum, std::move(done));
    }
    auto both = std::make_shared<SpillHalves>();
    both->done = std::move(done);
    disk_->Spill(key, tokens, slot, checksum, [both](Status s) {
      both->Finish(std::move(s), /*disk=*/true);
    });
    remote_->Spill(key, tokens, slot, checksum, [both](Status s) {
      both->Finish(std::move(s), /*disk=*/false);
    });
  }
  // Disk first when it holds the block; the remote tier when it does not,
  // or when reading it failed.
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, PromoteDone done) override {
    if (!disk_->Contains(key, tokens)) {
      return remote_->Promote(key, tokens, slot, std::move(done));
    }
    disk_->Promote(key, tokens, slot,
                   [remote = remote_, key, slot,
                    tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
                    done = std::move(done)](StatusOr<uint64_t> got) mutable {
                     if (got.ok()) return done(std::move(got));
                     remote->Promote(key, tokens, slot, std::move(done));
                   });
  }
  // The disk tier's order; the remote tier, shared, keeps its own.
  void HostDropped(const BlockKey& key) override { disk_->HostDropped(key); }
  bool ContainsThenRenew(const BlockKey& key,
                         std::span<const TokenId> tokens) override {
    return disk_->ContainsThenRenew(key, tokens) ||
           remote_->Contains(key, tokens);
  }
  bool CoversThenRenew(const BlockKey& key,
                       std::span<const TokenId> tokens) override {
    return disk_->CoversThenRenew(key, tokens);
  }
  LowerRemoval Remove(const BlockKey& key) override {
    LowerRemoval removed = disk_->Remove(key);
    return removed += remote_->Remove(key);
  }
  LowerRemoval RemoveSpilled(const BlockKey& key) override {
    LowerRemoval removed = disk_->RemoveSpilled(key);
    return removed += remote_->RemoveSpilled(key);
  }
  LowerRemoval RemoveAll() override {
    LowerRemoval removed = disk_->RemoveAll();
    return removed += remote_->RemoveAll();
  }
  // The disk tier's keys, then the remote tier's; a block both hold counts
  // twice.
  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const override {
    uint64_t disk_total = 0, remote_total = 0;
    std::vector<BlockKey> keys = disk_->StoredKeys(max, &disk_total);
    std::vector<BlockKey> more =
        remote_->StoredKeys(max - keys.size(), &remote_total);
    keys.insert(keys.end(), more.begin(), more.end());
    *total = disk_total + remote_total;
    return keys;
  }
  std::vector<BlockKey> KeysOn(CacheMedium medium, size_t max,
                               uint64_t* total) const override {
    return (medium == CacheMedium::kRemote ? remote_ : disk_)
        ->KeysOn(medium, max, total);
  }
  DiskTierStats stats() const override { return disk_->stats(); }
  std::optional<DiskTierStats> disk_stats() const override {
    return disk_->disk_stats();
  }
  std::optional<RemoteTierStats> remote_stats() const override {
    return remote_->remote_stats();
  }
  void WaitQueued() override {
    disk_->WaitQueued();
    remote_->WaitQueued();
  }

 private:
  struct SpillHalves {
    Done done;
    std::mutex mu;
    int finished = 0;     // Guarded by mu.
    Status disk, remote;  // Guarded by mu.

    void Finish(Status s, bool is_disk) {
      {
        std::lock_guard<std::mutex> lock(mu);
        (is_disk ? disk : remote) = std::move(s);
        if (++finished < 2) return;
      }
      if (disk.ok() || remote.ok()) return done(Status::Ok());
      if (remote.code() == StatusCode::kDataLoss) return done(remote);
      done(disk);
    }
  };

  LowerTier* disk_;
  LowerTier* remote_;
  const RemotePlacement placement_;
};

}  // namespace

StatusOr<std::unique_ptr<TieredStore>> TieredStore::Open(
    TieredStoreOptions options) {
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  HostTierOptions& host = options.host;
  if (host.slot_bytes == 0) host.slot_bytes = options.layout.BlockBytes();
  if (host.layout_fingerprint.empty()) {
    host.layout_fingerprint = StoreFingerprint(options.layout, options.model);
  }
  if (host.slot_bytes != options.layout.BlockBytes()) {
    return Status::InvalidArgument(
        "host slots of " + std::to_string(host.slot_bytes) +
        " bytes do not hold blocks of layout " + options.layout.ToString());
  }
  if (host.num_slots < 2) {
    return Status::InvalidArgument(
        "a store needs at least 2 host slots (the null slot and one block), "
        "not " +
        std::to_string(host.num_slots));
  }
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<HostTier> host_tier,
                          HostTier::Create(host));
  std::unique_ptr<TieredStore> store(
      new TieredStore(options, std::move(host_tier), std::move(options.disk)));
  TieredStore* raw = store.get();
  if (options.remote_placement == RemotePlacement::kUnder && options.remote &&
      raw->disk_ == nullptr) {
    return Status::InvalidArgument(
        "a remote tier under the disk tier needs a disk tier");
  }
  if (options.remote) {
    TIERKV_ASSIGN_OR_RETURN(
        raw->remote_, options.remote([host = raw->host_.get()](BlockId slot) {
          return std::span<std::byte>(host->slot(slot), host->slot_bytes());
        }));
    if (raw->disk_lower_ != nullptr) {
      raw->stack_ = std::make_unique<DiskOverRemote>(
          raw->disk_lower_.get(), raw->remote_.get(), options.remote_placement);
      raw->lower_ = raw->stack_.get();
      if (options.remote_placement == RemotePlacement::kUnder) {
        // The remote tier outlives the disk tier (~TieredStore), so no
        // eviction reaches it after it is gone.
        raw->disk_->SetEvictionSink(
            [remote = raw->remote_.get()](const BlockKey& key,
                                          std::span<const TokenId> tokens,
                                          std::span<const std::byte> payload) {
              if (remote->Contains(key, tokens)) return;
              // RemoteTier counts a failed or refused write (put_failures).
              remote->Demote(key, tokens, {payload.begin(), payload.end()},
                             [](const Status&) {});
            });
      }
    } else {
      raw->lower_ = raw->remote_.get();
    }
  }
  std::function<uint64_t(BlockId)> slot_checksum;
  if (options.slot_checksums) {
    slot_checksum = [host = raw->host_.get()](BlockId slot) {
      return SlotChecksumOf(*host, slot);
    };
  }
  StatusOr<Coordinator> coordinator = Coordinator::Create(
      {.layout = options.layout,
       .model = options.model,
       .host_slots = host.num_slots,
       .lower = raw->lower_,
       .spill_high = options.spill_high,
       .spill_low = options.spill_low,
       .write_behind_spills = options.write_behind_spills,
       .host_eviction = options.eviction,
       .lower_tier_wakeup = [raw] { raw->WakeTierThread(); },
       .loads_ready = options.loads_ready,
       .clock = options.clock,
       .caps = options.caps,
       .slot_checksum = std::move(slot_checksum),
       .verify_on_load = options.verify_on_load,
       .max_tenants = host.shared ? host.max_segments : 0,
       .assign_slot =
           host.shared
               ? std::function<Status(BlockId, uint32_t)>(
                     [tier = raw->host_.get()](BlockId slot, uint32_t segment) {
                       return tier->AssignSlot(slot, segment);
                     })
               : nullptr,
       .trim_segment = host.shared
                           ? std::function<void(uint32_t)>(
                                 [tier = raw->host_.get()](uint32_t segment) {
                                   tier->Trim(segment);
                                 })
                           : nullptr,
       .reset_segment = host.shared
                            ? std::function<Status(uint32_t)>(
                                  [tier = raw->host_.get()](uint32_t segment) {
                                    return tier->ResetSegment(segment);
                                  })
                            : nullptr,
       .chunk_lease_released = [raw] { raw->lease_ended_.NotifyAll(); },
       .block_trace = options.block_trace,
       .cache_events = options.cache_events});
  // Without a coordinator no disk callback can wake anything: the
  // destructor closes the tiers in order.
  TIERKV_RETURN_IF_ERROR(coordinator.status());
  {
    MutexLock lock(&raw->mu_);
    raw->coordinator_.emplace(std::move(*coordinator));
  }
  if (raw->lower_ != nullptr && options.tier_thread) {
    raw->tier_thread_ = std::thread([raw] { raw->RunTierThread(); });
  }
  return store;
}

TieredStore::TieredStore(const TieredStoreOptions& options,
                         std::unique_ptr<HostTier> host,
                         std::unique_ptr<DiskTier> disk)
    : layout_(options.layout), host_(std::move(host)), disk_(std::move(disk)) {
  if (disk_ != nullptr) {
    disk_lower_ = std::make_unique<DiskBelowHost>(disk_.get(), host_.get());
    lower_ = disk_lower_.get();
  }
}

TieredStore::~TieredStore() {
  {
    MutexLock lock(&wake_mu_);
    stopping_ = true;
  }
  wake_.NotifyAll();
  if (tier_thread_.joinable()) tier_thread_.join();
  // Spills already started finish and are synced, and their results are
  // applied, so the coordinator lets go of every slot they pinned; a
  // result may start a last spill toward the low watermark, which is
  // drained the same way. (tierkvd flushes before this and logs a failure.)
  if (lower_ != nullptr) (void)DrainWithoutThread(Clock::time_point::max());
  // The lower tiers wait for their I/O into host slots: before the slots
  // go. Their last callbacks reach the coordinator's inbox, which outlives
  // them.
  // Disk first: a promotion it fails falls back to the remote tier.
  lower_ = nullptr;
  stack_.reset();
  disk_.reset();
  disk_lower_.reset();
  remote_.reset();
  {
    MutexLock lock(&mu_);
    coordinator_.reset();
  }
  host_.reset();
}

void TieredStore::WakeTierThread() {
  {
    MutexLock lock(&wake_mu_);
    wanted_ = true;
  }
  wake_.NotifyOne();
}

void TieredStore::RunTierThread() {
  for (;;) {
    tier_heartbeat_.Beat();
    {
      MutexLock lock(&wake_mu_);
      // The timeout lets a spill that rested after a failure try again.
      const auto until = Clock::now() + std::chrono::milliseconds(100);
      while (!wanted_ && !stopping_ && wake_.WaitUntil(&wake_mu_, until)) {
      }
      if (stopping_) return;
      wanted_ = false;
    }
    {
      MutexLock lock(&mu_);
      coordinator_->PumpLowerTier();
    }
    applied_.notify_all();
  }
}

bool TieredStore::WaitIdle(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (lower_ != nullptr && !tier_thread_.joinable()) {
    return DrainWithoutThread(deadline);
  }
  MutexLock lock(&mu_);
  // Starts the spills the host's watermark calls for now.
  coordinator_->PumpLowerTier();
  while (!coordinator_->lower_tier_idle()) {
    // Each result wakes the tier thread, which applies it under mu_ (free
    // while this waits) and then signals.
    if (applied_.wait_until(mu_, deadline) == std::cv_status::timeout) {
      return coordinator_->lower_tier_idle();
    }
  }
  return true;
}

bool TieredStore::DrainWithoutThread(Clock::time_point deadline) {
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (!coordinator_.has_value()) return true;
      coordinator_->PumpLowerTier();
      if (coordinator_->lower_tier_idle()) return true;
    }
    if (Clock::now() >= deadline) return false;
    // The lower tiers' queued I/O finishes; results wait in the inbox.
    if (disk_ != nullptr) (void)disk_->Flush();
    if (remote_ != nullptr) remote_->WaitQueued();
  }
}

Status TieredStore::Complete(WorkerId worker,
                             std::span<const CompletedEvent> events) {
  std::vector<BlockId> slots;
  {
    MutexLock lock(&mu_);
    slots = coordinator_->CompletedStoreSlots(worker, events);
  }
  // The events pin these slots until Complete applies them (or the worker
  // is dropped meanwhile, and Complete then fails): nothing else writes
  // them legitimately while they are read here.
  std::vector<SlotChecksum> checksums;
  checksums.reserve(slots.size());
  for (BlockId slot : slots) {
    checksums.push_back({slot, SlotChecksumOf(*host_, slot)});
  }
  MutexLock lock(&mu_);
  return coordinator_->Complete(worker, events, checksums);
}

StatusOr<ChunkFetchResult> TieredStore::FetchChunk(
    WorkerId worker, RequestId request, std::span<const TokenId> tokens,
    int64_t virtual_start, const BlockKey& variant,
    std::chrono::milliseconds wait, const std::atomic<bool>* stop) {
  // How often a waiting fetch checks `stop` (a stop or its worker gone).
  constexpr auto kStopCheck = std::chrono::milliseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const auto stopped = [stop] {
    return stop != nullptr && stop->load(std::memory_order_relaxed);
  };
  // The last busy answer: a miss that pins nothing.
  std::optional<ChunkFetchResult> busy;
  MutexLock lock(&mu_);
  for (;;) {
    if (busy.has_value() && stopped()) {
      // Woken by the stop: not asked again, which could hand this stopping
      // session the lease a dropped holder just gave up.
      return std::move(*busy);
    }
    StatusOr<Coordinator::ChunkFetch> fetch = coordinator_->FetchChunk(
        worker, request, tokens, virtual_start, variant);
    if (!fetch.ok()) return fetch.status();
    const auto now = std::chrono::steady_clock::now();
    if (!fetch->busy || now >= deadline || stopped()) {
      // Busy still: a miss, computed by the caller.
      fetch->result.waited = busy.has_value() || fetch->busy;
      return std::move(fetch->result);
    }
    if (!busy.has_value()) ++chunk_lease_waits_;
    busy = fetch->result;
    busy->waited = true;
    ++chunk_fetches_waiting_;
    lease_ended_.WaitUntil(&mu_, std::min(deadline, now + kStopCheck));
    --chunk_fetches_waiting_;
  }
}

StatusOr<ipc::UniqueFd> TieredStore::HostSegmentFd(WorkerId worker) {
  MutexLock lock(&mu_);
  TIERKV_ASSIGN_OR_RETURN(const uint32_t segment,
                          coordinator_->SegmentOf(worker));
  TIERKV_RETURN_IF_ERROR(host_->EnsureSegment(segment));
  ipc::UniqueFd copy(fcntl(host_->segment_fd(segment), F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) {
    return Status::ResourceExhausted(std::string("cannot pass a descriptor: ") +
                                     std::strerror(errno));
  }
  return copy;
}

Status TieredStore::Flush() {
  if (lower_ == nullptr) return Status::Ok();
  Status flushed = disk_ != nullptr ? disk_->Flush() : Status::Ok();
  if (remote_ != nullptr) remote_->WaitQueued();
  MutexLock lock(&mu_);
  if (coordinator_.has_value()) coordinator_->PumpLowerTier();
  return flushed;
}

Status TieredStore::SpillAll(std::chrono::milliseconds timeout) {
  if (lower_ == nullptr) return Status::Ok();
  int64_t started = 0;
  {
    MutexLock lock(&mu_);
    started = coordinator_->SpillAll();
  }
  if (!WaitIdle(timeout)) {
    return Status::DeadlineExceeded(
        "spilling " + std::to_string(started) +
        " host blocks to the disk tier did not finish within " +
        std::to_string(timeout.count()) + " ms");
  }
  const int64_t left = HostOnlyBlocks();
  if (left > 0) {
    return Status::Unavailable(std::to_string(left) + " of " +
                               std::to_string(started) +
                               " host blocks could not be spilled to the "
                               "disk tier (spill_failures in the stats)");
  }
  return Status::Ok();
}

int64_t TieredStore::HostOnlyBlocks() const {
  MutexLock lock(&mu_);
  return coordinator_->HostOnlyBlocks();
}

CoordinatorStats TieredStore::stats() const {
  MutexLock lock(&mu_);
  CoordinatorStats out = coordinator_->stats();
  out.host.chunk_lease_waits = chunk_lease_waits_;
  out.host.chunk_fetches_waiting = chunk_fetches_waiting_;
  return out;
}

Status TieredStore::CheckProgress(
    std::chrono::milliseconds timeout,
    std::chrono::milliseconds stalled_after) const {
  if (tier_thread_.joinable()) {
    const Clock::duration age = tier_heartbeat_.Age();
    if (age >= stalled_after) {
      return Status::Unavailable(
          "the tier thread has been stuck for " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(age)
                  .count()) +
          " ms");
    }
  }
  if (!mu_.TryLockFor(timeout)) {
    return Status::Unavailable("the coordinator's mutex was not free within " +
                               std::to_string(timeout.count()) + " ms");
  }
  mu_.Unlock();
  return Status::Ok();
}

}  // namespace tierkv
