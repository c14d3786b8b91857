// `tierkv-demo real-model`: what tierkv's chunk cache does to a trained
// model's output. TinyStories' stories15M (testing/real_model.h) reads
// prompts of a system prompt, short stories in random order and a
// continuation prompt; every chunk comes from tierkv's chunk pool, cached
// by an earlier request that held the stories in another order. For a few
// requests the demo prints the greedy continuation of the full causal
// prefill beside those of chunk reuse and CacheBlend, then the agreement
// table over all of them. One process, no tierkvd: the model, not the
// transport, is what it shows.
#ifndef TIERKV_TOOLS_DEMO_REAL_MODEL_DEMO_H_
#define TIERKV_TOOLS_DEMO_REAL_MODEL_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "testing/real_model.h"
#include "tierkv/status.h"
#include "tools/demo/prefix_demo.h"

namespace tierkv::demo {

struct RealModelDemoOptions {
  FidelityOptions fidelity;  // prompts, seed, continuation, check layer.
  int32_t show = 3;          // Requests printed side by side. Default: 3.
  std::string model_dir;     // Default (empty): TrainedModelDir().
  ProgressMode progress = ProgressMode::kAuto;  // Default: kAuto.
};

struct RealModelDemoCommand {
  RealModelDemoOptions options;
  bool show_help = false;
  std::string help_text;
};

// tierkv-demo real-model's flags (argv[0] is "real-model"; see --help).
StatusOr<RealModelDemoCommand> ParseRealModelDemoFlags(int argc,
                                                       const char* const* argv);

// Loads the model, measures, prints the samples and the table to `out`
// and progress to `progress`.
StatusOr<FidelityReport> RunRealModelDemo(const RealModelDemoOptions& options,
                                          std::ostream& out,
                                          std::ostream& progress);

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_REAL_MODEL_DEMO_H_
