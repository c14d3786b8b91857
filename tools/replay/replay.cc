#include "tools/replay/replay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "src/block_pool.h"
#include "tiers/disk_internal.h"
#include "tiers/tiered_store.h"

namespace tierkv::replay {
namespace {

using Clock = std::chrono::steady_clock;

// Reports progress about every this many requests.
constexpr int64_t kProgressEvery = 64;

// SplitMix64's finaliser: token ids that differ for every hash id and
// place, with no pattern a hash could favour.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A vocabulary the size of Llama 2's.
constexpr uint64_t kVocabulary = 32000;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

StatusOr<BlockTrace> BlockTrace::Build(std::span<const TraceRequest> requests,
                                       const ReplayOptions& options) {
  if (options.block_tokens < 1 || options.trace_block_tokens < 1 ||
      options.trace_block_tokens % options.block_tokens != 0) {
    return Status::InvalidArgument(
        "the block size (" + std::to_string(options.block_tokens) +
        " tokens) must divide the trace's (" +
        std::to_string(options.trace_block_tokens) + ")");
  }
  BlockTrace t;
  t.block_tokens_ = options.block_tokens;
  t.subblocks_ = options.trace_block_tokens / options.block_tokens;
  t.offsets_.reserve(requests.size() + 1);
  t.offsets_.push_back(0);
  t.tails_.reserve(requests.size());
  // Each request's full blocks, and whether a partial one ends its prompt.
  // The hash ids bound the prompt: tokens past them are not known.
  std::vector<std::pair<int64_t, bool>> shapes;
  shapes.reserve(requests.size());
  size_t total = 0;
  for (const TraceRequest& r : requests) {
    const auto covered =
        static_cast<int64_t>(r.hash_ids.size()) * options.trace_block_tokens;
    const int64_t prompt =
        r.input_length == 0 ? covered : std::min(r.input_length, covered);
    shapes.emplace_back(prompt / t.block_tokens_,
                        prompt % t.block_tokens_ != 0);
    total += static_cast<size_t>(shapes.back().first);
  }
  if (total == 0) {
    return Status::InvalidArgument(
        "the trace has no full blocks: every prompt is shorter than one "
        "block of " +
        std::to_string(t.block_tokens_) + " tokens");
  }
  if (total > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("the trace has too many blocks");
  }
  t.keys_.reserve(total);
  t.dense_.reserve(total);
  t.seeds_.reserve(total);
  const KeyHasher hasher(
      KeyNamespace{.model_fingerprint = "tierkv-replay", .tenant = ""});
  std::unordered_map<BlockKey, int32_t, BlockKeyHash> ids;
  std::vector<TokenId> tokens(static_cast<size_t>(t.block_tokens_));
  for (size_t q = 0; q < requests.size(); ++q) {
    const TraceRequest& r = requests[q];
    const auto [full, tail] = shapes[q];
    BlockKey parent = hasher.sequence_root();
    for (int64_t b = 0; b < full; ++b) {
      const auto hash_id = static_cast<uint64_t>(
          r.hash_ids[static_cast<size_t>(b / t.subblocks_)]);
      const auto sub = static_cast<uint64_t>(b % t.subblocks_);
      const auto i = static_cast<int64_t>(t.seeds_.size());
      t.seeds_.push_back(Mix(hash_id * 0x9e3779b97f4a7c15ULL + sub));
      t.Tokens(i, tokens);
      parent = KeyHasher::HashBlock(parent, tokens);
      t.keys_.push_back(parent);
      const auto [it, inserted] =
          ids.try_emplace(parent, static_cast<int32_t>(ids.size()));
      t.dense_.push_back(it->second);
    }
    t.offsets_.push_back(static_cast<int64_t>(t.keys_.size()));
    t.tails_.push_back(tail ? 1 : 0);
    t.largest_request_ = std::max(t.largest_request_,
                                  static_cast<int32_t>(full + (tail ? 1 : 0)));
  }
  t.unique_blocks_ = static_cast<int64_t>(ids.size());
  return t;
}

void BlockTrace::Tokens(int64_t i, std::span<TokenId> out) const {
  const uint64_t base = seeds_[static_cast<size_t>(i)];
  for (size_t j = 0; j < out.size(); ++j) {
    out[j] = static_cast<TokenId>(Mix(base + j) % kVocabulary);
  }
}

StatusOr<ReplayResult> ReplayPool(const BlockTrace& trace,
                                  int32_t capacity_blocks,
                                  EvictionPolicy policy,
                                  const ReplayProgress& progress) {
  return ReplayTiers(trace, capacity_blocks, 0, policy, progress);
}

StatusOr<ReplayResult> ReplayTiers(const BlockTrace& trace,
                                   int32_t capacity_blocks, int32_t disk_blocks,
                                   EvictionPolicy policy,
                                   const ReplayProgress& progress) {
  if (disk_blocks < 0) {
    return Status::InvalidArgument("a disk tier of at least 0 blocks");
  }
  if (capacity_blocks < 1 ||
      capacity_blocks == std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("a cache of 1 to 2^31 - 2 blocks");
  }
  // Made as tierkvd's host pool is: block 0 the null block, blocks without
  // a key reused first, a token check instead of a copy of the tokens.
  TIERKV_ASSIGN_OR_RETURN(BlockPool pool,
                          BlockPool::Create({.num_blocks = capacity_blocks + 1,
                                             .block_size = trace.block_tokens(),
                                             .reserve_null_block = true,
                                             .eviction = policy,
                                             .free_uncached_first = true,
                                             .keep_tokens = false}));
  ReplayResult result;
  result.capacity_blocks = capacity_blocks;
  result.requested_blocks = trace.requested_blocks();
  std::vector<TokenId> tokens(static_cast<size_t>(trace.block_tokens()));
  std::vector<BlockId> blocks;
  std::vector<BlockId> fresh;
  // The disk tier's index, each block one unit of its bound; the tokens
  // are not kept (the keys alone tell blocks apart here).
  std::optional<disk_internal::DiskIndex> disk;
  uint64_t disk_writes = 0;
  std::vector<BlockKey> disk_victims;
  auto write_to_disk = [&](const BlockKey& key) -> Status {
    if (!disk.has_value() || disk->FindStored(key) != nullptr) {
      return Status::Ok();
    }
    disk_victims.clear();
    TIERKV_ASSIGN_OR_RETURN(
        const bool reserved,
        disk->Reserve(key, ++disk_writes, 1, {}, &disk_victims));
    if (!reserved || !disk->Commit(key, disk_writes, {})) {
      return Status::Internal("the disk index refused a write");
    }
    return Status::Ok();
  };
  Status spilled = Status::Ok();
  // tierkvd's spill watermarks, as its options default them.
  double spill_high = 0;
  double spill_low = 0;
  if (disk_blocks > 0) {
    const TieredStoreOptions defaults;
    spill_high = defaults.spill_high;
    spill_low = defaults.spill_low;
    disk.emplace(static_cast<uint64_t>(disk_blocks), nullptr,
                 trace.block_tokens(), policy, 1);
    // A block the host evicts goes to disk, or, when the disk holds it,
    // becomes the disk's most recently used (LowerTier::HostDropped).
    pool.set_key_dropped([&](const BlockKey& key) {
      if (disk->FindStored(key) != nullptr) {
        disk->Renew(key);
      } else if (spilled.ok()) {
        spilled = write_to_disk(key);
      }
    });
  }
  const Clock::time_point start = Clock::now();
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    const int64_t begin = trace.begin(r);
    const int64_t end = trace.end(r);
    if (trace.held(r) > capacity_blocks) {
      // It cannot be held at once: served from nothing, the cache
      // untouched (as by the optimum).
      ++result.oversized_requests;
      continue;
    }
    blocks.clear();
    for (int64_t i = begin; i < end; ++i) {
      trace.Tokens(i, tokens);
      const std::optional<BlockId> hit =
          pool.GetCachedBlock(trace.key(i), tokens);
      if (!hit.has_value()) break;
      blocks.push_back(*hit);
    }
    pool.Touch(blocks);
    const auto hits = static_cast<int64_t>(blocks.size());
    // The prefix goes on from disk: each block found there is read
    // (promoted) before the request's new blocks take room.
    int64_t promoted = 0;
    if (disk.has_value()) {
      for (int64_t i = begin + hits; i < end; ++i) {
        if (disk->FindStored(trace.key(i)) == nullptr) break;
        disk->Touch(trace.key(i));
        ++promoted;
      }
    }
    fresh.clear();
    // Nothing else is pinned, so a request that fits always finds room.
    // The partial block, if any, is the last: never keyed.
    TIERKV_RETURN_IF_ERROR(pool.GetNewBlocks(
        static_cast<int32_t>(end - begin - hits + trace.tail(r)), &fresh));
    TIERKV_RETURN_IF_ERROR(spilled);
    result.hit_blocks += hits + promoted;
    result.disk_hit_blocks += promoted;
    for (size_t j = 0; j + static_cast<size_t>(trace.tail(r)) < fresh.size();
         ++j) {
      const int64_t i = begin + hits + static_cast<int64_t>(j);
      trace.Tokens(i, tokens);
      TIERKV_RETURN_IF_ERROR(pool.CacheBlock(fresh[j], trace.key(i), tokens));
      if (static_cast<int64_t>(j) < promoted) {
        pool.MarkReused(fresh[j]);  // A use, found in a lower tier.
      } else {
        TIERKV_RETURN_IF_ERROR(write_to_disk(trace.key(i)));  // Write-behind.
      }
    }
    blocks.insert(blocks.end(), fresh.begin(), fresh.end());
    std::reverse(blocks.begin(), blocks.end());  // Tail first, as vLLM.
    pool.FreeBlocks(blocks);
    if (disk.has_value()) {
      // tierkvd's spill watermarks (Coordinator::MaybeSpill): past the high
      // one, the host's next victims go down to the low one, dropped when
      // the disk holds them (renewed there), written there first if not.
      const auto cached = static_cast<int64_t>(pool.num_cached_blocks());
      if (cached > static_cast<int64_t>(spill_high * capacity_blocks)) {
        const int64_t excess =
            cached - static_cast<int64_t>(spill_low * capacity_blocks);
        blocks.clear();
        pool.VisitFreeQueue([&](BlockId id) {
          if (pool.block(id).has_key()) blocks.push_back(id);
          return static_cast<int64_t>(blocks.size()) < excess;
        });
        for (const BlockId id : blocks) {
          TIERKV_RETURN_IF_ERROR(write_to_disk(pool.block(id).key));
          pool.DemoteCachedBlock(id);
        }
        TIERKV_RETURN_IF_ERROR(spilled);
      }
    }
    if (progress && r % kProgressEvery == 0) progress(r);
  }
  result.seconds = Seconds(Clock::now() - start);
  result.evictions = static_cast<int64_t>(pool.stats().evictions);
  if (disk.has_value()) {
    result.disk_evictions = static_cast<int64_t>(disk->evictions());
  }
  if (progress) progress(trace.num_requests());
  return result;
}

StatusOr<ReplayResult> ReplayOptimum(const BlockTrace& trace,
                                     int32_t capacity_blocks,
                                     const ReplayProgress& progress,
                                     int32_t skip_above) {
  if (capacity_blocks < 1) {
    return Status::InvalidArgument("a cache needs at least one block");
  }
  if (skip_above < 0 || skip_above > capacity_blocks) {
    return Status::InvalidArgument(
        "skip requests above 0 to " + std::to_string(capacity_blocks) +
        " blocks, not " + std::to_string(skip_above));
  }
  const int64_t largest = skip_above == 0 ? capacity_blocks : skip_above;
  constexpr int64_t kNever = std::numeric_limits<int32_t>::max();
  // next_use[i]: the next request that uses requested block i's block.
  std::vector<int32_t> next_use(static_cast<size_t>(trace.requested_blocks()));
  {
    std::vector<int32_t> seen(static_cast<size_t>(trace.unique_blocks()),
                              static_cast<int32_t>(kNever));
    for (int64_t r = trace.num_requests() - 1; r >= 0; --r) {
      if (trace.held(r) > largest) continue;
      for (int64_t i = trace.begin(r); i < trace.end(r); ++i) {
        const auto b = static_cast<size_t>(trace.block(i));
        next_use[static_cast<size_t>(i)] = seen[b];
        seen[b] = static_cast<int32_t>(r);
      }
    }
  }
  // Eviction order: furthest next use first, then the deepest block; the
  // rank packs both, the depth in the low kDepthBits.
  constexpr int kDepthBits = 24;
  if (trace.largest_request() >= (1 << kDepthBits)) {
    return Status::InvalidArgument("a request of over 16 M blocks");
  }
  struct Cached {
    bool present = false;
    int64_t rank = 0;
  };
  std::vector<Cached> cached(static_cast<size_t>(trace.unique_blocks()));
  std::set<std::pair<int64_t, int32_t>> evictable;  // (rank, block).
  ReplayResult result;
  result.capacity_blocks = capacity_blocks;
  result.requested_blocks = trace.requested_blocks();
  int64_t resident = 0;
  const Clock::time_point start = Clock::now();
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    const int64_t begin = trace.begin(r);
    const int64_t end = trace.end(r);
    if (trace.held(r) > largest) {
      ++result.oversized_requests;  // As in the pool: skipped, no change.
      continue;
    }
    int64_t hits = 0;
    while (begin + hits < end &&
           cached[static_cast<size_t>(trace.block(begin + hits))].present) {
      ++hits;
    }
    // Pin what the request holds; count what it must add (its partial
    // block too, for as long as it runs).
    int64_t missing = trace.tail(r);
    for (int64_t i = begin; i < end; ++i) {
      Cached& c = cached[static_cast<size_t>(trace.block(i))];
      if (c.present) {
        evictable.erase({c.rank, trace.block(i)});
      } else {
        ++missing;
      }
    }
    while (resident + missing > capacity_blocks && !evictable.empty()) {
      const auto victim = std::prev(evictable.end());
      cached[static_cast<size_t>(victim->second)].present = false;
      evictable.erase(victim);
      --resident;
      ++result.evictions;
    }
    result.hit_blocks += hits;
    for (int64_t i = begin; i < end; ++i) {
      const int32_t b = trace.block(i);
      Cached& c = cached[static_cast<size_t>(b)];
      const int64_t next = next_use[static_cast<size_t>(i)];
      if (next == kNever) {
        // Never used again: bypassed.
        if (c.present) {
          c.present = false;
          --resident;
        }
        continue;
      }
      if (!c.present) {
        c.present = true;
        ++resident;
      }
      c.rank = (next << kDepthBits) | (i - begin);
      evictable.insert({c.rank, b});
    }
    if (progress && r % kProgressEvery == 0) progress(r);
  }
  result.seconds = Seconds(Clock::now() - start);
  if (progress) progress(trace.num_requests());
  return result;
}

}  // namespace tierkv::replay
