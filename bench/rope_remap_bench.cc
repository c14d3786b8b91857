// Chunk remap speed: RopeRemap placing a 4,096-token chunk of a
// Llama-3-8B-shaped KV cache at an unaligned position, scalar and vectorised,
// against a single-thread memcpy of the same bytes (the baseline).
// Run with tools/run bench; figures and ratios are kept in BENCHMARKS.md.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "src/rope_remap.h"

namespace tierkv {
namespace {

constexpr int32_t kTokens = 4096;
constexpr int64_t kRealStart = 1237;  // Not a multiple of the block size.

KvLayout Llama3_8B() {
  return KvLayout{.num_layers = 32,
                  .num_kv_heads = 8,
                  .head_dim = 128,
                  .block_size = 16,
                  .dtype = DType::kBF16};
}

RopeConfig Llama3Rope() {
  RopeConfig rope;
  rope.head_dim = 128;
  rope.rotary_dim = 128;
  rope.theta = 500000;
  rope.scaling = RopeScaling::Llama3(8, 1, 4, 8192);
  return rope;
}

// The chunk's 256 source blocks and a destination of 257 blocks (the chunk
// starts at offset 5 of its first block), touched before timing. Shared by
// all benchmarks so that the 1 GiB is allocated once.
struct Buffers {
  Buffers() : layout(Llama3_8B()) {
    const size_t block_bytes = layout.BlockBytes();
    const int32_t src_count = kTokens / layout.block_size;
    src.resize(src_count * block_bytes);
    std::mt19937 rng(1);
    for (size_t i = 0; i < src.size(); i += 2) {
      // Random bf16 values of moderate magnitude, as K and V hold.
      uint16_t bf16 = static_cast<uint16_t>(0x3c00 + rng() % 0x0800) |
                      static_cast<uint16_t>((rng() & 1) << 15);
      std::memcpy(&src[i], &bf16, 2);
    }
    for (int32_t j = 0; j < src_count; ++j) {
      src_blocks.push_back(&src[j * block_bytes]);
    }
    dst_blocks = src_count + 1;
    dst.assign(dst_blocks * block_bytes, std::byte{0});
    std::vector<int32_t> ids(dst_blocks);
    for (int32_t b = 0; b < dst_blocks; ++b) ids[b] = b;
    slots = SlotMappingForBlocks(ids, layout.block_size,
                                 kRealStart % layout.block_size, kTokens)
                .value();
  }
  // K and V of every token of every layer: what a remap reads and writes.
  int64_t BytesMoved() const {
    return int64_t{kTokens} * layout.num_layers * 2 *
           static_cast<int64_t>(layout.TokenStride());
  }

  KvLayout layout;
  std::vector<std::byte> src;
  std::vector<const std::byte*> src_blocks;
  int32_t dst_blocks = 0;
  std::vector<std::byte> dst;
  std::vector<int64_t> slots;
};

Buffers& SharedBuffers() {
  static Buffers* buffers = new Buffers();
  return *buffers;
}

void BM_RopeRemap(benchmark::State& state, RemapPath path) {
  if (path == RemapPath::kVectorized && !RopeRemap::VectorizedAvailable()) {
    state.SkipWithError("no AVX2/F16C/FMA on this CPU");
    return;
  }
  Buffers& b = SharedBuffers();
  StatusOr<RopeRemap> remap = RopeRemap::Create(b.layout, Llama3Rope());
  if (!remap.ok()) {
    state.SkipWithError(remap.status().ToString().c_str());
    return;
  }
  RemapRequest request;
  request.src_blocks = b.src_blocks;
  request.num_tokens = kTokens;
  request.virtual_start = 0;
  request.dst_base = b.dst.data();
  request.dst_num_blocks = b.dst_blocks;
  request.dst_slots = b.slots;
  request.real_start = kRealStart;
  for (auto _ : state) {
    Status status = remap->Remap(request, path);
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * b.BytesMoved());
}
BENCHMARK_CAPTURE(BM_RopeRemap, Scalar, RemapPath::kScalar)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RopeRemap, Vectorized, RemapPath::kVectorized)
    ->Unit(benchmark::kMillisecond);

// Baseline: one single-thread memcpy of the same number of bytes between
// the same buffers.
void BM_Memcpy(benchmark::State& state) {
  Buffers& b = SharedBuffers();
  const size_t bytes = static_cast<size_t>(b.BytesMoved());
  for (auto _ : state) {
    std::memcpy(b.dst.data(), b.src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * b.BytesMoved());
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
