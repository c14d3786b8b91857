// Randomized model test: KVCacheManager and a deliberately simple reference
// model run the same seeded operations and must agree after each one on hits,
// block ids, free-queue order, keys, ref counts and stats; invariants hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/block_pool.h"
#include "src/kv_cache_manager_internal.h"
#include "tests/status_matchers.h"
#include "tierkv/block_key.h"
#include "tierkv/kv_cache_manager.h"
#include "tierkv/request.h"
#include "tierkv/status.h"

namespace tierkv {
namespace {

struct Config {
  const char* name;
  int32_t num_blocks;
  int32_t block_size;
  bool reserve_null_block;
  bool enable_caching;
  // The pool verifies hits by a check of the tokens rather than a copy
  // (BlockPoolOptions::keep_tokens false); the model still compares tokens.
  bool token_check;
};

constexpr uint64_t kSeeds[] = {1, 2, 3, 0x5eed, 0xc0ffee};
constexpr int kOpsPerSeed = 4000;
constexpr size_t kMaxLiveRequests = 10;

using KeyPair = std::pair<uint64_t, uint64_t>;

KeyPair AsPair(const BlockKey& key) { return {key.lo, key.hi}; }

std::vector<TokenId> Copy(std::span<const TokenId> tokens) {
  return {tokens.begin(), tokens.end()};
}

// The reference: plain containers and linear scans following the seeds'
// description (vLLM v1 BlockPool/KVCacheManager, nano-vllm's decode path).
// It shares no code with the implementation; only the keys come from Request.
class Model {
 public:
  struct Block {
    int32_t ref_cnt = 0;
    bool has_key = false;
    BlockKey key;
    std::vector<TokenId> tokens;  // Recorded with the key.
  };
  struct Req {
    std::vector<BlockId> blocks;
    int32_t slots = 0;      // Tokens that have a slot.
    int32_t num_keyed = 0;  // Leading blocks already hit or keyed.
  };

  explicit Model(const Config& config)
      : block_size_(config.block_size),
        caching_(config.enable_caching),
        blocks_(static_cast<size_t>(config.num_blocks)) {
    BlockId first = 0;
    if (config.reserve_null_block) {
      null_block_ = 0;
      blocks_[0].ref_cnt = 1;
      first = 1;
    }
    for (BlockId id = first; id < config.num_blocks; ++id) free_.push_back(id);
  }

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  std::optional<BlockId> null_block() const { return null_block_; }
  const Block& block(BlockId id) const { return blocks_[Idx(id)]; }
  std::vector<BlockId> FreeQueue() const {
    return {free_.begin(), free_.end()};
  }
  const std::map<KeyPair, BlockId>& index() const { return index_; }
  const std::map<RequestId, Req>& requests() const { return requests_; }
  const PrefixCacheStats& stats() const { return stats_; }
  uint64_t takeovers() const { return takeovers_; }
  uint64_t free_hits_touched() const { return free_hits_touched_; }
  uint64_t collisions() const { return collisions_; }

  ComputedBlocks Lookup(const Request& r) {
    ComputedBlocks out;
    if (!caching_ || r.num_tokens() == 0) return out;
    ++stats_.queries;
    stats_.query_tokens += static_cast<uint64_t>(r.num_tokens());
    const std::vector<BlockKey>& keys = r.block_keys();
    for (size_t i = 0; i < keys.size(); ++i) {
      // The last prompt token is always recomputed, so a hit block must end
      // before it.
      const auto end = static_cast<int32_t>(i + 1) * block_size_;
      if (end > r.num_tokens() - 1) break;
      auto it = index_.find(AsPair(keys[i]));
      if (it == index_.end()) break;
      if (blocks_[Idx(it->second)].tokens !=
          Copy(r.block_tokens(static_cast<int32_t>(i)))) {
        ++collisions_;  // Same key, other tokens: a miss.
        break;
      }
      out.blocks.push_back(it->second);
    }
    out.num_tokens = static_cast<int32_t>(out.blocks.size()) * block_size_;
    if (out.num_tokens > 0) {
      ++stats_.hits;
      stats_.hit_tokens += static_cast<uint64_t>(out.num_tokens);
    }
    return out;
  }

  StatusCode Allocate(const Request& r, int32_t num_new,
                      const ComputedBlocks& computed,
                      std::vector<BlockId>* new_blocks) {
    if (num_new < 0) return StatusCode::kInvalidArgument;
    const bool is_new = !requests_.contains(r.id());
    if (!is_new && !computed.blocks.empty()) {
      return StatusCode::kInvalidArgument;
    }
    const auto num_hits = static_cast<int32_t>(computed.blocks.size());
    if (computed.num_tokens != num_hits * block_size_ ||
        computed.blocks.size() > r.block_keys().size()) {
      return StatusCode::kInvalidArgument;
    }
    for (int32_t i = 0; i < num_hits; ++i) {
      const BlockId id = computed.blocks[Idx(i)];
      if (id < 0 || id >= num_blocks() || !block(id).has_key ||
          AsPair(block(id).key) != AsPair(r.block_keys()[Idx(i)])) {
        return StatusCode::kFailedPrecondition;  // Evicted since lookup.
      }
    }
    const Req before = is_new ? Req{} : requests_.at(r.id());
    const int32_t total = before.slots + computed.num_tokens + num_new;
    const int32_t blocks_for_total = (total + block_size_ - 1) / block_size_;
    // More blocks than the pool hands out (never the null block): it can
    // never fit, so it is not a "try again later".
    const int32_t usable = num_blocks() - (null_block_.has_value() ? 1 : 0);
    if (blocks_for_total > usable) return StatusCode::kInvalidArgument;
    const int32_t needed =
        std::max(0, blocks_for_total -
                        static_cast<int32_t>(before.blocks.size()) - num_hits);
    // A hit that sits in the free queue is taken out of it by the touch, so
    // it cannot also be handed out as a new block.
    int32_t free_hits = 0;
    for (BlockId id : computed.blocks) free_hits += block(id).ref_cnt == 0;
    if (needed > static_cast<int32_t>(free_.size()) - free_hits) {
      return StatusCode::kResourceExhausted;
    }
    Req& req = requests_[r.id()];
    for (BlockId id : computed.blocks) {
      Block& b = blocks_[Idx(id)];
      if (b.ref_cnt == 0) {
        free_.erase(std::find(free_.begin(), free_.end(), id));
        ++free_hits_touched_;
      }
      ++b.ref_cnt;
      req.blocks.push_back(id);
    }
    req.num_keyed += num_hits;
    for (int32_t i = 0; i < needed; ++i) {
      const BlockId id = PopFront();
      new_blocks->push_back(id);
      req.blocks.push_back(id);
    }
    req.slots = total;
    return KeyFullBlocks(r, &req);
  }

  // The appended tokens need blocks beyond those the request holds (for a
  // request without lookahead slots: the token starts a block).
  bool CanAppend(const Request& r) const {
    const int32_t blocks_for_len =
        (r.num_tokens() + block_size_ - 1) / block_size_;
    auto it = requests_.find(r.id());
    const int32_t held = it == requests_.end()
                             ? 0
                             : static_cast<int32_t>(it->second.blocks.size());
    return static_cast<int32_t>(free_.size()) >=
           std::max<int32_t>(0, blocks_for_len - held);
  }

  StatusCode MayAppend(const Request& r) {
    auto it = requests_.find(r.id());
    if (it == requests_.end()) return StatusCode::kNotFound;
    Req& req = it->second;
    const int32_t blocks_for_len =
        (r.num_tokens() + block_size_ - 1) / block_size_;
    const int32_t needed =
        blocks_for_len - static_cast<int32_t>(req.blocks.size());
    if (needed > static_cast<int32_t>(free_.size())) {
      return StatusCode::kResourceExhausted;
    }
    for (int32_t i = 0; i < needed; ++i) req.blocks.push_back(PopFront());
    req.slots = std::max(req.slots, r.num_tokens());
    return KeyFullBlocks(r, &req);
  }

  StatusCode Free(RequestId id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return StatusCode::kNotFound;
    // Reverse order: a request's tail blocks are the least reusable, so they
    // are evicted first.
    const std::vector<BlockId>& held = it->second.blocks;
    for (auto b = held.rbegin(); b != held.rend(); ++b) {
      if (*b == null_block_) continue;
      if (--blocks_[Idx(*b)].ref_cnt == 0) free_.push_back(*b);
    }
    requests_.erase(it);
    return StatusCode::kOk;
  }

  bool Evict(BlockId id) {
    if (id < 0 || id >= num_blocks()) return false;
    const Block& b = block(id);
    if (b.ref_cnt != 0 || !b.has_key) return false;
    DropKey(id);
    ++stats_.evictions;
    return true;
  }

 private:
  static size_t Idx(int32_t i) { return static_cast<size_t>(i); }

  // Head of the free queue; a key it still holds is evicted.
  BlockId PopFront() {
    const BlockId id = free_.front();
    free_.pop_front();
    if (blocks_[Idx(id)].has_key) {
      DropKey(id);
      ++stats_.evictions;
    }
    blocks_[Idx(id)].ref_cnt = 1;
    return id;
  }

  void DropKey(BlockId id) {
    Block& b = blocks_[Idx(id)];
    index_.erase(AsPair(b.key));
    b.has_key = false;
    b.tokens.clear();
  }

  // Keys every block of the request that is full of known tokens and not
  // yet keyed (or hit) by it.
  StatusCode KeyFullBlocks(const Request& r, Req* req) {
    if (!caching_) return StatusCode::kOk;
    const int32_t known = std::min(req->slots, r.num_tokens());
    const auto full =
        std::min<size_t>({static_cast<size_t>(known / block_size_),
                          r.block_keys().size(), req->blocks.size()});
    for (auto i = static_cast<size_t>(req->num_keyed); i < full; ++i) {
      const StatusCode code =
          Key(req->blocks[i], r.block_keys()[i],
              Copy(r.block_tokens(static_cast<int32_t>(i))));
      if (code != StatusCode::kOk) return code;
    }
    req->num_keyed = std::max(req->num_keyed, static_cast<int32_t>(full));
    return StatusCode::kOk;
  }

  StatusCode Key(BlockId id, const BlockKey& key, std::vector<TokenId> tokens) {
    Block& b = blocks_[Idx(id)];
    if (id == null_block_ || b.ref_cnt == 0 || b.has_key || tokens.empty() ||
        tokens.size() > static_cast<size_t>(block_size_)) {
      return StatusCode::kInvalidArgument;
    }
    // Two requests filled identical blocks: the newer one takes the key.
    auto it = index_.find(AsPair(key));
    if (it != index_.end()) {
      Block& older = blocks_[Idx(it->second)];
      older.has_key = false;
      older.tokens.clear();
      ++takeovers_;
    }
    index_[AsPair(key)] = id;
    b.has_key = true;
    b.key = key;
    b.tokens = std::move(tokens);
    return StatusCode::kOk;
  }

  int32_t block_size_;
  bool caching_;
  std::optional<BlockId> null_block_;
  std::vector<Block> blocks_;
  std::list<BlockId> free_;  // Front is reused (and evicted) first.
  std::map<KeyPair, BlockId> index_;
  std::map<RequestId, Req> requests_;
  PrefixCacheStats stats_;
  uint64_t takeovers_ = 0;
  uint64_t free_hits_touched_ = 0;
  uint64_t collisions_ = 0;
};

// How much of the interesting behaviour a run reached, so a change to the
// generator cannot silently turn the test into a no-op.
struct Coverage {
  uint64_t hits = 0;
  uint64_t free_hits_touched = 0;
  uint64_t collisions = 0;
  uint64_t evictions = 0;
  uint64_t takeovers = 0;
  uint64_t exhausted = 0;
  uint64_t stale_rejected = 0;
  uint64_t cannot_append = 0;
};

// One seeded run: drives the manager and the model in lockstep.
class Runner {
 public:
  Runner(const Config& config, uint64_t seed)
      : config_(config),
        rng_(seed),
        hasher_(KeyNamespace{"prefix-cache-model", ""}),
        manager_(KVCacheManager::Create(
                     {.pool = {.num_blocks = config.num_blocks,
                               .block_size = config.block_size,
                               .reserve_null_block = config.reserve_null_block,
                               .keep_tokens = !config.token_check},
                      .enable_caching = config.enable_caching})
                     .value()),
        model_(config) {
    MakePrefixes();
  }

  void Run(int num_ops) {
    ASSERT_NO_FATAL_FAILURE(CheckState());
    for (int op = 0; op < num_ops; ++op) {
      SCOPED_TRACE("op " + std::to_string(op));
      const int pick = Uniform(0, 99);
      if (pick < 30) {
        ASSERT_NO_FATAL_FAILURE(NewRequest(/*allow_stale=*/true));
      } else if (pick < 60) {
        ASSERT_NO_FATAL_FAILURE(Decode());
      } else if (pick < 65) {
        ASSERT_NO_FATAL_FAILURE(ContinuePrefill());
      } else if (pick < 83) {
        ASSERT_NO_FATAL_FAILURE(FreeOne());
      } else {
        ASSERT_NO_FATAL_FAILURE(EvictOne());
      }
      ASSERT_NO_FATAL_FAILURE(CheckState());
    }
    // Draining returns every block to the free queue.
    while (!live_.empty()) {
      ASSERT_NO_FATAL_FAILURE(FreeRequest(live_.begin()->first));
    }
    ASSERT_NO_FATAL_FAILURE(CheckState());
    const int32_t usable =
        config_.num_blocks - (config_.reserve_null_block ? 1 : 0);
    ASSERT_EQ(PoolOf(manager_).num_free_blocks(), usable);
    coverage_.hits = manager_.stats().hits;
    coverage_.evictions = manager_.stats().evictions;
    coverage_.takeovers = model_.takeovers();
    coverage_.free_hits_touched = model_.free_hits_touched();
    coverage_.collisions = model_.collisions();
  }

  const Coverage& coverage() const { return coverage_; }

 private:
  // Portable across standard libraries, unlike std::uniform_int_distribution,
  // so a seed means the same run everywhere.
  int Uniform(int lo, int hi) {
    return lo + static_cast<int>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Percent(int p) { return Uniform(0, 99) < p; }

  int32_t bs() const { return config_.block_size; }

  // KVCacheManager hands out its pool read-only; eviction for a tier
  // demotion goes through the pool itself. The pool is not a const object,
  // so casting the reference back is well defined.

  // Shared prefixes make hits common: two nested ones (a system prompt and
  // a longer one extending it), an unrelated one and the empty one.
  void MakePrefixes() {
    auto random_tokens = [&](int n, std::vector<TokenId>* out) {
      for (int i = 0; i < n; ++i) out->push_back(Uniform(2, 7));
    };
    std::vector<TokenId> system;
    random_tokens(Uniform(bs(), 2 * bs()), &system);
    std::vector<TokenId> longer = system;
    random_tokens(Uniform(1, bs() + 1), &longer);
    std::vector<TokenId> other;
    random_tokens(Uniform(1, 2 * bs()), &other);
    prefixes_ = {system, longer, other, {}};
  }

  // A prefix, a short suffix over a two-token alphabet (so suffixes collide
  // and hit too), sometimes cut to whole blocks or repeated verbatim (so
  // the block after the hit limit is keyed a second time).
  std::vector<TokenId> MakePrompt() {
    if (!recent_prompts_.empty() && Percent(20)) {
      return recent_prompts_[static_cast<size_t>(
          Uniform(0, static_cast<int>(recent_prompts_.size()) - 1))];
    }
    if (Percent(2)) return {};
    std::vector<TokenId> prompt = prefixes_[static_cast<size_t>(Uniform(0, 3))];
    const int suffix = Uniform(0, 3 * bs());
    for (int i = 0; i < suffix; ++i) prompt.push_back(Uniform(0, 1));
    const auto whole = static_cast<size_t>(bs());
    if (Percent(30) && prompt.size() >= whole) {
      prompt.resize(prompt.size() / whole * whole);
    }
    if (prompt.empty()) prompt.push_back(Uniform(0, 1));
    if (recent_prompts_.size() < 8) {
      recent_prompts_.push_back(prompt);
    } else {
      recent_prompts_[static_cast<size_t>(Uniform(0, 7))] = prompt;
    }
    return prompt;
  }

  // Keys supplied by the caller (Request::WithKeys) are never trusted: these
  // reuse a recent prompt's keys, usually for a prompt with one token
  // changed, forcing key collisions the token check must catch, and
  // sometimes fewer keys than full blocks.
  Request ForgedKeysRequest(RequestId id) {
    const std::vector<TokenId>& base = recent_prompts_[static_cast<size_t>(
        Uniform(0, static_cast<int>(recent_prompts_.size()) - 1))];
    std::vector<BlockKey> keys = Request(id, base, bs(), hasher_).block_keys();
    std::vector<TokenId> tokens = base;
    if (Percent(70)) {
      tokens[static_cast<size_t>(
          Uniform(0, static_cast<int>(tokens.size()) - 1))] ^= 1;
    }
    if (!keys.empty() && Percent(30)) {
      keys.resize(
          static_cast<size_t>(Uniform(0, static_cast<int>(keys.size()) - 1)));
    }
    return Request::WithKeys(id, std::move(tokens), bs(), std::move(keys));
  }

  // Mostly a function of the sequence, like greedy decoding, so requests
  // with equal prompts generate equal blocks and key them twice.
  TokenId NextToken(const Request& r) {
    if (r.num_tokens() == 0 || Percent(25)) return Uniform(0, 1);
    return (r.tokens().back() * 3 + static_cast<TokenId>(r.num_tokens())) % 2;
  }

  const Model::Req* ModelReq(RequestId id) const {
    auto it = model_.requests().find(id);
    return it == model_.requests().end() ? nullptr : &it->second;
  }

  RequestId PickLive() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return it->first;
  }

  void Lookup(const Request& r, ComputedBlocks* out) {
    *out = manager_.GetComputedBlocks(r);
    const ComputedBlocks want = model_.Lookup(r);
    ASSERT_EQ(out->blocks, want.blocks) << "hits of request " << r.id();
    ASSERT_EQ(out->num_tokens, want.num_tokens);
    const BlockPool& pool = PoolOf(manager_);
    for (size_t i = 0; i < out->blocks.size(); ++i) {
      // Without a copy in the pool, the tokens the model recorded for the
      // block (the same block, asserted above).
      const std::vector<TokenId> held =
          pool.keeps_tokens() ? Copy(pool.block_tokens(out->blocks[i]))
                              : model_.block(out->blocks[i]).tokens;
      ASSERT_EQ(held, Copy(r.block_tokens(static_cast<int32_t>(i))))
          << "hit block " << out->blocks[i] << " holds other tokens";
    }
  }

  void Allocate(const Request& r, int32_t num_new,
                const ComputedBlocks& computed, StatusCode* code) {
    StatusOr<std::vector<BlockId>> got =
        manager_.AllocateSlots(r, num_new, computed);
    std::vector<BlockId> want;
    *code = model_.Allocate(r, num_new, computed, &want);
    ASSERT_EQ(got.status().code(), *code)
        << "AllocateSlots(" << r.id() << ", " << num_new
        << "): " << got.status().ToString();
    if (got.ok()) {
      ASSERT_EQ(*got, want) << "new blocks of request " << r.id();
    }
    if (*code == StatusCode::kResourceExhausted) ++coverage_.exhausted;
  }

  void NewRequest(bool allow_stale) {
    if (live_.size() >= kMaxLiveRequests) {
      ASSERT_NO_FATAL_FAILURE(FreeOne());
      return;
    }
    const RequestId id = next_id_++;
    std::unique_ptr<Request> r;
    if (!recent_prompts_.empty() && Percent(4)) {
      r = std::make_unique<Request>(ForgedKeysRequest(id));
    } else {
      r = std::make_unique<Request>(id, MakePrompt(), bs(), hasher_);
    }
    ComputedBlocks computed;
    ASSERT_NO_FATAL_FAILURE(Lookup(*r, &computed));
    if (allow_stale && Percent(10)) {
      // Something happens between lookup and allocation; a hit that lost
      // its key must be refused, not handed out.
      const int what = Uniform(0, 2);
      if (what == 0) {
        ASSERT_NO_FATAL_FAILURE(EvictOne());
      } else if (what == 1) {
        ASSERT_NO_FATAL_FAILURE(NewRequest(/*allow_stale=*/false));
      } else {
        ASSERT_NO_FATAL_FAILURE(FreeOne());
      }
      ASSERT_NO_FATAL_FAILURE(CheckState());
    }
    const int32_t remaining = r->num_tokens() - computed.num_tokens;
    int32_t num_new = remaining;
    if (remaining > 1 && Percent(20)) {
      num_new = Uniform(1, remaining - 1);  // Chunked prefill.
    } else if (Percent(10)) {
      num_new += Uniform(1, bs());  // Slots ahead of the known tokens.
    }
    StatusCode code;
    ASSERT_NO_FATAL_FAILURE(Allocate(*r, num_new, computed, &code));
    if (code == StatusCode::kFailedPrecondition) {
      ++coverage_.stale_rejected;
      ASSERT_NO_FATAL_FAILURE(CheckState());
      ASSERT_NO_FATAL_FAILURE(Lookup(*r, &computed));  // Look it up again.
      ASSERT_NO_FATAL_FAILURE(
          Allocate(*r, r->num_tokens() - computed.num_tokens, computed, &code));
    }
    if (code == StatusCode::kOk) {
      live_.emplace(id, std::move(r));
    } else {
      ASSERT_TRUE(code == StatusCode::kResourceExhausted ||
                  code == StatusCode::kInvalidArgument);  // Dropped.
    }
  }

  void Decode() {
    std::vector<RequestId> running;
    for (const auto& [id, r] : live_) {
      if (ModelReq(id)->slots >= r->num_tokens()) running.push_back(id);
    }
    if (running.empty()) {
      ASSERT_NO_FATAL_FAILURE(NewRequest(/*allow_stale=*/false));
      return;
    }
    const RequestId id = running[static_cast<size_t>(
        Uniform(0, static_cast<int>(running.size()) - 1))];
    Request& r = *live_.at(id);
    r.AppendToken(NextToken(r));
    if (Percent(25)) {
      // vLLM's way: AllocateSlots for the tokens that lack a slot.
      const int32_t num_new = std::max(0, r.num_tokens() - ModelReq(id)->slots);
      StatusCode code;
      ASSERT_NO_FATAL_FAILURE(Allocate(r, num_new, {}, &code));
      if (code != StatusCode::kOk) {
        ASSERT_TRUE(code == StatusCode::kResourceExhausted ||
                    code == StatusCode::kInvalidArgument);
        ASSERT_NO_FATAL_FAILURE(CheckState());
        ASSERT_NO_FATAL_FAILURE(FreeRequest(id));  // Preempted.
      }
      return;
    }
    const bool can = manager_.CanAppend(r);
    ASSERT_EQ(can, model_.CanAppend(r)) << "CanAppend(" << id << ")";
    if (!can) ++coverage_.cannot_append;
    // Usually the scheduler preempts when it cannot append; sometimes try
    // anyway, to check MayAppend refuses cleanly.
    if (!can && Percent(50)) {
      ASSERT_NO_FATAL_FAILURE(FreeRequest(id));
      return;
    }
    const Status got = manager_.MayAppend(r);
    const StatusCode want = model_.MayAppend(r);
    ASSERT_EQ(got.code(), want)
        << "MayAppend(" << id << "): " << got.ToString();
    if (can) {
      ASSERT_THAT(got, IsOk());
    }
    if (!got.ok()) {
      ASSERT_NO_FATAL_FAILURE(CheckState());
      ASSERT_NO_FATAL_FAILURE(FreeRequest(id));  // Preempted.
    }
  }

  void ContinuePrefill() {
    std::vector<RequestId> partial;
    for (const auto& [id, r] : live_) {
      if (ModelReq(id)->slots < r->num_tokens()) partial.push_back(id);
    }
    if (partial.empty()) {
      ASSERT_NO_FATAL_FAILURE(NewRequest(/*allow_stale=*/true));
      return;
    }
    const RequestId id = partial[static_cast<size_t>(
        Uniform(0, static_cast<int>(partial.size()) - 1))];
    const Request& r = *live_.at(id);
    const int32_t remaining = r.num_tokens() - ModelReq(id)->slots;
    const int32_t chunk = Percent(50) ? remaining : Uniform(1, remaining);
    StatusCode code;
    ASSERT_NO_FATAL_FAILURE(Allocate(r, chunk, {}, &code));
    if (code != StatusCode::kOk) {
      ASSERT_TRUE(code == StatusCode::kResourceExhausted ||
                  code == StatusCode::kInvalidArgument);  // Retried later.
    }
  }

  void FreeRequest(RequestId id) {
    const Status got = manager_.Free(id);
    ASSERT_THAT(got, IsOk());
    ASSERT_EQ(model_.Free(id), StatusCode::kOk);
    live_.erase(id);
  }

  void FreeOne() {
    if (live_.empty() || Percent(3)) {
      const RequestId unknown = next_id_ + 1000;
      ASSERT_EQ(manager_.Free(unknown).code(), StatusCode::kNotFound);
      ASSERT_EQ(model_.Free(unknown), StatusCode::kNotFound);
      return;
    }
    ASSERT_NO_FATAL_FAILURE(FreeRequest(PickLive()));
  }

  void EvictOne() {
    std::vector<BlockId> cached_free;
    for (BlockId id : model_.FreeQueue()) {
      if (model_.block(id).has_key) cached_free.push_back(id);
    }
    // Mostly a real candidate; sometimes any id, including in-use, unkeyed,
    // null and out-of-range ones, which must be refused.
    const BlockId id = !cached_free.empty() && Percent(80)
                           ? cached_free[static_cast<size_t>(Uniform(
                                 0, static_cast<int>(cached_free.size()) - 1))]
                           : Uniform(-1, config_.num_blocks);
    const bool got = manager_.EvictCachedBlock(id);
    ASSERT_EQ(got, model_.Evict(id)) << "EvictCachedBlock(" << id << ")";
  }

  void CheckState() {
    const BlockPool& pool = PoolOf(manager_);
    const int32_t n = pool.num_blocks();
    ASSERT_EQ(n, model_.num_blocks());
    ASSERT_EQ(pool.null_block(), model_.null_block());

    const std::vector<BlockId> queue = pool.FreeQueueSnapshot();
    ASSERT_EQ(queue, model_.FreeQueue()) << "free queue order";
    ASSERT_EQ(pool.num_free_blocks(), static_cast<int32_t>(queue.size()));

    // References each block should have: one per live request holding it.
    std::vector<int32_t> holders(static_cast<size_t>(n), 0);
    ASSERT_EQ(manager_.num_requests(), model_.requests().size());
    for (const auto& [id, req] : model_.requests()) {
      const std::span<const BlockId> got = manager_.blocks(id);
      ASSERT_EQ(std::vector<BlockId>(got.begin(), got.end()), req.blocks)
          << "blocks of request " << id;
      for (BlockId b : req.blocks) {
        ASSERT_TRUE(pool.IsValid(b)) << "request " << id << " holds " << b;
        ASSERT_NE(std::optional<BlockId>(b), pool.null_block());
        ++holders[static_cast<size_t>(b)];
      }
    }

    std::vector<bool> queued(static_cast<size_t>(n), false);
    for (BlockId id : queue) {
      ASSERT_TRUE(pool.IsValid(id)) << "queued id " << id;
      ASSERT_FALSE(queued[static_cast<size_t>(id)]) << id << " queued twice";
      queued[static_cast<size_t>(id)] = true;
    }

    size_t keyed = 0;
    for (BlockId id = 0; id < n; ++id) {
      const BlockPool::Block& real = pool.block(id);
      const Model::Block& want = model_.block(id);
      ASSERT_EQ(real.ref_cnt, want.ref_cnt) << "ref count of block " << id;
      ASSERT_EQ(real.has_key(), want.has_key) << "has_key of block " << id;
      if (real.has_key()) {
        ++keyed;
        ASSERT_EQ(real.key.ToHex(), want.key.ToHex()) << "key of block " << id;
        ASSERT_EQ(real.num_tokens, want.tokens.size())
            << "token count of block " << id;
        if (pool.keeps_tokens()) {
          ASSERT_EQ(Copy(pool.block_tokens(id)), want.tokens)
              << "tokens of block " << id;
        }
        // The index finds a keyed block by its own key and tokens.
        const std::optional<BlockId> found =
            pool.GetCachedBlock(real.key, want.tokens);
        ASSERT_TRUE(found.has_value() && *found == id)
            << "block " << id << " not findable by its key";
      }
      // Invariants, checked here independently of CheckInvariants.
      ASSERT_GE(real.ref_cnt, 0) << "block " << id;
      if (pool.null_block() == id) {
        ASSERT_FALSE(queued[static_cast<size_t>(id)]) << "null block queued";
        ASSERT_FALSE(real.has_key()) << "null block keyed";
      } else {
        ASSERT_EQ(real.ref_cnt == 0, queued[static_cast<size_t>(id)])
            << "block " << id << " must be free xor in use; ref count "
            << real.ref_cnt;
        ASSERT_EQ(real.ref_cnt, holders[static_cast<size_t>(id)])
            << "ref count of block " << id << " vs requests holding it";
      }
    }
    ASSERT_EQ(pool.num_cached_blocks(), keyed);
    ASSERT_EQ(model_.index().size(), keyed);
    for (const auto& [key, id] : model_.index()) {
      ASSERT_TRUE(pool.IsValid(id));
      ASSERT_TRUE(pool.block(id).has_key()) << "index maps to unkeyed " << id;
      ASSERT_EQ(AsPair(pool.block(id).key), key) << "block " << id;
    }

    const PrefixCacheStats got = manager_.stats();
    const PrefixCacheStats& want = model_.stats();
    ASSERT_EQ(got.queries, want.queries);
    ASSERT_EQ(got.query_tokens, want.query_tokens);
    ASSERT_EQ(got.hits, want.hits);
    ASSERT_EQ(got.hit_tokens, want.hit_tokens);
    ASSERT_EQ(got.evictions, want.evictions);
    ASSERT_EQ(pool.stats().evictions, want.evictions);

    const Status invariants = pool.CheckInvariants();
    ASSERT_THAT(invariants, IsOk());
  }

  Config config_;
  std::mt19937_64 rng_;
  KeyHasher hasher_;
  KVCacheManager manager_;
  Model model_;
  std::vector<std::vector<TokenId>> prefixes_;
  std::vector<std::vector<TokenId>> recent_prompts_;
  std::map<RequestId, std::unique_ptr<Request>> live_;
  RequestId next_id_ = 0;
  Coverage coverage_;
};

void PrintTo(const Config& config, std::ostream* os) { *os << config.name; }

class PrefixCacheModel : public ::testing::TestWithParam<Config> {};

TEST_P(PrefixCacheModel, MatchesReferenceModel) {
  const Config& config = GetParam();
  Coverage total;
  for (uint64_t seed : kSeeds) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Runner runner(config, seed);
    ASSERT_NO_FATAL_FAILURE(runner.Run(kOpsPerSeed));
    const Coverage& c = runner.coverage();
    total.hits += c.hits;
    total.free_hits_touched += c.free_hits_touched;
    total.collisions += c.collisions;
    total.evictions += c.evictions;
    total.takeovers += c.takeovers;
    total.exhausted += c.exhausted;
    total.stale_rejected += c.stale_rejected;
    total.cannot_append += c.cannot_append;
  }
  // The runs must reach the cases the model exists to check.
  EXPECT_GT(total.exhausted, 0u);
  EXPECT_GT(total.cannot_append, 0u);
  if (config.enable_caching) {
    EXPECT_GT(total.hits, 0u);
    EXPECT_GT(total.free_hits_touched, 0u);
    EXPECT_GT(total.collisions, 0u);
    EXPECT_GT(total.evictions, 0u);
    EXPECT_GT(total.takeovers, 0u);
    EXPECT_GT(total.stale_rejected, 0u);
  } else {
    EXPECT_EQ(total.hits, 0u);
    EXPECT_EQ(total.evictions, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pools, PrefixCacheModel,
    ::testing::Values(Config{"Bs1Null", 12, 1, true, true, false},
                      Config{"Bs1NoNull", 8, 1, false, true, false},
                      Config{"Bs2NoNull", 12, 2, false, true, false},
                      Config{"Bs2Null", 24, 2, true, true, false},
                      Config{"Bs4Null", 28, 4, true, true, false},
                      Config{"Bs4NoNull", 16, 4, false, true, false},
                      Config{"Bs16Null", 24, 16, true, true, false},
                      Config{"Bs16NoNull", 12, 16, false, true, false},
                      Config{"Bs4NoCaching", 16, 4, true, false, false},
                      Config{"Bs4NullCheck", 28, 4, true, true, true},
                      Config{"Bs16NoNullCheck", 12, 16, false, true, true}),
    [](const ::testing::TestParamInfo<Config>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace tierkv
