// RemoteTier: a LowerTier on a Redis Cluster that several machines share.
// Blocks go to Redis as verified values under keys that carry the store
// fingerprint and the tenant; an optional TTL and a byte bound limit what
// this tier keeps. It learns of blocks other machines wrote by scanning the
// cluster (see Contains).
// Thread-safety: every method may be called from any thread; Redis I/O and
// every `done` callback run on the tier's one I/O thread (jobs in order;
// promotions queued one behind another are read in one pipeline, each
// value read off the socket straight into its slot, header aside, and
// verified there before it is served); scans run on a thread of their own,
// with a client of their own.
//
// Redis key: "tierkv:<XXH3-64 of the store fingerprint, 16 hex>:<tenant>:
// <block key, 32 hex>" (no braces, so keys spread over every slot).
// Value (little-endian), written and verified by this tier only:
//   u32 magic "TKVR" | u16 format version (1) | u16 fingerprint length
//   | u32 token count | u64 block key hi | u64 block key lo
//   | u64 payload bytes | u64 payload checksum (XXH3-64 of the payload)
//   | fingerprint | u32 token ids
//   | u64 header checksum (XXH3-64 of every header byte before it)
//   | payload (one host slot's bytes)
// A value is served only when all of it verifies and it names this store's
// fingerprint, this block key and these token ids: another model's value, a
// torn or damaged value, or a block whose key collides is never served. (A
// value exactly as long as this block's is read into the slot and verified
// there, so after such a miss the slot holds garbage, as Promote allows; a
// value of any other length never reaches the slot.) A damaged value is
// deleted; a colliding one is left alone.
//
// What the tier knows, without I/O (Contains):
//   - its index: the blocks this process wrote, with their token ids;
//   - the known keys: the keys of its prefix that the last scans found on
//     the masters (every machine's), by key alone.
// A block in the index:
//   absent --Spill or Demote (SET acknowledged, and no Remove of the key
//          since it was queued: then Aborted, and the DEL queued behind it
//          deletes the value)--> STORED (most recently used)
//   STORED --Promote (verified)--> STORED, most recently used
//   STORED --Remove / evicted past capacity_bytes / found damaged / found
//          gone by a Promote / not found by a whole scan that began after
//          it was written--> absent (DEL sent for the first three)
//   STORED --its TTL runs out--> neither contained nor covering, and
//          absent at the next spill or scan (no DEL: Redis expired it)
// A known key:
//   absent --a scan finds it--> KNOWN --a whole scan does not find it /
//   Remove / RemoveAll / evicted past capacity_bytes / a Promote finds no
//   value or another block's--> absent
// A scan cut short by a failed master only adds keys. Keys removed while a
// scan runs, or whose DEL has not run yet, are not added back by it.
#ifndef TIERKV_TIERS_REMOTE_TIER_H_
#define TIERKV_TIERS_REMOTE_TIER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "src/cache_event_sink.h"
#include "src/lower_tier.h"
#include "src/mutex.h"
#include "tiers/redis_cluster.h"

namespace tierkv {

struct RemoteTierOptions {
  // Required: the cluster (seeds and timeouts).
  RedisClusterOptions redis;
  // Required: StoreFingerprint(layout, model) of the store
  // (tierkv/kv_layout.h). Values of another fingerprint are never served.
  std::string store_fingerprint;
  // Required: 1 to 64 of [A-Za-z0-9_.-]. Part of every Redis key.
  std::string tenant;
  // Required: the bytes of one host slot (one block).
  size_t block_bytes = 0;
  // Required: the memory of host slot `slot` (block_bytes long). Spill
  // reads it and Promote writes it on the I/O thread, while the
  // coordinator pins the slot.
  std::function<std::span<std::byte>(BlockId slot)> slot_memory;
  // Expiry of each value in Redis; 0: none. Default: none.
  std::chrono::milliseconds ttl{0};
  // Bound on the value bytes this tier keeps in its index; past it, the
  // least recently used are deleted. 0: unbounded. Default: unbounded.
  uint64_t capacity_bytes = 0;
  // Between the starts of two scans of every master for the keys of this
  // store and tenant (the first runs at Open); 0: no scans, Contains knows
  // only this process's blocks. Default: 0 (tierkvd's default is 1 s).
  std::chrono::milliseconds scan_interval{0};
  // Keys a SCAN step asks each master for (SCAN's COUNT). Default: 1000.
  size_t scan_count = 1000;
  // Bound on the known keys scans keep (about 64 bytes each); keys past it
  // are not kept (known_keys_dropped). Default: 1 << 20.
  size_t max_known_keys = size_t{1} << 20;
  // Told of every block this tier's index gains or loses
  // (CacheMedium::kRemote): the blocks this process wrote, as a router
  // follows them; others' blocks are their writers' to report. Called with
  // the tier's lock held, from the I/O and scan threads and from Remove and
  // RemoveAll. Default: none.
  CacheEventSink* cache_events = nullptr;
  // Tokens per full block, for BlockStored events. Default: 0.
  int32_t block_size = 0;
  // Bound on the bytes of demoted blocks (Demote) waiting for the I/O
  // thread: past it a Demote fails at once (ResourceExhausted, counted in
  // put_failures) rather than queue without bound while Redis takes blocks
  // slower than the tier above evicts them; one block is always taken.
  // Default: 64 MiB.
  uint64_t max_demotion_backlog_bytes = uint64_t{64} << 20;
};

class RemoteTier final : public LowerTier {
 public:
  // Connects (RedisClusterClient::Open) and starts the I/O thread.
  static StatusOr<std::unique_ptr<RemoteTier>> Open(RemoteTierOptions options);
  // Runs every queued job (each `done` is called), then stops (a scan in
  // progress finishes first).
  ~RemoteTier() override;

  // Whether this tier's index holds `key` for these tokens, or the last
  // scans found `key` (for tokens unknown: Promote checks them). Never
  // waits on I/O; a block another machine wrote becomes visible at the
  // first scan that finds it.
  // A block of the index whose TTL has run out (counted from when its
  // write was sent) is not contained, whether or not a scan has dropped it
  // yet.
  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override;
  // Whether the host may drop its copy of the block without a spill: the
  // index holds it and its TTL has not run out. A key known only from a
  // scan covers only without a TTL: another machine wrote it at a time
  // this tier does not know, so it may expire at once, and a spill would
  // write it anew with a whole TTL. (Without a TTL, a key another machine
  // deletes after the last scan is the one case where the host still drops
  // its last copy; the block is then a miss, never wrong bytes.)
  bool Covers(const BlockKey& key,
              std::span<const TokenId> tokens) const override;
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             std::optional<uint64_t> checksum, Done done) override;
  // As Spill, from `payload` (block_bytes) instead of a host slot; fails at
  // once past options.max_demotion_backlog_bytes.
  void Demote(const BlockKey& key, std::span<const TokenId> tokens,
              std::vector<std::byte> payload, Done done) override;
  // Reads and verifies the value whether or not the index lists it.
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, PromoteDone done) override;
  // Forgets the key and deletes its value from the cluster, whoever wrote
  // it.
  LowerRemoval Remove(const BlockKey& key) override;
  // As Remove, unless the key is only known (found by a scan, neither in
  // the index nor being written by this process): no spill of this
  // process's wrote it (one would be in the index or being written), so
  // there is nothing to undo, and another machine's value stays.
  LowerRemoval RemoveSpilled(const BlockKey& key) override;
  // Forgets every key and deletes the values this process wrote; other
  // machines' blocks come back with the next scan. Spills of host slots
  // in flight land (LowerTier's contract); demotions queued before it (the
  // disk tier's evictions) are not kept: Aborted, their values deleted.
  LowerRemoval RemoveAll() override;
  // The blocks in this tier's index (those this process spilled), most
  // recently used first.
  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const override;
  // kRemote: StoredKeys; none on any other medium.
  std::vector<BlockKey> KeysOn(CacheMedium medium, size_t max,
                               uint64_t* total) const override {
    if (medium == CacheMedium::kRemote) return StoredKeys(max, total);
    *total = 0;
    return {};
  }
  DiskTierStats stats() const override;
  // None: this tier is no disk tier.
  std::optional<DiskTierStats> disk_stats() const override {
    return std::nullopt;
  }
  std::optional<RemoteTierStats> remote_stats() const override;
  void WaitQueued() override;

  // The Redis key of `key` in this store and tenant.
  std::string RedisKey(const BlockKey& key) const;

 private:
  struct Job;
  struct Entry {
    std::vector<TokenId> tokens;
    uint64_t bytes = 0;
    std::list<BlockKey>::iterator lru;  // Into lru_.
    uint64_t scan = 0;                  // scans_started_ when it was written.
    // When its TTL runs out (counted from when the SET was sent); max()
    // without a TTL.
    std::chrono::steady_clock::time_point expires;
  };

  RemoteTier(RemoteTierOptions options,
             std::unique_ptr<RedisClusterClient> client,
             std::unique_ptr<RedisClusterClient> scan_client);
  void Enqueue(Job job) TIERKV_EXCLUDES(mu_);
  void RunJobs() TIERKV_EXCLUDES(mu_);
  void RunSpill(Job& job) TIERKV_EXCLUDES(mu_);
  // A spill's or demotion's end: no longer being written, then `done`.
  void FinishWrite(Job& job, Status status) TIERKV_EXCLUDES(mu_);
  // Promotions queued one after another, read in one pipelined MultiGet.
  void RunPromotes(std::vector<Job>& batch) TIERKV_EXCLUDES(mu_);
  struct Read;
  // One promotion's outcome (what its GET and the value's verification
  // found; a value that verified is in its slot already) applied to the
  // index and the stats, and its `done` called.
  void FinishPromote(Job& job, const std::string& redis_key, const Read& read,
                     uint64_t removals_before) TIERKV_EXCLUDES(mu_);
  // Drops `key` from the index (a BlockRemoved event when `report`); the
  // bytes it held, 0 when it held none.
  // Drops the index's blocks whose TTL has run out by `now` (reported as
  // removed), so that they neither hold capacity_bytes nor hide a value
  // another machine wrote under the key since.
  void DropExpiredLocked(std::chrono::steady_clock::time_point now)
      TIERKV_REQUIRES(mu_);
  uint64_t EraseLocked(const BlockKey& key, bool report = true)
      TIERKV_REQUIRES(mu_);
  // Adds `key` to, or drops it from, the known keys.
  void AddKnownLocked(const BlockKey& key) TIERKV_REQUIRES(mu_);
  void DropKnownLocked(const BlockKey& key) TIERKV_REQUIRES(mu_);
  // `key`'s value is to be deleted (its DEL queued or about to run): no
  // longer known, not found again by a scan that listed it before, and a
  // write of it queued before the DEL does not enter the index (RunSpill),
  // until EndDeletesLocked says the DEL has run.
  void BeginDeleteLocked(const BlockKey& key) TIERKV_REQUIRES(mu_);
  void EndDeletesLocked(std::span<const BlockKey> keys) TIERKV_REQUIRES(mu_);
  // The I/O thread: DELs the values of `keys` (each begun with
  // BeginDeleteLocked), with some of those whose DEL failed before; a key
  // whose DEL fails again stays deleting and waits for the next try (the
  // next DELs, or the next scan), so that no scan finds its value again
  // meanwhile.
  void DeleteValues(std::vector<BlockKey> keys) TIERKV_EXCLUDES(mu_);
  // The scan thread: a scan every scan_interval until the tier stops.
  void RunScans() TIERKV_EXCLUDES(mu_);
  void RunScan() TIERKV_EXCLUDES(mu_);
  // Applies scan number `scan`'s keys, `found` (as a set); `whole`: every
  // master was scanned to its end. The set is built, and the known keys it
  // replaces freed, outside the lock: a scan of a million keys would
  // otherwise stall every lookup (Contains) for a good part of a second.
  using KeySet = std::unordered_set<BlockKey, BlockKeyHash>;
  void ApplyScanLocked(uint64_t scan, KeySet* found, bool whole)
      TIERKV_REQUIRES(mu_);

  const RemoteTierOptions options_;
  const std::string key_prefix_;  // "tierkv:<fingerprint hash>:<tenant>:"
  const std::unique_ptr<RedisClusterClient> client_;  // Used by the thread.
  // Used by the scan thread; null without scans.
  const std::unique_ptr<RedisClusterClient> scan_client_;

  mutable Mutex mu_;
  CondVar work_;
  CondVar idle_;       // Signalled when the I/O thread has no job left.
  CondVar scan_wake_;  // Signalled when the tier stops.
  std::deque<Job> jobs_ TIERKV_GUARDED_BY(mu_);
  // Payload bytes of the demotions in jobs_.
  uint64_t demotion_backlog_bytes_ TIERKV_GUARDED_BY(mu_) = 0;
  bool running_job_ TIERKV_GUARDED_BY(mu_) = false;
  bool stopping_ TIERKV_GUARDED_BY(mu_) = false;
  // Keys the scans found (see the header comment).
  std::unordered_set<BlockKey, BlockKeyHash> known_ TIERKV_GUARDED_BY(mu_);
  // Index keys not in known_: known_keys is known_.size() plus these.
  uint64_t index_unscanned_ TIERKV_GUARDED_BY(mu_) = 0;
  // Scans started; keys removed since the latest one started, and whether
  // RemoveAll ran since.
  uint64_t scans_started_ TIERKV_GUARDED_BY(mu_) = 0;
  std::unordered_set<BlockKey, BlockKeyHash> removed_in_scan_
      TIERKV_GUARDED_BY(mu_);
  bool cleared_in_scan_ TIERKV_GUARDED_BY(mu_) = false;
  // RemoveAll calls: a demotion queued before one is not kept.
  uint64_t clears_ TIERKV_GUARDED_BY(mu_) = 0;
  // Keys whose DEL is queued or running (Remove, RemoveAll, evictions past
  // capacity_bytes), with how many DELs: a scan that starts before the DEL
  // lands must not find them again, and a write of the key queued before
  // it must not enter the index.
  std::unordered_map<BlockKey, int, BlockKeyHash> deleting_
      TIERKV_GUARDED_BY(mu_);
  // Of deleting_, the keys whose DEL failed (a node down or stalled), with
  // how many of their deletes it owes: tried again, at most
  // kDeleteRetriesPerBatch at a time, with the next DELs or at the next
  // scan.
  std::unordered_map<BlockKey, int, BlockKeyHash> failed_deletes_
      TIERKV_GUARDED_BY(mu_);
  // Keys whose SET is queued or running (spills and demotions), with how
  // many: what RemoveSpilled must undo although no scan credits it to us.
  std::unordered_map<BlockKey, int, BlockKeyHash> writing_
      TIERKV_GUARDED_BY(mu_);
  // RemoteTierStats counters that DiskTierStats lacks.
  uint64_t io_errors_ TIERKV_GUARDED_BY(mu_) = 0;    // client_'s errors.
  uint64_t scan_errors_ TIERKV_GUARDED_BY(mu_) = 0;  // scan_client_'s.
  uint64_t bytes_read_ TIERKV_GUARDED_BY(mu_) = 0;
  uint64_t scan_passes_ TIERKV_GUARDED_BY(mu_) = 0;
  uint64_t scan_failures_ TIERKV_GUARDED_BY(mu_) = 0;
  uint64_t known_keys_dropped_ TIERKV_GUARDED_BY(mu_) = 0;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index_
      TIERKV_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ TIERKV_GUARDED_BY(mu_);  // Most recent first.
  // Under a TTL, each write's expiry and key, oldest first (one TTL for
  // all: in write order); an entry whose key was written again since is
  // skipped when its time comes.
  std::deque<std::pair<std::chrono::steady_clock::time_point, BlockKey>>
      expiries_ TIERKV_GUARDED_BY(mu_);
  // Counts Remove and RemoveAll calls, so a promotion that read a value
  // before its block was removed does not serve it.
  uint64_t removals_ TIERKV_GUARDED_BY(mu_) = 0;
  DiskTierStats stats_ TIERKV_GUARDED_BY(mu_);
  std::thread thread_;
  std::thread scan_thread_;  // Not started without scans.
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_REMOTE_TIER_H_
