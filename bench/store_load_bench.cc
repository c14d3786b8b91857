// Store and load through the emulated device tier against memcpy.
//
// What is measured: 64 blocks of 2 MiB (128 MiB) moved between the
// EmulatedDeviceTier arena and POSIX shared memory (shm_open + mmap, as the
// host tier uses):
// - BM_Memcpy: the baseline, one thread memcpy'ing the same blocks from the
//   arena into the shared memory (the bytes a store moves);
//   BM_MemcpyHostToDevice the same the other way (the bytes a load moves).
// - BM_Store: one device->host job of the 64 blocks submitted to the tier,
//   timed until its completion has been returned by WaitCompleted.
// - BM_Load: the same job host->device.
// - BM_RegisteredDeviceStore/Load: the same 64 blocks through a
//   RegisteredDeviceTier over vLLM's paged layout (per layer one
//   [2, 64, 16, heads, 128] bf16 tensor; 32 layers, 8 KV heads: 2 MiB
//   blocks) into the same shared memory. tp:1 holds every head (one memcpy
//   per plane); tp:2 is rank 0 of two (heads 0-3: one 1 KiB run per token
//   and plane, half the bytes). Compare GiB/s with BM_Memcpy /
//   BM_MemcpyHostToDevice.
// Store and load include the submit, the hand-off to the copy-engine thread
// and the wake-up of the waiter, so the figures are wall-clock (UseRealTime).
// Every page of every buffer is written before timing, so first-touch page
// faults are not measured.
//
// The bar (device-tier issue): store and load each reach at least 80% of
// memcpy of the same bytes in the same binary. Figures and the command that
// produced them are kept in BENCHMARKS.md.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tierkv/device_tier.h"

namespace tierkv {
namespace {

constexpr int32_t kBlocks = 64;
constexpr size_t kBlockBytes = size_t{2} << 20;
constexpr size_t kTotalBytes = kBlocks * kBlockBytes;

// The registered tier's model: 32 layers x 2 planes x 16 tokens x 8 heads x
// 128 dims of bf16, kBlockBytes per block.
const KvLayout kLayout{.num_layers = 32,
                       .num_kv_heads = 8,
                       .head_dim = 128,
                       .block_size = 16,
                       .dtype = DType::kBF16};

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "store_load_bench: %s: %s\n", what,
               std::strerror(errno));
  std::exit(1);
}

// Writes every page so that no benchmark pays for first-touch faults.
void Prefault(std::byte* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 4096) p[i] = std::byte{1};
  std::memset(p, 0x5a, bytes);
}

// A shared-memory mapping of kTotalBytes. The name is unlinked as soon as the
// mapping exists: the pages live as long as the mapping, and a killed run
// leaves nothing behind in /dev/shm.
std::byte* MapSharedHostMemory() {
  const std::string name =
      "/tierkv-store-load-bench-" + std::to_string(getpid()) + "-" +
      std::to_string(
          std::chrono::steady_clock::now().time_since_epoch().count());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) Die("shm_open");
  if (ftruncate(fd, static_cast<off_t>(kTotalBytes)) != 0) Die("ftruncate");
  void* p =
      mmap(nullptr, kTotalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) Die("mmap");
  close(fd);
  if (shm_unlink(name.c_str()) != 0) Die("shm_unlink");
  return static_cast<std::byte*>(p);
}

struct Setup {
  Setup() {
    auto created = EmulatedDeviceTier::Create(kBlocks, kBlockBytes);
    if (!created.ok()) {
      std::fprintf(stderr, "store_load_bench: %s\n",
                   created.status().ToString().c_str());
      std::exit(1);
    }
    tier = std::move(created).value();
    host = MapSharedHostMemory();
    Prefault(tier->block(0).data(), kTotalBytes);  // The arena is contiguous.
    Prefault(host, kTotalBytes);
    for (int32_t i = 0; i < kBlocks; ++i) {
      device_blocks.push_back(i);
      host_blocks.push_back(host + i * kBlockBytes);
    }
  }
  ~Setup() { munmap(host, kTotalBytes); }

  std::unique_ptr<EmulatedDeviceTier> tier;
  std::byte* host = nullptr;
  std::vector<BlockId> device_blocks;
  std::vector<std::byte*> host_blocks;
};

Setup& Shared() {
  static Setup setup;  // Built on first use, torn down at exit.
  return setup;
}

void BM_Memcpy(benchmark::State& state) {
  Setup& s = Shared();
  for (auto _ : state) {
    for (int32_t i = 0; i < kBlocks; ++i) {
      std::memcpy(s.host_blocks[i], s.tier->block(i).data(), kBlockBytes);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_MemcpyHostToDevice(benchmark::State& state) {
  Setup& s = Shared();
  for (auto _ : state) {
    for (int32_t i = 0; i < kBlocks; ++i) {
      std::memcpy(s.tier->block(i).data(), s.host_blocks[i], kBlockBytes);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

// vLLM's paged KV for `tp` ranks' rank 0, in one anonymous mapping (huge
// pages where granted, as the emulated arena gets), and the
// RegisteredDeviceTier over it.
struct RegisteredSetup {
  explicit RegisteredSetup(int32_t tp) {
    if (kLayout.BlockBytes() != kBlockBytes) {
      std::fprintf(stderr, "store_load_bench: layout is not kBlockBytes\n");
      std::exit(1);
    }
    const int32_t heads = kLayout.num_kv_heads / tp;
    const size_t plane =
        kLayout.block_size * heads * kLayout.head_dim * kLayout.ElementSize();
    const size_t layer_bytes = 2 * kBlocks * plane;
    bytes = kLayout.num_layers * layer_bytes;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap");
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    memory = static_cast<std::byte*>(p);
    Prefault(memory, bytes);
    RegisteredDeviceOptions options{.layout = kLayout,
                                    .num_blocks = kBlocks,
                                    .first_head = 0,
                                    .num_heads = heads};
    for (int32_t l = 0; l < kLayout.num_layers; ++l) {
      std::byte* layer = memory + l * layer_bytes;
      options.layers.push_back(LayerMemory{.key = layer,
                                           .value = layer + kBlocks * plane,
                                           .block_stride = plane});
    }
    auto created = RegisteredDeviceTier::Create(std::move(options));
    if (!created.ok()) {
      std::fprintf(stderr, "store_load_bench: %s\n",
                   created.status().ToString().c_str());
      std::exit(1);
    }
    tier = std::move(created).value();
  }
  ~RegisteredSetup() {
    tier.reset();
    munmap(memory, bytes);
  }

  std::unique_ptr<RegisteredDeviceTier> tier;
  std::byte* memory = nullptr;
  size_t bytes = 0;
};

RegisteredSetup& Registered(int64_t tp) {
  if (tp == 1) {
    static RegisteredSetup whole(1);
    return whole;
  }
  static RegisteredSetup shard(2);
  return shard;
}

// One job of the 64 blocks per iteration, timed until its completion is
// back; `bytes` is what one job moves.
void RunJobs(benchmark::State& state, DeviceTier& tier, CopyDirection direction,
             size_t bytes) {
  Setup& s = Shared();
  uint64_t tag = 0;
  for (auto _ : state) {
    Status submitted = tier.Submit(CopyJob{.tag = ++tag,
                                           .direction = direction,
                                           .device_blocks = s.device_blocks,
                                           .host_blocks = s.host_blocks});
    if (!submitted.ok()) {
      state.SkipWithError(submitted.ToString().c_str());
      break;
    }
    std::vector<CopyCompletion> done =
        tier.WaitCompleted(std::chrono::seconds(60));
    if (done.size() != 1 || done[0].tag != tag || !done[0].status.ok()) {
      state.SkipWithError("copy job did not complete");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_Store(benchmark::State& state) {
  RunJobs(state, *Shared().tier, CopyDirection::kDeviceToHost, kTotalBytes);
}

void BM_Load(benchmark::State& state) {
  RunJobs(state, *Shared().tier, CopyDirection::kHostToDevice, kTotalBytes);
}

void RunRegistered(benchmark::State& state, CopyDirection direction) {
  RegisteredDeviceTier& tier = *Registered(state.range(0)).tier;
  RunJobs(state, tier, direction, kBlocks * tier.shard_bytes());
}

void BM_RegisteredDeviceStore(benchmark::State& state) {
  RunRegistered(state, CopyDirection::kDeviceToHost);
}

void BM_RegisteredDeviceLoad(benchmark::State& state) {
  RunRegistered(state, CopyDirection::kHostToDevice);
}

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Store)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyHostToDevice)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RegisteredDeviceStore)
    ->ArgName("tp")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RegisteredDeviceLoad)
    ->ArgName("tp")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
