#include "src/block_pool.h"

#include <sys/random.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace tierkv {
namespace {

// Fills `out` from the kernel's random source (getrandom blocks only until
// the kernel's entropy pool is seeded at boot).
Status FillRandom(std::span<unsigned char> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Internal(std::string("getrandom: ") +
                              std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

std::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kArc:
      return "arc";
  }
  return "unknown";
}

StatusOr<EvictionPolicy> ParseEvictionPolicy(std::string_view name) {
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    if (name == EvictionPolicyName(p)) return p;
  }
  return Status::InvalidArgument("eviction policy must be lru or arc, got '" +
                                 std::string(name) + "'");
}

StatusOr<BlockPool> BlockPool::Create(const BlockPoolOptions& options) {
  const int32_t min_blocks = options.reserve_null_block ? 2 : 1;
  if (options.num_blocks < min_blocks) {
    return Status::InvalidArgument(
        "block pool needs at least " + std::to_string(min_blocks) +
        " blocks (with reserve_null_block=" +
        (options.reserve_null_block ? "true" : "false") + "), got " +
        std::to_string(options.num_blocks));
  }
  // The free queue's sentinels follow the blocks' ids.
  constexpr int32_t kMaxBlocks =
      std::numeric_limits<int32_t>::max() - FreeBlockQueue::kMaxLists;
  if (options.num_blocks > kMaxBlocks) {
    return Status::InvalidArgument(
        "a block pool holds at most " + std::to_string(kMaxBlocks) +
        " blocks, got " + std::to_string(options.num_blocks));
  }
  if (options.block_size < 1 || options.block_size > kMaxBlockSize) {
    return Status::InvalidArgument("block_size must be in [1, " +
                                   std::to_string(kMaxBlockSize) + "], got " +
                                   std::to_string(options.block_size));
  }
  CheckSecret secret{};
  if (!options.keep_tokens) TIERKV_RETURN_IF_ERROR(FillRandom(secret));
  return BlockPool(options, secret);
}

BlockPool::BlockPool(const BlockPoolOptions& options, const CheckSecret& secret)
    : block_size_(options.block_size),
      keep_tokens_(options.keep_tokens),
      blocks_(static_cast<size_t>(options.num_blocks)),
      tokens_(options.keep_tokens ? static_cast<size_t>(options.num_blocks) *
                                        static_cast<size_t>(options.block_size)
                                  : 0),
      eviction_(options.eviction),
      uncached_first_(options.free_uncached_first),
      free_queue_(options.num_blocks,
                  options.eviction == EvictionPolicy::kLru ? 1 : 3),
      // Under kArc the ghosts' bytes come out of the index's headroom, to
      // keep a block's metadata within a cache line.
      index_(options.num_blocks, options.eviction == EvictionPolicy::kArc),
      check_secret_(secret) {
  usable_blocks_ = options.num_blocks - (options.reserve_null_block ? 1 : 0);
  if (eviction_ == EvictionPolicy::kArc) {
    // ARC remembers as many evicted keys as the cache holds; GhostKeys
    // remembers each for at least half as many evictions.
    ghosts_.emplace(usable_blocks_);
    recent_target_ = usable_blocks_;
    free_tick_blocks_ = std::max<uint64_t>(
        1, static_cast<uint64_t>(usable_blocks_) / kTicksPerPool);
  }
  BlockId first = 0;
  if (options.reserve_null_block) {
    null_block_ = 0;
    blocks_[0].ref_cnt = 1;  // Held forever: never queued, never freed.
    first = 1;
  }
  for (BlockId id = first; id < options.num_blocks; ++id) {
    free_queue_.Append(id);
  }
}

std::span<const TokenId> BlockPool::block_tokens(BlockId id) const {
  if (!keep_tokens_) return {};
  const Block& b = block(id);
  return std::span<const TokenId>(tokens_).subspan(
      Index(id) * static_cast<size_t>(block_size_),
      static_cast<size_t>(b.num_tokens));
}

size_t BlockPool::MetadataBytes() const {
  return blocks_.size() * sizeof(Block) + tokens_.size() * sizeof(TokenId) +
         free_queue_.MemoryBytes() + index_.MemoryBytes() +
         (ghosts_.has_value() ? ghosts_->MemoryBytes() : 0);
}

uint64_t BlockPool::TokenCheck(std::span<const TokenId> tokens) const {
  return XXH3_64bits_withSecret(tokens.data(), tokens.size_bytes(),
                                check_secret_.data(), check_secret_.size());
}

bool BlockPool::HoldsTokens(const Block& b, BlockId id,
                            std::span<const TokenId> tokens) const {
  if (tokens.size() != b.num_tokens) return false;
  if (!keep_tokens_) return b.token_check == TokenCheck(tokens);
  const std::span<const TokenId> stored = block_tokens(id);
  return std::equal(stored.begin(), stored.end(), tokens.begin());
}

std::optional<BlockId> BlockPool::GetCachedBlock(
    const BlockKey& key, std::span<const TokenId> tokens) const {
  const std::optional<BlockId> id = index_.Find(key, KeyOf());
  // Same key, other tokens: a collision, a miss.
  if (!id || !HoldsTokens(blocks_[Index(*id)], *id, tokens)) {
    return std::nullopt;
  }
  return id;
}

Status BlockPool::GetNewBlocks(int32_t n, std::vector<BlockId>* out) {
  if (n < 0) return Status::InvalidArgument("negative block count");
  if (n > free_queue_.size()) {
    return Status::ResourceExhausted(
        "need " + std::to_string(n) + " free blocks, " +
        std::to_string(free_queue_.size()) + " available");
  }
  out->reserve(out->size() + static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t list = VictimList();
    const BlockId id = free_queue_.Front(list);
    free_queue_.Remove(id);
    Block& b = blocks_[Index(id)];
    assert(b.ref_cnt == 0);
    if (b.has_key()) {
      if (ghosts_.has_value() && list != kReuseFirst) {
        ghosts_->Add(b.key, static_cast<uint8_t>(list));
      }
      DropKey(id);
      ++stats_.evictions;
    }
    b.ref_cnt = 1;
    out->push_back(id);
  }
  return Status::Ok();
}

void BlockPool::Touch(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    Block& b = blocks_[Index(id)];
    if (b.ref_cnt == 0) free_queue_.Remove(id);
    ++b.ref_cnt;
    MarkUsedAgain(&b);
  }
}

void BlockPool::Pin(std::span<const BlockId> ids) {
  for (BlockId id : ids) {
    Block& b = blocks_[Index(id)];
    if (b.ref_cnt == 0) free_queue_.Remove(id);
    ++b.ref_cnt;
  }
}

bool BlockPool::MarkReused(BlockId id) {
  if (!IsValid(id) || !blocks_[Index(id)].has_key()) return false;
  MarkUsedAgain(&blocks_[Index(id)]);
  if (eviction_ != EvictionPolicy::kLru && free_queue_.Contains(id) &&
      free_queue_.ListOf(id) == kRecent) {
    free_queue_.Remove(id);
    StampFreed(&blocks_[Index(id)]);
    free_queue_.Append(id, kFrequent);
  }
  return true;
}

void BlockPool::MarkUsedAgain(Block* b) {
  if (b->has_key() && !b->reused()) {
    b->used_again = 1;
    ++frequent_blocks_;
  }
}

void BlockPool::FreeBlocks(std::span<const BlockId> ordered_ids) {
  for (BlockId id : ordered_ids) {
    if (null_block_ && id == *null_block_) continue;
    Block& b = blocks_[Index(id)];
    if (b.ref_cnt <= 0) [[unlikely]] {
      // A second free of a free block: it is queued already, and going on
      // would queue it twice, after which one slot could be handed to two
      // users. The caller's books are wrong; stop rather than serve from
      // them (in every build, not only where assert is on).
      std::fprintf(stderr, "tierkv: block %d freed while free (ref %d)\n",
                   static_cast<int>(id), static_cast<int>(b.ref_cnt));
      std::abort();
    }
    if (--b.ref_cnt == 0) Enqueue(id);
  }
}

void BlockPool::Enqueue(BlockId id) {
  const Block& b = blocks_[Index(id)];
  if (!b.has_key() && (uncached_first_ || eviction_ != EvictionPolicy::kLru)) {
    // Nothing in it can be hit (a request's partial last block, a block
    // whose key a newer one took): reused first, before any block that
    // can.
    free_queue_.PushFront(id, kReuseFirst);
  } else if (eviction_ == EvictionPolicy::kLru) {
    free_queue_.Append(id);
  } else {
    StampFreed(&blocks_[Index(id)]);
    free_queue_.Append(id, b.reused() ? kFrequent : kRecent);
  }
}

void BlockPool::StampFreed(Block* b) {
  if (++frees_ % free_tick_blocks_ == 0) {
    ++free_ticks_;
    if (free_ticks_ % kAgeClampTicks == 0) ClampFreedTicks();
  }
  b->freed_tick = free_ticks_ & kTickMask;
}

void BlockPool::ClampFreedTicks() {
  // Every waiting block older than kMaxAgeTicks is as old as the oldest
  // (they compare equal), so none is ever older than kMaxAgeTicks +
  // kAgeClampTicks < 2^14 ticks: the difference of two never wraps.
  const uint32_t oldest = (free_ticks_ - kMaxAgeTicks) & kTickMask;
  for (BlockId id = 0; id < num_blocks(); ++id) {
    Block& b = blocks_[Index(id)];
    if (b.ref_cnt == 0 &&
        ((free_ticks_ - b.freed_tick) & kTickMask) > kMaxAgeTicks) {
      b.freed_tick = oldest;
    }
  }
}

bool BlockPool::FreedBefore(BlockId a, BlockId b) const {
  const uint32_t diff =
      (blocks_[Index(b)].freed_tick - blocks_[Index(a)].freed_tick) & kTickMask;
  return diff != 0 && diff < kTickMask / 2;
}

int32_t BlockPool::VictimList() const {
  if (eviction_ == EvictionPolicy::kLru) return kReuseFirst;
  if (free_queue_.size(kReuseFirst) > 0) return kReuseFirst;
  // ARC's lists count blocks in use too: a request's fresh blocks (keyed
  // or not yet) are recent, its hits frequent; only free ones can go.
  return ArcVictimList(free_queue_.First(kRecent), free_queue_.First(kFrequent),
                       usable_blocks_ - frequent_blocks_);
}

int32_t BlockPool::ArcVictimList(BlockId r, BlockId f, double recent) const {
  if (r == FreeBlockQueue::kNone) return kFrequent;
  if (f == FreeBlockQueue::kNone) return kRecent;
  // ARC's REPLACE: the recent list gives up a block while it is over its
  // target. Otherwise ARC takes the frequent list's oldest; the pool
  // does so only when it is older than the recent list's oldest too, as
  // a block used more often and more recently is no better a victim by
  // either of ARC's measures. Ticks are coarser than one free in pools of
  // 2048 blocks and more: two blocks freed in one tick tie, and the block
  // used once goes.
  if (recent > recent_target_) return kRecent;
  return FreedBefore(f, r) ? kFrequent : kRecent;
}

int32_t BlockPool::TakeEvicted(const BlockKey& key) {
  if (!ghosts_.has_value()) return 0;
  const int32_t recent_ghosts = ghosts_->count(kRecent);
  const int32_t frequent_ghosts = ghosts_->count(kFrequent);
  const int32_t list = ghosts_->Take(key);
  if (list == 0) return 0;
  // ARC's adaptation: a key recomputed soon after leaving the recent list
  // says that list was too short, and one from the frequent list that the
  // frequent one was; each moves the recent list's target by the ratio of
  // the ghost lists' sizes, at least one block.
  if (list == kRecent) {
    recent_target_ = std::min<double>(
        usable_blocks_,
        recent_target_ + std::max(1.0, static_cast<double>(frequent_ghosts) /
                                           recent_ghosts));
  } else {
    recent_target_ = std::max(
        0.0, recent_target_ - std::max(1.0, static_cast<double>(recent_ghosts) /
                                                frequent_ghosts));
  }
  return list;
}

Status BlockPool::CacheBlock(BlockId id, const BlockKey& key,
                             std::span<const TokenId> tokens) {
  if (!IsValid(id) || (null_block_ && id == *null_block_)) {
    return Status::InvalidArgument("cannot key block " + std::to_string(id));
  }
  Block& b = blocks_[Index(id)];
  if (b.ref_cnt == 0) {
    return Status::InvalidArgument("block " + std::to_string(id) +
                                   " is free; only in-use blocks are keyed");
  }
  if (b.has_key()) {
    return Status::InvalidArgument("block " + std::to_string(id) +
                                   " is already keyed");
  }
  if (tokens.empty() || tokens.size() > static_cast<size_t>(block_size_)) {
    return Status::InvalidArgument(
        "a block holds 1.." + std::to_string(block_size_) + " tokens, got " +
        std::to_string(tokens.size()));
  }
  // The key's standing with the policy: a copy that was used again hands
  // it to the newer one; a key computed again soon after its eviction
  // earns it (a second use).
  bool reused = false;
  if (const std::optional<BlockId> older = index_.Insert(key, id, KeyOf())) {
    // The newer block takes the key; the older copy stays valid KV but is
    // no longer findable.
    Block& o = blocks_[Index(*older)];
    reused = o.reused();
    if (o.reused()) --frequent_blocks_;
    o.num_tokens = 0;
    o.used_again = 0;
    LeaveKeptLists(*older);
  } else {
    reused = TakeEvicted(key) != 0;
  }
  b.key = key;
  b.num_tokens = static_cast<uint16_t>(tokens.size());
  b.used_again = reused ? 1 : 0;
  if (reused) ++frequent_blocks_;
  if (keep_tokens_) {
    std::copy(
        tokens.begin(), tokens.end(),
        tokens_.begin() + static_cast<std::ptrdiff_t>(
                              Index(id) * static_cast<size_t>(block_size_)));
  } else {
    b.token_check = TokenCheck(tokens);
  }
  return Status::Ok();
}

Status BlockPool::CacheFullBlocks(std::span<const BlockId> blocks,
                                  std::span<const BlockKey> keys,
                                  std::span<const TokenId> tokens,
                                  int32_t num_cached_blocks,
                                  int32_t num_full_blocks) {
  const auto bs = static_cast<size_t>(block_size_);
  const auto full = static_cast<size_t>(num_full_blocks);
  if (num_cached_blocks < 0 || num_cached_blocks > num_full_blocks ||
      full > blocks.size() || full > keys.size() || full * bs > tokens.size()) {
    return Status::OutOfRange(
        "cannot key blocks [" + std::to_string(num_cached_blocks) + ", " +
        std::to_string(num_full_blocks) + ") of a request with " +
        std::to_string(blocks.size()) + " blocks, " +
        std::to_string(keys.size()) + " keys and " +
        std::to_string(tokens.size()) + " tokens");
  }
  for (size_t i = static_cast<size_t>(num_cached_blocks); i < full; ++i) {
    TIERKV_RETURN_IF_ERROR(
        CacheBlock(blocks[i], keys[i], tokens.subspan(i * bs, bs)));
  }
  return Status::Ok();
}

bool BlockPool::EvictCachedBlock(BlockId id) {
  if (!IsValid(id)) return false;
  const Block& b = blocks_[Index(id)];
  if (b.ref_cnt != 0 || !b.has_key()) return false;
  DropKey(id);
  ++stats_.evictions;
  return true;
}

bool BlockPool::DemoteCachedBlock(BlockId id) { return DropCachedBlock(id); }

bool BlockPool::ReturnNewBlock(BlockId id) {
  if (!IsValid(id) || (null_block_ && id == *null_block_)) return false;
  Block& b = blocks_[Index(id)];
  if (b.ref_cnt != 1 || b.has_key()) return false;
  b.ref_cnt = 0;
  free_queue_.PushFront(id);
  return true;
}

bool BlockPool::DropCachedBlock(BlockId id) {
  if (!IsValid(id)) return false;
  const Block& b = blocks_[Index(id)];
  if (b.ref_cnt != 0 || !b.has_key()) return false;
  DropKey(id);
  free_queue_.Remove(id);
  free_queue_.PushFront(id);
  return true;
}

bool BlockPool::MoveToFront(BlockId id) {
  // The null block's ref count never reaches 0.
  if (!IsValid(id) || blocks_[Index(id)].ref_cnt != 0) return false;
  Block& b = blocks_[Index(id)];
  // Next to go, it is no longer among ARC's frequent blocks (a hit before
  // then makes it one again).
  if (b.reused()) --frequent_blocks_;
  b.used_again = 0;
  free_queue_.Remove(id);
  free_queue_.PushFront(id);
  return true;
}

std::optional<BlockId> BlockPool::FindKeyedBlock(const BlockKey& key) const {
  return index_.Find(key, KeyOf());
}

void BlockPool::DropKey(BlockId id) {
  Block& b = blocks_[Index(id)];
  const bool erased = index_.Erase(b.key, id);
  assert(erased);
  (void)erased;
  if (key_dropped_) key_dropped_(b.key);
  b.num_tokens = 0;
  if (b.reused()) --frequent_blocks_;
  b.used_again = 0;
  LeaveKeptLists(id);
}

void BlockPool::LeaveKeptLists(BlockId id) {
  if (!free_queue_.Contains(id)) return;
  if (eviction_ == EvictionPolicy::kLru) {
    // One list: to its front when keyless blocks are reused first, as
    // Enqueue puts them.
    if (!uncached_first_) return;
  } else if (free_queue_.ListOf(id) == kReuseFirst) {
    return;
  }
  free_queue_.Remove(id);
  free_queue_.PushFront(id, kReuseFirst);
}

Status BlockPool::CheckInvariants() const {
  int32_t zero_ref = 0;
  int32_t frequent = 0;
  size_t keyed = 0;
  for (BlockId id = 0; id < num_blocks(); ++id) {
    const Block& b = block(id);
    const std::string where = "block " + std::to_string(id) + ": ";
    if (b.ref_cnt < 0) return Status::Internal(where + "negative ref count");
    const bool is_null = null_block_ && id == *null_block_;
    if (is_null && (free_queue_.Contains(id) || b.has_key())) {
      return Status::Internal(where + "null block is queued or keyed");
    }
    if (!is_null && (b.ref_cnt == 0) != free_queue_.Contains(id)) {
      return Status::Internal(
          where + "ref count " + std::to_string(b.ref_cnt) +
          (free_queue_.Contains(id) ? " but queued" : " but not queued"));
    }
    if (b.ref_cnt == 0) ++zero_ref;
    if (b.has_key() && b.reused()) ++frequent;
    if (eviction_ != EvictionPolicy::kLru && !is_null && b.ref_cnt == 0) {
      // Keyed blocks wait in the list of their use, unless moved to the
      // front (their contents are on a lower tier too); others go first.
      const int32_t list = free_queue_.ListOf(id);
      const int32_t want = !b.has_key() ? kReuseFirst
                           : b.reused() ? kFrequent
                                        : kRecent;
      if (list != want && !(b.has_key() && list == kReuseFirst)) {
        return Status::Internal(where + "in free list " + std::to_string(list) +
                                ", not " + std::to_string(want));
      }
    }
    if (b.has_key()) {
      ++keyed;
      if (index_.Find(b.key, KeyOf()) != id) {
        return Status::Internal(where +
                                "holds a key the index does not map "
                                "to it");
      }
    }
  }
  Status mapped = Status::Ok();
  index_.ForEach([&](BlockId id) {
    if (mapped.ok() && (!IsValid(id) || !block(id).has_key())) {
      mapped = Status::Internal("index maps a key to block " +
                                std::to_string(id) + " which holds none");
    }
  });
  TIERKV_RETURN_IF_ERROR(mapped);
  if (keyed != index_.size()) return Status::Internal("index size mismatch");
  if (frequent != frequent_blocks_) {
    return Status::Internal(std::to_string(frequent) +
                            " keyed blocks used again, counted " +
                            std::to_string(frequent_blocks_));
  }
  if (zero_ref != free_queue_.size()) {
    return Status::Internal("free queue holds " +
                            std::to_string(free_queue_.size()) + " blocks, " +
                            std::to_string(zero_ref) + " have ref count 0");
  }
  return Status::Ok();
}

}  // namespace tierkv
