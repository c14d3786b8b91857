// The types of the coordinator's calls that engines never see: a worker's
// registration and an operator's orders (clear, evict, the list of events
// in flight). The worker client and tierkv-admin speak them over the wire
// (ipc/protocol.h); the coordinator (src/coordinator.h) serves them.
#ifndef TIERKV_SRC_COORDINATOR_TYPES_H_
#define TIERKV_SRC_COORDINATOR_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/kv_layout.h"
#include "tierkv/transfer.h"
#include "tierkv/types.h"

namespace tierkv {

struct WorkerRegistration {
  KvLayout layout;
  std::string model = {};         // The model it runs. Default: "" (unnamed).
  int32_t num_device_blocks = 0;  // Block ids the worker may name: [0, n).
  std::string tenant;             // Tenants never share keys.
  int32_t pid = 0;
  // The worker's user: tierkvd takes it from the socket's peer
  // credentials. Caps count workers per uid.
  uint32_t uid = 0;
  // The uid is tierkvd's own, root or in --admin-group (the server decides,
  // as it does the uid): not held to max_tenants_per_uid.
  bool operator_uid = false;
  std::string name;  // For people: shown by tierkv-admin.
  // A scheduler (ClientOptions::copies = kRanks): its events are copied by
  // this many rank workers and complete once each of them has completed
  // them. 0: the worker completes its own events.
  int32_t ranks = 0;
  // A rank worker: the scheduler whose events it copies, and its rank in
  // [0, that scheduler's ranks). 0: not a rank worker.
  WorkerId scheduler = 0;
  int32_t rank = 0;
  // A scheduler: a token the engine draws for this attachment. A rank
  // worker: its scheduler's, or it is refused (NotFound) before it
  // registers; empty: not checked. Worker ids start over in a restarted
  // tierkvd, so the id alone may name another engine's scheduler. A
  // scheduler with a tag ends its attachment when it loses a rank
  // (Coordinator, "Split roles").
  std::string attachment_tag = {};
};

// The tiers an operator's Clear empties.
enum class TierSelection : uint8_t { kHost = 1, kDisk = 2, kAll = 3 };
const char* TierSelectionName(TierSelection tiers);  // "host", "disk", "all"

struct ClearResult {
  uint64_t host_dropped = 0;
  // Host blocks kept because something pins them: keyed slots held by
  // lookups or loads, and slots a store or promotion is writing. A block
  // only its spill pins is dropped (host_dropped): see Coordinator::Clear.
  uint64_t host_kept_pinned = 0;
  // Per lower medium, whether there was one to clear (`--tier disk` clears
  // every tier below host) and what it dropped: the disk tier's blocks, the
  // keys the remote tier knew. A block both held counts in each.
  uint64_t disk_dropped = 0;
  bool disk_cleared = false;
  // The disk tier takes no writes until tierkvd restarts (a write failed,
  // or it opened read-only): what it dropped was forgotten, not deleted,
  // and the next start serves it again.
  bool disk_undeleted = false;
  uint64_t remote_dropped = 0;
  bool remote_cleared = false;
};

// What Evict did with one key.
struct EvictedBlock {
  BlockKey key;
  // Dropped from host, including a block whose spill was in flight: lookups
  // miss it at once, and nothing of it stays once the spill finishes.
  bool host_dropped = false;
  // Kept on host: pinned by a worker, or a store or promotion of it is in
  // flight (it is keyed on host when that completes).
  bool host_pinned = false;
  bool disk_dropped = false;
  // Dropped from disk while its writes were stopped (ClearResult's
  // disk_undeleted): the next start serves it again.
  bool disk_undeleted = false;
  bool remote_dropped = false;  // The remote tier knew it; its key deleted.
  friend bool operator==(const EvictedBlock&, const EvictedBlock&) = default;
};
// For people: "dropped from " the tiers that held it ("host", "host and
// disk", "host, disk and remote", ...), "pinned, kept" (then "; dropped
// from disk" or the like if a lower tier held it), or "not cached".
std::string EvictedBlockSummary(const EvictedBlock& block);

// The keys each tier serves (Coordinator::HeldKeys): the host tier's keyed
// slots, the disk tier's stored blocks and the remote tier's (those this
// store wrote), each list in no set order and cut at a bound; the totals
// count them all.
struct HeldKeys {
  uint64_t host_total = 0;
  uint64_t disk_total = 0;
  uint64_t remote_total = 0;
  std::vector<BlockKey> host;
  std::vector<BlockKey> disk;
  std::vector<BlockKey> remote = {};
};

// Where a transfer event in flight stands (see the state list above).
enum class EventState : uint8_t { kPromoting = 1, kReady = 2, kCopying = 3 };

const char* EventStateName(EventState state);  // "promoting", ...

// One transfer event in flight, for people (tierkv-admin events).
struct EventInfo {
  WorkerId worker = 0;
  std::string worker_name;
  EventRef ref;
  RequestId request = 0;
  // Blocks it copies; a load cut short by failed promotions copies those
  // before the cut.
  uint32_t blocks = 0;
  EventState state = EventState::kCopying;
  uint64_t age_us = 0;  // Since Allocate or Commit created it.
};

}  // namespace tierkv

#endif  // TIERKV_SRC_COORDINATOR_TYPES_H_
