// Embedded mode: a worker client whose store (host tier, optional disk
// tier, coordinator) runs in the engine's own process, with no tierkvd.
// For a single-process engine, tests and benchmarks; nothing is shared with
// other processes. Library: tierkv::embedded (libtierkv_embedded), which
// links RocksDB for the disk tier; an engine that only attaches to a
// tierkvd links tierkv::client alone.
#ifndef TIERKV_INCLUDE_TIERKV_EMBEDDED_H_
#define TIERKV_INCLUDE_TIERKV_EMBEDDED_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tierkv/client.h"
#include "tierkv/status.h"

namespace tierkv {

struct EmbeddedOptions {
  // Host DRAM for KV slots (private memory). Default: 256 MiB.
  size_t host_bytes = size_t{256} << 20;
  // A disk tier (a RocksDB directory, created if missing) under the host
  // slots, bounded by disk_bytes. Default (empty): none.
  std::string disk_path;
  uint64_t disk_bytes = uint64_t{4} << 30;  // Default: 4 GiB.
};

// A client of a new store in this process; options.socket_path must be
// empty. The store lives as long as the client. Errors as Client::Open,
// and the disk tier's (DiskTier::Open) when it cannot be opened.
StatusOr<std::unique_ptr<Client>> OpenEmbedded(
    const ClientOptions& options, const EmbeddedOptions& embedded = {});

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_EMBEDDED_H_
