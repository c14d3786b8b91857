// Chunked prompts (src/chunk_parser.h) over arbitrary token ids: the first
// input byte gives the separator's length (0 to 7 tokens) and the block
// size, then every byte is one token id (0 to 3, so separators and repeated
// chunks turn up often): the separator first, then the prompt. Checked
// against a naive reference:
//   - FindSeparators finds the leftmost non-overlapping matches, as a
//     left-to-right scan does, in at most 2n comparisons;
//   - SplitPrompt fails exactly when the header says it must (empty or
//     overlong separator, no separator, an empty segment); otherwise its
//     segments are the system prompt, the documents and the question in
//     order, non-empty, cover the prompt exactly, with one separator
//     between each two and none inside any;
//   - ChunkContentKeys gives each chunk one key per block (partial last
//     block included), and keys by content alone: two chunks get the same
//     keys exactly when they hold the same tokens, wherever they are.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "src/chunk_parser.h"
#include "tierkv/block_key.h"

namespace tierkv {
namespace {

bool MatchesAt(std::span<const TokenId> prompt,
               std::span<const TokenId> separator, size_t at) {
  if (at + separator.size() > prompt.size()) return false;
  for (size_t j = 0; j < separator.size(); ++j) {
    if (prompt[at + j] != separator[j]) return false;
  }
  return true;
}

// The leftmost non-overlapping matches, in O(n * m).
std::vector<int64_t> NaiveSeparators(std::span<const TokenId> prompt,
                                     std::span<const TokenId> separator) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i + separator.size() <= prompt.size();) {
    if (MatchesAt(prompt, separator, i)) {
      starts.push_back(static_cast<int64_t>(i));
      i += separator.size();
    } else {
      ++i;
    }
  }
  return starts;
}

void Run(std::span<const TokenId> separator, std::span<const TokenId> prompt,
         int32_t block_size) {
  const std::vector<int64_t> expected =
      separator.empty() ? std::vector<int64_t>{}
                        : NaiveSeparators(prompt, separator);
  if (!separator.empty()) {
    int64_t comparisons = 0;
    const std::vector<int64_t> found =
        internal::FindSeparators(prompt, separator, &comparisons);
    FUZZ_CHECK(found == expected,
               "FindSeparators found %zu separators, a scan finds %zu",
               found.size(), expected.size());
    FUZZ_CHECK(comparisons <= 2 * static_cast<int64_t>(prompt.size()),
               "%lld comparisons for %zu tokens",
               static_cast<long long>(comparisons), prompt.size());
  }

  bool must_fail =
      separator.empty() || separator.size() > prompt.size() || expected.empty();
  if (!must_fail) {
    int64_t begin = 0;
    for (int64_t start : expected) {
      must_fail |= start == begin;
      begin = start + static_cast<int64_t>(separator.size());
    }
    must_fail |= begin == static_cast<int64_t>(prompt.size());
  }
  StatusOr<PromptSplit> split = SplitPrompt(prompt, separator);
  FUZZ_CHECK(split.ok() != must_fail, "SplitPrompt: %s where %s expected",
             split.ok() ? "OK" : split.status().ToString().c_str(),
             must_fail ? "an error" : "a split");
  if (!split.ok()) return;

  const std::span<const PromptSegment> segments = split->segments();
  FUZZ_CHECK(segments.size() == expected.size() + 1, "%zu segments",
             segments.size());
  FUZZ_CHECK(segments.front().begin == 0 &&
                 segments.back().end == static_cast<int64_t>(prompt.size()),
             "the segments do not cover the prompt");
  for (size_t i = 0; i < segments.size(); ++i) {
    const PromptSegment& s = segments[i];
    const SegmentKind kind = i == 0 ? SegmentKind::kSystemPrompt
                             : i + 1 == segments.size()
                                 ? SegmentKind::kQuestion
                                 : SegmentKind::kDocument;
    FUZZ_CHECK(s.kind == kind && s.begin < s.end,
               "segment %zu: %s [%lld, %lld)", i,
               std::string(SegmentKindName(s.kind)).c_str(),
               static_cast<long long>(s.begin), static_cast<long long>(s.end));
    for (int64_t at = s.begin; at < s.end; ++at) {
      FUZZ_CHECK(!MatchesAt(prompt, separator, static_cast<size_t>(at)),
                 "a separator starts inside segment %zu", i);
    }
    if (i + 1 < segments.size()) {
      FUZZ_CHECK(MatchesAt(prompt, separator, static_cast<size_t>(s.end)) &&
                     segments[i + 1].begin ==
                         s.end + static_cast<int64_t>(separator.size()),
                 "segments %zu and %zu are not one separator apart", i, i + 1);
    }
  }
  FUZZ_CHECK(&split->system_prompt() == &segments.front() &&
                 &split->question() == &segments.back() &&
                 split->chunks().size() == segments.size() - 1 &&
                 split->documents().size() == segments.size() - 2,
             "the split's views disagree with its segments");

  const KeyHasher hasher(KeyNamespace{});
  StatusOr<std::vector<std::vector<BlockKey>>> keys =
      ChunkContentKeys(hasher, prompt, *split, block_size);
  FUZZ_CHECK(keys.ok() == (block_size >= 1), "ChunkContentKeys: %s",
             keys.ok() ? "OK" : keys.status().ToString().c_str());
  if (!keys.ok()) return;
  FUZZ_CHECK(keys->size() == split->chunks().size(), "%zu key lists",
             keys->size());
  for (size_t i = 0; i < keys->size(); ++i) {
    const PromptSegment& chunk = split->chunks()[i];
    const size_t blocks =
        static_cast<size_t>((chunk.size() + block_size - 1) / block_size);
    FUZZ_CHECK((*keys)[i].size() == blocks, "chunk %zu: %zu keys, %zu blocks",
               i, (*keys)[i].size(), blocks);
    for (size_t j = 0; j < i; ++j) {
      const std::span<const TokenId> a = SegmentTokens(prompt, chunk);
      const std::span<const TokenId> b =
          SegmentTokens(prompt, split->chunks()[j]);
      const bool same =
          a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
      FUZZ_CHECK(same == ((*keys)[i] == (*keys)[j]),
                 "chunks %zu and %zu: %s content, %s keys", j, i,
                 same ? "same" : "different", same ? "different" : "same");
    }
  }
}

}  // namespace
}  // namespace tierkv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t separator_len = data[0] & 7;
  // 0 (refused) to 7 tokens per block.
  const int32_t block_size = (data[0] >> 3) & 7;
  std::vector<tierkv::TokenId> tokens;
  for (size_t i = 1; i < size; ++i) tokens.push_back(data[i] & 3);
  const size_t split_at = std::min(separator_len, tokens.size());
  const std::span<const tierkv::TokenId> all(tokens);
  tierkv::Run(all.first(split_at), all.subspan(split_at), block_size);
  return 0;
}
