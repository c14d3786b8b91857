// Prefix caching speed: keying a request against raw XXH3-128 of the same
// token bytes, and a full lookup/allocate/free cycle of the manager.
// Run with tools/run bench; figures and ratios are kept in BENCHMARKS.md.
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <numeric>
#include <random>
#include <vector>

#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

constexpr int kRequestTokens = 4096;

std::vector<TokenId> RandomTokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<TokenId> dist(0, 128'000);  // Llama-3 vocab.
  std::vector<TokenId> v(static_cast<size_t>(n));
  for (TokenId& t : v) t = dist(rng);
  return v;
}

// Keys of every full block of a 4,096-token request, chained from the root.
void BM_PrefixHash(benchmark::State& state) {
  const auto block_size = static_cast<int32_t>(state.range(0));
  const KeyHasher hasher(KeyNamespace{"bench-model", ""});
  const std::vector<TokenId> tokens = RandomTokens(kRequestTokens, 1);
  std::vector<BlockKey> keys;
  for (auto _ : state) {
    keys.clear();
    hasher.AppendPrefixKeys(tokens, block_size, {}, &keys);
    benchmark::DoNotOptimize(keys.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRequestTokens);
}
BENCHMARK(BM_PrefixHash)->Arg(16)->Arg(32)->Arg(64);

// Baseline: plain XXH3-128 over each block's token bytes, no chaining.
void BM_RawXXH3(benchmark::State& state) {
  const auto block_size = static_cast<size_t>(state.range(0));
  const std::vector<TokenId> tokens = RandomTokens(kRequestTokens, 1);
  for (auto _ : state) {
    uint64_t acc = 0;
    for (size_t i = 0; i + block_size <= tokens.size(); i += block_size) {
      acc ^=
          XXH3_128bits(tokens.data() + i, block_size * sizeof(TokenId)).low64;
    }
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(state.iterations() * kRequestTokens);
}
BENCHMARK(BM_RawXXH3)->Arg(16)->Arg(32)->Arg(64);

// get_computed_blocks + allocate_slots + free of a 4,096-token request whose
// first half is a prefix hit. Keys are computed once per request, when it
// arrives, as vLLM does; BM_ManagerCycleWithKeying adds that cost back.
// The second halves rotate through kVariants suffixes and the pool holds only
// two cycles' worth of them, so every suffix misses when it comes back.
constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocksPerRequest = kRequestTokens / kBlockSize;
constexpr int32_t kHitBlocks = kBlocksPerRequest / 2;
constexpr int kVariants = 8;

struct CycleFixture {
  KeyHasher hasher{KeyNamespace{"bench-model", ""}};
  KVCacheManager manager =
      KVCacheManager::Create(
          {.pool = {.num_blocks = 1 + kHitBlocks + 2 * kHitBlocks,
                    .block_size = kBlockSize}})
          .value();
  std::vector<TokenId> shared = RandomTokens(kRequestTokens / 2, 2);
  std::vector<std::vector<TokenId>> prompts;

  CycleFixture() {
    for (int v = 0; v < kVariants; ++v) {
      std::vector<TokenId> p = shared;
      const auto suffix = RandomTokens(kRequestTokens / 2, 100 + v);
      p.insert(p.end(), suffix.begin(), suffix.end());
      prompts.push_back(std::move(p));
    }
  }

  // One request's whole life in the pool; returns the blocks it hit.
  size_t Cycle(const Request& r) {
    ComputedBlocks c = manager.GetComputedBlocks(r);
    auto fresh = manager.AllocateSlots(r, r.num_tokens() - c.num_tokens, c);
    if (!fresh.ok() || !manager.Free(r.id()).ok()) return SIZE_MAX;
    return c.blocks.size();
  }
};

bool WarmUp(CycleFixture& f, benchmark::State& state) {
  for (int v = 0; v < 2 * kVariants; ++v) {
    Request r(static_cast<RequestId>(v), f.prompts[v % kVariants], kBlockSize,
              f.hasher);
    const size_t hits = f.Cycle(r);
    if (v > 0 && hits != static_cast<size_t>(kHitBlocks)) {
      state.SkipWithError("the workload does not hit exactly half");
      return false;
    }
  }
  return true;
}

void BM_ManagerCycle(benchmark::State& state) {
  CycleFixture f;
  if (!WarmUp(f, state)) return;
  std::vector<Request> requests;
  for (int v = 0; v < kVariants; ++v) {
    requests.emplace_back(static_cast<RequestId>(v), f.prompts[v], kBlockSize,
                          f.hasher);
  }
  size_t i = 0;
  size_t hit_blocks = 0;
  for (auto _ : state) {
    const size_t hits = f.Cycle(requests[i++ % kVariants]);
    if (hits != static_cast<size_t>(kHitBlocks)) {
      state.SkipWithError("a cycle failed or did not hit exactly half");
      break;
    }
    hit_blocks += hits;
  }
  state.SetItemsProcessed(state.iterations() * kBlocksPerRequest);
  state.counters["hit_fraction"] =
      static_cast<double>(hit_blocks) /
      static_cast<double>(state.iterations() * kBlocksPerRequest);
}
BENCHMARK(BM_ManagerCycle);

void BM_ManagerCycleWithKeying(benchmark::State& state) {
  CycleFixture f;
  if (!WarmUp(f, state)) return;
  size_t i = 0;
  for (auto _ : state) {
    Request r(static_cast<RequestId>(i), f.prompts[i % kVariants], kBlockSize,
              f.hasher);
    ++i;
    if (f.Cycle(r) != static_cast<size_t>(kHitBlocks)) {
      state.SkipWithError("a cycle failed or did not hit exactly half");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kBlocksPerRequest);
}
BENCHMARK(BM_ManagerCycleWithKeying);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
