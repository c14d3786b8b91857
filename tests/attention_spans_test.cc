// Chunk-isolated attention (seed 000 §3.7): chunk tokens see their own chunk
// causally, question tokens see everything; the spans agree with a dense
// token-by-token mask and stay one per segment however long the segments.
#include "src/attention_spans.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/status_matchers.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Layout = std::vector<LayoutSegment>;

constexpr SegmentKind kSys = SegmentKind::kSystemPrompt;
constexpr SegmentKind kDoc = SegmentKind::kDocument;
constexpr SegmentKind kQuestion = SegmentKind::kQuestion;

// Rows of '0'/'1', row = query.
std::vector<uint8_t> MaskFromRows(const std::vector<std::string>& rows) {
  std::vector<uint8_t> mask;
  for (const std::string& row : rows) {
    for (char c : row) mask.push_back(c == '1');
  }
  return mask;
}

int64_t Total(const Layout& layout) {
  int64_t n = 0;
  for (const LayoutSegment& s : layout) n += s.length;
  return n;
}

// Spans expanded into a mask must equal the reference mask.
void ExpectSpansMatchDense(const Layout& layout) {
  auto spans = BuildAttentionSpans(layout);
  auto dense = BuildDenseMask(layout);
  ASSERT_THAT(spans, IsOk());
  ASSERT_THAT(dense, IsOk());
  EXPECT_EQ(spans->size(), layout.size());
  auto expanded = ExpandSpans(*spans, Total(layout));
  ASSERT_THAT(expanded, IsOk());
  EXPECT_EQ(*expanded, *dense);
}

TEST(AttentionSpans, HandCheckedLayout) {
  const Layout layout = {{kSys, 2}, {kDoc, 3}, {kQuestion, 2}};
  auto spans = BuildAttentionSpans(layout);
  ASSERT_THAT(spans, IsOk());
  EXPECT_THAT(*spans, ElementsAre(AttentionSpan{{0, 2}, {0, 2}},
                                  AttentionSpan{{2, 5}, {2, 5}},
                                  AttentionSpan{{5, 7}, {0, 7}}));
  const std::vector<uint8_t> expected = MaskFromRows({
      "1000000",  // System prompt: causal.
      "1100000",
      "0010000",  // Document: its own tokens only, not the system prompt.
      "0011000",
      "0011100",
      "1111110",  // Question: everything before it, and itself.
      "1111111",
  });
  auto dense = BuildDenseMask(layout);
  ASSERT_THAT(dense, IsOk());
  EXPECT_EQ(*dense, expected);
  auto expanded = ExpandSpans(*spans, 7);
  ASSERT_THAT(expanded, IsOk());
  EXPECT_EQ(*expanded, expected);
}

TEST(AttentionSpans, DocumentsDoNotSeeEachOther) {
  const Layout layout = {{kSys, 1}, {kDoc, 2}, {kDoc, 2}, {kQuestion, 1}};
  auto dense = BuildDenseMask(layout);
  ASSERT_THAT(dense, IsOk());
  EXPECT_EQ(*dense, MaskFromRows({"100000", "010000", "011000", "000100",
                                  "000110", "111111"}));
}

TEST(AttentionSpans, SeedScenarioTwoPositions) {
  // Seed 000 §2.4: sys [0, 3), Doc1 [3, 103), question [103, 105).
  auto spans =
      BuildAttentionSpans(Layout{{kSys, 3}, {kDoc, 100}, {kQuestion, 2}});
  ASSERT_THAT(spans, IsOk());
  EXPECT_THAT(*spans, ElementsAre(AttentionSpan{{0, 3}, {0, 3}},
                                  AttentionSpan{{3, 103}, {3, 103}},
                                  AttentionSpan{{103, 105}, {0, 105}}));
}

TEST(AttentionSpans, AssembledLayoutDropsSeparators) {
  const std::vector<TokenId> prompt = {1, 2, 7, 8, 10, 11, 12, 7, 8, 100};
  auto split = SplitPrompt(prompt, std::vector<TokenId>{7, 8});
  ASSERT_THAT(split, IsOk());
  const Layout layout = AssembledLayout(*split);
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_EQ(layout[0].kind, kSys);
  EXPECT_EQ(layout[0].length, 2);
  EXPECT_EQ(layout[1].kind, kDoc);
  EXPECT_EQ(layout[1].length, 3);
  EXPECT_EQ(layout[2].kind, kQuestion);
  EXPECT_EQ(layout[2].length, 1);
  ExpectSpansMatchDense(layout);
}

TEST(AttentionSpans, LoneChunkIsCausal) {
  auto dense = BuildDenseMask(Layout{{kDoc, 3}});
  ASSERT_THAT(dense, IsOk());
  EXPECT_EQ(*dense, MaskFromRows({"100", "110", "111"}));
}

TEST(AttentionSpans, RandomLayoutsAgreeWithDenseMask) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    Layout layout = {{kSys, 1 + static_cast<int64_t>(rng() % 20)}};
    const size_t docs = rng() % 8;
    for (size_t i = 0; i < docs; ++i) {
      layout.push_back({kDoc, 1 + static_cast<int64_t>(rng() % 20)});
    }
    if (rng() % 4 != 0) {
      layout.push_back({kQuestion, 1 + static_cast<int64_t>(rng() % 20)});
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    ExpectSpansMatchDense(layout);
  }
}

TEST(AttentionSpans, RandomKindOrderAgreesWithDenseMask) {
  // The rules depend on the kind only, wherever the segment sits.
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    std::mt19937 rng(seed);
    Layout layout(1 + rng() % 10);
    for (LayoutSegment& s : layout) {
      s = {static_cast<SegmentKind>(rng() % 3),
           1 + static_cast<int64_t>(rng() % 15)};
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    ExpectSpansMatchDense(layout);
  }
}

TEST(AttentionSpans, SpanCountIsPerSegmentNotPerToken) {
  const Layout layout = {
      {kSys, 1 << 20}, {kDoc, 1 << 22}, {kDoc, 1 << 21}, {kQuestion, 1 << 10}};
  auto spans = BuildAttentionSpans(layout);
  ASSERT_THAT(spans, IsOk());
  ASSERT_EQ(spans->size(), 4u);
  EXPECT_EQ(spans->back().keys, (TokenRange{0, Total(layout)}));
}

TEST(AttentionSpans, EmptyLayoutIsAnError) {
  for (const Status& s :
       {BuildAttentionSpans({}).status(), BuildDenseMask({}).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("no segments"));
  }
}

TEST(AttentionSpans, EmptySegmentIsAnError) {
  const Layout layout = {{kSys, 2}, {kDoc, 0}, {kQuestion, 1}};
  for (const Status& s : {BuildAttentionSpans(layout).status(),
                          BuildDenseMask(layout).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("segment 1 (document) has length 0"));
  }
  auto negative = BuildAttentionSpans(Layout{{kQuestion, -3}});
  EXPECT_THAT(negative.status().message(), HasSubstr("length -3"));
}

TEST(AttentionSpans, OverflowingLayoutIsAnError) {
  const int64_t huge = int64_t{1} << 62;
  auto spans = BuildAttentionSpans(Layout{{kDoc, huge}, {kDoc, huge}});
  EXPECT_EQ(spans.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(spans.status().message(), HasSubstr("segment 1 overflows"));
}

TEST(AttentionSpans, DenseMaskSizeIsBounded) {
  auto dense = BuildDenseMask(Layout{{kDoc, kMaxDenseMaskTokens + 1}});
  EXPECT_EQ(dense.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dense.status().message(), HasSubstr("1 to 16384"));
  EXPECT_EQ(ExpandSpans({}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(AttentionSpans, ExpandRejectsBadSpans) {
  const std::vector<AttentionSpan> outside = {{{0, 2}, {0, 2}},
                                              {{2, 5}, {0, 5}}};
  auto expanded = ExpandSpans(outside, 4);
  EXPECT_EQ(expanded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(expanded.status().message(),
              HasSubstr("span 1 has range [2, 5) outside [0, 4)"));
  const std::vector<AttentionSpan> reversed = {{{0, 2}, {2, 1}}};
  EXPECT_EQ(ExpandSpans(reversed, 4).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierkv
