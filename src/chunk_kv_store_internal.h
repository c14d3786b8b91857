// What tierkv's own code and tests may see of a ChunkKvStore that engines do
// not: its BlockPool (ref counts, keys, the free queue's order), and the
// bound on a KV memory's size it shares with the reference model's cache.
#ifndef TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_
#define TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_

#include "src/block_pool.h"
#include "tierkv/chunk_kv_store.h"

namespace tierkv {

const BlockPool& PoolOf(const ChunkKvStore& store);

// OK when `num_blocks` blocks of `layout` make a KV memory tierkv keeps:
// at least one block, at most 1 TiB (a chunk pool's, or a paged cache's).
Status CheckKvMemorySize(const KvLayout& layout, int64_t num_blocks);

}  // namespace tierkv

#endif  // TIERKV_SRC_CHUNK_KV_STORE_INTERNAL_H_
