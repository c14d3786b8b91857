#include "ipc/service.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <type_traits>

namespace tierkv::ipc {
namespace {

template <typename Reply, typename T>
Message Wrap(StatusOr<T> result) {
  if (!result.ok()) return ErrorReply{result.status()};
  return Reply{std::move(*result)};
}

Message Wrap(Status status) {
  if (!status.ok()) return ErrorReply{std::move(status)};
  return OkReply{};
}

// A batched lookup's result, its error message cut to kMaxBatchErrorBytes
// so that a batch's reply stays within what the client sized it for.
StatusOr<LookupResult> BatchedResult(StatusOr<LookupResult> result) {
  if (result.ok() || result.status().message().size() <= kMaxBatchErrorBytes) {
    return result;
  }
  return Status(result.status().code(),
                result.status().message().substr(0, kMaxBatchErrorBytes));
}

// Each lookup of a batch, in order, through `lookup` (which reaches the
// coordinator as its caller does).
template <typename LookupOne>
LookupBatchReply LookupEach(const LookupBatchRequest& batch, LookupOne lookup) {
  LookupBatchReply reply;
  reply.results.reserve(batch.lookups.size());
  for (const LookupRequest& l : batch.lookups) {
    reply.results.push_back(BatchedResult(lookup(l)));
  }
  return reply;
}

// One lookup: all its tokens, or what changed since the request's last.
StatusOr<LookupResult> LookupOne(Coordinator& c, WorkerId worker,
                                 const LookupRequest& l) {
  if (l.kept_tokens == 0) {
    return c.Lookup(worker, l.request, l.tokens, l.num_computed_tokens,
                    l.extras);
  }
  return c.LookupAgain(worker, l.request, l.kept_tokens, l.kept_tag, l.tokens,
                       l.num_computed_tokens, l.extras);
}

// Bytes an event takes in a reply (wire.cc's Put: kind, id, request, its
// device and host block lists, failed blocks) for `blocks` blocks.
size_t EventReplyBytes(size_t blocks) { return 33 + 8 * blocks; }

// Room kept in every reply for the rest of it: frame header, counts, a
// status message.
inline constexpr size_t kReplyReserveBytes = 8192;

// The most blocks the one event a reply to `request` can carry names: an
// Allocate's, Commit's or PublishChunk's device blocks; a chunk fetch's
// tokens (a block per chunk block, at most one per token). 0 for calls
// whose replies carry no event, or whose events are bounded apart
// (ReadyLoads).
size_t ReplyBlocksBound(const Message& request) {
  return std::visit(
      [](const auto& m) -> size_t {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, AllocateRequest> ||
                      std::is_same_v<T, CommitRequest> ||
                      std::is_same_v<T, PublishChunkRequest>) {
          return m.device_blocks.size();
        } else if constexpr (std::is_same_v<T, FetchChunkRequest>) {
          return m.tokens.size();
        } else {
          return 0;
        }
      },
      request);
}

// OK when a reply to `request` fits in `max_reply_bytes`; else the call is
// refused before it changes anything: a reply that does not fit could not
// tell the worker of the events it made.
Status CheckReplyRoom(const Message& request, size_t max_reply_bytes) {
  const size_t blocks = ReplyBlocksBound(request);
  if (EventReplyBytes(blocks) + kReplyReserveBytes <= max_reply_bytes) {
    return Status::Ok();
  }
  return Status::ResourceExhausted(
      "a call of " + std::to_string(blocks) +
      " blocks needs a reply larger than the control channel's " +
      std::to_string(max_reply_bytes) + " bytes");
}

// Dispatch once the reply's room is checked.
Message DispatchChecked(Coordinator& c, WorkerId worker, const Message& request,
                        size_t max_reply_bytes) {
  return std::visit(
      [&](const auto& m) -> Message {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, LookupRequest>) {
          StatusOr<LookupResult> result = LookupOne(c, worker, m);
          if (!result.ok()) return ErrorReply{result.status()};
          return LookupReply{*result, c.TokensTag(worker, m.request)};
        } else if constexpr (std::is_same_v<T, LookupBatchRequest>) {
          return LookupEach(m, [&](const LookupRequest& l) {
            return LookupOne(c, worker, l);
          });
        } else if constexpr (std::is_same_v<T, LookupChunkRequest>) {
          return Wrap<LookupReply>(c.LookupChunk(worker, m.request, m.tokens,
                                                 m.virtual_start, m.variant));
        } else if constexpr (std::is_same_v<T, AllocateRequest>) {
          return Wrap<AllocateReply>(c.Allocate(
              worker, m.request, m.device_blocks, m.num_external_tokens));
        } else if constexpr (std::is_same_v<T, CommitRequest>) {
          return Wrap<CommitReply>(c.Commit(
              worker, m.request, m.num_computed_tokens, m.device_blocks));
        } else if constexpr (std::is_same_v<T, CompleteRequest>) {
          return Wrap(c.Complete(worker, m.events));
        } else if constexpr (std::is_same_v<T, FinishRequest>) {
          return Wrap(c.Finish(worker, m.request));
        } else if constexpr (std::is_same_v<T, ReadyLoadsRequest>) {
          // As many as one reply holds; the worker is told of the rest.
          size_t bytes = kReplyReserveBytes;
          return Wrap<ReadyLoadsReply>(c.TakeReadyLoads(
              worker, [&bytes, max_reply_bytes](const TransferEvent& e) {
                bytes += EventReplyBytes(e.host_blocks.size());
                return bytes <= max_reply_bytes;
              }));
        } else if constexpr (std::is_same_v<T, FetchChunkRequest>) {
          // No one to wait for here: a busy lease is a miss (waited).
          StatusOr<Coordinator::ChunkFetch> fetch = c.FetchChunk(
              worker, m.request, m.tokens, m.virtual_start, m.variant);
          if (!fetch.ok()) return ErrorReply{fetch.status()};
          fetch->result.waited = fetch->busy;
          return FetchChunkReply{std::move(fetch->result)};
        } else if constexpr (std::is_same_v<T, PublishChunkRequest>) {
          return Wrap<CommitReply>(c.PublishChunk(worker, m.request, m.tokens,
                                                  m.device_blocks,
                                                  m.virtual_start, m.variant));
        } else if constexpr (std::is_same_v<T, ChunkDoneRequest>) {
          // Finished whatever the completions say: nothing left open.
          Status s = c.Complete(worker, m.events);
          Status f = m.finish == 0 ? Status::Ok() : c.Finish(worker, m.finish);
          return Wrap(!s.ok() ? std::move(s) : std::move(f));
        } else if constexpr (std::is_same_v<T, RouteRequest>) {
          // The worker's own tenant, whatever the message names.
          return Wrap<RouteReply>(c.Route(worker, m.tokens, m.extras));
        } else if constexpr (std::is_same_v<T, StatsRequest>) {
          return Wrap<StatsReply>(c.StatsSeenBy(worker));
        } else {
          return ErrorReply{Status::InvalidArgument(
              std::string(MessageTypeName(TypeOf(request))) +
              " is not a request a worker channel accepts")};
        }
      },
      request);
}

}  // namespace

Message Dispatch(Coordinator& c, WorkerId worker, const Message& request,
                 size_t max_reply_bytes) {
  if (Status room = CheckReplyRoom(request, max_reply_bytes); !room.ok()) {
    return ErrorReply{std::move(room)};
  }
  return DispatchChecked(c, worker, request, max_reply_bytes);
}

Message DispatchToStore(TieredStore& store, WorkerId worker,
                        const Message& request, const std::atomic<bool>* stop,
                        size_t max_reply_bytes) {
  if (Status room = CheckReplyRoom(request, max_reply_bytes); !room.ok()) {
    return ErrorReply{std::move(room)};
  }
  if (const auto* fetch = std::get_if<FetchChunkRequest>(&request)) {
    const auto wait = std::chrono::milliseconds(
        std::min<uint32_t>(fetch->wait_ms, kMaxChunkWaitMs));
    return Wrap<FetchChunkReply>(
        store.FetchChunk(worker, fetch->request, fetch->tokens,
                         fetch->virtual_start, fetch->variant, wait, stop));
  }
  if (const auto* done = std::get_if<ChunkDoneRequest>(&request)) {
    // Checksums of the stored slots are taken without the mutex. Finished
    // whatever the completions say: nothing is left open.
    Status s = store.Complete(worker, done->events);
    Status f = done->finish == 0 ? Status::Ok()
                                 : store.Lock()->Finish(worker, done->finish);
    return Wrap(!s.ok() ? std::move(s) : std::move(f));
  }
  if (const auto* wait = std::get_if<WaitIdleRequest>(&request)) {
    // Bounded here whatever the worker asked: its session thread must come
    // back to notice a closed channel or a stop (Client::WaitIdle asks
    // again until its own timeout).
    const auto timeout = std::chrono::milliseconds(
        std::min<uint32_t>(wait->timeout_ms, kMaxWaitIdleMs));
    return WaitIdleReply{store.WaitIdle(timeout)};
  }
  if (const auto* batch = std::get_if<LookupBatchRequest>(&request)) {
    // One lookup per hold of the store's mutex: a batch of thousands must
    // not stall other workers and the tier thread for its whole length.
    return LookupEach(*batch, [&](const LookupRequest& l) {
      return LookupOne(*store.Lock(), worker, l);
    });
  }
  if (const auto* complete = std::get_if<CompleteRequest>(&request)) {
    // Checksums of the stored slots are taken without the mutex.
    return Wrap(store.Complete(worker, complete->events));
  }
  return DispatchChecked(*store.Lock(), worker, request, max_reply_bytes);
}

}  // namespace tierkv::ipc
