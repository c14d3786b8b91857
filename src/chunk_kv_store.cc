#include "tierkv/chunk_kv_store.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "src/block_pool.h"
#include "src/chunk_kv_store_internal.h"
#include "src/rope_remap.h"

namespace tierkv {

struct ChunkKvStore::State {
  State(const ChunkKvStoreOptions& options, BlockPool pool, RopeRemap remap)
      : hasher(options.key_namespace),
        virtual_start(options.virtual_start),
        variant(ChunkVariant(options.rope.ToString(), options.variant)),
        compute(options.compute),
        pool(std::move(pool)),
        remap(std::move(remap)),
        memory(static_cast<size_t>(options.num_blocks) *
               options.layout.BlockBytes()) {}

  const KvLayout& layout() const { return remap.layout(); }
  std::byte* block(BlockId id) {
    return memory.data() + static_cast<size_t>(id) * layout().BlockBytes();
  }

  KeyHasher hasher;
  int64_t virtual_start;
  BlockKey variant;  // Of its chunks' keys in the tier below.
  ChunkComputeFn compute;
  BlockPool pool;
  RopeRemap remap;
  std::vector<std::byte> memory;  // Zero-filled; never resized.
  ChunkSource* tier = nullptr;
  ChunkStoreStats stats;
  Status last_tier_error;
};

namespace {

// Tokens of block j of a chunk.
std::span<const TokenId> ChunkBlockTokens(std::span<const TokenId> chunk,
                                          int32_t block_size, size_t j) {
  const size_t begin = j * static_cast<size_t>(block_size);
  return chunk.subspan(
      begin, std::min(chunk.size() - begin, static_cast<size_t>(block_size)));
}

Status CheckComputable(std::span<const TokenId> chunk, int64_t virtual_start) {
  if (chunk.empty()) return Status::InvalidArgument("chunk store: empty chunk");
  if (static_cast<int64_t>(chunk.size()) > kMaxRopePosition - virtual_start) {
    // Computed, it could never be placed (RopeRemap takes positions < 2^48).
    return Status::InvalidArgument(
        "chunk store: a chunk of " + std::to_string(chunk.size()) +
        " tokens at virtual_start " + std::to_string(virtual_start) +
        " passes position 2^48");
  }
  return Status::Ok();
}

}  // namespace

Status CheckKvMemorySize(const KvLayout& layout, int64_t num_blocks) {
  TIERKV_RETURN_IF_ERROR(layout.Validate());
  constexpr int64_t kMaxBytes = int64_t{1} << 40;
  if (num_blocks < 1 ||
      num_blocks > kMaxBytes / static_cast<int64_t>(layout.BlockBytes())) {
    return Status::InvalidArgument("KV cache of " + std::to_string(num_blocks) +
                                   " blocks: need at least 1, at most 1 TiB");
  }
  return Status::Ok();
}

StatusOr<ChunkKvStore> ChunkKvStore::Create(ChunkKvStoreOptions options) {
  if (options.virtual_start < 0 || options.virtual_start >= kMaxRopePosition) {
    return Status::InvalidArgument("chunk store: virtual_start " +
                                   std::to_string(options.virtual_start) +
                                   " is negative or past 2^48");
  }
  TIERKV_ASSIGN_OR_RETURN(
      BlockPool pool,
      BlockPool::Create({.num_blocks = options.num_blocks,
                         .block_size = options.layout.block_size,
                         // A failed compute or fetch gives its blocks back
                         // unkeyed: reused before any cached chunk.
                         .free_uncached_first = true}));
  TIERKV_RETURN_IF_ERROR(CheckKvMemorySize(options.layout, options.num_blocks));
  TIERKV_ASSIGN_OR_RETURN(RopeRemap remap,
                          RopeRemap::Create(options.layout, options.rope));
  if (!options.compute) {
    return Status::InvalidArgument("chunk store: no compute function");
  }
  return ChunkKvStore(
      std::make_unique<State>(options, std::move(pool), std::move(remap)));
}

ChunkKvStore::ChunkKvStore(std::unique_ptr<State> state)
    : s_(std::move(state)) {}
ChunkKvStore::ChunkKvStore(ChunkKvStore&&) noexcept = default;
ChunkKvStore& ChunkKvStore::operator=(ChunkKvStore&&) noexcept = default;
ChunkKvStore::~ChunkKvStore() = default;

const BlockPool& PoolOf(const ChunkKvStore& store) { return store.s_->pool; }

Status ChunkKvStore::SetTier(ChunkSource* tier) {
  if (tier != nullptr && tier->layout() != s_->layout()) {
    return Status::InvalidArgument(
        "chunk store: the tier below holds blocks of layout " +
        tier->layout().ToString() + ", the pool's is " +
        s_->layout().ToString() + "; its bytes would be read as the other's");
  }
  if (tier != nullptr) {
    TIERKV_RETURN_IF_ERROR(tier->CheckPool(s_->memory, num_blocks()));
  }
  s_->tier = tier;
  return Status::Ok();
}
std::byte* ChunkKvStore::memory() { return s_->memory.data(); }
const std::byte* ChunkKvStore::memory() const { return s_->memory.data(); }
int64_t ChunkKvStore::virtual_start() const { return s_->virtual_start; }
const BlockKey& ChunkKvStore::variant() const { return s_->variant; }
const KvLayout& ChunkKvStore::layout() const { return s_->layout(); }
int32_t ChunkKvStore::num_blocks() const { return s_->pool.num_blocks(); }
int32_t ChunkKvStore::num_free_blocks() const {
  return s_->pool.num_free_blocks();
}
const Status& ChunkKvStore::last_tier_error() const {
  return s_->last_tier_error;
}

bool ChunkKvStore::Contains(std::span<const TokenId> chunk) const {
  const int32_t bs = s_->pool.block_size();
  const std::vector<BlockKey> keys = s_->hasher.ChunkKeys(chunk, bs);
  for (size_t j = 0; j < keys.size(); ++j) {
    if (!s_->pool.GetCachedBlock(keys[j], ChunkBlockTokens(chunk, bs, j))) {
      return false;
    }
  }
  return !keys.empty();
}

std::vector<BlockId> ChunkKvStore::Acquire(std::span<const TokenId> chunk) {
  const int32_t bs = s_->pool.block_size();
  const std::vector<BlockKey> keys = s_->hasher.ChunkKeys(chunk, bs);
  if (keys.empty()) return {};  // No chunk: neither a hit nor a miss.
  std::vector<BlockId> blocks;
  for (size_t j = 0; j < keys.size(); ++j) {
    std::optional<BlockId> hit =
        s_->pool.GetCachedBlock(keys[j], ChunkBlockTokens(chunk, bs, j));
    if (!hit.has_value()) return FetchFromTier(chunk, keys);
    blocks.push_back(*hit);
  }
  s_->pool.Touch(blocks);
  ++s_->stats.pool_hits;
  return blocks;
}

std::vector<BlockId> ChunkKvStore::FetchFromTier(
    std::span<const TokenId> chunk, std::span<const BlockKey> keys) {
  if (s_->tier == nullptr || keys.empty()) return {};
  std::vector<BlockId> blocks;
  bool pool_full = false;
  const ChunkSource::AllocateBlocks allocate =
      [&](int32_t n) -> StatusOr<std::vector<BlockId>> {
    if (n != static_cast<int32_t>(keys.size())) {
      return Status::Internal("chunk tier asked for " + std::to_string(n) +
                              " blocks for a chunk of " +
                              std::to_string(keys.size()));
    }
    if (Status got = s_->pool.GetNewBlocks(n, &blocks); !got.ok()) {
      pool_full = true;
      return got;
    }
    return blocks;
  };
  StatusOr<bool> fetched =
      s_->tier->Fetch(chunk, s_->virtual_start, s_->variant, allocate);
  Status status = fetched.status();
  if (status.ok() && *fetched && blocks.size() != keys.size()) {
    status = Status::Internal(
        "the chunk tier reported a hit without taking the chunk's blocks");
  }
  if (status.ok() && *fetched) {
    // Keyed only now: a lookup never sees a block still being copied.
    status = KeyBlocks(chunk, keys, &blocks);
  }
  if (status.ok() && *fetched) {
    ++s_->stats.tier_hits;
    return blocks;
  }
  if (status.code() == StatusCode::kDeadlineExceeded) {
    // A copy into them may still run: they stay taken, unkeyed, for good.
    s_->stats.retired_blocks += blocks.size();
    CountTierError(std::move(status));
    return {};
  }
  // A miss, or blocks whose contents are unknown: back to the pool unkeyed.
  GiveBack(blocks);
  if (pool_full) {
    ++s_->stats.pool_full;  // The tier below did its part.
  } else if (!status.ok()) {
    CountTierError(std::move(status));
  }
  return {};
}

void ChunkKvStore::CountTierError(Status status) {
  ++s_->stats.tier_errors;
  s_->last_tier_error = std::move(status);
}

ChunkStoreStats ChunkKvStore::stats() const {
  ChunkStoreStats out = s_->stats;
  out.evictions = s_->pool.stats().evictions;
  return out;
}

StatusOr<std::vector<BlockId>> ChunkKvStore::ComputeAndInsert(
    std::span<const TokenId> chunk) {
  const int32_t bs = s_->pool.block_size();
  const std::vector<BlockKey> keys = s_->hasher.ChunkKeys(chunk, bs);
  std::vector<BlockId> blocks;
  // New blocks holding the chunk's KV, keyed.
  const auto compute_into_blocks = [&]() -> Status {
    TIERKV_RETURN_IF_ERROR(CheckComputable(chunk, s_->virtual_start));
    TIERKV_RETURN_IF_ERROR(
        s_->pool.GetNewBlocks(static_cast<int32_t>(keys.size()), &blocks));
    TIERKV_ASSIGN_OR_RETURN(
        std::vector<int64_t> slots,
        SlotMappingForBlocks(blocks, bs, 0,
                             static_cast<int32_t>(chunk.size())));
    TIERKV_RETURN_IF_ERROR(s_->compute({.chunk = chunk,
                                        .virtual_start = s_->virtual_start,
                                        .blocks = blocks,
                                        .slots = slots,
                                        .layout = s_->layout(),
                                        .memory = s_->memory}));
    return KeyBlocks(chunk, keys, &blocks);
  };
  const Status status = compute_into_blocks();
  if (!status.ok()) {
    GiveBack(blocks);
    (void)Abandon(chunk);  // A tier error is counted there.
    return status;
  }
  ++s_->stats.computed;
  if (s_->tier != nullptr) {
    if (Status published =
            s_->tier->Publish(chunk, s_->virtual_start, s_->variant, blocks);
        published.ok()) {
      ++s_->stats.published;
    } else if (published.code() == StatusCode::kResourceExhausted) {
      ++s_->stats.unpublished;  // No room below: not a failure of the tier.
    } else {
      if (published.code() == StatusCode::kDeadlineExceeded) {
        // A copy out of them may still run: one more pin, never dropped,
        // keeps them from being written again. They still serve hits.
        s_->pool.Pin(blocks);
        s_->stats.retired_blocks += blocks.size();
      }
      CountTierError(std::move(published));
    }
  }
  return blocks;
}

Status ChunkKvStore::Abandon(std::span<const TokenId> chunk) {
  if (s_->tier == nullptr) return Status::Ok();
  // Workers waiting for this one to publish the chunk compute it now.
  Status abandoned = s_->tier->Abandon(chunk, s_->virtual_start, s_->variant);
  if (!abandoned.ok()) CountTierError(abandoned);
  return abandoned;
}

Status ChunkKvStore::KeyBlocks(std::span<const TokenId> chunk,
                               std::span<const BlockKey> keys,
                               std::vector<BlockId>* blocks) {
  // A block whose key the pool holds already (the same chunk computed or
  // fetched meanwhile for another request, or one that begins with the
  // same tokens) is given back and the held one, of the same KV, taken
  // instead: keying the new one would take the key from the held block,
  // and a request holding that block could no longer place it.
  const int32_t bs = s_->pool.block_size();
  for (size_t j = 0; j < keys.size(); ++j) {
    const std::span<const TokenId> tokens = ChunkBlockTokens(chunk, bs, j);
    const BlockId fresh = (*blocks)[j];
    if (const std::optional<BlockId> held =
            s_->pool.GetCachedBlock(keys[j], tokens);
        held.has_value() && *held != fresh) {
      s_->pool.Touch({&*held, 1});
      (*blocks)[j] = *held;
      s_->pool.FreeBlocks({&fresh, 1});
      continue;
    }
    TIERKV_RETURN_IF_ERROR(s_->pool.CacheBlock(fresh, keys[j], tokens));
  }
  return Status::Ok();
}

void ChunkKvStore::GiveBack(std::span<const BlockId> blocks) {
  std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  s_->pool.FreeBlocks(reversed);
}

Status ChunkKvStore::Release(std::span<const BlockId> blocks) {
  // Checked whole before any is released: a block freed more often than
  // it is held would be queued twice, and one slot handed to two users.
  std::vector<BlockId> sorted(blocks.begin(), blocks.end());
  std::ranges::sort(sorted);
  for (size_t i = 0; i < sorted.size();) {
    const BlockId id = sorted[i];
    size_t named = 0;
    while (i < sorted.size() && sorted[i] == id) ++named, ++i;
    if (id < 1 || id >= num_blocks()) {
      return Status::InvalidArgument("chunk store: no block " +
                                     std::to_string(id) + " to release");
    }
    if (static_cast<size_t>(std::max(0, s_->pool.block(id).ref_cnt)) < named) {
      return Status::InvalidArgument(
          "chunk store: block " + std::to_string(id) + " released " +
          std::to_string(named) + " time(s) but held " +
          std::to_string(s_->pool.block(id).ref_cnt) +
          " (released already?); nothing released");
    }
  }
  GiveBack(blocks);
  return Status::Ok();
}

Status ChunkKvStore::Place(std::span<const BlockId> blocks, int32_t num_tokens,
                           std::span<const int64_t> dst_slots,
                           int64_t real_start, std::span<std::byte> dst) const {
  // Only blocks the caller holds (Acquire, ComputeAndInsert) hold a
  // chunk's KV: a released one may be another chunk's by now, and the null
  // or a free block none. They hold num_tokens tokens, no more.
  std::vector<const std::byte*> src;
  int64_t held_tokens = 0;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const BlockId id = blocks[j];
    if (id < 1 || id >= num_blocks()) {
      return Status::InvalidArgument("chunk store: no block " +
                                     std::to_string(id));
    }
    const BlockPool::Block& b = s_->pool.block(id);
    if (b.ref_cnt < 1 || !b.has_key()) {
      return Status::InvalidArgument(
          "chunk store: block " + std::to_string(id) +
          " holds no chunk the caller has (released, or never keyed)");
    }
    if (j + 1 < blocks.size() && b.num_tokens < s_->pool.block_size()) {
      return Status::InvalidArgument(
          "chunk store: block " + std::to_string(id) + " holds a chunk's " +
          "partial last block, not its block " + std::to_string(j) +
          " (the blocks of one chunk, in order)");
    }
    held_tokens += b.num_tokens;
    src.push_back(s_->block(id));
  }
  const std::byte* pool_begin = s_->memory.data();
  const std::byte* pool_end = pool_begin + s_->memory.size();
  if (dst.data() < pool_end && dst.data() + dst.size() > pool_begin) {
    return Status::InvalidArgument(
        "chunk store: the destination overlaps the pool's own memory; "
        "placing would overwrite cached chunks");
  }
  if (num_tokens < 0 || num_tokens > held_tokens) {
    return Status::InvalidArgument(
        "chunk store: " + std::to_string(num_tokens) + " tokens to place; " +
        "the blocks hold " + std::to_string(held_tokens));
  }
  RemapRequest r;
  r.src_blocks = src;
  r.num_tokens = num_tokens;
  r.virtual_start = s_->virtual_start;
  r.dst_base = dst.data();
  r.dst_num_blocks = static_cast<int64_t>(dst.size() / layout().BlockBytes());
  r.dst_slots = dst_slots;
  r.real_start = real_start;
  return s_->remap.Remap(r);
}

}  // namespace tierkv
