// The encoding of a worker's messages (ipc/protocol.h): registration,
// lookups, allocate, commit, complete, finish and ready loads.
#include "ipc/wire.h"

namespace tierkv::ipc::wire {
namespace {

void PutCompleted(Writer& w, const std::vector<CompletedEvent>& events) {
  w.Int<uint32_t>(static_cast<uint32_t>(events.size()));
  for (const CompletedEvent& e : events) {
    w.Int<uint8_t>(static_cast<uint8_t>(e.ref.kind));
    w.Int<uint64_t>(e.ref.id);
    w.Bool(e.ok);
  }
}

std::vector<CompletedEvent> GetCompleted(Reader& r) {
  std::vector<CompletedEvent> events;
  const uint32_t n = r.Count(kMaxEvents, "event");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    CompletedEvent e;
    e.ref.kind = GetKind(r);
    e.ref.id = r.Int<uint64_t>();
    e.ok = r.Bool();
    events.push_back(e);
  }
  return events;
}

}  // namespace

void PutPayload(Writer& w, const RegisterRequest& m) {
  const WorkerRegistration& reg = m.registration;
  Put(w, reg.layout);
  w.String(reg.model);
  w.Int<int32_t>(reg.num_device_blocks);
  w.String(reg.tenant);
  w.Int<int32_t>(reg.pid);
  w.String(reg.name);
  w.Int<int32_t>(reg.ranks);
  w.Int<uint32_t>(reg.scheduler);
  w.Int<int32_t>(reg.rank);
  w.String(reg.attachment_tag);
}
void PutPayload(Writer& w, const RegisterReply& m) {
  w.Int<uint32_t>(m.worker_id);
  w.Int<int32_t>(m.host_slots);
  w.Int<uint64_t>(m.slot_bytes);
  w.String(m.store_fingerprint);
}
void PutExtras(Writer& w, const RequestExtras& extras) {
  w.Bool(extras.lora_id.has_value());
  w.Int<uint64_t>(extras.lora_id.value_or(0));
  w.Int<uint32_t>(static_cast<uint32_t>(extras.mm_items.size()));
  for (const MultiModalItem& item : extras.mm_items) {
    Put(w, item.hash);
    w.Int<int64_t>(item.start);
    w.Int<int64_t>(item.length);
  }
  w.String(extras.cache_salt);
}
void GetExtras(Reader& r, RequestExtras* extras) {
  const bool has_lora = r.Bool();
  const auto lora = r.Int<uint64_t>();
  if (has_lora) extras->lora_id = lora;
  const uint32_t items = r.Count(kMaxTokens, "multimodal item");
  for (uint32_t i = 0; i < items && r.ok(); ++i) {
    MultiModalItem item;
    item.hash = GetKey(r);
    item.start = r.Int<int64_t>();
    item.length = r.Int<int64_t>();
    extras->mm_items.push_back(item);
  }
  extras->cache_salt = r.String();
}
void PutLookup(Writer& w, RequestId request, int32_t num_computed_tokens,
               std::span<const TokenId> tokens, const RequestExtras& extras,
               uint32_t kept_tokens, uint64_t kept_tag) {
  w.Int<uint64_t>(request);
  w.Int<int32_t>(num_computed_tokens);
  w.Ints(tokens);
  PutExtras(w, extras);
  w.Int<uint32_t>(kept_tokens);
  w.Int<uint64_t>(kept_tag);
}
void PutPayload(Writer& w, const LookupRequest& m) {
  PutLookup(w, m.request, m.num_computed_tokens, m.tokens, m.extras,
            m.kept_tokens, m.kept_tag);
}
// A chunk's virtual start: a RoPE position, 0 .. kMaxChunkVirtualStart - 1.
int64_t GetVirtualStart(Reader& r) {
  const auto v = r.Int<int64_t>();
  if (v < 0 || v >= kMaxChunkVirtualStart) {
    r.Fail("chunk virtual start " + std::to_string(v) + " out of range");
  }
  return v;
}
void PutPayload(Writer& w, const LookupChunkRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Ints(m.tokens);
  w.Int<int64_t>(m.virtual_start);
  Put(w, m.variant);
}
void PutPayload(Writer& w, const LookupReply& m) {
  w.Int<int32_t>(m.result.hit_tokens);
  w.Int<int32_t>(m.result.disk_hit_tokens);
  w.Int<uint64_t>(m.tokens_tag);
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
  Put(w, m.result.store_status);
}
void PutPayload(Writer& w, const CompleteRequest& m) {
  PutCompleted(w, m.events);
}
void PutPayload(Writer& w, const FinishRequest& m) {
  w.Int<uint64_t>(m.request);
}
void GetPayload(Reader& r, RegisterRequest* m) {
  WorkerRegistration& reg = m->registration;
  Get(r, &reg.layout);
  reg.model = r.String();
  reg.num_device_blocks = r.Int<int32_t>();
  reg.tenant = r.String();
  reg.pid = r.Int<int32_t>();
  reg.name = r.String();
  reg.ranks = r.Int<int32_t>();
  reg.scheduler = r.Int<uint32_t>();
  reg.rank = r.Int<int32_t>();
  reg.attachment_tag = r.String();
}
void GetPayload(Reader& r, RegisterReply* m) {
  m->worker_id = r.Int<uint32_t>();
  m->host_slots = r.Int<int32_t>();
  m->slot_bytes = r.Int<uint64_t>();
  m->store_fingerprint = r.String();
}
void GetPayload(Reader& r, LookupRequest* m) {
  m->request = r.Int<uint64_t>();
  m->num_computed_tokens = r.Int<int32_t>();
  r.IntsInto(&m->tokens, kMaxTokens, "token");
  GetExtras(r, &m->extras);
  m->kept_tokens = r.Int<uint32_t>();
  m->kept_tag = r.Int<uint64_t>();
  if (m->kept_tokens > kMaxTokens) r.Fail("kept tokens past the limit");
}
void GetPayload(Reader& r, LookupChunkRequest* m) {
  m->request = r.Int<uint64_t>();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
  m->virtual_start = GetVirtualStart(r);
  m->variant = GetKey(r);
}
void GetPayload(Reader& r, LookupReply* m) {
  m->result.hit_tokens = r.Int<int32_t>();
  m->result.disk_hit_tokens = r.Int<int32_t>();
  if (m->result.disk_hit_tokens < 0 ||
      m->result.disk_hit_tokens > m->result.hit_tokens) {
    r.Fail("disk hit tokens outside the hit");
  }
  m->tokens_tag = r.Int<uint64_t>();
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
  m->result.store_status = GetStatus(r);
}

void GetPayload(Reader& r, CompleteRequest* m) { m->events = GetCompleted(r); }
void GetPayload(Reader& r, FinishRequest* m) { m->request = r.Int<uint64_t>(); }

void PutPayload(Writer& w, const WaitIdleRequest& m) {
  w.Int<uint32_t>(m.timeout_ms);
}
void PutPayload(Writer& w, const WaitIdleReply& m) { w.Bool(m.idle); }
void GetPayload(Reader& r, WaitIdleRequest* m) {
  m->timeout_ms = r.Int<uint32_t>();
}
void GetPayload(Reader& r, WaitIdleReply* m) { m->idle = r.Bool(); }

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

void PutPayload(Writer& w, const FetchChunkRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Int<uint32_t>(m.wait_ms);
  w.Ints(m.tokens);
  w.Int<int64_t>(m.virtual_start);
  Put(w, m.variant);
}
void GetPayload(Reader& r, FetchChunkRequest* m) {
  m->request = r.Int<uint64_t>();
  m->wait_ms = r.Int<uint32_t>();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
  m->virtual_start = GetVirtualStart(r);
  m->variant = GetKey(r);
}
void PutPayload(Writer& w, const FetchChunkReply& m) {
  const ChunkFetchResult& f = m.result;
  w.Int<int32_t>(f.lookup.hit_tokens);
  w.Int<int32_t>(f.lookup.disk_hit_tokens);
  // The load's slots only: its device blocks are the worker's to choose.
  w.Bool(f.load.has_value());
  if (f.load.has_value()) {
    w.Int<uint64_t>(f.load->ref.id);
    w.Int<uint64_t>(f.load->request);
    w.Ints(f.load->host_blocks);
    w.Int<int32_t>(f.load->failed_blocks);
  }
  w.Bool(f.lease);
  w.Bool(f.waited);
}
void GetPayload(Reader& r, FetchChunkReply* m) {
  ChunkFetchResult& f = m->result;
  f.lookup.hit_tokens = r.Int<int32_t>();
  f.lookup.disk_hit_tokens = r.Int<int32_t>();
  if (f.lookup.hit_tokens < 0 || f.lookup.disk_hit_tokens < 0 ||
      f.lookup.disk_hit_tokens > f.lookup.hit_tokens) {
    r.Fail("hit tokens out of range");
  }
  if (r.Bool()) {
    TransferEvent e;
    e.ref = {EventKind::kLoad, r.Int<uint64_t>()};
    e.request = r.Int<uint64_t>();
    e.host_blocks = r.Ints<BlockId>(kMaxBlocks, "host block");
    e.failed_blocks = r.Int<int32_t>();
    if (e.failed_blocks < 0 ||
        static_cast<uint32_t>(e.failed_blocks) > kMaxBlocks) {
      r.Fail("failed block count " + std::to_string(e.failed_blocks));
    }
    f.load = std::move(e);
  }
  f.lease = r.Bool();
  f.waited = r.Bool();
  if (f.lease && f.load.has_value()) r.Fail("a compute lease on a hit");
}
void PutPayload(Writer& w, const PublishChunkRequest& m) {
  w.Int<uint64_t>(m.request);
  w.Ints(m.tokens);
  w.Ints(m.device_blocks);
  w.Int<int64_t>(m.virtual_start);
  Put(w, m.variant);
}
void GetPayload(Reader& r, PublishChunkRequest* m) {
  m->request = r.Int<uint64_t>();
  m->tokens = r.Ints<TokenId>(kMaxTokens, "token");
  m->device_blocks = r.Ints<BlockId>(kMaxBlocks, "device block");
  m->virtual_start = GetVirtualStart(r);
  m->variant = GetKey(r);
}
void PutPayload(Writer& w, const ChunkDoneRequest& m) {
  PutCompleted(w, m.events);
  w.Int<uint64_t>(m.finish);
}
void GetPayload(Reader& r, ChunkDoneRequest* m) {
  m->events = GetCompleted(r);
  m->finish = r.Int<uint64_t>();
}

void PutPayload(Writer& w, const LookupBatchRequest& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.lookups.size()));
  for (const LookupRequest& l : m.lookups) PutPayload(w, l);
}
void GetPayload(Reader& r, LookupBatchRequest* m) {
  const uint32_t n = r.Count(kMaxBatchLookups, "batched lookup");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    GetPayload(r, &m->lookups.emplace_back());
  }
}
void PutPayload(Writer& w, const LookupBatchReply& m) {
  w.Int<uint32_t>(static_cast<uint32_t>(m.results.size()));
  for (const StatusOr<LookupResult>& result : m.results) {
    Put(w, result.status());
    if (result.ok()) PutPayload(w, LookupReply{*result});
  }
}
void GetPayload(Reader& r, LookupBatchReply* m) {
  const uint32_t n = r.Count(kMaxBatchLookups, "batched lookup result");
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    Status status = GetStatus(r);
    if (!status.ok()) {
      m->results.emplace_back(std::move(status));
      continue;
    }
    LookupReply reply;
    GetPayload(r, &reply);
    m->results.emplace_back(reply.result);
  }
}

}  // namespace tierkv::ipc::wire
