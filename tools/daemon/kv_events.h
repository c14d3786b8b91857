// KV cache events in vLLM's wire format, for cache-aware routers (Dynamo's
// KV router, llm-d, Mooncake's Conductor) that follow where each block is.
// KvEventPublisher is a CacheEventSink (src/cache_event_sink.h): tierkvd's
// coordinator and disk tier report to it, and its own thread batches the
// events, encodes them as vLLM's KVEventBatch (msgpack) and publishes them
// on a ZeroMQ PUB socket, keeping recent batches for a ROUTER replay socket,
// as vLLM's ZmqEventPublisher does (vllm/distributed/kv_events.py; the
// format followed is README.md's "KV cache events").
// Thread-safety: the CacheEventSink calls and stats() from any thread; they
// never block on the network (a full queue drops what it holds and tells
// routers to forget: see max_queue_events). Create and the destructor from
// one thread.
#ifndef TIERKV_TOOLS_DAEMON_KV_EVENTS_H_
#define TIERKV_TOOLS_DAEMON_KV_EVENTS_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/cache_event_sink.h"
#include "tierkv/block_key.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv::daemon {

// One event of a batch. BlockStored may carry a run of blocks, each the
// parent of the next (as vLLM's does): `tokens` are theirs, concatenated.
struct KvEvent {
  enum class Type : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Type type = Type::kAllBlocksCleared;
  CacheMedium medium = CacheMedium::kCpu;  // Not for kAllBlocksCleared.
  std::vector<BlockKey> keys;              // Not for kAllBlocksCleared.
  // BlockStored: the first block's parent.
  std::optional<BlockKey> parent;
  std::vector<TokenId> tokens;      // BlockStored.
  int32_t block_size = 0;           // BlockStored.
  std::optional<uint64_t> lora_id;  // BlockStored.
};

// How a block key goes on the wire as vLLM's ExternalBlockHash (bytes | int).
enum class KvEventHashFormat : uint8_t {
  // An unsigned 64-bit integer: the key's low word, which is what vLLM's
  // int form keeps of a digest (its last 8 bytes, big-endian; vLLM's
  // default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), so routers that index
  // integers take it as they take vLLM's.
  kInt64,
  // The whole key: KvEventBlockHash's 16 bytes.
  kBytes,
};
// "int" or "bytes"; the inverse is ParseKvEventHashFormat.
const char* KvEventHashFormatName(KvEventHashFormat format);
StatusOr<KvEventHashFormat> ParseKvEventHashFormat(std::string_view name);

// A block key as 16 bytes, the key's high word then its low word,
// big-endian: the bytes BlockKey::ToHex spells.
std::string KvEventBlockHash(const BlockKey& key);

// One KVEventBatch as vLLM's ZmqEventPublisher sends it in msgspec's
// positional form (array_like, omit_defaults, tagged events):
// [ts, [event, ...], data_parallel_rank] with each event an array that
// starts with its tag: ["BlockStored", block_hashes, parent_block_hash,
// token_ids, block_size, lora_id, medium, lora_name], ["BlockRemoved",
// block_hashes, medium], ["AllBlocksCleared"]. data_parallel_rank is 0, as
// a vLLM publisher without data parallelism fills it in (decoders that read
// the batch as a 3-tuple, Dynamo's among them, refuse 2 fields).
std::string EncodeKvEventBatch(
    double ts, std::span<const KvEvent> events,
    KvEventHashFormat hashes = KvEventHashFormat::kInt64);

// A KVEventBatch as a subscriber reads it (DecodeKvEventBatch).
struct DecodedKvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  std::optional<int64_t> data_parallel_rank;  // None: left out, or nil.
};
// The inverse of EncodeKvEventBatch, for routers written in C++ and for
// tests: a batch of two or three fields (vLLM's first releases sent no
// data_parallel_rank), of either hash format (an integer hash becomes a key
// whose `lo` is the integer and `hi` 0; 16 bytes, the whole key) and of
// vLLM's own BlockStored forms (ending at `medium`, at `lora_name`, or with
// later trailing fields, which are skipped). The medium "STORAGE" (what
// tierkvd called its disk tier before "DISK") is the disk tier. A medium
// tierkv does not name ("GPU", ...) or none, a hash that is neither an
// unsigned integer nor 16 bytes (a negative one, as vLLM releases that
// hashed with Python's hash() sent), bytes after the batch and anything
// malformed are InvalidArgument: never a crash, whatever the bytes.
StatusOr<DecodedKvEventBatch> DecodeKvEventBatch(std::string_view bytes);

// Appends `event` to `events`, merging it into the last event when it
// continues it: a full block's BlockStored of the same medium and LoRA
// whose parent is the last one's last block (which is full), or a
// BlockRemoved of the same medium. Caps a merged event at `max_keys` keys.
// A partial block (a position-independent chunk's last) stays an event of
// its own: routers that derive one key per full block from the tokens
// (llm-d's) refuse a whole event whose tokens do not fill its blocks.
void AppendKvEvent(KvEvent event, size_t max_keys,
                   std::vector<KvEvent>* events);

struct KvEventPublisherOptions {
  // Required. Where the PUB socket binds ("tcp://*:5557", "ipc:///run/x"),
  // or, with no '*' or "::" in a tcp address, connects (vLLM's rule).
  std::string endpoint;
  // Where the ROUTER socket for replay binds. Default: "" (no replay).
  std::string replay_endpoint = {};
  // The first frame of every message; subscribers filter on it. Default:
  // "" (vLLM's KVEventsConfig default).
  std::string topic = {};
  // Batches kept for replay. Default: 10000 (vLLM's buffer_steps).
  size_t buffer_steps = 10000;
  // Bytes of batches kept for replay at most (the oldest go first): a
  // batch of 4096 blocks with their token ids is about 0.4 MB, so 10000 of
  // them would hold gigabytes. Default: 256 MiB.
  size_t buffer_bytes = size_t{256} << 20;
  // Events (keys) queued for the thread at most. The coordinator never
  // waits: an event that finds the queue full drops everything queued
  // (counted) and an AllBlocksCleared takes its place, so that routers
  // forget this node's blocks and learn them again from the stores that
  // follow. A lost BlockRemoved would have had them route to a block gone
  // for good; this way they under-count instead, until each block is
  // stored again (one that stays cached, hit after hit, is not announced
  // again). Default: 100000 (vLLM's max_queue_size).
  size_t max_queue_events = 100000;
  // Keys in one batch at most. Default: 4096.
  size_t max_batch_keys = 4096;
  // The PUB socket's send high-water mark. Default: 100000 (vLLM's hwm).
  int hwm = 100000;
  // Block hashes as integers (vLLM's default) or the whole 16-byte keys.
  // Default: kInt64.
  KvEventHashFormat hash_format = KvEventHashFormat::kInt64;
  // Seconds since the epoch of a batch (its ts). Default: the system clock.
  std::function<double()> clock = {};
  // The first batch's sequence number. Default: microseconds since the
  // epoch when the publisher starts, so that a restarted tierkvd goes on
  // above the numbers of its last run (unless the clock went back): routers
  // that drop a number at or below the last they applied (Dynamo's) would
  // drop a restarted run's batches until it passed the old numbers, and
  // those that replay a gap (vLLM's example subscriber) see one and replay
  // the new run from its start.
  std::optional<int64_t> first_sequence = {};
  // The group an ipc:// socket file is given once bound (tierkvd's
  // --kv-events-group), so that routers of the group may subscribe; its
  // mode comes from the process's umask (tierkvd's --mode). The endpoint
  // must name a file (no abstract '@' name, no '*'). Default: none (the
  // process's group).
  std::optional<gid_t> ipc_group = {};
};

struct KvEventPublisherStats {
  uint64_t events_queued = 0;
  // Events dropped with a full queue (each time followed by an
  // AllBlocksCleared).
  uint64_t events_dropped = 0;
  uint64_t batches_published = 0;
  uint64_t replay_requests = 0;
};

// Prometheus text for the counters, each sample labelled with `labels`
// (store="...",model="..."): tierkvd's /metrics serves it after the store's.
std::string FormatKvEventMetrics(const KvEventPublisherStats& stats,
                                 std::string_view labels);

class KvEventPublisher final : public CacheEventSink {
 public:
  // Binds (or connects) the sockets and starts the thread. InvalidArgument
  // naming the endpoint when ZeroMQ refuses it; PermissionDenied when an
  // ipc:// socket cannot be given ipc_group.
  static StatusOr<std::unique_ptr<KvEventPublisher>> Create(
      KvEventPublisherOptions options);
  // A publisher that queues events and touches no socket until Start:
  // tierkvd starts it once it holds its store's locks, so that a second
  // tierkvd refused for the store neither takes over an ipc:// path nor
  // sends routers the AllBlocksCleared of a restart that never happened.
  static StatusOr<std::unique_ptr<KvEventPublisher>> CreateUnstarted(
      KvEventPublisherOptions options);
  // Binds (or connects) the sockets and starts the thread, as Create.
  Status Start();
  // Publishes what is queued, then stops the thread and closes the sockets
  // (waiting at most a second for subscribers to take the last batches).
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  void BlockStored(const StoredBlockEvent& block) override;
  void BlockRemoved(CacheMedium medium, const BlockKey& key) override;
  void AllBlocksCleared() override;

  KvEventPublisherStats stats() const;
  // Waits until every event queued so far is published, at most `timeout`;
  // false when it was not. For tests and a graceful stop.
  bool Flush(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_KV_EVENTS_H_
