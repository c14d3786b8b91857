// Chunk-isolated attention (seed 000 §3.7): which keys each query token of an
// assembled chunked sequence may attend to, as one span per segment instead
// of a dense N x N mask. Pure functions over values; thread-safe.
//
// The assembled sequence is the segments back to back with the separator
// tokens dropped, as in seed 000 §2.4 (system prompt at [0, 3), Doc1 at
// [3, 103), question at [103, 105)). The rules depend on the kind only:
//   - chunk tokens (system prompt and documents) see their own chunk,
//     causally. Not the system prompt, although seed 000 §1.2 lists it: a
//     chunk is cached by content alone and computed in isolation, so its KV
//     must not depend on what precedes it (seed §2.4 scenario 2, "Doc1
//     cannot see the new sys_prompt"; DESIGN.md).
//   - question tokens see every earlier token and themselves.
#ifndef TIERKV_SRC_ATTENTION_SPANS_H_
#define TIERKV_SRC_ATTENTION_SPANS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "src/chunk_parser.h"
#include "tierkv/status.h"

namespace tierkv {

// Dense masks are for tests: at most this many tokens (a 256 MiB mask).
inline constexpr int64_t kMaxDenseMaskTokens = int64_t{1} << 14;

// Token positions [begin, end) in the assembled sequence.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  friend bool operator==(const TokenRange&, const TokenRange&) = default;
};

// One segment of the assembled sequence, in order.
struct LayoutSegment {
  SegmentKind kind = SegmentKind::kDocument;
  int64_t length = 0;  // Tokens; must be >= 1.
};

// Query q in `queries` may attend to key k iff k is in `keys` and k <= q.
// A query range may appear in several spans (the union applies); today's
// rules produce exactly one span per segment.
struct AttentionSpan {
  TokenRange queries;
  TokenRange keys;

  friend bool operator==(const AttentionSpan&, const AttentionSpan&) = default;
};

// The layout of the sequence assembled from `split`: its segments in prompt
// order, with the separators dropped.
std::vector<LayoutSegment> AssembledLayout(const PromptSplit& split);

// The spans of `layout`, one per segment, in query order; their query ranges
// tile [0, total length). InvalidArgument for an empty layout or a segment of
// length < 1 (the message names the segment).
StatusOr<std::vector<AttentionSpan>> BuildAttentionSpans(
    std::span<const LayoutSegment> layout);

// Reference mask for tests, built token by token as seed 000 §3.7 does:
// N x N bytes, row = query, 1 = may attend. Same errors as
// BuildAttentionSpans, and InvalidArgument past kMaxDenseMaskTokens.
StatusOr<std::vector<uint8_t>> BuildDenseMask(
    std::span<const LayoutSegment> layout);

// `spans` expanded into an N x N mask like BuildDenseMask's. InvalidArgument
// if num_tokens is not in [1, kMaxDenseMaskTokens] or a range is reversed or
// outside [0, num_tokens).
StatusOr<std::vector<uint8_t>> ExpandSpans(std::span<const AttentionSpan> spans,
                                           int64_t num_tokens);

}  // namespace tierkv

#endif  // TIERKV_SRC_ATTENTION_SPANS_H_
