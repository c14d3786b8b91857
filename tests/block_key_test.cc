// Block keys: identical across processes and restarts, different wherever
// the KV would differ (namespace, tenant, LoRA, multimodal input, salt),
// and chunk keys never mean what prefix keys mean.
#include "tierkv/block_key.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "tests/key_fixtures.h"
#include "tests/sequential_tokens.h"

namespace tierkv {
namespace {

std::vector<BlockKey> PrefixKeys(const KeyHasher& h,
                                 const std::vector<TokenId>& tokens,
                                 const RequestExtras& extras = {}) {
  std::vector<BlockKey> keys;
  h.AppendPrefixKeys(tokens, 16, extras, &keys);
  return keys;
}

const KeyNamespace kNs{"model-a/bf16", ""};

TEST(BlockKey, SameInChildProcess) {
  FILE* child = popen(TIERKV_KEY_DUMP_PATH, "r");
  ASSERT_NE(child, nullptr) << "cannot start " << TIERKV_KEY_DUMP_PATH;
  std::vector<std::string> lines;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), child) != nullptr) {
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    lines.push_back(line);
  }
  ASSERT_EQ(pclose(child), 0);
  EXPECT_EQ(lines, testing::FixtureKeyLines());
}

// The key encoding is the persisted identity of every block: these values
// must only change together with the key format version.
TEST(KeyFormat, GoldenKeys) {
  const std::vector<std::string> lines = testing::FixtureKeyLines();
  auto find = [&](const std::string& label) {
    for (const std::string& l : lines) {
      if (l.rfind(label + " ", 0) == 0) return l.substr(label.size() + 1);
    }
    return std::string("missing");
  };
  EXPECT_EQ(find("seq_root"), "2ad73d9c4e7cb6c4b2ee34b3aac99acc");
  EXPECT_EQ(find("prefix3"), "7aa00639beaeaf9fc33564784a4c6767");
  EXPECT_EQ(find("extras0"), "a9ac944152640b7418e614a477fab77e");
  EXPECT_EQ(find("chunk2"), "91c9c6f78046f62d3aba067dd2ddf436");
}

TEST(BlockKey, SameInputsSameKeysAcrossHasherInstances) {
  const auto tokens = SequentialTokens(1, 64);
  EXPECT_EQ(PrefixKeys(KeyHasher(kNs), tokens),
            PrefixKeys(KeyHasher(kNs), tokens));
}

TEST(BlockKey, DiffersAcrossNamespacesAndTenants) {
  const auto tokens = SequentialTokens(1, 32);
  const auto base = PrefixKeys(KeyHasher(kNs), tokens);
  const auto other_model = PrefixKeys(KeyHasher({"model-b/bf16", ""}), tokens);
  const auto tenant_a = PrefixKeys(KeyHasher({"model-a/bf16", "a"}), tokens);
  const auto tenant_b = PrefixKeys(KeyHasher({"model-a/bf16", "b"}), tokens);
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NE(base[i], other_model[i]);
    EXPECT_NE(base[i], tenant_a[i]);
    EXPECT_NE(tenant_a[i], tenant_b[i]);
  }
  // Length-prefixed fields: moving a byte between model and tenant matters.
  EXPECT_NE(KeyHasher({"ab", "c"}).sequence_root(),
            KeyHasher({"a", "bc"}).sequence_root());
}

TEST(BlockKey, DiffersAcrossLoraIds) {
  const KeyHasher h(kNs);
  const auto tokens = SequentialTokens(1, 32);
  RequestExtras lora1, lora2;
  lora1.lora_id = 1;
  lora2.lora_id = 2;
  const auto none = PrefixKeys(h, tokens);
  const auto k1 = PrefixKeys(h, tokens, lora1);
  const auto k2 = PrefixKeys(h, tokens, lora2);
  for (size_t i = 0; i < none.size(); ++i) {
    EXPECT_NE(none[i], k1[i]);
    EXPECT_NE(k1[i], k2[i]);
  }
}

TEST(BlockKey, CacheSaltFoldsIntoFirstBlockOnly) {
  const KeyHasher h(kNs);
  const auto tokens = SequentialTokens(1, 32);
  RequestExtras s1, s2;
  s1.cache_salt = "tenant-secret-1";
  s2.cache_salt = "tenant-secret-2";
  const auto none = PrefixKeys(h, tokens);
  const auto k1 = PrefixKeys(h, tokens, s1);
  const auto k2 = PrefixKeys(h, tokens, s2);
  EXPECT_NE(none[0], k1[0]);
  EXPECT_NE(k1[0], k2[0]);
  EXPECT_NE(k1[1], k2[1]);  // Different through the chain.

  std::vector<std::byte> enc0, enc1;
  KeyHasher::EncodeExtraKeys(s1, 0, 0, 16, &enc0);
  KeyHasher::EncodeExtraKeys(s1, 1, 16, 16, &enc1);
  EXPECT_FALSE(enc0.empty());
  EXPECT_TRUE(enc1.empty());  // Block 1 carries no salt of its own.
}

TEST(BlockKey, MultiModalItemKeysOnlyTheBlocksItCovers) {
  const KeyHasher h(kNs);
  const auto tokens = SequentialTokens(1, 64);
  RequestExtras img_a, img_b, img_a_shifted;
  img_a.mm_items.push_back({.hash = {1, 2}, .start = 20, .length = 20});
  img_b.mm_items.push_back({.hash = {3, 4}, .start = 20, .length = 20});
  img_a_shifted.mm_items.push_back({.hash = {1, 2}, .start = 21, .length = 19});
  const auto none = PrefixKeys(h, tokens);
  const auto a = PrefixKeys(h, tokens, img_a);
  const auto b = PrefixKeys(h, tokens, img_b);
  const auto shifted = PrefixKeys(h, tokens, img_a_shifted);
  EXPECT_EQ(none[0], a[0]);  // Tokens 0-15: before the item.
  EXPECT_NE(none[1], a[1]);  // Tokens 16-31 hold the item's start.
  EXPECT_NE(a[1], b[1]);
  EXPECT_NE(a[1], shifted[1]);  // Offset inside the block matters.

  std::vector<std::byte> enc3;  // Tokens 48-63: after the item.
  KeyHasher::EncodeExtraKeys(img_a, 3, 48, 16, &enc3);
  EXPECT_TRUE(enc3.empty());
}

TEST(BlockKey, MultiModalItemsInAnyOrderAllCount) {
  // An image listed after a later one must still key the blocks it covers:
  // its placeholder tokens are the same whatever the image is.
  const KeyHasher h(kNs);
  const auto tokens = SequentialTokens(1, 64);
  RequestExtras cat, dog;
  cat.mm_items = {{.hash = {9, 9}, .start = 40, .length = 4},
                  {.hash = {1, 1}, .start = 4, .length = 4}};
  dog.mm_items = {{.hash = {9, 9}, .start = 40, .length = 4},
                  {.hash = {2, 2}, .start = 4, .length = 4}};
  EXPECT_NE(PrefixKeys(h, tokens, cat)[0], PrefixKeys(h, tokens, dog)[0]);
  RequestExtras cat_sorted = cat;
  std::swap(cat_sorted.mm_items[0], cat_sorted.mm_items[1]);
  EXPECT_EQ(PrefixKeys(h, tokens, cat), PrefixKeys(h, tokens, cat_sorted));
  // Items that start together (a video's frames and its audio track) too.
  RequestExtras video, video_swapped;
  video.mm_items = {{.hash = {7, 7}, .start = 4, .length = 30},
                    {.hash = {8, 8}, .start = 4, .length = 30},
                    {.hash = {6, 6}, .start = 4, .length = 12}};
  video_swapped.mm_items = {video.mm_items[1], video.mm_items[2],
                            video.mm_items[0]};
  EXPECT_EQ(PrefixKeys(h, tokens, video), PrefixKeys(h, tokens, video_swapped));
}

// AppendPrefixKeys looks at each block's items from the first that may
// still overlap it: it keys as chaining HashBlock over EncodeExtraKeys of
// every item does, for items in any order, overlapping or not.
TEST(BlockKey, PrefixKeysCountEveryItemOfEachBlock) {
  const KeyHasher h(kNs);
  const auto tokens = SequentialTokens(1, 160);
  RequestExtras extras;
  extras.lora_id = 7;
  extras.mm_items = {{.hash = {1, 1}, .start = 100, .length = 30},
                     {.hash = {2, 2}, .start = 3, .length = 60},
                     {.hash = {3, 3}, .start = 20, .length = 5},
                     {.hash = {4, 4}, .start = 64, .length = 1},
                     {.hash = {5, 5}, .start = 20, .length = 90}};
  std::vector<BlockKey> expected;
  BlockKey parent = h.sequence_root();
  for (int64_t b = 0; b < 10; ++b) {
    std::vector<std::byte> extra;
    KeyHasher::EncodeExtraKeys(extras, b, 16 * b, 16, &extra);
    parent = KeyHasher::HashBlock(
        parent, std::span(tokens).subspan(static_cast<size_t>(16 * b), 16),
        extra);
    expected.push_back(parent);
  }
  EXPECT_EQ(PrefixKeys(h, tokens, extras), expected);
  // Keys extended from a prefix agree with keys made at once.
  std::vector<BlockKey> grown =
      PrefixKeys(h, {tokens.begin(), tokens.begin() + 70}, extras);
  h.AppendPrefixKeys(tokens, 16, extras, &grown);
  EXPECT_EQ(grown, expected);
}

TEST(BlockKey, ZeroBlockSizeKeysNothing) {
  const KeyHasher h(kNs);
  std::vector<BlockKey> keys;
  h.AppendPrefixKeys(SequentialTokens(1, 8), 0, {}, &keys);
  EXPECT_TRUE(keys.empty());
  EXPECT_TRUE(h.ChunkKeys(SequentialTokens(1, 8), 0).empty());
}

TEST(BlockKey, ChunkKeysAreContentOnlyAndNeverPrefixKeys) {
  const KeyHasher h(kNs);
  const auto doc =
      SequentialTokens(500, 40);  // Two full blocks and a partial one.
  const auto chunk = h.ChunkKeys(doc, 16);
  ASSERT_EQ(chunk.size(), 3u);
  EXPECT_EQ(chunk, KeyHasher(kNs).ChunkKeys(doc, 16));
  const auto prefix = PrefixKeys(h, doc);
  ASSERT_EQ(prefix.size(), 2u);
  EXPECT_NE(chunk[0], prefix[0]);
  EXPECT_NE(chunk[1], prefix[1]);
  EXPECT_NE(h.chunk_root(), h.sequence_root());
  // A shorter chunk shares the full blocks; its partial block differs.
  const auto shorter = h.ChunkKeys(std::span(doc).first(36), 16);
  EXPECT_EQ(shorter[0], chunk[0]);
  EXPECT_EQ(shorter[1], chunk[1]);
  EXPECT_NE(shorter[2], chunk[2]);
}

// A chunk's KV depends on the position it was computed at (RoPE): each
// virtual start keys it apart, at every block; start 0 is the chunk root's
// own chain.
TEST(BlockKey, ChunkKeysDependOnTheVirtualStart) {
  const KeyHasher h(kNs);
  const auto doc = SequentialTokens(500, 40);
  const auto at0 = h.ChunkKeys(doc, 16);
  EXPECT_EQ(h.ChunkKeys(doc, 16, 0), at0);
  EXPECT_EQ(at0[0],
            KeyHasher::HashBlock(h.chunk_root(), std::span(doc).first(16)));
  std::vector<std::vector<BlockKey>> seen = {at0};
  for (int64_t start :
       {int64_t{1}, int64_t{100}, int64_t{1} << 32, (int64_t{1} << 48) - 1}) {
    const auto keys = h.ChunkKeys(doc, 16, start);
    ASSERT_EQ(keys.size(), 3u);
    EXPECT_EQ(keys, h.ChunkKeys(doc, 16, start));
    for (const auto& other : seen) {
      for (size_t i = 0; i < keys.size(); ++i) EXPECT_NE(keys[i], other[i]);
    }
    seen.push_back(keys);
  }
}

// The variant (RoPE config, LoRA adapter: what else changes a chunk's KV)
// keys it apart at every block and every start; none keeps the keys of a
// chunk keyed without one.
TEST(BlockKey, ChunkKeysDependOnTheVariant) {
  const KeyHasher h(kNs);
  const auto doc = SequentialTokens(500, 40);
  // No variant keeps the keys chunks had before variants: from the root at
  // start 0, else from a block of no tokens holding the start alone.
  EXPECT_EQ(h.ChunkKeys(doc, 16, 0, {})[0],
            KeyHasher::HashBlock(h.chunk_root(), std::span(doc).first(16)));
  std::array<std::byte, 8> start7{};
  start7[0] = std::byte{7};
  const BlockKey at7 = KeyHasher::HashBlock(h.chunk_root(), {}, start7);
  EXPECT_EQ(h.ChunkKeys(doc, 16, 7, {})[0],
            KeyHasher::HashBlock(at7, std::span(doc).first(16)));
  const BlockKey rope_a = ChunkVariant("neox theta=10000", "");
  const BlockKey rope_b = ChunkVariant("neox theta=500000", "");
  const BlockKey lora = ChunkVariant("neox theta=10000", "lora-7");
  EXPECT_EQ(rope_a, ChunkVariant("neox theta=10000", ""));
  // The two strings are told apart, not run together.
  EXPECT_NE(ChunkVariant("ab", ""), ChunkVariant("a", "b"));
  EXPECT_NE(ChunkVariant("ab", ""), ChunkVariant("", "ab"));
  for (int64_t start : {int64_t{0}, int64_t{100}}) {
    std::vector<std::vector<BlockKey>> seen = {h.ChunkKeys(doc, 16, start)};
    for (const BlockKey& variant : {rope_a, rope_b, lora}) {
      const auto keys = h.ChunkKeys(doc, 16, start, variant);
      ASSERT_EQ(keys.size(), 3u);
      EXPECT_EQ(keys, h.ChunkKeys(doc, 16, start, variant));
      for (const auto& other : seen) {
        for (size_t i = 0; i < keys.size(); ++i) EXPECT_NE(keys[i], other[i]);
      }
      seen.push_back(keys);
    }
  }
  // A variant's keys are not another start's.
  EXPECT_NE(h.ChunkKeys(doc, 16, 0, rope_a), h.ChunkKeys(doc, 16, 1));
}

TEST(BlockKey, EncodingIsInjective) {
  // [1, 2] with no extras must not equal [1] followed by bytes that spell 2.
  const BlockKey parent{9, 9};
  const std::vector<TokenId> two{1, 2};
  const std::vector<TokenId> one{1};
  const std::byte spelled_two[4] = {std::byte{2}, std::byte{0}, std::byte{0},
                                    std::byte{0}};
  EXPECT_NE(KeyHasher::HashBlock(parent, two),
            KeyHasher::HashBlock(parent, one, spelled_two));
  EXPECT_NE(KeyHasher::HashBlock(parent, two),
            KeyHasher::HashBlock(BlockKey{9, 10}, two));
}

// The key encoding rebuilt by hand from the format in block_key.h, so every
// hashing path (specialised, generic, heap, with extras) is checked against
// bytes the library did not produce.
BlockKey ManualKey(const BlockKey& parent, std::span<const TokenId> tokens,
                   const std::vector<uint8_t>& extra = {}) {
  std::vector<uint8_t> bytes;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i)
      bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put(parent.lo, 8);
  put(parent.hi, 8);
  put(tokens.size(), 4);
  for (TokenId t : tokens) put(t, 4);
  bytes.insert(bytes.end(), extra.begin(), extra.end());
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockKey{h.low64, h.high64};
}

TEST(KeyFormat, EveryPathMatchesAHandBuiltEncoding) {
  const KeyHasher h(kNs);
  for (int32_t bs : {1, 16, 32, 64, 100, 256, 300}) {
    const auto tokens = SequentialTokens(70000, 2 * bs + bs / 2);  // + partial
    std::vector<BlockKey> keys;
    h.AppendPrefixKeys(tokens, bs, {}, &keys);
    ASSERT_EQ(keys.size(), 2u) << bs;
    const auto span = std::span<const TokenId>(tokens);
    const BlockKey k0 = ManualKey(h.sequence_root(), span.first(bs));
    EXPECT_EQ(keys[0], k0) << "block size " << bs;
    EXPECT_EQ(keys[1], ManualKey(k0, span.subspan(bs, bs))) << bs;
  }
  // LoRA 7 and a salt on the first block: tag 0x01 + u64, tag 0x03 + u32
  // length + bytes.
  RequestExtras extras;
  extras.lora_id = 7;
  extras.cache_salt = "ab";
  const auto tokens = SequentialTokens(1, 16);
  std::vector<BlockKey> keys;
  h.AppendPrefixKeys(tokens, 16, extras, &keys);
  const std::vector<uint8_t> extra{0x01, 7,    0, 0, 0, 0, 0,   0,
                                   0,    0x03, 2, 0, 0, 0, 'a', 'b'};
  EXPECT_EQ(keys[0], ManualKey(h.sequence_root(), tokens, extra));
  // Chunk keys: chunk root, partial last block with its own count.
  const auto chunk = h.ChunkKeys(std::span(tokens).first(10), 8);
  ASSERT_EQ(chunk.size(), 2u);
  const BlockKey c0 = ManualKey(h.chunk_root(), std::span(tokens).first(8));
  EXPECT_EQ(chunk[0], c0);
  EXPECT_EQ(chunk[1], ManualKey(c0, std::span(tokens).subspan(8, 2)));
}

TEST(BlockKey, ToHexIsHiThenLo) {
  EXPECT_EQ((BlockKey{0x1, 0xab}).ToHex(), "00000000000000ab0000000000000001");
}

TEST(BlockKey, FromHexInvertsToHex) {
  const BlockKey key{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(BlockKey::FromHex(key.ToHex()).value(), key);
  EXPECT_EQ(BlockKey::FromHex("FEDCBA98765432100123456789ABCDEF").value(), key);
}

TEST(BlockKey, FromHexRefusesAnythingButThirtyTwoHexDigits) {
  for (const char* bad : {"", "abc", "00000000000000ab00000000000000010",
                          "00000000000000ab000000000000000g",
                          "0x000000000000ab0000000000000001"}) {
    StatusOr<BlockKey> key = BlockKey::FromHex(bad);
    ASSERT_FALSE(key.ok()) << bad;
    EXPECT_EQ(key.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(key.status().message().find("block key"), std::string::npos);
  }
}

}  // namespace
}  // namespace tierkv
