// The bytes of a test KV block, a function of the block's first token, so
// a process can check a block that another process stored.
#ifndef TIERKV_TESTS_BLOCK_PATTERN_H_
#define TIERKV_TESTS_BLOCK_PATTERN_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "tierkv/block_key.h"

namespace tierkv {

// The tokens of request `request` (of `blocks` 16-token blocks) that
// tierkv_test_worker's fill, verify and churn modes store under `seed`.
inline std::vector<TokenId> FillRequestTokens(uint32_t seed, int32_t request,
                                              int32_t blocks) {
  std::vector<TokenId> t(static_cast<size_t>(blocks) * 16);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = (seed * 1000003u + static_cast<uint32_t>(request) * 4099u) * 16u +
           static_cast<uint32_t>(i);
  }
  return t;
}

// The prompt of `blocks` 16-token blocks that tierkv_test_worker's store
// and load modes use under `seed`.
inline std::vector<TokenId> StorePrompt(uint32_t seed, int32_t blocks) {
  std::vector<TokenId> t(static_cast<size_t>(blocks) * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 100003u + i * 7u + 1u;
  return t;
}

// Fills `bytes` with an xorshift stream seeded by `first`.
inline void FillBlock(TokenId first, std::span<std::byte> bytes) {
  uint64_t x = first * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, std::min<size_t>(8, bytes.size() - i));
  }
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_BLOCK_PATTERN_H_
