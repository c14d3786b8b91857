// The small KV layout the multi-process tests use: 2 layers, 2 KV heads,
// head dim 64, 16-token blocks, bf16 (16 KiB per block).
#ifndef TIERKV_TESTS_TEST_LAYOUT_H_
#define TIERKV_TESTS_TEST_LAYOUT_H_

#include "tierkv/kv_layout.h"

namespace tierkv {

inline KvLayout TestLayout() {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .block_size = 16,
                  .dtype = DType::kBF16};
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_TEST_LAYOUT_H_
