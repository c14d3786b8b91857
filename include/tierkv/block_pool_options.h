// The shape of a pool of KV blocks that tierkv keys and recycles: the
// engine's main pool (KVCacheManager), a chunk pool, or tierkvd's host
// tier.
#ifndef TIERKV_INCLUDE_TIERKV_BLOCK_POOL_OPTIONS_H_
#define TIERKV_INCLUDE_TIERKV_BLOCK_POOL_OPTIONS_H_

#include <cstdint>
#include <string_view>

#include "tierkv/status.h"

namespace tierkv {

// Which free block a pool reuses (evicts) first.
enum class EvictionPolicy : uint8_t {
  // The least recently freed: vLLM's free queue, exactly.
  kLru,
  // Adaptive Replacement Cache (Megiddo and Modha, FAST 2003), over a
  // pool whose blocks in use are in no list: keyed blocks used once wait
  // in a recent list, blocks used again in a frequent one, and the recent
  // list's share adapts to which of the two lost the keys that come back.
  // It starts in LRU order (to within 1/1024 of the pool's frees) and
  // never evicts a reused block freed no earlier than the oldest block used
  // once; once reused blocks come back after eviction,
  // blocks used once (most of a real trace's) leave before them.
  kArc,
};

// What tierkvd's tiers use unless told otherwise: the policy with the best
// hit ratio measured on real traces (BENCHMARKS.md, "Eviction").
inline constexpr EvictionPolicy kDefaultTierEviction = EvictionPolicy::kArc;

// "lru" or "arc".
std::string_view EvictionPolicyName(EvictionPolicy policy);
// The inverse of EvictionPolicyName; InvalidArgument naming the choices.
StatusOr<EvictionPolicy> ParseEvictionPolicy(std::string_view name);

struct BlockPoolOptions {
  int32_t num_blocks = 0;          // Including the null block. Required.
  int32_t block_size = 16;         // Tokens per block. Default: 16.
  bool reserve_null_block = true;  // Block 0 is a placeholder, as in vLLM v1.
                                   // Default: true.
  // Default: kLru, vLLM's order (the engine's pool keeps it exactly).
  EvictionPolicy eviction = EvictionPolicy::kLru;
  // A freed block that holds no key (a request's partial last block) goes
  // to the front of the free queue, to be reused before any block that can
  // still be hit, rather than to the tail, where vLLM puts it and where it
  // keeps a cached block from its slot until the queue comes round. Always
  // so under kArc. Default: false, vLLM's order.
  bool free_uncached_first = false;
  // Whether the pool keeps a copy of each keyed block's token ids, so a hit
  // compares them and block_tokens() returns them. When false, the pool
  // keeps instead a 64-bit hash of each block's tokens under a secret drawn
  // at Create (a check independent of the key), so its metadata does not
  // grow with block_size; a key collision is still a miss unless the check
  // collides too. For a pool whose owner keeps the tokens with the payload.
  // Default: true.
  bool keep_tokens = true;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_BLOCK_POOL_OPTIONS_H_
