// ClientChunkSource: a worker's device chunk pool backed by tierkvd. Chunk
// blocks are looked up by their chunk keys in tierkvd's host and disk
// tiers, loaded into the pool's blocks, and stored from them, with the same
// load and store events as prefix blocks; every other worker of the tierkvd
// sees them. A fetch of a chunk on host and a publish each cost one
// waited-for round trip (Client::FetchChunk, PublishChunk) and the copy;
// their completion goes one-way (Client::CompleteOneWay). A chunk partly
// on disk costs a second round trip (Allocate) and waits for its
// promotions. Single flight: when workers miss one chunk at once, one
// computes it and the others' fetches wait for its publish
// (single_flight_wait). The client must be dedicated to the
// chunk pool: its device tier is the pool's memory (ChunkKvStore::memory(),
// e.g. through EmulatedDeviceTier::CreateOver) and no other caller drives it.
// Each call waits for its own copy; calls are not thread-safe.
#ifndef TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_
#define TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tierkv/chunk_source.h"
#include "tierkv/client.h"

namespace tierkv {

struct ClientChunkSourceOptions {
  // How long one fetch or publish waits for its copy (a fetch may wait for
  // promotions from disk) before it fails. A copy the device tier already
  // runs is waited for past this, up to stuck_copy_timeout more: until it
  // ends it writes (or reads) the blocks the pool would reuse. Default: 10 s.
  std::chrono::milliseconds copy_timeout{10000};
  // How much longer than copy_timeout a copy the device tier runs is waited
  // for. Past it the device tier is taken as wedged: the fetch or publish
  // fails with DeadlineExceeded, and the pool never reuses the chunk's
  // blocks (ChunkSource), so a copy that still runs costs blocks, never
  // another chunk's KV. Default: 60 s.
  std::chrono::milliseconds stuck_copy_timeout{60000};
  // How long a fetch that misses a chunk another worker is computing waits
  // for that worker's publish before it is a miss (and this worker
  // computes the chunk too). At most half the client's call_timeout.
  // Default: 1 s.
  std::chrono::milliseconds single_flight_wait{1000};
};

// Where the fetches were served from.
struct ClientChunkSourceStats {
  uint64_t fetches = 0;
  uint64_t host_hits = 0;  // Every block of the chunk on host.
  uint64_t disk_hits = 0;  // Some block promoted from the disk tier.
  uint64_t misses = 0;     // Some block in no tier.
  uint64_t failed = 0;     // Found, but a block could not be read.
  // Misses that made this worker the one to compute the chunk.
  uint64_t leases = 0;
  // Fetches that waited for another worker's publish (then a hit, or a
  // miss when the wait ran out).
  uint64_t waited = 0;
  uint64_t publishes = 0;
  // Fetches and publishes given up on while the device tier still ran
  // their copy (stuck_copy_timeout).
  uint64_t stuck_copies = 0;
};

class ClientChunkSource final : public ChunkSource {
 public:
  // `client` must outlive the tier.
  explicit ClientChunkSource(Client* client,
                             const ClientChunkSourceOptions& options = {});

  // DeadlineExceeded only for a copy given up on (stuck_copy_timeout);
  // any other deadline (a call tierkvd did not answer in time) comes as
  // Unavailable, as the blocks are then free to reuse. A publish that
  // left blocks of the chunk unstored (no free host slot, the worker's
  // caps) is ResourceExhausted, naming why.
  const KvLayout& layout() const override;  // The client's.
  StatusOr<bool> Fetch(std::span<const TokenId> chunk, int64_t virtual_start,
                       const BlockKey& variant,
                       const AllocateBlocks& allocate) override;
  Status Publish(std::span<const TokenId> chunk, int64_t virtual_start,
                 const BlockKey& variant,
                 std::span<const BlockId> blocks) override;
  // Ends this worker's compute lease on `chunk` (finishing the request of
  // the fetch that took it), if it still holds it.
  Status Abandon(std::span<const TokenId> chunk, int64_t virtual_start,
                 const BlockKey& variant) override;
  // The client copies itself (CopyMode::kClient) on a device tier of the
  // pool's blocks and block size; an EmulatedDeviceTier must be over the
  // pool's memory (CreateOver). Another device tier (a RegisteredDeviceTier)
  // is taken on its shape alone: that it is over the pool's memory cannot
  // be told through the DeviceTier interface.
  Status CheckPool(std::span<const std::byte> memory,
                   int32_t num_blocks) const override;

  const ClientChunkSourceStats& stats() const { return stats_; }

 private:
  StatusOr<bool> FetchOnce(std::span<const TokenId> chunk,
                           int64_t virtual_start, const BlockKey& variant,
                           const AllocateBlocks& allocate);
  Status PublishOnce(std::span<const TokenId> chunk, int64_t virtual_start,
                     const BlockKey& variant, std::span<const BlockId> blocks);
  // DeadlineExceeded means "a copy may still use the blocks" to the pool
  // (ChunkSource): every other one becomes Unavailable.
  Status OnlyStuckCopiesExceedTheDeadline(Status status) const;
  // A lost attachment (tierkvd died or stopped answering) is re-made
  // before the next fetch or publish, so a restarted tierkvd serves the
  // pool again.
  Status ReattachIfLost();
  // A chunk some of whose blocks are on disk: allocated, promoted and
  // loaded through the request FetchChunk left open.
  StatusOr<bool> FetchFromDisk(RequestId request,
                               std::span<const TokenId> chunk,
                               const AllocateBlocks& allocate);
  // Waits for the transfer `ref` and completes it one-way, finishing
  // request `finish` with it unless that is 0 (completing every transfer
  // that finishes meanwhile); its status, or failed_blocks > 0 as
  // DataLoss. When it does not finish in time, `finish` is finished.
  Status WaitFor(const EventRef& ref, RequestId finish);

  // The compute lease the last fetch took: the fetch's request (finishing
  // it ends the lease) and the chunk it is on. Any later fetch or publish
  // ends it in tierkvd, and forgets it here.
  struct Lease {
    RequestId request = 0;
    std::vector<TokenId> chunk;
    int64_t virtual_start = 0;
    BlockKey variant;
  };

  Client* client_;
  ClientChunkSourceOptions options_;
  std::optional<Lease> lease_;
  RequestId next_request_ = 1;
  ClientChunkSourceStats stats_;
  bool copy_stuck_ = false;  // This call gave up on a running copy.
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_
