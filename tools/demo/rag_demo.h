// The RAG demo behind `tools/run demo`: tierkvd with a small host tier and
// a disk tier, and worker processes that run the reference model on a
// generated retrieval-augmented workload (a shared system prompt, documents
// of Zipf popularity, several per prompt in random order). Each worker
// serves chunks from its device chunk pool, from tierkvd's host and disk
// tiers (chunks other workers computed), or computes them, and times every
// prefill against a full prefill without any cache. Used by tierkv-demo and
// its tests; free functions, no global state.
#ifndef TIERKV_TOOLS_DEMO_RAG_DEMO_H_
#define TIERKV_TOOLS_DEMO_RAG_DEMO_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "src/coordinator.h"
#include "testing/cached_prefill.h"
#include "testing/reference_model.h"
#include "tierkv/block_key.h"
#include "tierkv/status.h"
#include "tools/demo/prefix_demo.h"

namespace tierkv::demo {

struct RagDemoOptions {
  uint64_t seed = 1;              // Workload RNG seed. Default: 1.
  int32_t workers = 2;            // Worker processes. Default: 2.
  int32_t requests = 64;          // In all, dealt round-robin. Default: 64.
  int32_t documents = 32;         // Distinct documents. Default: 32.
  int32_t docs_per_prompt = 4;    // Default: 4.
  int32_t document_tokens = 256;  // Default: 256.
  int32_t system_tokens = 64;     // Default: 64.
  int32_t question_tokens = 32;   // Default: 32.
  double zipf = 1.0;  // Document k is picked with weight 1/(k+1)^zipf.
  // Host DRAM tierkvd keeps KV blocks in. Default: 4 MiB, a quarter of the
  // default workload's chunks, so blocks spill to disk and come back.
  uint64_t host_bytes = uint64_t{4} << 20;
  uint64_t disk_bytes = uint64_t{1} << 30;  // Default: 1 GiB.
  // Each worker's device chunk pool, in blocks (the null block included).
  // Default: 65, four documents.
  int32_t chunk_pool_blocks = 65;
  // CacheBlend's recompute ratio (seed 001); 0 keeps chunks isolated
  // (seed 000). Default: 0.
  double blend_ratio = 0;
  // Each worker also prefills every request with a private chunk store
  // (no tierkvd) and counts logits that differ in any bit. Default: off.
  bool verify = false;
  ProgressMode progress = ProgressMode::kAuto;  // Default: kAuto.
  // Programs. Defaults (empty): tierkvd next to this binary; workers run
  // this binary.
  std::string tierkvd_path;
  std::string worker_path;
  // Where tierkvd's socket, log and disk tier go. Default (empty): a fresh
  // directory under /tmp, removed at the end.
  std::string work_dir;
  // Machines to play (--nodes): each node is a tierkvd of its own (its own
  // store, host and disk tiers) with `workers` workers, all of them on one
  // remote tier, a Redis Cluster. The requests run node by node, in equal
  // shares, each node once every earlier node's blocks are visible to it in
  // the remote tier; a router follows every node's KV events. Default: 1
  // (one tierkvd, no Redis).
  int32_t nodes = 1;
  // With nodes > 1: an existing Redis Cluster (HOST:PORT,...) to use, with
  // a tenant of the demo's own. Default (empty): a cluster of 3 masters
  // started on loopback ports (redis-server, redis-cli) and stopped at the
  // end.
  std::string redis_seeds;

  // Set for a worker process (tierkv-demo worker ...): it runs the requests
  // with ids in [request_begin, request_end) that are its by
  // id % workers == worker_index. request_end -1: to the last.
  std::string socket_path;
  int32_t worker_index = -1;
  int32_t request_begin = 0;
  int32_t request_end = -1;
};

// The model the demo runs: 4 layers, hidden 128, 4 query heads and 2 KV
// heads of dim 32, SwiGLU 384, vocabulary 1,024 (BENCHMARKS.md's RAG model).
ReferenceModelConfig RagModelConfig();
// Its KV layout in tierkv: fp32, 16-token blocks.
KvLayout RagLayout();

struct RagRequest {
  int32_t id = 0;
  std::vector<int32_t> documents;  // In prompt order.
  std::vector<TokenId> prompt;     // With separators.
};

struct RagWorkload {
  std::vector<TokenId> separator;
  std::vector<TokenId> system;
  std::vector<std::vector<TokenId>> documents;
  std::vector<RagRequest> requests;
};

// InvalidArgument naming the flag for any bad value.
Status ValidateRagOptions(const RagDemoOptions& options);
// Deterministic for a seed. REQUIRES: ValidateRagOptions(options).ok().
RagWorkload GenerateRagWorkload(const RagDemoOptions& options);

// One request as a worker ran it.
struct RagRequestResult {
  int32_t id = 0;
  int32_t worker = 0;
  double cached_ms = 0;  // Prefill with the chunk cache.
  double cold_ms = 0;    // Full causal prefill, no cache.
  // Where its chunks (system prompt and documents) came from.
  int32_t pool_hits = 0;
  int32_t host_hits = 0;
  int32_t disk_hits = 0;
  int32_t computed = 0;
  int32_t tier_errors = 0;
  // Logits of the last token against the full prefill's.
  double deviation = 0;  // Relative L2.
  bool top1_agrees = false;
  std::optional<bool> verified;  // With --verify: bit-identical.
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

// One node of a --nodes run: its tierkvd's stats at the end, and what a
// router that followed its KV events saw.
struct RagNodeReport {
  std::string name;           // "a", "b", ...
  int32_t first_request = 0;  // The requests its workers ran,
  int32_t end_request = 0;    // [first_request, end_request).
  // Chunks its workers took from the lower tier (disk or the remote tier).
  int64_t lower_hits = 0;
  int64_t computed = 0;
  CoordinatorStats stats;
  // Event batches and events by kind and medium the router received.
  uint64_t batches = 0;
  uint64_t stored[4] = {};  // By CacheMedium (1 CPU, 2 DISK, 3 REMOTE).
  uint64_t removed[4] = {};
  uint64_t cleared = 0;
  // Blocks the router's index holds per medium at the end, and whether it
  // equals what the node's tierkv-admin held lists.
  uint64_t held[4] = {};
  bool index_matches = false;
};

struct RagDemoReport {
  std::vector<RagRequestResult> requests;  // By id.
  Percentiles cached_ms;
  Percentiles cold_ms;
  int64_t pool_hits = 0, host_hits = 0, disk_hits = 0, computed = 0;
  int64_t tier_errors = 0;
  int64_t verified = 0, mismatches = 0;
  CoordinatorStats stats;  // tierkvd's, at the end (the first node's).
  std::vector<RagNodeReport> nodes;  // With --nodes 2 or more.
};

// Starts tierkvd and the workers, shows progress, waits, prints the report
// and tierkv-admin's stats table to `out`, stops tierkvd. With nodes > 1,
// RunNodesDemo.
StatusOr<RagDemoReport> RunRagDemo(const RagDemoOptions& options,
                                   std::ostream& out, std::ostream& progress);

// RunRagDemo with nodes > 1 (nodes_demo.cc): a Redis Cluster (or
// redis_seeds), one tierkvd per node with the remote tier and KV events
// on, the workers node by node, and a router that follows the events.
// Prints the per-node report and the router's view.
StatusOr<RagDemoReport> RunNodesDemo(const RagDemoOptions& options,
                                     std::ostream& out, std::ostream& progress);

// A worker process's body: attaches to options.socket_path and runs the
// requests with id % workers == worker_index, one result line each on
// `out` (the parent parses them).
Status RunRagWorker(const RagDemoOptions& options, std::ostream& out);

struct RagDemoCommand {
  RagDemoOptions options;
  bool show_help = false;
  std::string help_text;
};

// tierkv-demo's flags (see --help); `worker` as the first argument makes a
// worker process.
StatusOr<RagDemoCommand> ParseRagDemoFlags(int argc, const char* const* argv);

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_RAG_DEMO_H_
