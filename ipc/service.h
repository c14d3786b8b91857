// Dispatch: runs one decoded worker message against the coordinator and
// returns the reply (an ErrorReply for any failure). The one place where
// messages meet the coordinator, shared by tierkvd's sessions and by
// embedded mode, so both behave alike.
// Not thread-safe: REQUIRES the caller serialises access to `coordinator`.
#ifndef TIERKV_IPC_SERVICE_H_
#define TIERKV_IPC_SERVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ipc/protocol.h"
#include "src/coordinator.h"
#include "tiers/tiered_store.h"

namespace tierkv::ipc {

// `max_reply_bytes`: what the worker's channel holds. A call whose reply
// could exceed it (Allocate, Commit, PublishChunk of that many blocks) is
// refused, ResourceExhausted, before it changes anything; ReadyLoads hands
// out what fits and the worker is told of the rest (loads_ready).
Message Dispatch(Coordinator& coordinator, WorkerId worker,
                 const Message& request, size_t max_reply_bytes = SIZE_MAX);

// The longest one WaitIdle message waits, whatever it asks.
inline constexpr uint32_t kMaxWaitIdleMs = 1000;

// The longest one FetchChunk message waits for another worker's compute
// lease, whatever it asks.
inline constexpr uint32_t kMaxChunkWaitMs = 10'000;

// Dispatch against a whole store: WaitIdle waits on the store itself,
// without its mutex, at most kMaxWaitIdleMs; FetchChunk waits for another
// worker's lease without it (TieredStore::FetchChunk), at most
// kMaxChunkWaitMs and no longer once *stop is set (null: never); Complete
// and ChunkDone checksum the stored slots without it (TieredStore::
// Complete); every other message is Dispatch under the mutex.
// Thread-safe.
Message DispatchToStore(TieredStore& store, WorkerId worker,
                        const Message& request,
                        const std::atomic<bool>* stop = nullptr,
                        size_t max_reply_bytes = SIZE_MAX);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_SERVICE_H_
