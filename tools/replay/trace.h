// Request traces in the JSON-lines format of the Mooncake trace release
// (github.com/kvcache-ai/Mooncake, FAST'25 traces): one object per line,
//
//   {"timestamp": 0, "input_length": 40160, "output_length": 6,
//    "hash_ids": [0, 1, 2, ...]}
//
// where hash_ids names one block of the prompt each (512 tokens in the
// published traces), prefix-chained: two requests that share their first k
// ids share their first k blocks of tokens. Other keys are skipped.
#ifndef TIERKV_TOOLS_REPLAY_TRACE_H_
#define TIERKV_TOOLS_REPLAY_TRACE_H_

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv::replay {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;   // Tokens; 0 when the line has none.
  int64_t output_length = 0;  // Tokens; 0 when the line has none.
  std::vector<int64_t> hash_ids;
};

// Parses one line. InvalidArgument saying what is wrong where (the caller
// adds the line number) for anything but one JSON object with a
// `hash_ids` array of non-negative integers.
StatusOr<TraceRequest> ParseTraceLine(const std::string& line);

// Every request of a trace, in file order; blank lines are skipped.
// InvalidArgument naming `name` and the line for a malformed line,
// NotFound for a file that cannot be opened.
StatusOr<std::vector<TraceRequest>> ReadTrace(std::istream& in,
                                              const std::string& name);
StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path);

}  // namespace tierkv::replay

#endif  // TIERKV_TOOLS_REPLAY_TRACE_H_
