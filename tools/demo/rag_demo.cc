#include "tools/demo/rag_demo.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <numeric>
#include <sstream>
#include <utility>

#include "tools/daemon/daemon_flags.h"
#include "tools/demo/demo_util.h"
#include "tools/demo/rag_demo_internal.h"

namespace tierkv::demo {
namespace {

namespace po = boost::program_options;

// Content tokens are drawn from [0, kSeparator); the separator is one token
// no document or question contains.
constexpr TokenId kSeparator = 1023;
constexpr int64_t kMaxPromptTokens = int64_t{1} << 16;

}  // namespace

ReferenceModelConfig RagModelConfig() {
  return {.vocab_size = 1024,
          .hidden_size = 128,
          .num_layers = 4,
          .num_heads = 4,
          .num_kv_heads = 2,
          .head_dim = 32,
          .ffn_size = 384,
          .rope_theta = 10000,
          .rope_style = RopeStyle::kNeoX,
          .seed = 1};
}

KvLayout RagLayout() {
  return RagModelConfig().CacheLayout(kBlockSize, DType::kF32);
}

Status ValidateRagOptions(const RagDemoOptions& o) {
  auto at_least = [](const char* flag, int64_t value, int64_t min) -> Status {
    if (value >= min) return Status::Ok();
    return Status::InvalidArgument("--" + std::string(flag) +
                                   " must be at least " + std::to_string(min) +
                                   ", got " + std::to_string(value));
  };
  TIERKV_RETURN_IF_ERROR(at_least("workers", o.workers, 1));
  TIERKV_RETURN_IF_ERROR(at_least("nodes", o.nodes, 1));
  if (o.nodes > 8) {
    return Status::InvalidArgument("--nodes must be at most 8, got " +
                                   std::to_string(o.nodes));
  }
  if (o.nodes > o.requests) {
    return Status::InvalidArgument(
        "--requests (" + std::to_string(o.requests) +
        ") must give every node at least one; --nodes is " +
        std::to_string(o.nodes));
  }
  if (o.nodes == 1 && !o.redis_seeds.empty()) {
    return Status::InvalidArgument("--redis needs --nodes 2 or more");
  }
  TIERKV_RETURN_IF_ERROR(at_least("requests", o.requests, 1));
  TIERKV_RETURN_IF_ERROR(at_least("documents", o.documents, 1));
  TIERKV_RETURN_IF_ERROR(at_least("docs-per-prompt", o.docs_per_prompt, 1));
  TIERKV_RETURN_IF_ERROR(at_least("document-tokens", o.document_tokens, 1));
  TIERKV_RETURN_IF_ERROR(at_least("system-tokens", o.system_tokens, 1));
  TIERKV_RETURN_IF_ERROR(at_least("question-tokens", o.question_tokens, 1));
  if (o.workers > 64) {
    return Status::InvalidArgument("--workers must be at most 64, got " +
                                   std::to_string(o.workers));
  }
  if (o.docs_per_prompt > o.documents) {
    return Status::InvalidArgument(
        "--docs-per-prompt (" + std::to_string(o.docs_per_prompt) +
        ") cannot exceed --documents (" + std::to_string(o.documents) + ")");
  }
  const int64_t prompt = int64_t{o.system_tokens} + o.question_tokens +
                         int64_t{o.docs_per_prompt} * o.document_tokens;
  if (prompt > kMaxPromptTokens) {
    return Status::InvalidArgument(
        "a prompt of " + std::to_string(prompt) + " tokens is more than " +
        std::to_string(kMaxPromptTokens) +
        "; lower --document-tokens or --docs-per-prompt");
  }
  if (!(o.zipf >= 0 && o.zipf <= 10)) {
    return Status::InvalidArgument("--zipf must be in [0, 10]");
  }
  if (!(o.blend_ratio >= 0 && o.blend_ratio <= 1)) {
    return Status::InvalidArgument("--blend-ratio must be in [0, 1]");
  }
  // The pool must hold the largest chunk.
  const int32_t largest =
      (std::max(o.system_tokens, o.document_tokens) + kBlockSize - 1) /
      kBlockSize;
  if (o.chunk_pool_blocks < largest + 1) {
    return Status::InvalidArgument(
        "--chunk-pool-blocks must be at least " + std::to_string(largest + 1) +
        " (the largest chunk plus the null block), got " +
        std::to_string(o.chunk_pool_blocks));
  }
  const uint64_t slot = RagLayout().BlockBytes();
  if (o.host_bytes < 2 * slot) {
    return Status::InvalidArgument("--host-capacity must hold at least two " +
                                   std::to_string(slot) + "-byte blocks");
  }
  return Status::Ok();
}

RagWorkload GenerateRagWorkload(const RagDemoOptions& o) {
  RagWorkload w;
  Rng rng(o.seed);
  w.separator = {kSeparator};
  w.system = rng.Tokens(o.system_tokens, kSeparator);
  for (int32_t d = 0; d < o.documents; ++d) {
    w.documents.push_back(rng.Tokens(o.document_tokens, kSeparator));
  }
  std::vector<double> weight(static_cast<size_t>(o.documents));
  for (size_t k = 0; k < weight.size(); ++k) {
    weight[k] = 1.0 / std::pow(static_cast<double>(k + 1), o.zipf);
  }
  for (int32_t id = 0; id < o.requests; ++id) {
    RagRequest r;
    r.id = id;
    // Weighted draws without replacement; the draw order is the prompt
    // order, so the same documents come in many orders.
    std::vector<double> left = weight;
    for (int32_t i = 0; i < o.docs_per_prompt; ++i) {
      double x = rng.Unit() * std::accumulate(left.begin(), left.end(), 0.0);
      size_t k = 0;
      while (k + 1 < left.size() && (left[k] == 0 || x >= left[k])) {
        x -= left[k];
        ++k;
      }
      while (left[k] == 0) --k;  // Rounding ran past the last weight.
      left[k] = 0;
      r.documents.push_back(static_cast<int32_t>(k));
    }
    r.prompt = w.system;
    for (int32_t d : r.documents) {
      r.prompt.push_back(kSeparator);
      const auto& doc = w.documents[static_cast<size_t>(d)];
      r.prompt.insert(r.prompt.end(), doc.begin(), doc.end());
    }
    r.prompt.push_back(kSeparator);
    const std::vector<TokenId> question =
        rng.Tokens(o.question_tokens, kSeparator);
    r.prompt.insert(r.prompt.end(), question.begin(), question.end());
    w.requests.push_back(std::move(r));
  }
  return w;
}

// ---------------------------------------------------------------------------
// Flags.

namespace {

constexpr const char* kAbout =
    "tierkv-demo: tierkv end to end on a RAG workload (the main job).\n"
    "\n"
    "Starts tierkvd with a host tier smaller than the workload's chunks and\n"
    "a disk tier under it, then worker processes that run the reference\n"
    "model (testing/reference_model.h) on generated retrieval-augmented\n"
    "prompts: a shared system prompt, then documents drawn by Zipf\n"
    "popularity, in random order, then a question. Each prompt is split on\n"
    "the separator; every chunk (system prompt and documents) comes from the\n"
    "worker's device chunk pool, from tierkvd's host or disk tier (chunks\n"
    "any worker computed), or is computed at virtual positions and\n"
    "published. Chunks are re-rotated into place (RoPE) and only the\n"
    "question is computed. Each request is also prefilled without any cache,\n"
    "for comparison.\n"
    "\n"
    "Prints where the chunks came from, the blocks moved between tiers,\n"
    "prefill-time percentiles against the no-cache run, how far the logits\n"
    "moved, and tierkv-admin's stats. Progress goes to stderr.\n"
    "\n"
    "--nodes 2 (or more) plays several machines: one tierkvd per node, each\n"
    "with its own host and disk tiers, all on one remote tier on a Redis\n"
    "Cluster (started on loopback ports, or --redis). The requests run node\n"
    "by node; later nodes load the chunks earlier ones computed from the\n"
    "remote tier, checked bit for bit. The demo follows every node's KV\n"
    "events as a cache-aware router does and checks the index it rebuilds\n"
    "against each node's.\n"
    "\n"
    "Usage: tierkv-demo [options]\n"
    "       tierkv-demo prefix [options]   the prefix-caching demo (one\n"
    "                                      process; tierkv-demo prefix "
    "--help)\n"
    "       tierkv-demo real-model [options]\n"
    "                                      a trained model's continuations\n"
    "                                      with and without the chunk cache\n"
    "                                      (tierkv-demo real-model --help)\n"
    "Exit status: 0 done, 1 failed, 2 bad usage.\n";

}  // namespace

StatusOr<RagDemoCommand> ParseRagDemoFlags(int argc, const char* const* argv) {
  RagDemoCommand command;
  RagDemoOptions& o = command.options;
  bool worker = argc > 1 && std::string(argv[1]) == "worker";
  std::string progress = "auto";
  std::string host = "4M", disk = "1G";
  po::options_description d("Options (default in parentheses)");
  po::options_description_easy_init add = d.add_options();
  add("help,h", "print this help and exit");
  add("version", "print tierkv-demo's version and exit");
  add("seed", Flag(&o.seed), "workload RNG seed; same seed, same workload");
  add("workers", Flag(&o.workers), "worker processes (1..64)");
  add("requests", Flag(&o.requests), "requests in all, dealt round-robin");
  add("documents", Flag(&o.documents), "distinct documents");
  add("docs-per-prompt", Flag(&o.docs_per_prompt),
      "documents in each prompt, drawn without repetition");
  add("document-tokens", Flag(&o.document_tokens), "tokens per document");
  add("system-tokens", Flag(&o.system_tokens), "system prompt tokens");
  add("question-tokens", Flag(&o.question_tokens), "question tokens");
  add("zipf", Flag(&o.zipf),
      "popularity exponent: document k is drawn with weight 1/(k+1)^zipf");
  add("host-capacity", po::value(&host)->default_value(host),
      "tierkvd's host DRAM for KV blocks (K, M, G suffixes); the default is "
      "a quarter of the default workload, so blocks spill to disk");
  add("disk-capacity", po::value(&disk)->default_value(disk),
      "bound on tierkvd's disk tier");
  add("chunk-pool-blocks", Flag(&o.chunk_pool_blocks),
      "each worker's device chunk pool in 16-token blocks, the null block "
      "included");
  add("blend-ratio", Flag(&o.blend_ratio),
      "CacheBlend recompute ratio (seed 001); 0 keeps chunks isolated");
  add("verify", po::bool_switch(&o.verify),
      "also prefill each request with a private chunk store and count "
      "logits that differ in any bit (slower)");
  add("progress", po::value(&progress)->default_value(progress),
      "auto (a bar on a terminal, else lines), bar, lines or none");
  add("tierkvd", po::value(&o.tierkvd_path),
      "the tierkvd program (default: next to tierkv-demo)");
  add("work-dir", po::value(&o.work_dir),
      "keep tierkvd's socket, log and disk tier here (default: a temporary "
      "directory, removed at the end)");
  add("nodes", Flag(&o.nodes),
      "machines to play (1..8): with 2 or more, each node is a tierkvd of "
      "its own with --workers workers, all on one remote tier, a Redis "
      "Cluster; the requests run node by node, each node finding the "
      "earlier nodes' chunks there, and a router follows every node's KV "
      "events (needs redis-server and redis-cli; turns --verify on)");
  add("redis", po::value(&o.redis_seeds),
      "with --nodes: an existing Redis Cluster (HOST:PORT,...) instead of "
      "one started on loopback ports for the demo");
  po::options_description hidden;
  hidden.add_options()("socket", po::value(&o.socket_path))(
      "worker-index", po::value(&o.worker_index))(
      "request-begin", po::value(&o.request_begin))("request-end",
                                                    po::value(&o.request_end));
  po::options_description all;
  all.add(d).add(hidden);
  po::variables_map vm;
  TIERKV_RETURN_IF_ERROR(ParseCommandLine(argc - (worker ? 1 : 0),
                                          argv + (worker ? 1 : 0), all, &vm));
  if (vm.count("help") > 0) {
    std::ostringstream help;
    help << kAbout << '\n' << d;
    command.show_help = true;
    command.help_text = help.str();
    return command;
  }
  if (!worker && vm.count("socket") + vm.count("worker-index") +
                         vm.count("request-begin") + vm.count("request-end") >
                     0) {
    return Status::InvalidArgument(
        "--socket, --worker-index and --request-begin/-end are for worker "
        "processes only");
  }
  TIERKV_ASSIGN_OR_RETURN(o.progress, ParseProgress(progress));
  StatusOr<size_t> host_bytes = daemon::ParseBytes(host);
  if (!host_bytes.ok()) {
    return Status::InvalidArgument("--host-capacity: " +
                                   host_bytes.status().message());
  }
  StatusOr<size_t> disk_bytes = daemon::ParseBytes(disk);
  if (!disk_bytes.ok()) {
    return Status::InvalidArgument("--disk-capacity: " +
                                   disk_bytes.status().message());
  }
  o.host_bytes = *host_bytes;
  // Several nodes show blocks loaded across machines: checked bit for bit.
  if (o.nodes > 1) o.verify = true;
  o.disk_bytes = *disk_bytes;
  if (worker && o.socket_path.empty()) {
    return Status::InvalidArgument("a worker needs --socket");
  }
  TIERKV_RETURN_IF_ERROR(ValidateRagOptions(o));
  return command;
}

}  // namespace tierkv::demo
