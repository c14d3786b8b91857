// Token ids for tests: n consecutive ids starting at `first`.
#ifndef TIERKV_TESTS_SEQUENTIAL_TOKENS_H_
#define TIERKV_TESTS_SEQUENTIAL_TOKENS_H_

#include <numeric>
#include <vector>

#include "tierkv/block_key.h"

namespace tierkv {

inline std::vector<TokenId> SequentialTokens(TokenId first, int n) {
  std::vector<TokenId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_SEQUENTIAL_TOKENS_H_
