// RAG prefill with the reference model (issue 5): a 64-token system prompt,
// four 512-token documents and a 32-token question (2,144 tokens once the
// separators are dropped), prefilled four ways:
//   Cold        everything computed, full causal attention (the baseline);
//   PrefixOnly  prefix caching (seed 002): the documents were cached in
//               another order, so only the system prompt's blocks hit;
//   ChunkHits   every chunk a hit (seed 000): the system prompt and the four
//               documents remapped from the chunk pool with RopeRemap, only
//               the question computed, chunk-isolated attention;
//   Blend15     CacheBlend (seed 001) at recompute ratio 0.15, check layer 1.
// The BM_RagPrefillReal* benchmarks do the same with a trained model
// (TinyStories' stories15M, testing/real_model.h, which tools/run bench
// fetches): a system prompt, three short stories and a continuation prompt
// (about 150 tokens; the model's context is 256), the stories cached by a
// request that held them in reverse order.
// Counters: tokens_per_s (prompt tokens), computed (tokens through the last
// layer), speedup (CPU time of a cold prefill of the same prompt, measured
// once in this process, over this benchmark's). Run with tools/run bench;
// figures are in BENCHMARKS.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "testing/cached_prefill.h"
#include "testing/real_model.h"
#include "testing/reference_model.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/request.h"

namespace tierkv {
namespace {

constexpr int kSysTokens = 64;
constexpr int kDocTokens = 512;
constexpr int kDocs = 4;
constexpr int kQuestionTokens = 32;
constexpr int kTokens = kSysTokens + kDocs * kDocTokens + kQuestionTokens;
constexpr int32_t kBlockSize = 16;
constexpr TokenId kSep = 1023;

ReferenceModelConfig BenchConfig() {
  ReferenceModelConfig c;
  c.vocab_size = 1024;
  c.hidden_size = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.ffn_size = 384;
  c.seed = 5;
  return c;
}

std::vector<TokenId> RandomTokens(std::mt19937& rng, int n) {
  std::vector<TokenId> out(static_cast<size_t>(n));
  for (TokenId& t : out) t = rng() % kSep;
  return out;
}

// The cached request (documents 0, 1, 2, 3) and the timed one (2, 0, 3, 1),
// as chunked prompts and as plain sequences (separators dropped).
struct Workload {
  Workload() : model(ReferenceModel::Create(BenchConfig()).value()) {
    std::mt19937 rng(9);
    const std::vector<TokenId> sys = RandomTokens(rng, kSysTokens);
    std::vector<std::vector<TokenId>> docs;
    for (int d = 0; d < kDocs; ++d) {
      docs.push_back(RandomTokens(rng, kDocTokens));
    }
    const std::vector<TokenId> q_old = RandomTokens(rng, kQuestionTokens);
    const std::vector<TokenId> q = RandomTokens(rng, kQuestionTokens);
    Build({sys, docs[0], docs[1], docs[2], docs[3], q_old}, &cached_prompt,
          &cached_sequence);
    Build({sys, docs[2], docs[0], docs[3], docs[1], q}, &prompt, &sequence);
    slots.resize(kTokens);
    std::iota(slots.begin(), slots.end(), 0);
  }

  static void Build(const std::vector<std::vector<TokenId>>& parts,
                    std::vector<TokenId>* chunked,
                    std::vector<TokenId>* plain) {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) chunked->push_back(kSep);
      chunked->insert(chunked->end(), parts[i].begin(), parts[i].end());
      plain->insert(plain->end(), parts[i].begin(), parts[i].end());
    }
  }

  PagedKvCache NewCache(int64_t blocks) const {
    return PagedKvCache::Create(
               model.config().CacheLayout(kBlockSize, DType::kF32), blocks)
        .value();
  }

  ReferenceModel model;
  std::vector<TokenId> cached_prompt, cached_sequence;
  std::vector<TokenId> prompt, sequence;
  std::vector<int64_t> slots;
  const std::vector<TokenId> separator = {kSep};
};

const Workload& SharedWorkload() {
  static const Workload* workload = new Workload();
  return *workload;
}

double CpuSeconds() {
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

Status ColdPrefill(const Workload& w, PagedKvCache* cache) {
  return w.model.Prefill({.tokens = w.sequence, .slots = w.slots}, cache)
      .status();
}

// CPU seconds of one cold prefill: the median of three, measured once.
double ColdSeconds() {
  static const double seconds = [] {
    const Workload& w = SharedWorkload();
    PagedKvCache cache = w.NewCache(kTokens / kBlockSize + 1);
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      const double start = CpuSeconds();
      if (!ColdPrefill(w, &cache).ok()) return 0.0;
      runs.push_back(CpuSeconds() - start);
    }
    std::sort(runs.begin(), runs.end());
    return runs[1];
  }();
  return seconds;
}

void Report(benchmark::State& state, double timed_seconds, int64_t computed,
            int64_t tokens, double cold_seconds) {
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(tokens) * iterations, benchmark::Counter::kIsRate);
  state.counters["computed"] = static_cast<double>(computed);
  if (timed_seconds > 0) {
    state.counters["speedup"] = cold_seconds / (timed_seconds / iterations);
  }
}

void Report(benchmark::State& state, double timed_seconds, int64_t computed) {
  Report(state, timed_seconds, computed, kTokens, ColdSeconds());
}

void BM_RagPrefillCold(benchmark::State& state) {
  const Workload& w = SharedWorkload();
  PagedKvCache cache = w.NewCache(kTokens / kBlockSize + 1);
  ColdSeconds();
  double timed = 0;
  for (auto _ : state) {
    const double start = CpuSeconds();
    Status s = ColdPrefill(w, &cache);
    timed += CpuSeconds() - start;
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  Report(state, timed, kTokens);
}
BENCHMARK(BM_RagPrefillCold)->Unit(benchmark::kMillisecond);

void BM_RagPrefillPrefixOnly(benchmark::State& state) {
  const Workload& w = SharedWorkload();
  const KeyHasher hasher(KeyNamespace{"rag-prefill-bench", ""});
  constexpr int32_t kPoolBlocks = 2 * (kTokens / kBlockSize + 1) + 1;
  KVCacheManager manager =
      KVCacheManager::Create(
          {.pool = {.num_blocks = kPoolBlocks, .block_size = kBlockSize}})
          .value();
  PagedKvCache pool_cache = w.NewCache(kPoolBlocks);
  RequestId id = 1;
  const Request cached(id++, w.cached_sequence, kBlockSize, hasher);
  if (!PrefixCachedPrefill(w.model, &manager, cached, &pool_cache, 1).ok() ||
      !manager.Free(cached.id()).ok()) {
    state.SkipWithError("could not cache the first request");
    return;
  }
  ColdSeconds();
  double timed = 0;
  int32_t hit = 0;
  int64_t computed = 0;
  for (auto _ : state) {
    const double start = CpuSeconds();
    const Request request(id++, w.sequence, kBlockSize, hasher);
    StatusOr<PrefillOutput> out =
        PrefixCachedPrefill(w.model, &manager, request, &pool_cache, 1, &hit);
    timed += CpuSeconds() - start;
    if (!out.ok() || hit != kSysTokens) {
      state.SkipWithError("expected a hit on exactly the system prompt");
      break;
    }
    computed = out->computed_tokens;
    // Forget this request's own blocks, or the next one would hit them all.
    state.PauseTiming();
    const std::vector<BlockId> blocks(manager.blocks(request.id()).begin(),
                                      manager.blocks(request.id()).end());
    if (!manager.Free(request.id()).ok()) state.SkipWithError("free failed");
    for (size_t b = kSysTokens / kBlockSize; b < blocks.size(); ++b) {
      manager.EvictCachedBlock(blocks[b]);
    }
    state.ResumeTiming();
  }
  Report(state, timed, computed);
}
BENCHMARK(BM_RagPrefillPrefixOnly)->Unit(benchmark::kMillisecond);

// Chunk hits, with or without CacheBlend: the chunk pool holds the five
// chunks, cached by a request that had the documents in another order.
void RunChunked(benchmark::State& state, std::optional<BlendOptions> blend) {
  const Workload& w = SharedWorkload();
  StatusOr<ChunkKvStore> store = CreateChunkKvStore(
      w.model, {.num_blocks = kTokens / kBlockSize + 2 * kDocs + 2,
                .block_size = kBlockSize,
                .virtual_start = 0});
  PagedKvCache dst = w.NewCache(kTokens / kBlockSize + 1);
  if (!store.ok() ||
      !ChunkedPrefill(w.model, &*store, w.cached_prompt, w.separator, {}, &dst)
           .ok()) {
    state.SkipWithError("could not cache the chunks");
    return;
  }
  ColdSeconds();
  double timed = 0;
  int64_t computed = 0;
  for (auto _ : state) {
    const double start = CpuSeconds();
    StatusOr<ChunkedPrefillResult> r = ChunkedPrefill(
        w.model, &*store, w.prompt, w.separator, {.blend = blend}, &dst);
    timed += CpuSeconds() - start;
    if (!r.ok() || r->chunk_hits != kDocs + 1) {
      state.SkipWithError("expected every chunk to hit");
      break;
    }
    computed = r->output.computed_tokens;
  }
  Report(state, timed, computed);
}

void BM_RagPrefillChunkHits(benchmark::State& state) {
  RunChunked(state, std::nullopt);
}
BENCHMARK(BM_RagPrefillChunkHits)->Unit(benchmark::kMillisecond);

void BM_RagPrefillBlend15(benchmark::State& state) {
  RunChunked(state, BlendOptions{.recompute_ratio = 0.15, .check_layer = 1});
}
BENCHMARK(BM_RagPrefillBlend15)->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------
// The same with trained weights, on real text.

struct RealWorkload {
  static StatusOr<RealWorkload*> Create() {
    TIERKV_ASSIGN_OR_RETURN(TrainedModel m, LoadTrainedModel());
    FidelityOptions options;
    options.prompts = 1;
    TIERKV_ASSIGN_OR_RETURN(std::vector<FidelityPrompt> prompts,
                            MakeFidelityPrompts(m, options));
    auto w = std::make_unique<RealWorkload>(std::move(m));
    w->prompt = prompts[0].prompt;
    TIERKV_ASSIGN_OR_RETURN(AssembledPrompt assembled,
                            AssemblePrompt(w->prompt, w->separator));
    w->sequence = assembled.tokens;
    // The earlier request: the same chunks, stories in reverse order.
    const std::vector<TokenId> question(
        assembled.tokens.begin() + assembled.question.begin,
        assembled.tokens.begin() + assembled.question.end);
    w->cached_prompt = ReversedStoriesPrompt(assembled, question);
    w->chunks = static_cast<int32_t>(assembled.chunks.size());
    w->slots.resize(w->sequence.size());
    std::iota(w->slots.begin(), w->slots.end(), 0);
    return w.release();
  }

  explicit RealWorkload(TrainedModel model) : m(std::move(model)) {}

  int64_t tokens() const { return static_cast<int64_t>(sequence.size()); }
  int64_t blocks() const { return tokens() / kBlockSize + 1; }
  PagedKvCache NewCache() const {
    return PagedKvCache::Create(
               m.model.config().CacheLayout(kBlockSize, DType::kF32), blocks())
        .value();
  }

  TrainedModel m;
  std::vector<TokenId> prompt, cached_prompt, sequence;
  std::vector<int64_t> slots;
  int32_t chunks = 0;
  const std::vector<TokenId> separator = {kRealModelSeparator};
};

// The shared real workload, or why there is none (the model not fetched).
StatusOr<const RealWorkload*> SharedRealWorkload() {
  static const StatusOr<RealWorkload*> workload = RealWorkload::Create();
  if (!workload.ok()) return workload.status();
  return *workload;
}

double RealColdSeconds(const RealWorkload& w) {
  static const double seconds = [&] {
    PagedKvCache cache = w.NewCache();
    std::vector<double> runs;
    for (int i = 0; i < 3; ++i) {
      const double start = CpuSeconds();
      if (!w.m.model.Prefill({.tokens = w.sequence, .slots = w.slots}, &cache)
               .ok()) {
        return 0.0;
      }
      runs.push_back(CpuSeconds() - start);
    }
    std::sort(runs.begin(), runs.end());
    return runs[1];
  }();
  return seconds;
}

void BM_RagPrefillRealCold(benchmark::State& state) {
  StatusOr<const RealWorkload*> w = SharedRealWorkload();
  if (!w.ok()) {
    state.SkipWithError(w.status().ToString().c_str());
    return;
  }
  PagedKvCache cache = (*w)->NewCache();
  const double cold = RealColdSeconds(**w);
  if (cold <= 0) {
    state.SkipWithError("the cold prefill failed");
    return;
  }
  double timed = 0;
  for (auto _ : state) {
    const double start = CpuSeconds();
    Status s =
        (*w)->m.model
            .Prefill({.tokens = (*w)->sequence, .slots = (*w)->slots}, &cache)
            .status();
    timed += CpuSeconds() - start;
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  Report(state, timed, (*w)->tokens(), (*w)->tokens(), cold);
}
BENCHMARK(BM_RagPrefillRealCold)->Unit(benchmark::kMillisecond);

void RunRealChunked(benchmark::State& state,
                    std::optional<BlendOptions> blend) {
  StatusOr<const RealWorkload*> shared = SharedRealWorkload();
  if (!shared.ok()) {
    state.SkipWithError(shared.status().ToString().c_str());
    return;
  }
  const RealWorkload& w = **shared;
  StatusOr<ChunkKvStore> store = CreateChunkKvStore(
      w.m.model, {.num_blocks = static_cast<int32_t>(w.blocks()) + 2 * w.chunks,
                  .block_size = kBlockSize,
                  .virtual_start = 0});
  PagedKvCache dst = w.NewCache();
  if (!store.ok() || !ChunkedPrefill(w.m.model, &*store, w.cached_prompt,
                                     w.separator, {}, &dst)
                          .ok()) {
    state.SkipWithError("could not cache the chunks");
    return;
  }
  const double cold = RealColdSeconds(w);
  if (cold <= 0) {
    state.SkipWithError("the cold prefill failed");
    return;
  }
  double timed = 0;
  int64_t computed = 0;
  for (auto _ : state) {
    const double start = CpuSeconds();
    StatusOr<ChunkedPrefillResult> r = ChunkedPrefill(
        w.m.model, &*store, w.prompt, w.separator, {.blend = blend}, &dst);
    timed += CpuSeconds() - start;
    if (!r.ok() || r->chunk_hits != w.chunks) {
      state.SkipWithError("expected every chunk to hit");
      break;
    }
    computed = r->output.computed_tokens;
  }
  Report(state, timed, computed, w.tokens(), cold);
}

void BM_RagPrefillRealChunkHits(benchmark::State& state) {
  RunRealChunked(state, std::nullopt);
}
BENCHMARK(BM_RagPrefillRealChunkHits)->Unit(benchmark::kMillisecond);

void BM_RagPrefillRealBlend15(benchmark::State& state) {
  RunRealChunked(state,
                 BlendOptions{.recompute_ratio = 0.15, .check_layer = 1});
}
BENCHMARK(BM_RagPrefillRealBlend15)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
