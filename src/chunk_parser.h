// Chunked prompts (seed 000 §1.2, §4.3 ChunkedPromptParser): splits
// `system prompt <sep> doc 1 <sep> ... <sep> doc k <sep> question` into its
// segments. Pure functions over caller-owned tokens; PromptSplit is a value.
// Thread-safe: nothing is shared.
//
// Grammar, on token ids. A prompt with s >= 1 separators has s + 1 segments:
// the system prompt (before the first separator), s - 1 document chunks and
// the question (after the last separator). So `sys <sep> question` is a
// system prompt and a question with zero documents, as in the seed, which
// asks for "at least one separator". Separators are matched left to right
// without overlap in linear time (KMP), never as std::search's O(n * m).
// Every segment must be non-empty; anything else is an error, never a guess.
// The system prompt and the documents are the cacheable chunks, keyed by
// content alone (KeyHasher::ChunkKeys), so the same document hits the cache
// wherever it appears. Separator tokens belong to no segment.
#ifndef TIERKV_SRC_CHUNK_PARSER_H_
#define TIERKV_SRC_CHUNK_PARSER_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/status.h"

namespace tierkv {

enum class SegmentKind : uint8_t {
  kSystemPrompt,  // A chunk, cached like a document (seed 000 §1.2).
  kDocument,      // A chunk between two separators.
  kQuestion,      // After the last separator; attends to everything.
};

std::string_view SegmentKindName(SegmentKind kind);

// Token offsets [begin, end) of one segment in the prompt it was split from.
struct PromptSegment {
  SegmentKind kind = SegmentKind::kDocument;
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  friend bool operator==(const PromptSegment&, const PromptSegment&) = default;
};

// The segments of a prompt in order: the system prompt, the documents, the
// question. Built only by SplitPrompt, so it always has at least two
// segments and every one is non-empty.
class PromptSplit {
 public:
  std::span<const PromptSegment> segments() const { return segments_; }
  // The cacheable chunks: the system prompt, then the documents.
  std::span<const PromptSegment> chunks() const {
    return std::span(segments_).first(segments_.size() - 1);
  }
  std::span<const PromptSegment> documents() const {
    return std::span(segments_).subspan(1, segments_.size() - 2);
  }
  const PromptSegment& system_prompt() const { return segments_.front(); }
  const PromptSegment& question() const { return segments_.back(); }

 private:
  friend StatusOr<PromptSplit> SplitPrompt(std::span<const TokenId>,
                                           std::span<const TokenId>);
  explicit PromptSplit(std::vector<PromptSegment> segments)
      : segments_(std::move(segments)) {}

  std::vector<PromptSegment> segments_;
};

// Splits `prompt` on `separator` (one or more tokens). InvalidArgument, with
// the token offset where it applies, for: an empty separator, a separator
// longer than the prompt, no separator in the prompt, an empty segment
// (separator at the start or end, or two adjacent separators).
StatusOr<PromptSplit> SplitPrompt(std::span<const TokenId> prompt,
                                  std::span<const TokenId> separator);

// The tokens of `segment`, a view into `prompt`.
inline std::span<const TokenId> SegmentTokens(std::span<const TokenId> prompt,
                                              const PromptSegment& segment) {
  return prompt.subspan(static_cast<size_t>(segment.begin),
                        static_cast<size_t>(segment.size()));
}

// Content keys of every chunk of `split` (system prompt first, then the
// documents), one KeyHasher::ChunkKeys list per chunk, partial last block
// included. InvalidArgument if block_size < 1 or `split` does not fit in
// `prompt` (it was split from another prompt).
StatusOr<std::vector<std::vector<BlockKey>>> ChunkContentKeys(
    const KeyHasher& hasher, std::span<const TokenId> prompt,
    const PromptSplit& split, int32_t block_size);

namespace internal {

// Start offsets of the non-overlapping matches of a non-empty `separator` in
// `prompt`, left to right, by Knuth-Morris-Pratt. Adds the number of token
// comparisons made to *comparisons (tests check it stays linear).
std::vector<int64_t> FindSeparators(std::span<const TokenId> prompt,
                                    std::span<const TokenId> separator,
                                    int64_t* comparisons);

}  // namespace internal
}  // namespace tierkv

#endif  // TIERKV_SRC_CHUNK_PARSER_H_
