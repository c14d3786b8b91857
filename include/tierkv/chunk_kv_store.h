// ChunkKvStore: a worker's pool of position-independent chunks (the chunk
// pool of position-independent KV caching, as README.md's "seed 000"
// describes it; separate from the engine's main pool). A chunked prompt
// (`sys <sep> doc1 <sep> doc2 <sep> question`) has its chunks' KV computed
// once, each in isolation at virtual positions [virtual_start, +n), and
// cached by content (KeyHasher::ChunkKeys); a reused chunk is copied into
// any destination slots with K re-rotated to its real positions (CacheBlend,
// arXiv 2405.16444, then recomputes the few tokens that deviate most). The
// store owns the pool's KV memory and keys its blocks in a block pool (LRU
// eviction, token check on every hit); the engine's model computes a missing
// chunk through ChunkKvStoreOptions::compute. With a ChunkSource below
// (SetTier), a pool miss is fetched from the tier before it is computed, and
// every computed chunk is published to it.
// Not thread-safe; owned by the engine's scheduler thread.
#ifndef TIERKV_INCLUDE_TIERKV_CHUNK_KV_STORE_H_
#define TIERKV_INCLUDE_TIERKV_CHUNK_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/chunk_source.h"
#include "tierkv/kv_layout.h"
#include "tierkv/rope_config.h"
#include "tierkv/status.h"
#include "tierkv/types.h"

namespace tierkv {

// One chunk for the engine's model to compute (ChunkKvStoreOptions::compute).
struct ChunkComputeArgs {
  std::span<const TokenId> chunk;  // Not empty.
  // RoPE position of chunk[0]; token i is at virtual_start + i.
  int64_t virtual_start = 0;
  // The pool blocks to fill, ceil(n / block_size) of them, in order: block j
  // holds tokens [j * block_size, (j + 1) * block_size), the last one
  // possibly in part.
  std::span<const BlockId> blocks;
  // The same as a slot mapping: token i goes to slot
  // slots[i] = blocks[i / block_size] * block_size + i % block_size.
  std::span<const int64_t> slots;
  // The pool's memory (ChunkKvStore::memory()): num_blocks blocks laid out
  // per `layout`, block b at memory.data() + b * layout.BlockBytes().
  KvLayout layout;
  std::span<std::byte> memory;
};

// Computes `args.chunk` in isolation (each token attends only to the
// chunk's tokens up to itself, causally) with token i at RoPE position
// args.virtual_start + i, and writes every layer's K (after RoPE) and V into
// its slot of args.memory, in the layout's dtype. Writes nothing outside the
// chunk's slots. The store keys the blocks only when this returns OK; on an
// error it returns them to the pool unkeyed and ComputeAndInsert fails with
// that error.
using ChunkComputeFn = std::function<Status(const ChunkComputeArgs& args)>;

struct ChunkKvStoreOptions {
  // The model's KV layout; block_size and dtype are the pool's. Required.
  KvLayout layout;
  // How the model turns K; head_dim as the layout's. Required.
  RopeConfig rope;
  int32_t num_blocks = 0;  // Pool size, null block included. Required.
  // Where every chunk is computed (0 .. 2^48 - 1; a chunk's last token
  // too, so a start near 2^48 takes only short chunks). Default: 0. Part of a
  // chunk's keys in the tiers below (ChunkSource): pools at other starts
  // never share a chunk's KV.
  int64_t virtual_start = 0;
  KeyNamespace key_namespace = {};  // Default: model "", tenant "".
  // What else changes the KV this store's compute writes, which the model
  // and tenant of the tier's client do not name: a LoRA adapter, a cache
  // salt (one store per such variant). With `rope`, part of its chunks'
  // keys in the tier below (ChunkVariant), so workers share a chunk only
  // when they compute it alike. Default: "" (nothing more).
  std::string variant = {};
  // Computes a chunk into pool blocks (the engine's model). Required.
  ChunkComputeFn compute;
};

// What a ChunkKvStore served, and how.
struct ChunkStoreStats {
  uint64_t pool_hits = 0;    // Chunks found in the pool.
  uint64_t tier_hits = 0;    // Chunks fetched from the tier below.
  uint64_t computed = 0;     // Chunks computed (ComputeAndInsert).
  uint64_t published = 0;    // Computed chunks copied to the tier below.
  uint64_t tier_errors = 0;  // Fetches or publishes that failed.
  // Chunks the tier below held but that were not fetched: every pool block
  // was pinned. Not a tier error; the caller computes nothing into a full
  // pool either (ComputeAndInsert is ResourceExhausted).
  uint64_t pool_full = 0;
  // Computed chunks the tier below had no room for, whole or in part (its
  // host slots pinned, the worker at a cap: Publish was ResourceExhausted).
  // Not published, and not a tier error: other workers compute them too.
  uint64_t unpublished = 0;
  uint64_t evictions = 0;  // Cached pool blocks dropped for reuse.
  // Pool blocks never used again: the tier below gave up on a copy into or
  // out of them that may still run (ChunkSource, DeadlineExceeded).
  uint64_t retired_blocks = 0;
};

class BlockPool;

// A tier that fails is counted (stats().tier_errors, last_tier_error()) and
// worked around: the chunk is computed, never served half-copied.
class ChunkKvStore {
 public:
  // InvalidArgument for an invalid layout, RoPE config, pool size or
  // virtual_start, or no compute function.
  static StatusOr<ChunkKvStore> Create(ChunkKvStoreOptions options);
  ChunkKvStore(ChunkKvStore&&) noexcept;
  ChunkKvStore& operator=(ChunkKvStore&&) noexcept;
  ~ChunkKvStore();

  // The tier below the pool, or null for none (the default). Not owned; it
  // copies into and out of memory(). InvalidArgument, with the tier
  // unchanged, when its layout is not the pool's; FailedPrecondition when
  // it copies elsewhere (ChunkSource::CheckPool).
  Status SetTier(ChunkSource* tier);
  // The pool's KV memory: num_blocks() blocks of layout().BlockBytes(), at a
  // fixed address for the store's life (a device tier is built over it).
  std::byte* memory();
  const std::byte* memory() const;

  // The chunk's blocks, pinned, when every one of them is in the pool or
  // the tier below; empty on a miss.
  std::vector<BlockId> Acquire(std::span<const TokenId> chunk);
  // Computes `chunk` in isolation at the virtual positions into new blocks
  // (options.compute), keys them and publishes them to the tier; returns
  // them pinned. ResourceExhausted when the pool has too few free blocks;
  // InvalidArgument for an empty chunk or one whose last token would sit
  // at or past position 2^48.
  // On any failure the tier is told the chunk will not be published
  // (ChunkSource::Abandon), so workers waiting for it compute it instead.
  StatusOr<std::vector<BlockId>> ComputeAndInsert(
      std::span<const TokenId> chunk);
  // The caller will not compute `chunk`, which Acquire missed (the request
  // that wanted it was aborted, or it is computed elsewhere): the tier
  // below is told (ChunkSource::Abandon), so workers waiting for this one
  // to publish the chunk stop waiting and compute it themselves. Call it
  // for every miss not followed by ComputeAndInsert; a chunk this worker
  // holds no lease on ends nothing. The lease is the worker's, per chunk:
  // when two requests of this store missed the same chunk, giving up the
  // first ends it for the second too (other workers may then compute the
  // chunk as well: wasted work, never wrong KV). OK without a tier; the
  // tier's error otherwise (also counted in stats().tier_errors).
  Status Abandon(std::span<const TokenId> chunk);
  // Unpins blocks from Acquire or ComputeAndInsert. InvalidArgument, with
  // nothing released, for a block that is not the pool's or that the
  // caller does not hold (released already, as often as it is named).
  Status Release(std::span<const BlockId> blocks);
  // Whether every block of `chunk` is cached.
  bool Contains(std::span<const TokenId> chunk) const;
  // Copies a chunk's KV (num_tokens tokens in `blocks`) into `dst` at
  // `dst_slots`, K re-rotated from the virtual positions to real_start + i.
  // `dst` is KV memory in layout(): block b at dst.data() + b * BlockBytes(),
  // a slot is block * block_size + offset. InvalidArgument, with nothing
  // written, for a block the caller does not hold (the null block, one not
  // from Acquire or ComputeAndInsert, or released since), a partial block
  // before the last, more tokens than the blocks hold, a slot outside
  // `dst`, or a `dst` that overlaps memory().
  Status Place(std::span<const BlockId> blocks, int32_t num_tokens,
               std::span<const int64_t> dst_slots, int64_t real_start,
               std::span<std::byte> dst) const;

  int64_t virtual_start() const;
  // Its chunks' variant in the tier below: ChunkVariant(rope, variant).
  const BlockKey& variant() const;
  const KvLayout& layout() const;
  int32_t num_blocks() const;       // The null block included.
  int32_t num_free_blocks() const;  // In the free queue, cached or not.
  ChunkStoreStats stats() const;
  // Why the tier last failed; OK when it never did.
  const Status& last_tier_error() const;

 private:
  struct State;
  // The pool itself, for tierkv's own checks (src/chunk_kv_store_internal.h).
  friend const BlockPool& PoolOf(const ChunkKvStore& store);

  explicit ChunkKvStore(std::unique_ptr<State> state);

  std::vector<BlockId> FetchFromTier(std::span<const TokenId> chunk,
                                     std::span<const BlockKey> keys);
  // Keys the chunk's blocks, fresh from a compute or a fetch; see there.
  Status KeyBlocks(std::span<const TokenId> chunk,
                   std::span<const BlockKey> keys,
                   std::vector<BlockId>* blocks);
  // Gives back blocks this store took for a compute or fetch that failed.
  void GiveBack(std::span<const BlockId> blocks);
  void CountTierError(Status status);

  std::unique_ptr<State> s_;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_CHUNK_KV_STORE_H_
