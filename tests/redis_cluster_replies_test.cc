// How RedisClusterClient reads GET replies (tiers/redis_cluster.cc: values
// off the socket into the caller's buffers, every other reply through
// hiredis), against scripted nodes: loopback listeners that speak just
// enough RESP for the client (CLUSTER SLOTS, ASKING, GET) and answer each
// GET with the bytes a test gives, whole, in small pieces, cut short or
// stalled. Values, nils, errors and replies GET never sends in one
// pipeline; MOVED and ASK among 2 MiB values; a value cut short, one
// stalled, and malformed bulk replies.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/status_matchers.h"
#include "tiers/redis_cluster.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kBlockBytes = 2 << 20;

// A failed Status (or StatusOr) of `code` whose message matches `text`.
MATCHER_P2(FailsWith, code, text,
           std::string("fails with ") + std::string(StatusCodeName(code))) {
  const Status s = StatusOf(arg);
  *result_listener << "which is " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(text, s.message(), result_listener);
}

// Deterministic bytes for (seed, size).
std::string Block(uint64_t seed, size_t size = kBlockBytes) {
  std::string bytes(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    bytes[i] = static_cast<char>(x >> 56);
  }
  return bytes;
}

std::string Bulk(const std::string& value) {
  return "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
}

// What a scripted node does for one GET.
struct Answer {
  std::string bytes;  // The reply, as sent.
  // Bytes per write, with a pause between writes (0: one write), so that
  // the client's reads end anywhere in the reply.
  size_t piece = 0;
  // After the reply: close the connection, or answer nothing more on it
  // until the node stops.
  bool close_after = false;
  bool stall_after = false;
};

// A node on loopback that answers CLUSTER SLOTS with one range, every slot
// on `owner_port` (0: itself), ASKING with +OK, CLUSTER anything else with
// an error, and GET key with script(key). One connection at a time; its
// thread stops when the node is destroyed.
class ScriptedNode {
 public:
  explicit ScriptedNode(std::function<Answer(const std::string& key)> script,
                        int owner_port = 0)
      : script_(std::move(script)) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0);
    EXPECT_EQ(listen(listener_, 8), 0);
    socklen_t len = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    owner_port_ = owner_port == 0 ? port_ : owner_port;
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedNode() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }

  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  int gets() const { return gets_; }

 private:
  // Waits up to 20 ms for `fd` to be readable; false when the node stops.
  bool WaitReadable(int fd) {
    for (;;) {
      if (stop_) return false;
      pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 20) > 0) return true;
    }
  }

  void Serve() {
    while (WaitReadable(listener_)) {
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ServeConnection(fd);
      close(fd);
    }
  }

  void ServeConnection(int fd) {
    std::string in;
    char chunk[4096];
    while (WaitReadable(fd)) {
      const ssize_t got = read(fd, chunk, sizeof(chunk));
      if (got <= 0) return;
      in.append(chunk, static_cast<size_t>(got));
      // Replies sent whole go out together, as a node's replies to a
      // pipeline do: the client's reads then span several of them.
      std::string together;
      std::vector<std::string> args;
      while (ParseCommand(&in, &args)) {
        const Answer answer = Respond(args);
        if (answer.piece == 0 && !answer.close_after && !answer.stall_after) {
          together += answer.bytes;
          continue;
        }
        if (!Send(fd, {.bytes = std::move(together)}) || !Send(fd, answer)) {
          return;
        }
        together.clear();
      }
      if (!Send(fd, {.bytes = std::move(together)})) return;
    }
  }

  // Takes one whole command ("*N\r\n" and N bulk strings) off `in`.
  static bool ParseCommand(std::string* in, std::vector<std::string>* args) {
    args->clear();
    size_t at = 0;
    auto line = [&](char type, size_t* n) {
      const size_t end = in->find("\r\n", at);
      if (end == std::string::npos || (*in)[at] != type) return false;
      *n = std::stoul(in->substr(at + 1, end - at - 1));
      at = end + 2;
      return true;
    };
    size_t count = 0;
    if (in->empty() || !line('*', &count)) return false;
    for (size_t i = 0; i < count; ++i) {
      size_t size = 0;
      if (at >= in->size() || !line('$', &size)) return false;
      if (in->size() < at + size + 2) return false;
      args->push_back(in->substr(at, size));
      at += size + 2;
    }
    in->erase(0, at);
    return true;
  }

  Answer Respond(const std::vector<std::string>& args) {
    if (args.size() == 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
      return Answer{.bytes = "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n" +
                             Bulk("127.0.0.1") + ":" +
                             std::to_string(owner_port_) + "\r\n"};
    }
    if (!args.empty() && args[0] == "CLUSTER") {
      return Answer{.bytes = "-ERR unknown subcommand\r\n"};
    }
    if (args.size() == 1 && args[0] == "ASKING") {
      return Answer{.bytes = "+OK\r\n"};
    }
    if (args.size() == 2 && args[0] == "GET") {
      ++gets_;
      return script_(args[1]);
    }
    return Answer{.bytes = "-ERR scripted node: unknown command\r\n"};
  }

  // False when the connection is to end.
  bool Send(int fd, const Answer& answer) {
    const size_t piece = answer.piece == 0 ? answer.bytes.size() : answer.piece;
    for (size_t at = 0; at < answer.bytes.size(); at += piece) {
      if (at > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      const std::string_view part =
          std::string_view(answer.bytes).substr(at, piece);
      for (size_t sent = 0; sent < part.size();) {
        const ssize_t n =
            send(fd, part.data() + sent, part.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return false;
        sent += static_cast<size_t>(n);
      }
    }
    if (answer.stall_after) {
      while (!stop_) std::this_thread::sleep_for(milliseconds(5));
    }
    return !answer.close_after && !answer.stall_after;
  }

  const std::function<Answer(const std::string& key)> script_;
  int listener_ = -1;
  int port_ = 0;
  int owner_port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> gets_{0};
  std::thread thread_;
};

std::unique_ptr<RedisClusterClient> OpenOn(
    const ScriptedNode& node,
    milliseconds command_timeout = milliseconds(2000)) {
  RedisClusterOptions options;
  options.seeds = node.addr();
  options.command_timeout = command_timeout;
  StatusOr<std::unique_ptr<RedisClusterClient>> client =
      RedisClusterClient::Open(options);
  EXPECT_THAT(client, IsOk());
  return client.ok() ? std::move(*client) : nullptr;
}

// A ValueSink that places each value whose length `expected` names (its
// first `head_bytes` into a head buffer, the rest into a body buffer) and
// takes any other whole.
struct RecordingSink {
  explicit RecordingSink(std::vector<std::optional<size_t>> expected,
                         size_t head_bytes = 16)
      : expected(std::move(expected)),
        head_bytes(head_bytes),
        heads(this->expected.size()),
        bodies(this->expected.size()),
        placed(this->expected.size(), false),
        taken(this->expected.size()) {}

  ValueSink sink() {
    return ValueSink{
        .place = [this](size_t i,
                        size_t length) -> std::optional<ValueBuffers> {
          if (expected[i] != length) return std::nullopt;
          const size_t head = std::min(head_bytes, length);
          heads[i].assign(head, '\0');
          bodies[i].assign(length - head, '\0');
          return ValueBuffers{.head = heads[i], .body = bodies[i]};
        },
        .placed =
            [this](size_t i) {
              placed[i] = true;
              return Status::Ok();
            },
        .take =
            [this](size_t i, std::string_view value) {
              taken[i] = std::string(value);
              return Status::Ok();
            },
    };
  }
  // Key i's value as read: placed (head and body joined) or taken.
  std::optional<std::string> value(size_t i) const {
    if (placed[i]) return heads[i] + bodies[i];
    return taken[i];
  }

  std::vector<std::optional<size_t>> expected;
  size_t head_bytes;
  std::vector<std::string> heads;
  std::vector<std::string> bodies;
  std::vector<bool> placed;
  std::vector<std::optional<std::string>> taken;
};

TEST(RedisClusterRepliesTest, ValuesNilsErrorsAndOtherRepliesInOnePipeline) {
  const std::map<std::string, Answer> script = {
      {"big", {.bytes = Bulk(Block(1))}},
      {"nil", {.bytes = "$-1\r\n"}},
      {"err", {.bytes = "-ERR boom\r\n"}},
      // One byte per write: reads end inside the header, the value and
      // the "\r\n" after it.
      {"dribbled", {.bytes = Bulk(Block(2, 300)), .piece = 1}},
      {"empty", {.bytes = Bulk("")}},
      {"integer", {.bytes = ":7\r\n"}},
      {"other_length", {.bytes = Bulk(Block(3, 5000))}},
      {"pieces", {.bytes = Bulk(Block(4)), .piece = 4099}},
  };
  ScriptedNode node(
      [&script](const std::string& key) { return script.at(key); });
  std::unique_ptr<RedisClusterClient> client = OpenOn(node);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"big",          "nil",   "err",
                                         "dribbled",     "empty", "integer",
                                         "other_length", "pieces"};
  RecordingSink sink({kBlockBytes, 0, 0, 300, 0, 0, 4096, kBlockBytes});
  const std::vector<Status> got = client->MultiGetInPlace(keys, sink.sink());
  ASSERT_EQ(got.size(), keys.size());

  EXPECT_THAT(got[0], IsOk());
  EXPECT_TRUE(sink.placed[0]);
  EXPECT_EQ(sink.value(0), Block(1));
  EXPECT_THAT(got[1], StatusIs(StatusCode::kNotFound));
  EXPECT_FALSE(sink.placed[1]);
  EXPECT_THAT(got[2], FailsWith(StatusCode::kInternal, HasSubstr("ERR boom")));
  EXPECT_THAT(got[3], IsOk());
  EXPECT_TRUE(sink.placed[3]);
  EXPECT_EQ(sink.value(3), Block(2, 300));
  EXPECT_THAT(got[4], IsOk());
  EXPECT_TRUE(sink.placed[4]);
  EXPECT_EQ(sink.value(4), "");
  EXPECT_THAT(got[5], FailsWith(StatusCode::kInternal,
                                HasSubstr("the command never returns")));
  // Not the length the sink wanted: read whole, handed to take.
  EXPECT_THAT(got[6], IsOk());
  EXPECT_FALSE(sink.placed[6]);
  EXPECT_EQ(sink.value(6), Block(3, 5000));
  EXPECT_THAT(got[7], IsOk());
  EXPECT_TRUE(sink.placed[7]);
  EXPECT_EQ(sink.value(7), Block(4));

  const RedisClusterStats stats = client->stats();
  EXPECT_EQ(stats.hits, 5u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.errors, 2u);
  EXPECT_EQ(stats.bytes_read, 2 * kBlockBytes + 300 + 5000);

  // The same replies through MultiGet (no buffers of the caller's) and
  // MultiGetInto (a buffer too small for one value).
  const std::vector<StatusOr<std::string>> values = client->MultiGet(keys);
  EXPECT_THAT(values[0], IsOkAndHolds(Block(1)));
  EXPECT_THAT(values[1], StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(values[3], IsOkAndHolds(Block(2, 300)));
  EXPECT_THAT(values[4], IsOkAndHolds(""));
  EXPECT_THAT(values[6], IsOkAndHolds(Block(3, 5000)));
  EXPECT_THAT(values[7], IsOkAndHolds(Block(4)));
  const std::vector<std::string> into_keys = {"other_length", "dribbled"};
  std::vector<char> small(1000), large(1000);
  const std::vector<std::span<char>> buffers = {small, large};
  const std::vector<StatusOr<size_t>> into =
      client->MultiGetInto(into_keys, buffers);
  EXPECT_THAT(into[0], StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(into[1], IsOkAndHolds(300u));
  EXPECT_EQ(std::string(large.data(), 300), Block(2, 300));

  // A sink without take: a value it gives no buffers for fails its key.
  ValueSink place_only = sink.sink();
  place_only.take = nullptr;
  const std::vector<std::string> other = {"other_length"};
  EXPECT_THAT(client->MultiGetInPlace(other, place_only)[0],
              StatusIs(StatusCode::kOutOfRange));
}

TEST(RedisClusterRepliesTest, MovedAndAskAmongLargeValues) {
  ScriptedNode target([](const std::string& key) {
    if (key == "k1") return Answer{.bytes = Bulk(Block(11))};
    if (key == "k3") return Answer{.bytes = Bulk(Block(13)), .piece = 65536};
    return Answer{.bytes = "$-1\r\n"};
  });
  const std::string to = target.addr();
  // Every slot is the first node's; it redirects two keys mid-pipeline,
  // each followed by a 2 MiB value whose first bytes hiredis reads with
  // the redirect.
  ScriptedNode owner([&to](const std::string& key) {
    const std::string slot = std::to_string(RedisKeySlot(key));
    if (key == "k0") return Answer{.bytes = Bulk(Block(10))};
    if (key == "k1")
      return Answer{.bytes = "-MOVED " + slot + " " + to + "\r\n"};
    if (key == "k2") return Answer{.bytes = Bulk(Block(12))};
    if (key == "k3") return Answer{.bytes = "-ASK " + slot + " " + to + "\r\n"};
    return Answer{.bytes = Bulk(Block(14))};
  });
  std::unique_ptr<RedisClusterClient> client = OpenOn(owner);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"k0", "k1", "k2", "k3", "k4"};
  RecordingSink sink(std::vector<std::optional<size_t>>(5, kBlockBytes), 100);
  const std::vector<Status> got = client->MultiGetInPlace(keys, sink.sink());
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(got[i], IsOk()) << keys[i];
    EXPECT_TRUE(sink.placed[i]) << keys[i];
    EXPECT_EQ(sink.value(i), Block(10 + i)) << keys[i];
  }
  EXPECT_EQ(target.gets(), 2);
  const RedisClusterStats stats = client->stats();
  EXPECT_EQ(stats.redirects, 2u);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.hits, 5u);
}

// Every key of a group asked of its owner with ASKING first: hiredis parses
// each +OK and reads past it, into the 2 MiB value behind, from the socket
// itself; the stream takes those bytes back before it reads the value.
TEST(RedisClusterRepliesTest, ValuesBehindAskingRepliesArriveWhole) {
  ScriptedNode target([](const std::string& key) {
    return Answer{.bytes = Bulk(Block(key == "x" ? 7 : 8))};
  });
  const std::string to = target.addr();
  ScriptedNode owner([&to](const std::string& key) {
    const std::string slot = std::to_string(RedisKeySlot(key));
    return Answer{.bytes = "-ASK " + slot + " " + to + "\r\n"};
  });
  std::unique_ptr<RedisClusterClient> client = OpenOn(owner);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"x", "y"};
  RecordingSink sink(std::vector<std::optional<size_t>>(2, kBlockBytes), 100);
  const std::vector<Status> got = client->MultiGetInPlace(keys, sink.sink());
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(got[i], IsOk()) << keys[i];
    EXPECT_TRUE(sink.placed[i]) << keys[i];
    EXPECT_EQ(sink.value(i), Block(7 + i)) << keys[i];
  }
  EXPECT_EQ(target.gets(), 2);
}

TEST(RedisClusterRepliesTest, AValueCutShortFailsItAndTheRestOfItsPipeline) {
  const std::string whole = Bulk(Block(2));
  ScriptedNode node([&whole](const std::string& key) {
    if (key == "a") return Answer{.bytes = Bulk(Block(1, 100000))};
    if (key == "b") {
      return Answer{.bytes = whole.substr(0, whole.size() / 2),
                    .close_after = true};
    }
    return Answer{.bytes = Bulk(Block(3, 100))};
  });
  std::unique_ptr<RedisClusterClient> client = OpenOn(node);
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"a", "b", "c"};
  RecordingSink sink({100000, kBlockBytes, 100});
  const std::vector<Status> got = client->MultiGetInPlace(keys, sink.sink());
  EXPECT_THAT(got[0], IsOk());
  EXPECT_EQ(sink.value(0), Block(1, 100000));
  // Half of b's value arrived: never handed on, a failure.
  EXPECT_THAT(got[1], FailsWith(StatusCode::kUnavailable,
                                HasSubstr("closed the connection")));
  EXPECT_FALSE(sink.placed[1]);
  EXPECT_THAT(got[2], StatusIs(StatusCode::kUnavailable));
  EXPECT_FALSE(sink.placed[2]);
  EXPECT_EQ(client->stats().errors, 2u);

  // The next call reads the map again on a fresh connection.
  const std::vector<std::string> again = {"c", "a"};
  const std::vector<StatusOr<std::string>> values = client->MultiGet(again);
  EXPECT_THAT(values[0], IsOkAndHolds(Block(3, 100)));
  EXPECT_THAT(values[1], IsOkAndHolds(Block(1, 100000)));
}

TEST(RedisClusterRepliesTest, AValueStalledMidwayTimesOut) {
  const std::string whole = Bulk(Block(1));
  ScriptedNode node([&whole](const std::string&) {
    return Answer{.bytes = whole.substr(0, 300000), .stall_after = true};
  });
  std::unique_ptr<RedisClusterClient> client = OpenOn(node, milliseconds(300));
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> keys = {"s"};
  RecordingSink sink({kBlockBytes});
  const Clock::time_point start = Clock::now();
  const std::vector<Status> got = client->MultiGetInPlace(keys, sink.sink());
  const auto took = Clock::now() - start;
  EXPECT_THAT(got[0], FailsWith(StatusCode::kDeadlineExceeded,
                                HasSubstr("did not answer within 300 ms")));
  EXPECT_FALSE(sink.placed[0]);
  EXPECT_GE(took, milliseconds(300));
}

TEST(RedisClusterRepliesTest, MalformedBulkRepliesDropTheConnection) {
  ScriptedNode node([](const std::string& key) {
    if (key == "bad") return Answer{.bytes = "$12x\r\n"};
    if (key == "endless") return Answer{.bytes = "$" + std::string(30, '1')};
    if (key == "long") return Answer{.bytes = "$3\r\nabcdef\r\n"};
    return Answer{.bytes = Bulk("hi")};
  });
  std::unique_ptr<RedisClusterClient> client = OpenOn(node);
  ASSERT_NE(client, nullptr);
  for (const auto& [key, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"bad", "malformed bulk reply header"},
           {"endless", "malformed bulk reply header"},
           {"long", "longer than its header"}}) {
    const std::vector<std::string> keys = {"ok", key, "ok"};
    const std::vector<StatusOr<std::string>> got = client->MultiGet(keys);
    EXPECT_THAT(got[0], IsOkAndHolds("hi")) << key;
    EXPECT_THAT(got[1], FailsWith(StatusCode::kUnavailable, HasSubstr(why)))
        << key;
    EXPECT_THAT(got[2], StatusIs(StatusCode::kUnavailable)) << key;
  }
  const std::vector<std::string> ok = {"ok"};
  EXPECT_THAT(client->MultiGet(ok)[0], IsOkAndHolds("hi"));
}

}  // namespace
}  // namespace tierkv
