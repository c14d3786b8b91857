// vLLM-format KV cache events (tools/daemon/kv_events.h): the msgpack
// encoding of a batch, decoded back with msgpack-c field by field as vLLM's
// msgspec decoder reads it; the merging of chained blocks into one
// BlockStored; and the publisher over real ZeroMQ sockets, a SUB socket for
// the live stream and a DEALER for replay (what a router runs).
#include "tools/daemon/kv_events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <msgpack.hpp>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "tests/scratch.h"
#include "tests/status_matchers.h"

namespace tierkv::daemon {
namespace {

using ::testing::ElementsAre;
using Clock = std::chrono::steady_clock;

BlockKey Key(uint64_t i) { return {.lo = i * 0x9e3779b97f4a7c15, .hi = i}; }

std::vector<TokenId> Tokens(TokenId first, int n) {
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) out.push_back(first + static_cast<TokenId>(i));
  return out;
}

KvEvent Stored(CacheMedium medium, uint64_t key, std::optional<uint64_t> parent,
               TokenId first_token, std::optional<uint64_t> lora = {}) {
  return {
      .type = KvEvent::Type::kBlockStored,
      .medium = medium,
      .keys = {Key(key)},
      .parent = parent ? std::optional<BlockKey>(Key(*parent)) : std::nullopt,
      .tokens = Tokens(first_token, 4),
      .block_size = 4,
      .lora_id = lora};
}

KvEvent Removed(CacheMedium medium, uint64_t key) {
  return {.type = KvEvent::Type::kBlockRemoved,
          .medium = medium,
          .keys = {Key(key)},
          .parent = std::nullopt,
          .tokens = {},
          .block_size = 0,
          .lora_id = std::nullopt};
}

std::string Bin(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  return {o.via.bin.ptr, o.via.bin.size};
}

std::string Str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return {o.via.str.ptr, o.via.str.size};
}

std::vector<msgpack::object> Array(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  if (o.type != msgpack::type::ARRAY) return {};
  return {o.via.array.ptr, o.via.array.ptr + o.via.array.size};
}

TEST(KvEventsEncoding, BlockHashIsTheKeyBigEndian) {
  const BlockKey key =
      BlockKey::FromHex("0123456789abcdeffedcba9876543210").value();
  const std::string hash = KvEventBlockHash(key);
  ASSERT_EQ(hash.size(), 16u);
  std::string hex;
  for (unsigned char c : hash) {
    constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  EXPECT_EQ(hex, key.ToHex());
}

// Each event is an array that starts with its tag, fields in vLLM's order.
TEST(KvEventsEncoding, BatchDecodesFieldByField) {
  std::vector<KvEvent> events = {
      Stored(CacheMedium::kCpu, 1, std::nullopt, 100, 7),
      Removed(CacheMedium::kStorage, 2),
      {.type = KvEvent::Type::kAllBlocksCleared,
       .medium = CacheMedium::kCpu,
       .keys = {},
       .parent = std::nullopt,
       .tokens = {},
       .block_size = 0,
       .lora_id = std::nullopt},
      Stored(CacheMedium::kStorage, 3, 1, 200)};
  const std::string bytes =
      EncodeKvEventBatch(1234.5, events, KvEventHashFormat::kBytes);
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  std::vector<msgpack::object> batch = Array(handle.get());
  // data_parallel_rank is 0, as a vLLM publisher fills it in: a decoder
  // that reads the batch as a 3-tuple (Dynamo's) refuses 2 fields.
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(batch[2].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(batch[2].as<int>(), 0);
  EXPECT_EQ(batch[0].type, msgpack::type::FLOAT64);
  EXPECT_DOUBLE_EQ(batch[0].as<double>(), 1234.5);
  std::vector<msgpack::object> decoded = Array(batch[1]);
  ASSERT_EQ(decoded.size(), 4u);

  std::vector<msgpack::object> stored = Array(decoded[0]);
  ASSERT_EQ(stored.size(), 8u);
  EXPECT_EQ(Str(stored[0]), "BlockStored");
  std::vector<msgpack::object> hashes = Array(stored[1]);
  ASSERT_EQ(hashes.size(), 1u);
  EXPECT_EQ(Bin(hashes[0]), KvEventBlockHash(Key(1)));
  EXPECT_TRUE(stored[2].is_nil());  // The first block has no parent.
  EXPECT_EQ(stored[3].as<std::vector<uint32_t>>(),
            (std::vector<uint32_t>{100, 101, 102, 103}));
  EXPECT_EQ(stored[4].as<int>(), 4);
  EXPECT_EQ(stored[5].as<uint64_t>(), 7u);  // lora_id
  EXPECT_EQ(Str(stored[6]), "CPU");
  EXPECT_TRUE(stored[7].is_nil());  // lora_name

  std::vector<msgpack::object> removed = Array(decoded[1]);
  ASSERT_EQ(removed.size(), 3u);
  EXPECT_EQ(Str(removed[0]), "BlockRemoved");
  hashes = Array(removed[1]);
  ASSERT_EQ(hashes.size(), 1u);
  EXPECT_EQ(Bin(hashes[0]), KvEventBlockHash(Key(2)));
  EXPECT_EQ(Str(removed[2]), "DISK");

  std::vector<msgpack::object> cleared = Array(decoded[2]);
  ASSERT_EQ(cleared.size(), 1u);
  EXPECT_EQ(Str(cleared[0]), "AllBlocksCleared");

  stored = Array(decoded[3]);
  ASSERT_EQ(stored.size(), 8u);
  EXPECT_EQ(Bin(stored[2]), KvEventBlockHash(Key(1)));  // parent
  EXPECT_TRUE(stored[5].is_nil());                      // no LoRA
  EXPECT_EQ(Str(stored[6]), "DISK");
}

// vLLM's default form: each hash an unsigned 64-bit integer, the key's low
// word (the last 8 of its 16 bytes, as vLLM folds a digest).
TEST(KvEventsEncoding, IntegerHashesAreTheKeysLowWord) {
  const BlockKey key = {.lo = 0xfedcba9876543210, .hi = 0x0123456789abcdef};
  const BlockKey parent = {.lo = 0x8000000000000001, .hi = 2};
  const std::vector<TokenId> tokens = Tokens(0, 4);
  std::vector<KvEvent> events = {{.type = KvEvent::Type::kBlockStored,
                                  .medium = CacheMedium::kCpu,
                                  .keys = {key},
                                  .parent = parent,
                                  .tokens = tokens,
                                  .block_size = 4,
                                  .lora_id = std::nullopt}};
  const std::string bytes = EncodeKvEventBatch(1.0, events);  // The default.
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  std::vector<msgpack::object> stored =
      Array(Array(Array(handle.get()).at(1)).at(0));
  ASSERT_EQ(stored.size(), 8u);
  std::vector<msgpack::object> hashes = Array(stored[1]);
  ASSERT_EQ(hashes.size(), 1u);
  EXPECT_EQ(hashes[0].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(hashes[0].as<uint64_t>(), key.lo);
  EXPECT_EQ(stored[2].as<uint64_t>(), parent.lo);  // Above 2^63: unsigned.
  const std::string whole = KvEventBlockHash(key);
  uint64_t tail = 0;
  for (size_t i = 8; i < 16; ++i) {
    tail = (tail << 8) | static_cast<unsigned char>(whole[i]);
  }
  EXPECT_EQ(tail, key.lo);
  EXPECT_EQ(KvEventHashFormatName(ParseKvEventHashFormat("int").value()),
            std::string("int"));
  EXPECT_EQ(ParseKvEventHashFormat("bytes").value(), KvEventHashFormat::kBytes);
  EXPECT_THAT(ParseKvEventHashFormat("hex"),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(KvEventsEncoding, MetricsTextNamesEachCounter) {
  const std::string text = FormatKvEventMetrics({.events_queued = 5,
                                                 .events_dropped = 2,
                                                 .batches_published = 3,
                                                 .replay_requests = 1},
                                                "store=\"s\"");
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "tierkv_kv_events_dropped_total{store=\"s\"} 2\n"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "tierkv_kv_events_queued_total{store=\"s\"} 5\n"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "# TYPE tierkv_kv_events_batches_total counter\n"));
}

// A request's chain of blocks travels as one BlockStored, as vLLM's does.
TEST(KvEventsEncoding, ChainedBlocksMergeIntoOneEvent) {
  std::vector<KvEvent> events;
  AppendKvEvent(Stored(CacheMedium::kCpu, 1, std::nullopt, 0), 100, &events);
  AppendKvEvent(Stored(CacheMedium::kCpu, 2, 1, 4), 100, &events);
  AppendKvEvent(Stored(CacheMedium::kCpu, 3, 2, 8), 100, &events);
  // Not the chain's next block, another medium, another LoRA: apart.
  AppendKvEvent(Stored(CacheMedium::kCpu, 5, 1, 20), 100, &events);
  AppendKvEvent(Stored(CacheMedium::kStorage, 6, 5, 24), 100, &events);
  AppendKvEvent(Stored(CacheMedium::kStorage, 7, 6, 28, 3), 100, &events);
  AppendKvEvent(Removed(CacheMedium::kCpu, 1), 100, &events);
  AppendKvEvent(Removed(CacheMedium::kCpu, 2), 100, &events);
  AppendKvEvent(Removed(CacheMedium::kStorage, 3), 100, &events);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_THAT(events[0].keys, ElementsAre(Key(1), Key(2), Key(3)));
  EXPECT_EQ(events[0].parent, std::nullopt);
  EXPECT_EQ(events[0].tokens, Tokens(0, 12));
  EXPECT_THAT(events[1].keys, ElementsAre(Key(5)));
  EXPECT_THAT(events[2].keys, ElementsAre(Key(6)));
  EXPECT_THAT(events[3].keys, ElementsAre(Key(7)));
  EXPECT_THAT(events[4].keys, ElementsAre(Key(1), Key(2)));
  EXPECT_THAT(events[5].keys, ElementsAre(Key(3)));
}

TEST(KvEventsEncoding, MergingStopsAtTheCap) {
  std::vector<KvEvent> events;
  AppendKvEvent(Removed(CacheMedium::kCpu, 1), 2, &events);
  AppendKvEvent(Removed(CacheMedium::kCpu, 2), 2, &events);
  AppendKvEvent(Removed(CacheMedium::kCpu, 3), 2, &events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_THAT(events[0].keys, ElementsAre(Key(1), Key(2)));
  EXPECT_THAT(events[1].keys, ElementsAre(Key(3)));
}

// What DecodeKvEventBatch gives back of an event, for comparisons.
std::string Describe(const KvEvent& e) {
  std::string out = e.type == KvEvent::Type::kBlockStored    ? "stored"
                    : e.type == KvEvent::Type::kBlockRemoved ? "removed"
                                                             : "cleared";
  if (e.type == KvEvent::Type::kAllBlocksCleared) return out;
  out += std::string(" ") + CacheMediumName(e.medium);
  for (const BlockKey& k : e.keys) out += " " + k.ToHex();
  if (e.type == KvEvent::Type::kBlockRemoved) return out;
  out += " parent " + (e.parent ? e.parent->ToHex() : std::string("-"));
  out += " tokens";
  for (TokenId t : e.tokens) out += " " + std::to_string(t);
  out += " size " + std::to_string(e.block_size) + " lora " +
         (e.lora_id ? std::to_string(*e.lora_id) : std::string("-"));
  return out;
}

std::vector<KvEvent> EveryKindOfEvent() {
  // Token ids span the whole uint32 range, as tierkv takes them.
  return {Stored(CacheMedium::kCpu, 1, std::nullopt, 0xfffffffcu, 7),
          Stored(CacheMedium::kStorage, 2, 1, 200),
          Stored(CacheMedium::kRemote, 3, std::nullopt, 300),
          Removed(CacheMedium::kRemote, 3),
          Removed(CacheMedium::kCpu, 1),
          {.type = KvEvent::Type::kAllBlocksCleared,
           .medium = CacheMedium::kCpu,
           .keys = {},
           .parent = std::nullopt,
           .tokens = {},
           .block_size = 0,
           .lora_id = std::nullopt}};
}

TEST(KvEventsDecoding, BytesHashesGiveBackEveryEventWhole) {
  const std::vector<KvEvent> events = EveryKindOfEvent();
  StatusOr<DecodedKvEventBatch> back = DecodeKvEventBatch(
      EncodeKvEventBatch(12.5, events, KvEventHashFormat::kBytes));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->ts, 12.5);
  ASSERT_EQ(back->events.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(Describe(back->events[i]), Describe(events[i])) << i;
  }
}

TEST(KvEventsDecoding, IntegerHashesGiveBackTheKeysLowWords) {
  std::vector<KvEvent> events = EveryKindOfEvent();
  StatusOr<DecodedKvEventBatch> back =
      DecodeKvEventBatch(EncodeKvEventBatch(1, events));
  ASSERT_THAT(back, IsOk());
  ASSERT_EQ(back->events.size(), events.size());
  for (KvEvent& e : events) {
    for (BlockKey& k : e.keys) k.hi = 0;
    if (e.parent) e.parent->hi = 0;
  }
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(Describe(back->events[i]), Describe(events[i])) << i;
  }
}

// vLLM's BlockStored has grown fields at its end over releases; a decoder
// reads the ones it knows by position and skips the rest.
TEST(KvEventsDecoding, ReadsVllmsShorterAndLongerBlockStored) {
  for (int fields : {7, 8, 11}) {
    msgpack::sbuffer buffer;
    msgpack::packer<msgpack::sbuffer> pk(&buffer);
    pk.pack_array(2);
    pk.pack_double(3.0);
    pk.pack_array(1);
    pk.pack_array(static_cast<uint32_t>(fields));
    pk.pack(std::string("BlockStored"));
    pk.pack_array(1);
    pk.pack_uint64(42);
    pk.pack_nil();
    pk.pack_array(2);
    pk.pack_uint32(5);
    pk.pack_uint32(6);
    pk.pack_int32(16);
    pk.pack_nil();
    pk.pack(std::string("CPU"));
    for (int extra = 7; extra < fields; ++extra) pk.pack_nil();
    StatusOr<DecodedKvEventBatch> back =
        DecodeKvEventBatch({buffer.data(), buffer.size()});
    ASSERT_THAT(back, IsOk()) << fields;
    ASSERT_EQ(back->events.size(), 1u);
    const std::string key = BlockKey{.lo = 42, .hi = 0}.ToHex();
    EXPECT_EQ(Describe(back->events[0]),
              "stored CPU " + key + " parent - tokens 5 6 size 16 lora -");
  }
}

// Anything malformed is an error, never a crash nor a half-decoded batch:
// every cut of a real batch, bytes after it, an events array that claims
// fewer or more events than follow, a container longer than the batch, a
// medium tierkv does not name, and bytes that are no msgpack at all. Every
// single-byte change decodes to an error or to a whole batch.
TEST(KvEventsDecoding, RefusesWhatIsMalformed) {
  const std::vector<KvEvent> events = EveryKindOfEvent();
  const std::string good =
      EncodeKvEventBatch(12.5, events, KvEventHashFormat::kBytes);
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_THAT(DecodeKvEventBatch(good.substr(0, cut)),
                StatusIs(StatusCode::kInvalidArgument))
        << cut;
  }
  EXPECT_THAT(DecodeKvEventBatch(good + "garbage"),
              StatusIs(StatusCode::kInvalidArgument));
  // [ts, [events]]: the events array's header follows the 9-byte float64.
  ASSERT_EQ(static_cast<unsigned char>(good[10]), 0x90 | events.size());
  for (int n : {-1, +1}) {
    std::string bad = good;
    bad[10] = static_cast<char>(0x90 | (events.size() + n));
    EXPECT_THAT(DecodeKvEventBatch(bad), StatusIs(StatusCode::kInvalidArgument))
        << n;
  }
  std::string huge = good.substr(0, 10);
  huge += std::string("\xdd\xff\xff\xff\xff", 5);  // array32 of 2^32-1.
  EXPECT_THAT(DecodeKvEventBatch(huge), StatusIs(StatusCode::kInvalidArgument));
  for (size_t i = 0; i < good.size(); ++i) {
    for (unsigned char flip : {0x01, 0x80, 0xff}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      StatusOr<DecodedKvEventBatch> back = DecodeKvEventBatch(bad);
      if (!back.ok()) {
        EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
      } else {
        // A change that still parses changed a value (the time, a token id,
        // a hash byte), never the batch's shape.
        ASSERT_EQ(back->events.size(), events.size()) << i;
        for (size_t e = 0; e < events.size(); ++e) {
          EXPECT_EQ(back->events[e].type, events[e].type) << i;
          EXPECT_EQ(back->events[e].keys.size(), events[e].keys.size()) << i;
          EXPECT_EQ(back->events[e].tokens.size(), events[e].tokens.size())
              << i;
        }
      }
    }
  }
  KvEvent gpu = Stored(CacheMedium::kCpu, 1, std::nullopt, 1);
  std::string bytes = EncodeKvEventBatch(1, {&gpu, 1});
  const size_t at = bytes.find("CPU");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 3, "GPU");
  StatusOr<DecodedKvEventBatch> gpu_batch = DecodeKvEventBatch(bytes);
  EXPECT_THAT(gpu_batch, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(gpu_batch.status().message(), testing::HasSubstr("GPU"));
  EXPECT_THAT(DecodeKvEventBatch("not msgpack \xc1"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeKvEventBatch(""), StatusIs(StatusCode::kInvalidArgument));
}

// One message as a subscriber receives it.
struct Received {
  std::string topic;
  int64_t seq = 0;
  std::string payload;
};

int64_t SeqOf(const zmq::message_t& frame) {
  EXPECT_EQ(frame.size(), 8u);
  int64_t seq = 0;
  const auto* b = static_cast<const unsigned char*>(frame.data());
  for (size_t i = 0; i < frame.size(); ++i) seq = (seq << 8) | b[i];
  return seq;
}

std::optional<Received> Receive(zmq::socket_t& socket, Clock::time_point end) {
  std::array<zmq::pollitem_t, 1> items{{{socket.handle(), 0, ZMQ_POLLIN, 0}}};
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
  if (left.count() <= 0 || zmq::poll(items.data(), 1, left) == 0) {
    return std::nullopt;
  }
  std::vector<zmq::message_t> frames;
  do {
    frames.emplace_back();
    (void)socket.recv(frames.back());
  } while (frames.back().more());
  if (frames.size() != 3) {
    ADD_FAILURE() << frames.size() << " frames";
    return std::nullopt;
  }
  return Received{frames[0].to_string(), SeqOf(frames[1]),
                  frames[2].to_string()};
}

// The event kinds of a batch, by tag.
std::vector<std::string> Tags(const std::string& payload) {
  msgpack::object_handle handle =
      msgpack::unpack(payload.data(), payload.size());
  std::vector<std::string> tags;
  for (const msgpack::object& e : Array(Array(handle.get()).at(1))) {
    tags.push_back(Str(Array(e).at(0)));
  }
  return tags;
}

class KvEventsPublisherTest : public ::testing::Test {
 protected:
  std::string Endpoint(const std::string& name) const {
    return "ipc://" + dir_.path() + "/" + name;
  }
  std::unique_ptr<KvEventPublisher> Start(size_t buffer_steps = 100) {
    StatusOr<std::unique_ptr<KvEventPublisher>> p =
        KvEventPublisher::Create({.endpoint = Endpoint("pub"),
                                  .replay_endpoint = Endpoint("replay"),
                                  .topic = "kv",
                                  .buffer_steps = buffer_steps,
                                  .clock = [] { return 42.0; },
                                  .first_sequence = 0});
    EXPECT_THAT(p, IsOk());
    return p.ok() ? std::move(p).value() : nullptr;
  }
  // Waits until `sub` gets messages: a SUB socket's subscription reaches
  // the publisher some time after it connects, and PUB drops until then.
  // Probes with AllBlocksCleared; returns the sequence number after them.
  // REQUIRES: a publisher whose first sequence number is 0.
  int64_t Join(KvEventPublisher& pub, zmq::socket_t& sub) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      pub.AllBlocksCleared();
      std::optional<Received> r =
          Receive(sub, Clock::now() + std::chrono::milliseconds(50));
      if (!r.has_value()) continue;
      int64_t last = r->seq;
      EXPECT_TRUE(pub.Flush(std::chrono::seconds(5)));
      // Every probe published so far is drained (sequences start at 0),
      // however slowly they arrive.
      const auto published =
          static_cast<int64_t>(pub.stats().batches_published);
      while (last + 1 < published &&
             (r = Receive(sub, Clock::now() + std::chrono::seconds(10)))) {
        last = r->seq;
      }
      EXPECT_EQ(last + 1, published);
      return last + 1;
    }
    ADD_FAILURE() << "the subscriber never received anything";
    return -1;
  }

  TempDir dir_{"kv_events_test"};
  zmq::context_t context_{1};
};

TEST_F(KvEventsPublisherTest, SubscriberGetsBatchesInSequence) {
  std::unique_ptr<KvEventPublisher> pub = Start();
  ASSERT_NE(pub, nullptr);
  zmq::socket_t sub(context_, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.connect(Endpoint("pub"));
  const int64_t first = Join(*pub, sub);
  ASSERT_GE(first, 1);

  const std::vector<TokenId> tokens = Tokens(0, 4);
  pub->BlockStored({.medium = CacheMedium::kCpu,
                    .key = Key(1),
                    .parent = std::nullopt,
                    .tokens = tokens,
                    .block_size = 4,
                    .lora_id = std::nullopt});
  ASSERT_TRUE(pub->Flush(std::chrono::seconds(5)));
  pub->BlockRemoved(CacheMedium::kCpu, Key(1));
  ASSERT_TRUE(pub->Flush(std::chrono::seconds(5)));

  const auto end = Clock::now() + std::chrono::seconds(10);
  std::optional<Received> a = Receive(sub, end);
  std::optional<Received> b = Receive(sub, end);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->topic, "kv");
  EXPECT_EQ(a->seq, first);
  EXPECT_EQ(b->seq, first + 1);
  EXPECT_THAT(Tags(a->payload), ElementsAre("BlockStored"));
  EXPECT_THAT(Tags(b->payload), ElementsAre("BlockRemoved"));
  const KvEventPublisherStats stats = pub->stats();
  EXPECT_EQ(stats.batches_published, static_cast<uint64_t>(first + 2));
  EXPECT_EQ(stats.events_dropped, 0u);
}

// An event that finds the queue full drops what is queued, and an
// AllBlocksCleared takes its place: a router forgets this node's blocks
// rather than keep one whose removal was lost (no router resyncs on a gap
// replay cannot fill).
TEST_F(KvEventsPublisherTest, AFullQueueTellsRoutersToForget) {
  // The publisher's clock, called as each batch is sent: held at `hold`
  // until released, so the queue fills behind a batch being sent.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool hold = false;
    bool held = false;  // The publisher is waiting at the gate.
  };
  auto gate = std::make_shared<Gate>();
  StatusOr<std::unique_ptr<KvEventPublisher>> created =
      KvEventPublisher::Create(
          {.endpoint = Endpoint("pub"),
           .topic = "kv",
           .max_queue_events = 2,
           .clock =
               [gate] {
                 std::unique_lock<std::mutex> lock(gate->mu);
                 gate->held = gate->hold;
                 gate->cv.notify_all();
                 gate->cv.wait(lock, [&] { return !gate->hold; });
                 gate->held = false;
                 return 42.0;
               },
           .first_sequence = 0});
  ASSERT_THAT(created, IsOk());
  KvEventPublisher& pub = **created;
  zmq::socket_t sub(context_, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv");
  sub.connect(Endpoint("pub"));
  const int64_t first = Join(pub, sub);
  ASSERT_GE(first, 1);

  {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->hold = true;
  }
  pub.BlockRemoved(CacheMedium::kCpu, Key(1));  // Taken, held at the gate.
  {
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->cv.wait(lock, [&] { return gate->held; });
  }
  // Join's probes may have been dropped already on a loaded machine.
  const uint64_t dropped_before = pub.stats().events_dropped;
  pub.BlockRemoved(CacheMedium::kCpu, Key(2));
  pub.BlockRemoved(CacheMedium::kCpu, Key(3));  // Queued: the queue is full.
  EXPECT_EQ(pub.stats().events_dropped, dropped_before);
  pub.BlockRemoved(CacheMedium::kCpu, Key(4));  // 2 and 3 go.
  EXPECT_EQ(pub.stats().events_dropped, dropped_before + 2);
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->hold = false;
  }
  gate->cv.notify_all();
  ASSERT_TRUE(pub.Flush(std::chrono::seconds(5)));

  const auto end = Clock::now() + std::chrono::seconds(10);
  std::optional<Received> held = Receive(sub, end);
  std::optional<Received> after = Receive(sub, end);
  ASSERT_TRUE(held.has_value() && after.has_value());
  EXPECT_GE(held->seq, first);
  EXPECT_THAT(Tags(held->payload), ElementsAre("BlockRemoved"));
  EXPECT_EQ(after->seq, held->seq + 1);
  StatusOr<DecodedKvEventBatch> decoded = DecodeKvEventBatch(after->payload);
  ASSERT_THAT(decoded, IsOk());
  ASSERT_EQ(decoded->events.size(), 2u);
  EXPECT_EQ(decoded->events[0].type, KvEvent::Type::kAllBlocksCleared);
  EXPECT_EQ(decoded->events[1].type, KvEvent::Type::kBlockRemoved);
  ASSERT_EQ(decoded->events[1].keys.size(), 1u);
  EXPECT_EQ(decoded->events[1].keys[0].lo, Key(4).lo);  // The int form.
}

// By default the first sequence number is the clock's microseconds, so a
// restarted publisher goes on above its last run's numbers: a router that
// drops numbers at or below the last it applied takes the new run's.
TEST_F(KvEventsPublisherTest, ARestartedPublisherNumbersAboveItsLastRun) {
  auto last_seq = [&](int run) -> int64_t {
    StatusOr<std::unique_ptr<KvEventPublisher>> pub =
        KvEventPublisher::Create({.endpoint = Endpoint("pub"),
                                  .replay_endpoint = Endpoint("replay"),
                                  .max_batch_keys = 1});
    EXPECT_THAT(pub, IsOk());
    if (!pub.ok()) return -1;
    for (int i = 0; i < 3; ++i) {
      (*pub)->BlockRemoved(CacheMedium::kCpu, Key(static_cast<uint64_t>(i)));
    }
    EXPECT_TRUE((*pub)->Flush(std::chrono::seconds(5)));
    zmq::socket_t replay(context_, zmq::socket_type::dealer);
    replay.connect(Endpoint("replay"));
    replay.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay.send(zmq::buffer(std::string(8, '\0')));  // From sequence 0.
    int64_t last = -1;
    const auto end = Clock::now() + std::chrono::seconds(10);
    for (int batches = 0;; ++batches) {
      std::optional<Received> r = Receive(replay, end);
      if (!r.has_value()) {
        ADD_FAILURE() << "run " << run << ": no end marker";
        return -1;
      }
      if (r->seq == -1) {
        EXPECT_EQ(batches, 3) << "run " << run;
        return last;
      }
      if (last >= 0) {
        EXPECT_EQ(r->seq, last + 1) << "run " << run;
      }
      last = r->seq;
    }
  };
  const int64_t before =
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  const int64_t first_run = last_seq(1);
  EXPECT_GE(first_run, before + 2);
  EXPECT_GT(last_seq(2), first_run);
}

// vLLM's first releases sent [ts, events]; later ones add the rank, which
// may be nil. A rank of another type is refused.
TEST(KvEventsEncoding, BatchesOfTwoOrThreeFieldsDecode) {
  const std::string three = EncodeKvEventBatch(1.0, {});
  StatusOr<DecodedKvEventBatch> decoded = DecodeKvEventBatch(three);
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->data_parallel_rank, 0);
  auto batch = [](auto&& last) {
    msgpack::sbuffer buffer;
    msgpack::packer<msgpack::sbuffer> pk(&buffer);
    pk.pack_array(last.has_value() ? 3 : 2);
    pk.pack_double(1.0);
    pk.pack_array(1);
    pk.pack_array(3);
    pk.pack(std::string("BlockRemoved"));
    pk.pack_array(1);
    pk.pack_uint64(9);
    pk.pack(std::string("STORAGE"));  // The disk tier's old name.
    if (last.has_value()) (*last)(pk);
    return std::string(buffer.data(), buffer.size());
  };
  using Pack = std::function<void(msgpack::packer<msgpack::sbuffer>&)>;
  decoded = DecodeKvEventBatch(batch(std::optional<Pack>()));
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->data_parallel_rank, std::nullopt);
  ASSERT_EQ(decoded->events.size(), 1u);
  EXPECT_EQ(decoded->events[0].medium, CacheMedium::kStorage);
  decoded = DecodeKvEventBatch(
      batch(std::optional<Pack>([](auto& pk) { pk.pack_nil(); })));
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->data_parallel_rank, std::nullopt);
  decoded = DecodeKvEventBatch(
      batch(std::optional<Pack>([](auto& pk) { pk.pack_int32(3); })));
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->data_parallel_rank, 3);
  EXPECT_THAT(DecodeKvEventBatch(batch(std::optional<Pack>(
                  [](auto& pk) { pk.pack(std::string("x")); }))),
              StatusIs(StatusCode::kInvalidArgument));
}

// A partial block (a chunk's last) is not merged into the run it ends:
// routers that derive a key per full block from the tokens (llm-d's) would
// refuse the whole run's event.
TEST(KvEventsEncoding, APartialBlockIsAnEventOfItsOwn) {
  std::vector<KvEvent> events;
  AppendKvEvent(Stored(CacheMedium::kCpu, 1, std::nullopt, 0), 100, &events);
  KvEvent partial = Stored(CacheMedium::kCpu, 2, 1, 4);
  partial.tokens.resize(3);
  AppendKvEvent(std::move(partial), 100, &events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].keys.size(), 1u);
  EXPECT_EQ(events[1].tokens.size(), 3u);
}

// A late subscriber asks the replay socket from a sequence number: the
// batches still in the ring from there on, then vLLM's end marker (-1).
TEST_F(KvEventsPublisherTest, ReplayServesTheRingFromTheAskedSequence) {
  std::unique_ptr<KvEventPublisher> pub = Start(/*buffer_steps=*/3);
  ASSERT_NE(pub, nullptr);
  for (uint64_t i = 0; i < 5; ++i) {
    pub->BlockRemoved(CacheMedium::kStorage, Key(i));
    ASSERT_TRUE(pub->Flush(std::chrono::seconds(5)));  // One batch each.
  }
  zmq::socket_t replay(context_, zmq::socket_type::dealer);
  replay.connect(Endpoint("replay"));
  auto ask = [&](int64_t start) {
    std::string seq(8, '\0');
    for (int i = 7; i >= 0; --i, start >>= 8) {
      seq[i] = static_cast<char>(start & 0xff);
    }
    replay.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay.send(zmq::buffer(seq));
    std::vector<int64_t> seqs;
    const auto end = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      std::optional<Received> r = Receive(replay, end);  // ["", seq, batch]
      if (!r.has_value()) {
        ADD_FAILURE() << "no end marker";
        return seqs;
      }
      EXPECT_EQ(r->topic, "");
      seqs.push_back(r->seq);
      if (r->seq == -1) {
        EXPECT_EQ(r->payload, "");
        return seqs;
      }
      EXPECT_THAT(Tags(r->payload), ElementsAre("BlockRemoved"));
    }
  };
  EXPECT_THAT(ask(0), ElementsAre(2, 3, 4, -1));  // 0 and 1 left the ring.
  EXPECT_THAT(ask(4), ElementsAre(4, -1));
  EXPECT_THAT(ask(9), ElementsAre(-1));
  EXPECT_EQ(pub->stats().replay_requests, 3u);
}

// The ring keeps at most buffer_bytes of batches: the newest, whole.
TEST_F(KvEventsPublisherTest, TheReplayRingIsBoundedInBytes) {
  StatusOr<std::unique_ptr<KvEventPublisher>> pub =
      KvEventPublisher::Create({.endpoint = Endpoint("pub"),
                                .replay_endpoint = Endpoint("replay"),
                                .buffer_steps = 100,
                                .buffer_bytes = 3 * 4096,
                                .max_batch_keys = 1,  // A batch per event.
                                .first_sequence = 0});
  ASSERT_THAT(pub, IsOk());
  // Ids past 65535 take 5 bytes each in msgpack: over 4 KB a batch.
  const std::vector<TokenId> tokens = Tokens(100000, 1000);
  for (uint64_t i = 0; i < 10; ++i) {
    (*pub)->BlockStored({.medium = CacheMedium::kCpu,
                         .key = Key(i),
                         .parent = std::nullopt,
                         .tokens = tokens,
                         .block_size = 1000,
                         .lora_id = std::nullopt});
    ASSERT_TRUE((*pub)->Flush(std::chrono::seconds(5)));
  }
  zmq::socket_t replay(context_, zmq::socket_type::dealer);
  replay.connect(Endpoint("replay"));
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(zmq::buffer(std::string(8, '\0')));
  std::vector<int64_t> seqs;
  const auto end = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::optional<Received> r = Receive(replay, end);
    ASSERT_TRUE(r.has_value());
    if (r->seq == -1) break;
    seqs.push_back(r->seq);
  }
  // Each batch is over 4 KB: two fit in 12 KB.
  EXPECT_THAT(seqs, ElementsAre(8, 9));
}

// A replay past ZeroMQ's default high-water mark (1000 messages) arrives
// whole: a late router catching up on a long history misses nothing.
TEST_F(KvEventsPublisherTest, ReplayOfALongHistoryArrivesWhole) {
  constexpr int kBatches = 2500;
  StatusOr<std::unique_ptr<KvEventPublisher>> pub =
      KvEventPublisher::Create({.endpoint = Endpoint("pub"),
                                .replay_endpoint = Endpoint("replay"),
                                .buffer_steps = kBatches,
                                .max_batch_keys = 1,  // A batch per event.
                                .first_sequence = 0});
  ASSERT_THAT(pub, IsOk());
  for (int i = 0; i < kBatches; ++i) {
    (*pub)->BlockRemoved(CacheMedium::kCpu, Key(static_cast<uint64_t>(i)));
  }
  ASSERT_TRUE((*pub)->Flush(std::chrono::seconds(10)));
  ASSERT_EQ((*pub)->stats().batches_published, static_cast<uint64_t>(kBatches));
  zmq::socket_t replay(context_, zmq::socket_type::dealer);
  replay.connect(Endpoint("replay"));
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay.send(zmq::buffer(std::string(8, '\0')));  // From sequence 0.
  int64_t expected = 0;
  const auto end = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    std::optional<Received> r = Receive(replay, end);
    ASSERT_TRUE(r.has_value()) << "stopped after " << expected;
    if (r->seq == -1) break;
    ASSERT_EQ(r->seq, expected);
    ++expected;
  }
  EXPECT_EQ(expected, kBatches);
}

TEST_F(KvEventsPublisherTest, RefusesAnEndpointZeroMqCannotTake) {
  StatusOr<std::unique_ptr<KvEventPublisher>> p =
      KvEventPublisher::Create({.endpoint = "nonsense://x"});
  EXPECT_THAT(p, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(p.status().message(), ::testing::HasSubstr("nonsense://x"));
}

}  // namespace
}  // namespace tierkv::daemon
