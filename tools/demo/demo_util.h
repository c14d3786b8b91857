// Pieces the demos share: a portable RNG (a seed names one workload on
// every standard library) and a progress reporter. Not thread-safe.
#ifndef TIERKV_TOOLS_DEMO_DEMO_UTIL_H_
#define TIERKV_TOOLS_DEMO_DEMO_UTIL_H_

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/status.h"
#include "tools/demo/prefix_demo.h"

namespace tierkv::demo {

// SplitMix64: tiny, and unlike std distributions gives the same numbers on
// every standard library, so a seed names one workload everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi]; the modulo bias is irrelevant here.
  int32_t Uniform(int32_t lo, int32_t hi) {
    const auto span = static_cast<uint64_t>(int64_t{hi} - lo + 1);
    return lo + static_cast<int32_t>(Next() % span);
  }
  // Uniform in [0, 1).
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1p-53; }
  // n token ids in [0, vocab).
  std::vector<TokenId> Tokens(int32_t n, uint32_t vocab) {
    std::vector<TokenId> out(static_cast<size_t>(n));
    for (TokenId& t : out) t = static_cast<TokenId>(Next() % vocab);
    return out;
  }

 private:
  uint64_t state_;
};

// Progress on a stream: a bar redrawn in place, or a line every quarter.
class ProgressReporter {
 public:
  ProgressReporter(ProgressMode mode, uint64_t total, std::string unit,
                   std::ostream& out)
      : mode_(mode == ProgressMode::kAuto ? ProgressMode::kLines : mode),
        total_(std::max<uint64_t>(total, 1)),
        unit_(std::move(unit)),
        out_(out) {}

  void Update(uint64_t done) {
    if (mode_ == ProgressMode::kBar) {
      const auto step = static_cast<int>(done * 100 / total_);
      if (step == last_step_ && done != total_) return;  // Redraw on change.
      last_step_ = step;
      const auto filled = static_cast<size_t>(done * kWidth / total_);
      out_ << '\r' << '[' << std::string(filled, '#')
           << std::string(kWidth - filled, '.') << "] " << done << '/' << total_
           << ' ' << unit_ << std::flush;
    } else if (mode_ == ProgressMode::kLines) {
      const auto quarter = static_cast<int>(done * 4 / total_);
      if (quarter == last_step_) return;
      last_step_ = quarter;
      out_ << "progress: " << done << '/' << total_ << ' ' << unit_ << '\n'
           << std::flush;
    }
  }
  void Done() {
    if (mode_ == ProgressMode::kBar) out_ << '\n' << std::flush;
  }

 private:
  static constexpr size_t kWidth = 30;
  ProgressMode mode_;
  uint64_t total_;
  std::string unit_;
  std::ostream& out_;
  int last_step_ = 0;  // Nothing to report at 0 done.
};

// "auto", "bar", "lines" or "none"; InvalidArgument naming --progress.
inline StatusOr<ProgressMode> ParseProgress(const std::string& s) {
  if (s == "auto") return ProgressMode::kAuto;
  if (s == "bar") return ProgressMode::kBar;
  if (s == "lines") return ProgressMode::kLines;
  if (s == "none") return ProgressMode::kNone;
  return Status::InvalidArgument(
      "--progress must be auto, bar, lines or none, got '" + s + "'");
}

// A flag bound to `field`, its current value shown as the default.
template <typename T>
boost::program_options::typed_value<T>* Flag(T* field) {
  return boost::program_options::value(field)->default_value(*field);
}

// Parses flags (no positional arguments) into `vm` and notifies their
// variables; InvalidArgument with the parser's message.
inline Status ParseCommandLine(
    int argc, const char* const* argv,
    const boost::program_options::options_description& flags,
    boost::program_options::variables_map* vm) {
  namespace po = boost::program_options;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(flags)
                  .positional({})  // Rejects stray arguments.
                  .run(),
              *vm);
    po::notify(*vm);
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  return Status::Ok();
}

}  // namespace tierkv::demo

#endif  // TIERKV_TOOLS_DEMO_DEMO_UTIL_H_
