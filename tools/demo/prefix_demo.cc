#include "tools/demo/prefix_demo.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstddef>
#include <iomanip>
#include <list>
#include <sstream>
#include <string>
#include <utility>

#include "src/kv_cache_manager_internal.h"
#include "tierkv/kv_cache_manager.h"
#include "tools/demo/demo_util.h"

namespace tierkv::demo {
namespace {

namespace po = boost::program_options;

constexpr uint32_t kVocabSize = 32000;
// Keeps a mistyped flag from asking for gigabytes of tokens.
constexpr int64_t kMaxRequestTokens = int64_t{1} << 24;
constexpr int64_t kMaxWorkloadTokens = int64_t{1} << 28;
constexpr int64_t kMaxPoolTokens = int64_t{1} << 28;

void Append(std::span<const TokenId> tail, std::vector<TokenId>* out) {
  out->insert(out->end(), tail.begin(), tail.end());
}

// Builds the interleaved workload. Streams 0..tasks-1 are few-shot tasks,
// the rest chat sessions; each arrival picks a stream with probability
// proportional to its remaining requests, so all of them end near the end.
class WorkloadBuilder {
 public:
  // Task prefixes and chat histories start empty and are filled at their
  // first request, so idle groups cost nothing.
  explicit WorkloadBuilder(const DemoOptions& o)
      : o_(o),
        rng_(o.seed),
        system_(rng_.Tokens(o.system_prompt_tokens, kVocabSize)),
        task_prefix_(static_cast<size_t>(o.few_shot_tasks)),
        chat_history_(static_cast<size_t>(o.chat_sessions)) {}

  std::vector<WorkloadRequest> Build() {
    std::vector<int32_t> remaining(task_prefix_.size(), o_.questions_per_task);
    remaining.resize(remaining.size() + chat_history_.size(),
                     o_.turns_per_chat);
    int64_t left = 0;
    for (int32_t r : remaining) left += r;
    std::vector<WorkloadRequest> out;
    out.reserve(static_cast<size_t>(left));
    for (; left > 0; --left) {
      const size_t s = PickStream(remaining, left);
      const bool few_shot = s < task_prefix_.size();
      const int32_t total =
          few_shot ? o_.questions_per_task : o_.turns_per_chat;
      const int32_t turn = total - remaining[s]--;
      out.push_back(few_shot ? FewShot(s, turn)
                             : ChatTurn(s - task_prefix_.size(), turn));
      out.back().id = out.size() - 1;
    }
    return out;
  }

 private:
  size_t PickStream(const std::vector<int32_t>& remaining, int64_t left) {
    auto pick = static_cast<int64_t>(rng_.Next() % static_cast<uint64_t>(left));
    size_t s = 0;
    while (pick >= remaining[s]) pick -= remaining[s++];
    return s;
  }

  std::vector<TokenId> Message() {
    return rng_.Tokens(
        rng_.Uniform(o_.message_tokens_min, o_.message_tokens_max), kVocabSize);
  }
  std::vector<TokenId> Answer() {
    return rng_.Tokens(rng_.Uniform(o_.answer_tokens_min, o_.answer_tokens_max),
                       kVocabSize);
  }

  static WorkloadRequest Start(RequestKind kind, size_t group, int32_t turn) {
    WorkloadRequest w;
    w.kind = kind;
    w.group = static_cast<int32_t>(group);
    w.turn = turn;
    return w;
  }

  // The system prompt + the task's examples, shared by its questions.
  const std::vector<TokenId>& TaskPrefix(size_t task) {
    std::vector<TokenId>& prefix = task_prefix_[task];
    if (!prefix.empty()) return prefix;
    prefix = system_;
    for (int32_t e = 0; e < o_.examples_per_task; ++e) {
      Append(rng_.Tokens(
                 rng_.Uniform(o_.example_tokens_min, o_.example_tokens_max),
                 kVocabSize),
             &prefix);
    }
    return prefix;
  }

  WorkloadRequest FewShot(size_t task, int32_t question) {
    WorkloadRequest w = Start(RequestKind::kFewShot, task, question);
    w.prompt = TaskPrefix(task);
    Append(Message(), &w.prompt);
    w.answer = Answer();
    return w;
  }

  WorkloadRequest ChatTurn(size_t session, int32_t turn) {
    std::vector<TokenId>& history = chat_history_[session];
    WorkloadRequest w = Start(RequestKind::kChat, session, turn);
    w.prompt = turn == 0 ? system_ : history;
    Append(Message(), &w.prompt);
    w.answer = Answer();
    history = w.prompt;
    Append(w.answer, &history);  // The next turn's prompt extends this one.
    return w;
  }

  const DemoOptions& o_;
  Rng rng_;
  std::vector<TokenId> system_;
  std::vector<std::vector<TokenId>> task_prefix_;   // System + examples.
  std::vector<std::vector<TokenId>> chat_history_;  // Prompts + answers.
};

struct IntRange {
  const char* flag;
  int64_t value;
  int64_t min;
  int64_t max;
  const char* min_flag = nullptr;  // The flag `min` comes from, if any.
};

Status CheckRanges(const DemoOptions& o) {
  constexpr int64_t kSeg = 1 << 16;  // Tokens in one prompt segment.
  constexpr int64_t kCount = 1 << 20;
  const IntRange ranges[] = {
      {"--system-prompt-tokens", o.system_prompt_tokens, 0, kSeg},
      {"--few-shot-tasks", o.few_shot_tasks, 0, kCount},
      {"--examples-per-task", o.examples_per_task, 0, kCount},
      {"--example-tokens-min", o.example_tokens_min, 1, kSeg},
      {"--example-tokens-max", o.example_tokens_max, o.example_tokens_min, kSeg,
       "--example-tokens-min"},
      {"--questions-per-task", o.questions_per_task, 0, kCount},
      {"--chat-sessions", o.chat_sessions, 0, kCount},
      {"--turns-per-chat", o.turns_per_chat, 0, kCount},
      {"--message-tokens-min", o.message_tokens_min, 1, kSeg},
      {"--message-tokens-max", o.message_tokens_max, o.message_tokens_min, kSeg,
       "--message-tokens-min"},
      {"--answer-tokens-min", o.answer_tokens_min, 0, kSeg},
      {"--answer-tokens-max", o.answer_tokens_max, o.answer_tokens_min, kSeg,
       "--answer-tokens-min"},
      {"--block-size", o.block_size, 1, 1 << 16},
      {"--pool-blocks", o.pool_blocks, 2, kMaxPoolTokens},
      {"--max-running", o.max_running, 1, kCount},
      {"--print-requests", o.print_requests, 0, kCount},
  };
  for (const IntRange& r : ranges) {
    if (r.min_flag != nullptr && r.value < r.min) {
      return Status::InvalidArgument(std::string(r.flag) + " (" +
                                     std::to_string(r.value) +
                                     ") must be at least " + r.min_flag + " (" +
                                     std::to_string(r.min) + ")");
    }
    if (r.value < r.min || r.value > r.max) {
      return Status::InvalidArgument(
          std::string(r.flag) + " must be in [" + std::to_string(r.min) + ", " +
          std::to_string(r.max) + "], got " + std::to_string(r.value));
    }
  }
  return Status::Ok();
}

// Upper bounds on request and workload size, so a typo cannot exhaust memory.
Status CheckSizes(const DemoOptions& o) {
  const int64_t turn = int64_t{o.message_tokens_max} + o.answer_tokens_max;
  const int64_t few_shot = o.system_prompt_tokens +
                           int64_t{o.examples_per_task} * o.example_tokens_max +
                           turn;
  const int64_t chat =
      o.system_prompt_tokens + int64_t{o.turns_per_chat} * turn;
  const int64_t requests = int64_t{o.few_shot_tasks} * o.questions_per_task +
                           int64_t{o.chat_sessions} * o.turns_per_chat;
  if (requests == 0) {
    return Status::InvalidArgument(
        "the workload is empty: set --few-shot-tasks and --questions-per-task, "
        "or --chat-sessions and --turns-per-chat, above 0");
  }
  if (std::max(few_shot, chat) > kMaxRequestTokens) {
    return Status::InvalidArgument(
        "a request could reach " + std::to_string(std::max(few_shot, chat)) +
        " tokens; the limit is " + std::to_string(kMaxRequestTokens) +
        " (lower the token counts or --turns-per-chat)");
  }
  if (requests * std::max(few_shot, chat) > kMaxWorkloadTokens) {
    return Status::InvalidArgument(
        "the workload could hold " +
        std::to_string(requests * std::max(few_shot, chat)) +
        " prompt tokens; the limit is " + std::to_string(kMaxWorkloadTokens) +
        " (fewer tasks, questions, sessions or turns)");
  }
  if (int64_t{o.pool_blocks} * o.block_size > kMaxPoolTokens) {
    return Status::InvalidArgument(
        "--pool-blocks x --block-size must be at most " +
        std::to_string(kMaxPoolTokens) + " tokens");
  }
  return Status::Ok();
}

Status CheckShape(const DemoOptions& o) {
  TIERKV_RETURN_IF_ERROR(CheckRanges(o));
  return CheckSizes(o);
}

Status CheckPoolFits(const DemoOptions& o,
                     std::span<const WorkloadRequest> workload) {
  const int32_t needed = MinPoolBlocks(workload, o.block_size);
  if (o.pool_blocks >= needed) return Status::Ok();
  return Status::InvalidArgument(
      "--pool-blocks " + std::to_string(o.pool_blocks) +
      " is too small: the largest request (prompt plus answer) needs " +
      std::to_string(needed - 1) + " blocks of " +
      std::to_string(o.block_size) +
      " tokens, plus the null block; use --pool-blocks " +
      std::to_string(needed) + " or more");
}

}  // namespace

std::string_view RequestKindName(RequestKind kind) {
  return kind == RequestKind::kFewShot ? "few-shot" : "chat";
}

double KindTotals::hit_rate() const {
  return prompt_tokens == 0 ? 0.0
                            : static_cast<double>(hit_tokens) /
                                  static_cast<double>(prompt_tokens);
}

std::vector<WorkloadRequest> GenerateWorkload(const DemoOptions& options) {
  return WorkloadBuilder(options).Build();
}

int32_t MinPoolBlocks(std::span<const WorkloadRequest> workload,
                      int32_t block_size) {
  size_t most = 0;
  for (const WorkloadRequest& w : workload) {
    most = std::max(most, w.prompt.size() + w.answer.size());
  }
  const auto bs = static_cast<size_t>(block_size);
  return static_cast<int32_t>((most + bs - 1) / bs) + 1;  // + null block.
}

Status ValidateDemoOptions(const DemoOptions& options) {
  TIERKV_RETURN_IF_ERROR(CheckShape(options));
  return CheckPoolFits(options, GenerateWorkload(options));
}

// ---------------------------------------------------------------------------
// Running the workload.

namespace {

// Drives one KVCacheManager through the workload like a scheduler would.
// Not movable: the requests it holds point at its hasher.
class Simulator {
 public:
  Simulator(const DemoOptions& o, KVCacheManager manager)
      : hasher_(KeyNamespace{"tierkv-demo/prefix", ""}),
        manager_(std::move(manager)),
        block_size_(o.block_size),
        max_running_(static_cast<size_t>(o.max_running)) {}
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  Status Run(std::span<const WorkloadRequest> workload,
             ProgressReporter* progress);
  DemoReport TakeReport();

 private:
  struct Running {
    const WorkloadRequest* work;
    Request request;
    size_t decoded = 0;  // Answer tokens appended so far.
    bool done() const { return decoded == work->answer.size(); }
  };
  using RunningList = std::list<Running>;  // Oldest first; stable references.

  Status Admit(const WorkloadRequest& w);
  StatusOr<int32_t> Prefill(const Request& request);
  Status WaitForPreviousTurn(const WorkloadRequest& w);
  Status DecodeStep();
  Status DecodeOne(Running& r);
  Status Finish(RunningList::iterator it);
  Status StopOldestExcept(const Running* keep);
  Status Release(RunningList::iterator it);
  void Record(const WorkloadRequest& w, int32_t hit_tokens);

  KeyHasher hasher_;
  KVCacheManager manager_;
  int32_t block_size_;
  size_t max_running_;
  RunningList running_;
  DemoReport report_;
};

Status Simulator::Run(std::span<const WorkloadRequest> workload,
                      ProgressReporter* progress) {
  uint64_t done = 0;
  for (const WorkloadRequest& w : workload) {
    TIERKV_RETURN_IF_ERROR(Admit(w));
    TIERKV_RETURN_IF_ERROR(DecodeStep());
    progress->Update(++done);
  }
  while (!running_.empty()) TIERKV_RETURN_IF_ERROR(Finish(running_.begin()));
  if (manager_.num_requests() != 0) {
    return Status::Internal("requests still hold blocks after the run");
  }
  return PoolOf(manager_).CheckInvariants();
}

// A scheduler step admits one request: its chat's previous turn must have
// answered, and a full window finishes its oldest request first.
Status Simulator::Admit(const WorkloadRequest& w) {
  TIERKV_RETURN_IF_ERROR(WaitForPreviousTurn(w));
  if (running_.size() >= max_running_) {
    TIERKV_RETURN_IF_ERROR(Finish(running_.begin()));
  }
  Request request(w.id, w.prompt, block_size_, hasher_);
  TIERKV_ASSIGN_OR_RETURN(const int32_t hit_tokens, Prefill(request));
  Record(w, hit_tokens);
  running_.push_back(Running{&w, std::move(request)});
  return Status::Ok();
}

// Allocates the uncached part of the prompt; returns the hit tokens. Under
// pressure stops the oldest running request and looks the prefix up again,
// since AllocateSlots wants a lookup with no pool change since.
StatusOr<int32_t> Simulator::Prefill(const Request& request) {
  while (true) {
    const ComputedBlocks computed = manager_.GetComputedBlocks(request);
    StatusOr<std::vector<BlockId>> slots = manager_.AllocateSlots(
        request, request.num_tokens() - computed.num_tokens, computed);
    if (slots.ok()) return computed.num_tokens;
    if (slots.status().code() != StatusCode::kResourceExhausted) {
      return slots.status();
    }
    TIERKV_RETURN_IF_ERROR(StopOldestExcept(nullptr));
  }
}

Status Simulator::WaitForPreviousTurn(const WorkloadRequest& w) {
  if (w.kind != RequestKind::kChat) return Status::Ok();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->work->kind == RequestKind::kChat && it->work->group == w.group) {
      return Finish(it);
    }
  }
  return Status::Ok();
}

// One engine step: every running request decodes one token; finished ones
// release their blocks.
Status Simulator::DecodeStep() {
  for (auto it = running_.begin(); it != running_.end();) {
    TIERKV_RETURN_IF_ERROR(DecodeOne(*it));
    // DecodeOne may stop other requests, never this one: take next now.
    const auto next = std::next(it);
    if (it->done()) TIERKV_RETURN_IF_ERROR(Release(it));
    it = next;
  }
  return Status::Ok();
}

Status Simulator::DecodeOne(Running& r) {
  if (r.done()) return Status::Ok();
  r.request.AppendToken(r.work->answer[r.decoded]);
  ++r.decoded;
  // The last sampled token ends the request: the engine never computes its
  // KV, so it gets no slot and keys no block.
  if (r.done()) return Status::Ok();
  while (!manager_.CanAppend(r.request)) {
    TIERKV_RETURN_IF_ERROR(StopOldestExcept(&r));
  }
  return manager_.MayAppend(r.request);
}

Status Simulator::Finish(RunningList::iterator it) {
  while (!it->done()) TIERKV_RETURN_IF_ERROR(DecodeOne(*it));
  return Release(it);
}

// Frees the blocks of the oldest running request other than `keep`, its
// answer cut short, as an engine out of blocks would.
Status Simulator::StopOldestExcept(const Running* keep) {
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (&*it == keep) continue;
    ++report_.stopped_early;
    return Release(it);
  }
  return Status::ResourceExhausted(
      "no running request left to stop: the pool cannot hold one request");
}

Status Simulator::Release(RunningList::iterator it) {
  TIERKV_RETURN_IF_ERROR(manager_.Free(it->request.id()));
  running_.erase(it);
  return Status::Ok();
}

void Simulator::Record(const WorkloadRequest& w, int32_t hit_tokens) {
  const auto prompt_tokens = static_cast<int32_t>(w.prompt.size());
  report_.per_request.push_back(
      RequestResult{w.id, w.kind, w.group, w.turn, prompt_tokens, hit_tokens});
  KindTotals& kind =
      w.kind == RequestKind::kFewShot ? report_.few_shot : report_.chat;
  ++kind.requests;
  kind.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
  kind.hit_tokens += static_cast<uint64_t>(hit_tokens);
}

DemoReport Simulator::TakeReport() {
  DemoReport r = std::move(report_);
  r.requests = r.few_shot.requests + r.chat.requests;
  r.prompt_tokens = r.few_shot.prompt_tokens + r.chat.prompt_tokens;
  r.hit_tokens = r.few_shot.hit_tokens + r.chat.hit_tokens;
  r.hit_rate = KindTotals{r.requests, r.prompt_tokens, r.hit_tokens}.hit_rate();
  r.prefill_tokens_saved = r.hit_tokens;
  r.evictions = manager_.stats().evictions;
  return r;
}

// ---------------------------------------------------------------------------
// Printing.

std::string WithCommas(uint64_t n) {
  std::string digits = std::to_string(n);
  for (auto i = static_cast<std::ptrdiff_t>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<size_t>(i), ",");
  }
  return digits;
}

std::string Percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << fraction * 100 << '%';
  return s.str();
}

std::string Range(int32_t lo, int32_t hi) {
  return lo == hi ? std::to_string(lo)
                  : std::to_string(lo) + "-" + std::to_string(hi);
}

void PrintHeader(const DemoOptions& o, size_t requests, std::ostream& out) {
  out << "tierkv prefix-caching demo\n"
      << "  workload  " << WithCommas(requests)
      << " requests, interleaved (seed " << o.seed << ")\n"
      << "    few-shot  " << o.few_shot_tasks << " tasks x "
      << o.questions_per_task << " questions: a " << o.system_prompt_tokens
      << "-token system prompt + " << o.examples_per_task << " examples of "
      << Range(o.example_tokens_min, o.example_tokens_max)
      << " tokens + a question\n"
      << "    chat      " << o.chat_sessions << " sessions x "
      << o.turns_per_chat
      << " turns: previous prompt + its answer + a new user message\n"
      << "    messages  " << Range(o.message_tokens_min, o.message_tokens_max)
      << " tokens; answers " << Range(o.answer_tokens_min, o.answer_tokens_max)
      << " tokens, decoded with up to " << o.max_running
      << " requests running\n"
      << "  pool      " << WithCommas(static_cast<uint64_t>(o.pool_blocks))
      << " blocks x " << o.block_size
      << " tokens (one is the null block); freed blocks stay cached "
         "until evicted (LRU)\n\n"
      << std::flush;  // Before the progress output, when both share a file.
}

std::string Describe(const RequestResult& r) {
  return r.kind == RequestKind::kFewShot
             ? "task " + std::to_string(r.group) + ", question " +
                   std::to_string(r.turn)
             : "chat " + std::to_string(r.group) + ", turn " +
                   std::to_string(r.turn);
}

void PrintTable(const DemoReport& report, int32_t rows, std::ostream& out) {
  const size_t n =
      std::min(report.per_request.size(), static_cast<size_t>(rows));
  if (n == 0) return;
  out << "first " << n << " requests\n"
      << std::right << std::setw(9) << "request"
      << "  " << std::left << std::setw(10) << "kind" << std::setw(22)
      << "which" << std::right << std::setw(8) << "prompt" << std::setw(8)
      << "hit" << std::setw(8) << "hit %" << '\n';
  for (size_t i = 0; i < n; ++i) {
    const RequestResult& r = report.per_request[i];
    const double rate = KindTotals{1, static_cast<uint64_t>(r.prompt_tokens),
                                   static_cast<uint64_t>(r.hit_tokens)}
                            .hit_rate();
    out << std::right << std::setw(9) << r.id << "  " << std::left
        << std::setw(10) << RequestKindName(r.kind) << std::setw(22)
        << Describe(r) << std::right << std::setw(8) << r.prompt_tokens
        << std::setw(8) << r.hit_tokens << std::setw(8) << Percent(rate)
        << '\n';
  }
  out << '\n';
}

void PrintKind(const char* name, const KindTotals& k, std::ostream& out) {
  out << "    " << std::left << std::setw(10) << name << std::right
      << std::setw(7) << Percent(k.hit_rate()) << "  ("
      << WithCommas(k.hit_tokens) << " of " << WithCommas(k.prompt_tokens)
      << " prompt tokens, " << WithCommas(k.requests) << " requests)\n";
}

void PrintSummary(const DemoReport& r, std::ostream& out) {
  out << "summary\n"
      << "  requests              " << WithCommas(r.requests) << '\n'
      << "  prompt tokens         " << WithCommas(r.prompt_tokens) << '\n'
      << "  hit tokens            " << WithCommas(r.hit_tokens) << '\n'
      << "  overall hit rate      " << Percent(r.hit_rate) << '\n'
      << "  prefill tokens saved  " << WithCommas(r.prefill_tokens_saved)
      << " (" << Percent(r.hit_rate) << " of prompt tokens)\n"
      << "  evictions             " << WithCommas(r.evictions)
      << " cached blocks\n"
      << "  stopped early         " << WithCommas(r.stopped_early)
      << " requests (pool out of free blocks)\n"
      << "  hit rate by kind\n";
  PrintKind("few-shot", r.few_shot, out);
  PrintKind("chat", r.chat, out);
}

}  // namespace

StatusOr<DemoReport> RunPrefixDemo(const DemoOptions& options,
                                   std::ostream& out, std::ostream& progress) {
  TIERKV_RETURN_IF_ERROR(CheckShape(options));
  const std::vector<WorkloadRequest> workload = GenerateWorkload(options);
  TIERKV_RETURN_IF_ERROR(CheckPoolFits(options, workload));
  KVCacheManagerOptions manager_options;
  manager_options.pool.num_blocks = options.pool_blocks;
  manager_options.pool.block_size = options.block_size;
  TIERKV_ASSIGN_OR_RETURN(KVCacheManager manager,
                          KVCacheManager::Create(manager_options));

  PrintHeader(options, workload.size(), out);
  Simulator simulator(options, std::move(manager));
  ProgressReporter reporter(options.progress, workload.size(), "requests",
                            progress);
  const Status run = simulator.Run(workload, &reporter);
  reporter.Done();  // Ends the bar's line, so an error starts on its own.
  TIERKV_RETURN_IF_ERROR(run);
  DemoReport report = simulator.TakeReport();
  PrintTable(report, options.print_requests, out);
  PrintSummary(report, out);
  return report;
}

// ---------------------------------------------------------------------------
// Flags.

namespace {

constexpr char kAbout[] =
    "tierkv-demo: prefix caching on a workload that looks like real use.\n"
    "\n"
    "Generates a deterministic, interleaved stream of requests:\n"
    "  - few-shot prompts: a shared system prompt + the task's shared\n"
    "    examples + a unique question;\n"
    "  - multi-turn chats: each turn's prompt is the previous turn's prompt\n"
    "    + its answer + a new user message, so it extends the earlier one.\n"
    "Each request looks up its longest cached prefix in a KVCacheManager,\n"
    "allocates blocks for the rest of its prompt, decodes its answer token\n"
    "by token (a few requests run at once) and frees its blocks, which stay\n"
    "cached until the pool evicts them (LRU). Prints per-request hit tokens,\n"
    "the overall hit rate and the prefill tokens saved; progress goes to\n"
    "stderr.\n"
    "\n"
    "Usage: tierkv-demo prefix [options]\n"
    "Exit status: 0 done, 1 failed, 2 bad usage.\n";

po::options_description DescribeFlags(DemoOptions* o, std::string* progress) {
  po::options_description d("Options (default in parentheses)");
  po::options_description_easy_init add = d.add_options();
  add("help,h", "print this help and exit");
  add("version", "print tierkv-demo's version and exit");
  add("seed", Flag(&o->seed), "workload RNG seed; same seed, same report");
  add("system-prompt-tokens", Flag(&o->system_prompt_tokens),
      "system prompt shared by every request");
  add("few-shot-tasks", Flag(&o->few_shot_tasks),
      "few-shot tasks, each with its own examples");
  add("examples-per-task", Flag(&o->examples_per_task),
      "examples in every prompt of a task");
  add("example-tokens-min", Flag(&o->example_tokens_min), "shortest example");
  add("example-tokens-max", Flag(&o->example_tokens_max), "longest example");
  add("questions-per-task", Flag(&o->questions_per_task),
      "few-shot requests per task");
  add("chat-sessions", Flag(&o->chat_sessions), "multi-turn chat sessions");
  add("turns-per-chat", Flag(&o->turns_per_chat), "requests per chat session");
  add("message-tokens-min", Flag(&o->message_tokens_min),
      "shortest question or user message");
  add("message-tokens-max", Flag(&o->message_tokens_max),
      "longest question or user message");
  add("answer-tokens-min", Flag(&o->answer_tokens_min),
      "fewest tokens decoded per request");
  add("answer-tokens-max", Flag(&o->answer_tokens_max),
      "most tokens decoded per request");
  add("block-size", Flag(&o->block_size), "tokens per KV block");
  add("pool-blocks", Flag(&o->pool_blocks),
      "KV blocks in the pool, including the null block; the default is too "
      "small for the whole workload, so blocks are evicted");
  add("max-running", Flag(&o->max_running),
      "requests decoding at once; the oldest finishes when full");
  add("print-requests", Flag(&o->print_requests),
      "rows in the per-request table");
  add("progress", po::value(progress)->default_value("auto"),
      "auto (a bar on a terminal, else lines), bar, lines or none");
  return d;
}

}  // namespace

StatusOr<DemoCommand> ParseDemoFlags(int argc, const char* const* argv) {
  DemoCommand command;
  std::string progress;
  const po::options_description flags =
      DescribeFlags(&command.options, &progress);
  po::variables_map vm;
  TIERKV_RETURN_IF_ERROR(ParseCommandLine(argc, argv, flags, &vm));
  if (vm.count("help") > 0) {
    std::ostringstream help;
    help << kAbout << '\n' << flags;
    command.show_help = true;
    command.help_text = help.str();
    return command;
  }
  TIERKV_ASSIGN_OR_RETURN(command.options.progress, ParseProgress(progress));
  TIERKV_RETURN_IF_ERROR(ValidateDemoOptions(command.options));
  return command;
}

}  // namespace tierkv::demo
