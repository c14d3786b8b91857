// Internal to the disk tier's sources (tiers/disk_*.cc), not part of tierkv's
// API: the declarations they share. Format limits and scratch buffers, the
// codecs' argument check (disk_codec.cc), storage keys and the value header
// (disk_value.cc), and the in-memory index (disk_index.cc). The value format
// itself is described in disk_tier.h.
#ifndef TIERKV_TIERS_DISK_INTERNAL_H_
#define TIERKV_TIERS_DISK_INTERNAL_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "src/cache_event_sink.h"
#include "src/ghost_keys.h"
#include "tierkv/block_pool_options.h"
#include "tiers/disk_tier.h"

namespace tierkv {

// Headers, keys and token ids are written in host order and read back with
// memcpy; the on-disk format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "the disk tier's value format assumes a little-endian host");

namespace disk_internal {

inline constexpr size_t kMaxPayloadBytes = size_t{1} << 30;
inline constexpr uint32_t kMaxTokens = 1 << 16;
// Slots of the value file start at multiples of kSlotAlign (the page size
// of every filesystem tierkv runs on), so no two blocks share a page.
inline constexpr uint64_t kSlotAlign = 4096;
// Far beyond any disk (2^40 slots of a 4 KiB block is 4 EiB); a header
// naming a slot past it is damaged.
inline constexpr uint64_t kMaxSlot = uint64_t{1} << 40;

// Bytes of one slot of the value file for blocks of `block_bytes`.
constexpr uint64_t SlotBytes(uint64_t block_bytes) {
  return (block_bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
}

inline std::string_view AsChars(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A growable buffer that is never zero-filled: codecs overwrite it whole.
class ScratchBuffer {
 public:
  std::byte* Get(size_t bytes) {
    if (bytes > capacity_) {
      data_.reset(new std::byte[bytes]);
      capacity_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t capacity_ = 0;
};

// ---------------------------------------------------------------------------
// Payload codecs (disk_codec.cc).

// Checks a codec's arguments against a payload of `payload_bytes`.
Status CheckCodecArgs(DiskCodec codec, int32_t element_bytes,
                      size_t payload_bytes);

// ---------------------------------------------------------------------------
// Storage keys and the value header (disk_value.cc).

// The block key of a storage key written by DiskStorageKey; nullopt for any
// other key.
std::optional<BlockKey> ParseStorageKey(std::string_view key);

struct ValueFields {
  DiskCodec codec = DiskCodec::kNone;
  int32_t element_bytes = 0;
  uint64_t sequence = 0;
  uint64_t payload_bytes = 0;
  uint64_t stored_bytes = 0;  // The size of the stored bytes.
  uint64_t payload_checksum = 0;
  uint64_t stored_checksum = 0;
  uint64_t slot = 0;  // Where the stored bytes are in the value file.
  std::string_view fingerprint;
  std::string_view token_bytes;  // num_tokens u32s, little-endian.
  // The stored bytes: not part of the header. Set by the writer, and by a
  // reader once it has read them from the value file.
  std::string_view stored;
};

// XXH3-64 of `bytes`.
uint64_t Checksum(std::string_view bytes);

// The header of a value, its checksum included; the stored bytes follow.
std::string EncodeHeader(const ValueFields& f);

// Parses and verifies a header (the whole of a block's RocksDB record);
// the stored bytes, read from the value file, are VerifyStored's.
StatusOr<ValueFields> ParseHeader(std::string_view value);

// Verifies f.stored against the header's size and checksum.
Status VerifyStored(const ValueFields& f);

// Verifies the stored bytes and decodes them into `out` (the payload size),
// verifying the payload checksum.
Status VerifyAndDecode(const ValueFields& f, std::span<std::byte> out);

// Whether a header's token bytes are `tokens`.
bool SameTokens(std::string_view token_bytes, std::span<const TokenId> tokens);

// Where a stored block's bytes are in the value file and how to check
// them: all a Get needs, without reading the block's record.
struct ValueLocation {
  uint64_t slot = 0;
  uint64_t stored_bytes = 0;
  uint64_t payload_checksum = 0;
  uint64_t stored_checksum = 0;
  DiskCodec codec = DiskCodec::kNone;
  int32_t element_bytes = 0;  // The codec's.
};

// ---------------------------------------------------------------------------
// The value file's slots (disk_index.cc). A write takes a slot; the slot
// belongs to its key's record once the record lands, and comes back when
// that record is deleted or replaced (or the write fails). A slot that
// comes back while a Get reads it is free only once its last reader is
// done, so no read ever sees another block's bytes land under it. Taking
// the lowest free slot keeps the file as short as the blocks it holds.
// Not thread-safe; DiskTierImpl guards it with mu_.
class SlotAllocator {
 public:
  uint64_t Take();
  void Give(uint64_t slot);
  void AddReader(uint64_t slot) { ++readers_[slot]; }
  void DropReader(uint64_t slot);
  // Open: every slot below the highest of `used` that is not in it is free.
  void Restore(std::span<const uint64_t> used);
  // One past the highest slot taken: the value file needs end() slots.
  uint64_t end() const { return end_; }
  // Forgets the free slots at the end (the file can be cut there); returns
  // the new end().
  uint64_t TrimEnd();
  // The free slots below end(), as runs of (first slot, slots), in order.
  std::vector<std::pair<uint64_t, uint64_t>> FreeRuns() const;

 private:
  std::set<uint64_t> free_;
  uint64_t end_ = 0;
  std::unordered_map<uint64_t, uint32_t> readers_;
  std::unordered_set<uint64_t> given_while_read_;
};

// ---------------------------------------------------------------------------
// The index (disk_index.cc): which keys the tier holds, their sizes, tokens,
// value locations and eviction order, and the byte bound. Not thread-safe;
// DiskTierImpl guards it with mu_.
//
// Eviction order (DiskTierOptions::eviction). kLru: one list, least
// recently stored or read first. kArc: the host pool's ARC (BlockPool,
// src/block_pool.h) in bytes: keys never read since stored wait in a
// recent list, keys read (promoted) at least once, or stored again soon
// after their eviction (a ghost), in a frequent one. A victim comes from
// the recent list while its bytes exceed an adaptive target, else it is
// the older of the two lists' oldest keys. The target starts at the whole
// capacity, so the tier evicts in LRU order until a key evicted from the
// frequent list comes back (it lowers the target: blocks written once then
// leave first); one from the recent list raises it again.
class DiskIndex {
 public:
  struct Entry {
    uint64_t generation = 0;  // The Put it belongs to (0: found by Open).
    uint64_t bytes = 0;
    bool stored = false;  // false: WRITING.
    // kArc: read since stored, or stored again soon after an eviction; it
    // waits in the frequent list.
    bool reused = false;
    // The index's use clock when the key was last stored or read: which of
    // the two lists' oldest keys is older.
    uint64_t used_at = 0;
    std::vector<TokenId> tokens;
    ValueLocation location;             // Valid iff stored.
    std::list<BlockKey>::iterator lru;  // Valid iff stored.
  };

  // A STORED entry evicted for room, as an eviction sink needs it.
  struct Evicted {
    BlockKey key;
    std::vector<TokenId> tokens;
    ValueLocation location;
  };

  // `events`, when set, hears of every key that becomes STORED (with no
  // parent: the tier keeps none) and every STORED key that leaves, in the
  // index's order (its owner's lock held), as medium kStorage. Under kArc
  // the ghosts remember as many evicted keys as `capacity` holds values of
  // `value_bytes` (at most kMaxGhosts).
  DiskIndex(uint64_t capacity, CacheEventSink* events, int32_t block_size,
            EvictionPolicy policy = EvictionPolicy::kLru,
            uint64_t value_bytes = 1);

  // Records `key` as WRITING `bytes` for the Put numbered `generation`,
  // replacing any entry of the key, after evicting STORED keys (in the
  // policy's order) until the bound holds. False (nothing changed) when the
  // key's entry belongs to a later Put: this one is stale.
  // ResourceExhausted (nothing changed) when the value does not fit beside
  // the values being written. `victims` gets every key that left the index
  // (the key's own replaced value is overwritten, not listed): their values
  // must be deleted. `evicted`, when given, also gets the entries evicted
  // for room.
  StatusOr<bool> Reserve(const BlockKey& key, uint64_t generation,
                         uint64_t bytes, std::span<const TokenId> tokens,
                         std::vector<BlockKey>* victims,
                         std::vector<Evicted>* evicted = nullptr);

  // WRITING -> STORED at `location` (most recently used). False if
  // `generation` is no longer the key's: the write was superseded or
  // removed.
  bool Commit(const BlockKey& key, uint64_t generation,
              const ValueLocation& location);

  bool IsCurrent(const BlockKey& key, uint64_t generation) const;

  // Adds a STORED key found on disk as the most recently used; Open inserts
  // in write order. Ignores the bound (EvictToCapacity restores it).
  void InsertStored(const BlockKey& key, uint64_t bytes,
                    std::vector<TokenId> tokens, const ValueLocation& location);

  void EvictToCapacity(std::vector<BlockKey>* victims,
                       std::vector<Evicted>* evicted = nullptr);

  const Entry* FindStored(const BlockKey& key) const;

  // A read of STORED `key`: it becomes the most recently used (under kArc,
  // in the frequent list). No-op for a key not STORED.
  void Touch(const BlockKey& key);
  // STORED `key` becomes the most recently used without counting as a use
  // (its list is kept): the host dropped its copy, so this one is now the
  // closest. No-op for a key not STORED.
  void Renew(const BlockKey& key);

  // Any state. True if the key was there.
  bool Erase(const BlockKey& key);

  bool EraseIf(const BlockKey& key, uint64_t generation);

  bool Contains(const BlockKey& key) const { return entries_.contains(key); }

  uint64_t bytes() const { return bytes_; }
  uint64_t stored_keys() const { return recent_.size() + frequent_.size(); }
  // STORED keys, least recently stored or read first (under kArc not
  // always the order they would be evicted in: the recent list's keys go
  // first while it is over its target).
  std::vector<BlockKey> StoredKeys() const;
  uint64_t evictions() const { return evictions_; }
  // kArc: the recent list's target in bytes, and the bytes in each list.
  uint64_t recent_target() const { return recent_target_; }
  uint64_t recent_bytes() const { return list_bytes_[0]; }
  uint64_t frequent_bytes() const { return list_bytes_[1]; }

 private:
  void ReportStored(const BlockKey& key, const Entry& entry) const;
  // Puts STORED `entry` of `key` at the tail of its list.
  void Link(const BlockKey& key, Entry* entry);
  void Unlink(const Entry& entry);
  // Makes STORED `key` the most recently used (Touch, Renew); `used`: a
  // use, so under kArc it joins the frequent list.
  void Relink(const BlockKey& key, bool used);
  // Whether the next victim is the recent list's oldest key.
  bool EvictFromRecent() const;
  // Evicts one STORED key, as the policy chooses, into `victims` (and
  // `evicted`).
  void EvictOne(std::vector<BlockKey>* victims, std::vector<Evicted>* evicted);
  // kArc: the ghost list `key` was evicted from lately (kRecentGhost,
  // kFrequentGhost; 0 when none), forgetting it and adapting the recent
  // list's target as ARC does for a value of `bytes`.
  uint8_t TakeEvicted(const BlockKey& key, uint64_t bytes);

  static constexpr uint64_t kMaxGhosts = uint64_t{1} << 21;
  static constexpr uint8_t kRecentGhost = 1;
  static constexpr uint8_t kFrequentGhost = 2;

  const uint64_t capacity_;
  CacheEventSink* const events_;
  const int32_t block_size_;
  const EvictionPolicy policy_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t clock_ = 0;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> entries_;
  // STORED keys, least recently used first: under kLru all of them in
  // recent_; under kArc those never read in recent_, the others in
  // frequent_.
  std::list<BlockKey> recent_;
  std::list<BlockKey> frequent_;
  uint64_t list_bytes_[2] = {0, 0};
  // kArc: ARC's p, in bytes, and the keys evicted lately (tagged with the
  // list each left).
  uint64_t recent_target_ = 0;
  std::optional<GhostKeys> ghosts_;
};

}  // namespace disk_internal
}  // namespace tierkv

#endif  // TIERKV_TIERS_DISK_INTERNAL_H_
