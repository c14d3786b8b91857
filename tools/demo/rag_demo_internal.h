// What the RAG demo's sources (rag_demo.cc: the workload and the flags;
// rag_demo_worker.cc; rag_demo_driver.cc: the parent) share beyond
// rag_demo.h; not for use outside tools/demo.
#ifndef TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_
#define TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tools/demo/demo_util.h"
#include "tools/demo/rag_demo.h"

namespace tierkv::demo {

// Tokens per block (RagLayout's).
inline constexpr int32_t kBlockSize = 16;

// Parses a worker's "result k=v ..." line.
StatusOr<RagRequestResult> ParseResult(const std::string& line);
// Nearest-rank percentiles and the mean.
Percentiles Summarise(std::vector<double> v);
// The flags a worker needs to regenerate the workload (and its request
// range).
std::vector<std::string> WorkerArgs(const RagDemoOptions& o);
// tierkvd's command line for a store in `dir` (socket dir/tierkvd.sock, log
// dir/tierkvd.log, disk tier dir/disk), and its path.
std::vector<std::string> TierkvdArgs(const RagDemoOptions& o,
                                     const std::string& tierkvd,
                                     const std::string& store,
                                     const std::string& dir);
std::string TierkvdPath(const RagDemoOptions& o);
// Runs one worker process per argv to its end, adding each result line to
// `results` and moving `bar` on from `done_before`; Internal when a worker
// fails.
Status RunWorkers(const std::vector<std::vector<std::string>>& argvs,
                  ProgressReporter& bar, uint64_t done_before,
                  std::vector<RagRequestResult>* results,
                  std::ostream& progress);
// Sorts report->requests by id and sums them into its totals.
void TallyRequests(RagDemoReport* report);

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_RAG_DEMO_INTERNAL_H_
