// RedisClusterClient: a client of a Redis Cluster (Redis 7; 6 works through
// CLUSTER SLOTS) on hiredis's synchronous API, for tierkv's remote tier of
// about 2 MiB KV blocks shared by several machines. It learns the slot map
// from its seeds, keeps one connection per node (made on first use), follows
// MOVED and ASK redirects, and pipelines batches per node. GET values are
// read off the socket by the client itself, straight into the caller's
// buffers (MultiGetInPlace); every other reply is parsed by hiredis.
//
// Thread-safety: every method may be called from any thread; calls serialize
// on one mutex per client (a batch holds it while it waits on the network).
// Threads that want parallel I/O each open a client of their own.
//
// Failure model. A node that refuses connections, closes them or does not
// answer within command_timeout fails the keys it owns in that call (per-key
// Unavailable or DeadlineExceeded, counted in stats().errors); the call never
// waits longer than the timeouts allow and never returns bytes it did not
// read whole from a GET reply. The failure marks the node down for
// down_backoff (calls fail its keys at once rather than time out again),
// and makes the next call re-read the slot map first, so keys come back as
// soon as a replica has taken over a dead master's slots. A node that timed
// out is down for down_backoff doubled for each timeout since it last
// answered, up to max_down_backoff, and is not asked for a slot map either:
// a cluster that stopped answering costs each call the timeouts of the
// nodes whose backoff ran out, not of every node. A connection that had
// been idle since an earlier call and fails before any reply is made again
// once within the same call, so a cluster restarted under the client costs
// no failed keys.
//
// A key's command in one batch:
//
//   sent to the slot's owner --reply--> done (value, miss or error reply)
//   --MOVED slot addr--> slot map updated, map re-read, sent to addr
//   --ASK slot addr--> ASKING + command sent to addr (map unchanged)
//   --I/O error or timeout--> failed (or sent once more on a fresh
//                             connection, see above)
//   more than max_redirects redirects --> failed (Unavailable)
#ifndef TIERKV_TIERS_REDIS_CLUSTER_H_
#define TIERKV_TIERS_REDIS_CLUSTER_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/mutex.h"
#include "tierkv/status.h"

namespace tierkv {

struct RedisClusterOptions {
  // Nodes to learn the cluster from, "host:port,host:port,...". Any one that
  // answers is enough; the others are tried in order when it does not.
  std::string seeds;
  // Bound on making one TCP connection. Default: 500 ms.
  std::chrono::milliseconds connect_timeout{500};
  // Bound on each read or write of a command's bytes (not on a whole batch:
  // a 2 MiB value moves in many reads). Default: 2000 ms.
  std::chrono::milliseconds command_timeout{2000};
  // Redirects (MOVED or ASK) one key may follow in a call. Default: 5.
  int max_redirects = 5;
  // After a node fails, how long its keys fail at once instead of being
  // tried again. Default: 100 ms.
  std::chrono::milliseconds down_backoff{100};
  // The most down_backoff grows to for a node that timed out, doubling
  // with each timeout since it last answered (it starts over once the node
  // answers, or fails at once). Default: 5000 ms; never less than
  // down_backoff.
  std::chrono::milliseconds max_down_backoff{5000};
};

// Counters since Open; each call adds to them.
struct RedisClusterStats {
  uint64_t hits = 0;                // GETs that found their key.
  uint64_t misses = 0;              // GETs of a key that was not there.
  uint64_t errors = 0;              // Keys that failed (any operation).
  uint64_t redirects = 0;           // MOVED and ASK replies followed.
  uint64_t topology_refreshes = 0;  // Slot maps read (Open's included).
  // Nodes asked for the slot map that did not answer with one.
  uint64_t topology_query_failures = 0;
  uint64_t bytes_written = 0;  // Value bytes of SETs that succeeded.
  uint64_t bytes_read = 0;     // Value bytes of GETs that hit.
};

// The hash slot of a key (0..16383): CRC16 (XMODEM) of the key, or of its
// hash tag (the bytes between the first '{' and the next '}', when there are
// any), mod 16384, as Redis Cluster computes it.
uint16_t RedisKeySlot(std::string_view key);

// Where a GET's value is read to, straight from the socket: its first
// head.size() bytes into `head`, the rest into `body`.
struct ValueBuffers {
  std::span<char> head;
  std::span<char> body;
};

// What RedisClusterClient::MultiGetInPlace does with each value found. The
// functions run with the client's mutex held: they must not call the
// client.
struct ValueSink {
  // Buffers for key i's value of `length` bytes (head.size() + body.size()
  // must be `length`: buffers of another size fail the group with Internal
  // and drop the connection), or none: the value is then read into a buffer
  // of the client's and handed to `take`.
  std::function<std::optional<ValueBuffers>(size_t i, size_t length)> place =
      nullptr;
  // Key i's value is in the buffers `place` gave, whole: OK when accepted.
  std::function<Status(size_t i)> placed = nullptr;
  // Key i's value when `place` gave no buffers, alive for this call only:
  // OK when accepted.
  std::function<Status(size_t i, std::string_view value)> take = nullptr;
};

class RedisClusterClient {
 public:
  static constexpr int kSlots = 16384;

  // Parses the seeds and reads the slot map from the first seed that
  // answers. InvalidArgument for a malformed seed list; Unavailable, naming
  // every seed and why it failed, when none answers.
  static StatusOr<std::unique_ptr<RedisClusterClient>> Open(
      const RedisClusterOptions& options);
  ~RedisClusterClient();
  RedisClusterClient(const RedisClusterClient&) = delete;
  RedisClusterClient& operator=(const RedisClusterClient&) = delete;

  // SET of each key to its value (keys.size() == values.size()), with a
  // time to live when ttl > 0 (EX for whole seconds, else PX). One Status
  // per key.
  std::vector<Status> MultiSet(std::span<const std::string> keys,
                               std::span<const std::string_view> values,
                               std::chrono::milliseconds ttl = {});
  // GET of each key: its value, NotFound for a miss, or the error.
  std::vector<StatusOr<std::string>> MultiGet(
      std::span<const std::string> keys);
  // GET of each key into buffers[i] (keys.size() == buffers.size()), with
  // no allocation per value: the value's length, NotFound for a miss,
  // OutOfRange when the value does not fit (the buffer's bytes are then
  // unspecified), or the error.
  std::vector<StatusOr<size_t>> MultiGetInto(
      std::span<const std::string> keys,
      std::span<const std::span<char>> buffers);
  // GET of each key, handing each value found to `take(i, value)` while
  // its reply is alive (nothing is copied or kept): per key OK when take
  // accepted it (take's Status otherwise), NotFound for a miss, or the
  // error. take runs with the client's mutex held: it must not call the
  // client.
  std::vector<Status> MultiGetWith(
      std::span<const std::string> keys,
      const std::function<Status(size_t i, std::string_view value)>& take);
  // GET of each key, each value found read from the socket straight into
  // the buffers sink.place gives for it (no copy through hiredis), then
  // handed to sink.placed (or, without buffers, to sink.take): per key OK
  // when accepted (the sink's Status otherwise), NotFound for a miss, or
  // the error. A key whose value was not read whole (its connection failed
  // or timed out mid-value) fails, and its buffers' bytes are unspecified.
  // place may run more than once for a key (a key sent again on a fresh
  // connection, see above); only a value read whole reaches sink.placed.
  // Without sink.take, a value with no buffers fails its key (OutOfRange).
  std::vector<Status> MultiGetInPlace(std::span<const std::string> keys,
                                      const ValueSink& sink);
  // DEL of each key: whether it was there. When a failed connection made
  // the call send a DEL again (see above), a key the first DEL removed
  // reads as false.
  std::vector<StatusOr<bool>> MultiDel(std::span<const std::string> keys);
  // EXISTS of each key.
  std::vector<StatusOr<bool>> Exists(std::span<const std::string> keys);

  // One-key forms of the above.
  Status Set(const std::string& key, std::string_view value,
             std::chrono::milliseconds ttl = {});
  StatusOr<std::string> Get(const std::string& key);

  // SCAN of every master in the slot map, read anew first, cursor by cursor
  // (`count` keys asked for a step), of the keys matching `pattern` (SCAN's
  // MATCH glob): `each` gets each key found, with the client's mutex held
  // (it must not call the client). A key may come more than once. OK when
  // every master's scan ran to its end, the map covers every slot and is
  // the same read again afterwards: then every key that existed throughout
  // the call was seen. Otherwise the first error (Unavailable when the map
  // changed), once the masters that answered have been scanned whole (the
  // keys of a failed master are missing); each failed master counts in
  // stats().errors.
  Status ScanMasters(std::string_view pattern, size_t count,
                     const std::function<void(std::string_view key)>& each);

  // Reads the slot map again now (calls do it themselves when needed).
  Status RefreshTopology();
  // "host:port" of the node this client sends `slot`'s keys to; empty when
  // no node serves it.
  std::string SlotOwner(uint16_t slot);
  RedisClusterStats stats();

 private:
  struct Node;
  struct PendingOp;
  struct Command;

  explicit RedisClusterClient(const RedisClusterOptions& options);

  class ReplyStream;
  struct BulkValue;

  // GETs of every key, each value found handed to `sink` (MultiGetInPlace).
  // Per key: OK (accepted), NotFound, or why not. Counts hits, misses and
  // bytes read.
  std::vector<Status> RunGets(std::span<const std::string> keys,
                              const ValueSink& sink) TIERKV_REQUIRES(mu_);
  // A one-key command answered with a count (DEL, EXISTS): count > 0.
  std::vector<StatusOr<bool>> RunCountCommand(std::string_view name,
                                              std::span<const std::string> keys)
      TIERKV_EXCLUDES(mu_);
  // Runs `command` for every key, following redirects, until each key has
  // its result or its error.
  void RunBatch(std::span<const std::string> keys, const Command& command)
      TIERKV_REQUIRES(mu_);
  std::vector<PendingOp> RunRound(std::span<const std::string> keys,
                                  const Command& command,
                                  std::vector<PendingOp> ops)
      TIERKV_REQUIRES(mu_);
  Status SendGroup(Node* node, const Command& command,
                   std::vector<PendingOp>& group) TIERKV_REQUIRES(mu_);
  void ReadGroup(Node* node, const Command& command,
                 std::vector<PendingOp>& group, std::vector<PendingOp>* next)
      TIERKV_REQUIRES(mu_);
  // Reads op's reply (after ASKING's, when it sent one) and hands it to the
  // command. Not OK when the connection failed before the reply was read
  // whole: op then has no result yet.
  Status ReadOne(ReplyStream& stream, Node* node, const Command& command,
                 const PendingOp& op, std::vector<PendingOp>* next)
      TIERKV_REQUIRES(mu_);
  // Reads a bulk string reply's value (its header read already) into the
  // buffers command.place gives, else into `scratch`.
  Status ReadBulk(ReplyStream& stream, const Command& command, size_t index,
                  int64_t length, std::string* scratch) TIERKV_REQUIRES(mu_);
  void HandleErrorReply(Node* node, std::string_view message, PendingOp op,
                        const Command& command, std::vector<PendingOp>* next)
      TIERKV_REQUIRES(mu_);
  // Fails `rest` (a group's ops without replies) with `why`, or queues them
  // again (see the header
  // comment) when the connection was idle before this call and `replied`
  // is false.
  void FailGroup(Node* node, std::span<PendingOp> rest, bool replied,
                 const Status& why, const Command& command,
                 std::vector<PendingOp>* next) TIERKV_REQUIRES(mu_);
  void FailKey(const Command& command, size_t index, Status why)
      TIERKV_REQUIRES(mu_);

  Status RefreshLocked() TIERKV_REQUIRES(mu_);
  // One master's whole SCAN (see ScanMasters).
  Status ScanNode(Node* node, std::string_view pattern, size_t count,
                  const std::function<void(std::string_view key)>& each)
      TIERKV_REQUIRES(mu_);
  Status QueryTopology(Node* node) TIERKV_REQUIRES(mu_);
  Node* NodeFor(const std::string& host, int port) TIERKV_REQUIRES(mu_);
  // Connects when not connected; refuses a node still within down_backoff
  // of a failure unless `ignore_backoff`.
  Status Connect(Node* node, bool ignore_backoff = false) TIERKV_REQUIRES(mu_);
  // Drops the connection (its pipeline state is unknown after a failure);
  // `mark_down` starts the node's backoff (MarkDown).
  void Disconnect(Node* node, const Status& why, bool mark_down)
      TIERKV_REQUIRES(mu_);
  // The node failed: down for down_backoff, or, when the failure cost a
  // timeout (`timed_out`), for down_backoff doubled per timeout since it
  // last answered, at most max_down_backoff.
  void MarkDown(Node* node, bool timed_out) TIERKV_REQUIRES(mu_);

  const RedisClusterOptions options_;
  std::vector<std::pair<std::string, int>> seeds_;

  Mutex mu_;
  // Every node seen (seeds and the slot map's), by "host:port"; never
  // removed while the client lives, so Node pointers stay valid.
  std::map<std::string, std::unique_ptr<Node>> nodes_ TIERKV_GUARDED_BY(mu_);
  // Which node serves each slot (nullptr: none known).
  std::array<Node*, kSlots> slot_owner_ TIERKV_GUARDED_BY(mu_){};
  // Set by failures and MOVED: the next call re-reads the slot map first.
  bool topology_stale_ TIERKV_GUARDED_BY(mu_) = false;
  // Numbers calls, so a batch knows which connections it made itself.
  uint64_t call_seq_ TIERKV_GUARDED_BY(mu_) = 0;
  RedisClusterStats stats_ TIERKV_GUARDED_BY(mu_);
};

}  // namespace tierkv

#endif  // TIERKV_TIERS_REDIS_CLUSTER_H_
