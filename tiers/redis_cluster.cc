// RedisClusterClient (redis_cluster.h): the slot map, connections,
// redirects and per-node pipelines over hiredis's synchronous API.
#include "tiers/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <optional>
#include <utility>

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021
                                                 : (crc << 1));
    }
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis
// Cluster's key hash.
uint16_t Crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (const char c : bytes) {
    const uint8_t index =
        static_cast<uint8_t>((crc >> 8) ^ static_cast<uint8_t>(c));
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[index]);
  }
  return crc;
}

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// "host:port" (the last ':' splits, so "::1:6379" works too).
bool ParseHostPort(std::string_view s, std::string* host, int* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view digits = s.substr(colon + 1);
  int value = 0;
  const auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || value < 1 ||
      value > 65535) {
    return false;
  }
  *host = std::string(s.substr(0, colon));
  *port = value;
  return true;
}

StatusOr<std::vector<std::pair<std::string, int>>> ParseSeeds(
    std::string_view list) {
  std::vector<std::pair<std::string, int>> seeds;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = Trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view()
                                           : list.substr(comma + 1);
    if (item.empty()) continue;
    std::string host;
    int port = 0;
    if (!ParseHostPort(item, &host, &port)) {
      return Status::InvalidArgument("Redis Cluster seed '" +
                                     std::string(item) +
                                     "' is not host:port (port 1..65535)");
    }
    seeds.emplace_back(std::move(host), port);
  }
  if (seeds.empty()) {
    return Status::InvalidArgument(
        "no Redis Cluster seeds given (want host:port,host:port,...)");
  }
  return seeds;
}

// Blocks SIGPIPE in this thread for its scope and swallows one raised in
// it: hiredis writes with write(2), and a node that closed its end would
// otherwise kill the process instead of failing its keys.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// A node's error reply as a Status. Errors that say the cluster is in
// transition (a failover, a node loading its data) are Unavailable: the
// same call may succeed a moment later.
Status FromErrorReply(const std::string& addr, std::string_view message) {
  const std::string text = addr + " replied: " + std::string(message);
  for (const std::string_view transient :
       {"CLUSTERDOWN", "LOADING", "TRYAGAIN", "MASTERDOWN", "READONLY"}) {
    if (message.starts_with(transient)) return Status::Unavailable(text);
  }
  if (message.starts_with("OOM")) return Status::ResourceExhausted(text);
  return Status::Internal(text);
}

// True for errors after which the slot map should be read again.
bool SuggestsNewTopology(std::string_view message) {
  return message.starts_with("CLUSTERDOWN") ||
         message.starts_with("MASTERDOWN") || message.starts_with("READONLY");
}

struct Redirect {
  bool ask = false;
  int slot = 0;
  std::string host;
  int port = 0;
};

// "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
bool ParseRedirect(std::string_view message, Redirect* out) {
  if (message.starts_with("MOVED ")) {
    message.remove_prefix(6);
    out->ask = false;
  } else if (message.starts_with("ASK ")) {
    message.remove_prefix(4);
    out->ask = true;
  } else {
    return false;
  }
  const size_t space = message.find(' ');
  if (space == std::string_view::npos) return false;
  const auto [end, ec] =
      std::from_chars(message.data(), message.data() + space, out->slot);
  if (ec != std::errc() || end != message.data() + space || out->slot < 0 ||
      out->slot >= RedisClusterClient::kSlots) {
    return false;
  }
  return ParseHostPort(message.substr(space + 1), &out->host, &out->port);
}

std::string_view ReplyText(const redisReply& r) {
  return std::string_view(r.str == nullptr ? "" : r.str, r.len);
}

// A flat RESP2 map (key, value, key, value...): the value of `key`.
const redisReply* MapGet(const redisReply& map, std::string_view key) {
  if (map.type != REDIS_REPLY_ARRAY) return nullptr;
  for (size_t i = 0; i + 1 < map.elements; i += 2) {
    const redisReply* k = map.element[i];
    if ((k->type == REDIS_REPLY_STRING || k->type == REDIS_REPLY_STATUS) &&
        ReplyText(*k) == key) {
      return map.element[i + 1];
    }
  }
  return nullptr;
}

struct SlotRange {
  int first = 0;
  int last = 0;
  std::string host;
  int port = 0;
};

// A node's address as the cluster announces it; `asked` (the node that
// sent the map) stands in for an endpoint the node does not know ("" or
// "?", which Redis documents for unknown endpoints).
std::string AnnouncedHost(const redisReply* endpoint,
                          const std::string& asked) {
  if (endpoint == nullptr || endpoint->type != REDIS_REPLY_STRING) return asked;
  const std::string_view text = ReplyText(*endpoint);
  return text.empty() || text == "?" ? asked : std::string(text);
}

// CLUSTER SHARDS (Redis 7): per shard, its slot ranges and its nodes; the
// node whose role is master serves the ranges.
StatusOr<std::vector<SlotRange>> ParseShards(const redisReply& reply,
                                             const std::string& asked) {
  if (reply.type != REDIS_REPLY_ARRAY) {
    return Status::Internal("CLUSTER SHARDS reply is not an array");
  }
  std::vector<SlotRange> ranges;
  for (size_t s = 0; s < reply.elements; ++s) {
    const redisReply* slots = MapGet(*reply.element[s], "slots");
    const redisReply* nodes = MapGet(*reply.element[s], "nodes");
    if (slots == nullptr || nodes == nullptr ||
        slots->type != REDIS_REPLY_ARRAY || nodes->type != REDIS_REPLY_ARRAY) {
      return Status::Internal("CLUSTER SHARDS entry lacks slots or nodes");
    }
    // After a failover the shard lists two masters until the old one comes
    // back as a replica: the promoted one, online, and the old one with
    // health "fail". Take the online one; any master if none is.
    const redisReply* master = nullptr;
    for (size_t n = 0; n < nodes->elements; ++n) {
      const redisReply* role = MapGet(*nodes->element[n], "role");
      if (role == nullptr || ReplyText(*role) != "master") continue;
      const redisReply* health = MapGet(*nodes->element[n], "health");
      const bool online = health != nullptr && ReplyText(*health) == "online";
      if (online || master == nullptr) master = nodes->element[n];
      if (online) break;
    }
    if (master == nullptr || slots->elements == 0) continue;
    const redisReply* port = MapGet(*master, "port");
    const redisReply* endpoint = MapGet(*master, "endpoint");
    if (endpoint == nullptr) endpoint = MapGet(*master, "ip");
    if (port == nullptr || port->type != REDIS_REPLY_INTEGER) {
      return Status::Internal("CLUSTER SHARDS master lacks a port");
    }
    for (size_t i = 0; i + 1 < slots->elements; i += 2) {
      ranges.push_back(
          SlotRange{.first = static_cast<int>(slots->element[i]->integer),
                    .last = static_cast<int>(slots->element[i + 1]->integer),
                    .host = AnnouncedHost(endpoint, asked),
                    .port = static_cast<int>(port->integer)});
    }
  }
  return ranges;
}

// CLUSTER SLOTS (before Redis 7): [first, last, [host, port, id], replicas].
StatusOr<std::vector<SlotRange>> ParseSlots(const redisReply& reply,
                                            const std::string& asked) {
  if (reply.type != REDIS_REPLY_ARRAY) {
    return Status::Internal("CLUSTER SLOTS reply is not an array");
  }
  std::vector<SlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply& r = *reply.element[i];
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 3 ||
        r.element[2]->type != REDIS_REPLY_ARRAY || r.element[2]->elements < 2) {
      return Status::Internal("CLUSTER SLOTS entry is malformed");
    }
    const redisReply& master = *r.element[2];
    ranges.push_back(
        SlotRange{.first = static_cast<int>(r.element[0]->integer),
                  .last = static_cast<int>(r.element[1]->integer),
                  .host = AnnouncedHost(master.element[0], asked),
                  .port = static_cast<int>(master.element[1]->integer)});
  }
  return ranges;
}

}  // namespace

uint16_t RedisKeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return static_cast<uint16_t>(Crc16(key) % RedisClusterClient::kSlots);
}

struct RedisClusterClient::Node {
  std::string host;
  int port = 0;
  std::string addr;  // "host:port"
  redisContext* ctx = nullptr;
  // The call that made ctx (call_seq_): an older one may have gone stale.
  uint64_t connected_in_call = 0;
  Clock::time_point down_until{};
  // Failures since the node last answered (its backoff doubles with each).
  int failures = 0;
  // The last failure cost a timeout (a node stalled, or unreachable): not
  // asked for a slot map within its backoff. A node that refused the
  // connection or sent a malformed reply answers fast, and is.
  bool timed_out = false;
  std::string last_error;
};

struct RedisClusterClient::PendingOp {
  size_t index = 0;        // Into the call's keys.
  Node* target = nullptr;  // Set by a redirect; else the slot's owner.
  bool asking = false;     // Send ASKING first (an ASK redirect).
  bool resent = false;     // Already sent again after an idle connection
                           // failed.
  int redirects = 0;
};

// One kind of command over a batch of keys.
struct RedisClusterClient::Command {
  // Appends key i's command words.
  std::function<void(size_t i, std::vector<const char*>* argv,
                     std::vector<size_t>* lens)>
      build;
  // Takes key i's reply (neither an error nor a redirect); false when the
  // reply is not of a type the command returns.
  std::function<bool(size_t i, const redisReply& reply)> on_reply;
  // Key i failed.
  std::function<void(size_t i, Status why)> on_error;
  // Set for GETs: bulk string replies are read by ReplyStream, each value
  // into the buffers place(i, length) gives for it (or, without any, into
  // the stream's scratch buffer), and handed to on_bulk, not on_reply.
  std::function<std::optional<ValueBuffers>(size_t i, size_t length)> place =
      nullptr;
  std::function<void(size_t i, const BulkValue& value)> on_bulk = nullptr;
};

// A bulk string reply read by ReplyStream.
struct RedisClusterClient::BulkValue {
  int64_t length = -1;       // -1: nil (no such key).
  bool placed = false;       // In the buffers Command::place gave.
  std::string_view value{};  // Else the value, alive until the next reply.
};

RedisClusterClient::RedisClusterClient(const RedisClusterOptions& options)
    : options_(options) {}

RedisClusterClient::~RedisClusterClient() {
  MutexLock lock(&mu_);
  for (auto& [addr, node] : nodes_) {
    if (node->ctx != nullptr) redisFree(node->ctx);
  }
}

StatusOr<std::unique_ptr<RedisClusterClient>> RedisClusterClient::Open(
    const RedisClusterOptions& options) {
  TIERKV_ASSIGN_OR_RETURN(auto seeds, ParseSeeds(options.seeds));
  if (options.max_redirects < 1 || options.connect_timeout.count() <= 0 ||
      options.command_timeout.count() <= 0) {
    return Status::InvalidArgument(
        "Redis Cluster options: max_redirects and both timeouts must be > 0");
  }
  std::unique_ptr<RedisClusterClient> client(new RedisClusterClient(options));
  client->seeds_ = std::move(seeds);
  TIERKV_RETURN_IF_ERROR(client->RefreshTopology());
  return client;
}

RedisClusterClient::Node* RedisClusterClient::NodeFor(const std::string& host,
                                                      int port) {
  const std::string addr = host + ":" + std::to_string(port);
  std::unique_ptr<Node>& node = nodes_[addr];
  if (node == nullptr) {
    node = std::make_unique<Node>();
    node->host = host;
    node->port = port;
    node->addr = addr;
  }
  return node.get();
}

Status RedisClusterClient::Connect(Node* node, bool ignore_backoff) {
  if (node->ctx != nullptr) return Status::Ok();
  if (!ignore_backoff && Clock::now() < node->down_until) {
    // The map still sends keys to a node that is down: read it again on the
    // next call, or a failover that completes within the backoff would go
    // unnoticed until a later failure.
    topology_stale_ = true;
    return Status::Unavailable("Redis node " + node->addr +
                               " is down: " + node->last_error);
  }
  redisContext* ctx = redisConnectWithTimeout(
      node->host.c_str(), node->port, ToTimeval(options_.connect_timeout));
  if (ctx == nullptr || ctx->err != 0) {
    const Status why = Status::Unavailable(
        "connecting to Redis node " + node->addr + ": " +
        (ctx == nullptr ? "out of memory" : std::string(ctx->errstr)));
    MarkDown(node, /*timed_out=*/why.message().find("timed out") !=
                       std::string::npos);
    if (ctx != nullptr) redisFree(ctx);
    node->last_error = why.message();
    topology_stale_ = true;
    return why;
  }
  if (redisSetTimeout(ctx, ToTimeval(options_.command_timeout)) != REDIS_OK) {
    redisFree(ctx);
    return Status::Internal("setting timeouts on the connection to " +
                            node->addr);
  }
  // Small commands (GET, replies to SET) must not wait for Nagle.
  const int one = 1;
  setsockopt(ctx->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  node->ctx = ctx;
  node->connected_in_call = call_seq_;
  return Status::Ok();
}

void RedisClusterClient::Disconnect(Node* node, const Status& why,
                                    bool mark_down) {
  if (node->ctx != nullptr) redisFree(node->ctx);
  node->ctx = nullptr;
  node->last_error = why.message();
  if (mark_down) {
    MarkDown(node, /*timed_out=*/why.code() == StatusCode::kDeadlineExceeded);
  }
  topology_stale_ = true;
}

void RedisClusterClient::MarkDown(Node* node, bool timed_out) {
  node->timed_out = timed_out;
  if (!timed_out) {
    // It answered at once (refused, closed, a malformed reply): trying it
    // again costs nothing, and a node restarting comes back soon.
    node->failures = 0;
    node->down_until = Clock::now() + options_.down_backoff;
    return;
  }
  const auto most = std::max(options_.down_backoff, options_.max_down_backoff);
  auto backoff = options_.down_backoff;
  for (int i = 0; i < node->failures && backoff < most; ++i) backoff *= 2;
  node->down_until = Clock::now() + std::min(backoff, most);
  node->failures = std::min(node->failures + 1, 30);
}

namespace {

Status TimeoutError(const std::string& addr,
                    std::chrono::milliseconds timeout) {
  return Status::DeadlineExceeded("Redis node " + addr +
                                  " did not answer within " +
                                  std::to_string(timeout.count()) + " ms");
}

// Why a context failed: a timeout (hiredis reports EAGAIN from a socket
// timeout as an I/O error) or anything else.
Status ContextError(const redisContext& ctx, const std::string& addr,
                    std::chrono::milliseconds timeout) {
  const std::string what(ctx.errstr);
  if (ctx.err == REDIS_ERR_IO &&
      what.find("temporarily unavailable") != std::string::npos) {
    return TimeoutError(addr, timeout);
  }
  return Status::Unavailable("Redis node " + addr + ": " + what);
}

Status Flush(redisContext* ctx) {
  int done = 0;
  while (done == 0) {
    if (redisBufferWrite(ctx, &done) != REDIS_OK) {
      return Status::Unavailable("write failed");  // ctx->err says why.
    }
  }
  return Status::Ok();
}

}  // namespace

// One connection's pipelined replies, read in order. A bulk string reply
// ("$<length>\r\n<bytes>\r\n") is parsed here and its bytes read from the
// socket straight into the caller's buffer: hiredis would read them through
// its reader buffer into a reply object, two copies of every byte. Any other
// reply (an error, a redirect, ASKING's +OK) goes to hiredis's parser. Bytes
// read past a reply wait in `buffer_`; hiredis gets them before it parses a
// reply, and what it reads past that reply comes back to `buffer_`, so the
// two never disagree on where the next reply starts.
class RedisClusterClient::ReplyStream {
 public:
  // Past this, a bulk header is malformed: "$", a length of at most 19
  // digits (or -1), "\r\n".
  static constexpr size_t kMaxHeaderBytes = 24;
  // The most read at a time into buffer_: a header and the first bytes of
  // its value. The rest of a value is read into the caller's buffer.
  static constexpr size_t kBufferBytes = 16 << 10;

  // Bytes read ahead are held by one side at a time: by buffer_ while the
  // stream reads values itself, by hiredis's reader from ReadReply until the
  // stream next reads (TakeBackFromHiredis at the start of Fill and
  // ReadValue), so replies hiredis parses one after another (a pipeline of
  // SETs or DELs) never cross between the two.
  ReplyStream(redisContext* ctx, const std::string& addr,
              std::chrono::milliseconds timeout)
      : ctx_(ctx), addr_(addr), timeout_(timeout) {}
  ReplyStream(const ReplyStream&) = delete;
  ReplyStream& operator=(const ReplyStream&) = delete;

  // Hands bytes read but not parsed back to hiredis's reader, which owns
  // the connection's later replies. Only for a connection that did not
  // fail (a failed one is dropped with its reader).
  void GiveBackToHiredis() {
    if (end_ > begin_) {
      redisReaderFeed(ctx_->reader, buffer_.data() + begin_, end_ - begin_);
    }
    begin_ = end_ = 0;
  }

  // The buffer a value is read into when its caller has none for it.
  std::string* scratch() { return &scratch_; }

  // When the next reply is a bulk string: its header consumed, its length
  // (-1 for nil). Otherwise nullopt, nothing consumed.
  StatusOr<std::optional<int64_t>> ReadBulkHeader() {
    TIERKV_RETURN_IF_ERROR(Fill(1));
    if (buffer_[begin_] != '$') return std::optional<int64_t>();
    for (;;) {
      const std::string_view held(buffer_.data() + begin_, end_ - begin_);
      const size_t newline = held.find("\r\n");
      if (newline != std::string_view::npos) {
        int64_t length = 0;
        const char* first = held.data() + 1;
        const char* last = held.data() + newline;
        const auto [stop, ec] = std::from_chars(first, last, length);
        if (ec != std::errc() || stop != last || length < -1) break;
        begin_ += newline + 2;
        return std::optional<int64_t>(length);
      }
      if (held.size() >= kMaxHeaderBytes) break;
      TIERKV_RETURN_IF_ERROR(Fill(held.size() + 1));
    }
    return Status::Unavailable("Redis node " + addr_ +
                               " sent a malformed bulk reply header");
  }

  // Reads a bulk value's bytes into `to`, and the "\r\n" after it once
  // `last` (the value's final part) is true.
  Status ReadValue(std::span<char> to, bool last) {
    TakeBackFromHiredis();
    const size_t held = std::min(end_ - begin_, to.size());
    if (held > 0) std::memcpy(to.data(), buffer_.data() + begin_, held);
    begin_ += held;
    for (size_t done = held; done < to.size();) {
      TIERKV_ASSIGN_OR_RETURN(const size_t got,
                              ReadSome(to.data() + done, to.size() - done));
      done += got;
    }
    if (!last) return Status::Ok();
    TIERKV_RETURN_IF_ERROR(Fill(2));
    if (buffer_[begin_] != '\r' || buffer_[begin_ + 1] != '\n') {
      return Status::Unavailable("Redis node " + addr_ +
                                 " sent a bulk reply longer than its header");
    }
    begin_ += 2;
    return Status::Ok();
  }

  // The next reply, parsed by hiredis.
  StatusOr<Reply> ReadReply() {
    if (end_ > begin_) {
      redisReaderFeed(ctx_->reader, buffer_.data() + begin_, end_ - begin_);
      begin_ = end_ = 0;
    }
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK) {
      return ContextError(*ctx_, addr_, timeout_);
    }
    return Reply(static_cast<redisReply*>(raw));
  }

 private:
  // Moves the bytes hiredis's reader holds past its last reply into
  // buffer_ (the reader is between replies: ridx is -1).
  void TakeBackFromHiredis() {
    redisReader* reader = ctx_->reader;
    const size_t left = reader->len - reader->pos;
    if (left == 0) return;
    Compact();
    if (buffer_.size() < end_ + left) buffer_.resize(end_ + left);
    std::memcpy(buffer_.data() + end_, reader->buf + reader->pos, left);
    end_ += left;
    // Consumed: hiredis drops consumed bytes at its next parse.
    reader->pos = reader->len;
  }

  void Compact() {
    if (begin_ == 0) return;
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }

  // Until buffer_ holds at least `bytes` unread bytes.
  Status Fill(size_t bytes) {
    TakeBackFromHiredis();
    while (end_ - begin_ < bytes) {
      if (buffer_.size() < kBufferBytes) buffer_.resize(kBufferBytes);
      // `bytes` is at most a header's, far less than the buffer.
      if (buffer_.size() - begin_ < bytes) Compact();
      TIERKV_ASSIGN_OR_RETURN(
          const size_t got,
          ReadSome(buffer_.data() + end_, buffer_.size() - end_));
      end_ += got;
    }
    return Status::Ok();
  }

  // One read(2) of at most `size` bytes (at least one): the socket's
  // timeout (SO_RCVTIMEO, set by Connect) is DeadlineExceeded, as hiredis's
  // own reads report it.
  StatusOr<size_t> ReadSome(char* to, size_t size) {
    for (;;) {
      const ssize_t got = read(ctx_->fd, to, size);
      if (got > 0) return static_cast<size_t>(got);
      if (got == 0) {
        return Status::Unavailable("Redis node " + addr_ +
                                   ": Server closed the connection");
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return TimeoutError(addr_, timeout_);
      }
      return Status::Unavailable("Redis node " + addr_ + ": " +
                                 std::strerror(errno));
    }
  }

  redisContext* const ctx_;
  const std::string& addr_;
  const std::chrono::milliseconds timeout_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // buffer_[begin_, end_) is read and not yet parsed.
  size_t end_ = 0;
  std::string scratch_;
};

Status RedisClusterClient::QueryTopology(Node* node) {
  TIERKV_RETURN_IF_ERROR(Connect(node, /*ignore_backoff=*/true));
  StatusOr<std::vector<SlotRange>> ranges = Status::Internal("unset");
  for (const char* sub : {"SHARDS", "SLOTS"}) {
    Reply reply(
        static_cast<redisReply*>(redisCommand(node->ctx, "CLUSTER %s", sub)));
    if (reply == nullptr) {
      const Status why =
          ContextError(*node->ctx, node->addr, options_.command_timeout);
      Disconnect(node, why, /*mark_down=*/true);
      return why;
    }
    // An error reply: CLUSTER SHARDS is unknown before Redis 7, so ask
    // CLUSTER SLOTS; or the node is not in cluster mode.
    if (reply->type == REDIS_REPLY_ERROR) {
      ranges =
          Status::FailedPrecondition(node->addr + " replied to CLUSTER " + sub +
                                     ": " + std::string(ReplyText(*reply)));
      continue;
    }
    ranges = std::string_view(sub) == "SHARDS" ? ParseShards(*reply, node->host)
                                               : ParseSlots(*reply, node->host);
    break;
  }
  TIERKV_RETURN_IF_ERROR(ranges.status());
  std::array<Node*, kSlots> owners{};
  int covered = 0;
  for (const SlotRange& range : *ranges) {
    if (range.first < 0 || range.last >= kSlots || range.first > range.last) {
      return Status::Internal(node->addr + " sent a bad slot range");
    }
    Node* owner = NodeFor(range.host, range.port);
    for (int slot = range.first; slot <= range.last; ++slot) {
      owners[slot] = owner;
      ++covered;
    }
  }
  node->failures = 0;  // It answered.
  if (covered == 0) {
    return Status::FailedPrecondition(node->addr +
                                      " knows no slots of a cluster");
  }
  slot_owner_ = owners;
  return Status::Ok();
}

Status RedisClusterClient::RefreshTopology() {
  MutexLock lock(&mu_);
  SigpipeGuard guard;
  return RefreshLocked();
}

Status RedisClusterClient::RefreshLocked() {
  // Nodes that serve slots first, then every other node known, then the
  // seeds; within that, by how likely each is to answer at once (below).
  std::vector<Node*> candidates;
  auto add = [&candidates](Node* n) {
    if (n != nullptr && std::find(candidates.begin(), candidates.end(), n) ==
                            candidates.end()) {
      candidates.push_back(n);
    }
  };
  for (Node* n : slot_owner_) add(n);
  for (auto& [addr, n] : nodes_) add(n.get());
  for (const auto& [host, port] : seeds_) add(NodeFor(host, port));
  // Nodes this client holds a connection to answered last time; nodes
  // past a failure's backoff may still be stalled (a timeout each); nodes
  // that timed out within it are not asked (a cluster that stopped
  // answering would cost every call a timeout per node), and other nodes
  // within it are asked last.
  const Clock::time_point now = Clock::now();
  auto rank = [now](const Node* n) {
    return n->ctx != nullptr ? 0 : n->down_until <= now ? 1 : 2;
  };
  std::erase_if(candidates, [now](const Node* n) {
    return n->timed_out && n->down_until > now;
  });
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [&rank](const Node* a, const Node* b) { return rank(a) < rank(b); });
  std::string failures;
  for (Node* n : candidates) {
    const Status s = QueryTopology(n);
    if (s.ok()) {
      topology_stale_ = false;
      ++stats_.topology_refreshes;
      return s;
    }
    ++stats_.topology_query_failures;
    failures += (failures.empty() ? "" : "; ") + s.message();
  }
  if (candidates.empty()) {
    return Status::Unavailable(
        "no Redis Cluster node to ask for a slot map: every node known "
        "timed out within its backoff");
  }
  return Status::Unavailable(
      "no Redis Cluster node answered with a slot map (" + failures + ")");
}

std::string RedisClusterClient::SlotOwner(uint16_t slot) {
  MutexLock lock(&mu_);
  const Node* n = slot < kSlots ? slot_owner_[slot] : nullptr;
  return n == nullptr ? "" : n->addr;
}

Status RedisClusterClient::ScanMasters(
    std::string_view pattern, size_t count,
    const std::function<void(std::string_view key)>& each) {
  MutexLock lock(&mu_);
  SigpipeGuard guard;
  ++call_seq_;
  // The map is read anew for every scan: SCAN is never redirected, so a
  // master that took slots since the map was read (a node added and given
  // slots) would otherwise never be scanned, and a scan that missed its
  // keys would count as whole.
  TIERKV_RETURN_IF_ERROR(RefreshLocked());
  const std::array<Node*, kSlots> scanned_map = slot_owner_;
  std::vector<Node*> masters;
  bool covered = true;
  for (Node* n : slot_owner_) {
    if (n == nullptr) covered = false;
    if (n != nullptr &&
        std::find(masters.begin(), masters.end(), n) == masters.end()) {
      masters.push_back(n);
    }
  }
  Status first =
      covered
          ? Status::Ok()
          : Status::Unavailable("the slot map leaves slots without a master");
  for (Node* node : masters) {
    Status s = ScanNode(node, pattern, count, each);
    if (!s.ok()) {
      ++stats_.errors;
      if (first.ok()) first = std::move(s);
    }
  }
  if (!first.ok()) return first;
  // A slot moved meanwhile may have had keys neither master's scan saw.
  TIERKV_RETURN_IF_ERROR(RefreshLocked());
  if (slot_owner_ != scanned_map) {
    return Status::Unavailable("the slot map changed during the scan");
  }
  return Status::Ok();
}

Status RedisClusterClient::ScanNode(
    Node* node, std::string_view pattern, size_t count,
    const std::function<void(std::string_view key)>& each) {
  const std::string count_text = std::to_string(count);
  std::string cursor = "0";
  bool replied = false;
  for (;;) {
    TIERKV_RETURN_IF_ERROR(Connect(node));
    const char* argv[] = {"SCAN",         cursor.data(), "MATCH",
                          pattern.data(), "COUNT",       count_text.data()};
    const size_t lens[] = {4, cursor.size(),    5, pattern.size(),
                           5, count_text.size()};
    Reply reply(
        static_cast<redisReply*>(redisCommandArgv(node->ctx, 6, argv, lens)));
    if (reply == nullptr) {
      const Status why =
          ContextError(*node->ctx, node->addr, options_.command_timeout);
      // A connection idle since an earlier call may have been closed by a
      // node that restarted meanwhile: once more on a fresh one.
      const bool stale = !replied && node->connected_in_call != call_seq_ &&
                         why.code() != StatusCode::kDeadlineExceeded;
      Disconnect(node, why, /*mark_down=*/!stale);
      if (stale) {
        replied = true;
        continue;
      }
      return why;
    }
    replied = true;
    node->failures = 0;
    if (reply->type == REDIS_REPLY_ERROR) {
      if (SuggestsNewTopology(ReplyText(*reply))) topology_stale_ = true;
      return FromErrorReply(node->addr, ReplyText(*reply));
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status::Internal(node->addr + " sent a malformed SCAN reply");
    }
    const redisReply& keys = *reply->element[1];
    for (size_t i = 0; i < keys.elements; ++i) {
      if (keys.element[i]->type == REDIS_REPLY_STRING) {
        each(ReplyText(*keys.element[i]));
      }
    }
    cursor = std::string(ReplyText(*reply->element[0]));
    if (cursor == "0") return Status::Ok();
  }
}

RedisClusterStats RedisClusterClient::stats() {
  MutexLock lock(&mu_);
  return stats_;
}

void RedisClusterClient::FailKey(const Command& command, size_t index,
                                 Status why) {
  ++stats_.errors;
  command.on_error(index, std::move(why));
}

void RedisClusterClient::RunBatch(std::span<const std::string> keys,
                                  const Command& command) {
  SigpipeGuard guard;
  ++call_seq_;
  std::vector<PendingOp> pending(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pending[i].index = i;
  while (!pending.empty()) {
    // A failed refresh leaves the old map; keys it sends astray fail or
    // are redirected on their own.
    if (topology_stale_) (void)RefreshLocked();
    pending = RunRound(keys, command, std::move(pending));
  }
}

std::vector<RedisClusterClient::PendingOp> RedisClusterClient::RunRound(
    std::span<const std::string> keys, const Command& command,
    std::vector<PendingOp> ops) {
  std::map<Node*, std::vector<PendingOp>> groups;
  for (const PendingOp& op : ops) {
    const uint16_t slot = RedisKeySlot(keys[op.index]);
    Node* node = op.target != nullptr ? op.target : slot_owner_[slot];
    if (node == nullptr) {
      topology_stale_ = true;
      FailKey(command, op.index,
              Status::Unavailable("no Redis node serves slot " +
                                  std::to_string(slot)));
      continue;
    }
    groups[node].push_back(op);
  }
  std::vector<PendingOp> next;
  // Every node's commands go out before any reply is read, so the nodes
  // work on their shares at the same time.
  std::vector<std::pair<Node*, std::vector<PendingOp>*>> sent;
  for (auto& [node, group] : groups) {
    const Status s = SendGroup(node, command, group);
    if (s.ok()) {
      sent.emplace_back(node, &group);
    } else {
      FailGroup(node, group, /*replied=*/false, s, command, &next);
    }
  }
  for (auto& [node, group] : sent) ReadGroup(node, command, *group, &next);
  return next;
}

Status RedisClusterClient::SendGroup(Node* node, const Command& command,
                                     std::vector<PendingOp>& group) {
  TIERKV_RETURN_IF_ERROR(Connect(node));
  // Written out every kFlushBytes, so that a batch of 2 MiB values never
  // sits whole in hiredis's output buffer.
  constexpr size_t kFlushBytes = 256 << 10;
  size_t queued = 0;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const PendingOp& op : group) {
    argv.clear();
    lens.clear();
    if (op.asking) {
      argv.push_back("ASKING");
      lens.push_back(6);
      redisAppendCommandArgv(node->ctx, 1, argv.data(), lens.data());
      argv.clear();
      lens.clear();
    }
    command.build(op.index, &argv, &lens);
    if (redisAppendCommandArgv(node->ctx, static_cast<int>(argv.size()),
                               argv.data(), lens.data()) != REDIS_OK) {
      return Status::Internal("hiredis could not queue a command for " +
                              node->addr);
    }
    for (const size_t len : lens) queued += len;
    if (queued >= kFlushBytes) {
      if (!Flush(node->ctx).ok()) {
        return ContextError(*node->ctx, node->addr, options_.command_timeout);
      }
      queued = 0;
    }
  }
  if (!Flush(node->ctx).ok()) {
    return ContextError(*node->ctx, node->addr, options_.command_timeout);
  }
  return Status::Ok();
}

void RedisClusterClient::ReadGroup(Node* node, const Command& command,
                                   std::vector<PendingOp>& group,
                                   std::vector<PendingOp>* next) {
  ReplyStream stream(node->ctx, node->addr, options_.command_timeout);
  bool replied = false;
  for (size_t i = 0; i < group.size(); ++i) {
    const Status read = ReadOne(stream, node, command, group[i], next);
    if (!read.ok()) {
      FailGroup(node, std::span<PendingOp>(group).subspan(i), replied, read,
                command, next);
      return;
    }
    replied = true;
    node->failures = 0;
  }
  stream.GiveBackToHiredis();
}

Status RedisClusterClient::ReadOne(ReplyStream& stream, Node* node,
                                   const Command& command, const PendingOp& op,
                                   std::vector<PendingOp>* next) {
  if (op.asking) TIERKV_RETURN_IF_ERROR(stream.ReadReply().status());
  if (command.on_bulk) {
    TIERKV_ASSIGN_OR_RETURN(const std::optional<int64_t> length,
                            stream.ReadBulkHeader());
    if (length.has_value()) {
      return ReadBulk(stream, command, op.index, *length, stream.scratch());
    }
  }
  TIERKV_ASSIGN_OR_RETURN(const Reply reply, stream.ReadReply());
  if (reply->type == REDIS_REPLY_ERROR) {
    HandleErrorReply(node, ReplyText(*reply), op, command, next);
  } else if (!command.on_reply(op.index, *reply)) {
    FailKey(command, op.index,
            Status::Internal(node->addr + " sent a reply of type " +
                             std::to_string(reply->type) +
                             " that the command never returns"));
  }
  return Status::Ok();
}

Status RedisClusterClient::ReadBulk(ReplyStream& stream, const Command& command,
                                    size_t index, int64_t length,
                                    std::string* scratch) {
  if (length < 0) {
    command.on_bulk(index, BulkValue{});
    return Status::Ok();
  }
  const size_t size = static_cast<size_t>(length);
  const std::optional<ValueBuffers> buffers = command.place(index, size);
  if (buffers.has_value() &&
      buffers->head.size() + buffers->body.size() != size) {
    return Status::Internal(
        "a value sink placed " +
        std::to_string(buffers->head.size() + buffers->body.size()) +
        " bytes for a value of " + std::to_string(size));
  }
  if (buffers.has_value()) {
    TIERKV_RETURN_IF_ERROR(stream.ReadValue(buffers->head, /*last=*/false));
    TIERKV_RETURN_IF_ERROR(stream.ReadValue(buffers->body, /*last=*/true));
    command.on_bulk(index, BulkValue{.length = length, .placed = true});
    return Status::Ok();
  }
  // Grown as the bytes arrive: a length that no bytes back up costs no
  // more than one step of memory.
  constexpr size_t kStep = 1 << 20;
  scratch->clear();
  do {
    const size_t at = scratch->size();
    const size_t part = std::min(kStep, size - at);
    scratch->resize(at + part);
    TIERKV_RETURN_IF_ERROR(stream.ReadValue(
        std::span<char>(scratch->data() + at, part), at + part == size));
  } while (scratch->size() < size);
  command.on_bulk(index, BulkValue{.length = length, .value = *scratch});
  return Status::Ok();
}

void RedisClusterClient::HandleErrorReply(Node* node, std::string_view message,
                                          PendingOp op, const Command& command,
                                          std::vector<PendingOp>* next) {
  Redirect redirect;
  if (!ParseRedirect(message, &redirect)) {
    if (SuggestsNewTopology(message)) topology_stale_ = true;
    FailKey(command, op.index, FromErrorReply(node->addr, message));
    return;
  }
  ++stats_.redirects;
  if (++op.redirects > options_.max_redirects) {
    FailKey(command, op.index,
            Status::Unavailable(
                "more than " + std::to_string(options_.max_redirects) +
                " redirects for one key; last: " + std::string(message)));
    return;
  }
  op.target = NodeFor(redirect.host, redirect.port);
  op.asking = redirect.ask;
  if (!redirect.ask) {
    // The slot has a new owner for good: use it now, and read the whole
    // map before the next round (other slots probably moved too).
    slot_owner_[redirect.slot] = op.target;
    topology_stale_ = true;
  }
  next->push_back(op);
}

void RedisClusterClient::FailGroup(Node* node, std::span<PendingOp> rest,
                                   bool replied, const Status& why,
                                   const Command& command,
                                   std::vector<PendingOp>* next) {
  // A connection idle since an earlier call may have been closed by a node
  // that restarted meanwhile: no reply at all on it says nothing about the
  // node now, so its keys go once more on a fresh connection.
  // A timeout is the node's doing, not the connection's. Without a
  // connection, Connect failed (and marked the node down) or refused a node
  // in its backoff, which must not extend the backoff.
  const bool connected = node->ctx != nullptr;
  const bool stale_connection = connected && !replied &&
                                node->connected_in_call != call_seq_ &&
                                why.code() != StatusCode::kDeadlineExceeded;
  if (connected) Disconnect(node, why, /*mark_down=*/!stale_connection);
  for (PendingOp& op : rest) {
    if (stale_connection && !op.resent) {
      op.resent = true;
      next->push_back(op);
    } else {
      FailKey(command, op.index, why);
    }
  }
}

std::vector<Status> RedisClusterClient::MultiSet(
    std::span<const std::string> keys, std::span<const std::string_view> values,
    std::chrono::milliseconds ttl) {
  std::vector<Status> results(keys.size());
  if (values.size() != keys.size()) {
    for (Status& s : results) {
      s = Status::InvalidArgument("MultiSet: " + std::to_string(keys.size()) +
                                  " keys but " + std::to_string(values.size()) +
                                  " values");
    }
    return results;
  }
  const bool whole_seconds = ttl.count() % 1000 == 0;
  const std::string ttl_unit = whole_seconds ? "EX" : "PX";
  const std::string ttl_value =
      std::to_string(whole_seconds ? ttl.count() / 1000 : ttl.count());
  Command command{
      .build =
          [&](size_t i, std::vector<const char*>* argv,
              std::vector<size_t>* lens) {
            *argv = {"SET", keys[i].data(), values[i].data()};
            *lens = {3, keys[i].size(), values[i].size()};
            if (ttl.count() > 0) {
              argv->insert(argv->end(), {ttl_unit.data(), ttl_value.data()});
              lens->insert(lens->end(), {ttl_unit.size(), ttl_value.size()});
            }
          },
      .on_reply =
          [&](size_t, const redisReply& reply) {
            return reply.type == REDIS_REPLY_STATUS && ReplyText(reply) == "OK";
          },
      .on_error = [&](size_t i, Status why) { results[i] = std::move(why); },
  };
  MutexLock lock(&mu_);
  RunBatch(keys, command);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (results[i].ok()) stats_.bytes_written += values[i].size();
  }
  return results;
}

std::vector<Status> RedisClusterClient::RunGets(
    std::span<const std::string> keys, const ValueSink& sink) {
  std::vector<Status> results(keys.size());
  std::vector<uint64_t> taken_bytes(keys.size(), 0);
  Command command{
      .build =
          [&](size_t i, std::vector<const char*>* argv,
              std::vector<size_t>* lens) {
            *argv = {"GET", keys[i].data()};
            *lens = {3, keys[i].size()};
          },
      // Values and nil are bulk replies (on_bulk): anything else that is
      // no error is a reply GET never sends.
      .on_reply = [](size_t, const redisReply&) { return false; },
      .on_error = [&](size_t i, Status why) { results[i] = std::move(why); },
      .place =
          [&](size_t i, size_t length) {
            return sink.place ? sink.place(i, length)
                              : std::optional<ValueBuffers>();
          },
      .on_bulk =
          [&](size_t i, const BulkValue& bulk) {
            if (bulk.length < 0) {
              results[i] = Status::NotFound("no key " + keys[i]);
              return;
            }
            if (bulk.placed) {
              results[i] = sink.placed ? sink.placed(i) : Status::Ok();
            } else if (sink.take) {
              results[i] = sink.take(i, bulk.value);
            } else {
              results[i] = Status::OutOfRange(
                  "value of " + keys[i] + " is " +
                  std::to_string(bulk.value.size()) +
                  " bytes, and no buffers were given for it");
            }
            if (results[i].ok()) taken_bytes[i] = bulk.length;
          },
  };
  RunBatch(keys, command);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (results[i].ok()) {
      ++stats_.hits;
      stats_.bytes_read += taken_bytes[i];
    } else if (results[i].code() == StatusCode::kNotFound) {
      ++stats_.misses;
    }
  }
  return results;
}

std::vector<StatusOr<std::string>> RedisClusterClient::MultiGet(
    std::span<const std::string> keys) {
  std::vector<std::string> values(keys.size());
  std::vector<Status> outcomes;
  {
    MutexLock lock(&mu_);
    outcomes = RunGets(
        keys, ValueSink{.take = [&values](size_t i, std::string_view value) {
          values[i].assign(value);
          return Status::Ok();
        }});
  }
  std::vector<StatusOr<std::string>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (outcomes[i].ok()) {
      results.emplace_back(std::move(values[i]));
    } else {
      results.emplace_back(std::move(outcomes[i]));
    }
  }
  return results;
}

std::vector<StatusOr<size_t>> RedisClusterClient::MultiGetInto(
    std::span<const std::string> keys,
    std::span<const std::span<char>> buffers) {
  if (buffers.size() != keys.size()) {
    return std::vector<StatusOr<size_t>>(
        keys.size(),
        StatusOr<size_t>(Status::InvalidArgument(
            "MultiGetInto: " + std::to_string(keys.size()) + " keys but " +
            std::to_string(buffers.size()) + " buffers")));
  }
  std::vector<size_t> lengths(keys.size(), 0);
  std::vector<Status> outcomes;
  {
    MutexLock lock(&mu_);
    // A value that fits is read straight into its buffer; one that does
    // not is read whole and refused.
    const ValueSink sink{
        .place = [&](size_t i, size_t length) -> std::optional<ValueBuffers> {
          if (length > buffers[i].size()) return std::nullopt;
          lengths[i] = length;
          return ValueBuffers{.head = {}, .body = buffers[i].first(length)};
        },
        .placed = [](size_t) { return Status::Ok(); },
        .take =
            [&](size_t i, std::string_view value) {
              return Status::OutOfRange("value of " + keys[i] + " is " +
                                        std::to_string(value.size()) +
                                        " bytes, its buffer " +
                                        std::to_string(buffers[i].size()));
            },
    };
    outcomes = RunGets(keys, sink);
  }
  std::vector<StatusOr<size_t>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (outcomes[i].ok()) {
      results.emplace_back(lengths[i]);
    } else {
      results.emplace_back(std::move(outcomes[i]));
    }
  }
  return results;
}

std::vector<Status> RedisClusterClient::MultiGetWith(
    std::span<const std::string> keys,
    const std::function<Status(size_t i, std::string_view value)>& take) {
  MutexLock lock(&mu_);
  return RunGets(keys, ValueSink{.take = take});
}

std::vector<Status> RedisClusterClient::MultiGetInPlace(
    std::span<const std::string> keys, const ValueSink& sink) {
  MutexLock lock(&mu_);
  return RunGets(keys, sink);
}

std::vector<StatusOr<bool>> RedisClusterClient::RunCountCommand(
    std::string_view name, std::span<const std::string> keys) {
  std::vector<StatusOr<bool>> results(
      keys.size(), StatusOr<bool>(Status::Internal("no reply")));
  Command command{
      .build =
          [&](size_t i, std::vector<const char*>* argv,
              std::vector<size_t>* lens) {
            *argv = {name.data(), keys[i].data()};
            *lens = {name.size(), keys[i].size()};
          },
      .on_reply =
          [&](size_t i, const redisReply& reply) {
            if (reply.type != REDIS_REPLY_INTEGER) return false;
            results[i] = reply.integer > 0;
            return true;
          },
      .on_error = [&](size_t i, Status why) { results[i] = std::move(why); },
  };
  MutexLock lock(&mu_);
  RunBatch(keys, command);
  return results;
}

std::vector<StatusOr<bool>> RedisClusterClient::MultiDel(
    std::span<const std::string> keys) {
  return RunCountCommand("DEL", keys);
}

std::vector<StatusOr<bool>> RedisClusterClient::Exists(
    std::span<const std::string> keys) {
  return RunCountCommand("EXISTS", keys);
}

Status RedisClusterClient::Set(const std::string& key, std::string_view value,
                               std::chrono::milliseconds ttl) {
  return MultiSet(std::span<const std::string>(&key, 1),
                  std::span<const std::string_view>(&value, 1), ttl)[0];
}

StatusOr<std::string> RedisClusterClient::Get(const std::string& key) {
  return std::move(MultiGet(std::span<const std::string>(&key, 1))[0]);
}

}  // namespace tierkv
