// Client: the API an engine worker links against, mirroring vLLM's
// KV-connector flow (DESIGN.md, "Data path"): Lookup, Allocate, Commit,
// PollEvents, Complete, Finish. Attached to a tierkvd over its socket and a
// shared-memory control channel (Open; library tierkv::client), or embedded:
// the same store in this process, with no daemon (OpenEmbedded in
// tierkv/embedded.h; library tierkv::embedded). The client executes the
// coordinator's events ask for on its DeviceTier and pins the engine's
// device blocks while they are in flight.
// Not thread-safe: one engine thread drives a client.
//
// Invariant: a device block receives bytes only while the transfer that
// writes it pins it. A load's destination blocks are pinned in the engine's
// KVCacheManager (ClientOptions::engine) from Allocate until the load is
// completed (Complete) or cancelled (Finish of its request while the load
// still waits for promotions, a lost tierkvd, or ~Client); no copy ever
// starts into a block that is not pinned so.
//
// Every call to tierkvd has a deadline (ClientOptions::call_timeout). A
// call that misses it returns DeadlineExceeded; a tierkvd that died makes
// it Unavailable, and so does a tierkvd that ended the attachment (a
// scheduler with an attachment tag that lost a rank, see
// ClientOptions::attachment_tag). Either way the attachment is lost: later
// calls return Unavailable, loads still waiting for promotions come back from
// PollEvents / WaitEvents failed (status Unavailable, nothing copied), and
// Reconnect attaches to tierkvd again (a restarted one, or the same one
// once it answers) as a new worker. On the loss the client waits for the
// copies already running (their completions are handed out as usual, and
// Complete then only unpins) and closes the socket, so a tierkvd that was
// only slow releases the old worker's pins at once. With copies = caller
// the engine runs the copies: the socket, and with it tierkvd's pins on
// their host slots, stays until the engine has completed every event
// handed to it, and Reconnect is refused until then. A rank client that
// copies for itself (copies = caller, scheduler set) is not handed its
// events by this client, so this does not hold for it: its engine must
// let its copies end before a call can time out (a long call_timeout).
#ifndef TIERKV_INCLUDE_TIERKV_CLIENT_H_
#define TIERKV_INCLUDE_TIERKV_CLIENT_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/device_tier.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/kv_layout.h"
#include "tierkv/stats.h"
#include "tierkv/status.h"
#include "tierkv/transfer.h"
#include "tierkv/types.h"

namespace tierkv {

struct EmbeddedOptions;  // tierkv/embedded.h
namespace ipc {
class InProcessStore;
}

// Who runs the copies of a client's transfer events.
enum class CopyMode : uint8_t {
  // The client, on its DeviceTier (ClientOptions::device): Allocate and
  // Commit start them, PollEvents and WaitEvents hand them back finished.
  kClient = 0,
  // The engine, in this process, with its own means (a CUDA engine: its
  // own streams): Allocate, Commit and TakeReadyLoads hand the events out
  // uncopied; the engine copies between its device blocks and host_block()
  // views of the store's slots, then calls Complete with each event's
  // FinishedTransfer (its status says whether the copy succeeded).
  kCaller = 1,
  // Rank clients in other processes (ClientOptions::scheduler): this client
  // is a scheduler that decides (lookups, allocation, commit, finish) and
  // owns no device memory. The engine passes each event it hands out to
  // every rank (vLLM: in the connector metadata); each rank copies its shard
  // of the KV heads and completes the event for itself. tierkvd completes
  // the event once every rank has (failed if any rank failed or died).
  kRanks = 2,
};
const char* CopyModeName(CopyMode mode);  // "client", "caller", "ranks"

struct ClientOptions {
  // The tierkvd to attach to (tierkvd --socket). Required by Open;
  // OpenEmbedded (tierkv/embedded.h) runs a store in this process instead.
  std::string socket_path;
  // Who may answer on socket_path. Before it sends anything, the client
  // checks the listener's user (SO_PEERCRED): this process's user, root,
  // the owner of the socket's directory when no one else can write there
  // (tierkvd's /run/tierkv), or this uid. Default: none beyond those.
  std::optional<uid_t> daemon_uid;
  KvLayout layout;  // Required; must match the store's.
  // The model this worker runs (ValidateModelName); must match the store's
  // (tierkvd --model), so KV of one model is never served to another.
  // Default: "" (the unnamed model).
  std::string model = {};
  int32_t num_device_blocks = 0;  // Required, >= 1.
  std::string tenant;             // Default: "" (the shared tenant).
  std::string name;               // Shown by tierkv-admin.
  // The device memory copies go to and from, driven by this client alone
  // (two clients on one device tier would take each other's finished
  // copies). Default (null): an EmulatedDeviceTier of num_device_blocks
  // blocks, owned by the client.
  DeviceTier* device = nullptr;
  // The engine's main pool. When set, device blocks in a transfer are
  // pinned in it until Complete (transfer protection, as vLLM's
  // SimpleCPUOffloadConnector does it); it must
  // outlive the client.
  KVCacheManager* engine = nullptr;
  // Who copies this client's events (CopyMode). kCaller and kRanks use no
  // device tier: device and engine must be null. Default: kClient.
  CopyMode copies = CopyMode::kClient;
  // kRanks: the rank clients that copy each event, 1 to kMaxRanks
  // (vLLM's tensor-parallel size). Otherwise 0.
  int32_t ranks = 0;
  // A rank client: the worker_id() of the kRanks scheduler whose events it
  // copies (same user, tenant, model and layout), and its rank in
  // [0, ranks). It makes no lookups of its own: Start runs the copy of
  // each event the engine passes it, on `device` (for tensor parallelism a
  // RegisteredDeviceTier over this rank's shard of the heads), and
  // Complete reports its part. Default: 0, not a rank client.
  WorkerId scheduler = 0;
  int32_t rank = 0;
  // kRanks: a token the engine draws for this attachment (vLLM's
  // connector: its epoch). A rank client: its scheduler's token, or Open
  // fails with NotFound before anything registers (a restarted tierkvd
  // numbers workers from 1 again, so `scheduler` alone may name another
  // engine's scheduler). Empty: not checked. A scheduler with a tag does
  // not Reconnect (FailedPrecondition): a new attachment opens a new
  // client with a new tag. Its attachment ends when tierkvd drops one of
  // its ranks (the rank exited, or lost its attachment): the engine hands
  // its events to ranks by its own path, and one handed to a rank that
  // attached again may name slots reused since. tierkvd then fails every
  // event still waiting for a rank, answers the scheduler's next Lookup,
  // Allocate, Commit or TakeReadyLoads with Unavailable, and attaches no
  // rank for it (FailedPrecondition). The client takes that Unavailable as
  // a lost attachment (connected() turns false, the socket closes and
  // tierkvd releases its pins): open a new client with a new tag, as for
  // a lost tierkvd. Without a tag a new rank may take the place of a
  // dropped one. Default: "".
  std::string attachment_tag;
  // How long one call may wait for tierkvd (registration included, from
  // the connect on: a tierkvd whose listen queue is full) before it fails
  // with DeadlineExceeded. Default: 5 s.
  std::chrono::milliseconds call_timeout = std::chrono::seconds(5);
};

// A transfer whose copy has finished (or failed) on the device tier, or a
// load that never started because tierkvd was lost; hand it to Complete so
// the coordinator can publish or release its slots and the client unpins
// its device blocks.
struct FinishedTransfer {
  TransferEvent event;
  Status status;
  // The attachment it belongs to (Client::session); Complete reports it to
  // tierkvd only while that attachment lasts.
  uint64_t session = 0;

  // Load: leading blocks of event.device_blocks that now hold the loaded
  // KV (0 when the copy failed); the engine recomputes from the next one.
  int32_t loaded_blocks() const {
    return status.ok() ? static_cast<int32_t>(event.device_blocks.size()) : 0;
  }
};

// Messages a client has exchanged with its store (Client::call_counts).
struct ClientCallCounts {
  uint64_t calls = 0;  // Round trips the caller waited for.
  uint64_t posts = 0;  // Messages sent one-way (CompleteOneWay).
  // Of those, answered with an error (Client::last_post_error says the
  // last one). The call that collected it goes on regardless.
  uint64_t post_errors = 0;
  // Token ids the lookups sent. Lookup of a request asked before sends
  // only those after the ones that did not change since its last Lookup.
  uint64_t lookup_tokens_sent = 0;
};

class Client {
 public:
  // Attaches to the tierkvd on options.socket_path (InvalidArgument when
  // it is empty). Unavailable when no tierkvd answers on the socket;
  // PermissionDenied when this user may not use it; FailedPrecondition naming
  // both layouts, or both models, when the store serves another.
  // DeadlineExceeded when tierkvd does not accept the connection or answer
  // within call_timeout.
  static StatusOr<std::unique_ptr<Client>> Open(const ClientOptions& options);
  // Waits for copies in flight, then unpins every device block the client
  // still pins in the engine, those of transfers PollEvents or WaitEvents
  // handed out and the engine has not completed included (the engine
  // completes them before, which also tells tierkvd). tierkvd drops the
  // rest when the socket closes. With copies = caller the
  // engine's copies must have ended first: the host slots they use are
  // unmapped here and released to other workers.
  ~Client();

  // See Coordinator for the semantics of each call.
  StatusOr<LookupResult> Lookup(RequestId request,
                                std::span<const TokenId> tokens,
                                int32_t num_computed_tokens = 0,
                                const RequestExtras& extras = {});
  // The lookups of a scheduler step (each as Lookup would do it, in order)
  // in as few round trips as the control channel allows: one unless the
  // batch's tokens exceed the channel's capacity (1 MiB by default, 256Ki
  // tokens). One result per query; one lookup failing (e.g. past a cap)
  // does not stop the others. The call itself fails only when the store
  // cannot be reached (then some lookups may have been done).
  StatusOr<std::vector<StatusOr<LookupResult>>> LookupBatch(
      std::span<const LookupQuery> queries);
  // A chunk's keys include the RoPE position its KV is computed at
  // (`virtual_start`, ChunkKvStoreOptions::virtual_start) and its variant
  // (ChunkVariant: the RoPE config and what else changes its KV): KV
  // computed at one position or variant is never served to a worker that
  // asks for another.
  StatusOr<LookupResult> LookupChunk(RequestId request,
                                     std::span<const TokenId> tokens,
                                     int64_t virtual_start = 0,
                                     const BlockKey& variant = {});
  // Also pins the load's device blocks and starts its copy, or, when the
  // load is pending (promotions from disk), keeps it until tierkvd reports
  // it ready: PollEvents and WaitEvents start it then (and unpin the blocks
  // of a load cut short).
  StatusOr<AllocateResult> Allocate(RequestId request,
                                    std::span<const BlockId> device_blocks,
                                    int32_t num_external_tokens);
  // Also starts the stores' copies.
  StatusOr<CommitResult> Commit(RequestId request, int32_t num_computed_tokens,
                                std::span<const BlockId> device_blocks);
  // Transfers whose copies finished; never blocks. Also starts the copies
  // of pending loads that became ready. A load whose event has
  // failed_blocks > 0 loaded only its first blocks; the engine recomputes
  // the rest. tierkvd signals when pending loads are ready (a pipe
  // passed at registration): only then, or once a call_timeout has passed
  // without a signal (so a wedged tierkvd is found), is it asked for them.
  std::vector<FinishedTransfer> PollEvents();
  // Where `tokens` (with `extras`) are cached on this client's tierkvd, for
  // a router: what a lookup by a worker of this client's tenant would find
  // now, and that tenant's workers attached. Pins nothing and keeps no
  // request (tierkv-admin route asks several tierkvd the same).
  StatusOr<RouteResult> Route(std::span<const TokenId> tokens,
                              const RequestExtras& extras = {});
  // As PollEvents, waiting up to `timeout` for at least one. It sleeps
  // until a copy completes (DeviceTier::SetCompletionNotify), tierkvd
  // signals ready loads, or, with loads pending, tierkvd's socket closes
  // (the loads then come back failed at once); it sends nothing to tierkvd
  // while it waits. Before it sleeps, copies still queued on a device tier
  // whose copies are memcpy (emulated, registered) run on the calling
  // thread (DeviceTier::RunQueuedCopies), so a copy that is long may take
  // it past `timeout`.
  std::vector<FinishedTransfer> WaitEvents(std::chrono::milliseconds timeout);
  // Reports finished transfers, then unpins their device blocks. A rank
  // client reports its part: tierkvd completes an event once every rank of
  // its scheduler has. FailedPrecondition for a kRanks scheduler: its ranks
  // complete its events. Each transfer is completed once: one this client
  // does not owe (completed already, or never handed out by PollEvents,
  // WaitEvents or, with copies = caller, the calls that return events) is
  // skipped, nothing unpinned, and the others are completed; then
  // InvalidArgument. (A rank client with copies = caller gets its events
  // from its scheduler, so it cannot tell.)
  Status Complete(std::span<const FinishedTransfer> finished);
  // kCaller and kRanks: the pending loads tierkvd reports ready since the
  // last call (possibly cut short: failed_blocks), to copy now like a load
  // Allocate returned. Never blocks. Empty in kClient mode, where
  // PollEvents and WaitEvents start them.
  StatusOr<std::vector<TransferEvent>> TakeReadyLoads();
  // A rank client: pins the event's device blocks (in `engine`, when set)
  // and starts its copy of this rank's shard; PollEvents and WaitEvents
  // hand it back finished. The event is one its scheduler handed out,
  // started once: AlreadyExists, with nothing pinned or reported, while
  // this rank still copies it or has not completed it. (Once completed,
  // its host slots are tierkvd's again: starting it then is the engine's
  // bug, which this client cannot tell from a new event.)
  // InvalidArgument for block ids out of range, with this rank's part
  // reported failed; FailedPrecondition for a client that is not a rank
  // client.
  Status Start(const TransferEvent& event);
  // A rank client: reports its part of each of `events`, ones its
  // scheduler handed out, as failed without copying them (the rank was not
  // attached when they came, say), in one round trip; tierkvd fails each
  // once every rank has reported, and releases its slots. Without it an
  // event would wait for this rank's part for good. AlreadyExists, with
  // nothing reported, when this rank has started one of them and not
  // completed it; FailedPrecondition for a client that is not a rank
  // client.
  Status Decline(std::span<const TransferEvent> events);
  // The bytes of host slot `slot` in the store's shared memory, for the
  // engine's own copies (kCaller, or a rank client that copies itself);
  // valid while the attachment lasts. OutOfRange for the null slot 0 and
  // slots past the store's.
  StatusOr<std::span<std::byte>> host_block(BlockId slot);
  // Also cancels the request's loads that wait for promotions (an aborted
  // or preempted request): they are never copied, and their device blocks
  // are unpinned at once. Loads being copied finish and are completed as
  // usual.
  Status Finish(RequestId request);
  // Position-independent chunks in one round trip each
  // (ClientChunkSource). FetchChunk looks the chunk up by content; when
  // host DRAM holds every block of it, calls `allocate` for one device
  // block per chunk block and (copies = client) starts the load into
  // them: the result's load, whose request tierkvd has finished already.
  // `allocate` is not called otherwise, nor when the load was cut short
  // (its failed_blocks > 0, verify_on_load: released, nothing copied). A
  // chunk partly on the disk tier is a hit without a load: its request
  // stays open for Allocate, as after LookupChunk. On a miss,
  // result.lease says whether this worker is the one to compute and
  // publish it; a miss while another worker computes it waits for that
  // worker's publish, at most `wait` (and half of call_timeout).
  // An error from `allocate` is returned, the load released. The copies of
  // FetchChunk and PublishChunk are for a caller that waits for them at
  // once (DeviceTier::SubmitForWaiter): WaitEvents runs them on the
  // calling thread; any other call (PollEvents included) first wakes the
  // device tier's copy thread for them.
  using AllocateDeviceBlocks =
      std::function<StatusOr<std::vector<BlockId>>(int32_t n)>;
  StatusOr<ChunkFetchResult> FetchChunk(RequestId request,
                                        std::span<const TokenId> tokens,
                                        std::chrono::milliseconds wait,
                                        const AllocateDeviceBlocks& allocate,
                                        int64_t virtual_start = 0,
                                        const BlockKey& variant = {});
  // Stores the chunk's blocks tierkvd lacks from `device_blocks` (one per
  // chunk block): LookupChunk, Allocate, Commit and Finish in one round
  // trip; starts the stores' copies (copies = client).
  StatusOr<CommitResult> PublishChunk(RequestId request,
                                      std::span<const TokenId> tokens,
                                      std::span<const BlockId> device_blocks,
                                      int64_t virtual_start = 0,
                                      const BlockKey& variant = {});
  // Complete, then Finish(finish) unless it is 0, in one message sent
  // without waiting for the answer: the next call collects it first. An
  // error in it is counted (post_errors) and kept (last_post_error), but
  // does not fail that next call, which may itself complete or finish what
  // would otherwise stay pinned. Unpins the device blocks at once, and
  // skips a transfer not owed, as Complete does.
  Status CompleteOneWay(std::span<const FinishedTransfer> finished,
                        RequestId finish = 0);
  const ClientCallCounts& call_counts() const;
  // The last one-way message tierkvd refused, naming it; OK if none was.
  const Status& last_post_error() const;

  StatusOr<CoordinatorStats> Stats();
  // Waits until the store's disk tier has nothing in flight: every spill
  // and promotion started has finished and is applied, so stats and
  // lookups see a settled store (for tests, benchmarks and orderly drains;
  // serving never needs it). DeadlineExceeded when the store is still busy
  // after `timeout`; unlike a missed call deadline, that keeps the
  // attachment (connected() stays true). Other workers may start more work
  // meanwhile.
  Status WaitIdle(std::chrono::milliseconds timeout);

  // After a lost attachment (any call returned Unavailable or
  // DeadlineExceeded): waits for the copies in flight, then registers
  // with tierkvd again as a new worker. Requests of the old attachment are
  // gone there: the engine finishes them locally and looks new ones up.
  // OK at once when attached and healthy, or embedded. Unavailable (or
  // DeadlineExceeded) when tierkvd does not answer yet: call it again.
  // FailedPrecondition for a rank client whose attachment was lost: a
  // restarted tierkvd numbers workers and events anew, so the rank opens a
  // new client for its scheduler's new worker id instead. FailedPrecondition
  // too (copies = caller) while events handed to the engine before the
  // loss are not completed: their copies may still use the old attachment's
  // slots, and the new attachment numbers its events anew.
  Status Reconnect();
  // False once the attachment is lost, until Reconnect succeeds.
  bool connected() const;
  // OK while attached; once the attachment is lost, the Unavailable every
  // call returns, naming the failure that lost it.
  const Status& connection_status() const;
  // Counts attachments: 1 after Open, one more per successful Reconnect.
  uint64_t session() const;

  WorkerId worker_id() const;
  CopyMode copies() const;
  bool embedded() const;
  const KvLayout& layout() const;
  // The device tier copies run on; null when the engine copies (kCaller,
  // kRanks).
  DeviceTier* device();
  size_t transfers_in_flight() const;
  // Whether a copy of `ref`, of this attachment, runs on device() now: its
  // device blocks are still being written (a load) or read (a store).
  bool copying(const EventRef& ref) const;
  // Loads waiting for promotions from disk.
  size_t loads_pending() const;

 private:
  friend StatusOr<std::unique_ptr<Client>> OpenEmbedded(
      const ClientOptions& options, const EmbeddedOptions& embedded);
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  // WaitEvents before the transfers are recorded as handed out.
  std::vector<FinishedTransfer> WaitForEvents(
      std::chrono::milliseconds timeout);
  static StatusOr<std::unique_ptr<Impl>> NewImpl(const ClientOptions& options);
  // An embedded client over `store`, for OpenEmbedded (which has checked
  // that options.socket_path is empty).
  static StatusOr<std::unique_ptr<Client>> OpenInProcess(
      const ClientOptions& options, std::unique_ptr<ipc::InProcessStore> store);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_CLIENT_H_
