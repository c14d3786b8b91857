// The reference model with trained weights (TinyStories' stories15M,
// testing/real_model.h): its loader and tokenizer against the checkpoint's
// known outputs, and tierkv's caches on real text. Prefix hits must be
// bit-identical, remapped chunks equal to a chunk-isolated prefill up to
// fp32 rounding, and CacheBlend's deviation from the full prefill must fall
// as its recompute ratio grows (seed 001's claim, measured on a model whose
// attention was trained).
//
// The checkpoint comes from `tools/run fetch-model` (every tools/run command
// that runs tests fetches it first); without it the RealModel tests fail,
// naming that command. The file-format tests (Llama2cFormat, TokenizerFormat)
// write their own small files.
#include "testing/real_model.h"

#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/cached_prefill.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tierkv/block_key.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/request.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

std::vector<uint32_t> Bits(std::span<const float> v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

double RelativeMaxError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return diff / scale;
}

PagedKvCache Cache(const ReferenceModel& m, int64_t tokens) {
  return PagedKvCache::Create(m.config().CacheLayout(16, DType::kF32),
                              (tokens + 15) / 16)
      .value();
}

// ---------------------------------------------------------------------------
// The file formats, on small files written here.

class FileWriter {
 public:
  template <typename T>
  void Put(T value) {
    const char* p = reinterpret_cast<const char*>(&value);
    bytes_.append(p, sizeof(T));
  }
  void PutFloats(int64_t n, float value) {
    for (int64_t i = 0; i < n; ++i) Put(value);
  }
  void PutPiece(float score, const std::string& piece) {
    Put(score);
    Put(static_cast<int32_t>(piece.size()));
    bytes_ += piece;
  }
  std::string& bytes() { return bytes_; }
  void WriteTo(const std::string& path, size_t size) const {
    std::ofstream(path, std::ios::binary).write(bytes_.data(), size);
  }
  void WriteTo(const std::string& path) const { WriteTo(path, bytes_.size()); }

 private:
  std::string bytes_;
};

// A llama2.c checkpoint of dim 8, FFN 12, 1 layer, 2 heads, vocabulary 300
// and context 16, tensor by tensor as the format lists them.
FileWriter TinyCheckpoint(bool tied) {
  const int32_t d = 8, f = 12, v = 300, seq = 16, head = 4;
  FileWriter w;
  for (int32_t x : {d, f, 1, 2, 2, tied ? v : -v, seq}) w.Put(x);
  w.PutFloats(v * d, 0.01f);                              // Token embedding.
  w.PutFloats(d, 1.0f);                                   // Attention RMSNorm.
  for (int i = 0; i < 4; ++i) w.PutFloats(d * d, 0.02f);  // wq wk wv wo.
  w.PutFloats(d, 1.0f);                                   // FFN RMSNorm.
  w.PutFloats(f * d, 0.03f);                              // w1.
  w.PutFloats(d * f, 0.03f);                              // w2.
  w.PutFloats(f * d, 0.03f);                              // w3.
  w.PutFloats(d, 1.0f);                                   // Final RMSNorm.
  w.PutFloats(2 * seq * head / 2, 0.0f);                  // RoPE tables.
  if (!tied) w.PutFloats(v * d, 0.05f);                   // LM head.
  return w;
}

TEST(Llama2cFormat, LoadsTheShapeItsHeaderGives) {
  TempDir dir("tierkv-llama2c");
  for (bool tied : {true, false}) {
    const std::string path = dir.path() + "/model.bin";
    TinyCheckpoint(tied).WriteTo(path);
    StatusOr<ReferenceModel> m = ReferenceModel::LoadLlama2c(path);
    ASSERT_THAT(m, IsOk()) << tied;
    const ReferenceModelConfig& c = m->config();
    EXPECT_EQ(c.hidden_size, 8);
    EXPECT_EQ(c.ffn_size, 12);
    EXPECT_EQ(c.num_layers, 1);
    EXPECT_EQ(c.num_heads, 2);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 4);
    EXPECT_EQ(c.vocab_size, 300);
    EXPECT_EQ(c.context_length, 16);
    EXPECT_EQ(c.rope_style, RopeStyle::kGptJ);

    // The context is enforced: position 15 runs, 16 does not.
    PagedKvCache cache = Cache(*m, 16);
    const std::vector<TokenId> tokens = {1, 2};
    const std::vector<int64_t> slots = {0, 1};
    EXPECT_THAT(
        m->Prefill({.tokens = tokens, .slots = slots, .start_position = 14},
                   &cache),
        IsOk());
    StatusOr<PrefillOutput> past = m->Prefill(
        {.tokens = tokens, .slots = slots, .start_position = 15}, &cache);
    EXPECT_THAT(past, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(past.status().message()),
                HasSubstr("past the model's context of 16"));
  }
}

TEST(Llama2cFormat, AFileOfAnotherSizeIsRefused) {
  TempDir dir("tierkv-llama2c");
  const std::string path = dir.path() + "/model.bin";
  FileWriter w = TinyCheckpoint(true);
  const size_t size = w.bytes().size();
  for (size_t bad : {size - 4, size - 1, size_t{20}, size_t{0}}) {
    w.WriteTo(path, bad);
    StatusOr<ReferenceModel> m = ReferenceModel::LoadLlama2c(path);
    EXPECT_THAT(m, StatusIs(StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(path)) << bad;
  }
  w.bytes() += "more";
  w.WriteTo(path);
  StatusOr<ReferenceModel> longer = ReferenceModel::LoadLlama2c(path);
  EXPECT_THAT(longer, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(longer.status().message()),
              HasSubstr("header implies"));

  // A header of nonsense sizes (a file of another format).
  FileWriter junk;
  for (int32_t x : {0x464c457f, 2, 1, 0, -5, 7, 9}) junk.Put(x);
  junk.WriteTo(path);
  EXPECT_THAT(ReferenceModel::LoadLlama2c(path),
              StatusIs(StatusCode::kInvalidArgument));
  FileWriter most_negative;
  for (int32_t x : {8, 12, 1, 2, 2, INT32_MIN, 16}) most_negative.Put(x);
  most_negative.WriteTo(path);
  EXPECT_THAT(ReferenceModel::LoadLlama2c(path),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ReferenceModel::LoadLlama2c(dir.path() + "/absent.bin"),
              StatusIs(StatusCode::kNotFound));
}

// <unk>, <s>, </s>, the 256 byte pieces, then " ", "a", "b", "c", "ab",
// "bc", " a" and "é".
FileWriter TinyTokenizer() {
  FileWriter w;
  w.Put(int32_t{8});
  w.PutPiece(0, "<unk>");
  w.PutPiece(0, "\n<s>\n");
  w.PutPiece(0, "\n</s>\n");
  for (int b = 0; b < 256; ++b) {
    char piece[8];
    std::snprintf(piece, sizeof(piece), "<0x%02X>", b);
    w.PutPiece(0, piece);
  }
  w.PutPiece(-1, " ");         // 259
  w.PutPiece(-2, "a");         // 260
  w.PutPiece(-2, "b");         // 261
  w.PutPiece(-2, "c");         // 262
  w.PutPiece(-3, "ab");        // 263
  w.PutPiece(-3, "bc");        // 264: ties with "ab"; the leftmost pair wins.
  w.PutPiece(-4, " a");        // 265
  w.PutPiece(-5, "\xc3\xa9");  // 266: é
  return w;
}

TEST(TokenizerFormat, EncodesMergesAndFallsBackToBytes) {
  TempDir dir("tierkv-tokenizer");
  const std::string path = dir.path() + "/tokenizer.bin";
  TinyTokenizer().WriteTo(path);
  StatusOr<Tokenizer> t = Tokenizer::Load(path, 267);
  ASSERT_THAT(t, IsOk());
  // " abc": the dummy prefix, then "ab" (a tie with "bc", leftmost first),
  // then " a" + "b" is not a piece, so " " "ab" "c"... " a" scores -4 and
  // "ab" -3: "ab" merges first and " a" never forms.
  EXPECT_THAT(t->Encode("abc", true), ElementsAre(1, 259, 263, 262));
  EXPECT_THAT(t->Encode("a", false), ElementsAre(265));
  EXPECT_THAT(t->Encode("", true), ElementsAre(1));
  // é is a piece; ü is not, so its two bytes fall back; a continuation
  // byte joins the character before it (llama2.c's grouping, so "ü\x80" is
  // looked up whole and falls back), and a character cut short falls back.
  EXPECT_THAT(
      t->Encode("\xc3\xa9\xc3\xbc\x80\xe2\x82", false),
      ElementsAre(259, 266, 3 + 0xc3, 3 + 0xbc, 3 + 0x80, 3 + 0xe2, 3 + 0x82));
  const std::vector<std::string> texts = {"abc", "a b  c",
                                          "\xc3\xa9\xc3\xbc\x80\xe2\x82",
                                          std::string("a\0b\n", 4), "\xff\xfe"};
  for (const std::string& text : texts) {
    EXPECT_EQ(t->DecodeAll(t->Encode(text, true)), text);
  }
  EXPECT_THAT(t->Encode("a\x80", false), ElementsAre(259, 3 + 'a', 3 + 0x80));
  EXPECT_EQ(t->Decode(1, 300), "");  // Outside the vocabulary.
}

// Some exports store each byte-fallback token's piece as the byte itself,
// so " ", "a" and "," appear twice. Text must map to the ordinary pieces;
// the byte tokens are only for bytes no piece covers, and never merge.
TEST(TokenizerFormat, RawBytePiecesAreReachedOnlyById) {
  FileWriter w;
  w.Put(int32_t{8});
  w.PutPiece(0, "<unk>");
  w.PutPiece(0, "\n<s>\n");
  w.PutPiece(0, "\n</s>\n");
  for (int b = 0; b < 256; ++b)
    w.PutPiece(0, std::string(1, static_cast<char>(b)));
  w.PutPiece(-1, " ");   // 259
  w.PutPiece(-2, "a");   // 260
  w.PutPiece(-3, " a");  // 261
  TempDir dir("tierkv-tokenizer");
  const std::string path = dir.path() + "/tokenizer.bin";
  w.WriteTo(path);
  StatusOr<Tokenizer> t = Tokenizer::Load(path, 262);
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->Encode("a", true), ElementsAre(1, 261));
  // "b" has no piece: its byte token, which does not merge with " ".
  EXPECT_THAT(t->Encode("b", false), ElementsAre(259, 3 + 'b'));
  EXPECT_THAT(t->Encode("ab a", false), ElementsAre(261, 3 + 'b', 261));
  EXPECT_EQ(t->DecodeAll(t->Encode("ab a", true)), "ab a");
}

TEST(TokenizerFormat, BrokenFilesAreRefused) {
  TempDir dir("tierkv-tokenizer");
  const std::string path = dir.path() + "/tokenizer.bin";
  FileWriter w = TinyTokenizer();
  EXPECT_THAT(Tokenizer::Load(path, 267), StatusIs(StatusCode::kNotFound));
  w.WriteTo(path, w.bytes().size() - 1);
  StatusOr<Tokenizer> cut = Tokenizer::Load(path, 267);
  EXPECT_THAT(cut, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("token 266"));
  w.WriteTo(path);
  StatusOr<Tokenizer> other = Tokenizer::Load(path, 32000);
  EXPECT_THAT(other, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("267 tokens, but the model has 32000"));
  FileWriter negative;
  negative.Put(int32_t{8});
  negative.Put(0.0f);
  negative.Put(int32_t{-3});
  negative.WriteTo(path);
  EXPECT_THAT(Tokenizer::Load(path, 1), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Tokenizer::Load(path, -1),
              StatusIs(StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------------------
// stories15M.

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    StatusOr<TrainedModel> m = LoadTrainedModel();
    status_ = new Status(m.status());
    if (m.ok()) model_ = new TrainedModel(std::move(m).value());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete status_;
    model_ = nullptr;
    status_ = nullptr;
  }
  void SetUp() override { ASSERT_THAT(*status_, IsOk()); }

  static const ReferenceModel& model() { return model_->model; }
  static const Tokenizer& tokenizer() { return model_->tokenizer; }

  // The full causal prefill of `tokens` in a cache with room for `extra`
  // more, and that cache.
  static std::pair<PrefillOutput, PagedKvCache> Full(
      const std::vector<TokenId>& tokens, int32_t extra = 0,
      int32_t num_logits = 1) {
    const auto n = static_cast<int64_t>(tokens.size());
    PagedKvCache cache = Cache(model(), n + extra);
    const std::vector<int64_t> slots = Iota(n);
    PrefillOutput out =
        model()
            .Prefill(
                {.tokens = tokens, .slots = slots, .num_logits = num_logits},
                &cache)
            .value();
    return {std::move(out), std::move(cache)};
  }

  static TrainedModel* model_;
  static Status* status_;
};

TrainedModel* RealModel::model_ = nullptr;
Status* RealModel::status_ = nullptr;

TEST_F(RealModel, CheckpointShape) {
  const ReferenceModelConfig& c = model().config();
  EXPECT_EQ(c.hidden_size, 288);
  EXPECT_EQ(c.ffn_size, 768);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.num_heads, 6);
  EXPECT_EQ(c.num_kv_heads, 6);
  EXPECT_EQ(c.head_dim, 48);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.context_length, 256);
  EXPECT_EQ(tokenizer().vocab_size(), 32000);
}

// What the checkpoint is known to do: the encoding of "Once upon a time",
// its two most likely next tokens with their logits, and the start of its
// greedy continuation.
TEST_F(RealModel, KnownTokensLogitsAndContinuation) {
  const std::vector<TokenId> prompt =
      tokenizer().Encode("Once upon a time", true);
  ASSERT_THAT(prompt, ElementsAre(1, 9038, 2501, 263, 931));
  // Punctuation maps to its ordinary pieces (29892 ",", 29889 "."), not to
  // the byte-fallback tokens whose pieces repeat them in this export.
  EXPECT_THAT(
      tokenizer().Encode("Once upon a time, there was a girl.", true),
      ElementsAre(1, 9038, 2501, 263, 931, 29892, 727, 471, 263, 7826, 29889));
  auto [out, cache] = Full(prompt, 40);
  const std::vector<float>& logits = out.logits;
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  EXPECT_EQ(order[0], 29892);  // ","
  EXPECT_EQ(order[1], 727);    // " there"
  EXPECT_NEAR(out.logits[29892], 18.36, 0.01);
  EXPECT_NEAR(out.logits[727], 14.98, 0.01);
  std::printf("logits: ',' %.4f, ' there' %.4f\n", out.logits[29892],
              out.logits[727]);

  const std::vector<TokenId> next =
      GreedyContinuation(model(), prompt, out.logits, 24, &cache).value();
  const std::string text = tokenizer().DecodeAll(next, prompt.back());
  std::printf("continuation: %s\n", text.c_str());
  EXPECT_THAT(text, StartsWith(", there was a little girl named Lily. She "
                               "loved to play outside in the sunshine."));
}

// Every story round-trips through the tokenizer, fits the budget the
// fidelity prompts rely on, and uses byte-fallback tokens only for the
// newline (which the vocabulary has no piece for); so does text outside
// the vocabulary's script.
TEST_F(RealModel, StoriesRoundTripAndFit) {
  constexpr TokenId kNewline = Tokenizer::kFirstByteToken + '\n';
  for (std::string_view story : ShortStories()) {
    const std::vector<TokenId> ids = tokenizer().Encode(story, true);
    EXPECT_EQ(tokenizer().DecodeAll(ids), story);
    EXPECT_LE(ids.size(), 65u) << story;
    for (TokenId t : ids) {
      EXPECT_NE(t, kRealModelSeparator);
      if (t != Tokenizer::kBos && t != kNewline) {
        EXPECT_GE(t, static_cast<TokenId>(Tokenizer::kFirstPieceToken))
            << story;
      }
    }
  }
  for (const char* text :
       {"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "I have 2 cats!", " x"}) {
    EXPECT_EQ(tokenizer().DecodeAll(tokenizer().Encode(text, true)), text);
  }
}

// Prefix caching (seed 002) on real text: request B repeats request A's
// system prompt and two stories and asks something else. Its hit blocks
// give logits and KV bit-identical to a full prefill, and the same greedy
// continuation.
TEST_F(RealModel, PrefixHitIsBitIdentical) {
  const auto stories = ShortStories();
  std::vector<TokenId> shared =
      tokenizer().Encode("Here are some short stories.\n", true);
  for (int s : {3, 11}) {
    const std::vector<TokenId> t = tokenizer().Encode(stories[s], false);
    shared.insert(shared.end(), t.begin(), t.end());
  }
  auto with = [&](const char* question) {
    std::vector<TokenId> out = shared;
    const std::vector<TokenId> q = tokenizer().Encode(question, false);
    out.insert(out.end(), q.begin(), q.end());
    return out;
  };
  constexpr int32_t kBlocks = 64;
  KVCacheManager manager =
      KVCacheManager::Create(
          {.pool = {.num_blocks = kBlocks, .block_size = 16}})
          .value();
  PagedKvCache pool = Cache(model(), int64_t{kBlocks} * 16);
  const KeyHasher hasher(KeyNamespace{"stories15M", ""});
  const Request a(1, with("Then the frog"), 16, hasher);
  int32_t hit = -1;
  ASSERT_THAT(PrefixCachedPrefill(model(), &manager, a, &pool, 1, &hit),
              IsOk());
  EXPECT_EQ(hit, 0);
  ASSERT_THAT(manager.Free(a.id()), IsOk());

  const Request b(2, with("One day, the duck"), 16, hasher);
  const int32_t n = b.num_tokens();
  PrefillOutput got =
      PrefixCachedPrefill(model(), &manager, b, &pool, 1, &hit).value();
  EXPECT_EQ(hit, static_cast<int32_t>(shared.size()) / 16 * 16);
  EXPECT_GT(hit, 64);
  EXPECT_EQ(got.computed_tokens, n - hit);

  const std::vector<TokenId> tokens(b.tokens().begin(), b.tokens().end());
  auto [full, full_cache] = Full(tokens);
  EXPECT_EQ(Bits(got.logits), Bits(full.logits));
  std::span<const BlockId> blocks = manager.blocks(b.id());
  for (int32_t t = 0; t < n; ++t) {
    const int64_t slot = int64_t{blocks[t / 16]} * 16 + t % 16;
    for (int32_t l = 0; l < model().config().num_layers; ++l) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        ASSERT_EQ(std::memcmp(pool.token(slot, l, plane),
                              full_cache.token(t, l, plane),
                              full_cache.layout().TokenStride()),
                  0)
            << "token " << t << " layer " << l;
      }
    }
  }
  ASSERT_THAT(manager.Free(b.id()), IsOk());
}

// Chunk reuse (seed 000) on real text: stories cached by an earlier request
// in another order, re-rotated into place, give the logits of one prefill
// of the whole prompt under the same chunk-isolated attention, up to fp32
// rounding (each chunk was computed at other absolute positions; the
// rotation is exact only up to float rounding, amplified through six
// layers). Placing the chunks without re-rotation is far off, so the bound
// has teeth.
// Measured about 2.5e-6 of the largest logit; 2^-16 is 1.5e-5.
constexpr double kChunkReuseTolerance = 0x1p-16;

TEST_F(RealModel, RemappedChunksMatchChunkIsolatedPrefill) {
  FidelityOptions options;
  options.prompts = 2;
  const std::vector<FidelityPrompt> prompts =
      MakeFidelityPrompts(*model_, options).value();
  ChunkKvStore store =
      CreateChunkKvStore(model(), {.num_blocks = 128, .virtual_start = 0})
          .value();
  const std::vector<TokenId> sep = {kRealModelSeparator};
  for (const FidelityPrompt& p : prompts) {
    const AssembledPrompt assembled = AssemblePrompt(p.prompt, sep).value();
    const auto n = static_cast<int64_t>(assembled.tokens.size());
    // Logits for every question token.
    const auto question = static_cast<int32_t>(assembled.question.size());
    PagedKvCache iso_cache = Cache(model(), n);
    const std::vector<int64_t> slots = Iota(n);
    const PrefillOutput isolated = model()
                                       .Prefill({.tokens = assembled.tokens,
                                                 .slots = slots,
                                                 .spans = assembled.spans,
                                                 .num_logits = question},
                                                &iso_cache)
                                       .value();
    // Twice: the first computes and stores the chunks the store lacks (a
    // later prompt may share some), the second hits them all.
    for (int round = 0; round < 2; ++round) {
      PagedKvCache dst = Cache(model(), n);
      ChunkedPrefillResult r = ChunkedPrefill(model(), &store, p.prompt, sep,
                                              {.num_logits = question}, &dst)
                                   .value();
      EXPECT_EQ(r.chunk_hits + r.chunk_misses, 1 + options.docs_per_prompt);
      if (round == 1) {
        EXPECT_EQ(r.chunk_misses, 0);
      }
      const double err = RelativeMaxError(r.output.logits, isolated.logits);
      std::printf("round %d: chunk reuse vs chunk-isolated prefill %.3g\n",
                  round, err);
      EXPECT_LE(err, kChunkReuseTolerance);
    }

    // Negative control: the same chunks copied without re-rotation.
    PagedKvCache unrotated = Cache(model(), n);
    for (const TokenRange& c : assembled.chunks) {
      std::span<const TokenId> chunk =
          std::span(assembled.tokens).subspan(c.begin, c.size());
      const std::vector<BlockId> blocks = store.Acquire(chunk);
      ASSERT_FALSE(blocks.empty());
      ASSERT_THAT(store.Place(blocks, static_cast<int32_t>(c.size()),
                              std::span(slots).subspan(c.begin, c.size()),
                              store.virtual_start(), unrotated.memory()),
                  IsOk());
      EXPECT_THAT(store.Release(blocks), IsOk());
    }
    const std::vector<TokenRange> cached = {{0, assembled.question.begin}};
    const PrefillOutput off = model()
                                  .Prefill({.tokens = assembled.tokens,
                                            .slots = slots,
                                            .spans = assembled.spans,
                                            .cached = cached,
                                            .num_logits = question},
                                           &unrotated)
                                  .value();
    const double err_off = RelativeMaxError(off.logits, isolated.logits);
    std::printf("without re-rotation: %.3g\n", err_off);
    EXPECT_GT(err_off, 100 * kChunkReuseTolerance);
  }
}

// The fidelity table (BENCHMARKS.md has it over more prompts): every mode
// served from chunk hits; CacheBlend's KL from the full prefill falls as
// the recompute ratio grows, and ratio 1 is the full prefill exactly.
TEST_F(RealModel, CacheBlendTableIsMonotone) {
  FidelityOptions options;
  options.prompts = 3;
  options.continuation = 8;
  const FidelityReport report = MeasureFidelity(*model_, options).value();
  std::printf("%s", FidelityTable(report).c_str());
  ASSERT_EQ(report.rows.size(), 1 + options.ratios.size());
  for (size_t k = 1; k < report.rows.size(); ++k) {
    EXPECT_EQ(report.rows[k].mode.kind, FidelityModeKind::kCacheBlend);
  }
  const FidelityRow& isolated = report.rows[0];
  EXPECT_GT(isolated.kl_mean, 0.0);
  for (size_t k = 2; k < report.rows.size(); ++k) {
    EXPECT_LE(report.rows[k].kl_mean, report.rows[k - 1].kl_mean)
        << report.rows[k].mode.name;
    EXPECT_GE(report.rows[k].recomputed_share,
              report.rows[k - 1].recomputed_share);
  }
  const FidelityRow& all = report.rows.back();
  EXPECT_EQ(all.mode.ratio, 1.0);
  EXPECT_EQ(all.kl_max, 0.0);
  EXPECT_EQ(all.top1, 1.0);
  EXPECT_EQ(all.exact, 1.0);
  EXPECT_EQ(all.recomputed_share, 1.0);
  for (const FidelityPromptResult& p : report.prompts) {
    EXPECT_EQ(p.modes.back().continuation, p.full_continuation);
  }
}

// The selection baselines recompute as many reused tokens as CacheBlend at
// the same ratio: the last ones before the question, or random ones.
TEST_F(RealModel, SelectionBaselinesRecomputeAsManyTokens) {
  FidelityOptions options;
  options.prompts = 1;
  options.continuation = 2;
  options.ratios = {0.0, 0.15, 1.0};
  options.selection_baselines = true;
  const FidelityReport report = MeasureFidelity(*model_, options).value();
  ASSERT_EQ(report.modes.size(), 6u);  // Reuse, 3 ratios, 2 baselines.
  const FidelityPromptResult& p = report.prompts[0];
  const int64_t want = RecomputeCount(0.15, p.reused_tokens).value();
  EXPECT_EQ(p.modes[2].recomputed, want);  // CacheBlend 0.15.
  EXPECT_EQ(report.modes[4].kind, FidelityModeKind::kNearest);
  EXPECT_EQ(p.modes[4].recomputed, want);
  EXPECT_EQ(report.modes[5].kind, FidelityModeKind::kRandom);
  EXPECT_EQ(p.modes[5].recomputed, want);
  // Neither is the chunk-isolated or the full result.
  for (size_t k : {4, 5}) {
    EXPECT_GT(p.modes[k].kl, 0.0) << report.modes[k].name;
    EXPECT_NE(p.modes[k].kl, p.modes[0].kl) << report.modes[k].name;
  }
}

}  // namespace
}  // namespace tierkv
