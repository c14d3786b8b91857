// Tests of the disk tier (tiers/disk_tier.h) against a real RocksDB in a
// temporary directory; faults are injected through a DiskStorage wrapper.
#include "tiers/disk_tier.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tierkv/kv_layout.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// 2 layers x 2 KV heads x head dim 64 x 16 tokens x bf16 = 16 KiB.
KvLayout TestLayout() {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .block_size = 16,
                  .dtype = DType::kBF16};
}

// bf16 values of a smooth-ish Gaussian signal, as KV data looks byte-wise.
std::vector<std::byte> Bf16Block(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<std::byte> out(bytes);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    float f = normal(rng) * (1.0f + static_cast<float>((i / 2) % 64) / 16.0f);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    bits += 0x7fff + ((bits >> 16) & 1);  // Round to nearest even.
    const uint16_t hi = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + i, &hi, sizeof(hi));
  }
  return out;
}

std::vector<TokenId> TokensOf(int block) {
  std::vector<TokenId> tokens(16);
  for (int j = 0; j < 16; ++j) tokens[j] = static_cast<TokenId>(block * 16 + j);
  return tokens;
}

BlockKey KeyOf(int block) {
  // Spread over the low word, as real keys are.
  return BlockKey{.lo = (static_cast<uint64_t>(block) + 1) * 0x9e3779b97f4a7c15,
                  .hi = 0xabcdef};
}

Status PutSync(DiskTier& tier, const BlockKey& key,
               std::span<const TokenId> tokens,
               std::span<const std::byte> payload) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  tier.Put(key, tokens, payload, [&](Status s) { done.set_value(s); });
  return result.get();
}

Status GetSync(DiskTier& tier, const BlockKey& key,
               std::span<const TokenId> tokens, std::span<std::byte> out) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  tier.Get(key, tokens, out, [&](Status s) { done.set_value(s); });
  return result.get();
}

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(DiskCodec codec = DiskCodec::kLz4BytePlanes) const {
    DiskTierOptions options;
    options.storage.path = dir_.path() + "/db";
    options.capacity_bytes = uint64_t{1} << 30;
    options.layout_fingerprint = layout_.Fingerprint();
    options.block_bytes = layout_.BlockBytes();
    options.codec = codec;
    return options;
  }

  std::unique_ptr<DiskTier> OpenTier(const DiskTierOptions& options) {
    StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(options);
    EXPECT_THAT(tier, IsOk());
    return tier.ok() ? std::move(tier).value() : nullptr;
  }

  const std::vector<std::byte>& Block(int i) {
    auto it = blocks_.find(i);
    if (it == blocks_.end()) {
      it = blocks_.emplace(i, Bf16Block(layout_.BlockBytes(), i)).first;
    }
    return it->second;
  }

  Status Put(DiskTier& tier, int i) {
    return PutSync(tier, KeyOf(i), TokensOf(i), Block(i));
  }

  // OK only when the block comes back bit for bit.
  Status GetAndCheck(DiskTier& tier, int i) {
    std::vector<std::byte> out(layout_.BlockBytes());
    Status s = GetSync(tier, KeyOf(i), TokensOf(i), out);
    if (s.ok() && out != Block(i)) return Status::Internal("bytes differ");
    return s;
  }

  // The bytes one block's value takes (header + stored payload).
  uint64_t ValueBytes(DiskCodec codec) {
    TempDir dir("disk_tier_test");
    DiskTierOptions options = Options(codec);
    options.storage.path = dir.path();
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    EXPECT_THAT(Put(*tier, 0), IsOk());
    return tier->stats().bytes;
  }

  KvLayout layout_ = TestLayout();
  TempDir dir_{"disk_tier_test"};
  std::map<int, std::vector<std::byte>> blocks_;
};

// --- Codecs -----------------------------------------------------------------

class DiskTierCodecTest : public ::testing::TestWithParam<DiskCodec> {};

TEST_P(DiskTierCodecTest, RoundTripIsBitExact) {
  const DiskCodec codec = GetParam();
  // Sizes with and without a SIMD tail, and two element sizes.
  for (size_t bytes : {size_t{16384}, size_t{16384 + 6}, size_t{2}}) {
    for (int32_t element_bytes : {2, 4}) {
      if (bytes % element_bytes != 0) continue;
      std::vector<std::byte> payload = Bf16Block(bytes, bytes);
      std::vector<std::byte> stored(
          MaxEncodedBytes(codec, element_bytes, bytes));
      StatusOr<EncodedPayload> encoded =
          EncodePayload(codec, element_bytes, payload, stored);
      ASSERT_THAT(encoded, IsOk());
      std::string_view view =
          encoded->codec == DiskCodec::kNone
              ? std::string_view(reinterpret_cast<const char*>(payload.data()),
                                 payload.size())
              : std::string_view(reinterpret_cast<const char*>(stored.data()),
                                 encoded->bytes);
      EXPECT_LT(view.size(), bytes + 1);
      std::vector<std::byte> out(bytes);
      ASSERT_THAT(DecodePayload(encoded->codec, element_bytes, view, out),
                  IsOk());
      EXPECT_EQ(out, payload)
          << "bytes " << bytes << " element " << element_bytes;
    }
  }
}

TEST_P(DiskTierCodecTest, TruncatedStoredBytesAreDataLoss) {
  const DiskCodec codec = GetParam();
  std::vector<std::byte> payload(16384, std::byte{7});  // Compresses well.
  std::vector<std::byte> stored(MaxEncodedBytes(codec, 2, payload.size()));
  StatusOr<EncodedPayload> encoded = EncodePayload(codec, 2, payload, stored);
  ASSERT_THAT(encoded, IsOk());
  ASSERT_EQ(encoded->codec, codec);
  const std::byte* stored_bytes =
      codec == DiskCodec::kNone ? payload.data() : stored.data();
  const size_t size =
      codec == DiskCodec::kNone ? payload.size() : encoded->bytes;
  std::vector<std::byte> out(payload.size());
  for (size_t cut = 0; cut < size; cut += 1 + size / 16) {
    std::string_view view(reinterpret_cast<const char*>(stored_bytes), cut);
    EXPECT_EQ(DecodePayload(codec, 2, view, out).code(), StatusCode::kDataLoss)
        << "cut at " << cut;
  }
}

// An empty payload (whose spans' data() are null) round-trips without
// handing memcpy or LZ4 a null pointer: UBSan (tools/run sanitize) fails
// this test otherwise. Found by fuzz/disk_value_fuzz.
TEST_P(DiskTierCodecTest, EmptyPayloadRoundTrips) {
  const DiskCodec codec = GetParam();
  const std::vector<std::byte> payload;
  std::vector<std::byte> stored(MaxEncodedBytes(codec, 2, 0));
  StatusOr<EncodedPayload> encoded = EncodePayload(codec, 2, payload, stored);
  ASSERT_THAT(encoded, IsOk());
  EXPECT_EQ(encoded->codec, DiskCodec::kNone);
  std::vector<std::byte> out;
  EXPECT_THAT(DecodePayload(DiskCodec::kNone, 2, std::string_view(), out),
              IsOk());
  EXPECT_THAT(DecodePayload(DiskCodec::kNone, 2, "x", out), Not(IsOk()));
}

// Every codec, and a test name for each ("lz4byteplanes").
const auto kEveryCodec = ::testing::Values(DiskCodec::kNone, DiskCodec::kLz4,
                                           DiskCodec::kLz4BytePlanes);
std::string CodecTestName(const ::testing::TestParamInfo<DiskCodec>& info) {
  std::string name(DiskCodecName(info.param));
  std::erase(name, '-');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Codecs, DiskTierCodecTest, kEveryCodec, CodecTestName);

TEST(DiskTierCodec, IncompressibleBytesAreStoredRaw) {
  std::vector<std::byte> payload(16384);
  std::mt19937_64 rng(1);
  for (std::byte& b : payload) b = static_cast<std::byte>(rng());
  for (DiskCodec codec : {DiskCodec::kLz4, DiskCodec::kLz4BytePlanes}) {
    std::vector<std::byte> stored(MaxEncodedBytes(codec, 2, payload.size()));
    StatusOr<EncodedPayload> encoded = EncodePayload(codec, 2, payload, stored);
    ASSERT_THAT(encoded, IsOk());
    EXPECT_EQ(encoded->codec, DiskCodec::kNone) << DiskCodecName(codec);
  }
}

TEST(DiskTierCodec, BadArgumentsAreRejected) {
  std::vector<std::byte> payload(15);
  std::vector<std::byte> stored(1024);
  EXPECT_EQ(EncodePayload(DiskCodec::kLz4BytePlanes, 2, payload, stored)
                .status()
                .code(),
            StatusCode::kInvalidArgument);  // 2 does not divide 15.
  EXPECT_EQ(EncodePayload(DiskCodec::kLz4BytePlanes, 0, payload, stored)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodePayload(DiskCodec::kLz4, 2, payload,
                          std::span<std::byte>(stored).first(4))
                .status()
                .code(),
            StatusCode::kInvalidArgument);  // Shorter than the bound.
}

// --- The tier ---------------------------------------------------------------

class DiskTierRoundTripTest : public DiskTierTest,
                              public ::testing::WithParamInterface<DiskCodec> {
};

TEST_P(DiskTierRoundTripTest, BlocksComeBackBitExact) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options(GetParam()));
  for (int i = 0; i < 8; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(tier->Contains(KeyOf(i)));
    EXPECT_TRUE(tier->Contains(KeyOf(i), TokensOf(i)));
    Status s = GetAndCheck(*tier, i);
    EXPECT_THAT(s, IsOk());
  }
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.keys, 8u);
  EXPECT_EQ(stats.puts, 8u);
  EXPECT_EQ(stats.gets, 8u);
  EXPECT_EQ(stats.hits, 8u);
  EXPECT_EQ(stats.misses, 0u);
  EXPECT_EQ(stats.payload_bytes_written, 8 * layout_.BlockBytes());
  // The bound counts each block's record and the pages of its slot that
  // the stored bytes take.
  EXPECT_GE(stats.bytes, stats.stored_bytes_written);
  EXPECT_LT(stats.bytes, stats.stored_bytes_written + 8 * 4096);
  if (GetParam() == DiskCodec::kLz4BytePlanes) {
    // bf16 sign/exponent bytes repeat; plain LZ4 finds nothing in
    // interleaved bf16 (it stores them raw), byte planes do.
    EXPECT_LT(stats.stored_bytes_written, stats.payload_bytes_written);
  } else {
    EXPECT_GT(stats.bytes, stats.payload_bytes_written);  // Raw + headers.
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, DiskTierRoundTripTest, kEveryCodec,
                         CodecTestName);

TEST_F(DiskTierTest, MissAndRemove) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  std::vector<std::byte> out(layout_.BlockBytes());
  EXPECT_EQ(GetSync(*tier, KeyOf(1), TokensOf(1), out).code(),
            StatusCode::kNotFound);
  ASSERT_THAT(Put(*tier, 1), IsOk());
  tier->Remove(KeyOf(1));
  EXPECT_FALSE(tier->Contains(KeyOf(1)));  // At once, before the delete.
  ASSERT_THAT(tier->Flush(), IsOk());
  EXPECT_EQ(GetSync(*tier, KeyOf(1), TokensOf(1), out).code(),
            StatusCode::kNotFound);
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.keys, 0u);
  EXPECT_EQ(stats.bytes, 0u);
  EXPECT_EQ(stats.misses, 2u);
  tier.reset();
  // Gone from RocksDB too: a reopen finds nothing.
  tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 0u);
}

TEST_F(DiskTierTest, PutOfAKeyReplacesItsValueAndLaterPutWins) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  // Two Puts of one key in flight together: the one queued later wins.
  std::promise<Status> first, second;
  tier->Put(KeyOf(0), TokensOf(0), Block(1),
            [&](Status s) { first.set_value(s); });
  tier->Put(KeyOf(0), TokensOf(0), Block(2),
            [&](Status s) { second.set_value(s); });
  EXPECT_THAT(first.get_future().get(), IsOk());
  EXPECT_THAT(second.get_future().get(), IsOk());
  std::vector<std::byte> out(layout_.BlockBytes());
  ASSERT_THAT(GetSync(*tier, KeyOf(0), TokensOf(0), out), IsOk());
  EXPECT_EQ(out, Block(2));
  EXPECT_EQ(tier->stats().keys, 1u);
  tier.reset();
  tier = OpenTier(Options());
  ASSERT_THAT(GetSync(*tier, KeyOf(0), TokensOf(0), out), IsOk());
  EXPECT_EQ(out, Block(2));
}

TEST_F(DiskTierTest, CallbacksRunOnIoThreads) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  std::promise<std::thread::id> put_thread, get_thread;
  tier->Put(KeyOf(0), TokensOf(0), Block(0), [&](Status s) {
    EXPECT_THAT(s, IsOk());
    put_thread.set_value(std::this_thread::get_id());
  });
  EXPECT_NE(put_thread.get_future().get(), std::this_thread::get_id());
  std::vector<std::byte> out(layout_.BlockBytes());
  tier->Get(KeyOf(0), TokensOf(0), out, [&](Status s) {
    EXPECT_THAT(s, IsOk());
    get_thread.set_value(std::this_thread::get_id());
  });
  EXPECT_NE(get_thread.get_future().get(), std::this_thread::get_id());
}

TEST_F(DiskTierTest, BadArgumentsFailThroughDone) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  std::vector<std::byte> short_payload(100);
  EXPECT_EQ(PutSync(*tier, KeyOf(0), TokensOf(0), short_payload).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PutSync(*tier, KeyOf(0), {}, Block(0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(GetSync(*tier, KeyOf(0), TokensOf(0), short_payload).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(DiskTierTest, OpenRejectsBadOptionsAndASecondOpener) {
  DiskTierOptions options = Options();
  options.capacity_bytes = 0;
  EXPECT_EQ(DiskTier::Open(options).status().code(),
            StatusCode::kInvalidArgument);
  options = Options();
  options.block_bytes = 15;  // Not a whole number of bf16 elements.
  EXPECT_EQ(DiskTier::Open(options).status().code(),
            StatusCode::kInvalidArgument);

  // A store in use (its LOCK held) is busy, not unusable.
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  StatusOr<std::unique_ptr<DiskTier>> second = DiskTier::Open(Options());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists)
      << second.status().ToString();
  EXPECT_THAT(second.status().message(), HasSubstr(dir_.path()));
}

// --- Capacity and LRU -------------------------------------------------------

// DiskValueBytes is what a value takes in the byte bound (a raw payload).
TEST_F(DiskTierTest, DiskValueBytesIsAValuesSize) {
  const DiskTierOptions options = Options(DiskCodec::kNone);
  EXPECT_EQ(ValueBytes(DiskCodec::kNone),
            DiskValueBytes(options.block_bytes,
                           options.layout_fingerprint.size(), 16));
}

TEST_F(DiskTierTest, CapacityReachedEvictsLeastRecentlyUsed) {
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 4 * value_bytes + value_bytes / 2;  // 4 blocks.
  std::unique_ptr<DiskTier> tier = OpenTier(options);

  // Ten times the capacity, all in flight at once; the bound holds at
  // every completion, not only at the end.
  std::atomic<int> over_bound{0};
  std::vector<std::promise<Status>> done(40);
  for (int i = 0; i < 40; ++i) {
    tier->Put(KeyOf(i), TokensOf(i), Block(i), [&, i](Status s) {
      if (tier->stats().bytes > options.capacity_bytes) ++over_bound;
      done[i].set_value(s);
    });
  }
  for (auto& d : done) EXPECT_THAT(d.get_future().get(), IsOk());
  ASSERT_THAT(tier->Flush(), IsOk());
  EXPECT_EQ(over_bound.load(), 0);
  DiskTierStats stats = tier->stats();
  EXPECT_LE(stats.bytes, options.capacity_bytes);
  EXPECT_EQ(stats.keys, 4u);
  EXPECT_EQ(stats.evictions, 36u);

  // Sequentially now: four known blocks, then touch the oldest.
  for (int i = 100; i < 104; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  ASSERT_THAT(GetAndCheck(*tier, 100), IsOk());  // 100 becomes most recent.
  ASSERT_THAT(Put(*tier, 104), IsOk());          // Evicts 101, the LRU.
  EXPECT_TRUE(tier->Contains(KeyOf(100)));
  EXPECT_FALSE(tier->Contains(KeyOf(101)));
  for (int i : {100, 102, 103, 104}) {
    EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  }
  EXPECT_EQ(tier->stats().evictions, 36u + 4u + 1u);
  EXPECT_LE(tier->stats().bytes, options.capacity_bytes);

  // Evicted values are deleted from RocksDB, not just forgotten.
  tier.reset();
  options.capacity_bytes = uint64_t{1} << 30;
  tier = OpenTier(options);
  EXPECT_EQ(tier->stats().keys, 4u);
}

// The value file holds no more than the blocks the tier keeps: after a
// restart with a smaller capacity (the oldest blocks, at the file's start,
// evicted) and after RemoveAll, the free slots' space goes back.
TEST_F(DiskTierTest, TheValueFileShrinksToWhatTheTierKeeps) {
  const std::string file =
      dir_.path() + "/db/" + std::string(kDiskValueFileName);
  const auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(stat(file.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  DiskTierOptions options = Options(DiskCodec::kNone);
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  for (int i = 0; i < 40; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  const uint64_t forty = allocated();
  ASSERT_GE(forty, 40 * layout_.BlockBytes());
  tier.reset();
  options.capacity_bytes = 4 * value_bytes + value_bytes / 2;  // 4 blocks.
  tier = OpenTier(options);
  ASSERT_EQ(tier->stats().keys, 4u);
  for (int i = 36; i < 40; ++i) EXPECT_THAT(GetAndCheck(*tier, i), IsOk());
  EXPECT_LE(allocated(), forty / 8);
  EXPECT_EQ(tier->RemoveAll(), 4u);
  EXPECT_EQ(allocated(), 0u);
  // And it takes writes again, from the file's start.
  ASSERT_THAT(Put(*tier, 50), IsOk());
  EXPECT_THAT(GetAndCheck(*tier, 50), IsOk());
}

// The disk tier's ARC: a block that was read (promoted) and comes back
// soon after its eviction earns the frequent list's protection, so a flood
// of blocks written once no longer pushes it out, as it does under LRU.
TEST_F(DiskTierTest, UnderArcAReadBlockBackAfterEvictionOutlastsAFlood) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    SCOPED_TRACE(std::string(EvictionPolicyName(policy)));
    const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
    DiskTierOptions options = Options(DiskCodec::kNone);
    options.capacity_bytes = 4 * value_bytes + value_bytes / 2;  // 4 blocks.
    options.eviction = policy;
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    ASSERT_THAT(GetAndCheck(*tier, 0), IsOk());  // Read: used again.
    // With no evidence yet both evict in LRU order: 1, 2, 3, then 0.
    for (int i = 4; i < 8; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    for (int i = 0; i < 4; ++i) EXPECT_FALSE(tier->Contains(KeyOf(i))) << i;
    // 0 is computed and spilled again soon after: ARC's frequent ghost.
    ASSERT_THAT(Put(*tier, 0), IsOk());
    for (int i = 8; i < 12; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    EXPECT_EQ(tier->Contains(KeyOf(0)), policy == EvictionPolicy::kArc);
    for (int i = 9; i < 12; ++i) EXPECT_TRUE(tier->Contains(KeyOf(i))) << i;
    EXPECT_THAT(GetAndCheck(*tier, policy == EvictionPolicy::kArc ? 0 : 8),
                IsOk());
    EXPECT_EQ(tier->stats().keys, 4u);
    EXPECT_LE(tier->stats().bytes, options.capacity_bytes);
  }
}

// A block the host let go (Renew) becomes the most recently used. (That
// it is not counted as a use under ARC is DiskIndex's test.)
TEST_F(DiskTierTest, ARenewedBlockIsEvictedLast) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    SCOPED_TRACE(std::string(EvictionPolicyName(policy)));
    const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
    DiskTierOptions options = Options(DiskCodec::kNone);
    options.capacity_bytes = 4 * value_bytes + value_bytes / 2;
    options.eviction = policy;
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    tier->Renew(KeyOf(0));
    tier->Renew(KeyOf(99));              // Not stored: nothing happens.
    ASSERT_THAT(Put(*tier, 4), IsOk());  // Evicts 1, not 0.
    EXPECT_TRUE(tier->Contains(KeyOf(0)));
    EXPECT_FALSE(tier->Contains(KeyOf(1)));
    EXPECT_FALSE(tier->Contains(KeyOf(99)));
    for (int i = 5; i < 8; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    EXPECT_FALSE(tier->Contains(KeyOf(0)));  // Its turn came.
    EXPECT_EQ(tier->stats().keys, 4u);
  }
}

// GetVerified reports the checksum the bytes were verified against, for
// raw and compressed values alike.
TEST_F(DiskTierTest, GetVerifiedReportsTheChecksumOfTheBlock) {
  for (DiskCodec codec : {DiskCodec::kNone, DiskCodec::kLz4BytePlanes}) {
    std::unique_ptr<DiskTier> tier = OpenTier(Options(codec));
    ASSERT_THAT(Put(*tier, 7), IsOk());
    std::vector<std::byte> out(layout_.BlockBytes());
    std::promise<StatusOr<uint64_t>> done;
    tier->GetVerified(KeyOf(7), TokensOf(7), out,
                      [&](StatusOr<uint64_t> got) { done.set_value(got); });
    StatusOr<uint64_t> got = done.get_future().get();
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(*got, XXH3_64bits(Block(7).data(), Block(7).size()));
    EXPECT_EQ(out, Block(7));
    std::promise<StatusOr<uint64_t>> missed;
    tier->GetVerified(KeyOf(8), TokensOf(8), out,
                      [&](StatusOr<uint64_t> got) { missed.set_value(got); });
    EXPECT_THAT(missed.get_future().get(), StatusIs(StatusCode::kNotFound));
    tier.reset();
    std::filesystem::remove_all(dir_.path() + "/db");
  }
}

// RenewIfStored checks and renews in one step: only a block stored for
// the same token ids, which then outlasts the others as Renew's does.
TEST_F(DiskTierTest, RenewIfStoredRenewsOnlyWhatItFinds) {
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 4 * value_bytes + value_bytes / 2;
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  EXPECT_FALSE(tier->RenewIfStored(KeyOf(1), TokensOf(2)));  // Other tokens.
  EXPECT_FALSE(tier->RenewIfStored(KeyOf(99), TokensOf(99)));
  EXPECT_TRUE(tier->RenewIfStored(KeyOf(0), TokensOf(0)));
  ASSERT_THAT(Put(*tier, 4), IsOk());  // Evicts 1: 0 was renewed.
  EXPECT_TRUE(tier->Contains(KeyOf(0)));
  EXPECT_FALSE(tier->Contains(KeyOf(1)));
}

// Under ARC a rewrite of a stored block keeps its standing: a block in the
// frequent list stays there, and outlasts the flood as above.
TEST_F(DiskTierTest, UnderArcARewriteKeepsABlocksStanding) {
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 4 * value_bytes + value_bytes / 2;
  options.eviction = EvictionPolicy::kArc;
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  ASSERT_THAT(GetAndCheck(*tier, 0), IsOk());
  for (int i = 4; i < 8; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  ASSERT_THAT(Put(*tier, 0), IsOk());  // Back from its frequent ghost.
  ASSERT_THAT(Put(*tier, 0), IsOk());  // Rewritten: still frequent.
  for (int i = 8; i < 12; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  EXPECT_TRUE(tier->Contains(KeyOf(0)));
  ASSERT_THAT(GetAndCheck(*tier, 0), IsOk());
}

TEST_F(DiskTierTest, ValueLargerThanCapacityIsResourceExhausted) {
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = layout_.BlockBytes() / 2;
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  EXPECT_EQ(Put(*tier, 0).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->stats().bytes, 0u);
  EXPECT_EQ(tier->stats().put_failures, 1u);
}

// --- Reopen -----------------------------------------------------------------

TEST_F(DiskTierTest, ReopenRebuildsIndexWithProgress) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 10; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }  // Closing flushes.
  std::vector<RebuildProgress> calls;
  DiskTierOptions options = Options();
  options.progress = [&](const RebuildProgress& p) { calls.push_back(p); };
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  ASSERT_FALSE(calls.empty());
  // The end counts the real values and bytes, not an estimate.
  const RebuildProgress& last = calls.back();
  EXPECT_TRUE(last.done);
  EXPECT_EQ(last.values, 10u);
  EXPECT_EQ(last.Percent(), 100);
  // Records only (keys, headers, token ids): the blocks' bytes stay unread
  // until a Get verifies them.
  EXPECT_GT(last.bytes_read, 0u);
  EXPECT_LT(last.bytes_read, tier->stats().bytes / 10);
  EXPECT_EQ(last.total_bytes, last.bytes_read);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_LE(calls[i].bytes_read, calls[i].total_bytes);
    EXPECT_LE(calls[i].Percent(), calls[i].done ? 100 : 99);
    if (i > 0) {
      EXPECT_LE(calls[i - 1].values, calls[i].values);
      EXPECT_LE(calls[i - 1].Percent(), calls[i].Percent());
    }
  }
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.keys, 10u);
  EXPECT_EQ(stats.dropped_on_open, 0u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(tier->Contains(KeyOf(i), TokensOf(i)));
    EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  }
}

TEST_F(DiskTierTest, ReopenWithSmallerCapacityEvictsOldestWrites) {
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options(DiskCodec::kNone));
    for (int i = 0; i < 10; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 3 * value_bytes;
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  EXPECT_EQ(tier->stats().keys, 3u);
  EXPECT_EQ(tier->stats().evictions, 7u);
  for (int i = 0; i < 7; ++i) EXPECT_FALSE(tier->Contains(KeyOf(i))) << i;
  for (int i = 7; i < 10; ++i) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
}

// --- Corruption -------------------------------------------------------------

// Flips one byte of a block's bytes in the value file, as a bad disk or
// another writer would: the page cache serves the flipped byte to every
// later read.
void FlipValueFileByte(const std::string& store, uint64_t offset) {
  const std::string file = store + "/" + std::string(kDiskValueFileName);
  const int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << file;
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  close(fd);
}

class DiskTierCorruptionTest : public DiskTierTest,
                               public ::testing::WithParamInterface<int64_t> {};

TEST_P(DiskTierCorruptionTest, FlippedBytesAreDetectedDroppedAndCounted) {
  // Raw blocks: every byte of the slot is the block's.
  DiskTierOptions options = Options(DiskCodec::kNone);
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(options.storage);
  ASSERT_THAT(rocks, IsOk());
  auto wrapper = std::make_unique<DiskStorageWrapper>(std::move(rocks).value());
  DiskStorage* storage = wrapper->target();
  StatusOr<std::unique_ptr<DiskTier>> opened =
      DiskTier::Open(options, std::move(wrapper));
  ASSERT_THAT(opened, IsOk());
  DiskTier& tier = **opened;

  // The first block of an empty tier takes the value file's first slot.
  ASSERT_THAT(Put(tier, 0), IsOk());
  ASSERT_THAT(Put(tier, 1), IsOk());
  const int64_t block = static_cast<int64_t>(layout_.BlockBytes());
  FlipValueFileByte(options.storage.path,
                    GetParam() >= 0 ? GetParam() : block + GetParam());
  std::vector<std::byte> out(layout_.BlockBytes());
  Status s = GetSync(tier, KeyOf(0), TokensOf(0), out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(KeyOf(0).ToHex()));
  DiskTierStats stats = tier.stats();
  EXPECT_EQ(stats.checksum_failures, 1u);
  EXPECT_EQ(stats.hits, 0u);
  EXPECT_EQ(stats.keys, 1u);
  EXPECT_FALSE(tier.Contains(KeyOf(0)));
  // Its record is deleted from storage, never served again; the other
  // block is intact.
  EXPECT_EQ(storage
                ->Get(DiskStorageKey(KeyOf(0)),
                      [](std::string_view) { return Status::Ok(); })
                .code(),
            StatusCode::kNotFound);
  EXPECT_EQ(GetSync(tier, KeyOf(0), TokensOf(0), out).code(),
            StatusCode::kNotFound);
  EXPECT_THAT(GetAndCheck(tier, 1), IsOk());
}

// The block's first bytes, a few inside, and from its end (its last byte,
// and one 5000 bytes before it).
INSTANTIATE_TEST_SUITE_P(Offsets, DiskTierCorruptionTest,
                         ::testing::Values(0, 9, 120, -1, -5000));

// Holds the first ReadPayload (after `gate()` is armed) until released;
// records every ReadPayload's block count and every WritePayload's offset.
class GatedStorage : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;

  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
  }
  // Waits until the held read has started; returns its offset.
  uint64_t AwaitHeldRead() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holding_; });
    return held_offset_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<size_t> read_sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return read_sizes_;
  }
  std::vector<uint64_t> write_offsets() {
    std::lock_guard<std::mutex> lock(mu_);
    return write_offsets_;
  }

  Status ReadPayload(uint64_t offset,
                     std::span<const std::span<std::byte>> outs) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      read_sizes_.push_back(outs.size());
      if (armed_) {
        armed_ = false;
        holding_ = true;
        held_offset_ = offset;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
      }
    }
    return DiskStorageWrapper::ReadPayload(offset, outs);
  }
  Status WritePayload(uint64_t offset, std::string_view bytes) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_offsets_.push_back(offset);
    }
    return DiskStorageWrapper::WritePayload(offset, bytes);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;                   // GUARDED_BY(mu_)
  bool holding_ = false;                 // GUARDED_BY(mu_)
  bool released_ = false;                // GUARDED_BY(mu_)
  uint64_t held_offset_ = 0;             // GUARDED_BY(mu_)
  std::vector<size_t> read_sizes_;       // GUARDED_BY(mu_)
  std::vector<uint64_t> write_offsets_;  // GUARDED_BY(mu_)
};

std::unique_ptr<DiskTier> OpenGated(const DiskTierOptions& options,
                                    GatedStorage** gated) {
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(options.storage);
  EXPECT_THAT(rocks, IsOk());
  if (!rocks.ok()) return nullptr;
  auto wrapper = std::make_unique<GatedStorage>(std::move(rocks).value());
  *gated = wrapper.get();
  StatusOr<std::unique_ptr<DiskTier>> tier =
      DiskTier::Open(options, std::move(wrapper));
  EXPECT_THAT(tier, IsOk());
  return tier.ok() ? std::move(tier).value() : nullptr;
}

// Gets queued together are read in runs of adjacent slots (one vectored
// read each), yet each block is verified on its own: one damaged block in
// the middle of a run fails alone.
TEST_F(DiskTierTest, GetsQueuedTogetherAreReadInRunsAndVerifiedEach) {
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.io_threads = 1;
  GatedStorage* gated = nullptr;
  std::unique_ptr<DiskTier> tier = OpenGated(options, &gated);
  ASSERT_NE(tier, nullptr);
  constexpr int kBlocks = 64;
  for (int i = 0; i < kBlocks; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  // Block 10's bytes: its slot is the one its write went to.
  const uint64_t damaged = gated->write_offsets()[10];
  FlipValueFileByte(options.storage.path, damaged + 5);
  std::vector<std::vector<std::byte>> outs(
      kBlocks, std::vector<std::byte>(layout_.BlockBytes()));
  std::vector<std::promise<Status>> done(kBlocks);
  // The only I/O thread is held in the first Get's read while the others
  // queue up behind it: they are then taken together.
  gated->Arm();
  for (int i = 0; i < kBlocks; ++i) {
    tier->Get(KeyOf(i), TokensOf(i), outs[i],
              [&done, i](Status s) { done[i].set_value(s); });
    if (i == 0) gated->AwaitHeldRead();
  }
  gated->Release();
  for (int i = 0; i < kBlocks; ++i) {
    Status s = done[i].get_future().get();
    if (i == 10) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    } else {
      EXPECT_THAT(s, IsOk()) << i;
      EXPECT_TRUE(outs[i] == Block(i)) << i;
    }
  }
  EXPECT_EQ(tier->stats().hits, uint64_t{kBlocks - 1});
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  // The 63 queued Gets (2 MiB of 16 KiB blocks) were one vectored read.
  const std::vector<size_t> reads = gated->read_sizes();
  EXPECT_EQ(*std::max_element(reads.begin(), reads.end()), size_t{kBlocks - 1});
}

// A Get reading a block while the block is removed and a new Put wants a
// slot: the slot being read is not written until the read is done, so the
// Get gets the whole old block and the new block lands elsewhere, intact.
TEST_F(DiskTierTest, ASlotBeingReadIsNotWrittenUntilTheReadIsDone) {
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.io_threads = 2;  // One held in the read, one for the Put.
  GatedStorage* gated = nullptr;
  std::unique_ptr<DiskTier> tier = OpenGated(options, &gated);
  ASSERT_NE(tier, nullptr);
  ASSERT_THAT(Put(*tier, 0), IsOk());
  std::vector<std::byte> out(layout_.BlockBytes());
  std::promise<Status> read;
  gated->Arm();
  tier->Get(KeyOf(0), TokensOf(0), out,
            [&read](Status s) { read.set_value(s); });
  const uint64_t reading = gated->AwaitHeldRead();
  ASSERT_TRUE(tier->Remove(KeyOf(0)));  // Its slot has no record now...
  ASSERT_THAT(Put(*tier, 1), IsOk());   // ...but is not free while read.
  EXPECT_NE(gated->write_offsets().back(), reading);
  gated->Release();
  EXPECT_THAT(read.get_future().get(), IsOk());
  EXPECT_TRUE(out == Block(0));
  EXPECT_THAT(GetAndCheck(*tier, 1), IsOk());
  // Once the read is done, the slot is free again: the next Put takes it.
  ASSERT_THAT(Put(*tier, 2), IsOk());
  EXPECT_EQ(gated->write_offsets().back(), reading);
  EXPECT_THAT(GetAndCheck(*tier, 2), IsOk());
}

// A restart reads records only, so bytes damaged while tierkvd was down
// are found by the Get that reads them: dropped, counted, never served,
// and the slot is used again.
TEST_F(DiskTierTest, BytesDamagedBetweenRunsAreFoundWhenRead) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  FlipValueFileByte(Options().storage.path, 2 * layout_.BlockBytes() + 77);
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 4u);
  EXPECT_EQ(tier->stats().dropped_on_open, 0u);
  std::vector<std::byte> out(layout_.BlockBytes());
  EXPECT_EQ(GetSync(*tier, KeyOf(2), TokensOf(2), out).code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_FALSE(tier->Contains(KeyOf(2)));
  for (int i : {0, 1, 3}) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  ASSERT_THAT(Put(*tier, 9), IsOk());
  EXPECT_THAT(GetAndCheck(*tier, 9), IsOk());
  tier.reset();
  tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 4u);
  for (int i : {0, 1, 3, 9}) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
}

// A value file cut short (or lost) while its records survive: the records
// whose bytes are gone are dropped on open, the rest served.
TEST_F(DiskTierTest, RecordsPastTheValueFilesEndAreDroppedOnOpen) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 4; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  const std::string file =
      Options().storage.path + "/" + std::string(kDiskValueFileName);
  std::filesystem::resize_file(file, 2 * layout_.BlockBytes() + 100);
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 2u);
  EXPECT_EQ(tier->stats().dropped_on_open, 2u);
  for (int i : {0, 1}) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  EXPECT_FALSE(tier->Contains(KeyOf(2)));
  EXPECT_FALSE(tier->Contains(KeyOf(3)));
  // The slots past the end are free again: new blocks go there.
  ASSERT_THAT(Put(*tier, 5), IsOk());
  ASSERT_THAT(Put(*tier, 6), IsOk());
  for (int i : {0, 1, 5, 6}) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
}

// Two records naming one slot: a machine crash lost the delete of an
// evicted block's record after its slot was written again for another
// block. The newer record owns the slot; the older is dropped, never
// served with the other block's bytes.
TEST_F(DiskTierTest, OfTwoRecordsOfOneSlotTheNewerWins) {
  auto read_record = [&](const BlockKey& key) {
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(Options().storage);
    std::string record;
    EXPECT_THAT(storage, IsOk());
    if (!storage.ok()) return record;
    EXPECT_THAT((*storage)->Get(DiskStorageKey(key),
                                [&](std::string_view v) {
                                  record = v;
                                  return Status::Ok();
                                }),
                IsOk());
    return record;
  };
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    ASSERT_THAT(Put(*tier, 0), IsOk());  // Slot 0.
  }
  const std::string lost_delete = read_record(KeyOf(0));
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    ASSERT_TRUE(tier->Remove(KeyOf(0)));  // Slot 0 is free again...
    ASSERT_THAT(Put(*tier, 1), IsOk());   // ...and holds block 1.
  }
  {
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(Options().storage);
    ASSERT_THAT(storage, IsOk());
    std::string_view parts[] = {lost_delete};
    ASSERT_THAT((*storage)->Put(DiskStorageKey(KeyOf(0)), parts), IsOk());
  }
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 1u);
  EXPECT_EQ(tier->stats().dropped_on_open, 1u);
  EXPECT_FALSE(tier->Contains(KeyOf(0)));
  EXPECT_THAT(GetAndCheck(*tier, 1), IsOk());
}

TEST_F(DiskTierTest, ValuesCorruptedOnDiskAreDroppedOnOpen) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 5; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  {
    // Between runs: damage values through the storage seam directly.
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(Options().storage);
    ASSERT_THAT(storage, IsOk());
    DiskStorage& db = **storage;
    std::string value;
    ASSERT_TRUE(db.Get(DiskStorageKey(KeyOf(2)), [&](std::string_view v) {
                    value = v;
                    return Status::Ok();
                  }).ok());
    value[value.size() / 2] ^= 0x01;  // One bit in the payload.
    std::string_view parts[] = {value};
    ASSERT_THAT(db.Put(DiskStorageKey(KeyOf(2)), parts), IsOk());
    value.resize(value.size() - 1);  // A torn value.
    ASSERT_THAT(db.Put(DiskStorageKey(KeyOf(3)), parts), IsOk());
    std::string_view garbage[] = {"not a tierkv value"};
    ASSERT_THAT(db.Put("garbage key", garbage), IsOk());
  }
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.dropped_on_open, 3u);
  EXPECT_EQ(stats.layout_mismatches, 0u);
  EXPECT_EQ(stats.keys, 3u);
  EXPECT_FALSE(tier->Contains(KeyOf(2)));
  EXPECT_FALSE(tier->Contains(KeyOf(3)));
  for (int i : {0, 1, 4}) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
  tier.reset();
  // Deleted, not skipped: the next open finds only the good ones.
  tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().dropped_on_open, 0u);
  EXPECT_EQ(tier->stats().keys, 3u);
}

// --- Eviction sink ----------------------------------------------------------

// What a disk tier's eviction sink was handed, in order.
class EvictedBlocks {
 public:
  struct Block {
    BlockKey key;
    std::vector<TokenId> tokens;
    std::vector<std::byte> payload;
  };
  DiskTier::EvictionSink Sink() {
    return [this](const BlockKey& key, std::span<const TokenId> tokens,
                  std::span<const std::byte> payload) {
      std::lock_guard<std::mutex> lock(mu_);
      got_.push_back({key,
                      {tokens.begin(), tokens.end()},
                      {payload.begin(), payload.end()}});
    };
  }
  std::vector<Block> got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }

 private:
  std::mutex mu_;
  std::vector<Block> got_;
};

// A tier below the disk tier keeps what it evicts: every block evicted for
// room reaches the sink once, in LRU order, with its tokens, bit for bit
// (through the codec), before its value is deleted. A block removed or
// replaced is not evicted and reaches nothing.
TEST_F(DiskTierTest, EvictedBlocksReachTheSinkBitExactAndNothingElseDoes) {
  for (DiskCodec codec : {DiskCodec::kNone, DiskCodec::kLz4BytePlanes}) {
    SCOPED_TRACE(DiskCodecName(codec));
    TempDir dir("disk_tier_test");
    DiskTierOptions options = Options(codec);
    options.storage.path = dir.path();
    options.capacity_bytes = 3 * ValueBytes(DiskCodec::kNone) + 4096;
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    EvictedBlocks sink;
    tier->SetEvictionSink(sink.Sink());
    for (int i = 0; i < 12; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    const uint64_t evictions = tier->stats().evictions;
    ASSERT_GT(evictions, 0u);
    std::vector<EvictedBlocks::Block> got = sink.got();
    ASSERT_EQ(got.size(), evictions);
    for (size_t i = 0; i < got.size(); ++i) {
      const int block = static_cast<int>(i);  // Written, so evicted, in order.
      EXPECT_EQ(got[i].key, KeyOf(block)) << i;
      EXPECT_EQ(got[i].tokens, TokensOf(block)) << i;
      EXPECT_TRUE(got[i].payload == Block(block)) << i;
      EXPECT_FALSE(tier->Contains(KeyOf(block))) << i;
    }
    // The newest block: removed. The next newest: written again, the same
    // size. Neither is an eviction.
    EXPECT_TRUE(tier->Remove(KeyOf(11)));
    ASSERT_THAT(Put(*tier, 10), IsOk());
    ASSERT_THAT(tier->Flush(), IsOk());
    EXPECT_EQ(tier->stats().evictions, evictions);
    EXPECT_EQ(sink.got().size(), evictions);
    // Turned off: evictions go on, the sink hears of none.
    tier->SetEvictionSink({});
    for (int i = 20; i < 24; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
    EXPECT_GT(tier->stats().evictions, evictions);
    EXPECT_EQ(sink.got().size(), evictions);
  }
}

// The offset in the value file of the bytes `block` starts with.
uint64_t FindInValueFile(const std::string& store,
                         std::span<const std::byte> block) {
  const std::string file = store + "/" + std::string(kDiskValueFileName);
  std::ifstream in(file, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  const std::string needle(reinterpret_cast<const char*>(block.data()), 64);
  const size_t at = data.find(needle);
  EXPECT_NE(at, std::string::npos) << "not in " << file;
  return at;
}

// A value damaged on disk is read back before it goes: it is counted and
// handed to nobody, so a tier below never receives bad bytes.
TEST_F(DiskTierTest, AnEvictedValueThatFailsVerificationReachesNoSink) {
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 3 * ValueBytes(DiskCodec::kNone) + 4096;
  std::unique_ptr<DiskTier> tier = OpenTier(options);
  EvictedBlocks sink;
  tier->SetEvictionSink(sink.Sink());
  for (int i = 0; i < 3; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  ASSERT_EQ(tier->stats().evictions, 0u);
  FlipValueFileByte(options.storage.path,
                    FindInValueFile(options.storage.path, Block(0)) + 100);
  ASSERT_THAT(Put(*tier, 3), IsOk());  // Evicts block 0, damaged.
  ASSERT_THAT(Put(*tier, 4), IsOk());  // Evicts block 1, whole.
  EXPECT_EQ(tier->stats().evictions, 2u);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  const std::vector<EvictedBlocks::Block> got = sink.got();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, KeyOf(1));
  EXPECT_TRUE(got[0].payload == Block(1));
}

// A Remove of a block being handed on returns only once the sink has it,
// so a tier below hears of the Remove after the block (and drops it), never
// before (and keeps it).
TEST_F(DiskTierTest, ARemoveOfABlockBeingHandedOnWaitsForIt) {
  DiskTierOptions options = Options(DiskCodec::kNone);
  options.capacity_bytes = 3 * ValueBytes(DiskCodec::kNone) + 4096;
  GatedStorage* gated = nullptr;
  std::unique_ptr<DiskTier> tier = OpenGated(options, &gated);
  ASSERT_NE(tier, nullptr);
  std::mutex mu;
  std::vector<std::string> order;
  tier->SetEvictionSink([&](const BlockKey& key, std::span<const TokenId>,
                            std::span<const std::byte>) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back("handed on " + key.ToHex());
  });
  for (int i = 0; i < 3; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  gated->Arm();
  std::promise<Status> put;
  tier->Put(KeyOf(3), TokensOf(3), Block(3),
            [&put](Status s) { put.set_value(std::move(s)); });
  gated->AwaitHeldRead();  // Block 0, evicted, being read back.
  std::promise<void> removing;
  std::thread remover([&] {
    removing.set_value();
    const bool was_stored = tier->Remove(KeyOf(0));
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(was_stored ? "removed a stored block" : "removed");
  });
  removing.get_future().wait();  // Released with the Remove under way.
  gated->Release();
  remover.join();
  EXPECT_THAT(put.get_future().get(), IsOk());
  EXPECT_THAT(order, ElementsAre("handed on " + KeyOf(0).ToHex(), "removed"));
}

// Records the storage keys deleted, and who deleted them first.
class DeleteLog : public DiskStorageWrapper {
 public:
  using DiskStorageWrapper::DiskStorageWrapper;
  bool Deleted(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return deleted_.contains(key);
  }
  Status Delete(std::string_view key) override {
    Record({std::string(key)});
    return DiskStorageWrapper::Delete(key);
  }
  Status DeleteBatch(std::span<const std::string> keys) override {
    Record({keys.begin(), keys.end()});
    return DiskStorageWrapper::DeleteBatch(keys);
  }

 private:
  void Record(std::vector<std::string> keys) {
    std::lock_guard<std::mutex> lock(mu_);
    deleted_.insert(keys.begin(), keys.end());
  }
  std::mutex mu_;
  std::set<std::string> deleted_;
};

// One Put evicts two blocks (a small compressed one, then a large one);
// while the second is being handed on, the first is evicted from the index
// but its record is deleted only after. A Remove of it then deletes the
// record itself before it returns: tierkvd killed right after would
// otherwise find the block again.
TEST_F(DiskTierTest, ARemoveOfAnEvictedBlockNotYetDeletedDeletesIt) {
  DiskTierOptions options = Options(DiskCodec::kLz4);
  blocks_[10] = std::vector<std::byte>(layout_.BlockBytes());  // Compresses.
  const uint64_t big = ValueBytes(DiskCodec::kLz4);
  uint64_t small = 0;
  {
    TempDir dir("disk_tier_test");
    DiskTierOptions probe = Options(DiskCodec::kLz4);
    probe.storage.path = dir.path();
    std::unique_ptr<DiskTier> tier = OpenTier(probe);
    ASSERT_THAT(Put(*tier, 10), IsOk());
    small = tier->stats().bytes;
  }
  ASSERT_LT(2 * small, big);
  options.capacity_bytes = big + small + options.reserved_bytes + 1;
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(options.storage);
  ASSERT_THAT(rocks, IsOk());
  auto log = std::make_unique<DeleteLog>(std::move(rocks).value());
  DeleteLog* deletes = log.get();
  std::unique_ptr<DiskTier> tier =
      DiskTier::Open(options, std::move(log)).value();
  ASSERT_THAT(Put(*tier, 10), IsOk());  // Small, oldest.
  ASSERT_THAT(Put(*tier, 0), IsOk());   // Large.
  ASSERT_EQ(tier->stats().keys, 2u);

  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, released = false;
  tier->SetEvictionSink([&](const BlockKey& key, std::span<const TokenId>,
                            std::span<const std::byte>) {
    if (!(key == KeyOf(0))) return;
    std::unique_lock<std::mutex> lock(mu);
    holding = true;
    cv.notify_all();
    cv.wait(lock, [&] { return released; });
  });
  std::promise<Status> put;
  tier->Put(KeyOf(1), TokensOf(1), Block(1),
            [&put](Status s) { put.set_value(std::move(s)); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return holding; });
  }
  // Block 10 is evicted and handed on; block 0 is being handed on.
  EXPECT_FALSE(tier->Contains(KeyOf(10), TokensOf(10)));
  EXPECT_FALSE(tier->Remove(KeyOf(10)));
  EXPECT_TRUE(deletes->Deleted(DiskStorageKey(KeyOf(10))));
  EXPECT_FALSE(deletes->Deleted(DiskStorageKey(KeyOf(0))));
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  EXPECT_THAT(put.get_future().get(), IsOk());
  tier->SetEvictionSink({});
  EXPECT_TRUE(tier->Contains(KeyOf(1), TokensOf(1)));
  EXPECT_EQ(tier->stats().keys, 1u);
}

// --- Another layout or model ------------------------------------------------

TEST_F(DiskTierTest, ModelMismatchRefusesToOpenAndKeepsTheValues) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 3; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  KvLayout other = layout_;
  other.dtype = DType::kF16;  // Same block size, another layout.
  DiskTierOptions options = Options();
  options.layout_fingerprint = other.Fingerprint();
  StatusOr<std::unique_ptr<DiskTier>> refused = DiskTier::Open(options);
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();
  // Both fingerprints, and how to drop the values knowingly.
  EXPECT_THAT(refused.status().message(), HasSubstr(layout_.Fingerprint()));
  EXPECT_THAT(refused.status().message(), HasSubstr(other.Fingerprint()));
  EXPECT_THAT(refused.status().message(), HasSubstr("--disk-reset"));

  // Nothing was deleted: the right layout finds every value.
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 3u);
  EXPECT_EQ(tier->stats().dropped_on_open, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_THAT(GetAndCheck(*tier, i), IsOk()) << i;
}

TEST_F(DiskTierTest, ModelMismatchWithResetStartsEmptyAndCounts) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 3; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  KvLayout other = layout_;
  other.dtype = DType::kF16;
  DiskTierOptions options = Options();
  options.layout_fingerprint = other.Fingerprint();
  options.reset = true;
  {
    std::unique_ptr<DiskTier> tier = OpenTier(options);
    DiskTierStats stats = tier->stats();
    EXPECT_EQ(stats.layout_mismatches, 3u);
    EXPECT_EQ(stats.dropped_on_open, 3u);
    EXPECT_EQ(stats.keys, 0u);
    std::vector<std::byte> out(layout_.BlockBytes());
    EXPECT_EQ(GetSync(*tier, KeyOf(0), TokensOf(0), out).code(),
              StatusCode::kNotFound);
    ASSERT_THAT(Put(*tier, 9), IsOk());
  }
  // The store is the other layout's now; reset does nothing to a usable one.
  options.reset = false;
  EXPECT_EQ(OpenTier(options)->stats().keys, 1u);
  EXPECT_EQ(DiskTier::Open(Options()).status().code(),
            StatusCode::kFailedPrecondition);
}

// An empty store takes the fingerprint of whoever opens it next.
TEST_F(DiskTierTest, ModelMismatchOfAnEmptyStoreIsNoMismatch) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    ASSERT_THAT(Put(*tier, 0), IsOk());
    EXPECT_TRUE(tier->Remove(KeyOf(0)));
  }
  DiskTierOptions options = Options();
  options.layout_fingerprint = "another model's fingerprint";
  EXPECT_THAT(DiskTier::Open(options), IsOk());
  EXPECT_THAT(DiskTier::Open(Options()), IsOk());
}

// A store written before the fingerprint record: its values tell whose it is.
TEST_F(DiskTierTest, ModelMismatchInAStoreWithoutItsRecordIsRefusedToo) {
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 3; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  {
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(Options().storage);
    ASSERT_THAT(storage, IsOk());
    ASSERT_THAT((*storage)->Delete(DiskFingerprintKey()), IsOk());
  }
  DiskTierOptions options = Options();
  options.layout_fingerprint = "another model's fingerprint";
  StatusOr<std::unique_ptr<DiskTier>> refused = DiskTier::Open(options);
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr(layout_.Fingerprint()));
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  EXPECT_EQ(tier->stats().keys, 3u);
}

// One value of another fingerprint in a store of this one is dropped alone.
TEST_F(DiskTierTest, ModelMismatchOfOneValueDropsThatValue) {
  std::string foreign;
  KvLayout other = layout_;
  other.dtype = DType::kF16;
  DiskTierOptions other_options = Options();
  other_options.layout_fingerprint = other.Fingerprint();
  {
    TempDir scratch("disk_tier_test");
    other_options.storage.path = scratch.path();
    std::unique_ptr<DiskTier> tier = OpenTier(other_options);
    ASSERT_THAT(Put(*tier, 7), IsOk());
    tier.reset();
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(other_options.storage);
    ASSERT_THAT(storage, IsOk());
    ASSERT_THAT((*storage)->Get(DiskStorageKey(KeyOf(7)),
                                [&](std::string_view v) {
                                  foreign = v;
                                  return Status::Ok();
                                }),
                IsOk());
  }
  {
    std::unique_ptr<DiskTier> tier = OpenTier(Options());
    for (int i = 0; i < 2; ++i) ASSERT_THAT(Put(*tier, i), IsOk());
  }
  {
    StatusOr<std::unique_ptr<DiskStorage>> storage =
        OpenRocksDbStorage(Options().storage);
    ASSERT_THAT(storage, IsOk());
    const std::string_view parts[] = {foreign};
    ASSERT_THAT((*storage)->Put(DiskStorageKey(KeyOf(7)), parts), IsOk());
  }
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.layout_mismatches, 1u);
  EXPECT_EQ(stats.dropped_on_open, 1u);
  EXPECT_EQ(stats.keys, 2u);
  EXPECT_FALSE(tier->Contains(KeyOf(7)));
}

TEST_F(DiskTierTest, OpenFailsCleanlyWhenTheScanFails) {
  class FailingScan : public DiskStorageWrapper {
   public:
    using DiskStorageWrapper::DiskStorageWrapper;
    Status ForEach(const Visitor&) override {
      return Status::Unavailable("disk went away");
    }
  };
  StatusOr<std::unique_ptr<DiskStorage>> rocks =
      OpenRocksDbStorage(Options().storage);
  ASSERT_THAT(rocks, IsOk());
  StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(
      Options(), std::make_unique<FailingScan>(std::move(rocks).value()));
  EXPECT_EQ(tier.status().code(), StatusCode::kUnavailable);
}

// --- Token ids --------------------------------------------------------------

TEST_F(DiskTierTest, WrongTokenIdsAreNeverServed) {
  std::unique_ptr<DiskTier> tier = OpenTier(Options());
  ASSERT_THAT(Put(*tier, 0), IsOk());
  std::vector<TokenId> other = TokensOf(0);
  other[5] += 1;  // Same key, different content: a collision.
  std::vector<std::byte> out(layout_.BlockBytes(), std::byte{0x5a});
  EXPECT_EQ(GetSync(*tier, KeyOf(0), other, out).code(), StatusCode::kNotFound);
  EXPECT_EQ(out, std::vector<std::byte>(out.size(), std::byte{0x5a}));
  std::vector<TokenId> shorter = TokensOf(0);
  shorter.pop_back();
  EXPECT_EQ(GetSync(*tier, KeyOf(0), shorter, out).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(tier->Contains(KeyOf(0), other));
  EXPECT_TRUE(tier->Contains(KeyOf(0), TokensOf(0)));
  DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.token_mismatches, 2u);
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.hits, 0u);
  // The stored block is kept for its own tokens.
  EXPECT_THAT(GetAndCheck(*tier, 0), IsOk());
}

// --- Threads ----------------------------------------------------------------

TEST_F(DiskTierTest, PutAndGetFromSeveralThreads) {
  const uint64_t value_bytes = ValueBytes(DiskCodec::kNone);
  std::unique_ptr<DiskTier> tier = OpenTier(Options(DiskCodec::kNone));
  constexpr int kThreads = 4;
  constexpr int kBlocksPerThread = 24;
  for (int i = 0; i < kThreads * kBlocksPerThread + 8; ++i) Block(i);

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int first = t * kBlocksPerThread;
      std::vector<std::future<Status>> puts;
      std::vector<std::promise<Status>> put_done(kBlocksPerThread);
      for (int i = 0; i < kBlocksPerThread; ++i) {
        const int b = first + i;
        puts.push_back(put_done[i].get_future());
        tier->Put(KeyOf(b), TokensOf(b), blocks_.at(b),
                  [&, i](Status s) { put_done[i].set_value(s); });
      }
      for (auto& f : puts) failures += f.get().ok() ? 0 : 1;
      std::vector<std::vector<std::byte>> outs(
          kBlocksPerThread, std::vector<std::byte>(layout_.BlockBytes()));
      std::vector<std::promise<Status>> get_done(kBlocksPerThread);
      for (int i = 0; i < kBlocksPerThread; ++i) {
        const int b = first + i;
        tier->Get(KeyOf(b), TokensOf(b), outs[i],
                  [&, i](Status s) { get_done[i].set_value(s); });
      }
      for (int i = 0; i < kBlocksPerThread; ++i) {
        Status s = get_done[i].get_future().get();
        if (!s.ok() || outs[i] != blocks_.at(first + i)) ++failures;
      }
    });
  }
  // Meanwhile, churn on a shared set of keys: Put, Get, Remove.
  const int shared = kThreads * kBlocksPerThread;
  std::thread churn([&] {
    std::vector<std::byte> out(layout_.BlockBytes());
    for (int round = 0; round < 20; ++round) {
      const int b = shared + round % 8;
      tier->Put(KeyOf(b), TokensOf(b), blocks_.at(b), [](Status) {});
      std::promise<Status> got;
      tier->Get(KeyOf(b), TokensOf(b), out,
                [&](Status s) { got.set_value(s); });
      Status s = got.get_future().get();
      if (s.ok() && out != blocks_.at(b)) ++failures;  // Misses are fine.
      if (round % 3 == 0) tier->Remove(KeyOf(b));
    }
  });
  for (std::thread& t : threads) t.join();
  churn.join();
  ASSERT_THAT(tier->Flush(), IsOk());
  EXPECT_EQ(failures.load(), 0);
  DiskTierStats stats = tier->stats();
  // Every value has the same size, so the byte count must match the keys.
  EXPECT_EQ(stats.bytes, stats.keys * value_bytes);
  EXPECT_GE(stats.keys, uint64_t{kThreads * kBlocksPerThread});
  for (int b = 0; b < kThreads * kBlocksPerThread; ++b) {
    EXPECT_TRUE(tier->Contains(KeyOf(b)));
  }
}

}  // namespace
}  // namespace tierkv
