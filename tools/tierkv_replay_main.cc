// tierkv-replay: replays a request trace through tierkvd's eviction code
// and the offline optimum, and prints each policy's hit ratio beside the
// optimum's (tools/replay/replay.h).
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "tierkv/block_pool_options.h"
#include "tierkv/version.h"
#include "tools/demo/demo_util.h"
#include "tools/replay/replay.h"
#include "tools/replay/trace.h"

namespace {

namespace po = boost::program_options;
using tierkv::EvictionPolicy;
using tierkv::Status;
using tierkv::StatusOr;
using tierkv::demo::ProgressMode;
using tierkv::replay::BlockTrace;
using tierkv::replay::ReplayResult;

constexpr char kUsage[] =
    "Usage: tierkv-replay TRACE [FLAGS]\n"
    "\n"
    "Replays a request trace through the eviction code of tierkvd's host\n"
    "tier and through the offline optimum (Belady: evict the block used\n"
    "furthest in the future), for several cache sizes, and prints the\n"
    "hit ratio of each (prefix-hit blocks / requested blocks), its share of\n"
    "the optimum's, evictions and block operations per second.\n"
    "\n"
    "TRACE is JSON lines, one request each, in the Mooncake trace format:\n"
    "  {\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 8,\n"
    "   \"hash_ids\": [0, 1]}\n"
    "hash_ids are prefix-chained block ids (two requests sharing their first\n"
    "k ids share their first k blocks). Each request looks up its longest\n"
    "cached prefix, adds the rest, and frees its blocks. Only full blocks\n"
    "are keyed, as an engine keys them: a prompt whose input_length ends\n"
    "inside a block holds that block while it runs, but never hits on it\n"
    "(without input_length, every hash id is full).\n"
    "\n"
    "With --disk, a disk tier lies below the host pool, evicting by the same\n"
    "policy as tierkvd's: a request's prefix goes on from disk where the host\n"
    "misses (those blocks are promoted), every block it computes is written\n"
    "to disk (write-behind), and hits count in either tier; the optimum is\n"
    "then one cache of both tiers' blocks, a bound on any two tiers.\n"
    "\n"
    "Flags";

struct Flags {
  std::string trace;
  std::string capacities = "0.01,0.02,0.05,0.1,0.2,0.5,1";
  std::string policy;
  double disk = 0;
  int32_t block_tokens = 512;
  int32_t trace_block_tokens = 512;
  bool json = false;
  std::string progress = "auto";
};

StatusOr<std::vector<double>> ParseCapacities(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(value > 0) || value > 1) {
      return Status::InvalidArgument(
          "--capacities takes shares of the trace's distinct blocks in (0, 1] "
          "separated by commas, got '" +
          item + "'");
    }
    out.push_back(value);
  }
  if (out.empty()) return Status::InvalidArgument("--capacities is empty");
  return out;
}

StatusOr<std::vector<EvictionPolicy>> ParsePolicies(const std::string& text) {
  if (text.empty()) return std::vector{tierkv::kDefaultTierEviction};
  if (text == "all") {
    return std::vector{EvictionPolicy::kLru, EvictionPolicy::kArc};
  }
  std::vector<EvictionPolicy> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    TIERKV_ASSIGN_OR_RETURN(EvictionPolicy p,
                            tierkv::ParseEvictionPolicy(item));
    out.push_back(p);
  }
  if (out.empty()) return Status::InvalidArgument("--policy is empty");
  return out;
}

std::string Fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

struct Row {
  double capacity;
  EvictionPolicy policy;
  ReplayResult result;
  ReplayResult optimum;
};

double OpsPerSecond(const ReplayResult& r) {
  return r.seconds > 0 ? static_cast<double>(r.requested_blocks) / r.seconds
                       : 0;
}

double ShareOfOptimum(const Row& row) {
  const double best = row.optimum.hit_ratio();
  return best > 0 ? row.result.hit_ratio() / best : 1;
}

void PrintJson(const Flags& flags, const BlockTrace& trace,
               const std::vector<Row>& rows) {
  std::ostream& out = std::cout;
  out << "{\"trace\": \"";
  for (const char c : flags.trace) {
    if (c == '"' || c == '\\') out << '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out << c;
  }
  out << "\", \"requests\": " << trace.num_requests()
      << ", \"block_tokens\": " << trace.block_tokens()
      << ", \"requested_blocks\": " << trace.requested_blocks()
      << ", \"unique_blocks\": " << trace.unique_blocks() << ", \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    out << (i == 0 ? "" : ", ") << "{\"capacity\": " << row.capacity
        << ", \"capacity_blocks\": " << row.result.capacity_blocks
        << ", \"policy\": \"" << tierkv::EvictionPolicyName(row.policy)
        << "\", \"hit_ratio\": " << Fixed(row.result.hit_ratio(), 6)
        << ", \"optimum_hit_ratio\": " << Fixed(row.optimum.hit_ratio(), 6)
        << ", \"ratio_to_optimum\": " << Fixed(ShareOfOptimum(row), 4)
        << ", \"evictions\": " << row.result.evictions
        << ", \"optimum_evictions\": " << row.optimum.evictions
        << ", \"oversized_requests\": " << row.result.oversized_requests
        << ", \"block_ops_per_second\": " << Fixed(OpsPerSecond(row.result), 0);
    if (flags.disk > 0) {
      out << ", \"disk_capacity\": " << flags.disk << ", \"disk_hit_ratio\": "
          << Fixed(static_cast<double>(row.result.disk_hit_blocks) /
                       static_cast<double>(row.result.requested_blocks),
                   6)
          << ", \"disk_evictions\": " << row.result.disk_evictions;
    }
    out << "}";
  }
  out << "]}\n";
}

void PrintTable(const Flags& flags, const BlockTrace& trace,
                const std::vector<Row>& rows) {
  std::ostream& out = std::cout;
  out << flags.trace << ": " << trace.num_requests() << " requests, "
      << trace.requested_blocks() << " blocks of " << trace.block_tokens()
      << " tokens requested, " << trace.unique_blocks() << " distinct\n\n";
  if (flags.disk > 0) {
    out << "with a disk tier of " << Fixed(flags.disk * 100, 1)
        << " % of the distinct blocks below each host pool; the optimum holds "
           "both tiers' blocks\n\n";
  }
  std::printf("%9s %9s %-7s %9s %9s %10s %10s %13s", "capacity", "blocks",
              "policy", "hit ratio", "optimum", "/ optimum", "evictions",
              "block ops/s");
  if (flags.disk > 0) std::printf(" %9s", "from disk");
  std::printf("\n");
  std::fflush(stdout);
  int64_t oversized = 0;
  for (const Row& row : rows) {
    std::printf(
        "%8s%% %9d %-7s %9.3f %9.3f %10.2f %10lld %13.0f",
        Fixed(row.capacity * 100, row.capacity < 0.1 ? 1 : 0).c_str(),
        row.result.capacity_blocks,
        std::string(tierkv::EvictionPolicyName(row.policy)).c_str(),
        row.result.hit_ratio(), row.optimum.hit_ratio(), ShareOfOptimum(row),
        static_cast<long long>(row.result.evictions), OpsPerSecond(row.result));
    if (flags.disk > 0) {
      std::printf(" %9.3f",
                  static_cast<double>(row.result.disk_hit_blocks) /
                      static_cast<double>(row.result.requested_blocks));
    }
    std::printf("\n");
    oversized += row.result.oversized_requests;
  }
  std::fflush(stdout);
  if (oversized > 0) {
    out << "\n"
        << oversized
        << " replays of a request larger than the cache skipped it: no hit, "
           "the cache untouched (the largest request has "
        << trace.largest_request() << " blocks)\n";
  }
}

int Run(const Flags& flags) {
  auto fail = [](const Status& s) {
    std::cerr << "tierkv-replay: " << s.ToString() << '\n';
    return s.code() == tierkv::StatusCode::kInvalidArgument ? 2 : 1;
  };
  auto capacities = ParseCapacities(flags.capacities);
  if (!capacities.ok()) return fail(capacities.status());
  auto policies = ParsePolicies(flags.policy);
  if (!policies.ok()) return fail(policies.status());
  auto mode = tierkv::demo::ParseProgress(flags.progress);
  if (!mode.ok()) return fail(mode.status());
  if (*mode == ProgressMode::kAuto) {
    *mode = isatty(STDERR_FILENO) ? ProgressMode::kBar : ProgressMode::kNone;
  }
  auto requests = tierkv::replay::LoadTrace(flags.trace);
  if (!requests.ok()) return fail(requests.status());
  auto trace = BlockTrace::Build(
      *requests, {.trace_block_tokens = flags.trace_block_tokens,
                  .block_tokens = flags.block_tokens});
  if (!trace.ok()) return fail(trace.status());
  requests->clear();

  const int64_t per_replay = trace->num_requests();
  const auto replays =
      static_cast<int64_t>(capacities->size() * (policies->size() + 1));
  tierkv::demo::ProgressReporter progress(
      *mode, static_cast<uint64_t>(per_replay * replays), "requests replayed",
      std::cerr);
  int64_t done_before = 0;
  auto report = [&](int64_t done) {
    progress.Update(static_cast<uint64_t>(done_before + done));
  };
  if (!(flags.disk >= 0 && flags.disk <= 1)) {
    return fail(Status::InvalidArgument(
        "--disk takes a share of the trace's distinct blocks in [0, 1], got " +
        std::to_string(flags.disk)));
  }
  const auto blocks_of = [&](double share) {
    return static_cast<int32_t>(std::clamp<int64_t>(
        std::llround(share * static_cast<double>(trace->unique_blocks())), 1,
        std::numeric_limits<int32_t>::max() / 2));
  };
  const int32_t disk_blocks = flags.disk > 0 ? blocks_of(flags.disk) : 0;
  std::vector<Row> rows;
  for (const double capacity : *capacities) {
    const int32_t blocks = blocks_of(capacity);
    // One cache of both tiers' blocks, skipping what the host cannot hold,
    // as the tiers do.
    auto optimum = tierkv::replay::ReplayOptimum(*trace, blocks + disk_blocks,
                                                 report, blocks);
    if (!optimum.ok()) return fail(optimum.status());
    done_before += per_replay;
    for (const EvictionPolicy policy : *policies) {
      auto result = tierkv::replay::ReplayTiers(*trace, blocks, disk_blocks,
                                                policy, report);
      if (!result.ok()) return fail(result.status());
      if (result->hit_blocks > optimum->hit_blocks) {
        return fail(Status::Internal(
            std::string(tierkv::EvictionPolicyName(policy)) + " hit " +
            std::to_string(result->hit_blocks) + " blocks, the optimum " +
            std::to_string(optimum->hit_blocks) +
            ": the optimum is wrong; please report it with the trace"));
      }
      done_before += per_replay;
      rows.push_back({capacity, policy, *result, *optimum});
    }
  }
  progress.Done();
  if (flags.json) {
    PrintJson(flags, *trace, rows);
  } else {
    PrintTable(flags, *trace, rows);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (tierkv::WantsVersion(argc, argv)) {
    std::cout << "tierkv-replay " << tierkv::Version() << "\n";
    return 0;
  }
  Flags flags;
  po::options_description options(kUsage);
  options.add_options()("help,h", "show this help")(
      "capacities",
      po::value(&flags.capacities)->default_value(flags.capacities),
      "cache sizes to replay, as shares of the trace's distinct blocks, "
      "comma-separated")(
      "disk", po::value(&flags.disk)->default_value(flags.disk),
      "a disk tier below each host pool, of this share of the trace's "
      "distinct blocks (0: none), evicting by the same policy; hits then "
      "count in either tier")(
      "policy", po::value(&flags.policy),
      "eviction policies to replay, comma-separated: lru, arc, or all "
      "(default: tierkvd's default)")(
      "block-tokens",
      po::value(&flags.block_tokens)->default_value(flags.block_tokens),
      "tokens per cached block; divides --trace-block-tokens (16 splits each "
      "of the trace's 512-token blocks into 32)")(
      "trace-block-tokens",
      po::value(&flags.trace_block_tokens)
          ->default_value(flags.trace_block_tokens),
      "tokens each of the trace's hash ids stands for")(
      "json", po::bool_switch(&flags.json),
      "print one JSON object instead of a table")(
      "progress", po::value(&flags.progress)->default_value(flags.progress),
      "progress on stderr: auto (a bar on a terminal, else none), bar, "
      "lines or none");
  po::options_description hidden;
  hidden.add_options()("trace", po::value(&flags.trace));
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("trace", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(all)
                  .positional(positional)
                  .run(),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "tierkv-replay: " << e.what()
              << "\n(tierkv-replay --help lists the flags)\n";
    return 2;
  }
  if (vm.count("help") != 0) {
    std::cout << options;
    return 0;
  }
  if (flags.trace.empty()) {
    std::cerr << "tierkv-replay: no TRACE given\n(tierkv-replay --help lists "
                 "the flags)\n";
    return 2;
  }
  return Run(flags);
}
