// The RAG demo's parent process: starts tierkvd and the workers, gathers
// their result lines, stops tierkvd and prints the report.
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <utility>

#include "ipc/socket_call.h"
#include "tools/admin/admin.h"
#include "tools/demo/demo_process.h"
#include "tools/demo/demo_util.h"
#include "tools/demo/rag_demo.h"
#include "tools/demo/rag_demo_internal.h"

namespace tierkv::demo {

// ---------------------------------------------------------------------------
// The parent: tierkvd, the workers, the report.

// Parses a worker's "result k=v ..." line.
StatusOr<RagRequestResult> ParseResult(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  std::map<std::string, std::string> kv;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) break;
    kv[word.substr(0, eq)] = word.substr(eq + 1);
  }
  RagRequestResult r;
  try {
    r.id = std::stoi(kv.at("id"));
    r.worker = std::stoi(kv.at("worker"));
    r.cached_ms = std::stod(kv.at("cached_us")) / 1000;
    r.cold_ms = std::stod(kv.at("cold_us")) / 1000;
    r.pool_hits = std::stoi(kv.at("pool"));
    r.host_hits = std::stoi(kv.at("host"));
    r.disk_hits = std::stoi(kv.at("disk"));
    r.computed = std::stoi(kv.at("computed"));
    r.tier_errors = std::stoi(kv.at("errors"));
    r.deviation = std::stod(kv.at("dev"));
    r.top1_agrees = kv.at("top1") == "1";
    const std::string& v = kv.at("verified");
    if (v != "-") r.verified = v == "1";
  } catch (const std::exception&) {
    return Status::DataLoss("malformed worker result: " + line);
  }
  return r;
}

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&v](double q) {  // Nearest rank.
    const auto rank = static_cast<size_t>(std::ceil(q * v.size()));
    return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return p;
}

// The flags a worker needs to regenerate the workload.
std::vector<std::string> WorkerArgs(const RagDemoOptions& o) {
  auto num = [](auto v) {
    std::ostringstream s;
    s << std::setprecision(17) << v;
    return s.str();
  };
  std::vector<std::string> a = {
      "--seed",
      num(o.seed),
      "--workers",
      num(o.workers),
      "--requests",
      num(o.requests),
      "--documents",
      num(o.documents),
      "--docs-per-prompt",
      num(o.docs_per_prompt),
      "--document-tokens",
      num(o.document_tokens),
      "--system-tokens",
      num(o.system_tokens),
      "--question-tokens",
      num(o.question_tokens),
      "--zipf",
      num(o.zipf),
      "--chunk-pool-blocks",
      num(o.chunk_pool_blocks),
      "--blend-ratio",
      num(o.blend_ratio),
      "--host-capacity",
      num(o.host_bytes),
      "--request-begin",
      num(o.request_begin),
      "--request-end",
      num(o.request_end),
  };
  if (o.verify) a.push_back("--verify");
  return a;
}

namespace {

void PrintReport(const RagDemoOptions& o, const RagDemoReport& r,
                 std::ostream& out) {
  const double block = static_cast<double>(RagLayout().BlockBytes());
  const int64_t chunks = r.pool_hits + r.host_hits + r.disk_hits + r.computed;
  auto row = [&](const char* name, int64_t n) {
    out << "  " << std::left << std::setw(24) << name << std::right
        << std::setw(8) << n << std::setw(9) << std::fixed
        << std::setprecision(1) << (chunks ? 100.0 * n / chunks : 0.0) << "%\n";
  };
  out << "\nChunks served (system prompt and documents), by tier\n"
      << "  " << std::left << std::setw(24) << "tier" << std::right
      << std::setw(8) << "chunks" << std::setw(10) << "share" << '\n';
  row("device chunk pool", r.pool_hits);
  row("host DRAM (tierkvd)", r.host_hits);
  row("disk (tierkvd)", r.disk_hits);
  row("computed", r.computed);
  if (r.tier_errors > 0) {
    out << "  (" << r.tier_errors
        << " tier errors: those chunks were computed instead)\n";
  }

  const HostTierStats& h = r.stats.host;
  auto moved = [&](const char* name, uint64_t blocks) {
    out << "  " << std::left << std::setw(28) << name << std::right
        << std::setw(8) << blocks << std::setw(13)
        << admin::HumanBytes(static_cast<double>(blocks) * block) << '\n';
  };
  out << "\nBlocks moved between tiers (" << admin::HumanBytes(block)
      << " each)\n";
  moved("device -> host  (stores)", h.stores_completed);
  moved("host -> device  (loads)", h.loads_completed);
  moved("host -> disk    (spills)", h.spills);
  moved("disk -> host    (promotions)", h.promotions);
  moved("host -> lost    (unspilled)", h.evicted_unspilled);

  auto ms = [&out](double v) {
    out << std::setw(9) << std::fixed << std::setprecision(1) << v;
  };
  out << "\nPrefill time per request (ms)   " << std::setw(9) << "p50"
      << std::setw(9) << "p90" << std::setw(9) << "p99" << std::setw(9)
      << "mean" << '\n';
  out << "  no cache (full prefill)     ";
  for (double v :
       {r.cold_ms.p50, r.cold_ms.p90, r.cold_ms.p99, r.cold_ms.mean}) {
    ms(v);
  }
  out << "\n  tierkv chunk cache          ";
  for (double v :
       {r.cached_ms.p50, r.cached_ms.p90, r.cached_ms.p99, r.cached_ms.mean}) {
    ms(v);
  }
  out << "\n  speedup                     ";
  for (auto [cold, cached] : {std::pair{r.cold_ms.p50, r.cached_ms.p50},
                              std::pair{r.cold_ms.p90, r.cached_ms.p90},
                              std::pair{r.cold_ms.p99, r.cached_ms.p99},
                              std::pair{r.cold_ms.mean, r.cached_ms.mean}}) {
    out << std::setw(8) << std::fixed << std::setprecision(1)
        << (cached > 0 ? cold / cached : 0.0) << 'x';
  }
  out << '\n';

  std::vector<double> dev;
  int64_t top1 = 0;
  for (const RagRequestResult& q : r.requests) {
    dev.push_back(q.deviation);
    top1 += q.top1_agrees ? 1 : 0;
  }
  out << "\nLast-token logits against the full prefill: median relative L2 "
         "deviation "
      << std::setprecision(3) << Summarise(dev).p50
      << ", top-1 token agrees in " << top1 << " of " << r.requests.size()
      << " requests\n"
      << (o.blend_ratio > 0
              ? "  (CacheBlend, seed 001: " +
                    std::to_string(static_cast<int>(o.blend_ratio * 100)) +
                    "% of the reused tokens recomputed)\n"
              : std::string(
                    "  (chunk-isolated attention, seed 000; "
                    "--blend-ratio recomputes toward full attention)\n"));
  if (o.verify) {
    out << "Verified: " << r.verified - r.mismatches << " of " << r.verified
        << " requests bit-identical to a private chunk store in the worker\n";
  }
  out << "\ntierkv-admin stats:\n" << admin::FormatStatsTable(r.stats);
}

}  // namespace

Status RunWorkers(const std::vector<std::vector<std::string>>& argvs,
                  ProgressReporter& bar, uint64_t done_before,
                  std::vector<RagRequestResult>* results,
                  std::ostream& progress) {
  std::vector<std::unique_ptr<Child>> workers;
  for (const std::vector<std::string>& argv : argvs) {
    TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Child> child,
                            Child::Spawn(argv, /*capture=*/true));
    workers.push_back(std::move(child));
  }
  uint64_t done = done_before;
  std::vector<std::string> partial(workers.size());
  std::string worker_errors;
  size_t open = workers.size();
  while (open > 0) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < workers.size(); ++i) {
      if (workers[i]->fd() < 0) continue;
      fds.push_back({workers[i]->fd(), POLLIN, 0});
      which.push_back(i);
    }
    if (poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) {
      return Status::Internal(std::string("poll: ") + std::strerror(errno));
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const size_t i = which[k];
      char buf[4096];
      const ssize_t n = read(workers[i]->fd(), buf, sizeof buf);
      if (n <= 0) {
        workers[i]->CloseOutput();
        --open;
        continue;
      }
      partial[i].append(buf, static_cast<size_t>(n));
      for (size_t eol; (eol = partial[i].find('\n')) != std::string::npos;) {
        const std::string line = partial[i].substr(0, eol);
        partial[i].erase(0, eol + 1);
        if (line.starts_with("result ")) {
          TIERKV_ASSIGN_OR_RETURN(RagRequestResult r, ParseResult(line));
          results->push_back(r);
          bar.Update(++done);
        } else {
          worker_errors += "worker " + std::to_string(i) + ": " + line + "\n";
        }
      }
    }
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (int code = workers[i]->Wait(); code != 0) {
      return Status::Internal("worker " + std::to_string(i) + " exited with " +
                              std::to_string(code) + "\n" + worker_errors);
    }
  }
  if (!worker_errors.empty()) progress << worker_errors;
  return Status::Ok();
}

void TallyRequests(RagDemoReport* report) {
  std::sort(report->requests.begin(), report->requests.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  std::vector<double> cached, cold;
  for (const RagRequestResult& r : report->requests) {
    cached.push_back(r.cached_ms);
    cold.push_back(r.cold_ms);
    report->pool_hits += r.pool_hits;
    report->host_hits += r.host_hits;
    report->disk_hits += r.disk_hits;
    report->computed += r.computed;
    report->tier_errors += r.tier_errors;
    if (r.verified.has_value()) {
      ++report->verified;
      if (!*r.verified) ++report->mismatches;
    }
  }
  report->cached_ms = Summarise(cached);
  report->cold_ms = Summarise(cold);
}

std::vector<std::string> TierkvdArgs(const RagDemoOptions& o,
                                     const std::string& tierkvd,
                                     const std::string& store,
                                     const std::string& dir) {
  const KvLayout layout = RagLayout();
  return {tierkvd,
          "--store",
          store,
          "--socket",
          dir + "/tierkvd.sock",
          "--host-capacity",
          std::to_string(o.host_bytes),
          "--layers",
          std::to_string(layout.num_layers),
          "--kv-heads",
          std::to_string(layout.num_kv_heads),
          "--head-dim",
          std::to_string(layout.head_dim),
          "--block-size",
          std::to_string(layout.block_size),
          "--dtype",
          "f32",
          "--disk-dir",
          dir + "/disk",
          "--disk-capacity",
          std::to_string(o.disk_bytes),
          "--log-file",
          dir + "/tierkvd.log"};
}

std::string TierkvdPath(const RagDemoOptions& o) {
  return o.tierkvd_path.empty()
             ? (std::filesystem::path(SelfPath()).parent_path() / "tierkvd")
                   .string()
             : o.tierkvd_path;
}

StatusOr<RagDemoReport> RunRagDemo(const RagDemoOptions& o, std::ostream& out,
                                   std::ostream& progress) {
  TIERKV_RETURN_IF_ERROR(ValidateRagOptions(o));
  if (o.nodes > 1) return RunNodesDemo(o, out, progress);
  const std::string tierkvd = TierkvdPath(o);
  const std::string worker = o.worker_path.empty() ? SelfPath() : o.worker_path;
  DirRemover cleanup;
  TIERKV_RETURN_IF_ERROR(MakeWorkDir(o.work_dir, &cleanup));
  const std::string& dir = cleanup.dir;
  const std::string socket = dir + "/tierkvd.sock";
  const std::string log = dir + "/tierkvd.log";
  const std::string store = "demo-" + std::to_string(getpid());
  const KvLayout layout = RagLayout();

  const double block = static_cast<double>(layout.BlockBytes());
  const int32_t doc_blocks = (o.document_tokens + kBlockSize - 1) / kBlockSize;
  const int32_t sys_blocks = (o.system_tokens + kBlockSize - 1) / kBlockSize;
  out << "tierkv RAG demo: " << o.workers << " workers, " << o.requests
      << " requests. " << o.documents << " documents of " << o.document_tokens
      << " tokens, " << o.docs_per_prompt
      << " per prompt in random order, Zipf " << o.zipf << "; system prompt "
      << o.system_tokens << ", question " << o.question_tokens << " tokens.\n"
      << "Model: " << layout.ToString() << "; " << admin::HumanBytes(block)
      << " per " << kBlockSize << "-token block.\n"
      << "Chunk working set "
      << admin::HumanBytes((int64_t{o.documents} * doc_blocks + sys_blocks) *
                           block)
      << "; device chunk pool "
      << admin::HumanBytes((o.chunk_pool_blocks - 1) * block)
      << " per worker; host tier "
      << admin::HumanBytes(static_cast<double>(o.host_bytes))
      << "; disk tier (RocksDB) in " << dir << "/disk.\n"
      << std::flush;

  TIERKV_ASSIGN_OR_RETURN(
      std::unique_ptr<Child> daemon,
      StartTierkvd(TierkvdArgs(o, tierkvd, store, dir), socket, log));

  std::vector<std::vector<std::string>> argvs;
  for (int32_t i = 0; i < o.workers; ++i) {
    std::vector<std::string> argv = {worker,           "worker",
                                     "--socket",       socket,
                                     "--worker-index", std::to_string(i)};
    for (std::string& a : WorkerArgs(o)) argv.push_back(std::move(a));
    argvs.push_back(std::move(argv));
  }
  RagDemoReport report;
  ProgressReporter bar(o.progress, static_cast<uint64_t>(o.requests),
                       "requests", progress);
  TIERKV_RETURN_IF_ERROR(RunWorkers(argvs, bar, 0, &report.requests, progress));
  bar.Done();
  if (report.requests.size() != static_cast<size_t>(o.requests)) {
    return Status::Internal("the workers reported " +
                            std::to_string(report.requests.size()) + " of " +
                            std::to_string(o.requests) + " requests");
  }
  TIERKV_ASSIGN_OR_RETURN(report.stats, FetchStats(socket));
  TIERKV_RETURN_IF_ERROR(StopTierkvd(*daemon, log));
  TallyRequests(&report);
  PrintReport(o, report, out);
  return report;
}

}  // namespace tierkv::demo
