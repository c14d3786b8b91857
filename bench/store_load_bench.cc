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
// Store and load include the submit, the hand-off to the copy-engine thread
// and the wake-up of the waiter, so the figures are wall-clock (UseRealTime).
// Every page of both buffers is written before timing, so first-touch page
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

void RunJobs(benchmark::State& state, CopyDirection direction) {
  Setup& s = Shared();
  uint64_t tag = 0;
  for (auto _ : state) {
    Status submitted = s.tier->Submit(CopyJob{.tag = ++tag,
                                              .direction = direction,
                                              .device_blocks = s.device_blocks,
                                              .host_blocks = s.host_blocks});
    if (!submitted.ok()) {
      state.SkipWithError(submitted.ToString().c_str());
      break;
    }
    std::vector<CopyCompletion> done =
        s.tier->WaitCompleted(std::chrono::seconds(60));
    if (done.size() != 1 || done[0].tag != tag || !done[0].status.ok()) {
      state.SkipWithError("copy job did not complete");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * kTotalBytes);
}

void BM_Store(benchmark::State& state) {
  RunJobs(state, CopyDirection::kDeviceToHost);
}

void BM_Load(benchmark::State& state) {
  RunJobs(state, CopyDirection::kHostToDevice);
}

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Store)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyHostToDevice)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
