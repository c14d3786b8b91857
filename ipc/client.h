// Client: the API an engine worker links against, mirroring vLLM's
// KV-connector flow (DESIGN.md, "Data path"): Lookup, Allocate, Commit,
// PollEvents, Complete, Finish. Attached to a tierkvd over its socket and a
// shared-memory control channel, or embedded: the same coordinator core in
// this process, with no daemon. The client executes the copies the
// coordinator's events ask for on its DeviceTier and pins the engine's
// device blocks while they are in flight.
// Not thread-safe: one engine thread drives a client.
#ifndef TIERKV_IPC_CLIENT_H_
#define TIERKV_IPC_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/block_key.h"
#include "src/coordinator.h"
#include "src/kv_cache_manager.h"
#include "src/kv_layout.h"
#include "src/status.h"
#include "tiers/device_tier.h"

namespace tierkv {

struct ClientOptions {
  // The tierkvd to attach to. Default (empty): embedded mode.
  std::string socket_path;
  // Embedded mode only: host DRAM for KV slots. Default: 256 MiB.
  size_t embedded_host_bytes = size_t{256} << 20;
  // Embedded mode only: a disk tier (a RocksDB directory) under the host
  // slots, bounded by embedded_disk_bytes. Default (empty): none.
  std::string embedded_disk_path;
  uint64_t embedded_disk_bytes = uint64_t{4} << 30;  // Default: 4 GiB.
  KvLayout layout;  // Required; must match the store's.
  // The model this worker runs (ValidateModelName); must match the store's
  // (tierkvd --model), so KV of one model is never served to another.
  // Default: "" (the unnamed model).
  std::string model = {};
  int32_t num_device_blocks = 0;  // Required, >= 1.
  std::string tenant;             // Default: "" (the shared tenant).
  std::string name;               // Shown by tierkv-admin.
  // The device memory copies go to and from. Default (null): an
  // EmulatedDeviceTier of num_device_blocks blocks, owned by the client.
  DeviceTier* device = nullptr;
  // The engine's main pool. When set, device blocks in a transfer are
  // pinned in it until Complete (seed 004's transfer protection).
  KVCacheManager* engine = nullptr;
};

// A transfer whose copy has finished (or failed) on the device tier; hand
// it to Complete so the coordinator can publish or release its slots.
struct FinishedTransfer {
  TransferEvent event;
  Status status;
};

class Client {
 public:
  // Unavailable when no tierkvd answers on the socket; PermissionDenied when
  // this user may not use it; FailedPrecondition naming both layouts, or
  // both models, when the store serves another.
  static StatusOr<std::unique_ptr<Client>> Open(const ClientOptions& options);
  ~Client();  // Waits for copies in flight; tierkvd drops the rest.

  // See Coordinator for the semantics of each call.
  StatusOr<LookupResult> Lookup(RequestId request,
                                std::span<const TokenId> tokens,
                                int32_t num_computed_tokens = 0,
                                const RequestExtras& extras = {});
  StatusOr<LookupResult> LookupChunk(RequestId request,
                                     std::span<const TokenId> tokens);
  // Also starts the load's copy, or, when the load is pending (promotions
  // from disk), keeps it until tierkvd reports it ready: PollEvents and
  // WaitEvents start it then.
  StatusOr<AllocateResult> Allocate(RequestId request,
                                    std::span<const BlockId> device_blocks,
                                    int32_t num_external_tokens);
  // Also starts the stores' copies.
  StatusOr<CommitResult> Commit(RequestId request, int32_t num_computed_tokens,
                                std::span<const BlockId> device_blocks);
  // Transfers whose copies finished; never blocks. Also starts the copies
  // of pending loads that became ready. A load whose event has
  // failed_blocks > 0 loaded only its first blocks; the engine recomputes
  // the rest.
  std::vector<FinishedTransfer> PollEvents();
  // As PollEvents, waiting up to `timeout` for at least one.
  std::vector<FinishedTransfer> WaitEvents(std::chrono::milliseconds timeout);
  // Reports finished transfers, then unpins their device blocks.
  Status Complete(std::span<const FinishedTransfer> finished);
  Status Finish(RequestId request);
  StatusOr<CoordinatorStats> Stats();

  WorkerId worker_id() const;
  bool embedded() const;
  const KvLayout& layout() const;
  DeviceTier& device();
  // Host slot memory (for checks; engines never need it).
  const std::byte* host_slot(BlockId slot) const;
  size_t transfers_in_flight() const;
  // Loads waiting for promotions from disk.
  size_t loads_pending() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv

#endif  // TIERKV_IPC_CLIENT_H_
