// The disk tier itself (DiskTierImpl): its I/O threads, Put and Get with
// their index and storage steps, removal, stats, and Open with the rebuild
// scan that verifies the store and restores the index.
#include "tiers/disk_tier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/mutex.h"
#include "tiers/disk_internal.h"

namespace tierkv {
namespace {

using disk_internal::AsChars;
using disk_internal::CheckCodecArgs;
using disk_internal::Checksum;
using disk_internal::DiskIndex;
using disk_internal::EncodeHeader;
using disk_internal::kMaxTokens;
using disk_internal::ParseHeader;
using disk_internal::ParseStorageKey;
using disk_internal::ScratchBuffer;
using disk_internal::SlotAllocator;
using disk_internal::SlotBytes;
using disk_internal::ValueFields;
using disk_internal::ValueLocation;
using disk_internal::VerifyAndDecode;

// ---------------------------------------------------------------------------
// A fixed pool of threads running queued tasks in FIFO order, reads before
// writes: a promotion (a lookup waits on it) does not wait behind a burst of
// spills, only for a thread to finish the I/O it is in. Writes still get
// one task in kReadsBeforeAWrite + 1 while reads keep coming.
class IoThreads {
 public:
  explicit IoThreads(int32_t count) {
    for (int32_t i = 0; i < count; ++i)
      threads_.emplace_back([this] { Run(); });
  }
  // Runs what is queued, then joins.
  ~IoThreads() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    work_cv_.NotifyAll();
    for (std::thread& t : threads_) t.join();
  }

  // `read`: runs before every write task queued.
  void Submit(std::function<void()> task, bool read = false)
      TIERKV_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      (read ? reads_ : queue_).push_back(std::move(task));
    }
    work_cv_.NotifyOne();
  }

  // Waits until no task is queued or running (tasks queued by running tasks
  // included). REQUIRES: not called from a task.
  void Drain() TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (!reads_.empty() || !queue_.empty() || running_ != 0) {
      idle_cv_.Wait(&mu_);
    }
  }

 private:
  // Holds mu_ except while a task runs.
  void Run() TIERKV_EXCLUDES(mu_) {
    mu_.Lock();
    while (true) {
      while (!stopping_ && reads_.empty() && queue_.empty()) {
        work_cv_.Wait(&mu_);
      }
      const bool read =
          !reads_.empty() &&
          (queue_.empty() || reads_in_a_row_ < kReadsBeforeAWrite);
      reads_in_a_row_ = read && !queue_.empty() ? reads_in_a_row_ + 1 : 0;
      std::deque<std::function<void()>>& from = read ? reads_ : queue_;
      if (from.empty()) break;  // Stopping, and nothing left.
      std::function<void()> task = std::move(from.front());
      from.pop_front();
      ++running_;
      mu_.Unlock();
      task();
      task = nullptr;  // Destroy captures outside the lock.
      mu_.Lock();
      --running_;
      if (reads_.empty() && queue_.empty() && running_ == 0) {
        idle_cv_.NotifyAll();
      }
    }
    mu_.Unlock();
  }

  static constexpr int kReadsBeforeAWrite = 8;

  Mutex mu_;
  CondVar work_cv_;  // Signals a task queued, or stopping_.
  CondVar idle_cv_;  // Signals both queues empty with nothing running.
  std::deque<std::function<void()>> reads_ TIERKV_GUARDED_BY(mu_);
  std::deque<std::function<void()>> queue_ TIERKV_GUARDED_BY(mu_);
  int32_t running_ TIERKV_GUARDED_BY(mu_) = 0;
  int reads_in_a_row_ TIERKV_GUARDED_BY(mu_) = 0;  // Taken with writes queued.
  bool stopping_ TIERKV_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

struct Counters {
  uint64_t puts = 0;
  uint64_t put_failures = 0;
  uint64_t gets = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t checksum_failures = 0;
  uint64_t read_errors = 0;
  uint64_t token_mismatches = 0;
  uint64_t dropped_on_open = 0;
  uint64_t layout_mismatches = 0;
  uint64_t payload_bytes_written = 0;
  uint64_t stored_bytes_written = 0;
  uint64_t write_errors = 0;
  uint64_t space_refusals = 0;
  uint64_t undeleted_removals = 0;
};

// Keeps the storage's reserve free on its filesystem without a statvfs per
// write: the free space is read at least every kMaxAge (and at most every
// kMinAge while short), and each write admitted since is taken off it twice
// (the log, then the flushed value), so the estimate errs on the side of
// refusing.
class SpaceGuard {
 public:
  explicit SpaceGuard(DiskStorage* storage)
      : storage_(storage), reserve_(storage->ReservedBytes()) {}

  // OK if `bytes` may be written now; ResourceExhausted while the free space
  // is short, or while it cannot be read (EINTR, an NFS timeout: a reading
  // that may pass, tried again as a short one is); NotFound when the
  // directory is gone. Once short, it takes the reserve twice over to end it:
  // RocksDB preallocates its write-ahead log, so each flush that deletes one
  // frees about a memtable at once, which would otherwise end the state and
  // the next log start it again.
  Status Admit(uint64_t bytes) TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    const Clock::time_point now = Clock::now();
    const uint64_t need = (short_ ? 2 : 1) * reserve_ + 2 * bytes;
    const Clock::duration age = now - checked_;
    if (!checked_once_ || age >= kMaxAge ||
        ((free_ < need || !unreadable_.ok()) && age >= kMinAge)) {
      StatusOr<uint64_t> free = storage_->FreeBytes();
      checked_once_ = true;
      checked_ = now;
      if (!free.ok() && free.status().code() == StatusCode::kNotFound) {
        return free.status();
      }
      // A reading that failed otherwise may pass: refused until one works
      // (read again after kMinAge), short_ left as it was, so that such a
      // reading needs the reserve only once, as before the failure.
      unreadable_ = free.ok() ? Status::Ok()
                              : Status::ResourceExhausted(
                                    "disk tier: cannot read its filesystem's "
                                    "free space (" +
                                    free.status().message() +
                                    "): blocks are not spilled until it can");
      if (free.ok()) free_ = *free;
    }
    if (!unreadable_.ok()) return unreadable_;
    short_ = free_ < need;
    if (short_) {
      return Status::ResourceExhausted(
          "disk tier: its filesystem has " + std::to_string(free_) +
          " bytes free, too few to store a block and keep the " +
          std::to_string(reserve_) +
          " bytes its storage needs in reserve (write-ahead log, "
          "memtables): blocks are not spilled until space is freed there");
    }
    free_ -= 2 * bytes;
    return Status::Ok();
  }

  // A write found no room although Admit let it through (another process
  // filled the filesystem, or a quota): short from now on, until a fresh
  // reading shows the reserve twice over.
  void RanOut() TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    checked_once_ = true;
    checked_ = Clock::now();
    free_ = 0;
    short_ = true;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kMaxAge = std::chrono::milliseconds(250);
  static constexpr Clock::duration kMinAge = std::chrono::milliseconds(100);

  DiskStorage* const storage_;
  const uint64_t reserve_;
  Mutex mu_;
  bool checked_once_ TIERKV_GUARDED_BY(mu_) = false;
  Clock::time_point checked_ TIERKV_GUARDED_BY(mu_);
  uint64_t free_ TIERKV_GUARDED_BY(mu_) = 0;
  bool short_ TIERKV_GUARDED_BY(mu_) = false;  // The last Admit refused.
  Status unreadable_ TIERKV_GUARDED_BY(mu_);   // The last reading's failure.
};

// ---------------------------------------------------------------------------
// The tier.
//
// Concurrency: mu_ guards the index and counters and is never held across
// disk I/O. A storage write or delete of a key runs with the key marked busy
// (busy_, taken under mu_ in the same section that checks that the index
// still wants it: the writer's generation is current, a deleted key is still
// absent), so operations on one key never overlap and land in the index's
// order: a delete of an evicted key never lands after a newer Put of the same
// key, and a superseded write never lands after the newer one. An operation
// waits only for another of the same key (one block's write at most), never
// for unrelated keys. Reads take no busy mark: a Get pins the slot its
// entry names (SlotAllocator readers), so the bytes there stay that
// block's until it is done, whatever happens to the key meanwhile.
// A block's bytes go to a free slot of the value file first, then its
// record (header, token ids, slot) to RocksDB: a record is never visible,
// in the index or after a crash, before the bytes it points at are written.
// A slot is given back only once no record points at it (record_slots_,
// changed with the key busy).
// A block evicted while an eviction sink is set keeps its key busy until
// the sink has it (PassOnEvicted), so its slot stays its own while it is
// read back, and a Remove of it returns only after the tier below has it.
// Remove and RemoveAll delete with their keys busy, before they return, so a
// write of the key has either landed (and is deleted) or finds its entry
// gone; Remove also cancels the key's Puts not yet reserved (queued_: a Put
// leaves it only in the section that reserves its index entry, so no Remove
// falls between the two).
class DiskTierImpl final : public DiskTier {
 public:
  DiskTierImpl(const DiskTierOptions& options,
               std::unique_ptr<DiskStorage> storage)
      : options_(options),
        storage_(std::move(storage)),
        space_(storage_.get()),
        slot_bytes_(SlotBytes(options.block_bytes)),
        index_(options.capacity_bytes - options.reserved_bytes,
               options.cache_events, options.block_size, options.eviction,
               // A compressed value takes fewer bytes than a slot, so the
               // tier may hold more values than slots' worth: ghosts for
               // twice as many.
               options.codec == DiskCodec::kNone ? slot_bytes_
                                                 : slot_bytes_ / 2) {}

  ~DiskTierImpl() override {
    if (io_ == nullptr) return;  // Open failed before starting threads.
    // Nobody to report a failed final flush to: the blocks it loses are
    // simply absent next time.
    Status ignored = Flush();
    (void)ignored;
    io_.reset();  // Joins before the members the tasks use go away.
  }

  Status Rebuild() TIERKV_EXCLUDES(mu_);
  void Start() { io_ = std::make_unique<IoThreads>(options_.io_threads); }

  void Put(const BlockKey& key, std::span<const TokenId> tokens,
           std::span<const std::byte> payload, Done done) override {
    Submit(key, tokens, payload, std::nullopt, std::move(done));
  }

  void PutChecked(const BlockKey& key, std::span<const TokenId> tokens,
                  std::span<const std::byte> payload, uint64_t checksum,
                  Done done) override {
    Submit(key, tokens, payload, checksum, std::move(done));
  }

  void Get(const BlockKey& key, std::span<const TokenId> tokens,
           std::span<std::byte> out, Done done) override {
    GetVerified(key, tokens, out,
                [done = std::move(done)](StatusOr<uint64_t> got) {
                  done(got.status());
                });
  }

  void GetVerified(const BlockKey& key, std::span<const TokenId> tokens,
                   std::span<std::byte> out, VerifiedDone done) override {
    {
      MutexLock lock(&mu_);
      reads_.push_back(Read{.key = key,
                            .tokens = {tokens.begin(), tokens.end()},
                            .out = out,
                            .done = std::move(done)});
    }
    io_->Submit([this] { RunReads(); }, /*read=*/true);
  }

  bool Contains(const BlockKey& key) const TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    return index_.FindStored(key) != nullptr;
  }

  bool Contains(const BlockKey& key, std::span<const TokenId> tokens) const
      TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    const DiskIndex::Entry* entry = index_.FindStored(key);
    return entry != nullptr && std::ranges::equal(entry->tokens, tokens);
  }

  void Renew(const BlockKey& key) TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    index_.Renew(key);
  }

  bool RenewIfStored(const BlockKey& key, std::span<const TokenId> tokens)
      TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    const DiskIndex::Entry* entry = index_.FindStored(key);
    if (entry == nullptr || !std::ranges::equal(entry->tokens, tokens)) {
      return false;
    }
    index_.Renew(key);
    return true;
  }

  bool Remove(const BlockKey& key) TIERKV_EXCLUDES(mu_) override {
    bool stored = false;
    bool erase_value = false;
    {
      MutexLock lock(&mu_);
      // Forgotten at once (a Put of the key not yet reserved is cancelled),
      // then deleted with the key busy: a write of it that is running has
      // landed by then and is deleted here; one not yet started finds its
      // entry gone and never writes.
      stored = index_.FindStored(key) != nullptr;
      const bool erased = index_.Erase(key);
      if (auto it = queued_.find(key); it != queued_.end()) {
        it->second.cancel_below = next_generation_;
      }
      AcquireKey(key);
      // Unless a Put queued after this Remove wrote the key meanwhile (its
      // write ran before this one got the key). A block evicted whose
      // record is not deleted yet (its Put deletes victims once they are
      // handed on) is deleted here too: once Remove returns, no restart
      // brings the key back.
      erase_value = (erased || record_slots_.contains(key)) &&
                    index_.FindStored(key) == nullptr;
    }
    if (erase_value) DeleteNow({&key, 1});
    ReleaseKeys({&key, 1});
    return stored;
  }

  void SetEvictionSink(EvictionSink sink) TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    eviction_sink_ = std::move(sink);
    // The old sink may be gone once this returns.
    while (passing_on_ > 0) busy_cv_.Wait(&mu_);
  }

  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const
      TIERKV_EXCLUDES(mu_) override {
    MutexLock lock(&mu_);
    std::vector<BlockKey> keys = index_.StoredKeys();
    *total = keys.size();
    if (keys.size() > max) keys.resize(max);
    return keys;
  }

  uint64_t RemoveAll() TIERKV_EXCLUDES(mu_) override {
    std::vector<BlockKey> keys;
    uint64_t stored = 0;
    {
      MutexLock lock(&mu_);
      // A stored key is busy only for a moment (an operation that finds it
      // stored again and leaves it alone).
      // Nor does it overtake a block evicted before it that is still being
      // handed on: the tier below would keep that one.
      // Blocks evicted whose records are not deleted yet go too, so that
      // no restart brings them back.
      std::vector<BlockKey> evicted;
      while (true) {
        keys = index_.StoredKeys();
        evicted.clear();
        for (const auto& [key, slot] : record_slots_) {
          if (!index_.Contains(key)) evicted.push_back(key);
        }
        bool busy = passing_on_ > 0;
        for (const BlockKey& key : keys) busy = busy || busy_.contains(key);
        for (const BlockKey& key : evicted) busy = busy || busy_.contains(key);
        if (!busy) break;
        busy_cv_.Wait(&mu_);
      }
      stored = keys.size();
      for (const BlockKey& key : keys) index_.Erase(key);
      keys.insert(keys.end(), evicted.begin(), evicted.end());
      for (const BlockKey& key : keys) busy_.insert(key);
    }
    DeleteNow(keys);
    ReleaseKeys(keys);
    ShrinkValueFile();
    return stored;
  }

  Status Flush() TIERKV_EXCLUDES(mu_) override {
    io_->Drain();
    if (Status stopped = Stopped(); !stopped.ok()) {
      return Status(stopped.code(),
                    "disk tier: blocks written since the last flush may be "
                    "lost: " +
                        stopped.message());
    }
    Status s = storage_->Flush();
    if (!s.ok()) WriteFailed(s);
    file_bytes_ = storage_->FileBytes();
    return s;
  }

  DiskTierStats stats() const TIERKV_EXCLUDES(mu_) override;
  std::vector<std::string> damaged_files() const override {
    return damaged_files_;
  }

 private:
  void Submit(const BlockKey& key, std::span<const TokenId> tokens,
              std::span<const std::byte> payload,
              std::optional<uint64_t> checksum, Done done)
      TIERKV_EXCLUDES(mu_) {
    // Numbered here, so that of two Puts of a key in flight together the
    // one queued later wins.
    uint64_t generation = 0;
    {
      MutexLock lock(&mu_);
      generation = next_generation_++;
      ++queued_[key].puts;
    }
    std::vector<TokenId> owned(tokens.begin(), tokens.end());
    io_->Submit([this, key, generation, owned = std::move(owned), payload,
                 checksum, done = std::move(done)] {
      done(PutNow(key, generation, owned, payload, checksum));
    });
  }
  Status PutNow(const BlockKey& key, uint64_t generation,
                std::span<const TokenId> tokens,
                std::span<const std::byte> payload,
                std::optional<uint64_t> checksum) TIERKV_EXCLUDES(mu_);
  // PutNow's work; sets *dequeued once it took the Put off queued_.
  Status EncodeAndWrite(const BlockKey& key, uint64_t generation,
                        std::span<const TokenId> tokens,
                        std::span<const std::byte> payload,
                        std::optional<uint64_t> checksum, bool* dequeued)
      TIERKV_EXCLUDES(mu_);
  // Takes a queued Put of `key` off queued_: true if a Remove cancelled it.
  bool DequeueLocked(const BlockKey& key, uint64_t generation)
      TIERKV_REQUIRES(mu_);
  // Whether a Remove cancelled a queued Put of `key` (still queued).
  bool CancelledLocked(const BlockKey& key, uint64_t generation) const
      TIERKV_REQUIRES(mu_) {
    auto it = queued_.find(key);
    return it != queued_.end() && generation < it->second.cancel_below;
  }
  static Status Cancelled(const BlockKey& key) {
    return Status::Aborted("block " + key.ToHex() +
                           " was removed before it was written");
  }
  // Marks `key` busy, first waiting while an operation of it runs.
  void AcquireKey(const BlockKey& key) TIERKV_REQUIRES(mu_) {
    while (busy_.contains(key)) busy_cv_.Wait(&mu_);
    busy_.insert(key);
  }
  void ReleaseKeyLocked(const BlockKey& key) TIERKV_REQUIRES(mu_) {
    busy_.erase(key);
    busy_cv_.NotifyAll();
  }
  void ReleaseKeys(std::span<const BlockKey> keys) TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    for (const BlockKey& key : keys) ReleaseKeyLocked(key);
  }
  // Writes `stored` to a free slot, then the key's record (`fields` with
  // that slot) to the storage.
  Status WriteReserved(const BlockKey& key, uint64_t generation,
                       ValueFields fields) TIERKV_EXCLUDES(mu_);
  // A queued Get, and what the index said of it.
  struct Read {
    BlockKey key;
    std::vector<TokenId> tokens;
    std::span<std::byte> out;
    VerifiedDone done;
    Status status = Status::Ok();  // Not OK: answered without reading.
    uint64_t generation = 0;       // The entry read.
    ValueLocation location = {};   // Pinned (a reader of its slot) if OK.
  };
  // Takes queued Gets (up to kReadBatchBytes of them) and reads them: one
  // vectored read per run of adjacent slots, so that small blocks spilled
  // together come back in one I/O, then each is verified on its own.
  void RunReads() TIERKV_EXCLUDES(mu_);
  // Checks a Get against the index; pins its slot if it is stored.
  void ResolveLocked(Read* read) TIERKV_REQUIRES(mu_);
  // Reads `run` (pinned Gets in adjacent slots, raw blocks if more than
  // one) into their buffers in one storage read, then verifies each.
  void ReadRun(std::span<Read*> run) TIERKV_EXCLUDES(mu_);
  // Reads and verifies the bytes at `location` into `out`.
  Status ReadValue(const ValueLocation& location, std::span<std::byte> out)
      TIERKV_EXCLUDES(mu_);
  Status CheckLayout(const ValueFields& fields) const;
  // Deletes `key` from storage unless the index holds it again.
  void DeleteIfAbsent(const BlockKey& key) TIERKV_EXCLUDES(mu_);
  // Forgets and deletes `key` if its entry is still `generation`.
  void DropIfCurrent(const BlockKey& key, uint64_t generation)
      TIERKV_EXCLUDES(mu_);
  void DeleteVictims(const std::vector<BlockKey>& victims)
      TIERKV_EXCLUDES(mu_) {
    for (const BlockKey& victim : victims) DeleteIfAbsent(victim);
  }
  // Reads back each block evicted for room and hands the ones that verify
  // to `sink`, before DeleteVictims deletes them. The blocks' keys must be
  // busy (AcquireKey, in the section that evicted them, counted in
  // passing_on_): their slots stay theirs, and a Remove of one returns only
  // once it has been handed on, so the tier below hears of the Remove
  // after the block. Releases the keys.
  void PassOnEvicted(const EvictionSink& sink,
                     std::span<const DiskIndex::Evicted> evicted)
      TIERKV_EXCLUDES(mu_);
  // Deletes the keys' records (in one storage write) unless the tier is
  // degraded (RocksDB is not written after a write error), then gives back
  // the slots they pointed at; a failure degrades the tier. The keys must
  // be busy (AcquireKey).
  void DeleteNow(std::span<const BlockKey> keys) TIERKV_EXCLUDES(mu_);
  // Gives the space of free value slots back to the filesystem: cuts the
  // file after the last slot in use and punches out the free slots below
  // it. After Open's evictions and RemoveAll, which can free far more than
  // new writes take again soon; single evictions' slots are reused.
  void ShrinkValueFile() TIERKV_EXCLUDES(mu_);
  // Deletes storage keys of records Open found bad: no slot is theirs.
  Status DeleteRecords(std::span<const std::string> storage_keys)
      TIERKV_EXCLUDES(mu_);
  // Refreshes file_bytes_ on an I/O thread once it is older than
  // kFileBytesAge: stats() never reads the disk on its caller's thread.
  void MaybeRefreshFileBytes() const;
  // Whether a write of `bytes` may go to the storage; counts and reports a
  // refusal.
  Status AdmitWrite(uint64_t bytes) TIERKV_EXCLUDES(mu_);
  // Why the tier takes no writes until the next Open; OK while it does.
  Status Stopped() const TIERKV_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return stopped_;
  }
  // A storage write failed: counts it and stops writes (reported once).
  void WriteFailed(const Status& s) TIERKV_EXCLUDES(mu_);
  // A value file write found the filesystem full: counts it, and the tier
  // is short of space (as AdmitWrite's refusals make it) until there is
  // room again; RocksDB was not written, so writes need not stop for good.
  void ValueFileFull(const Status& s) TIERKV_EXCLUDES(mu_);
  void Report(const Status& why) const {
    if (options_.on_degraded) options_.on_degraded(why);
  }
  StatusOr<std::optional<std::string>> ReadFingerprint();
  Status FingerprintMismatch(std::string_view stored, uint64_t values) const;
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kFileBytesAge = std::chrono::seconds(1);
  const DiskTierOptions options_;
  const std::unique_ptr<DiskStorage> storage_;
  SpaceGuard space_;
  const uint64_t slot_bytes_;  // SlotBytes(block_bytes).
  // Puts queued and not yet run, per key: a Remove cancels them.
  struct QueuedPuts {
    int64_t puts = 0;
    uint64_t cancel_below = 0;  // Generations below it were removed.
  };
  uint64_t next_sequence_ TIERKV_GUARDED_BY(mu_) = 1;
  mutable Mutex mu_;
  DiskIndex index_ TIERKV_GUARDED_BY(mu_);
  SlotAllocator slots_ TIERKV_GUARDED_BY(mu_);
  // The slot each key's record in the storage points at.
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> record_slots_
      TIERKV_GUARDED_BY(mu_);
  std::deque<Read> reads_ TIERKV_GUARDED_BY(mu_);  // Gets not yet taken.
  Counters counters_ TIERKV_GUARDED_BY(mu_);
  Status stopped_ TIERKV_GUARDED_BY(mu_);  // See Stopped.
  uint64_t next_generation_ TIERKV_GUARDED_BY(mu_) = 1;
  std::unordered_map<BlockKey, QueuedPuts, BlockKeyHash> queued_
      TIERKV_GUARDED_BY(mu_);
  // Keys with a storage write or delete running (see Concurrency).
  std::unordered_set<BlockKey, BlockKeyHash> busy_ TIERKV_GUARDED_BY(mu_);
  CondVar busy_cv_;  // Signals a key leaving busy_.
  // The storage's FileBytes, as last read off the caller's thread.
  mutable std::atomic<uint64_t> file_bytes_{0};
  mutable std::atomic<Clock::rep> file_bytes_read_{0};  // When, since epoch.
  mutable std::atomic<bool> file_bytes_reading_{false};
  // The filesystem was short of free space at the last write tried.
  bool low_space_ TIERKV_GUARDED_BY(mu_) = false;
  EvictionSink eviction_sink_ TIERKV_GUARDED_BY(mu_);  // SetEvictionSink.
  // PassOnEvicted calls running (busy_cv_ signals each end).
  int passing_on_ TIERKV_GUARDED_BY(mu_) = 0;
  std::unique_ptr<IoThreads> io_;
  std::vector<std::string> damaged_files_;  // Set by Rebuild, then constant.
};

Status DiskTierImpl::PutNow(const BlockKey& key, uint64_t generation,
                            std::span<const TokenId> tokens,
                            std::span<const std::byte> payload,
                            std::optional<uint64_t> checksum) {
  bool dequeued = false;
  Status s =
      EncodeAndWrite(key, generation, tokens, payload, checksum, &dequeued);
  if (!dequeued) {
    MutexLock lock(&mu_);
    (void)DequeueLocked(key, generation);
  }
  return s;
}

Status DiskTierImpl::EncodeAndWrite(const BlockKey& key, uint64_t generation,
                                    std::span<const TokenId> tokens,
                                    std::span<const std::byte> payload,
                                    std::optional<uint64_t> checksum,
                                    bool* dequeued) {
  {
    MutexLock lock(&mu_);
    if (CancelledLocked(key, generation)) return Cancelled(key);
  }
  if (payload.size() != options_.block_bytes) {
    return Status::InvalidArgument(
        "disk tier Put: payload is " + std::to_string(payload.size()) +
        " bytes, a block is " + std::to_string(options_.block_bytes));
  }
  if (tokens.empty() || tokens.size() > kMaxTokens) {
    return Status::InvalidArgument("disk tier Put: 1 to 65536 token ids");
  }
  // Before any work: a degraded tier fails at once. The header is small
  // beside a block; its tokens are counted in full.
  TIERKV_RETURN_IF_ERROR(
      AdmitWrite(payload.size() + tokens.size_bytes() + 4096));
  const uint64_t payload_checksum = Checksum(AsChars(payload));
  if (checksum.has_value() && *checksum != payload_checksum) {
    return Status::DataLoss("block " + key.ToHex() +
                            ": its bytes changed since they were stored; "
                            "not written");
  }
  thread_local ScratchBuffer scratch;
  const size_t max_stored =
      MaxEncodedBytes(options_.codec, options_.element_bytes, payload.size());
  std::span<std::byte> out(scratch.Get(max_stored), max_stored);
  TIERKV_ASSIGN_OR_RETURN(
      EncodedPayload encoded,
      EncodePayload(options_.codec, options_.element_bytes, payload, out));
  const std::string_view stored = encoded.codec == DiskCodec::kNone
                                      ? AsChars(payload)
                                      : AsChars(out.first(encoded.bytes));
  ValueFields fields{
      .codec = encoded.codec,
      .element_bytes = options_.element_bytes,
      .sequence = 0,  // Taken with the slot.
      .payload_bytes = payload.size(),
      .stored_bytes = stored.size(),
      .payload_checksum = payload_checksum,
      // Raw payloads (the common case for incompressible data) hash once.
      .stored_checksum = encoded.codec == DiskCodec::kNone ? payload_checksum
                                                           : Checksum(stored),
      .slot = 0,  // Taken when the write starts.
      .fingerprint = options_.layout_fingerprint,
      .token_bytes = AsChars(std::as_bytes(tokens)),
      .stored = stored,
  };
  // The record and the slot's pages the stored bytes take (the rest of the
  // slot is a hole: see WriteReserved).
  const uint64_t bytes =
      DiskValueBytes(payload.size(), options_.layout_fingerprint.size(),
                     tokens.size()) -
      SlotBytes(payload.size()) + SlotBytes(stored.size());
  std::vector<BlockKey> victims;
  std::vector<DiskIndex::Evicted> evicted;
  EvictionSink sink;
  StatusOr<bool> reserved = false;
  {
    MutexLock lock(&mu_);
    // In the section that reserves: a Remove comes either before (and
    // cancels the Put here) or after (and finds the entry).
    *dequeued = true;
    if (DequeueLocked(key, generation)) return Cancelled(key);
    reserved = index_.Reserve(key, generation, bytes, tokens, &victims,
                              eviction_sink_ ? &evicted : nullptr);
    if (!reserved.ok()) ++counters_.put_failures;
    if (!evicted.empty()) {
      sink = eviction_sink_;
      ++passing_on_;
      for (const DiskIndex::Evicted& e : evicted) AcquireKey(e.key);
    }
  }
  PassOnEvicted(sink, evicted);
  DeleteVictims(victims);
  if (!reserved.ok()) return reserved.status();
  if (!*reserved) return Status::Ok();  // A later Put of the key won.
  return WriteReserved(key, generation, fields);
}

Status DiskTierImpl::WriteReserved(const BlockKey& key, uint64_t generation,
                                   ValueFields fields) {
  {
    MutexLock lock(&mu_);
    AcquireKey(key);
    if (!index_.IsCurrent(key, generation)) {
      // Superseded by a newer Put (which wins: OK) or removed.
      const bool removed = !index_.Contains(key);
      ReleaseKeyLocked(key);
      return removed ? Cancelled(key) : Status::Ok();
    }
    fields.slot = slots_.Take();
    // In the section that takes the slot: of two records naming one slot,
    // the later writer's has the higher sequence (see Rebuild).
    fields.sequence = next_sequence_++;
  }
  const uint64_t offset = fields.slot * slot_bytes_;
  Status s = storage_->WritePayload(offset, fields.stored);
  const uint64_t used = SlotBytes(fields.stored.size());
  if (s.ok() && used < slot_bytes_) {
    // A compressed block: the slot's tail (a longer block's, before) takes
    // no disk space.
    s = storage_->ReleasePayload(offset + used, slot_bytes_ - used);
  }
  // Failed in the value file, before RocksDB saw the write.
  const bool value_file_failed = !s.ok();
  const std::string header = EncodeHeader(fields);
  if (s.ok()) {
    const std::string_view parts[1] = {header};
    s = storage_->Put(DiskStorageKey(key), parts);
  }
  {
    MutexLock lock(&mu_);
    ReleaseKeyLocked(key);
    if (s.ok()) {
      // The record now points at the new slot; the one it replaced (if the
      // key was stored before) is free once its readers are done.
      auto [it, inserted] = record_slots_.try_emplace(key, fields.slot);
      if (!inserted) {
        slots_.Give(it->second);
        it->second = fields.slot;
      }
      ++counters_.puts;
      counters_.payload_bytes_written += options_.block_bytes;
      counters_.stored_bytes_written += header.size() + fields.stored.size();
      const ValueLocation location{.slot = fields.slot,
                                   .stored_bytes = fields.stored.size(),
                                   .payload_checksum = fields.payload_checksum,
                                   .stored_checksum = fields.stored_checksum,
                                   .codec = fields.codec,
                                   .element_bytes = fields.element_bytes};
      if (index_.Commit(key, generation, location)) return s;
      // Removed while it was written (Remove deletes it once the key is
      // free), or superseded by a newer Put, which writes over it.
      return index_.Contains(key) ? s : Cancelled(key);
    }
    // No record points at the slot: the tier writes nothing more after
    // this error, and a record RocksDB kept of it is checked when read.
    slots_.Give(fields.slot);
    index_.EraseIf(key, generation);
    ++counters_.put_failures;
  }
  if (value_file_failed && s.code() == StatusCode::kResourceExhausted) {
    // The value file is tierkv's own, not RocksDB's: a write that found
    // the filesystem full left nothing behind, and writes resume once
    // there is room again.
    ValueFileFull(s);
    return s;
  }
  WriteFailed(s);
  // Whatever RocksDB kept of the write is verified (and dropped) by the
  // next Open: no delete is tried after a write error.
  return s;
}

bool DiskTierImpl::DequeueLocked(const BlockKey& key, uint64_t generation) {
  auto it = queued_.find(key);
  const bool cancelled = generation < it->second.cancel_below;
  if (--it->second.puts == 0) queued_.erase(it);
  return cancelled;
}

Status DiskTierImpl::AdmitWrite(uint64_t bytes) {
  if (Status stopped = Stopped(); !stopped.ok()) {
    MutexLock lock(&mu_);
    ++counters_.put_failures;
    return stopped;
  }
  Status room = space_.Admit(bytes);
  if (!room.ok() && room.code() != StatusCode::kResourceExhausted) {
    // The directory is gone or unreadable: nothing written there is safe.
    WriteFailed(room);
    return room;
  }
  bool changed = false;
  {
    MutexLock lock(&mu_);
    changed = low_space_ == room.ok();
    low_space_ = !room.ok();
    if (!room.ok()) {
      ++counters_.space_refusals;
      ++counters_.put_failures;
    }
  }
  if (changed) Report(room);
  return room;
}

void DiskTierImpl::ValueFileFull(const Status& s) {
  space_.RanOut();
  bool changed = false;
  {
    MutexLock lock(&mu_);
    ++counters_.write_errors;
    changed = !low_space_;
    low_space_ = true;
  }
  if (changed) Report(s);
}

void DiskTierImpl::WriteFailed(const Status& s) {
  bool first = false;
  {
    MutexLock lock(&mu_);
    ++counters_.write_errors;
    first = stopped_.ok();
    if (first) {
      stopped_ =
          Status(s.code(), "disk tier stopped taking writes (" + s.message() +
                               "); it keeps serving what it holds until "
                               "restarted");
    }
  }
  if (first) Report(Stopped());
}

void DiskTierImpl::ShrinkValueFile() {
  if (!Stopped().ok()) return;
  Status s;
  {
    // Under the lock: no write takes a free slot while its space goes.
    MutexLock lock(&mu_);
    s = storage_->TruncatePayloads(slots_.TrimEnd() * slot_bytes_);
    for (const auto& [first, count] : slots_.FreeRuns()) {
      if (!s.ok()) break;
      s = storage_->ReleasePayload(first * slot_bytes_, count * slot_bytes_);
    }
  }
  if (!s.ok()) WriteFailed(s);
}

void DiskTierImpl::DeleteNow(std::span<const BlockKey> keys) {
  if (keys.empty()) return;
  // Stopped (before, or by this delete failing): forgotten by the index
  // only, and their slots stay taken (their records still point there);
  // Open checks them again. Each is counted once, and not deleted again by
  // a later RemoveAll.
  const auto forget = [&] {
    MutexLock lock(&mu_);
    for (const BlockKey& key : keys) {
      counters_.undeleted_removals += record_slots_.erase(key);
    }
  };
  if (!Stopped().ok()) return forget();
  Status s;
  if (keys.size() == 1) {
    s = storage_->Delete(DiskStorageKey(keys[0]));
  } else {
    std::vector<std::string> storage_keys;
    storage_keys.reserve(keys.size());
    for (const BlockKey& key : keys) {
      storage_keys.push_back(DiskStorageKey(key));
    }
    s = storage_->DeleteBatch(storage_keys);
  }
  if (!s.ok()) {
    WriteFailed(s);
    return forget();
  }
  MutexLock lock(&mu_);
  for (const BlockKey& key : keys) {
    auto it = record_slots_.find(key);
    if (it == record_slots_.end()) continue;
    slots_.Give(it->second);
    record_slots_.erase(it);
  }
}

Status DiskTierImpl::DeleteRecords(std::span<const std::string> storage_keys) {
  if (storage_keys.empty() || !Stopped().ok()) return Status::Ok();
  Status s = storage_->DeleteBatch(storage_keys);
  if (!s.ok()) WriteFailed(s);
  return s;
}

// Small blocks are read in I/Os of up to this many bytes (a block larger
// than it is one I/O of its own). Larger reads measured no faster on 2 MiB
// blocks (disk_bench, BENCHMARKS.md): from a cold page cache, several I/O
// threads each reading its own blocks kept the device busier than fewer,
// larger reads.
constexpr uint64_t kReadBatchBytes = uint64_t{2} << 20;
constexpr size_t kMaxReadBatch = 256;

void DiskTierImpl::ResolveLocked(Read* read) {
  ++counters_.gets;
  if (read->out.size() != options_.block_bytes) {
    read->status = Status::InvalidArgument(
        "disk tier Get: buffer is " + std::to_string(read->out.size()) +
        " bytes, a block is " + std::to_string(options_.block_bytes));
    return;
  }
  const DiskIndex::Entry* entry = index_.FindStored(read->key);
  if (entry == nullptr) {
    ++counters_.misses;
    read->status =
        Status::NotFound("block " + read->key.ToHex() + " is not on disk");
    return;
  }
  if (!std::ranges::equal(entry->tokens, read->tokens)) {
    ++counters_.misses;
    ++counters_.token_mismatches;
    read->status = Status::NotFound("block " + read->key.ToHex() +
                                    " is on disk for other token ids");
    return;
  }
  index_.Touch(read->key);
  read->generation = entry->generation;
  read->location = entry->location;
  slots_.AddReader(read->location.slot);
}

void DiskTierImpl::RunReads() {
  std::vector<Read> batch;
  {
    MutexLock lock(&mu_);
    uint64_t bytes = 0;
    while (!reads_.empty() && batch.size() < kMaxReadBatch &&
           (batch.empty() || bytes + options_.block_bytes <= kReadBatchBytes)) {
      batch.push_back(std::move(reads_.front()));
      reads_.pop_front();
      bytes += options_.block_bytes;
      ResolveLocked(&batch.back());
    }
  }
  if (batch.empty()) return;  // Another thread's batch took these Gets.
  std::vector<Read*> pinned;
  for (Read& read : batch) {
    if (read.status.ok()) pinned.push_back(&read);
  }
  std::sort(pinned.begin(), pinned.end(), [](const Read* a, const Read* b) {
    return a->location.slot < b->location.slot;
  });
  // Runs of raw blocks in adjacent slots that fill them (no gap between
  // one block's bytes and the next's) are one read.
  const bool contiguous = slot_bytes_ == options_.block_bytes;
  for (size_t first = 0; first < pinned.size();) {
    size_t last = first + 1;
    while (contiguous && last < pinned.size() &&
           pinned[first]->location.codec == DiskCodec::kNone &&
           pinned[last]->location.codec == DiskCodec::kNone &&
           pinned[last]->location.slot == pinned[last - 1]->location.slot + 1) {
      ++last;
    }
    ReadRun(std::span(pinned).subspan(first, last - first));
    first = last;
  }
  for (Read* read : pinned) {
    if (read->status.code() == StatusCode::kDataLoss) {
      read->status = Status::DataLoss("disk tier block " + read->key.ToHex() +
                                      " failed verification (" +
                                      read->status.message() + "); deleted");
    }
  }
  {
    MutexLock lock(&mu_);
    for (Read* read : pinned) {
      slots_.DropReader(read->location.slot);
      if (read->status.ok()) {
        ++counters_.hits;
      } else if (read->status.code() == StatusCode::kDataLoss) {
        ++counters_.checksum_failures;
      } else {
        ++counters_.read_errors;
      }
    }
  }
  // A value that failed verification is deleted. So is one the storage
  // could not read (a bad sector): kept, it would stay the most recently
  // used entry, cover its block on host (so it is never written again)
  // and fail every promotion of it. A read that may succeed when tried
  // again (no memory, a server's timeout) leaves it.
  for (Read* read : pinned) {
    if (!read->status.ok() && !IsTransientReadError(read->status)) {
      DropIfCurrent(read->key, read->generation);
    }
  }
  for (Read& read : batch) {
    VerifiedDone done = std::move(read.done);
    if (read.status.ok()) {
      done(read.location.payload_checksum);
    } else {
      done(std::move(read.status));
    }
  }
}

// A raw block read in place: its bytes against the record's checksum.
Status VerifyRaw(const ValueLocation& location,
                 std::span<const std::byte> out) {
  if (Checksum(AsChars(out)) != location.payload_checksum) {
    return Status::DataLoss("payload checksum mismatch");
  }
  return Status::Ok();
}

void DiskTierImpl::ReadRun(std::span<Read*> run) {
  if (run.size() > 1) {
    std::vector<std::span<std::byte>> outs;
    outs.reserve(run.size());
    for (Read* read : run) outs.push_back(read->out);
    Status s =
        storage_->ReadPayload(run.front()->location.slot * slot_bytes_, outs);
    if (s.ok()) {
      for (Read* read : run) {
        read->status = VerifyRaw(read->location, read->out);
      }
      return;
    }
    // One block of the run may be past the end of a damaged file: the
    // others are read on their own.
  }
  for (Read* read : run) read->status = ReadValue(read->location, read->out);
}

Status DiskTierImpl::ReadValue(const ValueLocation& location,
                               std::span<std::byte> out) {
  const uint64_t offset = location.slot * slot_bytes_;
  if (location.codec == DiskCodec::kNone) {
    // Straight into the caller's buffer (a host slot), then one pass to
    // verify it.
    const std::span<std::byte> outs[1] = {out};
    TIERKV_RETURN_IF_ERROR(storage_->ReadPayload(offset, outs));
    return VerifyRaw(location, out);
  }
  thread_local ScratchBuffer scratch;
  std::span<std::byte> stored(scratch.Get(location.stored_bytes),
                              location.stored_bytes);
  const std::span<std::byte> outs[1] = {stored};
  TIERKV_RETURN_IF_ERROR(storage_->ReadPayload(offset, outs));
  const ValueFields fields{.codec = location.codec,
                           .element_bytes = location.element_bytes,
                           .sequence = 0,
                           .payload_bytes = out.size(),
                           .stored_bytes = location.stored_bytes,
                           .payload_checksum = location.payload_checksum,
                           .stored_checksum = location.stored_checksum,
                           .slot = location.slot,
                           .fingerprint = {},
                           .token_bytes = {},
                           .stored = AsChars(stored)};
  return VerifyAndDecode(fields, out);
}

Status DiskTierImpl::CheckLayout(const ValueFields& fields) const {
  if (fields.fingerprint != options_.layout_fingerprint) {
    return Status::FailedPrecondition("written for layout \"" +
                                      std::string(fields.fingerprint) + "\"");
  }
  if (fields.payload_bytes != options_.block_bytes) {
    return Status::FailedPrecondition(
        "block of " + std::to_string(fields.payload_bytes) + " bytes");
  }
  return Status::Ok();
}

void DiskTierImpl::DeleteIfAbsent(const BlockKey& key) {
  bool absent = false;
  {
    MutexLock lock(&mu_);
    AcquireKey(key);
    absent = !index_.Contains(key);  // Else Put again: its writer owns it.
  }
  // A value left behind (degraded, or the delete failed) takes disk space
  // until the next Open verifies and indexes it again.
  if (absent) DeleteNow({&key, 1});
  ReleaseKeys({&key, 1});
}

void DiskTierImpl::PassOnEvicted(const EvictionSink& sink,
                                 std::span<const DiskIndex::Evicted> evicted) {
  if (evicted.empty()) return;
  thread_local ScratchBuffer buffer;
  const std::span<std::byte> payload(buffer.Get(options_.block_bytes),
                                     options_.block_bytes);
  for (const DiskIndex::Evicted& e : evicted) {
    const Status read = ReadValue(e.location, payload);
    if (read.ok()) sink(e.key, e.tokens, payload);
    MutexLock lock(&mu_);
    if (read.code() == StatusCode::kDataLoss) {
      ++counters_.checksum_failures;
    } else if (!read.ok()) {
      ++counters_.read_errors;
    }
    ReleaseKeyLocked(e.key);
  }
  MutexLock lock(&mu_);
  --passing_on_;
  busy_cv_.NotifyAll();
}

void DiskTierImpl::DropIfCurrent(const BlockKey& key, uint64_t generation) {
  bool erased = false;
  {
    MutexLock lock(&mu_);
    AcquireKey(key);
    erased = index_.EraseIf(key, generation);
  }
  if (erased) DeleteNow({&key, 1});
  ReleaseKeys({&key, 1});
}

DiskTierStats DiskTierImpl::stats() const {
  DiskTierStats out;
  out.capacity_bytes = options_.capacity_bytes;
  {
    MutexLock lock(&mu_);
    out.bytes = index_.bytes();
    out.keys = index_.stored_keys();
    out.evictions = index_.evictions();
    const Counters& c = counters_;
    out.puts = c.puts;
    out.put_failures = c.put_failures;
    out.gets = c.gets;
    out.hits = c.hits;
    out.misses = c.misses;
    out.checksum_failures = c.checksum_failures;
    out.read_errors = c.read_errors;
    out.token_mismatches = c.token_mismatches;
    out.dropped_on_open = c.dropped_on_open;
    out.layout_mismatches = c.layout_mismatches;
    out.payload_bytes_written = c.payload_bytes_written;
    out.stored_bytes_written = c.stored_bytes_written;
    out.degraded = !stopped_.ok() || low_space_ ? 1 : 0;
    out.writes_stopped = stopped_.ok() ? 0 : 1;
    out.undeleted_removals = c.undeleted_removals;
    out.write_errors = c.write_errors;
    out.space_refusals = c.space_refusals;
    out.damaged_files = damaged_files_.size();
  }
  out.file_bytes = file_bytes_;
  MaybeRefreshFileBytes();
  return out;
}

void DiskTierImpl::MaybeRefreshFileBytes() const {
  const Clock::rep now = Clock::now().time_since_epoch().count();
  if (now - file_bytes_read_ < kFileBytesAge.count()) return;
  if (file_bytes_reading_.exchange(true)) return;  // Already queued.
  io_->Submit([this] {
    file_bytes_ = storage_->FileBytes();
    file_bytes_read_ = Clock::now().time_since_epoch().count();
    file_bytes_reading_ = false;
  });
}

// One value found by Open's scan.
struct FoundValue {
  BlockKey key;
  uint64_t sequence = 0;
  uint64_t bytes = 0;
  std::vector<TokenId> tokens;
  ValueLocation location;
};

// Reports a rebuild's progress at least every 1% of the bytes to read.
class Progress {
 public:
  Progress(std::function<void(const RebuildProgress&)> fn, uint64_t total)
      : fn_(std::move(fn)), step_(std::max<uint64_t>(1, total / 100)) {
    p_.total_bytes = total;
  }
  void Step(uint64_t bytes) {
    ++p_.values;
    p_.bytes_read += bytes;
    p_.total_bytes = std::max(p_.total_bytes, p_.bytes_read);
    if (fn_ && p_.bytes_read >= next_) {
      next_ = p_.bytes_read + step_;
      fn_(p_);
    }
  }
  void Finish() {
    p_.done = true;
    p_.total_bytes = p_.bytes_read;
    if (fn_) fn_(p_);
  }

 private:
  std::function<void(const RebuildProgress&)> fn_;
  RebuildProgress p_;
  uint64_t step_;
  uint64_t next_ = 0;
};

StatusOr<std::optional<std::string>> DiskTierImpl::ReadFingerprint() {
  std::optional<std::string> recorded;
  Status s = storage_->Get(DiskFingerprintKey(), [&](std::string_view value) {
    recorded.emplace(value);
    return Status::Ok();
  });
  if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  return recorded;
}

Status DiskTierImpl::FingerprintMismatch(std::string_view stored,
                                         uint64_t values) const {
  const std::string where = options_.storage.path.empty()
                                ? std::string("the disk tier")
                                : "the disk tier at " + options_.storage.path;
  return Status::FailedPrecondition(
      where + " holds " + std::to_string(values) + " blocks of \"" +
      std::string(stored) + "\", not of this store's \"" +
      options_.layout_fingerprint +
      "\"; they are kept. Start with the --model and layout they were "
      "written for, point --disk-dir at another directory, or start with "
      "--disk-reset to drop them");
}

// Runs on the Open thread before the I/O threads start: no lock contention,
// but the index is still only touched under mu_.
Status DiskTierImpl::Rebuild() {
  const Status writable = storage_->Writable();
  if (!writable.ok()) {
    MutexLock lock(&mu_);
    stopped_ = writable;
  }
  TIERKV_ASSIGN_OR_RETURN(std::optional<std::string> recorded,
                          ReadFingerprint());
  std::vector<FoundValue> found;
  std::vector<std::string> bad;
  uint64_t layout_mismatches = 0;
  std::optional<std::string> other;  // A fingerprint of another store.
  // Records only: the blocks' bytes are verified when a Get reads them.
  TIERKV_ASSIGN_OR_RETURN(const uint64_t value_file_bytes,
                          storage_->ValueFileBytes());
  // Past every record read, dropped ones included: a new write's sequence
  // is above all of them.
  uint64_t max_sequence = 0;
  Progress progress(options_.progress, storage_->IndexBytes());
  TIERKV_RETURN_IF_ERROR(storage_->ForEach(
      [&](std::string_view key, std::string_view value) -> Status {
        if (key == DiskFingerprintKey()) return Status::Ok();
        progress.Step(key.size() + value.size());
        if (options_.cancelled && options_.cancelled()) {
          return Status::Unavailable(
              "disk tier: opening cancelled (tierkvd is stopping)");
        }
        std::optional<BlockKey> block_key = ParseStorageKey(key);
        StatusOr<ValueFields> fields = ParseHeader(value);
        if (fields.ok())
          max_sequence = std::max(max_sequence, fields->sequence);
        if (fields.ok() && (fields->slot > value_file_bytes / slot_bytes_ ||
                            fields->slot * slot_bytes_ + fields->stored_bytes >
                                value_file_bytes)) {
          // Its bytes were never written (the value file was cut or lost).
          fields = Status::DataLoss("slot past the end of the value file");
        }
        if (!block_key || !fields.ok()) {
          bad.emplace_back(key);
          return Status::Ok();
        }
        if (!CheckLayout(*fields).ok()) {
          if (!other) other.emplace(fields->fingerprint);
          bad.emplace_back(key);
          ++layout_mismatches;
          return Status::Ok();
        }
        FoundValue v{
            .key = *block_key,
            .sequence = fields->sequence,
            .bytes =
                DiskValueBytes(options_.block_bytes, fields->fingerprint.size(),
                               fields->token_bytes.size() / sizeof(TokenId)) -
                slot_bytes_ + SlotBytes(fields->stored_bytes),
            .tokens = {},
            .location = {.slot = fields->slot,
                         .stored_bytes = fields->stored_bytes,
                         .payload_checksum = fields->payload_checksum,
                         .stored_checksum = fields->stored_checksum,
                         .codec = fields->codec,
                         .element_bytes = fields->element_bytes}};
        v.tokens.resize(fields->token_bytes.size() / sizeof(TokenId));
        std::memcpy(v.tokens.data(), fields->token_bytes.data(),
                    fields->token_bytes.size());
        found.push_back(std::move(v));
        return Status::Ok();
      }));
  // Decided before anything is deleted. A store recorded as another's (or,
  // written before the record, holding only another's values) is refused
  // while it holds any; stray values in a store of this one are dropped.
  const bool another_store =
      recorded ? *recorded != options_.layout_fingerprint : found.empty();
  if (another_store && other && !options_.reset) {
    return FingerprintMismatch(recorded ? *recorded : *other,
                               layout_mismatches);
  }
  // Newest first: of two records naming one slot (a machine crash lost the
  // delete of the older one, whose slot was then written again), the newer
  // owns it and the older is dropped.
  std::sort(found.begin(), found.end(),
            [](const FoundValue& a, const FoundValue& b) {
              return a.sequence > b.sequence;
            });
  std::unordered_set<uint64_t> claimed;
  std::erase_if(found, [&](const FoundValue& v) {
    if (claimed.insert(v.location.slot).second) return false;
    bad.push_back(DiskStorageKey(v.key));
    return true;
  });
  std::reverse(found.begin(), found.end());  // Write order: the LRU's.
  (void)DeleteRecords(bad);
  if (recorded != options_.layout_fingerprint && Stopped().ok()) {
    const std::string_view parts[] = {options_.layout_fingerprint};
    Status s = storage_->Put(DiskFingerprintKey(), parts);
    if (!s.ok()) WriteFailed(s);
  }
  std::vector<BlockKey> victims;
  {
    MutexLock lock(&mu_);
    std::vector<uint64_t> used;
    used.reserve(found.size());
    for (FoundValue& v : found) {
      used.push_back(v.location.slot);
      record_slots_[v.key] = v.location.slot;
      index_.InsertStored(v.key, v.bytes, std::move(v.tokens), v.location);
    }
    slots_.Restore(used);
    index_.EvictToCapacity(&victims);
    counters_.dropped_on_open = bad.size();
    counters_.layout_mismatches = layout_mismatches;
  }
  damaged_files_ = storage_->DamagedFiles();
  DeleteNow(victims);
  // Past the last slot in use (evicted blocks' slots given back) the file
  // holds only bytes no record names, and so do the free slots below it.
  ShrinkValueFile();
  file_bytes_ = storage_->FileBytes();
  file_bytes_read_ = Clock::now().time_since_epoch().count();
  {
    MutexLock lock(&mu_);
    next_sequence_ = max_sequence + 1;
  }
  progress.Finish();
  if (!writable.ok()) Report(writable);
  return Status::Ok();
}

Status ValidateOptions(const DiskTierOptions& o) {
  if (o.capacity_bytes == 0) {
    return Status::InvalidArgument("disk tier: capacity_bytes is 0");
  }
  if (o.reserved_bytes >= o.capacity_bytes) {
    return Status::InvalidArgument(
        "disk tier: reserved_bytes must be less than capacity_bytes");
  }
  if (o.layout_fingerprint.empty() || o.layout_fingerprint.size() > 4096) {
    return Status::InvalidArgument(
        "disk tier: layout_fingerprint must be 1 to 4096 bytes");
  }
  if (o.block_bytes == 0) {
    return Status::InvalidArgument("disk tier: block_bytes is 0");
  }
  if (o.io_threads < 1 || o.io_threads > 64) {
    return Status::InvalidArgument("disk tier: io_threads must be 1 to 64");
  }
  Status codec = CheckCodecArgs(o.codec, o.element_bytes, o.block_bytes);
  if (!codec.ok()) {
    return Status::InvalidArgument("disk tier: " + codec.message());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options) {
  TIERKV_RETURN_IF_ERROR(ValidateOptions(options));
  auto open = [&options]() -> StatusOr<std::unique_ptr<DiskTier>> {
    TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<DiskStorage> storage,
                            OpenRocksDbStorage(options.storage));
    return Open(options, std::move(storage));
  };
  StatusOr<std::unique_ptr<DiskTier>> tier = open();
  if (tier.ok() || tier.status().code() != StatusCode::kDataLoss ||
      !options.reset) {
    return tier;
  }
  // Damage RocksDB cannot open, or the scan cannot step over (an SST's key
  // blocks): start empty. The failed attempt has closed the database.
  TIERKV_RETURN_IF_ERROR(DestroyRocksDbStorage(options.storage.path));
  return open();
}

StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options, std::unique_ptr<DiskStorage> storage) {
  TIERKV_RETURN_IF_ERROR(ValidateOptions(options));
  if (storage == nullptr) {
    return Status::InvalidArgument("disk tier: storage is null");
  }
  auto tier = std::make_unique<DiskTierImpl>(options, std::move(storage));
  TIERKV_RETURN_IF_ERROR(tier->Rebuild());
  tier->Start();
  return std::unique_ptr<DiskTier>(std::move(tier));
}

}  // namespace tierkv
