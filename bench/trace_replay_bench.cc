// A request trace replayed through BlockPool at 16-token blocks, with
// eviction: the per-block cost of prefix caching (keying, lookup, allocation,
// freeing) against raw XXH3-128 of the same tokens, and the pool's metadata
// bytes per block.
//
// The trace is JSON lines with `hash_ids`, one per 512-token block of the
// prompt, prefix-chained (the Mooncake trace format). A request's prompt is
// its `input_length` tokens: it keys its full 16-token blocks only, as an
// engine does, and holds a partial last block unkeyed while it runs
// (tierkv-replay's model). Its path: --trace=PATH,
// else $TIERKV_TRACE, else ../shared/traces/synthetic_trace.jsonl beside the
// source tree. Without it both benchmarks are skipped with a message, and
// the run still succeeds.
// Run with tools/run bench; figures are kept in BENCHMARKS.md.
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "src/block_pool.h"
#include "tierkv/block_key.h"
#include "tierkv/block_pool_options.h"
#include "tools/replay/trace.h"

namespace tierkv {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kTraceBlockTokens = 512;  // Tokens per hash id.
constexpr int32_t kBlocksPerHashId = kTraceBlockTokens / kBlockSize;

std::string& TracePath() {
  static std::string path = [] {
    if (const char* env = std::getenv("TIERKV_TRACE")) return std::string(env);
    return std::string(TIERKV_SOURCE_DIR) +
           "/../shared/traces/synthetic_trace.jsonl";
  }();
  return path;
}

struct TraceRequest {
  std::vector<int64_t> hash_ids;
  int64_t tokens = 0;  // The prompt: input_length, at most the hash ids'.
};

struct Trace {
  std::vector<TraceRequest> requests;
  int64_t unique_full_blocks = 0;  // Of kBlockSize tokens.
  int64_t max_request_blocks = 0;  // A partial last block included.
  std::string error;  // Why no trace was loaded; empty when one was.
};

const Trace& LoadedTrace() {
  static const Trace trace = [] {
    Trace t;
    StatusOr<std::vector<replay::TraceRequest>> loaded =
        replay::LoadTrace(TracePath());
    if (!loaded.ok()) {
      t.error = loaded.status().ToString() +
                " (set TIERKV_TRACE or pass --trace=PATH)";
      return t;
    }
    // A full block is named by its hash id (which names the whole prefix)
    // and its place among the id's kBlocksPerHashId blocks.
    std::unordered_set<int64_t> unique;
    for (replay::TraceRequest& r : *loaded) {
      const auto all =
          static_cast<int64_t>(r.hash_ids.size()) * kTraceBlockTokens;
      const int64_t tokens =
          r.input_length > 0 ? std::min(r.input_length, all) : all;
      for (int64_t b = 0; b < tokens / kBlockSize; ++b) {
        unique.insert(r.hash_ids[b / kBlocksPerHashId] * kBlocksPerHashId +
                      b % kBlocksPerHashId);
      }
      t.max_request_blocks = std::max(t.max_request_blocks,
                                      (tokens + kBlockSize - 1) / kBlockSize);
      t.requests.push_back({std::move(r.hash_ids), tokens});
    }
    t.unique_full_blocks = static_cast<int64_t>(unique.size());
    if (t.requests.empty()) t.error = TracePath() + ": no requests";
    return t;
  }();
  return trace;
}

// Token ids of a request: each hash id's 512 tokens derive from the id and
// the position alone, so requests sharing leading ids share leading tokens.
void ExpandTokens(const TraceRequest& request, std::vector<TokenId>* tokens) {
  tokens->resize(static_cast<size_t>(request.tokens));
  for (size_t t = 0; t < tokens->size(); ++t) {
    const int64_t id = request.hash_ids[t / kTraceBlockTokens];
    uint64_t x = static_cast<uint64_t>(id) * kTraceBlockTokens +
                 t % kTraceBlockTokens + 0x9e3779b97f4a7c15;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;  // SplitMix64's finalizer.
    x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
    (*tokens)[t] = static_cast<TokenId>((x ^ (x >> 31)) % 128'000);
  }
}

const Trace* TraceOrSkip(benchmark::State& state) {
  const Trace& trace = LoadedTrace();
  if (!trace.error.empty()) {
    state.SkipWithError(trace.error.c_str());
    return nullptr;
  }
  return &trace;
}

// The whole trace per iteration, on a fresh pool of state.range(0) percent
// of the trace's unique 16-token blocks, made as tierkvd's host pool is
// (eviction policy state.range(1): 0 LRU, 1 ARC). Each request as
// KVCacheManager handles it: keys of its full blocks chained from the
// root, the longest cached prefix looked up and touched, new blocks taken
// (evicting) and keyed, with one unkeyed block more for a partial last
// block, then every block freed in reverse.
// Items: block ops, one per full block a request names.
void BM_TraceReplay(benchmark::State& state) {
  const Trace* trace = TraceOrSkip(state);
  if (trace == nullptr) return;
  const auto num_blocks = static_cast<int32_t>(
      1 + std::max(trace->unique_full_blocks * state.range(0) / 100,
                   trace->max_request_blocks));
  const KeyHasher hasher(KeyNamespace{"bench-model", ""});
  const BlockPoolOptions options{.num_blocks = num_blocks,
                                 .block_size = kBlockSize,
                                 .reserve_null_block = true,
                                 .eviction = state.range(1) == 0
                                                 ? EvictionPolicy::kLru
                                                 : EvictionPolicy::kArc,
                                 .free_uncached_first = true,
                                 .keep_tokens = false};
  std::vector<TokenId> tokens;
  std::vector<BlockKey> keys;
  std::vector<BlockId> blocks;
  int64_t block_ops = 0;
  int64_t hit_blocks = 0;
  size_t metadata_bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    BlockPool pool = BlockPool::Create(options).value();
    state.ResumeTiming();
    for (const TraceRequest& request : trace->requests) {
      state.PauseTiming();
      ExpandTokens(request, &tokens);
      state.ResumeTiming();
      const std::span<const TokenId> all(tokens);
      keys.clear();
      hasher.AppendPrefixKeys(all, kBlockSize, {}, &keys);
      blocks.clear();
      for (size_t i = 0; i < keys.size(); ++i) {
        const std::optional<BlockId> hit = pool.GetCachedBlock(
            keys[i], all.subspan(i * kBlockSize, kBlockSize));
        if (!hit) break;
        blocks.push_back(*hit);
      }
      const auto hits = static_cast<int32_t>(blocks.size());
      const auto full = static_cast<int32_t>(keys.size());
      const int32_t partial = all.size() % kBlockSize != 0 ? 1 : 0;
      pool.Touch(blocks);
      if (!pool.GetNewBlocks(full - hits + partial, &blocks).ok() ||
          !pool.CacheFullBlocks(blocks, keys, all, hits, full).ok()) {
        state.SkipWithError("the pool refused a request");
        return;
      }
      std::reverse(blocks.begin(), blocks.end());
      pool.FreeBlocks(blocks);
      hit_blocks += hits;
      block_ops += full;
    }
    metadata_bytes = pool.MetadataBytes();  // Full: as large as it gets.
  }
  state.SetItemsProcessed(block_ops);
  state.counters["bytes_per_block"] =
      static_cast<double>(metadata_bytes) / num_blocks;
  state.counters["hit_ratio"] =
      static_cast<double>(hit_blocks) / static_cast<double>(block_ops);
  state.counters["pool_blocks"] = num_blocks;
}
BENCHMARK(BM_TraceReplay)
    ->ArgNames({"pct", "arc"})
    ->Args({10, 0})
    ->Args({10, 1})
    ->Unit(benchmark::kMillisecond);

// Baseline: XXH3-128 of each 16-token block of the same requests, no
// chaining, no pool. Items: blocks hashed.
void BM_TraceXxh3(benchmark::State& state) {
  const Trace* trace = TraceOrSkip(state);
  if (trace == nullptr) return;
  std::vector<TokenId> tokens;
  int64_t blocks = 0;
  for (auto _ : state) {
    for (const TraceRequest& request : trace->requests) {
      state.PauseTiming();
      ExpandTokens(request, &tokens);
      state.ResumeTiming();
      uint64_t acc = 0;
      for (size_t i = 0; i + kBlockSize <= tokens.size(); i += kBlockSize) {
        acc ^=
            XXH3_128bits(tokens.data() + i, kBlockSize * sizeof(TokenId)).low64;
      }
      benchmark::DoNotOptimize(acc);
      blocks += static_cast<int64_t>(tokens.size()) / kBlockSize;
    }
  }
  state.SetItemsProcessed(blocks);
}
BENCHMARK(BM_TraceXxh3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

// --trace=PATH is this binary's own flag; the rest go to Google Benchmark.
int main(int argc, char** argv) {
  constexpr std::string_view kTraceFlag = "--trace=";
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.starts_with(kTraceFlag)) {
      tierkv::TracePath() = std::string(arg.substr(kTraceFlag.size()));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
