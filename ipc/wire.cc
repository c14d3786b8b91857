// The protocol's wire primitives: Put/Get of the types several messages
// share (ipc/wire.h).
#include "ipc/wire.h"

namespace tierkv::ipc::wire {

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
  if (code > static_cast<uint8_t>(StatusCode::kAborted)) {
    r.Fail("unknown status code");
    return Status::Internal("bad status");
  }
  if (code == 0) return Status::Ok();
  return Status(static_cast<StatusCode>(code), std::move(message));
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

}  // namespace tierkv::ipc::wire
