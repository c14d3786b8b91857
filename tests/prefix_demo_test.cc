// PrefixDemo: the prefix-caching demo library behind tierkv-demo. Checks the
// report against bounds derived from the generated workload, not numbers
// copied from a run.
#include "tools/demo/prefix_demo.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/status_matchers.h"

namespace tierkv::demo {
namespace {

DemoOptions QuietOptions() {
  DemoOptions o;
  o.progress = ProgressMode::kNone;
  return o;
}

DemoReport RunOrDie(const DemoOptions& o, std::string* out_text = nullptr) {
  std::ostringstream out;
  std::ostringstream progress;
  StatusOr<DemoReport> report = RunPrefixDemo(o, out, progress);
  EXPECT_THAT(report, IsOk());
  if (out_text != nullptr) *out_text = out.str();
  return report.ok() ? *std::move(report) : DemoReport{};
}

int64_t BlocksFor(size_t tokens, int32_t block_size) {
  return static_cast<int64_t>((tokens + static_cast<size_t>(block_size) - 1) /
                              static_cast<size_t>(block_size));
}

// Tokens in whole blocks of a prefix of `tokens` tokens.
int32_t FullBlockTokens(size_t tokens, int32_t block_size) {
  return static_cast<int32_t>(tokens / static_cast<size_t>(block_size)) *
         block_size;
}

size_t CommonPrefix(const std::vector<TokenId>& a,
                    const std::vector<TokenId>& b) {
  return static_cast<size_t>(
      std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

std::vector<const char*> Argv(std::vector<const char*> flags) {
  flags.insert(flags.begin(), "tierkv-demo");
  return flags;
}

TEST(PrefixDemo, ReportIsDeterministicForAFixedSeed) {
  std::string first_text;
  std::string second_text;
  const DemoReport first = RunOrDie(QuietOptions(), &first_text);
  const DemoReport second = RunOrDie(QuietOptions(), &second_text);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first_text, second_text);

  DemoOptions other = QuietOptions();
  other.seed += 1;
  EXPECT_NE(GenerateWorkload(other)[0].prompt,
            GenerateWorkload(QuietOptions())[0].prompt);
}

TEST(PrefixDemo, DefaultWorkloadHitsOftenAndEvicts) {
  const DemoOptions o = QuietOptions();
  const DemoReport r = RunOrDie(o);
  const auto expected_requests =
      static_cast<uint64_t>(o.few_shot_tasks * o.questions_per_task +
                            o.chat_sessions * o.turns_per_chat);
  EXPECT_EQ(r.requests, expected_requests);
  EXPECT_GT(r.hit_rate, 0.25);
  EXPECT_GT(r.few_shot.hit_rate(), 0.0);
  EXPECT_GT(r.chat.hit_rate(), 0.0);
  EXPECT_GT(r.evictions, 0u) << "the default pool should be too small to "
                                "keep the whole workload cached";
  EXPECT_EQ(r.prefill_tokens_saved, r.hit_tokens);

  // Totals agree with the rows; no request hits past its last full block
  // before the final token.
  uint64_t prompt = 0;
  uint64_t hit = 0;
  for (const RequestResult& row : r.per_request) {
    prompt += static_cast<uint64_t>(row.prompt_tokens);
    hit += static_cast<uint64_t>(row.hit_tokens);
    EXPECT_LE(row.hit_tokens,
              FullBlockTokens(static_cast<size_t>(row.prompt_tokens - 1),
                              o.block_size));
  }
  EXPECT_EQ(r.prompt_tokens, prompt);
  EXPECT_EQ(r.hit_tokens, hit);
  EXPECT_EQ(r.few_shot.requests + r.chat.requests, r.requests);
}

// With a pool that can hold every block the run ever allocates, nothing is
// evicted: each chat turn hits at least every full block of the previous
// turn (prompt and decoded answer), and each later question of a few-shot
// task at least the full blocks it shares with the task's first question.
TEST(PrefixDemo, TurnsHitThePreviousTurnWhenThePoolIsLargeEnough) {
  DemoOptions o = QuietOptions();
  const std::vector<WorkloadRequest> workload = GenerateWorkload(o);
  int64_t all_blocks = 1;  // The null block.
  for (const WorkloadRequest& w : workload) {
    all_blocks += BlocksFor(w.prompt.size() + w.answer.size(), o.block_size);
  }
  o.pool_blocks = static_cast<int32_t>(all_blocks);
  const DemoReport r = RunOrDie(o);
  ASSERT_EQ(r.per_request.size(), workload.size());
  EXPECT_EQ(r.evictions, 0u);
  EXPECT_EQ(r.stopped_early, 0u);

  std::map<int32_t, const WorkloadRequest*> last_turn;       // By chat.
  std::map<int32_t, const WorkloadRequest*> first_question;  // By task.
  int checked = 0;
  for (size_t i = 0; i < workload.size(); ++i) {
    const WorkloadRequest& w = workload[i];
    int32_t bound = 0;
    if (w.kind == RequestKind::kChat) {
      if (const WorkloadRequest* prev = last_turn[w.group]; prev != nullptr) {
        // Everything the previous turn computed is cached: its prompt and
        // its answer but the last answer token, which was sampled and never
        // computed.
        bound = FullBlockTokens(prev->prompt.size() + prev->answer.size() - 1,
                                o.block_size);
      }
      last_turn[w.group] = &w;
    } else if (const auto it = first_question.find(w.group);
               it != first_question.end()) {
      bound =
          FullBlockTokens(std::min(CommonPrefix(w.prompt, it->second->prompt),
                                   w.prompt.size() - 1),
                          o.block_size);
    } else {
      first_question[w.group] = &w;
    }
    EXPECT_GE(r.per_request[i].hit_tokens, bound)
        << RequestKindName(w.kind) << " " << w.group << " turn " << w.turn;
    checked += bound > 0 ? 1 : 0;
  }
  EXPECT_GT(checked, static_cast<int>(workload.size()) / 2);
}

TEST(PrefixDemo, PoolTooSmallIsInvalidArgumentNamingTheMinimum) {
  DemoOptions o = QuietOptions();
  int64_t largest = 0;
  for (const WorkloadRequest& w : GenerateWorkload(o)) {
    largest = std::max(
        largest, BlocksFor(w.prompt.size() + w.answer.size(), o.block_size));
  }
  const int64_t minimum = largest + 1;  // Plus the null block.
  EXPECT_EQ(MinPoolBlocks(GenerateWorkload(o), o.block_size), minimum);

  o.pool_blocks = static_cast<int32_t>(minimum - 1);
  std::ostringstream out;
  std::ostringstream progress;
  const StatusOr<DemoReport> report = RunPrefixDemo(o, out, progress);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("--pool-blocks"), std::string::npos);
  EXPECT_NE(report.status().message().find(std::to_string(minimum)),
            std::string::npos)
      << report.status().message();
  EXPECT_EQ(out.str(), "") << "validation happens before any output";

  // The minimum itself runs, stopping requests early to make room.
  o.pool_blocks = static_cast<int32_t>(minimum);
  const DemoReport tight = RunOrDie(o);
  EXPECT_EQ(tight.requests, tight.per_request.size());
  EXPECT_GT(tight.stopped_early, 0u);
}

TEST(PrefixDemo, HelpExplainsTheDemoAndListsDefaults) {
  const std::vector<const char*> argv = Argv({"--help"});
  const StatusOr<DemoCommand> command =
      ParseDemoFlags(static_cast<int>(argv.size()), argv.data());
  ASSERT_THAT(command, IsOk());
  EXPECT_TRUE(command->show_help);
  const std::string& help = command->help_text;
  EXPECT_NE(help.find("few-shot"), std::string::npos);
  EXPECT_NE(help.find("--block-size arg (=16)"), std::string::npos) << help;
  EXPECT_NE(help.find("--pool-blocks arg (=" +
                      std::to_string(DemoOptions{}.pool_blocks) + ")"),
            std::string::npos);
  for (const char* flag :
       {"--seed", "--few-shot-tasks", "--examples-per-task", "--chat-sessions",
        "--turns-per-chat", "--message-tokens-min", "--answer-tokens-max",
        "--max-running", "--print-requests", "--progress"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
}

TEST(PrefixDemo, ParsesFlags) {
  const std::vector<const char*> argv =
      Argv({"--seed", "7", "--block-size", "32", "--progress", "none"});
  const StatusOr<DemoCommand> command =
      ParseDemoFlags(static_cast<int>(argv.size()), argv.data());
  ASSERT_THAT(command, IsOk());
  EXPECT_FALSE(command->show_help);
  EXPECT_EQ(command->options.seed, 7u);
  EXPECT_EQ(command->options.block_size, 32);
  EXPECT_EQ(command->options.progress, ProgressMode::kNone);
  EXPECT_EQ(command->options.pool_blocks, DemoOptions{}.pool_blocks);
}

TEST(PrefixDemo, RejectsBadFlagsWithInvalidArgument) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--block-size", "0"}, "--block-size"},
      {{"--pool-blocks", "3"}, "--pool-blocks"},
      {{"--answer-tokens-min", "9", "--answer-tokens-max", "8"},
       "--answer-tokens-min"},
      {{"--progress", "fancy"}, "--progress"},
      {{"--no-such-flag"}, "no-such-flag"},
      {{"--block-size", "many"}, "block-size"},
      {{"stray"}, "positional"},
  };
  for (const auto& [flags, mention] : cases) {
    const std::vector<const char*> argv = Argv(flags);
    const StatusOr<DemoCommand> command =
        ParseDemoFlags(static_cast<int>(argv.size()), argv.data());
    ASSERT_FALSE(command.ok()) << flags[0];
    EXPECT_EQ(command.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(command.status().message().find(mention), std::string::npos)
        << command.status().message();
  }
}

TEST(PrefixDemo, ProgressGoesToItsOwnStream) {
  DemoOptions o = QuietOptions();
  o.chat_sessions = 2;
  o.few_shot_tasks = 2;
  const std::string total =
      std::to_string(o.few_shot_tasks * o.questions_per_task +
                     o.chat_sessions * o.turns_per_chat);
  for (ProgressMode mode : {ProgressMode::kLines, ProgressMode::kBar}) {
    o.progress = mode;
    std::ostringstream out;
    std::ostringstream progress;
    ASSERT_THAT(RunPrefixDemo(o, out, progress), IsOk());
    EXPECT_NE(progress.str().find(total + "/" + total + " requests"),
              std::string::npos)
        << progress.str();
    EXPECT_EQ(progress.str().find('\r') != std::string::npos,
              mode == ProgressMode::kBar);
    EXPECT_EQ(out.str().find(total + "/"), std::string::npos);
    EXPECT_NE(out.str().find("overall hit rate"), std::string::npos);
  }
}

}  // namespace
}  // namespace tierkv::demo
