// The shape of a pool of KV blocks that tierkv keys and recycles: the
// engine's main pool (KVCacheManager) or a chunk pool.
#ifndef TIERKV_INCLUDE_TIERKV_BLOCK_POOL_OPTIONS_H_
#define TIERKV_INCLUDE_TIERKV_BLOCK_POOL_OPTIONS_H_

#include <cstdint>

namespace tierkv {

struct BlockPoolOptions {
  int32_t num_blocks = 0;          // Including the null block. Required.
  int32_t block_size = 16;         // Tokens per block. Default: 16.
  bool reserve_null_block = true;  // Block 0 is a placeholder, as in vLLM v1.
                                   // Default: true.
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
