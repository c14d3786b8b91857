#include "tools/demo/real_model_demo.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tools/demo/demo_util.h"

namespace tierkv::demo {
namespace {

namespace po = boost::program_options;

constexpr const char* kAbout =
    "tierkv-demo real-model: a trained model (TinyStories' stories15M, 15.2 M\n"
    "parameters, fetched by `tools/run fetch-model`) reads prompts of a "
    "system\n"
    "prompt, short stories in random order and a continuation prompt, every\n"
    "chunk served from tierkv's chunk pool. Prints, for a few requests, the\n"
    "continuation of the full prefill beside those of chunk reuse (chunks\n"
    "computed alone, re-rotated into place) and of CacheBlend, then the\n"
    "agreement over all requests.\n"
    "\n"
    "Usage: tierkv-demo real-model [options]\n"
    "Exit status: 0 done, 1 failed (the model missing included), 2 bad "
    "usage.\n";

// `text` on one line (newlines written as \n), cut to `width`.
std::string OneLine(const std::string& text, size_t width) {
  std::string out;
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  if (out.size() > width) out = out.substr(0, width - 3) + "...";
  return out;
}

}  // namespace

StatusOr<RealModelDemoCommand> ParseRealModelDemoFlags(
    int argc, const char* const* argv) {
  RealModelDemoCommand command;
  RealModelDemoOptions& o = command.options;
  FidelityOptions& f = o.fidelity;
  std::string progress = "auto";
  po::options_description d("Options (default in parentheses)");
  po::options_description_easy_init add = d.add_options();
  add("help,h", "print this help and exit");
  add("prompts", Flag(&f.prompts), "requests measured");
  add("show", Flag(&o.show), "requests printed side by side");
  add("docs-per-prompt", Flag(&f.docs_per_prompt), "stories in each prompt");
  add("continuation", Flag(&f.continuation),
      "greedy tokens generated and compared per request");
  add("check-layer", Flag(&f.check_layer),
      "CacheBlend's check layer: every token is recomputed below it, the "
      "most deviating ones above it");
  add("seed", Flag(&f.seed), "picks the stories, their order and the prompt");
  add("selection-baselines", po::bool_switch(&f.selection_baselines),
      "also recompute, at each ratio between 0 and 1, as many reused tokens "
      "nearest the question, and random ones, to compare with CacheBlend's "
      "pick (slower)");
  add("model-dir", po::value(&o.model_dir),
      "where model.bin and tokenizer.bin are (default: TIERKV_REAL_MODEL_DIR "
      "or ~/.cache/tierkv/stories15M)");
  add("progress", po::value(&progress)->default_value(progress),
      "auto (a bar on a terminal, else lines), bar, lines or none");
  po::variables_map vm;
  TIERKV_RETURN_IF_ERROR(ParseCommandLine(argc, argv, d, &vm));
  if (vm.count("help") > 0) {
    std::ostringstream help;
    help << kAbout << '\n' << d;
    command.show_help = true;
    command.help_text = help.str();
    return command;
  }
  TIERKV_ASSIGN_OR_RETURN(o.progress, ParseProgress(progress));
  if (o.show < 0) return Status::InvalidArgument("--show must be >= 0");
  return command;
}

StatusOr<FidelityReport> RunRealModelDemo(const RealModelDemoOptions& options,
                                          std::ostream& out,
                                          std::ostream& progress) {
  const std::string dir =
      options.model_dir.empty() ? TrainedModelDir() : options.model_dir;
  out << "Loading stories15M from " << dir << "\n";
  TIERKV_ASSIGN_OR_RETURN(TrainedModel m, LoadTrainedModel(dir));
  const FidelityOptions& f = options.fidelity;
  out << f.prompts << " requests: a system prompt, " << f.docs_per_prompt
      << " short stories in random order and a continuation prompt. Every "
         "chunk is a hit in tierkv's chunk pool (an earlier request held the "
         "stories in reverse order). "
      << f.continuation
      << " greedy tokens per request; CacheBlend checks layer " << f.check_layer
      << " of " << m.model.config().num_layers << ".\n\n";
  ProgressReporter bar(options.progress, static_cast<uint64_t>(f.prompts),
                       "requests", progress);
  TIERKV_ASSIGN_OR_RETURN(FidelityReport report,
                          MeasureFidelity(m, f, [&](int32_t done, int32_t) {
                            bar.Update(static_cast<uint64_t>(done));
                          }));
  bar.Done();

  const auto stories = ShortStories();
  // Side by side: the full prefill, chunk reuse, and the CacheBlend ratio
  // closest to 0.15 (seed 001's default).
  size_t blend = 1;
  for (size_t k = 1; k < report.modes.size(); ++k) {
    if (report.modes[k].kind == FidelityModeKind::kCacheBlend &&
        std::abs(report.modes[k].ratio - 0.15) <
            std::abs(report.modes[blend].ratio - 0.15)) {
      blend = k;
    }
  }
  const size_t shown =
      std::min(report.prompts.size(), static_cast<size_t>(options.show));
  for (size_t i = 0; i < shown; ++i) {
    const FidelityPromptResult& p = report.prompts[i];
    out << "Request " << i + 1 << ": stories";
    for (int32_t s : p.prompt.stories) {
      out << " \"" << OneLine(std::string(stories[s]), 24) << "\"";
    }
    out << ", then \"" << p.prompt.question << "\" (" << p.tokens << " tokens, "
        << p.reused_tokens << " from the chunk pool)\n";
    const TokenId last = p.prompt.prompt.back();
    auto line = [&](const std::string& name, const std::vector<TokenId>& gen,
                    int32_t agree, bool agree_known) {
      char head[64];
      std::snprintf(head, sizeof(head), "  %-17s", (name + ":").c_str());
      out << head << OneLine(m.tokenizer.DecodeAll(gen, last), 96);
      if (agree_known) {
        out << "  [" << agree << "/" << f.continuation << " agree]";
      }
      out << "\n";
    };
    line("full prefill", p.full_continuation, 0, false);
    for (size_t k : {size_t{0}, blend}) {
      line(report.modes[k].name, p.modes[k].continuation,
           p.modes[k].agree_tokens, true);
    }
    out << "\n";
  }
  out << "Against the full causal prefill, over " << report.prompts.size()
      << " requests (KL in nats, at the last prompt token; continuation "
         "agreement counts leading tokens equal to the full prefill's):\n\n"
      << FidelityTable(report);
  return report;
}

}  // namespace tierkv::demo
