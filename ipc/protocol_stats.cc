// The encoding of the stats messages (ipc/protocol.h): StatsRequest and
// StatsReply, which carries a whole CoordinatorStats.
#include "ipc/wire.h"

namespace tierkv::ipc::wire {

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

}  // namespace tierkv::ipc::wire
