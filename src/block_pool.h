// BlockPool: the one block-pool mechanism every tier reuses (seed 002
// §4.2.2 BlockPool, seed 003 BlockManager): an array of blocks with ref
// counts and optional keys, a key -> block index, and an LRU FreeBlockQueue.
// Not thread-safe; owned by one thread (the engine's scheduler, or the
// coordinator thread for a tier's pool).
//
// Metadata per block: the Block below (32 bytes), the free queue's links
// and list tag (9), the key index's slots (16; 14 under kArc), under kArc
// the ghosts (three tables of 4-byte slots, each for half the pool's
// blocks and at most three quarters full: 8), and with keep_tokens
// the token ids (4 x block_size). Without keep_tokens a hit is checked
// against a secret hash of the tokens instead of the tokens themselves
// (BlockPoolOptions); the owner may compare the tokens it keeps.
//
// Block states (the null block, when reserved, is none of these: it is never
// queued, keyed or freed):
//
//        GetNewBlocks (key dropped: eviction)
//   +------------------------------------------+
//   |                                          v
//  FREE (ref 0, no key, queued)          IN USE (ref > 0, not queued)
//  CACHED-FREE (ref 0, key, queued) ---> IN USE      Touch (a hit)
//  IN USE --FreeBlocks, ref reaches 0--> FREE or CACHED-FREE (appended)
//  IN USE --CacheBlock--> IN USE with a key
//
// Invariants (CheckInvariants):
//  - a block is in the free queue iff its ref count is 0;
//  - a block has a key iff the index maps that key to that block;
//  - ref counts are never negative.
// The free queue's order is the pool's eviction policy
// (BlockPoolOptions::eviction). kLru is one list, vLLM's. kArc keeps three
// over the same links: blocks holding nothing worth keeping (no key, or
// dropped) first, then ARC's recent list (keyed blocks used once) and its
// frequent list (hit at least once, or keyed again soon after an eviction:
// its ghost). A victim comes from the first list while it has any, then
// from the recent list while it is over its adaptive target, else from
// whichever of the two lists' oldest blocks was freed first: the frequent
// list gives up a block only when it is older than the recent list's
// oldest (of two freed in one tick, 1/1024 of the pool's frees, the block
// used once goes). So with the target at the whole pool, where it starts,
// the pool evicts in LRU order to within a tick; frequent blocks that come back
// soon after leaving (their ghosts) lower the target and earn the frequent list
// protection, recent ones raise it again. (Plain ARC evicts the frequent list's
// oldest whenever the recent list is under target, even a block used both more
// often and more recently than the recent list's oldest; on prefix
// workloads where reuse is mostly recent that put it below LRU.) Both
// lists are in free order, and a request frees its blocks tail first, so a
// block goes before the blocks that extend it unless they are in the
// frequent list and it is not (they were used more).
//
// Free blocks keep their key until popped for reuse (lazy eviction), so a
// freed block can still be hit. When a block is keyed with a key that another
// block already holds (two requests filled identical blocks), the newer block
// takes the key and the older one becomes unkeyed: the index stays one-to-one.
#ifndef TIERKV_SRC_BLOCK_POOL_H_
#define TIERKV_SRC_BLOCK_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "src/free_block_queue.h"
#include "src/ghost_keys.h"
#include "src/key_index.h"
#include "tierkv/block_key.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/status.h"

namespace tierkv {

struct BlockPoolStats {
  uint64_t evictions = 0;  // Keyed blocks whose key was dropped for reuse.
};

class BlockPool {
 public:
  // Packed to 32 bytes, two to a cache line: a hit reads the key and the
  // token check together.
  struct Block {
    BlockKey key;              // Meaningful only while has_key().
    uint64_t token_check = 0;  // Without keep_tokens: the tokens' hash.
    int32_t ref_cnt = 0;
    uint16_t num_tokens = 0;  // Tokens recorded with the key; 0: no key.
    // The eviction policy's per-block state. kArc: 1 when the block was
    // hit since it was keyed, or keyed again from a ghost (it is freed into
    // the frequent list, not the recent one).
    uint16_t used_again : 1 = 0;
    // kArc, while the block waits in the recent or frequent list: when it
    // was freed, in ticks of the pool's free clock, modulo 2^15 (the pool
    // keeps every waiting block's tick within 2^14 of now, so two compare
    // by their difference).
    uint16_t freed_tick : 15 = 0;

    bool has_key() const { return num_tokens != 0; }
    bool reused() const { return used_again != 0; }
  };
  static_assert(sizeof(Block) == 32);
  // num_tokens is 16 bits wide.
  static constexpr int32_t kMaxBlockSize = UINT16_MAX;

  static StatusOr<BlockPool> Create(const BlockPoolOptions& options);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return free_queue_.size(); }
  size_t num_cached_blocks() const { return index_.size(); }
  // The reserved placeholder block, if any.
  std::optional<BlockId> null_block() const { return null_block_; }
  bool IsValid(BlockId id) const { return id >= 0 && id < num_blocks(); }

  const Block& block(BlockId id) const { return blocks_[Index(id)]; }
  bool keeps_tokens() const { return keep_tokens_; }
  // The token ids recorded when the block was keyed. Always empty without
  // keep_tokens: the pool keeps only their check then.
  std::span<const TokenId> block_tokens(BlockId id) const;

  // Bytes of per-block bookkeeping the pool holds: the block array, the free
  // queue, the key index, any token copies and the eviction policy's
  // ghosts. Fixed at Create.
  size_t MetadataBytes() const;

  // The block holding `key` whose recorded tokens equal `tokens` (with
  // keep_tokens) or whose token count and check match theirs (without). A
  // key whose block holds other tokens (a hash collision) is a miss.
  std::optional<BlockId> GetCachedBlock(const BlockKey& key,
                                        std::span<const TokenId> tokens) const;

  // The block holding `key`, in any state (free or in use), whatever its
  // tokens: for an operator naming a block by its key alone.
  std::optional<BlockId> FindKeyedBlock(const BlockKey& key) const;

  // Pops `n` blocks from the head of the free queue into `out` with ref
  // count 1, dropping the keys they held. ResourceExhausted (and no change)
  // when fewer than `n` are free.
  Status GetNewBlocks(int32_t n, std::vector<BlockId>* out);

  // Takes a reference on hit blocks; a block whose ref count was 0 leaves the
  // free queue so it cannot be evicted. A hit: under kArc, a keyed block
  // is freed into the frequent list from now on.
  void Touch(std::span<const BlockId> ids);

  // Takes a reference as Touch does, for a reason other than a hit (a copy
  // to a lower tier reads it): the policy does not count it as a use. Its
  // recency does change: freed again, the block goes to its list's tail.
  void Pin(std::span<const BlockId> ids);

  // Counts a use of a keyed block that is not a hit in this pool (it was
  // found in a lower tier and promoted into it). False for a block holding
  // no key.
  bool MarkReused(BlockId id);

  // Drops one reference per block; blocks reaching 0 are appended to the free
  // queue in the order given (callers pass a request's blocks in reverse).
  // Freeing a block that is free already aborts the process, in every build.
  void FreeBlocks(std::span<const BlockId> ordered_ids);

  // Gives back a block GetNewBlocks just handed out and nobody keyed or
  // pinned since (ref count 1, no key): to the front of the free queue, so
  // the next GetNewBlocks takes it again rather than evicting another
  // cached block. Returns false (and changes nothing) for any other block.
  bool ReturnNewBlock(BlockId id);

  // Records `key` and `tokens` (1..block_size of them) for an in-use block so
  // later lookups can hit it. InvalidArgument for a free, null, out-of-range
  // or already keyed block, or a wrong token count.
  Status CacheBlock(BlockId id, const BlockKey& key,
                    std::span<const TokenId> tokens);

  // Keys a request's blocks [num_cached_blocks, num_full_blocks) (vLLM's
  // cache_full_blocks): blocks[i] gets keys[i] and token ids
  // tokens[i * block_size, (i + 1) * block_size). OutOfRange when a span is
  // too short; otherwise as CacheBlock.
  Status CacheFullBlocks(std::span<const BlockId> blocks,
                         std::span<const BlockKey> keys,
                         std::span<const TokenId> tokens,
                         int32_t num_cached_blocks, int32_t num_full_blocks);

  // Drops the key of a free cached block, leaving it in the free queue.
  // Returns false when the block is in use or holds no key.
  bool EvictCachedBlock(BlockId id);

  // Drops the key of a free cached block whose contents now live in a lower
  // tier, and moves the block to the front of the free queue, so it is
  // reused before any block that still holds a key. Not an eviction: the
  // block is not lost. Returns false when the block is in use or holds no
  // key.
  bool DemoteCachedBlock(BlockId id);

  // Drops the key of a free cached block on an operator's request and
  // moves the block to the front of the free queue (it holds nothing worth
  // keeping). Not an eviction: stats().evictions counts capacity only.
  // Returns false when the block is in use or holds no key.
  bool DropCachedBlock(BlockId id);

  // Moves a free block (keyed or not) to the front of the free queue: the
  // next GetNewBlocks takes it first. For a block whose contents a lower
  // tier now holds too. Returns false (and changes nothing) for a block in
  // use.
  bool MoveToFront(BlockId id);

  // Calls visit(id) for the free blocks in the order GetNewBlocks would
  // take them, until it returns false (a spill picks its victims so). The
  // pool must not change during the walk.
  template <typename Visit>
  void VisitFreeQueue(Visit&& visit) const {
    if (eviction_ == EvictionPolicy::kLru) {
      free_queue_.ForEach(std::forward<Visit>(visit));
      return;
    }
    if (!free_queue_.ForEachIn(kReuseFirst, visit)) return;
    // Then ARC's choice, as VictimList makes it: a block taken leaves the
    // recent count as it was (it is in use, unkeyed, after), one taken from
    // the frequent list adds to it.
    double recent = usable_blocks_ - frequent_blocks_;
    BlockId r = free_queue_.First(kRecent);
    BlockId f = free_queue_.First(kFrequent);
    while (r != FreeBlockQueue::kNone || f != FreeBlockQueue::kNone) {
      const bool from_recent = ArcVictimList(r, f, recent) == kRecent;
      const BlockId id = from_recent ? r : f;
      if (from_recent) {
        r = free_queue_.After(r);
      } else {
        f = free_queue_.After(f);
        ++recent;
      }
      if (!visit(id)) return;
    }
  }

  // The free block GetNewBlocks would take next; nullopt when none is free.
  std::optional<BlockId> NextFreeBlock() const {
    if (free_queue_.empty()) return std::nullopt;
    return free_queue_.Front(VictimList());
  }

  // Free queue, front (next to evict) to back.
  std::vector<BlockId> FreeQueueSnapshot() const {
    return free_queue_.ToVector();
  }
  const BlockPoolStats& stats() const { return stats_; }

  // Called with each key the index loses (eviction for reuse, a drop),
  // before the block forgets it; not when a newer block takes a key over
  // (the key stays held). For an owner that reports what the pool holds
  // (the coordinator's CacheEventSink). Default: none.
  void set_key_dropped(std::function<void(const BlockKey&)> key_dropped) {
    key_dropped_ = std::move(key_dropped);
  }

  // Checks every invariant listed above; O(num_blocks). For tests and
  // debugging.
  Status CheckInvariants() const;

 private:
  // Keyed by XXH3-64 with this many secret bytes (XXH3's default size).
  static constexpr size_t kCheckSecretBytes = 192;
  using CheckSecret = std::array<unsigned char, kCheckSecretBytes>;
  // kArc's lists; kLru uses kReuseFirst alone.
  static constexpr int32_t kReuseFirst = 0;
  static constexpr int32_t kRecent = 1;
  static constexpr int32_t kFrequent = 2;
  // kArc's free clock: a tick is 1/kTicksPerPool of the pool's blocks
  // freed (at least one). Blocks freed more than kMaxAgeTicks ago (8 pool
  // turnovers) count as freed then; Block::freed_tick's 15 bits hold any
  // difference below 2^14 ticks.
  static constexpr uint32_t kTicksPerPool = 1024;
  static constexpr uint32_t kMaxAgeTicks = 8 * kTicksPerPool;
  static constexpr uint32_t kAgeClampTicks = 4 * kTicksPerPool;
  static constexpr uint32_t kTickMask = (1u << 15) - 1;
  static_assert(kMaxAgeTicks + kAgeClampTicks < kTickMask / 2);

  BlockPool(const BlockPoolOptions& options, const CheckSecret& secret);
  static size_t Index(BlockId id) { return static_cast<size_t>(id); }
  auto KeyOf() const {
    return [this](BlockId id) -> const BlockKey& {
      return blocks_[Index(id)].key;
    };
  }
  uint64_t TokenCheck(std::span<const TokenId> tokens) const;
  bool HoldsTokens(const Block& b, BlockId id,
                   std::span<const TokenId> tokens) const;
  void DropKey(BlockId id);
  // kArc: a free block that lost its key goes to the front of the first
  // list, out of the recent or frequent list, which hold keyed blocks only.
  void LeaveKeptLists(BlockId id);
  // The list the next victim comes from. REQUIRES: a free block.
  int32_t VictimList() const;
  // kArc's choice between the recent list's oldest block `r` and the
  // frequent list's `f` (either kNone when its list is empty, not both),
  // with `recent` blocks counted in the recent list.
  int32_t ArcVictimList(BlockId r, BlockId f, double recent) const;
  // Whether block `a` was freed before block `b`, both waiting in the
  // recent or frequent list; false within one tick.
  bool FreedBefore(BlockId a, BlockId b) const;
  // Stamps a block entering the recent or frequent list with the free
  // clock, advancing it.
  void StampFreed(Block* b);
  // Makes every free block older than kMaxAgeTicks that old. O(num_blocks),
  // once every kAgeClampTicks ticks.
  void ClampFreedTicks();
  // A second use of a keyed block: it belongs in the frequent list.
  void MarkUsedAgain(Block* b);
  // Queues a block whose ref count reached 0.
  void Enqueue(BlockId id);
  // The list `key` was evicted from (kRecent, kFrequent) within the last
  // usable_blocks_ to 3/2 x usable_blocks_ evictions (GhostKeys'
  // generations), forgetting it and adapting the recent list's
  // target as ARC does; 0 when none.
  int32_t TakeEvicted(const BlockKey& key);

  int32_t block_size_;
  bool keep_tokens_;
  std::optional<BlockId> null_block_;
  std::vector<Block> blocks_;
  // With keep_tokens: num_blocks x block_size, row per block. Else empty.
  std::vector<TokenId> tokens_;
  EvictionPolicy eviction_;
  std::function<void(const BlockKey&)> key_dropped_;
  bool uncached_first_;
  FreeBlockQueue free_queue_;
  // kArc: the recent list's target size in blocks (ARC's p). Starts at
  // the whole pool: LRU order until the ghosts say otherwise.
  double recent_target_ = 0;
  // kArc's free clock: blocks entered into the recent or frequent list,
  // and that count in ticks of free_tick_blocks_ (so a tick is a fixed
  // share of the pool, and 15 bits of ticks span many pool turnovers).
  uint64_t frees_ = 0;
  uint64_t free_tick_blocks_ = 1;
  uint32_t free_ticks_ = 0;
  // kArc's ghost lists: the evicted keys, tagged with the list each left.
  std::optional<GhostKeys> ghosts_;
  int32_t usable_blocks_ = 0;    // All but the null block.
  int32_t frequent_blocks_ = 0;  // Keyed and reused, free or in use.
  KeyIndex index_;
  // Without keep_tokens: the key of TokenCheck, unknown outside the process,
  // so whoever chooses tokens to collide with another block's key can match
  // its check only by chance (2^-64).
  CheckSecret check_secret_{};
  BlockPoolStats stats_;
};

}  // namespace tierkv

#endif  // TIERKV_SRC_BLOCK_POOL_H_
