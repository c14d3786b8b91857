#include "src/chunk_parser.h"

#include <algorithm>
#include <string>
#include <utility>

namespace tierkv {
namespace {

// Separators longer than this are shown abbreviated in error messages.
constexpr size_t kMaxShownSeparatorTokens = 8;

std::string SeparatorText(std::span<const TokenId> separator) {
  std::string text = "[";
  const size_t shown = std::min(separator.size(), kMaxShownSeparatorTokens);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(separator[i]);
  }
  if (shown < separator.size()) {
    text += ", ... (" + std::to_string(separator.size()) + " tokens)";
  }
  return text + "]";
}

// failure[i]: length of the longest proper prefix of separator[0..i] that is
// also its suffix.
std::vector<size_t> FailureTable(std::span<const TokenId> separator) {
  std::vector<size_t> failure(separator.size(), 0);
  size_t k = 0;
  for (size_t i = 1; i < separator.size(); ++i) {
    while (k > 0 && separator[i] != separator[k]) k = failure[k - 1];
    if (separator[i] == separator[k]) ++k;
    failure[i] = k;
  }
  return failure;
}

// Why segment `index` of `num_segments` is empty; `seps` are the separator
// starts (segment i ends at seps[i] and begins after seps[i - 1]).
Status EmptySegmentError(size_t index, size_t num_segments,
                         const std::vector<int64_t>& seps) {
  if (index == 0) {
    return Status::InvalidArgument(
        "empty system prompt: the prompt starts with the chunk separator "
        "(token offset 0)");
  }
  if (index + 1 == num_segments) {
    return Status::InvalidArgument(
        "empty question: the prompt ends with the chunk separator (token "
        "offset " +
        std::to_string(seps[index - 1]) + ")");
  }
  return Status::InvalidArgument(
      "empty document chunk " + std::to_string(index) +
      ": the chunk separator at token offset " + std::to_string(seps[index]) +
      " directly follows the one at token offset " +
      std::to_string(seps[index - 1]));
}

Status CheckSeparator(std::span<const TokenId> prompt,
                      std::span<const TokenId> separator) {
  if (separator.empty()) {
    return Status::InvalidArgument(
        "chunk separator is empty; it must be at least one token");
  }
  if (separator.size() > prompt.size()) {
    return Status::InvalidArgument(
        "chunk separator " + SeparatorText(separator) + " is " +
        std::to_string(separator.size()) + " tokens, longer than the " +
        std::to_string(prompt.size()) + "-token prompt");
  }
  return Status::Ok();
}

SegmentKind KindOf(size_t index, size_t num_segments) {
  if (index == 0) return SegmentKind::kSystemPrompt;
  if (index + 1 == num_segments) return SegmentKind::kQuestion;
  return SegmentKind::kDocument;
}

}  // namespace

std::string_view SegmentKindName(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kSystemPrompt:
      return "system prompt";
    case SegmentKind::kDocument:
      return "document";
    case SegmentKind::kQuestion:
      return "question";
  }
  return "unknown";
}

namespace internal {

std::vector<int64_t> FindSeparators(std::span<const TokenId> prompt,
                                    std::span<const TokenId> separator,
                                    int64_t* comparisons) {
  const std::vector<size_t> failure = FailureTable(separator);
  std::vector<int64_t> starts;
  size_t matched = 0;
  // Each comparison either moves to the next prompt token or shrinks
  // `matched`, which grows at most once per token: at most 2n comparisons.
  for (size_t i = 0; i < prompt.size(); ++i) {
    while (true) {
      ++*comparisons;
      if (prompt[i] == separator[matched]) {
        ++matched;
        break;
      }
      if (matched == 0) break;
      matched = failure[matched - 1];
    }
    if (matched == separator.size()) {
      starts.push_back(static_cast<int64_t>(i + 1 - matched));
      matched = 0;  // Non-overlapping: the next match starts after this one.
    }
  }
  return starts;
}

}  // namespace internal

StatusOr<PromptSplit> SplitPrompt(std::span<const TokenId> prompt,
                                  std::span<const TokenId> separator) {
  TIERKV_RETURN_IF_ERROR(CheckSeparator(prompt, separator));
  int64_t comparisons = 0;
  const std::vector<int64_t> seps =
      internal::FindSeparators(prompt, separator, &comparisons);
  if (seps.empty()) {
    return Status::InvalidArgument(
        "no chunk separator " + SeparatorText(separator) + " in the " +
        std::to_string(prompt.size()) +
        "-token prompt; a chunked prompt is 'system prompt <sep> [document "
        "<sep>]... question'");
  }
  const size_t num_segments = seps.size() + 1;
  const auto sep_len = static_cast<int64_t>(separator.size());
  std::vector<PromptSegment> segments;
  segments.reserve(num_segments);
  int64_t begin = 0;
  for (size_t i = 0; i < num_segments; ++i) {
    const int64_t end =
        i < seps.size() ? seps[i] : static_cast<int64_t>(prompt.size());
    if (end == begin) return EmptySegmentError(i, num_segments, seps);
    segments.push_back({KindOf(i, num_segments), begin, end});
    begin = end + sep_len;
  }
  return PromptSplit(std::move(segments));
}

StatusOr<std::vector<std::vector<BlockKey>>> ChunkContentKeys(
    const KeyHasher& hasher, std::span<const TokenId> prompt,
    const PromptSplit& split, int32_t block_size) {
  if (block_size < 1) {
    return Status::InvalidArgument("chunk keys need block_size >= 1, got " +
                                   std::to_string(block_size));
  }
  const int64_t needed = split.question().end;
  if (needed > static_cast<int64_t>(prompt.size())) {
    return Status::InvalidArgument("split covers " + std::to_string(needed) +
                                   " tokens but the prompt has " +
                                   std::to_string(prompt.size()) +
                                   "; it was split from another prompt");
  }
  std::vector<std::vector<BlockKey>> keys;
  keys.reserve(split.chunks().size());
  for (const PromptSegment& chunk : split.chunks()) {
    keys.push_back(hasher.ChunkKeys(SegmentTokens(prompt, chunk), block_size));
  }
  return keys;
}

}  // namespace tierkv
