// The prefix-caching demo behind `tierkv-demo prefix`: a generated
// workload that looks like real use (few-shot prompts, multi-turn chats) run
// through one KVCacheManager. Used by tierkv-demo and its tests; free
// functions, each call owns all its state, so concurrent calls are safe.
#ifndef TIERKV_TOOLS_DEMO_PREFIX_DEMO_H_
#define TIERKV_TOOLS_DEMO_PREFIX_DEMO_H_

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/request.h"
#include "tierkv/status.h"

namespace tierkv::demo {

// How progress is shown on the progress stream.
enum class ProgressMode : uint8_t {
  kAuto,   // The binary picks kBar on a TTY, else kLines; the library: kLines.
  kBar,    // One line redrawn with '\r'.
  kLines,  // A plain line every 25%.
  kNone,
};

struct DemoOptions {
  uint64_t seed = 1;                   // Workload RNG seed. Default: 1.
  int32_t system_prompt_tokens = 256;  // Shared by every request. Default: 256.

  // Few-shot prompts: system prompt + the task's examples + a question.
  int32_t few_shot_tasks = 8;        // Default: 8.
  int32_t examples_per_task = 5;     // Default: 5.
  int32_t example_tokens_min = 48;   // Default: 48.
  int32_t example_tokens_max = 128;  // Default: 128.
  int32_t questions_per_task = 40;   // Requests per task. Default: 40.

  // Chats: each turn's prompt is the previous prompt + its answer + a new
  // user message.
  int32_t chat_sessions = 24;   // Default: 24.
  int32_t turns_per_chat = 12;  // Default: 12.

  // Tokens of a few-shot question or a chat user message.
  int32_t message_tokens_min = 16;   // Default: 16.
  int32_t message_tokens_max = 160;  // Default: 160.
  // Tokens decoded per request (the answer).
  int32_t answer_tokens_min = 8;   // Default: 8.
  int32_t answer_tokens_max = 96;  // Default: 96.

  int32_t block_size = 16;  // Tokens per KV block. Default: 16.
  // Blocks in the pool, including the null block. Too small for the whole
  // workload, so cached blocks are evicted, but large enough for good hit
  // rates. Default: 3072.
  int32_t pool_blocks = 3072;
  int32_t max_running = 4;      // Requests decoding at once. Default: 4.
  int32_t print_requests = 20;  // Rows in the per-request table. Default: 20.
  ProgressMode progress = ProgressMode::kAuto;  // Default: kAuto.
};

enum class RequestKind : uint8_t { kFewShot, kChat };
std::string_view RequestKindName(RequestKind kind);  // "few-shot" or "chat".

// One request of the generated workload.
struct WorkloadRequest {
  RequestId id = 0;  // Position in arrival order.
  RequestKind kind = RequestKind::kFewShot;
  int32_t group = 0;  // Few-shot task or chat session.
  int32_t turn = 0;   // Question within the task, or chat turn.
  std::vector<TokenId> prompt;
  std::vector<TokenId> answer;  // Decoded token by token.
};

// The deterministic, interleaved workload for `options`; each group's
// requests keep their order. REQUIRES: ValidateDemoOptions(options).ok().
std::vector<WorkloadRequest> GenerateWorkload(const DemoOptions& options);

// Blocks a pool needs so the largest request (prompt + answer) fits alone,
// including the null block.
int32_t MinPoolBlocks(std::span<const WorkloadRequest> workload,
                      int32_t block_size);

// InvalidArgument, naming the flag and what is needed, for any bad value,
// including a pool too small for the largest request.
Status ValidateDemoOptions(const DemoOptions& options);

struct KindTotals {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;
  double hit_rate() const;  // hit_tokens / prompt_tokens; 0 when empty.
  friend bool operator==(const KindTotals&, const KindTotals&) = default;
};

struct RequestResult {
  RequestId id = 0;
  RequestKind kind = RequestKind::kFewShot;
  int32_t group = 0;
  int32_t turn = 0;
  int32_t prompt_tokens = 0;
  int32_t hit_tokens = 0;  // Prompt tokens served from the cache.
  friend bool operator==(const RequestResult&, const RequestResult&) = default;
};

struct DemoReport {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;
  double hit_rate = 0;                // hit_tokens / prompt_tokens.
  uint64_t prefill_tokens_saved = 0;  // = hit_tokens: no KV to compute.
  uint64_t evictions = 0;             // Cached blocks dropped for reuse.
  // Running requests stopped before their answer was complete because the
  // pool had no free block for another request.
  uint64_t stopped_early = 0;
  KindTotals few_shot;
  KindTotals chat;
  std::vector<RequestResult> per_request;  // In arrival order.
  friend bool operator==(const DemoReport&, const DemoReport&) = default;
};

// Generates the workload and runs it: per request GetComputedBlocks,
// AllocateSlots for the rest of the prompt, the answer decoded with
// AppendToken + CanAppend/MayAppend (up to max_running requests at once, the
// oldest finished when the window is full), then Free. Writes a header, the
// first print_requests rows and a summary to `out`; progress to `progress`.
StatusOr<DemoReport> RunPrefixDemo(const DemoOptions& options,
                                   std::ostream& out, std::ostream& progress);

// The parsed command line: either options to run or help to print.
struct DemoCommand {
  DemoOptions options;
  bool show_help = false;  // --help: print help_text and run nothing.
  std::string help_text;
};

// Parses tierkv-demo's flags (see --help). InvalidArgument, with a message
// for a person, for unknown flags and bad values.
StatusOr<DemoCommand> ParseDemoFlags(int argc, const char* const* argv);

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_PREFIX_DEMO_H_
