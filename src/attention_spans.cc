#include "src/attention_spans.h"

#include <algorithm>
#include <limits>
#include <string>

namespace tierkv {
namespace {

bool IsChunk(SegmentKind kind) { return kind != SegmentKind::kQuestion; }

// Total length of `layout`, or why it is malformed.
StatusOr<int64_t> TotalLength(std::span<const LayoutSegment> layout) {
  if (layout.empty()) {
    return Status::InvalidArgument("attention layout has no segments");
  }
  int64_t total = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const int64_t length = layout[i].length;
    if (length < 1) {
      return Status::InvalidArgument(
          "attention layout segment " + std::to_string(i) + " (" +
          std::string(SegmentKindName(layout[i].kind)) + ") has length " +
          std::to_string(length) + "; every segment needs at least 1 token");
    }
    if (length > std::numeric_limits<int64_t>::max() - total) {
      return Status::InvalidArgument("attention layout segment " +
                                     std::to_string(i) +
                                     " overflows the total token count");
    }
    total += length;
  }
  return total;
}

Status CheckDenseSize(int64_t num_tokens) {
  if (num_tokens < 1 || num_tokens > kMaxDenseMaskTokens) {
    return Status::InvalidArgument(
        "dense attention mask of " + std::to_string(num_tokens) +
        " tokens; it needs 1 to " + std::to_string(kMaxDenseMaskTokens));
  }
  return Status::Ok();
}

Status CheckRange(const TokenRange& range, int64_t num_tokens,
                  size_t span_index) {
  if (range.begin < 0 || range.begin > range.end || range.end > num_tokens) {
    return Status::InvalidArgument(
        "attention span " + std::to_string(span_index) + " has range [" +
        std::to_string(range.begin) + ", " + std::to_string(range.end) +
        ") outside [0, " + std::to_string(num_tokens) + ")");
  }
  return Status::Ok();
}

}  // namespace

std::vector<LayoutSegment> AssembledLayout(const PromptSplit& split) {
  std::vector<LayoutSegment> layout;
  layout.reserve(split.segments().size());
  for (const PromptSegment& segment : split.segments()) {
    layout.push_back({segment.kind, segment.size()});
  }
  return layout;
}

StatusOr<std::vector<AttentionSpan>> BuildAttentionSpans(
    std::span<const LayoutSegment> layout) {
  TIERKV_RETURN_IF_ERROR(TotalLength(layout).status());
  std::vector<AttentionSpan> spans;
  spans.reserve(layout.size());
  int64_t begin = 0;
  for (const LayoutSegment& segment : layout) {
    const TokenRange queries{begin, begin + segment.length};
    // Causality (k <= q) is part of the span's meaning, so a question's key
    // range can simply end with its own queries.
    const int64_t keys_begin = IsChunk(segment.kind) ? begin : 0;
    spans.push_back({queries, {keys_begin, queries.end}});
    begin = queries.end;
  }
  return spans;
}

StatusOr<std::vector<uint8_t>> BuildDenseMask(
    std::span<const LayoutSegment> layout) {
  TIERKV_ASSIGN_OR_RETURN(const int64_t n, TotalLength(layout));
  TIERKV_RETURN_IF_ERROR(CheckDenseSize(n));
  // Per token, as the seed's chunk_ids: which segment it belongs to.
  std::vector<size_t> segment_of;
  segment_of.reserve(static_cast<size_t>(n));
  for (size_t s = 0; s < layout.size(); ++s) {
    segment_of.insert(segment_of.end(), static_cast<size_t>(layout[s].length),
                      s);
  }
  const auto un = static_cast<size_t>(n);
  std::vector<uint8_t> mask(un * un, 0);
  for (size_t q = 0; q < un; ++q) {
    const bool question = !IsChunk(layout[segment_of[q]].kind);
    for (size_t k = 0; k <= q; ++k) {
      mask[q * un + k] = question || segment_of[k] == segment_of[q];
    }
  }
  return mask;
}

StatusOr<std::vector<uint8_t>> ExpandSpans(std::span<const AttentionSpan> spans,
                                           int64_t num_tokens) {
  TIERKV_RETURN_IF_ERROR(CheckDenseSize(num_tokens));
  const auto un = static_cast<size_t>(num_tokens);
  std::vector<uint8_t> mask(un * un, 0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const AttentionSpan& span = spans[i];
    TIERKV_RETURN_IF_ERROR(CheckRange(span.queries, num_tokens, i));
    TIERKV_RETURN_IF_ERROR(CheckRange(span.keys, num_tokens, i));
    for (int64_t q = span.queries.begin; q < span.queries.end; ++q) {
      const int64_t keys_end = std::min(span.keys.end, q + 1);
      for (int64_t k = span.keys.begin; k < keys_end; ++k) {
        mask[static_cast<size_t>(q) * un + static_cast<size_t>(k)] = 1;
      }
    }
  }
  return mask;
}

}  // namespace tierkv
