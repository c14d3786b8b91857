// Replays a request trace (tools/replay/trace.h) through tierkv's BlockPool,
// the eviction code of tierkvd's host tier, and computes the offline
// optimum for the same cache sizes, so a policy's hit ratio can be read as
// a share of what any policy could reach on that trace.
//
// The model of one request: look up the longest cached prefix of its full
// blocks (a hit counts only up to the first miss, as in an engine's prefix
// cache), pin those, allocate and key a block for each of the rest, and
// one more, never keyed, for a prompt that ends inside a block (its
// partial last block: an engine keys full blocks only), then free them
// all, tail first. A request larger than the cache is counted and skipped,
// by the pool and the optimum alike: served from nothing, the cache
// untouched.
#ifndef TIERKV_TOOLS_REPLAY_REPLAY_H_
#define TIERKV_TOOLS_REPLAY_REPLAY_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tierkv/block_key.h"
#include "tierkv/block_pool_options.h"
#include "tierkv/status.h"
#include "tools/replay/trace.h"

namespace tierkv::replay {

struct ReplayOptions {
  // Tokens each of a trace's hash ids stands for. Default: 512, the
  // published traces' block.
  int32_t trace_block_tokens = 512;
  // Tokens per cached block; divides trace_block_tokens (each hash id then
  // becomes trace_block_tokens / block_tokens blocks). Default: 512.
  int32_t block_tokens = 512;
};

// A trace as blocks: each request's chained keys, computed once. A
// request's prompt is its input_length tokens: its full blocks are keyed,
// a last partial block is not (tail), and blocks of its hash ids past the
// prompt are not requested. A request without an input_length (0) fills
// its hash ids, every block full.
class BlockTrace {
 public:
  // InvalidArgument for block sizes that do not divide, or an empty trace.
  static StatusOr<BlockTrace> Build(std::span<const TraceRequest> requests,
                                    const ReplayOptions& options);

  int64_t num_requests() const {
    return static_cast<int64_t>(offsets_.size()) - 1;
  }
  int64_t requested_blocks() const {
    return static_cast<int64_t>(keys_.size());
  }
  int64_t unique_blocks() const { return unique_blocks_; }
  int32_t block_tokens() const { return block_tokens_; }
  // The most blocks one request holds at once, its partial block included.
  int32_t largest_request() const { return largest_request_; }

  // Request r's blocks [begin, end) in the flat arrays below.
  int64_t begin(int64_t r) const { return offsets_[static_cast<size_t>(r)]; }
  int64_t end(int64_t r) const { return offsets_[static_cast<size_t>(r) + 1]; }
  // 1 when request r's prompt ends inside a block: that block is allocated
  // for the request but never keyed. 0 otherwise.
  int32_t tail(int64_t r) const { return tails_[static_cast<size_t>(r)]; }
  // The blocks request r holds while it runs: its full ones and its tail.
  int64_t held(int64_t r) const { return end(r) - begin(r) + tail(r); }
  const BlockKey& key(int64_t i) const { return keys_[static_cast<size_t>(i)]; }
  // The block's id among the trace's distinct blocks, [0, unique_blocks).
  int32_t block(int64_t i) const { return dense_[static_cast<size_t>(i)]; }
  // The block's token ids (derived from its hash id and place in it) into
  // `out`, which must hold block_tokens().
  void Tokens(int64_t i, std::span<TokenId> out) const;

 private:
  int32_t block_tokens_ = 0;
  int32_t subblocks_ = 0;  // Blocks per hash id.
  int64_t unique_blocks_ = 0;
  int32_t largest_request_ = 0;
  std::vector<int64_t> offsets_;  // num_requests + 1.
  std::vector<uint8_t> tails_;    // num_requests.
  std::vector<BlockKey> keys_;    // One per requested block.
  std::vector<int32_t> dense_;    // One per requested block.
  // One per requested block: its hash id and place in it, mixed (the seed
  // of its token ids).
  std::vector<uint64_t> seeds_;
};

struct ReplayResult {
  int32_t capacity_blocks = 0;
  int64_t requested_blocks = 0;  // Full blocks: what a hit could serve.
  int64_t hit_blocks = 0;        // Prefix hits, in any tier.
  int64_t evictions = 0;         // Keyed blocks dropped for room.
  // With a disk tier (ReplayTiers): of hit_blocks, those found on disk
  // (promoted), and the disk's evictions for room.
  int64_t disk_hit_blocks = 0;
  int64_t disk_evictions = 0;
  int64_t oversized_requests = 0;  // Larger than the cache: skipped.
  double seconds = 0;              // The replay alone.

  double hit_ratio() const {
    return requested_blocks == 0 ? 0
                                 : static_cast<double>(hit_blocks) /
                                       static_cast<double>(requested_blocks);
  }
};

// Called with the requests done so far, now and then, and at the end.
using ReplayProgress = std::function<void(int64_t done)>;

// The trace through a BlockPool of `capacity_blocks` usable blocks under
// `policy`. InvalidArgument for a capacity below 1.
StatusOr<ReplayResult> ReplayPool(const BlockTrace& trace,
                                  int32_t capacity_blocks,
                                  EvictionPolicy policy,
                                  const ReplayProgress& progress = {});

// The trace through a host pool of `host_blocks` over a disk tier of
// `disk_blocks`, both evicting by `policy`, as tierkvd runs them: the
// host pool is ReplayPool's; the disk is the disk tier's index
// (DiskTierOptions::eviction), each block one unit of its bound. A request
// looks up its longest prefix on host, then continues it on disk: each
// block found there is promoted (a read of it on disk, a use on host). Its
// other blocks are computed, and each is written to disk at once
// (write-behind). A block the host evicts is renewed on disk when the disk
// holds it (LowerTier::HostDropped), else written there (a spill); and
// past tierkvd's high spill watermark (TieredStoreOptions::spill_high) the
// host lets its next victims go the same way, down to the low one. With no
// disk (0 blocks), ReplayPool.
StatusOr<ReplayResult> ReplayTiers(const BlockTrace& trace, int32_t host_blocks,
                                   int32_t disk_blocks, EvictionPolicy policy,
                                   const ReplayProgress& progress = {});

// The offline optimum for the same model (Belady with bypass): when room
// is needed, evict the cached block whose next use is furthest away (a
// block never used again first); of two used next by the same request, the
// deeper one, so the cache always holds whole prefixes and every cached
// block of a request is a prefix hit. Its evictions are those it made.
// A request holding more than `skip_above` blocks is skipped (0: more than
// the capacity): the bound of a two-tier replay skips what its host could
// not hold, as ReplayTiers does.
StatusOr<ReplayResult> ReplayOptimum(const BlockTrace& trace,
                                     int32_t capacity_blocks,
                                     const ReplayProgress& progress = {},
                                     int32_t skip_above = 0);

}  // namespace tierkv::replay

#endif  // TIERKV_TOOLS_REPLAY_REPLAY_H_
