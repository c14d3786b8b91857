// Chunked prompt splitting (seed 000 §4.3): boundaries and kinds, separators
// of any length matched without overlap in linear time, every malformed
// prompt an error that says where, and chunk keys by content alone.
#include "src/chunk_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Tokens = std::vector<TokenId>;

constexpr TokenId kHash = 35;  // "##" as one token.

// sys <sep> doc... <sep> question.
Tokens Join(const std::vector<Tokens>& parts, const Tokens& sep) {
  Tokens out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.insert(out.end(), sep.begin(), sep.end());
    out.insert(out.end(), parts[i].begin(), parts[i].end());
  }
  return out;
}

Tokens Text(const Tokens& prompt, const PromptSegment& segment) {
  const auto tokens = SegmentTokens(prompt, segment);
  return Tokens(tokens.begin(), tokens.end());
}

Status SplitError(const Tokens& prompt, const Tokens& sep) {
  return SplitPrompt(prompt, sep).status();
}

// Non-overlapping left-to-right matches, the obvious O(n * m) way.
std::vector<int64_t> NaiveFind(const Tokens& prompt, const Tokens& sep) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i + sep.size() <= prompt.size();) {
    if (std::equal(sep.begin(), sep.end(), prompt.begin() + i)) {
      starts.push_back(static_cast<int64_t>(i));
      i += sep.size();
    } else {
      ++i;
    }
  }
  return starts;
}

TEST(ChunkParser, SeedExampleSystemDocumentQuestion) {
  // "You are helpful.##Doc1##What?" (seed 000 §2.4).
  const Tokens sys = {1, 2, 3}, doc = {10, 11, 12, 13}, question = {100, 101};
  const Tokens prompt = Join({sys, doc, question}, {kHash});
  auto split = SplitPrompt(prompt, Tokens{kHash});
  ASSERT_THAT(split, IsOk());
  EXPECT_THAT(split->segments(),
              ElementsAre(PromptSegment{SegmentKind::kSystemPrompt, 0, 3},
                          PromptSegment{SegmentKind::kDocument, 4, 8},
                          PromptSegment{SegmentKind::kQuestion, 9, 11}));
  EXPECT_EQ(Text(prompt, split->system_prompt()), sys);
  ASSERT_EQ(split->documents().size(), 1u);
  EXPECT_EQ(Text(prompt, split->documents()[0]), doc);
  EXPECT_EQ(Text(prompt, split->question()), question);
  ASSERT_EQ(split->chunks().size(), 2u);
  EXPECT_EQ(split->chunks()[0], split->system_prompt());
}

TEST(ChunkParser, SingleSeparatorIsSystemPromptAndQuestion) {
  const Tokens prompt = {1, 2, kHash, 100};
  auto split = SplitPrompt(prompt, Tokens{kHash});
  ASSERT_THAT(split, IsOk());
  EXPECT_THAT(split->documents(), IsEmpty());
  ASSERT_EQ(split->chunks().size(), 1u);
  EXPECT_EQ(split->system_prompt(),
            (PromptSegment{SegmentKind::kSystemPrompt, 0, 2}));
  EXPECT_EQ(split->question(), (PromptSegment{SegmentKind::kQuestion, 3, 4}));
}

TEST(ChunkParser, ManyDocumentsMultiTokenSeparator) {
  const Tokens sep = {7, 8, 9};
  const std::vector<Tokens> parts = {{1}, {20, 21}, {7, 8}, {9, 30}, {40}};
  const Tokens prompt = Join(parts, sep);
  auto split = SplitPrompt(prompt, sep);
  ASSERT_THAT(split, IsOk());
  ASSERT_EQ(split->segments().size(), parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(Text(prompt, split->segments()[i]), parts[i]) << "segment " << i;
  }
  EXPECT_EQ(split->documents().size(), 3u);
  EXPECT_EQ(split->documents()[1].kind, SegmentKind::kDocument);
}

TEST(ChunkParser, PartialMatchFallsBack) {
  // The 5 at offset 1 starts a near-match; the real one begins at offset 2.
  const Tokens prompt = {1, 5, 5, 5, 6, 2, 5, 5, 6, 3};
  auto split = SplitPrompt(prompt, Tokens{5, 5, 6});
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(Text(prompt, split->system_prompt()), (Tokens{1, 5}));
  ASSERT_EQ(split->documents().size(), 1u);
  EXPECT_EQ(Text(prompt, split->documents()[0]), (Tokens{2}));
  EXPECT_EQ(Text(prompt, split->question()), (Tokens{3}));
}

TEST(ChunkParser, SelfOverlappingSeparator) {
  const Tokens sep = {1, 2, 1, 2, 3};
  const Tokens prompt = {9, 1, 2, 1, 2, 1, 2, 3, 8};
  auto split = SplitPrompt(prompt, sep);
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(Text(prompt, split->system_prompt()), (Tokens{9, 1, 2}));
  EXPECT_EQ(Text(prompt, split->question()), (Tokens{8}));
}

TEST(ChunkParser, MatchesDoNotOverlap) {
  // 4 4 4: the match at offset 1 consumes offsets 1-2; offset 2 starts none.
  const Tokens prompt = {1, 4, 4, 4, 2};
  auto split = SplitPrompt(prompt, Tokens{4, 4});
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(Text(prompt, split->system_prompt()), (Tokens{1}));
  EXPECT_EQ(Text(prompt, split->question()), (Tokens{4, 2}));
}

TEST(ChunkParser, AgreesWithNaiveSearchOnRandomPrompts) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<TokenId> token(0, 2);  // Many near-matches.
    Tokens sep(1 + rng() % 5), prompt(rng() % 60);
    for (TokenId& t : sep) t = token(rng);
    for (TokenId& t : prompt) t = token(rng);
    int64_t comparisons = 0;
    EXPECT_EQ(internal::FindSeparators(prompt, sep, &comparisons),
              NaiveFind(prompt, sep))
        << "seed " << seed;
    EXPECT_LE(comparisons, 2 * static_cast<int64_t>(prompt.size()));
  }
}

TEST(ChunkParser, LinearTimeOnAdversarialPrompts) {
  constexpr size_t kPromptTokens = 1 << 20;
  Tokens sep(999, 5);
  sep.push_back(6);
  // All 5s: every offset is a near-match of a naive search (~1e9 steps).
  Tokens prompt(kPromptTokens, 5);
  prompt.front() = 1;
  prompt.insert(prompt.end(), {6, 2});
  int64_t comparisons = 0;
  EXPECT_THAT(internal::FindSeparators(prompt, sep, &comparisons),
              ElementsAre(static_cast<int64_t>(kPromptTokens - 999)));
  EXPECT_LE(comparisons, 2 * static_cast<int64_t>(prompt.size()));
  // Repeated near-matches that fail on their last token.
  Tokens near;
  while (near.size() < kPromptTokens) {
    near.insert(near.end(), sep.begin(), sep.end() - 1);
    near.push_back(7);
  }
  comparisons = 0;
  EXPECT_THAT(internal::FindSeparators(near, sep, &comparisons), IsEmpty());
  EXPECT_LE(comparisons, 2 * static_cast<int64_t>(near.size()));
  auto split = SplitPrompt(prompt, sep);
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(split->system_prompt().size(),
            static_cast<int64_t>(kPromptTokens - 999));
}

TEST(ChunkParser, EmptySeparatorIsAnError) {
  const Status s = SplitError({1, 2, 3}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("separator is empty"));
}

TEST(ChunkParser, SeparatorLongerThanPromptIsAnError) {
  const Status s = SplitError({1, 2}, {1, 2, 3});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("[1, 2, 3] is 3 tokens"),
                                 HasSubstr("2-token prompt")));
  EXPECT_EQ(SplitError({}, {kHash}).code(), StatusCode::kInvalidArgument);
}

TEST(ChunkParser, MissingSeparatorIsAnError) {
  const Status s = SplitError({1, 2, 3, 4}, {kHash, 36});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("no chunk separator [35, 36]"),
                                 HasSubstr("4-token prompt")));
}

TEST(ChunkParser, SeparatorAtStartIsAnError) {
  const Status s = SplitError({kHash, 1, kHash, 2}, {kHash});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("empty system prompt"), HasSubstr("offset 0")));
  EXPECT_THAT(SplitError({kHash}, {kHash}).message(),
              HasSubstr("empty system prompt"));
}

TEST(ChunkParser, SeparatorAtEndIsAnError) {
  const Status s = SplitError({1, kHash, 2, 3, kHash}, {kHash});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("empty question"), HasSubstr("offset 4")));
}

TEST(ChunkParser, AdjacentSeparatorsAreAnError) {
  // sys ## doc1 #### question: document 2 is empty.
  const Tokens sep = {kHash, 36};
  const Tokens prompt = Join({{1}, {2}, {}, {3}}, sep);
  const Status s = SplitError(prompt, sep);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("empty document chunk 2"),
                    HasSubstr("token offset 6"), HasSubstr("token offset 4")));
}

TEST(ChunkParser, LongSeparatorIsAbbreviatedInMessages) {
  const Tokens sep(20, 9);
  const Status s = SplitError(Tokens(30, 1), sep);
  EXPECT_THAT(s.message(), HasSubstr("9, 9, ... (20 tokens)]"));
}

TEST(ChunkParser, SegmentKindNames) {
  EXPECT_EQ(SegmentKindName(SegmentKind::kSystemPrompt), "system prompt");
  EXPECT_EQ(SegmentKindName(SegmentKind::kDocument), "document");
  EXPECT_EQ(SegmentKindName(SegmentKind::kQuestion), "question");
}

KeyHasher Hasher() { return KeyHasher(KeyNamespace{"model-a/bf16", ""}); }

// Chunk keys of `prompt` split on kHash, 4-token blocks.
StatusOr<std::vector<std::vector<BlockKey>>> Keys(const Tokens& prompt) {
  auto split = SplitPrompt(prompt, Tokens{kHash});
  if (!split.ok()) return split.status();
  return ChunkContentKeys(Hasher(), prompt, *split, 4);
}

TEST(ChunkParser, SameDocumentSameKeysAnywhere) {
  const Tokens doc = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};  // 2.5 blocks.
  auto a = Keys(Join({{1, 2, 3}, doc, {50}, {100}}, {kHash}));
  auto b = Keys(Join({{5, 6}, {60, 61}, {62}, doc, {200, 201}}, {kHash}));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_EQ(a->size(), 3u);
  ASSERT_EQ(b->size(), 4u);
  EXPECT_EQ((*a)[1].size(), 3u);  // The partial last block has a key.
  EXPECT_EQ((*a)[1], (*b)[3]);
  EXPECT_EQ((*a)[1], Hasher().ChunkKeys(doc, 4));
  EXPECT_NE((*a)[0], (*b)[0]);  // Different system prompts.
  EXPECT_NE((*a)[2], (*b)[1]);  // Different documents.
}

TEST(ChunkParser, SystemPromptKeyedLikeAnyChunk) {
  auto a = Keys({1, 2, 3, kHash, 9});
  auto b = Keys({7, kHash, 1, 2, 3, kHash, 9});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*a)[0], (*b)[1]);
}

TEST(ChunkParser, ChunkKeysRejectBadArguments) {
  const Tokens prompt = {1, 2, kHash, 3, kHash, 4};
  auto split = SplitPrompt(prompt, Tokens{kHash});
  ASSERT_THAT(split, IsOk());
  auto zero = ChunkContentKeys(Hasher(), prompt, *split, 0);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("block_size >= 1, got 0"));
  const Tokens shorter(prompt.begin(), prompt.end() - 1);
  auto other = ChunkContentKeys(Hasher(), shorter, *split, 4);
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("covers 6 tokens"));
}

}  // namespace
}  // namespace tierkv
