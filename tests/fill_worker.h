// What tests know of the fill, verify and churn workers
// (tests/worker_main.cc): the tally on their last line ("blocks N hit H
// missed M wrong W") and the keys of the one-block requests they make.
#ifndef TIERKV_TESTS_FILL_WORKER_H_
#define TIERKV_TESTS_FILL_WORKER_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/test_layout.h"
#include "tierkv/block_key.h"

namespace tierkv {

struct Tally {
  long long blocks = -1, hit = -1, missed = -1, wrong = -1;
};

// The tally in a worker's output; every field -1 when there is none.
inline Tally ParseTally(const std::string& output) {
  Tally t;
  const size_t at = output.find("blocks ");
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at,
                "blocks %lld hit %lld missed %lld wrong %lld", &t.blocks,
                &t.hit, &t.missed, &t.wrong);
  }
  return t;
}

// The key of fill/verify's one-block request `r` of `seed` (worker_main.cc
// derives the tokens the same way), as tierkv-admin evict takes it.
inline std::string FillKeyHex(uint32_t seed, uint32_t r) {
  std::vector<TokenId> tokens(16);
  for (uint32_t i = 0; i < 16; ++i) {
    tokens[i] = (seed * 1000003u + r * 4099u) * 16u + i;
  }
  const KeyHasher hasher(
      {.model_fingerprint = TestLayout().Fingerprint(), .tenant = ""});
  std::vector<BlockKey> keys;
  hasher.AppendPrefixKeys(tokens, 16, {}, &keys);
  return keys.at(0).ToHex();
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_FILL_WORKER_H_
