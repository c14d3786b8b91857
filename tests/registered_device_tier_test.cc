// RegisteredDeviceTier over the layouts engines allocate: every element of
// the engine's tensors lands at its KvLayout position in the host block and
// back (vLLM's paged layout, a cross-layer pool, SGLang's page-first host
// pool), tensor-parallel shards fill one host block with exactly the bytes a
// single all-heads worker stores, nothing outside the copied blocks and
// heads is touched, bad options and jobs are refused naming what is wrong,
// and jobs complete in submission order. Synchronisation is always on the
// completion itself; timeouts only bound a failing test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/status_matchers.h"
#include "tierkv/device_tier.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr std::chrono::milliseconds kFailAfter{60'000};
constexpr std::byte kUnwritten{0xEE};

// The value the engine's element (layer, plane, block, token, head, dim)
// holds in these tests, `head` the model's head index: a hash of every
// coordinate, so an element copied to the wrong place is seen. Elements
// narrower than 32 bits keep its low bytes.
uint32_t Code(int32_t layer, KvPlane plane, BlockId block, int32_t token,
              int32_t head, int32_t dim) {
  uint64_t x = 0;
  for (int64_t part :
       {int64_t{layer}, int64_t{static_cast<int>(plane)}, int64_t{block},
        int64_t{token}, int64_t{head}, int64_t{dim}}) {
    x = (x ^ static_cast<uint64_t>(part + 1)) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
  }
  return static_cast<uint32_t>(x);
}

void Put(std::byte* element, size_t bytes, uint32_t code) {
  std::memcpy(element, &code, bytes);
}

bool Holds(const std::byte* element, size_t bytes, uint32_t code) {
  return std::memcmp(element, &code, bytes) == 0;
}

// Where an element sits in the engine's own tensors, computed from their
// shapes rather than from the LayerMemory registered for them, so the tests
// check the tier against the engine's indexing. `head` counts within the
// shard.
using ElementAt =
    std::function<std::byte*(int32_t layer, KvPlane plane, BlockId block,
                             int32_t token, int32_t head, int32_t dim)>;

// An engine's KV tensors for one shard of heads and how they are registered.
struct EngineMemory {
  KvLayout layout;
  int32_t num_blocks = 0;
  int32_t first_head = 0;
  int32_t num_heads = 0;
  std::vector<std::vector<std::byte>> buffers = {};
  std::vector<LayerMemory> layers = {};
  ElementAt at = {};

  size_t element_bytes() const { return layout.ElementSize(); }

  RegisteredDeviceOptions Options() const {
    return RegisteredDeviceOptions{.layout = layout,
                                   .num_blocks = num_blocks,
                                   .layers = layers,
                                   .first_head = first_head,
                                   .num_heads = num_heads};
  }

  // Calls f(layer, plane, token, head_in_shard, dim) for each element of a
  // block.
  template <typename F>
  void ForEachElement(F f) const {
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      for (KvPlane p : {KvPlane::kKey, KvPlane::kValue}) {
        for (int32_t t = 0; t < layout.block_size; ++t) {
          for (int32_t h = 0; h < num_heads; ++h) {
            for (int32_t d = 0; d < layout.head_dim; ++d) f(l, p, t, h, d);
          }
        }
      }
    }
  }

  // Every block b holds the codes of block b.
  void Fill() {
    for (BlockId b = 0; b < num_blocks; ++b) {
      ForEachElement(
          [&](int32_t l, KvPlane p, int32_t t, int32_t h, int32_t d) {
            Put(at(l, p, b, t, h, d), element_bytes(),
                Code(l, p, b, t, first_head + h, d));
          });
    }
  }

  // Elements of device block `block` that do not hold `source`'s codes.
  int CountMismatches(BlockId block, BlockId source) const {
    int wrong = 0;
    ForEachElement([&](int32_t l, KvPlane p, int32_t t, int32_t h, int32_t d) {
      if (Holds(at(l, p, block, t, h, d), element_bytes(),
                Code(l, p, source, t, first_head + h, d))) {
        return;
      }
      if (wrong++ == 0) {
        ADD_FAILURE() << "device block " << block << " layer " << l << " plane "
                      << static_cast<int>(p) << " token " << t << " head "
                      << first_head + h << " dim " << d
                      << " does not hold block " << source << "'s element";
      }
    });
    return wrong;
  }

  // `buffers` as they must be after a load wrote `source`'s codes into
  // `block`, given their bytes before it (`before`).
  void ExpectLoaded(std::vector<std::vector<std::byte>> before,
                    const std::vector<BlockId>& blocks,
                    const std::vector<BlockId>& sources) const {
    for (size_t i = 0; i < blocks.size(); ++i) {
      ForEachElement(
          [&](int32_t l, KvPlane p, int32_t t, int32_t h, int32_t d) {
            const std::byte* live = at(l, p, blocks[i], t, h, d);
            for (size_t b = 0; b < buffers.size(); ++b) {
              const std::byte* base = buffers[b].data();
              if (live >= base && live < base + buffers[b].size()) {
                Put(before[b].data() + (live - base), element_bytes(),
                    Code(l, p, sources[i], t, first_head + h, d));
              }
            }
          });
    }
    for (size_t b = 0; b < buffers.size(); ++b) {
      EXPECT_TRUE(buffers[b] == before[b])
          << "buffer " << b << " differs outside the loaded elements";
    }
  }
};

size_t RunBytes(const KvLayout& layout, int32_t num_heads) {
  return static_cast<size_t>(num_heads) * layout.head_dim *
         layout.ElementSize();
}

// vLLM's paged layout: per layer one tensor
// [2, num_blocks, block_size, num_heads, head_dim].
EngineMemory Paged(const KvLayout& layout, int32_t num_blocks,
                   int32_t first_head, int32_t num_heads) {
  EngineMemory m{.layout = layout,
                 .num_blocks = num_blocks,
                 .first_head = first_head,
                 .num_heads = num_heads};
  const size_t e = layout.ElementSize();
  const size_t block = layout.block_size * RunBytes(layout, num_heads);
  std::vector<std::byte*> bases;
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    m.buffers.emplace_back(2 * num_blocks * block, std::byte{0});
    std::byte* base = m.buffers.back().data();
    bases.push_back(base);
    m.layers.push_back(LayerMemory{.key = base,
                                   .value = base + num_blocks * block,
                                   .block_stride = block});
  }
  const int32_t bs = layout.block_size, d_max = layout.head_dim;
  m.at = [=](int32_t l, KvPlane p, BlockId b, int32_t t, int32_t h, int32_t d) {
    const size_t index =
        (((static_cast<size_t>(p) * num_blocks + b) * bs + t) * num_heads + h) *
            d_max +
        d;
    return bases[l] + index * e;
  };
  return m;
}

// A cross-layer pool: one tensor
// [num_blocks, num_layers, 2, block_size, num_heads, head_dim].
EngineMemory CrossLayer(const KvLayout& layout, int32_t num_blocks,
                        int32_t first_head, int32_t num_heads) {
  EngineMemory m{.layout = layout,
                 .num_blocks = num_blocks,
                 .first_head = first_head,
                 .num_heads = num_heads};
  const size_t e = layout.ElementSize();
  const size_t plane = layout.block_size * RunBytes(layout, num_heads);
  const int32_t layers = layout.num_layers;
  m.buffers.emplace_back(num_blocks * layers * 2 * plane, std::byte{0});
  std::byte* base = m.buffers.back().data();
  for (int32_t l = 0; l < layers; ++l) {
    std::byte* key = base + 2 * l * plane;
    m.layers.push_back(LayerMemory{
        .key = key, .value = key + plane, .block_stride = layers * 2 * plane});
  }
  const int32_t bs = layout.block_size, d_max = layout.head_dim;
  m.at = [=](int32_t l, KvPlane p, BlockId b, int32_t t, int32_t h, int32_t d) {
    const size_t index =
        ((((static_cast<size_t>(b) * layers + l) * 2 + static_cast<size_t>(p)) *
              bs +
          t) *
             num_heads +
         h) *
            d_max +
        d;
    return base + index * e;
  };
  return m;
}

// SGLang's page-first host pool: per plane one tensor
// [num_tokens, num_layers, num_heads, head_dim], block b's token t being
// token b * block_size + t: the token dimension outside the layer one.
EngineMemory PageFirst(const KvLayout& layout, int32_t num_blocks,
                       int32_t first_head, int32_t num_heads) {
  EngineMemory m{.layout = layout,
                 .num_blocks = num_blocks,
                 .first_head = first_head,
                 .num_heads = num_heads};
  const size_t e = layout.ElementSize();
  const size_t run = RunBytes(layout, num_heads);
  const int32_t layers = layout.num_layers, bs = layout.block_size;
  const size_t token_stride = layers * run;
  std::vector<std::byte*> planes;
  for (int p = 0; p < 2; ++p) {
    m.buffers.emplace_back(num_blocks * bs * token_stride, std::byte{0});
    planes.push_back(m.buffers.back().data());
  }
  for (int32_t l = 0; l < layers; ++l) {
    m.layers.push_back(LayerMemory{.key = planes[0] + l * run,
                                   .value = planes[1] + l * run,
                                   .block_stride = bs * token_stride,
                                   .token_stride = token_stride});
  }
  const int32_t d_max = layout.head_dim;
  m.at = [=](int32_t l, KvPlane p, BlockId b, int32_t t, int32_t h, int32_t d) {
    const size_t token = static_cast<size_t>(b) * bs + t;
    const size_t index = ((token * layers + l) * num_heads + h) * d_max + d;
    return planes[static_cast<size_t>(p)] + index * e;
  };
  return m;
}

std::unique_ptr<RegisteredDeviceTier> MakeTier(const EngineMemory& m) {
  auto tier = RegisteredDeviceTier::Create(m.Options());
  EXPECT_THAT(tier, IsOk());
  return tier.ok() ? std::move(tier).value() : nullptr;
}

std::vector<std::byte> HostBlock(const KvLayout& layout) {
  return std::vector<std::byte>(layout.BlockBytes(), kUnwritten);
}

// Elements of a host block in heads [first_head, first_head + num_heads)
// that do not hold `source`'s codes.
int CountHostMismatches(const KvLayout& layout, const std::byte* host,
                        BlockId source, int32_t first_head, int32_t num_heads) {
  const size_t e = layout.ElementSize();
  int wrong = 0;
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    for (KvPlane p : {KvPlane::kKey, KvPlane::kValue}) {
      for (int32_t t = 0; t < layout.block_size; ++t) {
        for (int32_t h = first_head; h < first_head + num_heads; ++h) {
          for (int32_t d = 0; d < layout.head_dim; ++d) {
            const size_t offset =
                layout.Offset(l, p, t) + (h * layout.head_dim + d) * e;
            if (Holds(host + offset, e, Code(l, p, source, t, h, d))) continue;
            if (wrong++ == 0) {
              ADD_FAILURE()
                  << "host layer " << l << " plane " << static_cast<int>(p)
                  << " token " << t << " head " << h << " dim " << d
                  << " does not hold block " << source << "'s element";
            }
          }
        }
      }
    }
  }
  return wrong;
}

// Bytes of a host block outside heads [first_head, first_head + num_heads)
// that are no longer kUnwritten.
int CountWrittenOutside(const KvLayout& layout, const std::byte* host,
                        int32_t first_head, int32_t num_heads) {
  const size_t head_bytes = layout.head_dim * layout.ElementSize();
  int written = 0;
  for (size_t offset = 0; offset < layout.BlockBytes(); ++offset) {
    const size_t head = (offset % layout.TokenStride()) / head_bytes;
    const bool inside = head >= static_cast<size_t>(first_head) &&
                        head < static_cast<size_t>(first_head + num_heads);
    if (!inside && host[offset] != kUnwritten) ++written;
  }
  return written;
}

// Submits one job and returns once its completion is back.
void RunJob(DeviceTier& tier, uint64_t tag, CopyDirection direction,
            std::vector<BlockId> device_blocks,
            std::vector<std::byte*> host_blocks) {
  ASSERT_THAT(tier.Submit(CopyJob{.tag = tag,
                                  .direction = direction,
                                  .device_blocks = std::move(device_blocks),
                                  .host_blocks = std::move(host_blocks)}),
              IsOk());
  std::vector<CopyCompletion> done = tier.WaitCompleted(kFailAfter);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, tag);
  EXPECT_THAT(done[0].status, IsOk());
}

// Stores two device blocks into host blocks, checks every element there,
// loads them back into two other device blocks and checks that exactly
// those elements changed in the engine's memory.
void ExpectRoundTrip(EngineMemory& m) {
  ASSERT_GE(m.num_blocks, 4);
  m.Fill();
  std::unique_ptr<RegisteredDeviceTier> tier = MakeTier(m);
  ASSERT_NE(tier, nullptr);
  const BlockId last = m.num_blocks - 1;
  std::vector<std::byte> first_slot = HostBlock(m.layout);
  std::vector<std::byte> second_slot = HostBlock(m.layout);
  RunJob(*tier, 1, CopyDirection::kDeviceToHost, {1, last},
         {first_slot.data(), second_slot.data()});
  EXPECT_EQ(CountHostMismatches(m.layout, first_slot.data(), 1, m.first_head,
                                m.num_heads),
            0);
  EXPECT_EQ(CountHostMismatches(m.layout, second_slot.data(), last,
                                m.first_head, m.num_heads),
            0);
  EXPECT_EQ(CountWrittenOutside(m.layout, first_slot.data(), m.first_head,
                                m.num_heads),
            0);

  std::vector<std::vector<std::byte>> before = m.buffers;
  RunJob(*tier, 2, CopyDirection::kHostToDevice, {0, 2},
         {first_slot.data(), second_slot.data()});
  EXPECT_EQ(m.CountMismatches(0, 1), 0);
  EXPECT_EQ(m.CountMismatches(2, last), 0);
  m.ExpectLoaded(std::move(before), {0, 2}, {1, last});
}

KvLayout SmallLayout(DType dtype = DType::kF32) {
  return KvLayout{.num_layers = 3,
                  .num_kv_heads = 4,
                  .head_dim = 8,
                  .block_size = 4,
                  .dtype = dtype};
}

TEST(RegisteredDeviceLayouts, VllmPagedRoundTripsEveryElement) {
  EngineMemory m = Paged(SmallLayout(), 6, 0, 4);
  ExpectRoundTrip(m);
}

TEST(RegisteredDeviceLayouts, VllmPagedBf16RoundTripsEveryElement) {
  EngineMemory m = Paged(SmallLayout(DType::kBF16), 5, 0, 4);
  ExpectRoundTrip(m);
}

TEST(RegisteredDeviceLayouts, CrossLayerRoundTripsEveryElement) {
  EngineMemory m = CrossLayer(SmallLayout(), 5, 0, 4);
  ExpectRoundTrip(m);
}

TEST(RegisteredDeviceLayouts, CrossLayerShardRoundTripsItsHeads) {
  EngineMemory m = CrossLayer(SmallLayout(DType::kF16), 4, 2, 2);
  ExpectRoundTrip(m);
}

TEST(RegisteredDeviceLayouts, PageFirstTokenStrideRoundTripsEveryElement) {
  EngineMemory m = PageFirst(SmallLayout(), 5, 0, 4);
  ExpectRoundTrip(m);
}

TEST(RegisteredDeviceLayouts, PageFirstShardRoundTripsItsHeads) {
  EngineMemory m = PageFirst(SmallLayout(DType::kBF16), 4, 1, 2);
  ExpectRoundTrip(m);
}

// Runs of 6 bytes at odd offsets: nothing may assume aligned or
// 16-byte-multiple runs.
TEST(RegisteredDeviceLayouts, UnalignedShardRoundTripsItsHeads) {
  const KvLayout layout{.num_layers = 2,
                        .num_kv_heads = 5,
                        .head_dim = 3,
                        .block_size = 3,
                        .dtype = DType::kF16};
  EngineMemory paged = Paged(layout, 4, 1, 2);
  ExpectRoundTrip(paged);
  EngineMemory page_first = PageFirst(layout, 4, 3, 2);
  ExpectRoundTrip(page_first);
}

TEST(RegisteredDeviceShards, TwoRanksStoreTheBytesOfOneAllHeadsWorker) {
  const KvLayout layout = SmallLayout(DType::kBF16);
  constexpr int32_t kBlocks = 6;
  constexpr BlockId kStored = 3;
  EngineMemory whole = Paged(layout, kBlocks, 0, 4);
  std::vector<EngineMemory> ranks;
  ranks.push_back(Paged(layout, kBlocks, 0, 2));
  ranks.push_back(Paged(layout, kBlocks, 2, 2));
  whole.Fill();
  for (EngineMemory& rank : ranks) rank.Fill();
  std::unique_ptr<RegisteredDeviceTier> whole_tier = MakeTier(whole);
  std::vector<std::unique_ptr<RegisteredDeviceTier>> rank_tiers;
  for (const EngineMemory& rank : ranks) rank_tiers.push_back(MakeTier(rank));
  ASSERT_NE(whole_tier, nullptr);
  ASSERT_NE(rank_tiers[0], nullptr);
  ASSERT_NE(rank_tiers[1], nullptr);
  for (const auto& tier : rank_tiers) {
    EXPECT_EQ(tier->block_bytes(), layout.BlockBytes());
    EXPECT_EQ(tier->shard_bytes(), layout.BlockBytes() / 2);
  }
  EXPECT_EQ(whole_tier->shard_bytes(), layout.BlockBytes());

  std::vector<std::byte> reference = HostBlock(layout);
  RunJob(*whole_tier, 1, CopyDirection::kDeviceToHost, {kStored},
         {reference.data()});
  EXPECT_EQ(CountHostMismatches(layout, reference.data(), kStored, 0, 4), 0);

  // Rank 1 first: each rank writes its own heads only, in any order.
  std::vector<std::byte> slot = HostBlock(layout);
  RunJob(*rank_tiers[1], 2, CopyDirection::kDeviceToHost, {kStored},
         {slot.data()});
  EXPECT_EQ(CountWrittenOutside(layout, slot.data(), 2, 2), 0);
  RunJob(*rank_tiers[0], 3, CopyDirection::kDeviceToHost, {kStored},
         {slot.data()});
  EXPECT_TRUE(slot == reference)
      << "the ranks' host block differs from the all-heads worker's";

  // Loading the slot back restores each rank's heads only.
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<std::vector<std::byte>> before = ranks[r].buffers;
    RunJob(*rank_tiers[r], 4, CopyDirection::kHostToDevice, {0}, {slot.data()});
    EXPECT_EQ(ranks[r].CountMismatches(0, kStored), 0);
    ranks[r].ExpectLoaded(std::move(before), {0}, {kStored});
  }
}

TEST(RegisteredDeviceCreate, ResolvesDefaultsIntoOptions) {
  const KvLayout layout = SmallLayout();
  EngineMemory m = Paged(layout, 4, 1, 3);
  RegisteredDeviceOptions options = m.Options();
  options.num_heads = 0;  // Every head from first_head on.
  auto tier = RegisteredDeviceTier::Create(options);
  ASSERT_THAT(tier, IsOk());
  EXPECT_EQ((*tier)->options().first_head, 1);
  EXPECT_EQ((*tier)->options().num_heads, 3);
  EXPECT_EQ((*tier)->options().layers[2].token_stride, RunBytes(layout, 3));
  EXPECT_EQ((*tier)->num_blocks(), 4);
  EXPECT_EQ((*tier)->block_bytes(), layout.BlockBytes());
  EXPECT_EQ((*tier)->shard_bytes(), layout.BlockBytes() * 3 / 4);
}

// Create with one field broken by `breaks` is InvalidArgument naming
// `field`.
void ExpectRefused(const std::function<void(RegisteredDeviceOptions&)>& breaks,
                   const std::string& field) {
  EngineMemory m = Paged(SmallLayout(), 4, 0, 4);
  RegisteredDeviceOptions options = m.Options();
  breaks(options);
  auto tier = RegisteredDeviceTier::Create(options);
  EXPECT_THAT(tier, StatusIs(StatusCode::kInvalidArgument)) << field;
  if (!tier.ok()) {
    EXPECT_THAT(tier.status().message(), HasSubstr(field));
  }
}

TEST(RegisteredDeviceCreate, RefusesEachInvalidFieldNamingIt) {
  const size_t run = RunBytes(SmallLayout(), 4);
  const size_t extent = 3 * run + run;  // block_size 4, dense tokens.
  const size_t huge = std::numeric_limits<size_t>::max() / 2;
  ExpectRefused([](auto& o) { o.layout.head_dim = 0; }, "head_dim");
  ExpectRefused([](auto& o) { o.layout.num_layers = 0; }, "layout");
  ExpectRefused([](auto& o) { o.num_blocks = 0; }, "num_blocks");
  ExpectRefused([](auto& o) { o.num_blocks = -3; }, "num_blocks");
  ExpectRefused([](auto& o) { o.layers.pop_back(); }, "layers has 2");
  ExpectRefused([](auto& o) { o.layers.push_back(o.layers[0]); },
                "layers has 4");
  ExpectRefused([](auto& o) { o.layers[1].key = nullptr; }, "layers[1].key");
  ExpectRefused([](auto& o) { o.layers[2].value = nullptr; },
                "layers[2].value");
  ExpectRefused([](auto& o) { o.first_head = -1; }, "first_head");
  ExpectRefused([](auto& o) { o.first_head = 4; }, "first_head");
  ExpectRefused([](auto& o) { o.num_heads = -1; }, "num_heads");
  ExpectRefused([](auto& o) { o.num_heads = 5; }, "num_heads");
  ExpectRefused(
      [](auto& o) {
        o.first_head = 2;
        o.num_heads = 3;
      },
      "num_heads");
  ExpectRefused([&](auto& o) { o.layers[0].token_stride = run - 1; },
                "layers[0].token_stride");
  ExpectRefused([&](auto& o) { o.layers[1].token_stride = huge; },
                "layers[1].token_stride");
  ExpectRefused([&](auto& o) { o.layers[2].block_stride = extent - 1; },
                "layers[2].block_stride");
  ExpectRefused([](auto& o) { o.layers[0].block_stride = 0; },
                "layers[0].block_stride");
  // A token stride the blocks cannot hold.
  ExpectRefused([&](auto& o) { o.layers[0].token_stride = run + 1; },
                "layers[0].block_stride");
  ExpectRefused([&](auto& o) { o.layers[1].block_stride = huge; },
                "layers[1].block_stride");
}

TEST(RegisteredDeviceCreate, AcceptsStridesExactlyLargeEnough) {
  // A shard's tokens spaced at the full token's width with the last token
  // ending the block: block_stride == (block_size - 1) * token_stride + run.
  const KvLayout layout = SmallLayout();
  const size_t run = RunBytes(layout, 2);
  const size_t token_stride = RunBytes(layout, 4);
  const size_t block_stride = 3 * token_stride + run;
  const size_t plane = 4 * block_stride;  // One layer's K or V.
  std::vector<std::byte> memory(2 * layout.num_layers * plane);
  RegisteredDeviceOptions options{
      .layout = layout, .num_blocks = 4, .first_head = 2, .num_heads = 2};
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    std::byte* key = memory.data() + 2 * l * plane;
    options.layers.push_back(LayerMemory{.key = key,
                                         .value = key + plane,
                                         .block_stride = block_stride,
                                         .token_stride = token_stride});
  }
  EXPECT_THAT(RegisteredDeviceTier::Create(options), IsOk());
}

// One tensor given for two layers, or for a layer's K and V (in Python,
// [t] * num_layers, or (t, t)): every copy of one would read and write the
// other's bytes, stored and served as both. Planes interleaved by token
// (K and V of a token side by side) are memory of their own, and taken.
TEST(RegisteredDeviceCreate, PlanesSharingMemoryAreRefused) {
  const KvLayout layout = SmallLayout();
  const size_t run = RunBytes(layout, 4);
  std::vector<std::byte> memory(2 * layout.num_layers * 4 * 4 * 2 * run);
  auto options = [&](auto&& place) {
    RegisteredDeviceOptions o{.layout = layout, .num_blocks = 4};
    for (int32_t l = 0; l < layout.num_layers; ++l) {
      o.layers.push_back(place(l));
    }
    return o;
  };
  const size_t token_stride = 2 * run, block_stride = 4 * token_stride;
  const size_t layer_bytes = 4 * block_stride;
  // K and V of each token side by side, layers one after another: taken.
  EXPECT_THAT(RegisteredDeviceTier::Create(options([&](int32_t l) {
                std::byte* key = memory.data() + l * layer_bytes;
                return LayerMemory{.key = key,
                                   .value = key + run,
                                   .block_stride = block_stride,
                                   .token_stride = token_stride};
              })),
              IsOk());
  // Every layer on one tensor.
  StatusOr<std::unique_ptr<RegisteredDeviceTier>> same_layers =
      RegisteredDeviceTier::Create(options([&](int32_t) {
        return LayerMemory{.key = memory.data(),
                           .value = memory.data() + run,
                           .block_stride = block_stride,
                           .token_stride = token_stride};
      }));
  EXPECT_EQ(same_layers.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(same_layers.status().message(), HasSubstr("overlap"));
  // K and V of a layer on one tensor, or half a token apart.
  for (size_t apart : {size_t{0}, run / 2}) {
    StatusOr<std::unique_ptr<RegisteredDeviceTier>> same_planes =
        RegisteredDeviceTier::Create(options([&](int32_t l) {
          std::byte* key = memory.data() + l * layer_bytes;
          return LayerMemory{.key = key,
                             .value = key + apart,
                             .block_stride = block_stride,
                             .token_stride = token_stride};
        }));
    EXPECT_EQ(same_planes.status().code(), StatusCode::kInvalidArgument)
        << apart;
    EXPECT_THAT(same_planes.status().message(),
                HasSubstr("layers[0].key and layers[0].value overlap"));
  }
}

TEST(RegisteredDeviceSubmit, InvalidJobsAreRejectedWithNothingQueued) {
  EngineMemory m = Paged(SmallLayout(), 4, 0, 4);
  std::unique_ptr<RegisteredDeviceTier> tier = MakeTier(m);
  ASSERT_NE(tier, nullptr);
  std::vector<std::byte> host = HostBlock(m.layout);
  auto submit = [&](std::vector<BlockId> device,
                    std::vector<std::byte*> hosts) {
    return tier->Submit(CopyJob{.tag = 9,
                                .direction = CopyDirection::kHostToDevice,
                                .device_blocks = std::move(device),
                                .host_blocks = std::move(hosts)});
  };
  EXPECT_THAT(submit({0, 1}, {host.data()}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(submit({-1}, {host.data()}),
              StatusIs(StatusCode::kInvalidArgument));
  Status out_of_range = submit({4}, {host.data()});
  EXPECT_THAT(out_of_range, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(out_of_range.message(), HasSubstr("outside [0, 4)"));
  Status null_host = submit({0}, {nullptr});
  EXPECT_THAT(null_host, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(null_host.message(), HasSubstr("null"));
  EXPECT_EQ(tier->in_flight(), 0u);
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
}

TEST(RegisteredDeviceOrder, LoadAfterStoreOfTheSameSlotSeesTheStoredBytes) {
  EngineMemory m = Paged(SmallLayout(), 6, 0, 4);
  m.Fill();
  std::unique_ptr<RegisteredDeviceTier> tier = MakeTier(m);
  ASSERT_NE(tier, nullptr);
  std::vector<std::byte> slot = HostBlock(m.layout);
  // Submitted back to back without waiting: only the order of the copy
  // thread makes the load read what the store wrote.
  ASSERT_THAT(tier->Submit(CopyJob{.tag = 1,
                                   .direction = CopyDirection::kDeviceToHost,
                                   .device_blocks = {1},
                                   .host_blocks = {slot.data()}}),
              IsOk());
  ASSERT_THAT(tier->Submit(CopyJob{.tag = 2,
                                   .direction = CopyDirection::kHostToDevice,
                                   .device_blocks = {4},
                                   .host_blocks = {slot.data()}}),
              IsOk());
  ASSERT_THAT(tier->Submit(CopyJob{.tag = 3}), IsOk());  // A fence.
  std::vector<uint64_t> tags;
  while (tags.size() < 3) {
    std::vector<CopyCompletion> done = tier->WaitCompleted(kFailAfter);
    ASSERT_FALSE(done.empty()) << "timed out";
    for (const CopyCompletion& c : done) {
      EXPECT_THAT(c.status, IsOk());
      tags.push_back(c.tag);
    }
  }
  EXPECT_THAT(tags, ElementsAre(1, 2, 3));
  EXPECT_EQ(tier->in_flight(), 0u);
  EXPECT_EQ(m.CountMismatches(4, 1), 0);
}

TEST(RegisteredDeviceOrder, DestructorRunsQueuedJobs) {
  EngineMemory m = Paged(SmallLayout(), 4, 0, 4);
  m.Fill();
  std::vector<std::byte> slot = HostBlock(m.layout);
  {
    std::unique_ptr<RegisteredDeviceTier> tier = MakeTier(m);
    ASSERT_NE(tier, nullptr);
    ASSERT_THAT(tier->Submit(CopyJob{.tag = 1,
                                     .direction = CopyDirection::kDeviceToHost,
                                     .device_blocks = {2},
                                     .host_blocks = {slot.data()}}),
                IsOk());
  }
  EXPECT_EQ(CountHostMismatches(m.layout, slot.data(), 2, 0, 4), 0);
}

}  // namespace
}  // namespace tierkv
