// DiskTier: the disk tier of the KV block store. Each store directory holds
// a value file of fixed-size slots with the blocks' bytes (optionally
// LZ4-compressed over byte planes), and a RocksDB database, the index of
// record, with one small verified record per block (its header, token ids
// and slot); the tier is bounded in bytes, evicting keys in LRU or ARC order
// (DiskTierOptions::eviction).
// Owned by the coordinator (tierkvd, or an embedded store). Thread-safety:
// every method may be called from any thread. Disk I/O runs on the tier's own
// I/O threads and completion callbacks run there too, so the caller's thread
// never waits on the disk (except in Flush and the destructor, which exist to
// wait).
//
// A key's life in the tier (one entry in the in-memory index):
//
//   absent --Put (bytes reserved, LRU victims evicted)--> WRITING
//   WRITING --value written--> STORED (most recently used)
//   (queued) --Remove--> cancelled: the Put never writes
//   WRITING --a newer Put of the key / Remove--> superseded: that write is
//             skipped, the newer state wins
//   STORED --Get (verified)--> STORED, moved to most recently used
//   STORED --evicted / Remove / Get finds it corrupt--> absent (deleted)
//
// Contains and Get see STORED keys only: a block being written is invisible.
// The byte bound counts WRITING and STORED values, so it holds at every
// moment, not just between operations.
//
// The tier as a whole is either WRITABLE or DEGRADED (stats().degraded):
//
//   WRITABLE --free space below the reserve--> DEGRADED (low space)
//   DEGRADED (low space) --twice the reserve free again (checked at most
//             every 100 ms, statvfs)--> WRITABLE
//   WRITABLE --a value file write finds the filesystem full (ENOSPC,
//             EDQUOT)--> DEGRADED (low space), as above
//   WRITABLE --any other storage write fails (RocksDB's ENOSPC, EIO,
//             directory gone), or the storage opened read-only--> DEGRADED
//             until the next Open
//
// A DEGRADED tier fails Put at once without touching the storage (RocksDB
// must not be written again after a write error: its assertions abort), and
// forgets removed keys without deleting them; it keeps serving what reads
// back verified. Each entry into DEGRADED is reported once
// (DiskTierOptions::on_degraded) and counted.
//
// A block's record in RocksDB (format version 2, little-endian), written
// and verified by this tier only:
//   u32 magic "TKVD" | u16 format version | u8 codec | u8 element bytes
//   | u64 sequence (write order, rebuilds the LRU on open)
//   | u64 payload bytes (uncompressed) | u64 stored bytes
//   | u64 payload checksum (XXH3-64 of the uncompressed payload)
//   | u64 stored checksum (XXH3-64 of the stored bytes; the same value when
//     the codec is none, so a raw payload is hashed once)
//   | u64 slot (the stored bytes are at slot * SlotBytes(block) in the
//     value file; slots are whole 4 KiB pages, and the pages a compressed
//     block leaves empty are holes)
//   | u16 fingerprint length | store fingerprint (layout and model)
//   | u32 token count | u32 token ids
//   | u64 header checksum (XXH3-64 of every header byte before it)
// A Put writes the stored bytes into a free slot, then the record (through
// RocksDB's write-ahead log): no record ever names bytes not yet written.
// A slot is written again only after the record naming it was deleted or
// replaced, and a Get in flight keeps its slot from being written.
// Open reads the records only (the index, not the data: a store of any
// size opens in the time its records take); Get verifies the bytes it
// reads against the record's checksums. A record that fails, that belongs
// to another layout or model, or whose slot lies past the end of the value
// file, is deleted and counted at Open; bytes that fail at Get are deleted
// and counted then; neither is ever served. Format version 1 (the bytes
// inside RocksDB) is dropped on open.
#ifndef TIERKV_TIERS_DISK_TIER_H_
#define TIERKV_TIERS_DISK_TIER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/cache_event_sink.h"
#include "src/lower_tier.h"
#include "tierkv/block_key.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/status.h"

namespace tierkv {

// How a block's payload is stored. The codec recorded in each value is the
// one actually applied: a payload that does not shrink is stored as kNone.
enum class DiskCodec : uint8_t {
  kNone = 0,           // The payload bytes as they are.
  kLz4 = 1,            // LZ4 over the payload.
  kLz4BytePlanes = 2,  // Byte planes (byte i of every element together,
                       // for i < element bytes), each plane LZ4'd or kept
                       // raw, whichever is smaller.
};

// "none", "lz4", "lz4-byte-planes"; "unknown" outside the enum.
std::string_view DiskCodecName(DiskCodec codec);

// ---------------------------------------------------------------------------
// The storage seam: the key-value store under the disk tier. RocksDB in
// production (OpenRocksDbStorage); tests wrap it (DiskStorageWrapper) to
// inject faults. Implementations must be safe to call from several threads.
class DiskStorage {
 public:
  // Reads a value; the view is valid only during the call.
  using ValueReader = std::function<Status(std::string_view value)>;
  // Visits one entry; views valid only during the call. A non-OK return
  // stops the walk and is returned by ForEach.
  using Visitor =
      std::function<Status(std::string_view key, std::string_view value)>;

  virtual ~DiskStorage() = default;

  // Stores the concatenation of `value_parts` under `key`, replacing any
  // older value. Visible to Get once it returns; durable after Flush.
  virtual Status Put(std::string_view key,
                     std::span<const std::string_view> value_parts) = 0;
  // Calls `read` with the value under `key` and returns what it returns;
  // NotFound (without calling `read`) when there is none.
  virtual Status Get(std::string_view key, const ValueReader& read) = 0;
  // OK also when the key is absent.
  virtual Status Delete(std::string_view key) = 0;
  // Deletes every key as Delete, in one write (RocksDB: one WriteBatch, one
  // write-ahead log record), so that a large clear costs one write.
  virtual Status DeleteBatch(std::span<const std::string> keys) = 0;
  // Every entry, in key order, on the calling thread.
  virtual Status ForEach(const Visitor& visit) = 0;
  // Writes everything Put so far to files and syncs them: after OK, it
  // survives a crash.
  virtual Status Flush() = 0;
  // Bytes of every file the storage keeps (RocksDB's SSTs, write-ahead log
  // and MANIFEST; the value file by the space it takes).
  virtual uint64_t FileBytes() = 0;
  // Bytes free for the storage on its filesystem (statvfs). NotFound when
  // its directory is gone.
  virtual StatusOr<uint64_t> FreeBytes() = 0;
  // Bytes the storage may write beyond the values it holds, and must find
  // free on its filesystem (RocksDB: its write-ahead log and memtables not
  // yet flushed, the MANIFEST and info logs).
  virtual uint64_t ReservedBytes() = 0;
  // OK while writes may be tried; otherwise why not (opened read-only, or
  // an earlier write failed: RocksDB must not be written again after a
  // write error, and Put, Delete and Flush return this status at once).
  virtual Status Writable() = 0;
  // Files found damaged while opening or scanning (paths), for the report.
  virtual std::vector<std::string> DamagedFiles() = 0;

  // The value file: the blocks' bytes, at offsets the tier chooses (its
  // slots), beside the records. Writes go to the page cache (durable after
  // Flush, which syncs the file before the records); a failed write
  // latches as a failed Put does, except one that found the filesystem
  // full (ResourceExhausted: ENOSPC, EDQUOT), which no record names and
  // which the tier tries again once there is room. OK once every byte is
  // written. ReleasePayload likewise.
  virtual Status WritePayload(uint64_t offset, std::string_view bytes) = 0;
  // Reads the bytes from `offset` on into `outs`, one after the other (one
  // vectored read: adjacent slots in one I/O), with no copy on the way.
  // DataLoss when the file ends before them; ResourceExhausted or
  // DeadlineExceeded for a failure that may pass (IsTransientReadError);
  // another error for one that will not (EIO from a bad sector).
  virtual Status ReadPayload(uint64_t offset,
                             std::span<const std::span<std::byte>> outs) = 0;
  // Gives the filesystem back the space of `bytes` bytes from `offset` (a
  // hole; the file keeps its size): the tail of a slot that a compressed
  // block does not fill. OK where the filesystem cannot (only space is
  // lost).
  virtual Status ReleasePayload(uint64_t offset, uint64_t bytes) = 0;
  // Cuts the value file to at most `bytes` (Open: past the last slot in
  // use).
  virtual Status TruncatePayloads(uint64_t bytes) = 0;
  // FileBytes less the value file: what Open's scan reads.
  virtual uint64_t IndexBytes() = 0;
  // The value file's length (its holes included).
  virtual StatusOr<uint64_t> ValueFileBytes() = 0;
};

// Whether a failed ReadPayload may succeed when tried again: the tier then
// keeps the block, where it drops one the storage cannot read.
inline bool IsTransientReadError(const Status& s) {
  return s.code() == StatusCode::kResourceExhausted ||
         s.code() == StatusCode::kDeadlineExceeded;
}

// Forwards every call to another DiskStorage, which it owns; tests derive
// from it and override what they break.
class DiskStorageWrapper : public DiskStorage {
 public:
  explicit DiskStorageWrapper(std::unique_ptr<DiskStorage> target)
      : target_(std::move(target)) {}

  Status Put(std::string_view key,
             std::span<const std::string_view> value_parts) override {
    return target_->Put(key, value_parts);
  }
  Status Get(std::string_view key, const ValueReader& read) override {
    return target_->Get(key, read);
  }
  Status Delete(std::string_view key) override { return target_->Delete(key); }
  Status DeleteBatch(std::span<const std::string> keys) override {
    return target_->DeleteBatch(keys);
  }
  Status ForEach(const Visitor& visit) override {
    return target_->ForEach(visit);
  }
  Status Flush() override { return target_->Flush(); }
  uint64_t FileBytes() override { return target_->FileBytes(); }
  StatusOr<uint64_t> FreeBytes() override { return target_->FreeBytes(); }
  uint64_t ReservedBytes() override { return target_->ReservedBytes(); }
  Status Writable() override { return target_->Writable(); }
  std::vector<std::string> DamagedFiles() override {
    return target_->DamagedFiles();
  }
  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    return target_->WritePayload(offset, bytes);
  }
  Status ReadPayload(uint64_t offset,
                     std::span<const std::span<std::byte>> outs) override {
    return target_->ReadPayload(offset, outs);
  }
  Status ReleasePayload(uint64_t offset, uint64_t bytes) override {
    return target_->ReleasePayload(offset, bytes);
  }
  Status TruncatePayloads(uint64_t bytes) override {
    return target_->TruncatePayloads(bytes);
  }
  uint64_t IndexBytes() override { return target_->IndexBytes(); }
  StatusOr<uint64_t> ValueFileBytes() override {
    return target_->ValueFileBytes();
  }

  DiskStorage* target() const { return target_.get(); }

 private:
  std::unique_ptr<DiskStorage> target_;
};

// The value file's name in the store's directory.
inline constexpr std::string_view kDiskValueFileName = "tierkv-values";

struct RocksDbStorageOptions {
  // Required. The database directory; created if missing. The value file
  // (kDiskValueFileName) is kept in it too.
  std::string path;
  // Memtable size; at least 1 MiB. Up to two memtables (and the log that
  // holds them) are written beyond the values: see ReservedBytes. Default:
  // 64 MiB.
  size_t write_buffer_bytes = size_t{64} << 20;
  // Records go through RocksDB's write-ahead log (not synced), so a block
  // whose Put completed survives the process being killed; only a machine
  // crash loses the unsynced tail, and Flush syncs it. Without the log,
  // records still in the memtable are lost when the process dies: a lost
  // hit, never a wrong block, since this is a cache. Records are small (a
  // header and token ids; the bytes are in the value file), so the log
  // costs little. Default: true.
  // Deletes always go through the log, so that a removal survives the
  // process being killed. Default: true.
  bool write_ahead_log = true;
};

// Opens (or creates) the database. AlreadyExists when another process
// holds it open (its LOCK); DataLoss naming the damaged files when RocksDB
// finds them damaged; other RocksDB failures
// become a Status naming the path. On a filesystem with less than
// RocksDbReservedBytes free, or when a normal open fails for lack of space,
// an existing database is opened read-only: reads work, Writable() says why
// writes do not; where there is no database yet, ResourceExhausted.
StatusOr<std::unique_ptr<DiskStorage>> OpenRocksDbStorage(
    const RocksDbStorageOptions& options);

// Deletes the database at `path` and its files (RocksDB's DestroyDB); OK
// when there is none.
Status DestroyRocksDbStorage(const std::string& path);

// RocksDbStorage's ReservedBytes: two memtables (and the write-ahead log
// holding them) plus 1 MiB for the MANIFEST and info logs.
uint64_t RocksDbReservedBytes(const RocksDbStorageOptions& options);

// Bytes one block's value takes at most in the tier's byte bound: its
// header (the fingerprint and `tokens` token ids) and a payload of
// `block_bytes` stored raw (a codec never stores more).
uint64_t DiskValueBytes(size_t block_bytes, size_t fingerprint_bytes,
                        size_t tokens);

// Storage keys of blocks: 'b' followed by the key, hi then lo, big-endian.
std::string DiskStorageKey(const BlockKey& key);
// The storage key of the store's record of its fingerprint: written once,
// it tells Open which layout and model the store was written for.
std::string_view DiskFingerprintKey();

// ---------------------------------------------------------------------------
// Payload codecs, exposed for benchmarks and tests.

struct EncodedPayload {
  DiskCodec codec = DiskCodec::kNone;  // The codec actually applied.
  size_t bytes = 0;                    // Stored bytes written to `out`.
};
// Bytes EncodePayload may write for a payload of `payload_bytes`.
size_t MaxEncodedBytes(DiskCodec codec, int32_t element_bytes,
                       size_t payload_bytes);
// Encodes `payload` with `codec` into `out` (at least MaxEncodedBytes).
// When the payload does not shrink, the result is kNone and `out` is left
// alone: the stored bytes are then the payload itself. InvalidArgument for
// an unknown codec, element_bytes outside [1, 16] or not dividing the
// payload size (byte planes), a payload of 1 GiB or more, or a short `out`.
StatusOr<EncodedPayload> EncodePayload(DiskCodec codec, int32_t element_bytes,
                                       std::span<const std::byte> payload,
                                       std::span<std::byte> out);
// Decodes `stored` into `out`, which must be exactly the payload size.
// DataLoss when the stored bytes are malformed (a checksum catches the rest).
Status DecodePayload(DiskCodec codec, int32_t element_bytes,
                     std::string_view stored, std::span<std::byte> out);

// ---------------------------------------------------------------------------
// The tier.

// How far a disk tier's Open is in rebuilding its index.
struct RebuildProgress {
  uint64_t values = 0;      // Values read so far (good and bad).
  uint64_t bytes_read = 0;  // Their keys and values.
  // Bytes in the store's files when the scan started (at least bytes_read):
  // what the scan reads, give or take what RocksDB has not flushed yet.
  uint64_t total_bytes = 0;
  bool done = false;  // The last call: every value was read.
  // Share of total_bytes read, 0..100; 100 only when done.
  int Percent() const {
    if (done) return 100;
    if (total_bytes == 0) return 0;
    return static_cast<int>(
        std::min<uint64_t>(99, bytes_read * 100 / total_bytes));
  }
};

struct DiskTierOptions {
  // Where and how the database is kept, for Open(options). Ignored by the
  // Open overload that takes a storage.
  RocksDbStorageOptions storage;
  // Required. Bound on the bytes the tier takes on disk: the values held
  // (header + stored payload) are bounded by capacity_bytes less
  // reserved_bytes. Keys are evicted to stay under it, in the order
  // `eviction` says.
  // Files can still exceed it by RocksDB's space amplification until
  // compaction reclaims deleted values (DiskTierStats::file_bytes shows it).
  uint64_t capacity_bytes = 0;
  // Which stored block goes first when room is needed. kLru: the least
  // recently stored or read. kArc: the host pool's ARC, in bytes: blocks
  // read at least once (promoted) are kept ahead of blocks only ever
  // written, in shares that adapt to which of the two come back after their
  // eviction; in LRU order until they do. Default: kDefaultTierEviction.
  EvictionPolicy eviction = kDefaultTierEviction;
  // The part of capacity_bytes kept for what the storage writes beyond the
  // values (RocksDbReservedBytes: its write-ahead log and memtables); less
  // than capacity_bytes. Default: 0 (capacity_bytes bounds the values).
  uint64_t reserved_bytes = 0;
  // Required. StoreFingerprint(layout, model) of the store
  // (tierkv/kv_layout.h). The store records the fingerprint it was written
  // for; Open fails (FailedPrecondition, naming both) when it is another,
  // unless `reset`. Single values of another fingerprint in a store of this
  // one are deleted on open and counted in layout_mismatches.
  std::string layout_fingerprint;
  // Start empty where the store cannot be used as it is: written for
  // another layout or model, or (Open(options) only) a database RocksDB
  // cannot open. Only then: a usable store is kept. Default: false (Open
  // fails and says so).
  bool reset = false;
  // Called once per cause when the tier stops taking writes (a write
  // failed, the filesystem is nearly full, the storage opened read-only;
  // `why` says which and what to do), and with OK when it takes writes
  // again. On the thread that found it; must not call the tier. Default:
  // none.
  std::function<void(const Status& why)> on_degraded = {};
  // Required. KvLayout::BlockBytes(): the payload of every Put and Get.
  size_t block_bytes = 0;
  // Element size in bytes, for byte planes. Default: 2 (bf16 / fp16).
  int32_t element_bytes = 2;
  // Default: kNone. Measured on real bf16 KV (BENCHMARKS.md, "Disk
  // tier"): plain LZ4 finds nothing (ratio 1.00, every block stored raw);
  // byte planes store 16% fewer bytes (ratio 1.195) but encode at well
  // under 1 GB/s per thread, which made spills and promotions slower than
  // raw blocks on the disks measured. Choose kLz4BytePlanes where disk
  // space, not throughput, is the scarce resource.
  DiskCodec codec = DiskCodec::kNone;
  int32_t io_threads = 2;  // Default: 2.
  // Called by Open on its own thread while it rebuilds the index, at least
  // every 1% of the bytes to read and once at the end (done set). Default:
  // none.
  std::function<void(const RebuildProgress&)> progress = {};
  // Checked for each value the rebuild reads: once it says true, Open
  // gives up with Unavailable (tierkvd asked to stop while starting).
  // Default: never.
  std::function<bool()> cancelled = {};
  // Told of every block the tier starts or stops serving (CacheEventSink,
  // medium kStorage): a value written or found by Open, and one evicted,
  // removed, replaced or found corrupt. Called on the tier's threads (and
  // Open's) with its lock held. Not owned; must outlive the tier. Default:
  // none.
  CacheEventSink* cache_events = nullptr;
  // Tokens per full block (KvLayout::block_size), reported with each
  // stored block. Needed only with cache_events. Default: 0.
  int32_t block_size = 0;
};

// DiskTierStats is in tierkv/stats.h: the coordinator reports it too.

class DiskTier {
 public:
  // Runs on an I/O thread, exactly once per Put or Get. It may call the
  // tier's methods except Flush; it must not block for long, since it holds
  // one of the I/O threads.
  using Done = std::function<void(Status)>;
  // Receives a block the tier evicted to make room (see SetEvictionSink):
  // its key, token ids and payload, read back and verified. The payload is
  // valid only during the call.
  using EvictionSink =
      std::function<void(const BlockKey& key, std::span<const TokenId> tokens,
                         std::span<const std::byte> payload)>;

  // Opens the RocksDB storage at options.storage.path and rebuilds the
  // index (see the Open below).
  static StatusOr<std::unique_ptr<DiskTier>> Open(
      const DiskTierOptions& options);
  // Rebuilds the in-memory index, LRU and free slots from `storage`'s
  // records (the value file is not read): every record is read once and
  // its header verified; bad records (and records RocksDB finds damaged),
  // records past the end of the value file, the older of two records
  // naming one slot, and single records of another layout or model are
  // deleted and counted. FailedPrecondition, naming both, when the store
  // was written for another layout or model (unless options.reset). The
  // LRU order is the write order (reads of a previous run are not
  // remembered). If the store holds more than capacity_bytes, the oldest
  // blocks are evicted. The value file is cut after the last slot in use.
  // InvalidArgument for bad options.
  static StatusOr<std::unique_ptr<DiskTier>> Open(
      const DiskTierOptions& options, std::unique_ptr<DiskStorage> storage);

  // Waits for queued I/O (Flush), then stops the I/O threads.
  virtual ~DiskTier() = default;

  // Queues a write of one block (block_bytes of payload, 1..65536 tokens)
  // and returns at once. `tokens` is copied; `payload` must stay valid and
  // unchanged until `done` runs (the caller keeps the host slot pinned).
  // Evicts least recently used keys to make room. `done` gets OK once the
  // block is readable (not yet durable: see Flush), ResourceExhausted if it
  // cannot fit (larger than the capacity, or the rest is being written),
  // InvalidArgument for bad sizes, or the storage's error. A Put of a key
  // replaces its value; of two Puts of one key in flight together, the one
  // queued later wins (the other's `done` gets OK without writing). A Put
  // cancelled by a Remove of its key (Remove came first: the block was
  // evicted) gets Aborted: nothing was written, and the tier does not hold
  // the block.
  virtual void Put(const BlockKey& key, std::span<const TokenId> tokens,
                   std::span<const std::byte> payload, Done done) = 0;
  // As Put, but the payload must hash (XXH3-64, the checksum every value
  // carries) to `checksum`: if it does not, nothing is written and `done`
  // gets DataLoss. For a host slot whose checksum was taken when its store
  // completed: bytes a worker changed since are never stored as valid. (A
  // change while the write runs leaves a value that fails verification
  // when read.) Costs nothing over Put, which hashes the payload anyway.
  virtual void PutChecked(const BlockKey& key, std::span<const TokenId> tokens,
                          std::span<const std::byte> payload, uint64_t checksum,
                          Done done) = 0;
  // Queues a read of one block into `out` (block_bytes) and returns at
  // once; `out` must stay valid until `done` runs. `done` gets OK with the
  // block in `out`; NotFound if the key is not stored or was stored for
  // other token ids; DataLoss if the value fails verification (it is
  // deleted and counted; `out` holds garbage). A hit makes the key the most
  // recently used.
  virtual void Get(const BlockKey& key, std::span<const TokenId> tokens,
                   std::span<std::byte> out, Done done) = 0;
  // As Get; on success `done` gets the checksum (XXH3-64) of the bytes
  // verified into `out`: that of the block as stored, whatever writes
  // `out` after the verification.
  using VerifiedDone = std::function<void(StatusOr<uint64_t>)>;
  virtual void GetVerified(const BlockKey& key, std::span<const TokenId> tokens,
                           std::span<std::byte> out, VerifiedDone done) = 0;
  // Whether `key` is stored (not being written). No disk access.
  virtual bool Contains(const BlockKey& key) const = 0;
  // Whether `key` is stored for exactly these token ids: a lookup can
  // confirm a disk hit without touching the disk.
  virtual bool Contains(const BlockKey& key,
                        std::span<const TokenId> tokens) const = 0;
  // The tier above let its copy of stored `key` go (the host evicted it):
  // the key becomes the most recently used here, without counting as a
  // use, so the tier keeps the blocks nearest to the engine's working set
  // rather than those the host was holding anyway. No disk access; no-op
  // for a key not stored.
  virtual void Renew(const BlockKey& key) = 0;
  // Whether `key` is stored for these token ids and, when it is, Renew of
  // it, under one lock: no eviction comes between.
  virtual bool RenewIfStored(const BlockKey& key,
                             std::span<const TokenId> tokens) = 0;
  // Forgets `key` and deletes its value before returning, through the
  // write-ahead log: a removal survives the process being killed right
  // after. A Put of the key in flight is cancelled (it never writes; its
  // `done` gets Aborted) or, when its write is running, waited for and
  // deleted with it; so Remove may wait for one write of this key, never
  // for other keys' writes or a queue. A Get already
  // reading the value gets NotFound or the whole value, never part of it.
  // Returns whether the key was stored (a write in flight that it cancels
  // does not count).
  virtual bool Remove(const BlockKey& key) = 0;
  // Removes every stored key, as Remove, in one storage write, and returns
  // how many. Keys being written are left alone: their writes complete as
  // usual.
  virtual uint64_t RemoveAll() = 0;
  // The stored keys (LowerTier::StoredKeys), least recently used first.
  virtual std::vector<BlockKey> StoredKeys(size_t max,
                                           uint64_t* total) const = 0;
  // Waits until every queued Put and Get has run (and its callback
  // returned), then makes what was written durable. Fails when the tier is
  // degraded by a write error or read-only: what was written since the last
  // Flush may then be lost. Must not be called from a Done callback.
  virtual Status Flush() = 0;
  // Never touches the disk on the caller's thread: file_bytes is read on an
  // I/O thread at most every second (and by Flush), so a hung disk cannot
  // stall stats.
  virtual DiskTierStats stats() const = 0;
  // The files Open found damaged (paths): their values were dropped.
  virtual std::vector<std::string> damaged_files() const = 0;
  // From now on, each block a Put evicts to make room (not one removed,
  // replaced or found corrupt, nor one Open drops for a smaller capacity)
  // is read back, verified and handed to `sink` before its value is
  // deleted, on the I/O thread that evicted it, so that a tier below can
  // keep what this one gives up. Its key stays busy meanwhile: a Remove of
  // it, or a RemoveAll, returns only after the sink has it. A block that
  // does not read back verified is not handed on (a failed verification
  // counts in checksum_failures). `sink` must not call this tier and should
  // not block: it holds an I/O thread, and each eviction costs one read. An
  // empty sink turns this off. Returns once no call of the previous sink is
  // under way, so its target may go then. Default: off, an evicted block is
  // gone.
  virtual void SetEvictionSink(EvictionSink sink) = 0;
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_DISK_TIER_H_
