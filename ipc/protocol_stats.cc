// The encoding of the stats messages (ipc/protocol.h): StatsRequest and
// StatsReply, which carries a whole CoordinatorStats: each stats struct's
// fields in the order of its field table (tierkv/stats.h).
#include <string>
#include <type_traits>

#include "ipc/wire.h"
#include "tierkv/stats.h"

namespace tierkv::ipc::wire {

namespace {

// One field of a stats field table (tierkv/stats.h), in table order.
template <typename T>
void PutField(Writer& w, const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    w.String(v);
  } else {
    w.Int<T>(v);
  }
}
template <typename T>
void GetField(Reader& r, T* v) {
  if constexpr (std::is_same_v<T, std::string>) {
    *v = r.String();
  } else {
    *v = r.Int<T>();
  }
}

template <typename Stats>
void PutFields(Writer& w, const Stats& s) {
  Stats::ForEachField(s,
                      [&](const StatField&, const auto& v) { PutField(w, v); });
}
template <typename Stats>
void GetFields(Reader& r, Stats* s) {
  Stats::ForEachField(*s, [&](const StatField&, auto& v) { GetField(r, &v); });
}

}  // namespace

void PutPayload(Writer&, const StatsRequest&) {}
void PutPayload(Writer& w, const StatsReply& m) {
  PutFields(w, m.stats.host);
  w.Bool(m.stats.disk.has_value());
  if (m.stats.disk.has_value()) PutFields(w, *m.stats.disk);
  w.Int<uint32_t>(static_cast<uint32_t>(m.stats.workers.size()));
  for (const WorkerStats& ws : m.stats.workers) PutFields(w, ws);
  Put(w, m.stats.load_latency);
  Put(w, m.stats.store_latency);
  Put(w, m.stats.spill_latency);
  Put(w, m.stats.promotion_latency);
  w.Int<uint64_t>(m.stats.oldest_event_age_us);
  PutFields(w, m.stats.attach);
  w.String(m.stats.model);
  w.String(m.stats.store);
  w.String(m.stats.key_fingerprint);
  w.Int<uint32_t>(m.stats.block_size);
  w.String(m.stats.version);
  w.Bool(m.stats.remote.has_value());
  if (m.stats.remote.has_value()) PutFields(w, *m.stats.remote);
}

void GetPayload(Reader&, StatsRequest*) {}
void GetPayload(Reader& r, StatsReply* m) {
  GetFields(r, &m->stats.host);
  if (r.Bool()) GetFields(r, &m->stats.disk.emplace());
  const uint32_t n = r.Count(kMaxWorkersListed, "worker");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    GetFields(r, &m->stats.workers.emplace_back());
  }
  Get(r, &m->stats.load_latency);
  Get(r, &m->stats.store_latency);
  Get(r, &m->stats.spill_latency);
  Get(r, &m->stats.promotion_latency);
  m->stats.oldest_event_age_us = r.Int<uint64_t>();
  GetFields(r, &m->stats.attach);
  m->stats.model = r.String();
  m->stats.store = r.String();
  m->stats.key_fingerprint = r.String();
  m->stats.block_size = r.Int<uint32_t>();
  m->stats.version = r.String();
  if (r.Bool()) GetFields(r, &m->stats.remote.emplace());
}

}  // namespace tierkv::ipc::wire
