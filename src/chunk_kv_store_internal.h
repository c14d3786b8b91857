// What tierkv's own code and tests may see of a ChunkKvStore that engines do
// not: its BlockPool (ref counts, keys, the free queue's order).
#ifndef TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_
#define TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_

#include "src/block_pool.h"
#include "tierkv/chunk_kv_store.h"

namespace tierkv {

const BlockPool& PoolOf(const ChunkKvStore& store);

}  // namespace tierkv

#endif  // TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_
