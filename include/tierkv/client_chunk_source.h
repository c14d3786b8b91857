// ClientChunkSource: a worker's device chunk pool backed by tierkvd. Chunk
// blocks are looked up by their chunk keys (Client::LookupChunk) in
// tierkvd's host and disk tiers, loaded into the pool's blocks, and stored
// from them, with the same load and store events as prefix blocks; every
// other worker of the tierkvd sees them. The client must be dedicated to the
// chunk pool: its device tier is the pool's memory (ChunkKvStore::memory(),
// e.g. through EmulatedDeviceTier::CreateOver) and no other caller drives it.
// Each call waits for its own copy; calls are not thread-safe.
#ifndef TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_
#define TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_

#include <chrono>
#include <cstdint>
#include <span>

#include "tierkv/chunk_source.h"
#include "tierkv/client.h"

namespace tierkv {

struct ClientChunkSourceOptions {
  // How long one fetch or publish waits for its copy (a fetch may wait for
  // promotions from disk). Default: 10 s.
  std::chrono::milliseconds copy_timeout{10000};
};

// Where the fetches were served from.
struct ClientChunkSourceStats {
  uint64_t fetches = 0;
  uint64_t host_hits = 0;  // Every block of the chunk on host.
  uint64_t disk_hits = 0;  // Some block promoted from the disk tier.
  uint64_t misses = 0;     // Some block in no tier.
  uint64_t failed = 0;     // Found, but a block could not be read.
  uint64_t publishes = 0;
};

class ClientChunkSource final : public ChunkSource {
 public:
  // `client` must outlive the tier.
  explicit ClientChunkSource(Client* client,
                             const ClientChunkSourceOptions& options = {});

  StatusOr<bool> Fetch(std::span<const TokenId> chunk,
                       const AllocateBlocks& allocate) override;
  Status Publish(std::span<const TokenId> chunk,
                 std::span<const BlockId> blocks) override;

  const ClientChunkSourceStats& stats() const { return stats_; }

 private:
  // Waits for the transfer `ref` (completing every transfer that finishes
  // meanwhile); its status, or failed_blocks > 0 as DataLoss.
  // A lost attachment (tierkvd died or stopped answering) is re-made
  // before the next fetch or publish, so a restarted tierkvd serves the
  // pool again.
  Status ReattachIfLost();
  Status WaitFor(const EventRef& ref);

  Client* client_;
  ClientChunkSourceOptions options_;
  RequestId next_request_ = 1;
  ClientChunkSourceStats stats_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_CLIENT_CHUNK_SOURCE_H_
