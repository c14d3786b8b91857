// What tierkv's own code and tests may see of a KVCacheManager that engines
// do not: its BlockPool (ref counts, keys, the free queue's order).
#ifndef TIERKV_SRC_KV_CACHE_MANAGER_INTERNAL_H_
#define TIERKV_SRC_KV_CACHE_MANAGER_INTERNAL_H_

#include "src/block_pool.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {

const BlockPool& PoolOf(const KVCacheManager& manager);

}  // namespace tierkv

#endif  // TIERKV_SRC_KV_CACHE_MANAGER_INTERNAL_H_
