// Disk tier benchmarks (tiers/disk_tier.h): spilling and promoting 2 MiB KV
// blocks against raw sequential file I/O of the same bytes, in the same
// binary and directory; and the payload codecs on real KV data.
//
// Data: K and V that the reference model (testing/reference_model.h) computes
// for a 128-token prompt in a Llama-3-8B-shaped cache (32 layers, 8 KV heads,
// head dim 128, 16-token blocks, bf16): 8 distinct 2 MiB blocks, reused
// round-robin. The model's weights are seeded random, not trained.
//
// Writes: the tier writes each block into a slot of its value file (in
// steady state over a block it evicted) and a small record to RocksDB (its
// write-ahead log, not synced); each iteration ends with DiskTier::Flush,
// which syncs the value file and flushes the records. BM_RawFileWrite
// overwrites a file of the same size in place and syncs it once at the end.
//
// Reads: the Cold variants drop the files' pages from the page cache before
// every iteration (posix_fadvise DONTNEED, after the data was synced), so
// both the tier and the raw baseline read from the device; the Warm ones
// read what the page cache holds, which for both is every byte.
//
// The directory is $TIERKV_BENCH_DIR, else the system temp directory; it
// must not be tmpfs for the figures to mean anything.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "testing/reference_model.h"
#include "tests/scratch.h"
#include "tierkv/kv_layout.h"
#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

constexpr int kBlocksPerIteration = 128;  // 256 MiB.
constexpr int kDistinctBlocks = 8;
constexpr int kTokensPerBlock = 16;

KvLayout BenchLayout() {
  return KvLayout{.num_layers = 32,
                  .num_kv_heads = 8,
                  .head_dim = 128,
                  .block_size = kTokensPerBlock,
                  .dtype = DType::kBF16};
}

// ---------------------------------------------------------------------------
// Real KV blocks from the reference model.

std::vector<std::vector<std::byte>> ComputeKvBlocks() {
  ReferenceModelConfig config;
  config.vocab_size = 256;
  config.hidden_size = 256;
  config.num_layers = 32;
  config.num_heads = 8;
  config.num_kv_heads = 8;
  config.head_dim = 128;
  config.ffn_size = 512;
  config.rope_theta = 500000;  // Llama 3.
  StatusOr<ReferenceModel> model = ReferenceModel::Create(config);
  if (!model.ok()) std::abort();
  const KvLayout layout = config.CacheLayout(kTokensPerBlock, DType::kBF16);
  StatusOr<PagedKvCache> cache = PagedKvCache::Create(layout, kDistinctBlocks);
  if (!cache.ok()) std::abort();

  const int n = kDistinctBlocks * kTokensPerBlock;
  std::mt19937 rng(42);
  std::vector<TokenId> tokens(n);
  for (TokenId& t : tokens) t = rng() % config.vocab_size;
  std::vector<int64_t> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = i;
  PrefillInput input;
  input.tokens = tokens;
  input.slots = slots;
  if (!model->Prefill(input, &*cache).ok()) std::abort();

  std::vector<std::vector<std::byte>> blocks;
  for (int b = 0; b < kDistinctBlocks; ++b) {
    const std::byte* start = cache->block(b);
    blocks.emplace_back(start, start + layout.BlockBytes());
  }
  return blocks;
}

const std::vector<std::vector<std::byte>>& KvBlocks() {
  static const auto* blocks =
      new std::vector<std::vector<std::byte>>(ComputeKvBlocks());
  return *blocks;
}

std::vector<TokenId> TokensOf(uint64_t block) {
  std::vector<TokenId> tokens(kTokensPerBlock);
  for (int j = 0; j < kTokensPerBlock; ++j) {
    tokens[j] = static_cast<TokenId>(block * kTokensPerBlock + j);
  }
  return tokens;
}

BlockKey KeyOf(uint64_t block) {
  return BlockKey{.lo = (block + 1) * 0x9e3779b97f4a7c15, .hi = 0xd15c};
}

// ---------------------------------------------------------------------------
// Files.

std::string BenchRoot() {
  const char* env = std::getenv("TIERKV_BENCH_DIR");
  return env != nullptr ? env : std::filesystem::temp_directory_path();
}

// Evicts every file under `dir` from the page cache. The files must be
// synced (dirty pages are not dropped).
void DropPageCache(const std::string& dir) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    int fd = open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

bool WriteAll(int fd, const std::byte* data, size_t bytes) {
  while (bytes > 0) {
    ssize_t n = write(fd, data, bytes);
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, std::byte* data, size_t bytes, off_t offset) {
  while (bytes > 0) {
    ssize_t n = pread(fd, data, bytes, offset);
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

// Writes `blocks` KV blocks sequentially from the start of the file at
// `path` (made if missing, overwritten in place if not, as the tier's
// value file is in steady state), then fdatasync, where the tier's Flush
// syncs. False on an I/O error.
bool WriteRawFile(const std::string& path, int blocks) {
  int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  if (fd < 0) return false;
  bool ok = true;
  for (int i = 0; ok && i < blocks; ++i) {
    const std::vector<std::byte>& block = KvBlocks()[i % kDistinctBlocks];
    ok = WriteAll(fd, block.data(), block.size());
  }
  ok = ok && fdatasync(fd) == 0;
  return close(fd) == 0 && ok;
}

std::vector<std::vector<std::byte>> TouchedBuffers(int count, size_t bytes) {
  std::vector<std::vector<std::byte>> out(count);
  for (auto& b : out) b.assign(bytes, std::byte{1});
  return out;
}

void AddFsContext() {
  struct statfs fs {};
  const std::string root = BenchRoot();
  const bool tmpfs = statfs(root.c_str(), &fs) == 0 && fs.f_type == 0x01021994;
  benchmark::AddCustomContext("disk_bench_dir",
                              root + (tmpfs ? " (tmpfs!)" : ""));
}

void SetBytes(benchmark::State& state, size_t per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(per_iteration));
}

// ---------------------------------------------------------------------------
// Raw baselines.

void BM_RawFileWrite(benchmark::State& state) {
  const size_t bytes = BenchLayout().BlockBytes();
  TempDir dir("disk_bench", BenchRoot());
  const std::string path = dir.path() + "/raw";
  // Written once first: the timed writes overwrite it, as the tier's
  // steady state overwrites its value file's slots.
  if (!WriteRawFile(path, kBlocksPerIteration)) {
    state.SkipWithError("raw write failed");
    return;
  }
  for (auto _ : state) {
    if (!WriteRawFile(path, kBlocksPerIteration)) {
      state.SkipWithError("raw write failed");
      return;
    }
  }
  SetBytes(state, kBlocksPerIteration * bytes);
}
BENCHMARK(BM_RawFileWrite)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3)
    ->UseRealTime();

void RawFileRead(benchmark::State& state, bool cold) {
  const size_t bytes = BenchLayout().BlockBytes();
  TempDir dir("disk_bench", BenchRoot());
  const std::string path = dir.path() + "/raw";
  if (!WriteRawFile(path, kBlocksPerIteration)) {
    state.SkipWithError("raw write failed");
    return;
  }
  auto buffers = TouchedBuffers(kBlocksPerIteration, bytes);
  const int fd = open(path.c_str(), O_RDONLY);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      DropPageCache(dir.path());
      state.ResumeTiming();
    }
    for (int i = 0; i < kBlocksPerIteration; ++i) {
      if (!ReadAll(fd, buffers[i].data(), bytes, off_t(i) * bytes)) {
        state.SkipWithError("raw read failed");
        break;
      }
    }
    benchmark::ClobberMemory();
  }
  close(fd);
  if (buffers[1] != KvBlocks()[1]) state.SkipWithError("raw read differs");
  SetBytes(state, kBlocksPerIteration * bytes);
}

void BM_RawFileReadCold(benchmark::State& state) { RawFileRead(state, true); }
void BM_RawFileReadWarm(benchmark::State& state) { RawFileRead(state, false); }
BENCHMARK(BM_RawFileReadCold)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2)
    ->UseRealTime();
BENCHMARK(BM_RawFileReadWarm)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2)
    ->UseRealTime();

// ---------------------------------------------------------------------------
// The tier.

// Counts callbacks down; remembers the first error.
class Waiter {
 public:
  explicit Waiter(int count) : latch_(count) {}
  DiskTier::Done Callback() {
    return [this](Status s) {
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.ok()) error_ = s;
      }
      latch_.count_down();
    };
  }
  Status Wait() {
    latch_.wait();
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  std::latch latch_;
  std::mutex mu_;
  Status error_;  // GUARDED_BY(mu_)
};

// The tier's configuration: DiskTierOptions' defaults unless a benchmark
// names another codec or thread count.
struct TierConfig {
  DiskCodec codec = DiskTierOptions{}.codec;
  int32_t io_threads = DiskTierOptions{}.io_threads;
  uint64_t capacity_blocks = kBlocksPerIteration;
};

StatusOr<std::unique_ptr<DiskTier>> OpenTier(const std::string& path,
                                             const TierConfig& config) {
  const KvLayout layout = BenchLayout();
  DiskTierOptions options;
  options.storage.path = path;
  options.block_bytes = layout.BlockBytes();
  options.layout_fingerprint = layout.Fingerprint();
  // capacity_blocks blocks exactly (the steady state of BM_DiskSpill
  // evicts as much as it writes).
  options.capacity_bytes =
      config.capacity_blocks * DiskValueBytes(layout.BlockBytes(),
                                              options.layout_fingerprint.size(),
                                              kTokensPerBlock);
  options.codec = config.codec;
  options.io_threads = config.io_threads;
  return DiskTier::Open(options);
}

// Puts `count` blocks numbered from *next; waits for them.
Status SpillBlocks(DiskTier& tier, uint64_t* next,
                   int count = kBlocksPerIteration) {
  Waiter waiter(count);
  for (int i = 0; i < count; ++i) {
    const uint64_t b = (*next)++;
    tier.Put(KeyOf(b), TokensOf(b), KvBlocks()[b % kDistinctBlocks],
             waiter.Callback());
  }
  return waiter.Wait();
}

void SetTierCounters(benchmark::State& state, const DiskTier& tier) {
  const DiskTierStats stats = tier.stats();
  state.counters["ratio"] =
      stats.stored_bytes_written == 0
          ? 0.0
          : static_cast<double>(stats.payload_bytes_written) /
                static_cast<double>(stats.stored_bytes_written);
  state.counters["file_MiB"] = static_cast<double>(stats.file_bytes) / 1048576;
}

// Steady state: the tier starts full, so every iteration evicts as many
// blocks as it writes. Each iteration is 128 Puts, every callback, then
// Flush (the value file and the records synced).
void DiskSpill(benchmark::State& state, const TierConfig& config) {
  state.SetLabel(std::string(DiskCodecName(config.codec)) + ", " +
                 std::to_string(config.io_threads) + " I/O threads");
  TempDir dir("disk_bench", BenchRoot());
  StatusOr<std::unique_ptr<DiskTier>> tier = OpenTier(dir.path(), config);
  uint64_t next = 0;
  Status s = tier.ok() ? SpillBlocks(**tier, &next) : tier.status();
  if (s.ok()) s = (*tier)->Flush();
  if (!s.ok()) {
    state.SkipWithError(("setup: " + s.ToString()).c_str());
    return;
  }
  for (auto _ : state) {
    s = SpillBlocks(**tier, &next);
    if (s.ok()) s = (*tier)->Flush();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetTierCounters(state, **tier);
  SetBytes(state, kBlocksPerIteration * BenchLayout().BlockBytes());
}

// 128 Gets into pre-touched buffers, each verified (checksum, token ids),
// then compared with what was written.
void DiskPromote(benchmark::State& state, const TierConfig& config, bool cold) {
  state.SetLabel(std::string(DiskCodecName(config.codec)) + ", " +
                 std::to_string(config.io_threads) + " I/O threads");
  const size_t bytes = BenchLayout().BlockBytes();
  TempDir dir("disk_bench", BenchRoot());
  StatusOr<std::unique_ptr<DiskTier>> tier = OpenTier(dir.path(), config);
  uint64_t next = 0;
  Status s = tier.ok() ? SpillBlocks(**tier, &next) : tier.status();
  if (s.ok()) s = (*tier)->Flush();
  if (!s.ok()) {
    state.SkipWithError(("setup: " + s.ToString()).c_str());
    return;
  }
  auto buffers = TouchedBuffers(kBlocksPerIteration, bytes);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      DropPageCache(dir.path());
      state.ResumeTiming();
    }
    Waiter waiter(kBlocksPerIteration);
    for (int i = 0; i < kBlocksPerIteration; ++i) {
      (*tier)->Get(KeyOf(i), TokensOf(i), buffers[i], waiter.Callback());
    }
    s = waiter.Wait();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  for (int i = 0; i < kBlocksPerIteration; ++i) {
    if (buffers[i] != KvBlocks()[i % kDistinctBlocks]) {
      state.SkipWithError("promoted block differs");
    }
  }
  SetTierCounters(state, **tier);
  SetBytes(state, kBlocksPerIteration * bytes);
}

// The bar's figures: the default configuration.
void BM_DiskSpillDefault(benchmark::State& state) { DiskSpill(state, {}); }
void BM_DiskPromoteDefaultCold(benchmark::State& state) {
  DiskPromote(state, {}, true);
}
void BM_DiskPromoteDefaultWarm(benchmark::State& state) {
  DiskPromote(state, {}, false);
}
BENCHMARK(BM_DiskSpillDefault)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3)
    ->UseRealTime();
BENCHMARK(BM_DiskPromoteDefaultCold)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2)
    ->UseRealTime();
BENCHMARK(BM_DiskPromoteDefaultWarm)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2)
    ->UseRealTime();

constexpr int64_t kNone = static_cast<int64_t>(DiskCodec::kNone);
constexpr int64_t kLz4 = static_cast<int64_t>(DiskCodec::kLz4);
constexpr int64_t kPlanes = static_cast<int64_t>(DiskCodec::kLz4BytePlanes);

// Args: codec, I/O threads.
void BM_DiskSpill(benchmark::State& state) {
  DiskSpill(state, {.codec = static_cast<DiskCodec>(state.range(0)),
                    .io_threads = static_cast<int32_t>(state.range(1))});
}
// Args: codec, I/O threads, cold (0/1).
void BM_DiskPromote(benchmark::State& state) {
  DiskPromote(state,
              {.codec = static_cast<DiskCodec>(state.range(0)),
               .io_threads = static_cast<int32_t>(state.range(1))},
              state.range(2) != 0);
}
BENCHMARK(BM_DiskSpill)
    ->ArgNames({"codec", "threads"})
    ->ArgsProduct({{kNone}, {1, 4, 8}})
    ->Args({kLz4, 2})
    ->Args({kPlanes, 2})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3)
    ->UseRealTime();
BENCHMARK(BM_DiskPromote)
    ->ArgNames({"codec", "threads", "cold"})
    ->ArgsProduct({{kNone}, {1, 4, 8}, {1}})
    ->Args({kPlanes, 2, 1})
    ->Args({kPlanes, 2, 0})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2)
    ->UseRealTime();

// Opening a store of `GiB` GiB of 2 MiB blocks (written once, before the
// timing): RocksDB's open, the record scan and the index rebuild, as
// tierkvd does before it is ready. From the page cache (the records are a
// few MiB whatever the store holds; the value file is not read).
void BM_DiskOpen(benchmark::State& state) {
  const uint64_t gib = static_cast<uint64_t>(state.range(0));
  const uint64_t blocks = (gib << 30) / BenchLayout().BlockBytes();
  TempDir dir("disk_bench", BenchRoot());
  const TierConfig config{.capacity_blocks = blocks};
  {
    StatusOr<std::unique_ptr<DiskTier>> tier = OpenTier(dir.path(), config);
    uint64_t next = 0;
    Status s = tier.ok() ? Status::Ok() : tier.status();
    while (s.ok() && next < blocks) s = SpillBlocks(**tier, &next, 64);
    if (s.ok()) s = (*tier)->Flush();
    if (!s.ok()) {
      state.SkipWithError(("setup: " + s.ToString()).c_str());
      return;
    }
  }
  uint64_t keys = 0;
  for (auto _ : state) {
    StatusOr<std::unique_ptr<DiskTier>> tier = OpenTier(dir.path(), config);
    if (!tier.ok()) {
      state.SkipWithError(tier.status().ToString().c_str());
      return;
    }
    keys = (*tier)->stats().keys;
    state.PauseTiming();
    tier->reset();  // Closing is not part of starting.
    state.ResumeTiming();
  }
  if (keys != blocks) state.SkipWithError("the open lost blocks");
  state.counters["blocks"] = static_cast<double>(blocks);
  state.counters["seconds_per_gib"] = benchmark::Counter(
      static_cast<double>(gib), benchmark::Counter::kIsIterationInvariantRate |
                                    benchmark::Counter::kInvert);
  state.counters["seconds_per_10k_blocks"] =
      benchmark::Counter(static_cast<double>(blocks) / 1e4,
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
}
BENCHMARK(BM_DiskOpen)
    ->ArgName("GiB")
    ->Arg(1)
    ->Arg(10)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5)
    ->UseRealTime();

// ---------------------------------------------------------------------------
// Codecs on real KV data: ratio, and encode / decode bytes per second on
// one thread (the tier runs one block per I/O thread).

void BM_Codec(benchmark::State& state) {
  const auto codec = static_cast<DiskCodec>(state.range(0));
  state.SetLabel(std::string(DiskCodecName(codec)));
  const auto& blocks = KvBlocks();
  const size_t bytes = blocks[0].size();
  std::vector<std::byte> stored(MaxEncodedBytes(codec, 2, bytes));
  std::vector<std::byte> out(bytes);
  double encode_s = 0, decode_s = 0;
  uint64_t payload_total = 0, stored_total = 0;
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    for (const std::vector<std::byte>& block : blocks) {
      const auto t0 = Clock::now();
      StatusOr<EncodedPayload> encoded = EncodePayload(codec, 2, block, stored);
      const auto t1 = Clock::now();
      if (!encoded.ok()) {
        state.SkipWithError("encode failed");
        return;
      }
      const bool raw = encoded->codec == DiskCodec::kNone;
      std::string_view view(
          reinterpret_cast<const char*>(raw ? block.data() : stored.data()),
          raw ? block.size() : encoded->bytes);
      if (!DecodePayload(encoded->codec, 2, view, out).ok()) {
        state.SkipWithError("decode failed");
        return;
      }
      const auto t2 = Clock::now();
      encode_s += std::chrono::duration<double>(t1 - t0).count();
      decode_s += std::chrono::duration<double>(t2 - t1).count();
      payload_total += bytes;
      stored_total += view.size();
    }
  }
  if (out != blocks.back()) state.SkipWithError("round trip differs");
  state.counters["ratio"] =
      static_cast<double>(payload_total) / static_cast<double>(stored_total);
  state.counters["encode_GBps"] = payload_total / encode_s / 1e9;
  state.counters["decode_GBps"] = payload_total / decode_s / 1e9;
  SetBytes(state, blocks.size() * bytes);
}
BENCHMARK(BM_Codec)
    ->ArgName("codec")
    ->Arg(kNone)
    ->Arg(kLz4)
    ->Arg(kPlanes)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  tierkv::AddFsContext();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
