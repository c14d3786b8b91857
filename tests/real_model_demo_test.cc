// `tierkv-demo real-model` (tools/demo/real_model_demo.h): its flags, its
// report on the trained model, and a clear error without the model.
#include "tools/demo/real_model_demo.h"

#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"

namespace tierkv::demo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

StatusOr<RealModelDemoCommand> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "real-model");
  return ParseRealModelDemoFlags(static_cast<int>(args.size()), args.data());
}

TEST(RealModelDemoFlags, DefaultsHelpAndBadValues) {
  StatusOr<RealModelDemoCommand> none = Parse({});
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->options.fidelity.prompts, FidelityOptions{}.prompts);
  StatusOr<RealModelDemoCommand> help = Parse({"--help"});
  ASSERT_THAT(help, IsOk());
  EXPECT_TRUE(help->show_help);
  EXPECT_THAT(help->help_text, HasSubstr("--check-layer"));
  StatusOr<RealModelDemoCommand> set =
      Parse({"--prompts", "5", "--check-layer", "2", "--show", "0"});
  ASSERT_THAT(set, IsOk());
  EXPECT_EQ(set->options.fidelity.prompts, 5);
  EXPECT_EQ(set->options.fidelity.check_layer, 2);
  EXPECT_EQ(set->options.show, 0);
  EXPECT_THAT(Parse({"--progress", "loud"}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Parse({"--show", "-1"}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Parse({"stray"}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(RealModelDemo, WithoutTheModelNamesFetchModel) {
  TempDir empty("tierkv-no-model");
  RealModelDemoOptions options;
  options.model_dir = empty.path();
  std::ostringstream out, progress;
  StatusOr<FidelityReport> r = RunRealModelDemo(options, out, progress);
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("tools/run fetch-model"));
}

// Bad options reach the user as errors, not as a run.
TEST(RealModelDemo, BadOptionsAreErrors) {
  RealModelDemoOptions options;
  options.fidelity.check_layer = 6;  // The model has layers 0..5.
  std::ostringstream out, progress;
  EXPECT_THAT(RunRealModelDemo(options, out, progress),
              StatusIs(StatusCode::kInvalidArgument));
  options.fidelity.check_layer = 1;
  options.fidelity.docs_per_prompt = 6;  // Past the 256-token context.
  StatusOr<FidelityReport> r = RunRealModelDemo(options, out, progress);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("context"));
}

TEST(RealModelDemo, PrintsContinuationsSideBySideAndTheTable) {
  RealModelDemoOptions options;
  options.fidelity.prompts = 2;
  options.fidelity.continuation = 8;
  options.show = 1;
  options.progress = ProgressMode::kNone;
  std::ostringstream out, progress;
  StatusOr<FidelityReport> r = RunRealModelDemo(options, out, progress);
  ASSERT_THAT(r, IsOk());
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("Request 1:"));
  EXPECT_THAT(text, Not(HasSubstr("Request 2:")));
  EXPECT_THAT(text, HasSubstr("full prefill:"));
  EXPECT_THAT(text, HasSubstr("chunk reuse:"));
  EXPECT_THAT(text, HasSubstr("CacheBlend 0.15:"));
  EXPECT_THAT(text, HasSubstr("| CacheBlend 1.00 | 100.0% | 0.0000 |"));
  EXPECT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->rows.size(), 1 + options.fidelity.ratios.size());
  EXPECT_TRUE(progress.str().empty());
}

}  // namespace
}  // namespace tierkv::demo
