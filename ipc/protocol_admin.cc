// The encoding of tierkv-admin's orders (ipc/protocol.h): the events in
// flight, clear and evict.
#include "ipc/wire.h"

namespace tierkv::ipc::wire {

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
  w.Bool(m.result.disk_undeleted);
  w.Int<uint64_t>(m.result.remote_dropped);
  w.Bool(m.result.remote_cleared);
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
  m->result.disk_undeleted = r.Bool();
  m->result.remote_dropped = r.Int<uint64_t>();
  m->result.remote_cleared = r.Bool();
}

void PutPayload(Writer& w, const EvictRequest& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.keys.size()));
  for (const BlockKey& key : m.keys) Put(w, key);
}
// Flags of one EvictedBlock.
constexpr uint8_t kHostDropped = 1, kHostPinned = 2, kDiskDropped = 4,
                  kRemoteDropped = 8, kDiskUndeleted = 16;
void PutPayload(Writer& w, const EvictReply& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.blocks.size()));
  for (const EvictedBlock& b : m.blocks) {
    Put(w, b.key);
    w.Int<uint8_t>((b.host_dropped ? kHostDropped : 0) |
                   (b.host_pinned ? kHostPinned : 0) |
                   (b.disk_dropped ? kDiskDropped : 0) |
                   (b.disk_undeleted ? kDiskUndeleted : 0) |
                   (b.remote_dropped ? kRemoteDropped : 0));
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
    if ((flags & ~(kHostDropped | kHostPinned | kDiskDropped | kDiskUndeleted |
                   kRemoteDropped)) != 0 ||
        ((flags & kHostDropped) != 0 && (flags & kHostPinned) != 0) ||
        ((flags & kDiskUndeleted) != 0 && (flags & kDiskDropped) == 0)) {
      r.Fail("bad evicted block flags " + std::to_string(flags));
    }
    b.host_dropped = (flags & kHostDropped) != 0;
    b.host_pinned = (flags & kHostPinned) != 0;
    b.disk_dropped = (flags & kDiskDropped) != 0;
    b.disk_undeleted = (flags & kDiskUndeleted) != 0;
    b.remote_dropped = (flags & kRemoteDropped) != 0;
    m->blocks.push_back(b);
  }
}

void PutPayload(Writer&, const HeldKeysRequest&) {}
void PutPayload(Writer& w, const HeldKeysReply& m) {
  w.Int<uint64_t>(m.keys.host_total);
  w.Int<uint64_t>(m.keys.disk_total);
  w.Int<uint64_t>(m.keys.remote_total);
  for (const std::vector<BlockKey>* keys :
       {&m.keys.host, &m.keys.disk, &m.keys.remote}) {
    w.Int<uint32_t>(static_cast<uint32_t>(keys->size()));
    for (const BlockKey& key : *keys) Put(w, key);
  }
}
void GetPayload(Reader&, HeldKeysRequest*) {}
void GetPayload(Reader& r, HeldKeysReply* m) {
  m->keys.host_total = r.Int<uint64_t>();
  m->keys.disk_total = r.Int<uint64_t>();
  m->keys.remote_total = r.Int<uint64_t>();
  for (auto [keys, total] :
       {std::pair{&m->keys.host, m->keys.host_total},
        std::pair{&m->keys.disk, m->keys.disk_total},
        std::pair{&m->keys.remote, m->keys.remote_total}}) {
    const uint32_t n = r.Count(kMaxHeldKeysListed, "held key");
    if (n > total) r.Fail("more keys listed than held");
    for (uint32_t i = 0; i < n && r.ok(); ++i) keys->push_back(GetKey(r));
  }
}

void PutPayload(Writer& w, const RouteRequest& m) {
  w.String(m.tenant);
  w.Ints(m.tokens);
  PutExtras(w, m.extras);
}
void PutPayload(Writer& w, const RouteReply& m) {
  w.Int<int32_t>(m.result.prompt_tokens);
  w.Int<int32_t>(m.result.cached_tokens);
  w.Int<int32_t>(m.result.lower_tokens);
  w.Int<uint32_t>(static_cast<uint32_t>(m.result.workers.size()));
  for (const RouteWorker& worker : m.result.workers) {
    w.Int<uint32_t>(worker.id);
    w.String(worker.name);
    w.Int<int32_t>(worker.pid);
  }
}
void GetPayload(Reader& r, RouteRequest* m) {
  m->tenant = r.String();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
  GetExtras(r, &m->extras);
}
void GetPayload(Reader& r, RouteReply* m) {
  RouteResult& route = m->result;
  route.prompt_tokens = r.Int<int32_t>();
  route.cached_tokens = r.Int<int32_t>();
  route.lower_tokens = r.Int<int32_t>();
  if (route.prompt_tokens < 0 || route.cached_tokens < 0 ||
      route.cached_tokens > route.prompt_tokens || route.lower_tokens < 0 ||
      route.lower_tokens > route.cached_tokens) {
    r.Fail("cached tokens outside the prompt");
  }
  const uint32_t n = r.Count(kMaxWorkersListed, "worker");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    RouteWorker& worker = route.workers.emplace_back();
    worker.id = r.Int<uint32_t>();
    worker.name = r.String();
    worker.pid = r.Int<int32_t>();
  }
}

}  // namespace tierkv::ipc::wire
