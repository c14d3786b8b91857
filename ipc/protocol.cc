#include "ipc/protocol.h"

#include <bit>
#include <cstring>
#include <type_traits>

namespace tierkv::ipc {
namespace {

// Little-endian writer over a byte vector.
class Writer {
 public:
  explicit Writer(std::vector<std::byte>* out) : out_(out) {}

  template <typename T>
  void Int(T v) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    auto u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_->push_back(static_cast<std::byte>(u & 0xFF));
      if constexpr (sizeof(T) > 1) u >>= 8;
    }
  }
  void Bool(bool v) { Int<uint8_t>(v ? 1 : 0); }
  void String(const std::string& s) {
    Int<uint32_t>(static_cast<uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_->insert(out_->end(), p, p + s.size());
  }
  template <typename T>
  void Ints(const std::vector<T>& v) {
    Int<uint32_t>(static_cast<uint32_t>(v.size()));
    if constexpr (std::endian::native == std::endian::little) {
      // The wire format is little-endian: the array is its own encoding.
      const size_t at = out_->size();
      out_->resize(at + v.size() * sizeof(T));
      if (!v.empty())
        std::memcpy(out_->data() + at, v.data(), v.size() * sizeof(T));
    } else {
      for (T x : v) Int<T>(x);
    }
  }

 private:
  std::vector<std::byte>* out_;
};

// Bounds-checked little-endian reader. After the first failure every read
// fails, so a decoder checks ok() once at the end.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  T Int() {
    static_assert(std::is_integral_v<T>);
    if (!Need(sizeof(T))) return T{};
    std::make_unsigned_t<T> u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      u |= static_cast<std::make_unsigned_t<T>>(
               static_cast<uint8_t>(in_[pos_ + i]))
           << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  bool Bool() {
    const auto v = Int<uint8_t>();
    if (v > 1) Fail("boolean out of range");
    return v == 1;
  }
  std::string String() {
    const auto n = Int<uint32_t>();
    if (n > kMaxString) {
      Fail("string of " + std::to_string(n) + " bytes");
      return {};
    }
    if (!Need(n)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> Ints(uint32_t max_count, const char* what) {
    const auto n = Int<uint32_t>();
    if (n > max_count) {
      Fail(std::string(what) + " count " + std::to_string(n) + " exceeds " +
           std::to_string(max_count));
      return {};
    }
    if (!Need(static_cast<size_t>(n) * sizeof(T))) return {};
    std::vector<T> v(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n > 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
      pos_ += n * sizeof(T);
    } else {
      for (auto& x : v) x = Int<T>();
    }
    return v;
  }
  uint32_t Count(uint32_t max_count, const char* what) {
    const auto n = Int<uint32_t>();
    if (n > max_count) {
      Fail(std::string(what) + " count " + std::to_string(n) + " exceeds " +
           std::to_string(max_count));
      return 0;
    }
    return n;
  }
  void Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    pos_ = in_.size();
  }
  bool ok() const { return error_.empty(); }
  bool at_end() const { return pos_ == in_.size(); }
  const std::string& error() const { return error_; }
  size_t pos() const { return pos_; }

 private:
  bool Need(size_t n) {
    if (!error_.empty()) return false;
    if (in_.size() - pos_ < n) {
      Fail("truncated at byte " + std::to_string(pos_));
      return false;
    }
    return true;
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- Shared pieces -------------------------------------------------------

void Put(Writer& w, const KvLayout& l) {
  w.Int<int32_t>(l.num_layers);
  w.Int<int32_t>(l.num_kv_heads);
  w.Int<int32_t>(l.head_dim);
  w.Int<int32_t>(l.block_size);
  w.Int<uint8_t>(static_cast<uint8_t>(l.dtype));
}
void Get(Reader& r, KvLayout* l) {
  l->num_layers = r.Int<int32_t>();
  l->num_kv_heads = r.Int<int32_t>();
  l->head_dim = r.Int<int32_t>();
  l->block_size = r.Int<int32_t>();
  const auto dtype = r.Int<uint8_t>();
  if (dtype > static_cast<uint8_t>(DType::kBF16)) r.Fail("unknown dtype");
  l->dtype = static_cast<DType>(dtype);
}

void Put(Writer& w, const TransferEvent& e) {
  w.Int<uint8_t>(static_cast<uint8_t>(e.ref.kind));
  w.Int<uint64_t>(e.ref.id);
  w.Int<uint64_t>(e.request);
  w.Ints(e.device_blocks);
  w.Ints(e.host_blocks);
  w.Int<int32_t>(e.failed_blocks);
}
EventKind GetKind(Reader& r) {
  const auto kind = r.Int<uint8_t>();
  if (kind != static_cast<uint8_t>(EventKind::kLoad) &&
      kind != static_cast<uint8_t>(EventKind::kStore)) {
    r.Fail("unknown event kind " + std::to_string(kind));
  }
  return static_cast<EventKind>(kind);
}
void Get(Reader& r, TransferEvent* e) {
  e->ref.kind = GetKind(r);
  e->ref.id = r.Int<uint64_t>();
  e->request = r.Int<uint64_t>();
  e->device_blocks = r.Ints<BlockId>(kMaxBlocks, "device block");
  e->host_blocks = r.Ints<BlockId>(kMaxBlocks, "host block");
  if (e->device_blocks.size() != e->host_blocks.size()) {
    r.Fail("event with unequal block lists");
  }
  e->failed_blocks = r.Int<int32_t>();
  if (e->failed_blocks < 0 ||
      static_cast<uint32_t>(e->failed_blocks) > kMaxBlocks) {
    r.Fail("failed block count " + std::to_string(e->failed_blocks));
  }
}

void Put(Writer& w, const EventLatency& l) {
  for (uint64_t b : l.buckets) w.Int<uint64_t>(b);
  w.Int<uint64_t>(l.count);
  w.Int<uint64_t>(l.sum_us);
}
void Get(Reader& r, EventLatency* l) {
  uint64_t total = 0;
  for (uint64_t& b : l->buckets) {
    b = r.Int<uint64_t>();
    total += b;
  }
  l->count = r.Int<uint64_t>();
  l->sum_us = r.Int<uint64_t>();
  if (total != l->count) r.Fail("latency buckets do not add up to the count");
}

void Put(Writer& w, const Status& s) {
  w.Int<uint8_t>(static_cast<uint8_t>(s.code()));
  w.String(s.message().substr(0, kMaxString));
}
Status GetStatus(Reader& r) {
  const auto code = r.Int<uint8_t>();
  std::string message = r.String();
  if (code > static_cast<uint8_t>(StatusCode::kDeadlineExceeded)) {
    r.Fail("unknown status code");
    return Status::Internal("bad status");
  }
  if (code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(code), std::move(message));
}

// ---- Per message ---------------------------------------------------------

void PutPayload(Writer& w, const ErrorReply& m) { Put(w, m.status); }
void PutPayload(Writer&, const OkReply&) {}
void PutPayload(Writer& w, const RegisterRequest& m) {
  const WorkerRegistration& reg = m.registration;
  Put(w, reg.layout);
  w.String(reg.model);
  w.Int<int32_t>(reg.num_device_blocks);
  w.String(reg.tenant);
  w.Int<int32_t>(reg.pid);
  w.String(reg.name);
}
void PutPayload(Writer& w, const RegisterReply& m) {
  w.Int<uint32_t>(m.worker_id);
  w.String(m.host_segment);
  w.Int<int32_t>(m.host_slots);
  w.Int<uint64_t>(m.slot_bytes);
  w.String(m.control_segment);
  w.String(m.store_fingerprint);
}
void PutPayload(Writer& w, const LookupRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Int<int32_t>(m.num_computed_tokens);
  w.Ints(m.tokens);
  w.Bool(m.extras.lora_id.has_value());
  w.Int<uint64_t>(m.extras.lora_id.value_or(0));
  w.Int<uint32_t>(static_cast<uint32_t>(m.extras.mm_items.size()));
  for (const MultiModalItem& item : m.extras.mm_items) {
    w.Int<uint64_t>(item.hash.lo);
    w.Int<uint64_t>(item.hash.hi);
    w.Int<int64_t>(item.start);
    w.Int<int64_t>(item.length);
  }
  w.String(m.extras.cache_salt);
}
void PutPayload(Writer& w, const LookupChunkRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Ints(m.tokens);
}
void PutPayload(Writer& w, const LookupReply& m) {
  w.Int<int32_t>(m.result.hit_tokens);
  w.Int<int32_t>(m.result.disk_hit_tokens);
}
void PutPayload(Writer& w, const AllocateRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Int<int32_t>(m.num_external_tokens);
  w.Ints(m.device_blocks);
}
void PutPayload(Writer& w, const AllocateReply& m) {
  w.Bool(m.result.load.has_value());
  if (m.result.load.has_value()) Put(w, *m.result.load);
  w.Bool(m.result.load_pending);
  Put(w, m.result.store_status);
}
void PutPayload(Writer& w, const CommitRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Int<int32_t>(m.num_computed_tokens);
  w.Ints(m.device_blocks);
}
void PutPayload(Writer& w, const CommitReply& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.result.stores.size()));
  for (const TransferEvent& e : m.result.stores) Put(w, e);
  w.Int<int32_t>(m.result.skipped_blocks);
}
void PutPayload(Writer& w, const CompleteRequest& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.events.size()));
  for (const CompletedEvent& e : m.events) {
    w.Int<uint8_t>(static_cast<uint8_t>(e.ref.kind));
    w.Int<uint64_t>(e.ref.id);
    w.Bool(e.ok);
  }
}
void PutPayload(Writer& w, const FinishRequest& m) {
  w.Int<uint64_t>(m.request);
}
void PutPayload(Writer&, const StatsRequest&) {}
void PutPayload(Writer& w, const StatsReply& m) {
  const HostTierStats& h = m.stats.host;
  for (int64_t v : {h.capacity_slots, h.free_slots, h.used_slots,
                    h.cached_slots, h.pinned_slots}) {
    w.Int<int64_t>(v);
  }
  for (uint64_t v : {h.slot_bytes,
                     h.lookups,
                     h.lookup_blocks,
                     h.hit_blocks,
                     h.miss_blocks,
                     h.evictions,
                     h.stores_completed,
                     h.loads_completed,
                     h.stores_failed,
                     h.store_skipped,
                     h.events_in_flight,
                     h.disk_hit_blocks,
                     h.spills,
                     h.spill_drops,
                     h.spill_failures,
                     h.promotions,
                     h.promotion_failures,
                     h.spills_in_flight,
                     h.promotions_in_flight,
                     h.loads_cancelled}) {
    w.Int<uint64_t>(v);
  }
  w.Bool(m.stats.disk.has_value());
  if (m.stats.disk.has_value()) {
    const DiskTierStats& d = *m.stats.disk;
    for (uint64_t v :
         {d.capacity_bytes, d.bytes, d.keys, d.puts, d.put_failures, d.gets,
          d.hits, d.misses, d.evictions, d.checksum_failures,
          d.token_mismatches, d.dropped_on_open, d.layout_mismatches,
          d.payload_bytes_written, d.stored_bytes_written, d.file_bytes}) {
      w.Int<uint64_t>(v);
    }
  }
  w.Int<uint32_t>(static_cast<uint32_t>(m.stats.workers.size()));
  for (const WorkerStats& ws : m.stats.workers) {
    w.Int<uint32_t>(ws.id);
    w.Int<int32_t>(ws.pid);
    w.String(ws.name);
    w.Int<uint32_t>(ws.requests);
    w.Int<uint32_t>(ws.loads_in_flight);
    w.Int<uint32_t>(ws.stores_in_flight);
  }
  Put(w, m.stats.load_latency);
  Put(w, m.stats.store_latency);
  w.Int<uint64_t>(m.stats.oldest_event_age_us);
  w.String(m.stats.model);
  w.String(m.stats.version);
}

void GetPayload(Reader& r, ErrorReply* m) {
  m->status = GetStatus(r);
  if (m->status.ok()) r.Fail("error reply carrying OK");
}
void GetPayload(Reader&, OkReply*) {}
void GetPayload(Reader& r, RegisterRequest* m) {
  WorkerRegistration& reg = m->registration;
  Get(r, &reg.layout);
  reg.model = r.String();
  reg.num_device_blocks = r.Int<int32_t>();
  reg.tenant = r.String();
  reg.pid = r.Int<int32_t>();
  reg.name = r.String();
}
void GetPayload(Reader& r, RegisterReply* m) {
  m->worker_id = r.Int<uint32_t>();
  m->host_segment = r.String();
  m->host_slots = r.Int<int32_t>();
  m->slot_bytes = r.Int<uint64_t>();
  m->control_segment = r.String();
  m->store_fingerprint = r.String();
}
void GetPayload(Reader& r, LookupRequest* m) {
  m->request = r.Int<uint64_t>();
  m->num_computed_tokens = r.Int<int32_t>();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
  const bool has_lora = r.Bool();
  const auto lora = r.Int<uint64_t>();
  if (has_lora) m->extras.lora_id = lora;
  const uint32_t items = r.Count(kMaxTokens, "multimodal item");
  for (uint32_t i = 0; i < items && r.ok(); ++i) {
    MultiModalItem item;
    item.hash.lo = r.Int<uint64_t>();
    item.hash.hi = r.Int<uint64_t>();
    item.start = r.Int<int64_t>();
    item.length = r.Int<int64_t>();
    m->extras.mm_items.push_back(item);
  }
  m->extras.cache_salt = r.String();
}
void GetPayload(Reader& r, LookupChunkRequest* m) {
  m->request = r.Int<uint64_t>();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
}
void GetPayload(Reader& r, LookupReply* m) {
  m->result.hit_tokens = r.Int<int32_t>();
  m->result.disk_hit_tokens = r.Int<int32_t>();
  if (m->result.disk_hit_tokens < 0 ||
      m->result.disk_hit_tokens > m->result.hit_tokens) {
    r.Fail("disk hit tokens outside the hit");
  }
}
void GetPayload(Reader& r, AllocateRequest* m) {
  m->request = r.Int<uint64_t>();
  m->num_external_tokens = r.Int<int32_t>();
  m->device_blocks = r.Ints<BlockId>(kMaxBlocks, "device block");
}
void GetPayload(Reader& r, AllocateReply* m) {
  if (r.Bool()) {
    TransferEvent e;
    Get(r, &e);
    m->result.load = std::move(e);
  }
  m->result.load_pending = r.Bool();
  if (m->result.load_pending && !m->result.load.has_value()) {
    r.Fail("pending load without a load");
  }
  m->result.store_status = GetStatus(r);
}
void GetPayload(Reader& r, CommitRequest* m) {
  m->request = r.Int<uint64_t>();
  m->num_computed_tokens = r.Int<int32_t>();
  m->device_blocks = r.Ints<BlockId>(kMaxBlocks, "device block");
}
void GetPayload(Reader& r, CommitReply* m) {
  const uint32_t n = r.Count(kMaxEvents, "event");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    TransferEvent e;
    Get(r, &e);
    m->result.stores.push_back(std::move(e));
  }
  m->result.skipped_blocks = r.Int<int32_t>();
}
void GetPayload(Reader& r, CompleteRequest* m) {
  const uint32_t n = r.Count(kMaxEvents, "event");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    CompletedEvent e;
    e.ref.kind = GetKind(r);
    e.ref.id = r.Int<uint64_t>();
    e.ok = r.Bool();
    m->events.push_back(e);
  }
}
void GetPayload(Reader& r, FinishRequest* m) { m->request = r.Int<uint64_t>(); }
void GetPayload(Reader&, StatsRequest*) {}
void GetPayload(Reader& r, StatsReply* m) {
  HostTierStats& h = m->stats.host;
  for (int64_t* v : {&h.capacity_slots, &h.free_slots, &h.used_slots,
                     &h.cached_slots, &h.pinned_slots}) {
    *v = r.Int<int64_t>();
  }
  for (uint64_t* v : {&h.slot_bytes,
                      &h.lookups,
                      &h.lookup_blocks,
                      &h.hit_blocks,
                      &h.miss_blocks,
                      &h.evictions,
                      &h.stores_completed,
                      &h.loads_completed,
                      &h.stores_failed,
                      &h.store_skipped,
                      &h.events_in_flight,
                      &h.disk_hit_blocks,
                      &h.spills,
                      &h.spill_drops,
                      &h.spill_failures,
                      &h.promotions,
                      &h.promotion_failures,
                      &h.spills_in_flight,
                      &h.promotions_in_flight,
                      &h.loads_cancelled}) {
    *v = r.Int<uint64_t>();
  }
  if (r.Bool()) {
    DiskTierStats& d = m->stats.disk.emplace();
    for (uint64_t* v :
         {&d.capacity_bytes, &d.bytes, &d.keys, &d.puts, &d.put_failures,
          &d.gets, &d.hits, &d.misses, &d.evictions, &d.checksum_failures,
          &d.token_mismatches, &d.dropped_on_open, &d.layout_mismatches,
          &d.payload_bytes_written, &d.stored_bytes_written, &d.file_bytes}) {
      *v = r.Int<uint64_t>();
    }
  }
  const uint32_t n = r.Count(kMaxWorkersListed, "worker");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    WorkerStats ws;
    ws.id = r.Int<uint32_t>();
    ws.pid = r.Int<int32_t>();
    ws.name = r.String();
    ws.requests = r.Int<uint32_t>();
    ws.loads_in_flight = r.Int<uint32_t>();
    ws.stores_in_flight = r.Int<uint32_t>();
    m->stats.workers.push_back(std::move(ws));
  }
  Get(r, &m->stats.load_latency);
  Get(r, &m->stats.store_latency);
  m->stats.oldest_event_age_us = r.Int<uint64_t>();
  m->stats.model = r.String();
  m->stats.version = r.String();
}

void PutPayload(Writer&, const ReadyLoadsRequest&) {}
void PutPayload(Writer& w, const ReadyLoadsReply& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.loads.size()));
  for (const TransferEvent& e : m.loads) Put(w, e);
}
void GetPayload(Reader&, ReadyLoadsRequest*) {}
void GetPayload(Reader& r, ReadyLoadsReply* m) {
  const uint32_t n = r.Count(kMaxEvents, "event");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    TransferEvent e;
    Get(r, &e);
    if (e.ref.kind != EventKind::kLoad) r.Fail("a ready load that is a store");
    m->loads.push_back(std::move(e));
  }
}

void PutPayload(Writer&, const EventsRequest&) {}
void PutPayload(Writer& w, const EventsReply& m) {
  w.Int<uint64_t>(m.in_flight);
  w.Int<uint32_t>(static_cast<uint32_t>(m.events.size()));
  for (const EventInfo& e : m.events) {
    w.Int<uint32_t>(e.worker);
    w.String(e.worker_name);
    w.Int<uint8_t>(static_cast<uint8_t>(e.ref.kind));
    w.Int<uint64_t>(e.ref.id);
    w.Int<uint64_t>(e.request);
    w.Int<uint32_t>(e.blocks);
    w.Int<uint8_t>(static_cast<uint8_t>(e.state));
    w.Int<uint64_t>(e.age_us);
  }
}
void GetPayload(Reader&, EventsRequest*) {}
void GetPayload(Reader& r, EventsReply* m) {
  m->in_flight = r.Int<uint64_t>();
  const uint32_t n = r.Count(kMaxEventsListed, "listed event");
  if (n > m->in_flight) r.Fail("more events listed than in flight");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    EventInfo e;
    e.worker = r.Int<uint32_t>();
    e.worker_name = r.String();
    e.ref.kind = GetKind(r);
    e.ref.id = r.Int<uint64_t>();
    e.request = r.Int<uint64_t>();
    e.blocks = r.Int<uint32_t>();
    if (e.blocks > kMaxBlocks) {
      r.Fail("event of " + std::to_string(e.blocks) + " blocks");
    }
    const auto state = r.Int<uint8_t>();
    if (state < static_cast<uint8_t>(EventState::kPromoting) ||
        state > static_cast<uint8_t>(EventState::kCopying)) {
      r.Fail("unknown event state " + std::to_string(state));
    }
    e.state = static_cast<EventState>(state);
    e.age_us = r.Int<uint64_t>();
    m->events.push_back(std::move(e));
  }
}

void PutPayload(Writer& w, const ClearRequest& m) {
  w.Int<uint8_t>(static_cast<uint8_t>(m.tiers));
}
void PutPayload(Writer& w, const ClearReply& m) {
  w.Int<uint64_t>(m.result.host_dropped);
  w.Int<uint64_t>(m.result.host_kept_pinned);
  w.Int<uint64_t>(m.result.disk_dropped);
  w.Bool(m.result.disk_cleared);
}
void GetPayload(Reader& r, ClearRequest* m) {
  const auto tiers = r.Int<uint8_t>();
  if (tiers < static_cast<uint8_t>(TierSelection::kHost) ||
      tiers > static_cast<uint8_t>(TierSelection::kAll)) {
    r.Fail("unknown tier selection " + std::to_string(tiers));
  }
  m->tiers = static_cast<TierSelection>(tiers);
}
void GetPayload(Reader& r, ClearReply* m) {
  m->result.host_dropped = r.Int<uint64_t>();
  m->result.host_kept_pinned = r.Int<uint64_t>();
  m->result.disk_dropped = r.Int<uint64_t>();
  m->result.disk_cleared = r.Bool();
}

void Put(Writer& w, const BlockKey& key) {
  w.Int<uint64_t>(key.lo);
  w.Int<uint64_t>(key.hi);
}
BlockKey GetKey(Reader& r) {
  BlockKey key;
  key.lo = r.Int<uint64_t>();
  key.hi = r.Int<uint64_t>();
  return key;
}

void PutPayload(Writer& w, const EvictRequest& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.keys.size()));
  for (const BlockKey& key : m.keys) Put(w, key);
}
// Flags of one EvictedBlock.
constexpr uint8_t kHostDropped = 1, kHostPinned = 2, kDiskDropped = 4;
void PutPayload(Writer& w, const EvictReply& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.blocks.size()));
  for (const EvictedBlock& b : m.blocks) {
    Put(w, b.key);
    w.Int<uint8_t>((b.host_dropped ? kHostDropped : 0) |
                   (b.host_pinned ? kHostPinned : 0) |
                   (b.disk_dropped ? kDiskDropped : 0));
  }
}
void GetPayload(Reader& r, EvictRequest* m) {
  const uint32_t n = r.Count(kMaxBlocks, "key");
  for (uint32_t i = 0; i < n && r.ok(); ++i) m->keys.push_back(GetKey(r));
}
void GetPayload(Reader& r, EvictReply* m) {
  const uint32_t n = r.Count(kMaxBlocks, "evicted block");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    EvictedBlock b{.key = GetKey(r)};
    const auto flags = r.Int<uint8_t>();
    if ((flags & ~(kHostDropped | kHostPinned | kDiskDropped)) != 0 ||
        ((flags & kHostDropped) != 0 && (flags & kHostPinned) != 0)) {
      r.Fail("bad evicted block flags " + std::to_string(flags));
    }
    b.host_dropped = (flags & kHostDropped) != 0;
    b.host_pinned = (flags & kHostPinned) != 0;
    b.disk_dropped = (flags & kDiskDropped) != 0;
    m->blocks.push_back(b);
  }
}

constexpr MessageType kTypes[] = {
    MessageType::kError,       MessageType::kOk,
    MessageType::kRegister,    MessageType::kRegisterReply,
    MessageType::kLookup,      MessageType::kLookupReply,
    MessageType::kAllocate,    MessageType::kAllocateReply,
    MessageType::kCommit,      MessageType::kCommitReply,
    MessageType::kComplete,    MessageType::kFinish,
    MessageType::kStats,       MessageType::kStatsReply,
    MessageType::kReadyLoads,  MessageType::kReadyLoadsReply,
    MessageType::kLookupChunk, MessageType::kEvents,
    MessageType::kEventsReply, MessageType::kClear,
    MessageType::kClearReply,  MessageType::kEvict,
    MessageType::kEvictReply,
};
static_assert(std::size(kTypes) == std::variant_size_v<Message>);

// The variant alternative with index I, decoded.
template <size_t I>
Message DecodeAs(Reader& r) {
  std::variant_alternative_t<I, Message> m;
  GetPayload(r, &m);
  return m;
}

template <size_t... I>
Message DecodeIndex(size_t index, Reader& r, std::index_sequence<I...>) {
  Message out;
  ((index == I ? (out = DecodeAs<I>(r), 0) : 0), ...);
  return out;
}

StatusOr<size_t> IndexOfType(uint16_t type) {
  for (size_t i = 0; i < std::size(kTypes); ++i) {
    if (static_cast<uint16_t>(kTypes[i]) == type) return i;
  }
  return Status::InvalidArgument("unknown message type " +
                                 std::to_string(type));
}

}  // namespace

MessageType TypeOf(const Message& message) { return kTypes[message.index()]; }

const char* MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kError:
      return "Error";
    case MessageType::kOk:
      return "Ok";
    case MessageType::kRegister:
      return "Register";
    case MessageType::kRegisterReply:
      return "RegisterReply";
    case MessageType::kLookup:
      return "Lookup";
    case MessageType::kLookupReply:
      return "LookupReply";
    case MessageType::kAllocate:
      return "Allocate";
    case MessageType::kAllocateReply:
      return "AllocateReply";
    case MessageType::kCommit:
      return "Commit";
    case MessageType::kCommitReply:
      return "CommitReply";
    case MessageType::kComplete:
      return "Complete";
    case MessageType::kFinish:
      return "Finish";
    case MessageType::kStats:
      return "Stats";
    case MessageType::kStatsReply:
      return "StatsReply";
    case MessageType::kReadyLoads:
      return "ReadyLoads";
    case MessageType::kReadyLoadsReply:
      return "ReadyLoadsReply";
    case MessageType::kLookupChunk:
      return "LookupChunk";
    case MessageType::kEvents:
      return "Events";
    case MessageType::kEventsReply:
      return "EventsReply";
    case MessageType::kClear:
      return "Clear";
    case MessageType::kClearReply:
      return "ClearReply";
    case MessageType::kEvict:
      return "Evict";
    case MessageType::kEvictReply:
      return "EvictReply";
  }
  return "?";
}

void Encode(const Message& message, std::vector<std::byte>* out) {
  const size_t start = out->size();
  Writer w(out);
  w.Int<uint32_t>(kFrameMagic);
  w.Int<uint16_t>(kProtocolVersion);
  w.Int<uint16_t>(static_cast<uint16_t>(TypeOf(message)));
  w.Int<uint32_t>(0);  // Payload length, patched below.
  w.Int<uint32_t>(0);  // Reserved.
  std::visit([&w](const auto& m) { PutPayload(w, m); }, message);
  const auto len =
      static_cast<uint32_t>(out->size() - start - kFrameHeaderBytes);
  for (size_t i = 0; i < 4; ++i) {
    (*out)[start + 8 + i] = static_cast<std::byte>((len >> (8 * i)) & 0xFF);
  }
}

std::vector<std::byte> Encode(const Message& message) {
  std::vector<std::byte> out;
  Encode(message, &out);
  return out;
}

StatusOr<uint32_t> PeekPayloadLength(std::span<const std::byte> header,
                                     uint32_t max_payload) {
  if (header.size() < kFrameHeaderBytes) {
    return Status::InvalidArgument("truncated frame header (" +
                                   std::to_string(header.size()) + " bytes)");
  }
  Reader r(header.first(kFrameHeaderBytes));
  const auto magic = r.Int<uint32_t>();
  const auto version = r.Int<uint16_t>();
  r.Int<uint16_t>();
  const auto len = r.Int<uint32_t>();
  if (magic != kFrameMagic) {
    return Status::InvalidArgument("not a tierkv frame (bad magic)");
  }
  if (version != kProtocolVersion) {
    return Status::FailedPrecondition(
        "protocol version " + std::to_string(version) + "; this side speaks " +
        std::to_string(kProtocolVersion));
  }
  if (len > max_payload) {
    return Status::InvalidArgument("frame payload of " + std::to_string(len) +
                                   " bytes exceeds " +
                                   std::to_string(max_payload));
  }
  return len;
}

StatusOr<Message> Decode(std::span<const std::byte> frame) {
  TIERKV_ASSIGN_OR_RETURN(uint32_t len, PeekPayloadLength(frame, UINT32_MAX));
  if (frame.size() != kFrameHeaderBytes + len) {
    return Status::InvalidArgument("frame of " + std::to_string(frame.size()) +
                                   " bytes announces " + std::to_string(len) +
                                   " payload bytes");
  }
  Reader header(frame.first(kFrameHeaderBytes));
  header.Int<uint32_t>();
  header.Int<uint16_t>();
  const auto type = header.Int<uint16_t>();
  TIERKV_ASSIGN_OR_RETURN(size_t index, IndexOfType(type));
  Reader r(frame.subspan(kFrameHeaderBytes));
  Message m = DecodeIndex(
      index, r, std::make_index_sequence<std::variant_size_v<Message>>());
  const char* name = MessageTypeName(kTypes[index]);
  if (!r.ok()) {
    return Status::InvalidArgument(std::string("malformed ") + name + ": " +
                                   r.error());
  }
  if (!r.at_end()) {
    return Status::InvalidArgument(std::string("malformed ") + name + ": " +
                                   "trailing bytes after byte " +
                                   std::to_string(r.pos()));
  }
  return m;
}

Status StatusOf(const Message& message) {
  if (const auto* e = std::get_if<ErrorReply>(&message)) return e->status;
  return Status::Ok();
}

}  // namespace tierkv::ipc
