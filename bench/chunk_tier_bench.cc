// A chunk through tierkvd: what a worker's chunk pool pays to fetch a chunk
// from tierkvd's host tier, or to publish one it computed, against copying
// the chunk's bytes.
//
// Setup: an ipc::Server in this process (tierkvd's machinery, a 256 MiB host
// tier, no disk) and a worker Client attached to it whose device tier is an
// EmulatedDeviceTier over a pool arena, driven by a ClientChunkSource, as a
// worker's ChunkKvStore drives it. The layout is the demo's: 4 layers, 2 KV
// heads of 32 dims, f32, 16-token blocks (32 KiB); a chunk is 256 tokens,
// 16 blocks, 512 KiB (a retrieved document of the demo).
//
// - BM_ChunkMemcpy: the baseline for a fetch, one memcpy of the chunk's
//   512 KiB from one host-side buffer into the pool arena (a fetch reads the
//   same host slots every time, so both are warm in cache).
// - BM_ChunkMemcpyToCold: the baseline for a publish, the same memcpy from
//   the pool into the next 512 KiB of a 256 MiB buffer, round robin, as a
//   publish writes least recently used host slots.
// - BM_ChunkFetch: ClientChunkSource::Fetch of a chunk that sits on host:
//   one FetchChunk round trip (lookup, pins, a load event), the device
//   tier's copy of the 16 blocks, and its completion posted one-way (the
//   next iteration's call collects the reply).
// - BM_ChunkPublish: ClientChunkSource::Publish of a chunk tierkvd has not
//   seen (fresh tokens each iteration): one PublishChunk round trip (lookup,
//   allocate, a store event), the copy into host slots, and its completion
//   posted one-way. The host tier holds 512 chunks, so later iterations
//   recycle least recently used slots.
// Both report calls_per_op: the round trips waited for per chunk.
// Each is wall-clock (UseRealTime): the copy runs on the device tier's copy
// thread. Every buffer is written once before timing.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ipc/server.h"
#include "tierkv/client.h"
#include "tierkv/client_chunk_source.h"
#include "tierkv/device_tier.h"

namespace tierkv {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kChunkTokens = 256;
constexpr int32_t kChunkBlocks = kChunkTokens / kBlockSize;
// The pool: the null block, one chunk to publish from, one to fetch into.
constexpr int32_t kPoolBlocks = 1 + 2 * kChunkBlocks;

KvLayout BenchLayout() {
  return KvLayout{.num_layers = 4,
                  .num_kv_heads = 2,
                  .head_dim = 32,
                  .block_size = kBlockSize,
                  .dtype = DType::kF32};
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "chunk_tier_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T ValueOrDie(StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + v.status().ToString());
  return std::move(*v);
}

// Tokens of chunk number `n`: no two chunks share a block.
std::vector<TokenId> ChunkTokens(uint64_t n) {
  std::vector<TokenId> tokens(kChunkTokens);
  for (int32_t i = 0; i < kChunkTokens; ++i) {
    tokens[i] = static_cast<TokenId>((n * kChunkTokens + i) % 120'000);
  }
  return tokens;
}

std::vector<BlockId> PoolBlocks(int32_t first) {
  std::vector<BlockId> blocks(kChunkBlocks);
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// tierkvd's machinery in this process and one attached chunk-pool worker.
// Built once: Google Benchmark calls each benchmark function several times.
struct ChunkPath {
  std::string dir;
  std::vector<std::byte> pool;
  std::unique_ptr<ipc::Server> server;
  std::unique_ptr<EmulatedDeviceTier> device;
  std::unique_ptr<Client> client;
  std::unique_ptr<ClientChunkSource> tier;
  uint64_t next_chunk = 1;

  ChunkPath() {
    char tmpl[] = "/tmp/chunk_tier_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die(std::strerror(errno));
    dir = tmpl;
    const KvLayout layout = BenchLayout();
    ipc::ServerOptions options;
    options.store = "chunk-tier-bench-" + std::to_string(getpid());
    options.socket_path = dir + "/tierkvd.sock";
    options.host_capacity_bytes = size_t{256} << 20;
    options.layout = layout;
    server = ValueOrDie(ipc::Server::Start(options), "start server");

    pool.assign(size_t{kPoolBlocks} * layout.BlockBytes(), std::byte{0x5a});
    device = ValueOrDie(
        EmulatedDeviceTier::CreateOver(pool, kPoolBlocks, layout.BlockBytes()),
        "device tier");
    ClientOptions client_options;
    client_options.socket_path = options.socket_path;
    client_options.layout = layout;
    client_options.num_device_blocks = kPoolBlocks;
    client_options.device = device.get();
    client_options.name = "chunk_tier_bench";
    client = ValueOrDie(Client::Open(client_options), "attach");
    tier = std::make_unique<ClientChunkSource>(client.get());
    // The chunk BM_ChunkFetch fetches, published once; and a warm-up pass
    // over every host slot, so no timed copy takes a first-touch fault.
    const int64_t chunks_on_host =
        options.host_capacity_bytes / layout.BlockBytes() / kChunkBlocks;
    for (int64_t i = 0; i < chunks_on_host; ++i) {
      if (Status s = Publish(); !s.ok()) Die("warm-up: " + s.ToString());
    }
    if (Status s = tier->Publish(ChunkTokens(0), 0, {}, PoolBlocks(1));
        !s.ok()) {
      Die("publish: " + s.ToString());
    }
  }
  ~ChunkPath() {
    tier.reset();
    client.reset();  // Detach before the server stops.
    server.reset();
    std::filesystem::remove_all(dir);
  }

  // Sets the counter calls_per_op: control round trips waited for per
  // iteration since the client had made `before`.
  void CountCalls(benchmark::State& state, uint64_t before) const {
    state.counters["calls_per_op"] =
        static_cast<double>(client->call_counts().calls - before) /
        static_cast<double>(std::max<int64_t>(1, state.iterations()));
  }

  // Publishes a chunk tierkvd has not seen from pool blocks 1..16.
  Status Publish() {
    return tier->Publish(ChunkTokens(next_chunk++), 0, {}, PoolBlocks(1));
  }
  // Fetches chunk 0 into pool blocks 17..32; true on a hit.
  StatusOr<bool> Fetch() {
    const std::vector<TokenId> tokens = ChunkTokens(0);
    return tier->Fetch(tokens, 0, {},
                       [](int32_t n) -> StatusOr<std::vector<BlockId>> {
                         if (n != kChunkBlocks) {
                           return Status::Internal("unexpected block count");
                         }
                         return PoolBlocks(1 + kChunkBlocks);
                       });
  }
};

ChunkPath& Path() {
  static ChunkPath path;
  return path;
}

const size_t kChunkBytes = size_t{kChunkBlocks} * BenchLayout().BlockBytes();

void BM_ChunkMemcpy(benchmark::State& state) {
  std::vector<std::byte> host(kChunkBytes, std::byte{0x33});
  std::vector<std::byte>& pool = Path().pool;
  std::byte* dst =
      pool.data() + (1 + kChunkBlocks) * BenchLayout().BlockBytes();
  for (auto _ : state) {
    std::memcpy(dst, host.data(), kChunkBytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
}
BENCHMARK(BM_ChunkMemcpy)->UseRealTime();

void BM_ChunkMemcpyToCold(benchmark::State& state) {
  constexpr size_t kColdBytes = size_t{256} << 20;
  std::vector<std::byte> cold(kColdBytes, std::byte{0x33});
  const std::byte* src = Path().pool.data() + BenchLayout().BlockBytes();
  size_t offset = 0;
  for (auto _ : state) {
    std::memcpy(cold.data() + offset, src, kChunkBytes);
    benchmark::ClobberMemory();
    offset = (offset + kChunkBytes) % kColdBytes;
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
}
BENCHMARK(BM_ChunkMemcpyToCold)->UseRealTime();

void BM_ChunkFetch(benchmark::State& state) {
  ChunkPath& path = Path();
  // BM_ChunkPublish may have run first (repetitions interleave) and pushed
  // the chunk out of host DRAM: published again (a no-op when there).
  if (Status s = path.tier->Publish(ChunkTokens(0), 0, {}, PoolBlocks(1));
      !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const uint64_t calls = path.client->call_counts().calls;
  for (auto _ : state) {
    StatusOr<bool> hit = path.Fetch();
    if (!hit.ok() || !*hit) {
      state.SkipWithError(hit.ok() ? "the chunk missed on host"
                                   : hit.status().ToString().c_str());
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
  path.CountCalls(state, calls);
}
BENCHMARK(BM_ChunkFetch)->UseRealTime();

void BM_ChunkPublish(benchmark::State& state) {
  ChunkPath& path = Path();
  const uint64_t calls = path.client->call_counts().calls;
  for (auto _ : state) {
    if (Status s = path.Publish(); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  state.SetBytesProcessed(state.iterations() * kChunkBytes);
  path.CountCalls(state, calls);
}
BENCHMARK(BM_ChunkPublish)->UseRealTime();

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
