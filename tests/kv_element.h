// One stored KV element read back as a float, for tests that compare cached
// K or V with what they expect.
#ifndef TIERKV_TESTS_KV_ELEMENT_H_
#define TIERKV_TESTS_KV_ELEMENT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "src/rope_remap.h"
#include "tierkv/kv_layout.h"

namespace tierkv {

// The element of dtype `d` at `p` (f32, f16 or bf16), as a float.
inline float LoadKvElement(DType d, const std::byte* p) {
  if (d == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kF16 ? internal::HalfToFloat(h) : internal::Bf16ToFloat(h);
}

}  // namespace tierkv

#endif  // TIERKV_TESTS_KV_ELEMENT_H_
