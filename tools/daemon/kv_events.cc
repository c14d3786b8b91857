// KV cache events in vLLM's wire format (tools/daemon/kv_events.h): the
// msgpack encoding of a KVEventBatch and the ZeroMQ publisher's thread.
// ZeroMQ's exceptions (cppzmq) stop at this file and become a Status or a
// logged error.
#include "tools/daemon/kv_events.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <limits>
#include <msgpack.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <zmq.hpp>

#include "src/mutex.h"

namespace tierkv::daemon {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

constexpr size_t kHashBytes = 16;

void PutBigEndian(uint64_t v, char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(Packer& pk, const BlockKey& key, KvEventHashFormat format) {
  if (format == KvEventHashFormat::kInt64) {
    pk.pack_uint64(key.lo);
    return;
  }
  const std::string hash = KvEventBlockHash(key);
  pk.pack_bin(static_cast<uint32_t>(hash.size()));
  pk.pack_bin_body(hash.data(), static_cast<uint32_t>(hash.size()));
}

void PackHashes(Packer& pk, std::span<const BlockKey> keys,
                KvEventHashFormat format) {
  pk.pack_array(static_cast<uint32_t>(keys.size()));
  for (const BlockKey& key : keys) PackHash(pk, key, format);
}

void PackEvent(Packer& pk, const KvEvent& e, KvEventHashFormat format) {
  switch (e.type) {
    case KvEvent::Type::kBlockStored:
      // Fields in BlockStored's order; lora_name (tierkv has LoRA ids, not
      // names) is null. Older subscribers, whose BlockStored ends at
      // medium, skip trailing fields they do not know.
      pk.pack_array(8);
      PackString(pk, "BlockStored");
      PackHashes(pk, e.keys, format);
      if (e.parent.has_value()) {
        PackHash(pk, *e.parent, format);
      } else {
        pk.pack_nil();
      }
      pk.pack_array(static_cast<uint32_t>(e.tokens.size()));
      for (TokenId t : e.tokens) pk.pack_uint32(static_cast<uint32_t>(t));
      pk.pack_int32(e.block_size);
      if (e.lora_id.has_value()) {
        pk.pack_uint64(*e.lora_id);
      } else {
        pk.pack_nil();
      }
      PackString(pk, CacheMediumName(e.medium));
      pk.pack_nil();
      return;
    case KvEvent::Type::kBlockRemoved:
      pk.pack_array(3);
      PackString(pk, "BlockRemoved");
      PackHashes(pk, e.keys, format);
      PackString(pk, CacheMediumName(e.medium));
      return;
    case KvEvent::Type::kAllBlocksCleared:
      pk.pack_array(1);
      PackString(pk, "AllBlocksCleared");
      return;
  }
}

bool Continues(const KvEvent& last, const KvEvent& next, size_t max_keys) {
  if (last.type != next.type || last.keys.size() >= max_keys) return false;
  switch (next.type) {
    case KvEvent::Type::kBlockStored:
      return last.medium == next.medium && last.lora_id == next.lora_id &&
             last.block_size == next.block_size && next.keys.size() == 1 &&
             next.parent.has_value() && *next.parent == last.keys.back() &&
             last.tokens.size() ==
                 last.keys.size() * static_cast<size_t>(last.block_size) &&
             next.tokens.size() == static_cast<size_t>(next.block_size);
    case KvEvent::Type::kBlockRemoved:
      return last.medium == next.medium;
    case KvEvent::Type::kAllBlocksCleared:
      return true;  // A second clear adds nothing.
  }
  return false;
}

KvEvent AllClearedEvent() {
  return {.type = KvEvent::Type::kAllBlocksCleared,
          .medium = CacheMedium::kCpu,
          .keys = {},
          .parent = std::nullopt,
          .tokens = {},
          .block_size = 0,
          .lora_id = std::nullopt};
}

// 8 bytes, big-endian: how vLLM frames a sequence number.
std::string SequenceFrame(int64_t seq) {
  std::string out(8, '\0');
  PutBigEndian(static_cast<uint64_t>(seq), out.data());
  return out;
}

double SystemSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Gives the socket file of an ipc:// `endpoint` bound by `option` (a
// flag's name, for the error) to `group`; nothing for other transports.
Status GiveIpcSocketTo(const std::optional<gid_t>& group,
                       std::string_view option, std::string_view endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  if (!group.has_value() || !endpoint.starts_with(kIpc)) return Status::Ok();
  const std::string path(endpoint.substr(kIpc.size()));
  // Not through a link someone put in the socket's place.
  if (lchown(path.c_str(), static_cast<uid_t>(-1), *group) == 0) {
    return Status::Ok();
  }
  const int err = errno;
  std::string message = std::string(option) + " " + std::string(endpoint) +
                        ": cannot give the socket to group " +
                        std::to_string(*group) +
                        " (--kv-events-group): " + std::strerror(err);
  if (err == EPERM || err == EACCES) {
    return Status::PermissionDenied(std::move(message));
  }
  return Status::Unavailable(std::move(message));
}

// vLLM's rule: bind an address with a wildcard, or ipc / inproc; connect to
// any other.
bool ShouldBind(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

}  // namespace

std::string KvEventBlockHash(const BlockKey& key) {
  std::string out(kHashBytes, '\0');
  PutBigEndian(key.hi, out.data());
  PutBigEndian(key.lo, out.data() + 8);
  return out;
}

const char* KvEventHashFormatName(KvEventHashFormat format) {
  return format == KvEventHashFormat::kInt64 ? "int" : "bytes";
}

StatusOr<KvEventHashFormat> ParseKvEventHashFormat(std::string_view name) {
  if (name == "int") return KvEventHashFormat::kInt64;
  if (name == "bytes") return KvEventHashFormat::kBytes;
  return Status::InvalidArgument("'" + std::string(name) +
                                 "': expected int or bytes");
}

std::string EncodeKvEventBatch(double ts, std::span<const KvEvent> events,
                               KvEventHashFormat hashes) {
  msgpack::sbuffer buffer;
  Packer pk(&buffer);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackEvent(pk, e, hashes);
  pk.pack_int32(0);  // data_parallel_rank.
  return {buffer.data(), buffer.size()};
}

namespace {

// Reads msgpack objects of a batch; each getter fails with what it expected.
class BatchReader {
 public:
  Status error;

  bool ok() const { return error.ok(); }
  std::span<const msgpack::object> Array(const msgpack::object& o,
                                         const char* what) {
    if (o.type != msgpack::type::ARRAY) return Fail(what, "an array"), Empty();
    return {o.via.array.ptr, o.via.array.size};
  }
  std::string_view String(const msgpack::object& o, const char* what) {
    if (o.type != msgpack::type::STR) return Fail(what, "a string"), "";
    return {o.via.str.ptr, o.via.str.size};
  }
  std::optional<uint64_t> Unsigned(const msgpack::object& o, const char* what) {
    if (o.type == msgpack::type::NIL) return std::nullopt;
    if (o.type != msgpack::type::POSITIVE_INTEGER) {
      return Fail(what, "a non-negative integer or nil"), std::nullopt;
    }
    return o.via.u64;
  }
  BlockKey Hash(const msgpack::object& o) {
    if (o.type == msgpack::type::POSITIVE_INTEGER) {
      return BlockKey{.lo = o.via.u64, .hi = 0};
    }
    if (o.type != msgpack::type::BIN || o.via.bin.size != kHashBytes) {
      return Fail("block hash", "an unsigned integer or 16 bytes"), BlockKey{};
    }
    const auto* b = reinterpret_cast<const unsigned char*>(o.via.bin.ptr);
    auto word = [b](int at) {
      uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v = (v << 8) | b[at + i];
      return v;
    };
    return BlockKey{.lo = word(8), .hi = word(0)};
  }
  std::vector<BlockKey> Hashes(const msgpack::object& o) {
    std::vector<BlockKey> keys;
    for (const msgpack::object& h : Array(o, "block_hashes")) {
      keys.push_back(Hash(h));
    }
    return keys;
  }
  CacheMedium Medium(const msgpack::object& o) {
    const std::string_view name = String(o, "medium");
    for (CacheMedium m :
         {CacheMedium::kCpu, CacheMedium::kStorage, CacheMedium::kRemote}) {
      if (name == CacheMediumName(m)) return m;
    }
    if (name == "STORAGE") return CacheMedium::kStorage;  // The old name.
    if (ok()) {
      error =
          Status::InvalidArgument("KV event batch: medium \"" +
                                  std::string(name) + "\" is none of tierkv's");
    }
    return CacheMedium::kCpu;
  }

 private:
  static std::span<const msgpack::object> Empty() { return {}; }
  void Fail(const char* what, const char* expected) {
    if (ok()) {
      error = Status::InvalidArgument(std::string("KV event batch: ") + what +
                                      " is not " + expected);
    }
  }
};

std::optional<KvEvent> DecodeEvent(BatchReader& r, const msgpack::object& o) {
  const std::span<const msgpack::object> f = r.Array(o, "event");
  if (!r.ok()) return std::nullopt;
  if (f.empty()) {
    r.error = Status::InvalidArgument("KV event batch: an empty event");
    return std::nullopt;
  }
  const std::string_view tag = r.String(f[0], "event tag");
  KvEvent e;
  if (tag == "BlockStored" && f.size() >= 7) {
    e.type = KvEvent::Type::kBlockStored;
    e.keys = r.Hashes(f[1]);
    if (f[2].type != msgpack::type::NIL) e.parent = r.Hash(f[2]);
    for (const msgpack::object& t : r.Array(f[3], "token_ids")) {
      const std::optional<uint64_t> v = r.Unsigned(t, "token id");
      if (!v.has_value() || *v > std::numeric_limits<TokenId>::max()) {
        if (r.ok()) {
          r.error = Status::InvalidArgument("KV event batch: a bad token id");
        }
        return std::nullopt;
      }
      e.tokens.push_back(static_cast<TokenId>(*v));
    }
    const std::optional<uint64_t> block_size = r.Unsigned(f[4], "block_size");
    if (!block_size.has_value() || *block_size == 0 ||
        *block_size > uint64_t{INT32_MAX}) {
      if (r.ok()) {
        r.error = Status::InvalidArgument("KV event batch: a bad block_size");
      }
      return std::nullopt;
    }
    e.block_size = static_cast<int32_t>(*block_size);
    e.lora_id = r.Unsigned(f[5], "lora_id");
    e.medium = r.Medium(f[6]);
  } else if (tag == "BlockRemoved" && f.size() >= 3) {
    e.type = KvEvent::Type::kBlockRemoved;
    e.keys = r.Hashes(f[1]);
    e.medium = r.Medium(f[2]);
  } else if (tag == "AllBlocksCleared") {
    e.type = KvEvent::Type::kAllBlocksCleared;
  } else if (r.ok()) {
    r.error = Status::InvalidArgument("KV event batch: an event \"" +
                                      std::string(tag) + "\" of " +
                                      std::to_string(f.size()) + " fields");
  }
  if (!r.ok()) return std::nullopt;
  return e;
}

}  // namespace

StatusOr<DecodedKvEventBatch> DecodeKvEventBatch(std::string_view bytes) {
  msgpack::object_handle handle;
  size_t used = 0;
  // No container can hold more elements than the batch has bytes, nor nest
  // deeper than a BlockStored's hashes: a forged length fails here, before
  // anything is allocated for it.
  const msgpack::unpack_limit limit(/*array=*/bytes.size(), /*map=*/0,
                                    /*str=*/bytes.size(), /*bin=*/bytes.size(),
                                    /*ext=*/0, /*depth=*/4);
  try {
    handle = msgpack::unpack(bytes.data(), bytes.size(), used, nullptr, nullptr,
                             limit);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(
        std::string("KV event batch: not msgpack: ") + e.what());
  }
  if (used != bytes.size()) {
    return Status::InvalidArgument(
        "KV event batch: " + std::to_string(bytes.size() - used) +
        " bytes after the batch");
  }
  BatchReader r;
  const std::span<const msgpack::object> batch =
      r.Array(handle.get(), "the batch");
  if (!r.ok()) return r.error;
  if (batch.size() < 2 || batch.size() > 3) {
    return Status::InvalidArgument(
        "KV event batch: " + std::to_string(batch.size()) +
        " fields, not 2 or 3");
  }
  DecodedKvEventBatch out;
  if (batch[0].type == msgpack::type::FLOAT64 ||
      batch[0].type == msgpack::type::FLOAT32) {
    out.ts = batch[0].via.f64;
  } else if (batch[0].type == msgpack::type::POSITIVE_INTEGER) {
    out.ts = static_cast<double>(batch[0].via.u64);
  } else {
    return Status::InvalidArgument("KV event batch: ts is not a number");
  }
  for (const msgpack::object& o : r.Array(batch[1], "events")) {
    std::optional<KvEvent> e = DecodeEvent(r, o);
    if (!e.has_value()) return r.error;
    out.events.push_back(std::move(*e));
  }
  if (!r.ok()) return r.error;
  if (batch.size() == 3) {
    const msgpack::object& rank = batch[2];
    if (rank.type == msgpack::type::POSITIVE_INTEGER &&
        rank.via.u64 <= uint64_t{INT64_MAX}) {
      out.data_parallel_rank = static_cast<int64_t>(rank.via.u64);
    } else if (rank.type == msgpack::type::NEGATIVE_INTEGER) {
      out.data_parallel_rank = rank.via.i64;
    } else if (rank.type != msgpack::type::NIL) {
      return Status::InvalidArgument(
          "KV event batch: data_parallel_rank is not an integer or nil");
    }
  }
  return out;
}

void AppendKvEvent(KvEvent event, size_t max_keys,
                   std::vector<KvEvent>* events) {
  if (!events->empty() && Continues(events->back(), event, max_keys)) {
    KvEvent& last = events->back();
    last.keys.insert(last.keys.end(), event.keys.begin(), event.keys.end());
    last.tokens.insert(last.tokens.end(), event.tokens.begin(),
                       event.tokens.end());
    return;
  }
  events->push_back(std::move(event));
}

std::string FormatKvEventMetrics(const KvEventPublisherStats& stats,
                                 std::string_view labels) {
  std::string out;
  auto counter = [&](std::string_view name, std::string_view help,
                     uint64_t value) {
    out += "# HELP tierkv_kv_events_" + std::string(name) + " " +
           std::string(help) + "\n# TYPE tierkv_kv_events_" +
           std::string(name) + " counter\ntierkv_kv_events_" +
           std::string(name) + "{" + std::string(labels) + "} " +
           std::to_string(value) + "\n";
  };
  counter("queued_total", "KV cache events queued for publishing.",
          stats.events_queued);
  counter("dropped_total",
          "KV cache events dropped: the publisher's queue was full (routers "
          "were told to forget this store's blocks).",
          stats.events_dropped);
  counter("batches_total", "KV cache event batches published.",
          stats.batches_published);
  counter("replay_requests_total", "Replay requests answered.",
          stats.replay_requests);
  return out;
}

struct KvEventPublisher::Impl {
  KvEventPublisherOptions options;
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;

  mutable Mutex mu;
  CondVar wake;  // Events queued, or stopping.
  CondVar published;
  std::vector<KvEvent> pending TIERKV_GUARDED_BY(mu);
  size_t pending_keys TIERKV_GUARDED_BY(mu) = 0;
  size_t pending_events TIERKV_GUARDED_BY(mu) = 0;  // Before merging.
  uint64_t submitted TIERKV_GUARDED_BY(mu) = 0;     // Events accepted.
  uint64_t done TIERKV_GUARDED_BY(mu) = 0;          // Of them, published.
  bool stopping TIERKV_GUARDED_BY(mu) = false;
  KvEventPublisherStats stats TIERKV_GUARDED_BY(mu);

  // The thread's own.
  int64_t next_seq = 0;
  std::deque<std::pair<int64_t, std::string>> ring;
  size_t ring_bytes = 0;
  uint64_t dropped_logged = 0;
  std::chrono::steady_clock::time_point last_drop_log{};
  std::thread thread;

  void Submit(KvEvent event) TIERKV_EXCLUDES(mu);
  void Run() TIERKV_EXCLUDES(mu);
  void Publish(std::span<const KvEvent> events);
  void SendBatch(std::span<const KvEvent> events);
  void ServeReplay();
  void LogDrops(uint64_t dropped);
};

void KvEventPublisher::Impl::Submit(KvEvent event) {
  const size_t keys = std::max<size_t>(1, event.keys.size());
  MutexLock lock(&mu);
  const bool was_empty = pending.empty();
  if (pending_keys + keys > options.max_queue_events) {
    // Full: what is queued goes, and routers are told to forget this
    // node's blocks (max_queue_events).
    stats.events_dropped += pending_events;
    pending.clear();
    pending.push_back(AllClearedEvent());
    pending_keys = 1;
    pending_events = 1;
    ++submitted;
    ++stats.events_queued;
    if (pending_keys + keys > options.max_queue_events) {
      ++stats.events_dropped;
      if (was_empty) wake.NotifyOne();
      return;
    }
  }
  pending_keys += keys;
  ++pending_events;
  ++submitted;
  ++stats.events_queued;
  AppendKvEvent(std::move(event), options.max_batch_keys, &pending);
  // One wakeup per batch, not per event: the owner's lock is held here.
  if (was_empty) wake.NotifyOne();
}

void KvEventPublisher::Impl::Run() {
  // With a replay socket the thread polls it between batches; without one
  // it sleeps until woken.
  constexpr auto kPoll = std::chrono::milliseconds(5);
  for (;;) {
    std::vector<KvEvent> taken;
    uint64_t taken_up_to = 0;
    uint64_t dropped = 0;
    bool stop = false;
    {
      MutexLock lock(&mu);
      if (pending.empty() && !stopping) {
        const auto wait = replay.has_value() ? kPoll : kPoll * 20;
        wake.WaitUntil(&mu, std::chrono::steady_clock::now() + wait);
      }
      taken.swap(pending);
      pending_keys = 0;
      pending_events = 0;
      taken_up_to = submitted;
      dropped = stats.events_dropped;
      stop = stopping;
    }
    if (!taken.empty()) Publish(taken);
    {
      MutexLock lock(&mu);
      done = taken_up_to;
    }
    published.NotifyAll();
    LogDrops(dropped);
    if (replay.has_value()) ServeReplay();
    if (stop) {
      MutexLock lock(&mu);
      if (pending.empty()) return;
    }
  }
}

void KvEventPublisher::Impl::Publish(std::span<const KvEvent> events) {
  size_t begin = 0;
  size_t keys = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    keys += events[i].keys.size();
    if (keys >= options.max_batch_keys || i + 1 == events.size()) {
      SendBatch(events.subspan(begin, i + 1 - begin));
      begin = i + 1;
      keys = 0;
    }
  }
}

void KvEventPublisher::Impl::SendBatch(std::span<const KvEvent> events) {
  const double ts = options.clock ? options.clock() : SystemSeconds();
  std::string payload = EncodeKvEventBatch(ts, events, options.hash_format);
  const int64_t seq = next_seq++;
  const std::string seq_frame = SequenceFrame(seq);
  try {
    // PUB never blocks: past the high-water mark ZeroMQ drops for that
    // subscriber, which replay then repairs.
    pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    spdlog::error("kv events: publishing batch {} failed: {}", seq, e.what());
  }
  {
    MutexLock lock(&mu);
    ++stats.batches_published;
  }
  if (!replay.has_value() || options.buffer_steps == 0) return;
  ring_bytes += payload.size();
  ring.emplace_back(seq, std::move(payload));
  while (ring.size() > options.buffer_steps ||
         (ring.size() > 1 && ring_bytes > options.buffer_bytes)) {
    ring_bytes -= ring.front().second.size();
    ring.pop_front();
  }
}

void KvEventPublisher::Impl::ServeReplay() {
  // A few requests a turn, so that a client that keeps asking cannot keep
  // the thread from publishing (each answer is the whole ring).
  constexpr int kRequestsPerTurn = 4;
  try {
    for (int served = 0; served < kRequestsPerTurn; ++served) {
      std::array<zmq::pollitem_t, 1> items{
          {{static_cast<void*>(*replay), 0, ZMQ_POLLIN, 0}}};
      if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(0)) ==
          0) {
        return;
      }
      // [identity, "", start sequence (8 bytes, big-endian)], as a DEALER
      // socket sends it.
      std::vector<zmq::message_t> frames;
      do {
        frames.emplace_back();
        (void)replay->recv(frames.back(), zmq::recv_flags::none);
      } while (frames.back().more());
      if (frames.size() != 3 || frames[2].size() != 8) {
        spdlog::warn("kv events: malformed replay request of {} frames",
                     frames.size());
        continue;
      }
      int64_t start = 0;
      const auto* b = static_cast<const unsigned char*>(frames[2].data());
      for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
      {
        MutexLock lock(&mu);
        ++stats.replay_requests;
      }
      const std::string identity = frames[0].to_string();
      auto send = [&](std::string_view seq, std::string_view payload) {
        replay->send(zmq::buffer(identity), zmq::send_flags::sndmore);
        replay->send(zmq::message_t(), zmq::send_flags::sndmore);
        replay->send(zmq::buffer(seq), zmq::send_flags::sndmore);
        replay->send(zmq::buffer(payload), zmq::send_flags::none);
      };
      for (const auto& [seq, payload] : ring) {
        if (seq >= start) send(SequenceFrame(seq), payload);
      }
      send(SequenceFrame(-1), "");  // vLLM's end marker.
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("kv events: replay failed: {}", e.what());
  }
}

void KvEventPublisher::Impl::LogDrops(uint64_t dropped) {
  if (dropped == dropped_logged) return;
  const auto now = std::chrono::steady_clock::now();
  if (dropped_logged != 0 && now - last_drop_log < std::chrono::seconds(1)) {
    return;
  }
  spdlog::warn(
      "kv events: queue full ({} keys): {} events dropped so far; routers "
      "following this store were told to forget its blocks "
      "(AllBlocksCleared)",
      options.max_queue_events, dropped);
  dropped_logged = dropped;
  last_drop_log = now;
}

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    KvEventPublisherOptions options) {
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<KvEventPublisher> publisher,
                          CreateUnstarted(std::move(options)));
  TIERKV_RETURN_IF_ERROR(publisher->Start());
  return publisher;
}

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::CreateUnstarted(
    KvEventPublisherOptions options) {
  if (options.endpoint.empty()) {
    return Status::InvalidArgument("kv events: no endpoint to publish on");
  }
  if (options.max_queue_events < 1 || options.max_batch_keys < 1) {
    return Status::InvalidArgument(
        "kv events: the queue and a batch must hold at least one event");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  return std::unique_ptr<KvEventPublisher>(
      new KvEventPublisher(std::move(impl)));
}

Status KvEventPublisher::Start() {
  Impl* impl = impl_.get();
  if (impl->thread.joinable()) {
    return Status::FailedPrecondition("kv events: started already");
  }
  const std::string& endpoint = impl->options.endpoint;
  try {
    impl->pub.set(zmq::sockopt::sndhwm, impl->options.hwm);
    impl->pub.set(zmq::sockopt::linger, 1000);
    if (ShouldBind(endpoint)) {
      impl->pub.bind(endpoint);
    } else {
      impl->pub.connect(endpoint);
    }
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("--kv-events-endpoint " + endpoint + ": " +
                                   e.what());
  }
  TIERKV_RETURN_IF_ERROR(GiveIpcSocketTo(impl->options.ipc_group,
                                         "--kv-events-endpoint", endpoint));
  const std::string& replay = impl->options.replay_endpoint;
  if (!replay.empty()) {
    try {
      impl->replay.emplace(impl->context, zmq::socket_type::router);
      impl->replay->set(zmq::sockopt::linger, 0);
      // One request is answered with up to buffer_steps + 1 messages;
      // ZeroMQ's default high-water mark (1000) would drop the rest. Room
      // for two whole answers a peer: a client that asks and never reads
      // holds at most that much of tierkvd's memory (the ROUTER socket
      // drops what does not fit; its answer lacks the end marker).
      const int answer = static_cast<int>(std::min<size_t>(
          impl->options.buffer_steps + 1, std::numeric_limits<int>::max() / 2));
      impl->replay->set(zmq::sockopt::sndhwm, 2 * answer);
      impl->replay->bind(replay);
    } catch (const zmq::error_t& e) {
      impl->replay.reset();
      return Status::InvalidArgument("--kv-events-replay-endpoint " + replay +
                                     ": " + e.what());
    }
    TIERKV_RETURN_IF_ERROR(GiveIpcSocketTo(
        impl->options.ipc_group, "--kv-events-replay-endpoint", replay));
  }
  impl->next_seq = impl->options.first_sequence.value_or(
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  impl->thread = std::thread([impl] { impl->Run(); });
  return Status::Ok();
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.NotifyAll();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void KvEventPublisher::BlockStored(const StoredBlockEvent& block) {
  impl_->Submit({.type = KvEvent::Type::kBlockStored,
                 .medium = block.medium,
                 .keys = {block.key},
                 .parent = block.parent,
                 .tokens = {block.tokens.begin(), block.tokens.end()},
                 .block_size = block.block_size,
                 .lora_id = block.lora_id});
}

void KvEventPublisher::BlockRemoved(CacheMedium medium, const BlockKey& key) {
  impl_->Submit({.type = KvEvent::Type::kBlockRemoved,
                 .medium = medium,
                 .keys = {key},
                 .parent = std::nullopt,
                 .tokens = {},
                 .block_size = 0,
                 .lora_id = std::nullopt});
}

void KvEventPublisher::AllBlocksCleared() { impl_->Submit(AllClearedEvent()); }

KvEventPublisherStats KvEventPublisher::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

bool KvEventPublisher::Flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&impl_->mu);
  const uint64_t target = impl_->submitted;
  while (impl_->done < target) {
    if (!impl_->published.WaitUntil(&impl_->mu, deadline) &&
        impl_->done < target) {
      return false;
    }
  }
  return true;
}

}  // namespace tierkv::daemon
