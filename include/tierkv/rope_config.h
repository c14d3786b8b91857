// RopeConfig: how a model applies rotary position embedding (RoPE) to K, as
// inference engines do it: the pairing (NeoX rotate-half, GPT-J interleaved,
// partial rotary dims) and the frequency scaling (linear, NTK, llama3). A
// chunk pool needs it to turn a cached chunk's K to new positions. Plain
// values; safe to share between threads. The rotation itself is internal
// (src/rope.h, src/rope_remap.h).
#ifndef TIERKV_INCLUDE_TIERKV_ROPE_CONFIG_H_
#define TIERKV_INCLUDE_TIERKV_ROPE_CONFIG_H_

#include <cstdint>
#include <string>

#include "tierkv/status.h"

namespace tierkv {

// Which elements of a head form a rotary pair; pair i turns at frequency i.
enum class RopeStyle : uint8_t {
  kNeoX,  // Rotate-half (Llama, NeoX, vLLM is_neox_style): (i, i + rot/2).
  kGptJ,  // Interleaved (GPT-J, ChatGLM): (2i, 2i + 1).
};

enum class RopeScalingType : uint8_t { kNone, kLinear, kNtk, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                   // Linear and llama3.
  double alpha = 1.0;                    // NTK.
  double low_freq_factor = 1.0;          // llama3.
  double high_freq_factor = 4.0;         // llama3.
  int64_t original_max_position = 8192;  // llama3.

  static RopeScaling None() { return {}; }
  // Positions divided by `factor` (HF "linear"): inv_freq / factor.
  static RopeScaling Linear(double factor);
  // NTK-aware: theta' = theta * alpha^(rot / (rot - 2)).
  static RopeScaling Ntk(double alpha);
  // As HF transformers' _compute_llama3_parameters.
  static RopeScaling Llama3(double factor, double low_freq_factor,
                            double high_freq_factor,
                            int64_t original_max_position);
};

struct RopeConfig {
  int32_t head_dim = 0;    // Required.
  int32_t rotary_dim = 0;  // Required; even, <= head_dim. Dims past it are
                           // not rotated.
  double theta = 10000.0;  // Base. Default: 10000.
  RopeStyle style = RopeStyle::kNeoX;  // Default: NeoX rotate-half.
  RopeScaling scaling;                 // Default: none.

  // OK, or InvalidArgument naming the bad field.
  Status Validate() const;
  // "head_dim=128 rotary_dim=128 theta=500000 style=neox scaling=llama3(...)".
  std::string ToString() const;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_ROPE_CONFIG_H_
