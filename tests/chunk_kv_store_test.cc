// The chunk pool on its own, with a compute function that is not a model:
// what the function is asked to fill, that a chunk is keyed only when it was
// computed, and that placing a chunk at its own virtual positions copies its
// bytes. The reference model's chunks are in reference_model_test and
// cache_blend_test, the tiers below in chunk_tier_test.
#include "tierkv/chunk_kv_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "src/chunk_kv_store_internal.h"
#include "tests/status_matchers.h"
#include "tierkv/chunk_source.h"

namespace tierkv {
namespace {

constexpr int32_t kBs = 4;

KvLayout Layout() {
  return {.num_layers = 2,
          .num_kv_heads = 1,
          .head_dim = 4,
          .block_size = kBs,
          .dtype = DType::kF32};
}

RopeConfig Rope() {
  RopeConfig rope;
  rope.head_dim = 4;
  rope.rotary_dim = 4;
  return rope;
}

// Token i's bytes, every layer and plane: i + 1 as floats.
Status FillWithPositions(const ChunkComputeArgs& args) {
  const KvLayout& l = args.layout;
  const size_t width = static_cast<size_t>(l.num_kv_heads) * l.head_dim;
  for (size_t i = 0; i < args.chunk.size(); ++i) {
    const std::vector<float> values(width, static_cast<float>(i + 1));
    const int64_t slot = args.slots[i];
    for (int32_t layer = 0; layer < l.num_layers; ++layer) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        std::byte* p = args.memory.data() + (slot / kBs) * l.BlockBytes() +
                       l.Offset(layer, plane, static_cast<int32_t>(slot % kBs));
        std::memcpy(p, values.data(), width * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

ChunkKvStoreOptions Options(ChunkComputeFn compute) {
  return {.layout = Layout(),
          .rope = Rope(),
          .num_blocks = 8,
          .virtual_start = 100,
          .compute = std::move(compute)};
}

TEST(ChunkKvStore, NeedsAComputeFunction) {
  EXPECT_THAT(ChunkKvStore::Create(Options(nullptr)),
              StatusIs(StatusCode::kInvalidArgument));
  ChunkKvStoreOptions bad_rope = Options(FillWithPositions);
  bad_rope.rope.head_dim = 8;
  EXPECT_THAT(ChunkKvStore::Create(bad_rope),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(ChunkKvStore, ComputeFillsTheBlocksItIsGiven) {
  std::vector<ChunkComputeArgs> calls;
  std::vector<BlockId> seen_blocks;
  std::vector<int64_t> seen_slots;
  ChunkKvStore store =
      ChunkKvStore::Create(Options([&](const ChunkComputeArgs& args) {
        calls.push_back(args);
        seen_blocks.assign(args.blocks.begin(), args.blocks.end());
        seen_slots.assign(args.slots.begin(), args.slots.end());
        return FillWithPositions(args);
      })).value();
  const std::vector<TokenId> chunk = {5, 6, 7, 8, 9, 10};  // 1.5 blocks.
  const std::vector<BlockId> blocks = store.ComputeAndInsert(chunk).value();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].chunk.size(), chunk.size());
  EXPECT_EQ(calls[0].virtual_start, 100);
  EXPECT_EQ(calls[0].layout, Layout());
  EXPECT_EQ(calls[0].memory.data(), store.memory());
  EXPECT_EQ(calls[0].memory.size(), 8 * Layout().BlockBytes());
  EXPECT_EQ(seen_blocks, blocks);
  ASSERT_EQ(seen_slots.size(), chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) {
    EXPECT_EQ(seen_slots[i], int64_t{blocks[i / kBs]} * kBs + i % kBs);
  }
  EXPECT_THAT(store.Release(blocks), IsOk());
  EXPECT_TRUE(store.Contains(chunk));
  EXPECT_EQ(store.Acquire(chunk), blocks);
  EXPECT_THAT(store.Release(blocks), IsOk());
  EXPECT_EQ(store.stats().computed, 1u);
  EXPECT_EQ(store.stats().pool_hits, 1u);
  // No tokens is no chunk: nothing acquired, and not counted as a hit.
  EXPECT_TRUE(store.Acquire({}).empty());
  EXPECT_EQ(store.stats().pool_hits, 1u);
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// A chunk whose last token would pass position 2^48 is refused before it is
// computed: it could never be placed (RoPE remap takes positions < 2^48).
TEST(ChunkKvStore, AChunkPastTheLastPositionIsRefusedUncomputed) {
  int computes = 0;
  ChunkKvStoreOptions options = Options([&](const ChunkComputeArgs& args) {
    ++computes;
    return FillWithPositions(args);
  });
  options.virtual_start = (int64_t{1} << 48) - 4;
  ChunkKvStore store = ChunkKvStore::Create(options).value();
  EXPECT_THAT(store.ComputeAndInsert(std::vector<TokenId>{1, 2, 3, 4, 5}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(computes, 0);
  EXPECT_EQ(store.num_free_blocks(), 7);
  // Four tokens fit, and are placed.
  const std::vector<BlockId> blocks =
      store.ComputeAndInsert(std::vector<TokenId>{1, 2, 3, 4}).value();
  EXPECT_EQ(computes, 1);
  std::vector<std::byte> dst(2 * Layout().BlockBytes());
  const std::vector<int64_t> slots = {0, 1, 2, 3};
  EXPECT_THAT(store.Place(blocks, 4, slots, 0, dst), IsOk());
  EXPECT_THAT(store.Release(blocks), IsOk());
}

TEST(ChunkKvStore, FailedComputeKeysNothing) {
  ChunkKvStore store =
      ChunkKvStore::Create(Options([](const ChunkComputeArgs&) {
        return Status::Internal("model failed");
      })).value();
  const int32_t free_before = store.num_free_blocks();
  const std::vector<TokenId> chunk = {1, 2, 3, 4, 5};
  EXPECT_THAT(store.ComputeAndInsert(chunk), StatusIs(StatusCode::kInternal));
  EXPECT_FALSE(store.Contains(chunk));
  EXPECT_EQ(store.num_free_blocks(), free_before);
  EXPECT_EQ(store.stats().computed, 0u);
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// Blocks a failed compute gives back hold nothing a lookup can find: they
// are reused before any cached chunk, so one failure costs one eviction,
// not two.
TEST(ChunkKvStore, BlocksOfAFailedComputeAreReusedFirst) {
  bool fail = false;
  ChunkKvStore store =
      ChunkKvStore::Create(Options([&](const ChunkComputeArgs& args) {
        return fail ? Status::Internal("model failed")
                    : FillWithPositions(args);
      })).value();
  const auto chunk = [](TokenId n) {
    return std::vector<TokenId>{n, n + 1, n + 2, n + 3};  // One block.
  };
  // Seven one-block chunks fill the pool (block 0 is the null block).
  for (TokenId c = 0; c < 7; ++c) {
    EXPECT_THAT(store.Release(store.ComputeAndInsert(chunk(10 * c)).value()),
                IsOk());
  }
  ASSERT_EQ(store.stats().evictions, 0u);
  fail = true;
  EXPECT_THAT(store.ComputeAndInsert(chunk(100)),
              StatusIs(StatusCode::kInternal));  // Evicts chunk 0.
  fail = false;
  EXPECT_THAT(store.Release(store.ComputeAndInsert(chunk(200)).value()),
              IsOk());
  EXPECT_EQ(store.stats().evictions, 1u);
  EXPECT_FALSE(store.Contains(chunk(0)));
  EXPECT_TRUE(store.Contains(chunk(10)));
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// What else a chunk's KV depends on keys it in the tier below: the RoPE
// config (other workers re-rotate K with their own) and the engine's
// variant.
TEST(ChunkKvStore, TheRopeConfigAndVariantKeyItsChunksBelow) {
  const auto variant_of = [](const ChunkKvStoreOptions& o) {
    return ChunkKvStore::Create(o).value().variant();
  };
  const BlockKey base = variant_of(Options(FillWithPositions));
  EXPECT_EQ(variant_of(Options(FillWithPositions)), base);
  ChunkKvStoreOptions theta = Options(FillWithPositions);
  theta.rope.theta = 500000;
  ChunkKvStoreOptions scaled = Options(FillWithPositions);
  scaled.rope.scaling = RopeScaling::Linear(4);
  ChunkKvStoreOptions lora = Options(FillWithPositions);
  lora.variant = "lora-7";
  std::vector<BlockKey> seen = {base};
  for (const ChunkKvStoreOptions& o : {theta, scaled, lora}) {
    const BlockKey v = variant_of(o);
    for (const BlockKey& other : seen) EXPECT_NE(v, other);
    seen.push_back(v);
  }
}

// A tier whose device copies never end: it gives up with DeadlineExceeded
// (ClientChunkSource past stuck_copy_timeout), the copy still running.
class WedgedTier final : public ChunkSource {
 public:
  explicit WedgedTier(const KvLayout& layout) : layout_(layout) {}
  const KvLayout& layout() const override { return layout_; }
  StatusOr<bool> Fetch(std::span<const TokenId>, int64_t, const BlockKey&,
                       const AllocateBlocks& allocate) override {
    TIERKV_ASSIGN_OR_RETURN(copying_into, allocate(1));
    return Status::DeadlineExceeded("copy still runs");
  }
  Status Publish(std::span<const TokenId>, int64_t, const BlockKey&,
                 std::span<const BlockId> blocks) override {
    copying_out_of.assign(blocks.begin(), blocks.end());
    return Status::DeadlineExceeded("copy still runs");
  }
  std::vector<BlockId> copying_into, copying_out_of;

 private:
  KvLayout layout_;
};

TEST(ChunkKvStore, BlocksACopyMayStillUseAreNeverReused) {
  ChunkKvStore store = ChunkKvStore::Create(Options(FillWithPositions)).value();
  // A tier of another layout would read the pool's bytes as its own.
  KvLayout f16 = store.layout();
  f16.dtype = DType::kF16;
  f16.block_size *= 2;  // The same bytes per block.
  ASSERT_EQ(f16.BlockBytes(), store.layout().BlockBytes());
  WedgedTier other(f16);
  EXPECT_THAT(store.SetTier(&other), StatusIs(StatusCode::kInvalidArgument));
  WedgedTier tier(store.layout());
  ASSERT_THAT(store.SetTier(&tier), IsOk());
  const auto chunk = [](TokenId n) {
    return std::vector<TokenId>{n, n + 1, n + 2, n + 3};  // One block.
  };
  // A publish given up on: the block keeps its chunk, and a pin for good.
  EXPECT_THAT(store.Release(store.ComputeAndInsert(chunk(0)).value()), IsOk());
  ASSERT_EQ(tier.copying_out_of.size(), 1u);
  // A fetch given up on: the block stays taken, unkeyed.
  EXPECT_TRUE(store.Acquire(chunk(10)).empty());
  ASSERT_EQ(tier.copying_into.size(), 1u);
  EXPECT_EQ(store.stats().retired_blocks, 2u);
  EXPECT_EQ(store.stats().tier_errors, 2u);
  EXPECT_EQ(store.num_free_blocks(), 5);  // 7 usable.
  // Many more chunks than the pool holds: neither block is handed out.
  ASSERT_THAT(store.SetTier(nullptr), IsOk());
  for (TokenId c = 2; c < 40; ++c) {
    const std::vector<BlockId> blocks =
        store.ComputeAndInsert(chunk(10 * c)).value();
    EXPECT_NE(blocks[0], tier.copying_into[0]);
    EXPECT_NE(blocks[0], tier.copying_out_of[0]);
    EXPECT_THAT(store.Release(blocks), IsOk());
  }
  // The published chunk is still whole and served from the pool.
  const std::vector<BlockId> again = store.Acquire(chunk(0));
  EXPECT_EQ(again, tier.copying_out_of);
  EXPECT_THAT(store.Release(again), IsOk());
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// At its own virtual positions a chunk turns by zero: exact, so Place copies
// the bytes. A block outside the pool or a slot outside `dst` is refused.
TEST(ChunkKvStore, PlaceAtTheVirtualPositionsCopiesTheBytes) {
  ChunkKvStore store = ChunkKvStore::Create(Options(FillWithPositions)).value();
  const std::vector<TokenId> chunk = {5, 6, 7, 8, 9, 10};
  const std::vector<BlockId> blocks = store.ComputeAndInsert(chunk).value();
  const KvLayout l = Layout();
  std::vector<std::byte> dst(3 * l.BlockBytes());
  std::vector<int64_t> slots(chunk.size());
  std::iota(slots.begin(), slots.end(), int64_t{3});  // Not block-aligned.
  ASSERT_THAT(store.Place(blocks, 6, slots, store.virtual_start(), dst),
              IsOk());
  for (size_t i = 0; i < chunk.size(); ++i) {
    const int64_t src_slot = int64_t{blocks[i / kBs]} * kBs + i % kBs;
    for (int32_t layer = 0; layer < l.num_layers; ++layer) {
      for (KvPlane plane : {KvPlane::kKey, KvPlane::kValue}) {
        const std::byte* want =
            store.memory() + (src_slot / kBs) * l.BlockBytes() +
            l.Offset(layer, plane, static_cast<int32_t>(src_slot % kBs));
        const std::byte* got =
            dst.data() + (slots[i] / kBs) * l.BlockBytes() +
            l.Offset(layer, plane, static_cast<int32_t>(slots[i] % kBs));
        EXPECT_EQ(std::memcmp(got, want, l.TokenStride()), 0) << i;
      }
    }
  }
  const std::vector<BlockId> bad = {blocks[0], 8};
  EXPECT_THAT(store.Place(bad, 6, slots, 0, dst),
              StatusIs(StatusCode::kInvalidArgument));
  // The null block, and more tokens than the blocks hold.
  const std::vector<BlockId> null_block = {0, blocks[1]};
  EXPECT_THAT(store.Place(null_block, 6, slots, 0, dst),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store.Place(blocks, 7, slots, 0, dst),
              StatusIs(StatusCode::kInvalidArgument));
  std::iota(slots.begin(), slots.end(), int64_t{8});  // Past 3 blocks.
  EXPECT_THAT(store.Place(blocks, 6, slots, 0, dst),
              StatusIs(StatusCode::kInvalidArgument));
  // The partial last block first, and a destination in the pool itself.
  std::iota(slots.begin(), slots.end(), int64_t{0});
  const std::vector<BlockId> reversed = {blocks[1], blocks[0]};
  Status placed = store.Place(reversed, 6, slots, 0, dst);
  EXPECT_EQ(placed.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(placed.message(), ::testing::HasSubstr("partial last block"));
  placed =
      store.Place(blocks, 6, slots, 0, {store.memory(), 3 * l.BlockBytes()});
  EXPECT_EQ(placed.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(placed.message(), ::testing::HasSubstr("overlaps the pool"));
  EXPECT_THAT(store.Release(blocks), IsOk());
  // Released: the blocks may hold another chunk by now.
  std::iota(slots.begin(), slots.end(), int64_t{0});
  EXPECT_THAT(store.Place(blocks, 6, slots, 0, dst),
              StatusIs(StatusCode::kInvalidArgument));
}

// A chunk computed while another request holds a chunk that begins with
// the same block (documents with one header), or the same chunk computed
// twice in one batch: the block the pool holds already is shared, not
// rekeyed away from the request that holds it, which still places it.
TEST(ChunkKvStore, AChunkComputedWhileItsFirstBlockIsHeldSharesIt) {
  ChunkKvStore store = ChunkKvStore::Create(Options(FillWithPositions)).value();
  const std::vector<TokenId> y = {1, 2, 3, 4, 50, 51, 52, 53};
  const std::vector<TokenId> x = {1, 2, 3, 4, 60, 61, 62, 63};
  const std::vector<BlockId> held_y = store.ComputeAndInsert(y).value();
  ASSERT_TRUE(store.Acquire(x).empty());  // Its second block misses.
  const std::vector<BlockId> computed_x = store.ComputeAndInsert(x).value();
  EXPECT_EQ(computed_x[0], held_y[0]);
  EXPECT_NE(computed_x[1], held_y[1]);
  // The same chunk again while it is held: every block shared.
  const std::vector<BlockId> again_x = store.ComputeAndInsert(x).value();
  EXPECT_EQ(again_x, computed_x);
  const KvLayout l = Layout();
  std::vector<std::byte> dst(2 * l.BlockBytes());
  std::vector<int64_t> slots(y.size());
  std::iota(slots.begin(), slots.end(), int64_t{0});
  for (const std::vector<BlockId>* held : {&held_y, &computed_x, &again_x}) {
    EXPECT_THAT(store.Place(*held, 8, slots, store.virtual_start(), dst),
                IsOk());
  }
  EXPECT_TRUE(store.Contains(x));
  EXPECT_TRUE(store.Contains(y));
  for (const std::vector<BlockId>* held : {&held_y, &computed_x, &again_x}) {
    EXPECT_THAT(store.Release(*held), IsOk());
  }
  EXPECT_EQ(store.num_free_blocks(), 7);  // Every block back, none lost.
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

// A release of blocks the caller does not hold is refused whole: a block
// released twice (named twice, or once more than held), the null block,
// one outside the pool. The engine's process goes on.
TEST(ChunkKvStore, AReleaseOfBlocksNotHeldIsRefusedWhole) {
  ChunkKvStore store = ChunkKvStore::Create(Options(FillWithPositions)).value();
  const std::vector<TokenId> chunk = {1, 2, 3, 4, 5};
  const std::vector<BlockId> blocks = store.ComputeAndInsert(chunk).value();
  ASSERT_EQ(blocks.size(), 2u);
  const std::vector<BlockId> twice = {blocks[0], blocks[1], blocks[1]};
  EXPECT_THAT(store.Release(twice), StatusIs(StatusCode::kInvalidArgument));
  for (BlockId bad : {0, -1, 8, 1 << 30}) {
    const std::vector<BlockId> one = {blocks[0], bad};
    EXPECT_THAT(store.Release(one), StatusIs(StatusCode::kInvalidArgument))
        << bad;
  }
  EXPECT_EQ(store.num_free_blocks(), 5);  // Nothing released.
  EXPECT_THAT(store.Release(blocks), IsOk());
  EXPECT_THAT(store.Release(blocks), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(store.num_free_blocks(), 7);
  EXPECT_THAT(PoolOf(store).CheckInvariants(), IsOk());
}

}  // namespace
}  // namespace tierkv
