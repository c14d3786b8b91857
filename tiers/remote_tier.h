// RemoteTier: a LowerTier on a Redis Cluster that several machines share (a
// first cut: what it stores and verifies is settled, how it learns of
// blocks other machines wrote is not, see Contains). Blocks go to Redis as
// verified values under keys that carry the store fingerprint and the
// tenant; an optional TTL and a byte bound limit what this tier keeps.
// Thread-safety: every method may be called from any thread; Redis I/O and
// every `done` callback run on the tier's one I/O thread.
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
// torn or damaged value, or a block whose key collides is never copied into
// a slot. A damaged value is deleted; a colliding one is left alone.
//
// A block in this tier's index:
//   absent --Spill (SET acknowledged)--> STORED (most recently used)
//   STORED --Promote (verified)--> STORED, most recently used
//   STORED --Remove / evicted past capacity_bytes / found damaged-->
//          absent (DEL sent)
// The index knows only blocks this process wrote; a TTL may expire a value
// the index still lists (Promote then misses).
#ifndef TIERKV_TIERS_REMOTE_TIER_H_
#define TIERKV_TIERS_REMOTE_TIER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

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
};

class RemoteTier final : public LowerTier {
 public:
  // Connects (RedisClusterClient::Open) and starts the I/O thread.
  static StatusOr<std::unique_ptr<RemoteTier>> Open(RemoteTierOptions options);
  // Runs every queued job (each `done` is called), then stops.
  ~RemoteTier() override;

  // Whether this tier's index holds `key` for these tokens. Never waits on
  // I/O, so it knows only blocks this process spilled: a block another
  // machine wrote is in Redis but not here (the open question of a shared
  // tier: learn of such blocks by a periodic SCAN, by keyspace
  // notifications, or by a Contains that may answer "maybe" and let
  // Promote decide).
  bool Contains(const BlockKey& key,
                std::span<const TokenId> tokens) const override;
  void Spill(const BlockKey& key, std::span<const TokenId> tokens, BlockId slot,
             std::optional<uint64_t> checksum, Done done) override;
  // Reads and verifies the value whether or not the index lists it.
  void Promote(const BlockKey& key, std::span<const TokenId> tokens,
               BlockId slot, PromoteDone done) override;
  bool Remove(const BlockKey& key) override;
  uint64_t RemoveAll() override;
  // The blocks in this tier's index (those this process spilled), most
  // recently used first.
  std::vector<BlockKey> StoredKeys(size_t max, uint64_t* total) const override;
  DiskTierStats stats() const override;

  // The Redis key of `key` in this store and tenant.
  std::string RedisKey(const BlockKey& key) const;

 private:
  struct Job;
  struct Entry {
    std::vector<TokenId> tokens;
    uint64_t bytes = 0;
    std::list<BlockKey>::iterator lru;  // Into lru_.
  };

  RemoteTier(RemoteTierOptions options,
             std::unique_ptr<RedisClusterClient> client);
  void Enqueue(Job job) TIERKV_EXCLUDES(mu_);
  void RunJobs() TIERKV_EXCLUDES(mu_);
  void RunSpill(Job& job) TIERKV_EXCLUDES(mu_);
  void RunPromote(Job& job) TIERKV_EXCLUDES(mu_);
  // Drops `key` from the index; the bytes it held.
  uint64_t EraseLocked(const BlockKey& key) TIERKV_REQUIRES(mu_);

  const RemoteTierOptions options_;
  const std::string key_prefix_;  // "tierkv:<fingerprint hash>:<tenant>:"
  const std::unique_ptr<RedisClusterClient> client_;  // Used by the thread.
  std::vector<char> scratch_;  // A value read by Promote; the thread's.

  mutable Mutex mu_;
  CondVar work_;
  std::deque<Job> jobs_ TIERKV_GUARDED_BY(mu_);
  bool stopping_ TIERKV_GUARDED_BY(mu_) = false;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index_
      TIERKV_GUARDED_BY(mu_);
  std::list<BlockKey> lru_ TIERKV_GUARDED_BY(mu_);  // Most recent first.
  // Counts Remove and RemoveAll calls, so a promotion that read a value
  // before its block was removed does not serve it.
  uint64_t removals_ TIERKV_GUARDED_BY(mu_) = 0;
  DiskTierStats stats_ TIERKV_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_REMOTE_TIER_H_
