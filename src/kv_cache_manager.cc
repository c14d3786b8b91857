#include "tierkv/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

#include "src/block_pool.h"
#include "src/kv_cache_manager_internal.h"

namespace tierkv {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

struct KVCacheManager::RequestState {
  std::vector<BlockId> blocks;
  int32_t num_tokens = 0;         // Tokens that have slots.
  int32_t num_cached_blocks = 0;  // Leading blocks already keyed.
  // An external load outstanding: tokens [load_start, load_end) wait for
  // their KV and nothing of the request is keyed. load_end == 0: none.
  int32_t load_start = 0;
  int32_t load_end = 0;
};

struct KVCacheManager::State {
  BlockPool pool;
  bool enable_caching = true;
  std::unordered_map<RequestId, RequestState> requests;
  PrefixCacheStats stats;
};

KVCacheManager::KVCacheManager(std::unique_ptr<State> state)
    : s_(std::move(state)) {}
KVCacheManager::KVCacheManager(KVCacheManager&&) noexcept = default;
KVCacheManager& KVCacheManager::operator=(KVCacheManager&&) noexcept = default;
KVCacheManager::~KVCacheManager() = default;

const BlockPool& PoolOf(const KVCacheManager& manager) {
  return manager.s_->pool;
}

bool KVCacheManager::EvictCachedBlock(BlockId id) {
  return s_->pool.EvictCachedBlock(id);
}
void KVCacheManager::PinBlocks(std::span<const BlockId> ids) {
  // A transfer's pin, not a use: the eviction policy does not count it.
  s_->pool.Pin(ids);
}
void KVCacheManager::UnpinBlocks(std::span<const BlockId> ids) {
  s_->pool.FreeBlocks(ids);
}
size_t KVCacheManager::num_requests() const { return s_->requests.size(); }
int32_t KVCacheManager::num_blocks() const { return s_->pool.num_blocks(); }
int32_t KVCacheManager::num_free_blocks() const {
  return s_->pool.num_free_blocks();
}

StatusOr<KVCacheManager> KVCacheManager::Create(
    const KVCacheManagerOptions& options) {
  TIERKV_ASSIGN_OR_RETURN(BlockPool pool, BlockPool::Create(options.pool));
  return KVCacheManager(
      std::make_unique<State>(State{.pool = std::move(pool),
                                    .enable_caching = options.enable_caching,
                                    .requests = {},
                                    .stats = {}}));
}

ComputedBlocks KVCacheManager::GetComputedBlocks(const Request& request) {
  ComputedBlocks computed;
  if (!s_->enable_caching || request.num_tokens() == 0 ||
      request.block_size() != s_->pool.block_size()) {
    return computed;
  }
  ++s_->stats.queries;
  s_->stats.query_tokens += static_cast<uint64_t>(request.num_tokens());

  const int32_t bs = s_->pool.block_size();
  const auto max_blocks =
      std::min<size_t>(static_cast<size_t>((request.num_tokens() - 1) / bs),
                       request.block_keys().size());
  computed.blocks.reserve(max_blocks);
  for (size_t i = 0; i < max_blocks; ++i) {
    auto hit = s_->pool.GetCachedBlock(
        request.block_keys()[i], request.block_tokens(static_cast<int32_t>(i)));
    if (!hit) break;
    computed.blocks.push_back(*hit);
  }
  computed.num_tokens = static_cast<int32_t>(computed.blocks.size()) * bs;
  if (computed.num_tokens > 0) {
    ++s_->stats.hits;
    s_->stats.hit_tokens += static_cast<uint64_t>(computed.num_tokens);
  }
  return computed;
}

int64_t KVCacheManager::BlocksShort(int64_t num_tokens, size_t held) const {
  return std::max<int64_t>(0, CeilDiv(num_tokens, s_->pool.block_size()) -
                                  static_cast<int64_t>(held));
}

Status KVCacheManager::CheckBlockSize(const Request& request) const {
  if (request.block_size() != s_->pool.block_size()) {
    return Status::InvalidArgument(
        "request " + std::to_string(request.id()) + " was keyed with " +
        std::to_string(request.block_size()) + "-token blocks; this pool's " +
        "blocks hold " + std::to_string(s_->pool.block_size()));
  }
  return Status::Ok();
}

Status KVCacheManager::CheckComputedStillCached(
    const Request& request, const ComputedBlocks& computed) const {
  const int32_t bs = s_->pool.block_size();
  if (computed.num_tokens !=
          static_cast<int32_t>(computed.blocks.size()) * bs ||
      computed.blocks.size() > request.block_keys().size()) {
    return Status::InvalidArgument("computed blocks do not match the request");
  }
  for (size_t i = 0; i < computed.blocks.size(); ++i) {
    const BlockId id = computed.blocks[i];
    if (!s_->pool.IsValid(id) || !s_->pool.block(id).has_key() ||
        !(s_->pool.block(id).key == request.block_keys()[i])) {
      return Status::FailedPrecondition(
          "computed block " + std::to_string(id) +
          " was evicted since GetComputedBlocks; look the request up again");
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<BlockId>> KVCacheManager::AllocateSlots(
    const Request& request, int32_t num_new_tokens,
    const ComputedBlocks& computed, int32_t num_external_tokens) {
  if (num_new_tokens < 0) {
    return Status::InvalidArgument("num_new_tokens must be >= 0");
  }
  if (num_external_tokens < 0 || num_external_tokens > num_new_tokens) {
    return Status::InvalidArgument(
        "num_external_tokens must be within 0..num_new_tokens");
  }
  TIERKV_RETURN_IF_ERROR(CheckBlockSize(request));
  auto it = s_->requests.find(request.id());
  const bool is_new = it == s_->requests.end();
  if (!is_new && !computed.blocks.empty()) {
    return Status::InvalidArgument(
        "computed blocks are only taken on a request's first allocation");
  }
  if (!is_new && it->second.load_end > 0) {
    return Status::FailedPrecondition(
        "request " + std::to_string(request.id()) +
        " waits for an external load; CompleteExternalLoad first");
  }
  TIERKV_RETURN_IF_ERROR(CheckComputedStillCached(request, computed));

  const int32_t bs = s_->pool.block_size();
  const int64_t have_tokens = is_new ? 0 : it->second.num_tokens;
  const int64_t load_start = have_tokens + computed.num_tokens;
  if (num_external_tokens > 0 && load_start % bs != 0) {
    return Status::InvalidArgument(
        "an external load must start at a block "
        "boundary, not at token " +
        std::to_string(load_start));
  }
  const size_t have_blocks = is_new ? 0 : it->second.blocks.size();
  const int64_t total =
      have_tokens + int64_t{computed.num_tokens} + int64_t{num_new_tokens};
  // The null block is never handed out. Past int32 tokens a request could
  // not count its own (RequestState), whatever the pool holds.
  const int64_t usable =
      s_->pool.num_blocks() - (s_->pool.null_block().has_value() ? 1 : 0);
  if (CeilDiv(total, bs) > usable ||
      total > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(
        "request " + std::to_string(request.id()) + " would hold " +
        std::to_string(total) + " tokens, more than the whole pool (" +
        std::to_string(usable) + " usable blocks of " + std::to_string(bs) +
        ") or a request's 2^31 - 1");
  }
  const auto needed = static_cast<int32_t>(
      BlocksShort(total, have_blocks + computed.blocks.size()));
  // Touching a free hit takes it out of the free queue, so it cannot also
  // serve as a new block.
  const auto free_hits = static_cast<int32_t>(std::count_if(
      computed.blocks.begin(), computed.blocks.end(),
      [&](BlockId id) { return s_->pool.block(id).ref_cnt == 0; }));
  if (needed > s_->pool.num_free_blocks() - free_hits) {
    return Status::ResourceExhausted(
        "request " + std::to_string(request.id()) + " needs " +
        std::to_string(needed) + " new blocks, " +
        std::to_string(s_->pool.num_free_blocks() - free_hits) + " available");
  }

  RequestState& state = is_new ? s_->requests[request.id()] : it->second;
  s_->pool.Touch(computed.blocks);
  state.blocks.insert(state.blocks.end(), computed.blocks.begin(),
                      computed.blocks.end());
  state.num_cached_blocks += static_cast<int32_t>(computed.blocks.size());
  std::vector<BlockId> new_blocks;
  TIERKV_RETURN_IF_ERROR(s_->pool.GetNewBlocks(needed, &new_blocks));
  state.blocks.insert(state.blocks.end(), new_blocks.begin(), new_blocks.end());
  state.num_tokens = static_cast<int32_t>(total);
  if (num_external_tokens > 0) {
    state.load_start = static_cast<int32_t>(load_start);
    state.load_end = static_cast<int32_t>(load_start) + num_external_tokens;
  }
  TIERKV_RETURN_IF_ERROR(CacheFullBlocks(request, &state));
  return new_blocks;
}

StatusOr<ExternalLoadResult> KVCacheManager::CompleteExternalLoad(
    const Request& request, int32_t num_loaded_tokens) {
  auto it = s_->requests.find(request.id());
  if (it == s_->requests.end()) {
    return Status::NotFound("request " + std::to_string(request.id()) +
                            " holds no blocks");
  }
  RequestState& state = it->second;
  if (state.load_end == 0) {
    return Status::FailedPrecondition("request " +
                                      std::to_string(request.id()) +
                                      " has no external load outstanding");
  }
  const int32_t bs = s_->pool.block_size();
  const int32_t expected = state.load_end - state.load_start;
  // A whole-block count for a load whose last block is partial (a chunk).
  if (num_loaded_tokens > expected &&
      num_loaded_tokens <= static_cast<int32_t>(CeilDiv(expected, bs)) * bs) {
    num_loaded_tokens = expected;
  }
  if (num_loaded_tokens < 0 || num_loaded_tokens > expected) {
    return Status::InvalidArgument("the load of request " +
                                   std::to_string(request.id()) + " had " +
                                   std::to_string(expected) + " tokens, not " +
                                   std::to_string(num_loaded_tokens));
  }
  // Only whole blocks count when the load fell short: the engine recomputes
  // from the first block that did not load.
  const int32_t good = num_loaded_tokens == expected
                           ? state.load_end
                           : state.load_start + num_loaded_tokens / bs * bs;
  ExternalLoadResult result{.num_computed_tokens = good, .failed_blocks = {}};
  const auto end = std::min(state.blocks.size(),
                            static_cast<size_t>(CeilDiv(state.load_end, bs)));
  for (auto i = static_cast<size_t>(good / bs);
       i < end && good < state.load_end; ++i) {
    result.failed_blocks.push_back(state.blocks[i]);
  }
  // Tokens past `good` are computed later, when the engine schedules them
  // (AllocateSlots keys their blocks then), so nothing is keyed before its
  // KV exists.
  state.num_tokens = std::min(state.num_tokens, good);
  state.load_start = state.load_end = 0;
  TIERKV_RETURN_IF_ERROR(CacheFullBlocks(request, &state));
  return result;
}

bool KVCacheManager::IsLoading(RequestId id) const {
  auto it = s_->requests.find(id);
  return it != s_->requests.end() && it->second.load_end > 0;
}

Status KVCacheManager::CacheFullBlocks(const Request& request,
                                       RequestState* state) {
  if (!s_->enable_caching || state->load_end > 0) return Status::Ok();
  const int32_t bs = s_->pool.block_size();
  const int32_t known = std::min(state->num_tokens, request.num_tokens());
  const int32_t full = std::min<int32_t>(
      {known / bs, static_cast<int32_t>(request.block_keys().size()),
       static_cast<int32_t>(state->blocks.size())});
  if (full <= state->num_cached_blocks) return Status::Ok();
  TIERKV_RETURN_IF_ERROR(s_->pool.CacheFullBlocks(
      state->blocks, request.block_keys(), request.tokens(),
      state->num_cached_blocks, full));
  state->num_cached_blocks = full;
  return Status::Ok();
}

bool KVCacheManager::CanAppend(const Request& request) const {
  auto it = s_->requests.find(request.id());
  const size_t held = it == s_->requests.end() ? 0 : it->second.blocks.size();
  return s_->pool.num_free_blocks() >= BlocksShort(request.num_tokens(), held);
}

Status KVCacheManager::MayAppend(const Request& request) {
  auto it = s_->requests.find(request.id());
  if (it == s_->requests.end()) {
    return Status::NotFound("request " + std::to_string(request.id()) +
                            " holds no blocks");
  }
  TIERKV_RETURN_IF_ERROR(CheckBlockSize(request));
  RequestState& state = it->second;
  const int32_t len = request.num_tokens();
  if (state.load_end > 0 || state.num_tokens < len - 1) {
    // The new token's block would be keyed over blocks that have no KV yet.
    return Status::FailedPrecondition(
        "request " + std::to_string(request.id()) +
        (state.load_end > 0 ? " waits for an external load"
                            : " has tokens without slots; AllocateSlots "
                              "them first"));
  }
  const auto needed =
      static_cast<int32_t>(BlocksShort(len, state.blocks.size()));
  if (needed > 0) {
    // len % block_size == 1: the previous block is full, start a new one.
    TIERKV_RETURN_IF_ERROR(s_->pool.GetNewBlocks(needed, &state.blocks));
  }
  state.num_tokens = std::max(state.num_tokens, len);
  // len % block_size == 0: the new token filled the last block.
  return CacheFullBlocks(request, &state);
}

Status KVCacheManager::Free(RequestId id) {
  auto it = s_->requests.find(id);
  if (it == s_->requests.end()) {
    return Status::NotFound("request " + std::to_string(id) +
                            " holds no blocks");
  }
  std::vector<BlockId>& blocks = it->second.blocks;
  std::reverse(blocks.begin(), blocks.end());
  s_->pool.FreeBlocks(blocks);
  s_->requests.erase(it);
  return Status::Ok();
}

StatusOr<std::vector<BlockId>> KVCacheManager::AllocateRemapBlocks(int32_t n) {
  std::vector<BlockId> blocks;
  if (n < 1) return blocks;
  TIERKV_RETURN_IF_ERROR(s_->pool.GetNewBlocks(n, &blocks));
  return blocks;
}

void KVCacheManager::ReleaseRemappedBlocks(std::span<const BlockId> blocks) {
  std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  s_->pool.FreeBlocks(reversed);
}

std::span<const BlockId> KVCacheManager::blocks(RequestId id) const {
  auto it = s_->requests.find(id);
  if (it == s_->requests.end()) return {};
  return it->second.blocks;
}

PrefixCacheStats KVCacheManager::stats() const {
  PrefixCacheStats s = s_->stats;
  s.evictions = s_->pool.stats().evictions;
  return s;
}

}  // namespace tierkv
