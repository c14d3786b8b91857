// The ids every tierkv interface speaks in.
#ifndef TIERKV_INCLUDE_TIERKV_TYPES_H_
#define TIERKV_INCLUDE_TIERKV_TYPES_H_

#include <cstdint>

namespace tierkv {

// A token id of the model's vocabulary.
using TokenId = uint32_t;
// A block of a KV pool (device, host or chunk pool). Block 0 is the null
// block in every pool that keeps one.
using BlockId = int32_t;
// The engine's name for a request; unique among the requests of one worker.
using RequestId = uint64_t;
// A worker attached to a store, numbered by the store from 1.
using WorkerId = uint32_t;

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_TYPES_H_
