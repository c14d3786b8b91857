// Sequences of worker messages against a real store: what two hostile
// workers can make tierkvd do through their channels. Each input is a run
// of records, a control byte and then one frame (the 16-byte header and the
// payload it announces, cut short where the input ends):
//   control bit 0: which of the two registered workers sends it;
//   control bit 1: that worker first disconnects and registers again, as
//                  tierkvd does when a worker's socket closes (its pins are
//                  released).
// The frame is decoded as tierkvd's session thread decodes a request (a
// frame that does not decode is answered with an error and changes
// nothing) and dispatched with ipc::DispatchToStore into a TieredStore with
// a small private host tier and no disk, opened afresh for every input.
//
// Checked after every message: the host pool's invariants
// (BlockPool::CheckInvariants); the counts the coordinator keeps agree with
// the events it lists; the reply is of the request's kind and decodes on
// the worker's side; every event handed out names host slots and the
// worker's device blocks in range; and no host slot a store is writing is
// also the source or destination of another transfer in flight (a worker
// would copy torn bytes). After the input both workers disconnect, and
// then nothing may be pinned and no event in flight.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ipc/protocol.h"
#include "ipc/service.h"
#include "tiers/tiered_store.h"

namespace tierkv::ipc {
namespace {

// One block is 4 tokens of 128 bytes of KV: small, so lookups hit often.
KvLayout FuzzLayout() {
  return KvLayout{.num_layers = 1,
                  .num_kv_heads = 1,
                  .head_dim = 8,
                  .block_size = 4,
                  .dtype = DType::kF16};
}
// Eight usable host slots: the store runs out of slots easily.
constexpr int32_t kHostSlots = 9;
constexpr int32_t kDeviceBlocks = 64;

struct TrackedEvent {
  EventRef ref;
  std::vector<BlockId> host_blocks;
};

class Harness {
 public:
  Harness() {
    TieredStoreOptions options;
    options.layout = FuzzLayout();
    options.host.num_slots = kHostSlots;
    options.tier_thread = false;  // No disk: nothing to apply.
    StatusOr<std::unique_ptr<TieredStore>> store =
        TieredStore::Open(std::move(options));
    FUZZ_CHECK(store.ok(), "%s", store.status().ToString().c_str());
    store_ = std::move(*store);
    for (int i = 0; i < 2; ++i) Register(i);
  }

  void Run(std::span<const std::byte> input) {
    while (!input.empty()) {
      const auto control = static_cast<uint8_t>(input[0]);
      input = input.subspan(1);
      const int slot = control & 1;
      if ((control & 2) != 0) {
        Drop(slot);
        Register(slot);
      }
      size_t frame = input.size();
      if (input.size() >= kFrameHeaderBytes) {
        StatusOr<uint32_t> len = PeekPayloadLength(input, UINT32_MAX);
        if (len.ok() && *len <= input.size() - kFrameHeaderBytes) {
          frame = kFrameHeaderBytes + *len;
        }
      }
      Send(slot, input.first(frame));
      input = input.subspan(frame);
    }
    for (int i = 0; i < 2; ++i) Drop(i);
    const CoordinatorStats stats = store_->stats();
    FUZZ_CHECK(stats.host.pinned_slots == 0,
               "%lld host slots stay pinned after every worker left",
               static_cast<long long>(stats.host.pinned_slots));
    FUZZ_CHECK(stats.host.events_in_flight == 0,
               "%llu events in flight after every worker left",
               static_cast<unsigned long long>(stats.host.events_in_flight));
  }

 private:
  void Register(int slot) {
    StatusOr<WorkerId> id = store_->Lock()->RegisterWorker(
        {.layout = FuzzLayout(),
         .num_device_blocks = kDeviceBlocks,
         .tenant = "",
         .pid = slot + 1,
         .name = "fuzz-" + std::to_string(slot)});
    FUZZ_CHECK(id.ok(), "%s", id.status().ToString().c_str());
    workers_[slot] = *id;
  }

  void Drop(int slot) {
    const Status dropped = store_->Lock()->DropWorker(workers_[slot]);
    FUZZ_CHECK(dropped.ok(), "%s", dropped.ToString().c_str());
    events_[slot].clear();
    CheckStore();
  }

  void Send(int slot, std::span<const std::byte> frame) {
    StatusOr<Message> request = Decode(frame);
    if (!request.ok()) return;  // tierkvd answers an ErrorReply.
    // One thread runs every worker here: no other could end a lease while
    // a fetch waits for it.
    if (auto* fetch = std::get_if<FetchChunkRequest>(&*request)) {
      fetch->wait_ms = 0;
    }
    const Message reply = DispatchToStore(*store_, workers_[slot], *request);
    CheckReply(slot, *request, reply);
    CheckStore();
  }

  // The reply a worker gets for `request`, and the events it hands out.
  void CheckReply(int slot, const Message& request, const Message& reply) {
    const std::vector<std::byte> bytes = Encode(reply);
    FUZZ_CHECK(Decode(bytes).ok(), "the %s reply to %s does not decode",
               MessageTypeName(TypeOf(reply)),
               MessageTypeName(TypeOf(request)));
    if (std::holds_alternative<ErrorReply>(reply)) {
      // A ChunkDone applies its completions whatever its Finish says (the
      // client sends it one-way and never reads the reply), so an error
      // from the Finish comes back with the events completed. Those the
      // store no longer lists are done.
      if (const auto* done = std::get_if<ChunkDoneRequest>(&request)) {
        ForgetCompletedOutside(slot, done->events);
      }
      return;
    }
    const MessageType expected = ExpectedReply(TypeOf(request));
    FUZZ_CHECK(TypeOf(reply) == expected, "%s answered with %s",
               MessageTypeName(TypeOf(request)),
               MessageTypeName(TypeOf(reply)));
    if (const auto* lookup = std::get_if<LookupReply>(&reply)) {
      size_t tokens = 0;
      if (const auto* r = std::get_if<LookupRequest>(&request)) {
        tokens = r->tokens.size();
      } else {
        tokens = std::get<LookupChunkRequest>(request).tokens.size();
      }
      FUZZ_CHECK(lookup->result.hit_tokens >= 0 &&
                     static_cast<size_t>(lookup->result.hit_tokens) <= tokens,
                 "%d tokens hit of %zu", lookup->result.hit_tokens, tokens);
      FUZZ_CHECK(lookup->result.disk_hit_tokens == 0, "a disk hit, no disk");
    } else if (const auto* allocate = std::get_if<AllocateReply>(&reply)) {
      FUZZ_CHECK(!allocate->result.load_pending, "a pending load, no disk");
      if (allocate->result.load) Track(slot, *allocate->result.load);
    } else if (const auto* commit = std::get_if<CommitReply>(&reply)) {
      for (const TransferEvent& store : commit->result.stores) {
        Track(slot, store);
      }
    } else if (const auto* ready = std::get_if<ReadyLoadsReply>(&reply)) {
      for (const TransferEvent& load : ready->loads) Track(slot, load);
    } else if (const auto* fetch = std::get_if<FetchChunkReply>(&reply)) {
      FUZZ_CHECK(!fetch->result.load.has_value() || !fetch->result.lease,
                 "a chunk fetch that both loads and leases");
      if (fetch->result.load) {
        // Its device blocks are the worker's to choose: any in range.
        TransferEvent load = *fetch->result.load;
        load.device_blocks.assign(load.host_blocks.size(), 0);
        Track(slot, load);
      }
    } else if (const auto* complete = std::get_if<CompleteRequest>(&request)) {
      for (const CompletedEvent& done : complete->events) {
        FUZZ_CHECK(events_[slot].erase(Key(done.ref)) == 1,
                   "completed an event never handed out");
      }
    } else if (const auto* done = std::get_if<ChunkDoneRequest>(&request)) {
      for (const CompletedEvent& e : done->events) {
        FUZZ_CHECK(events_[slot].erase(Key(e.ref)) == 1,
                   "completed an event never handed out");
      }
    }
  }

  // Forgets the tracked events among `completed` that the store no longer
  // lists.
  void ForgetCompletedOutside(int slot,
                              std::span<const CompletedEvent> completed) {
    std::vector<EventInfo> listed = store_->Lock()->events();
    for (const CompletedEvent& e : completed) {
      const bool in_flight =
          std::any_of(listed.begin(), listed.end(), [&](const EventInfo& i) {
            return i.worker == workers_[slot] && Key(i.ref) == Key(e.ref);
          });
      if (!in_flight) events_[slot].erase(Key(e.ref));
    }
  }

  static MessageType ExpectedReply(MessageType request) {
    switch (request) {
      case MessageType::kLookup:
      case MessageType::kLookupChunk:
        return MessageType::kLookupReply;
      case MessageType::kAllocate:
        return MessageType::kAllocateReply;
      case MessageType::kCommit:
        return MessageType::kCommitReply;
      case MessageType::kComplete:
      case MessageType::kFinish:
        return MessageType::kOk;
      case MessageType::kReadyLoads:
        return MessageType::kReadyLoadsReply;
      case MessageType::kStats:
        return MessageType::kStatsReply;
      case MessageType::kWaitIdle:
        return MessageType::kWaitIdleReply;
      case MessageType::kFetchChunk:
        return MessageType::kFetchChunkReply;
      case MessageType::kPublishChunk:
        return MessageType::kCommitReply;
      case MessageType::kChunkDone:
        return MessageType::kOk;
      case MessageType::kLookupBatch:
        return MessageType::kLookupBatchReply;
      default:
        return MessageType::kError;  // Not a worker's request.
    }
  }

  static std::pair<int, uint64_t> Key(const EventRef& ref) {
    return {static_cast<int>(ref.kind), ref.id};
  }

  // A new event in flight: its blocks are in range, and a store's host
  // slots are nobody else's while it writes them (a load's sources are no
  // store's destination).
  void Track(int slot, const TransferEvent& event) {
    FUZZ_CHECK(event.device_blocks.size() == event.host_blocks.size(),
               "%zu device blocks for %zu host blocks",
               event.device_blocks.size(), event.host_blocks.size());
    for (size_t i = 0; i < event.host_blocks.size(); ++i) {
      FUZZ_CHECK(event.host_blocks[i] >= 1 && event.host_blocks[i] < kHostSlots,
                 "host slot %d", event.host_blocks[i]);
      FUZZ_CHECK(
          event.device_blocks[i] >= 0 && event.device_blocks[i] < kDeviceBlocks,
          "device block %d", event.device_blocks[i]);
    }
    const bool store = event.ref.kind == EventKind::kStore;
    for (const auto& worker_events : events_) {
      for (const auto& [key, other] : worker_events) {
        if (!store && other.ref.kind != EventKind::kStore) continue;
        for (BlockId a : event.host_blocks) {
          for (BlockId b : other.host_blocks) {
            FUZZ_CHECK(a != b, "host slot %d is in a %s and a %s in flight", a,
                       EventKindName(event.ref.kind),
                       EventKindName(other.ref.kind));
          }
        }
      }
    }
    const bool added =
        events_[slot]
            .emplace(Key(event.ref), TrackedEvent{event.ref, event.host_blocks})
            .second;
    FUZZ_CHECK(added, "%s %llu handed out twice", EventKindName(event.ref.kind),
               static_cast<unsigned long long>(event.ref.id));
  }

  void CheckStore() {
    TieredStore::Locked c = store_->Lock();
    const Status pool = c->host_pool().CheckInvariants();
    FUZZ_CHECK(pool.ok(), "%s", pool.ToString().c_str());
    const CoordinatorStats stats = c->stats();
    const std::vector<EventInfo> events = c->events();
    uint64_t per_worker = 0;
    for (const WorkerStats& w : stats.workers) {
      per_worker += w.loads_in_flight + w.stores_in_flight;
    }
    FUZZ_CHECK(stats.host.events_in_flight == events.size() &&
                   per_worker == events.size(),
               "events in flight: %llu counted, %zu listed, %llu per worker",
               static_cast<unsigned long long>(stats.host.events_in_flight),
               events.size(), static_cast<unsigned long long>(per_worker));
    size_t tracked = 0;
    for (const auto& worker_events : events_) tracked += worker_events.size();
    FUZZ_CHECK(tracked == events.size(),
               "%zu events handed out are in flight, the store lists %zu",
               tracked, events.size());
    const int64_t usable = kHostSlots - 1;
    FUZZ_CHECK(
        stats.host.capacity_slots == usable && stats.host.free_slots >= 0 &&
            stats.host.free_slots <= usable && stats.host.cached_slots >= 0 &&
            stats.host.cached_slots <= usable && stats.host.used_slots >= 0 &&
            stats.host.used_slots <= usable,
        "host slots out of range: free %lld cached %lld used %lld",
        static_cast<long long>(stats.host.free_slots),
        static_cast<long long>(stats.host.cached_slots),
        static_cast<long long>(stats.host.used_slots));
  }

  std::unique_ptr<TieredStore> store_;
  WorkerId workers_[2] = {};
  // The events each worker was handed and has not completed.
  std::map<std::pair<int, uint64_t>, TrackedEvent> events_[2];
};

}  // namespace
}  // namespace tierkv::ipc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tierkv::ipc::Harness harness;
  harness.Run(std::span(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
