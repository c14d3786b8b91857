// The RAG demo's worker process (tierkv-demo worker ...): attaches to
// tierkvd, runs its share of the requests through the chunk store and
// without any cache, and prints one result line per request.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/client_chunk_source.h"
#include "tierkv/device_tier.h"
#include "tierkv/kv_cache_manager.h"
#include "tools/demo/rag_demo.h"
#include "tools/demo/rag_demo_internal.h"

namespace tierkv::demo {

// ---------------------------------------------------------------------------
// The worker process.

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double RelativeL2(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return norm == 0 ? 0 : std::sqrt(diff / norm);
}

size_t ArgMax(std::span<const float> v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

Status RunRagWorker(const RagDemoOptions& o, std::ostream& out) {
  TIERKV_RETURN_IF_ERROR(ValidateRagOptions(o));
  if (o.socket_path.empty() || o.worker_index < 0 ||
      o.worker_index >= o.workers) {
    return Status::InvalidArgument(
        "a worker needs --socket and --worker-index in [0, --workers)");
  }
  const RagWorkload w = GenerateRagWorkload(o);
  TIERKV_ASSIGN_OR_RETURN(ReferenceModel model,
                          ReferenceModel::Create(RagModelConfig()));
  TIERKV_ASSIGN_OR_RETURN(
      ChunkKvStore store,
      CreateChunkKvStore(model, {.num_blocks = o.chunk_pool_blocks,
                                 .block_size = kBlockSize,
                                 .dtype = DType::kF32}));
  const KvLayout layout = store.layout();
  TIERKV_ASSIGN_OR_RETURN(
      std::unique_ptr<EmulatedDeviceTier> device,
      EmulatedDeviceTier::CreateOver(
          {store.memory(),
           static_cast<size_t>(o.chunk_pool_blocks) * layout.BlockBytes()},
          o.chunk_pool_blocks, layout.BlockBytes()));
  ClientOptions client_options;
  client_options.socket_path = o.socket_path;
  client_options.layout = layout;
  client_options.num_device_blocks = o.chunk_pool_blocks;
  client_options.name = "rag-worker-" + std::to_string(o.worker_index);
  client_options.device = device.get();
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                          Client::Open(client_options));
  ClientChunkSource tier(client.get());
  TIERKV_RETURN_IF_ERROR(store.SetTier(&tier));

  // The engine's main pool holds one request at a time; every assembled
  // prompt (separators dropped) has the same length.
  const int32_t max_tokens = o.system_tokens + o.question_tokens +
                             o.docs_per_prompt * o.document_tokens;
  const int32_t main_blocks = (max_tokens + kBlockSize - 1) / kBlockSize + 1;
  TIERKV_ASSIGN_OR_RETURN(
      KVCacheManager main,
      KVCacheManager::Create(
          {.pool = {.num_blocks = main_blocks, .block_size = kBlockSize}}));
  TIERKV_ASSIGN_OR_RETURN(PagedKvCache main_memory,
                          PagedKvCache::Create(layout, main_blocks));
  TIERKV_ASSIGN_OR_RETURN(PagedKvCache cold_cache,
                          PagedKvCache::Create(layout, main_blocks));
  std::optional<ChunkKvStore> private_store;
  if (o.verify) {
    TIERKV_ASSIGN_OR_RETURN(
        private_store,
        CreateChunkKvStore(model, {.num_blocks = o.chunk_pool_blocks,
                                   .block_size = kBlockSize,
                                   .dtype = DType::kF32}));
  }
  ChunkedPrefillOptions chunked;
  if (o.blend_ratio > 0) chunked.blend = BlendOptions{o.blend_ratio, 1};

  for (const RagRequest& r : w.requests) {
    if (r.id % o.workers != o.worker_index || r.id < o.request_begin ||
        (o.request_end >= 0 && r.id >= o.request_end)) {
      continue;
    }
    const ChunkStoreStats before = store.stats();
    const ClientChunkSourceStats tier_before = tier.stats();
    const auto t0 = std::chrono::steady_clock::now();
    TIERKV_ASSIGN_OR_RETURN(
        ChunkedPrefillResult cached,
        ChunkedPrefill(model, &store, r.prompt, w.separator, chunked,
                       MainKvPool{.manager = &main, .memory = &main_memory}));
    const auto t1 = std::chrono::steady_clock::now();
    // cleanup_remapped_blocks: the request is done.
    main.ReleaseRemappedBlocks(cached.main_blocks);

    // The same tokens without any cache: a full causal prefill.
    const std::vector<TokenId>& tokens = cached.prompt.tokens;
    std::vector<int64_t> slots(tokens.size());
    std::iota(slots.begin(), slots.end(), 0);
    const auto t2 = std::chrono::steady_clock::now();
    TIERKV_ASSIGN_OR_RETURN(
        PrefillOutput cold,
        model.Prefill({.tokens = tokens, .slots = slots}, &cold_cache));
    const auto t3 = std::chrono::steady_clock::now();

    std::string verified = "-";
    if (private_store.has_value()) {
      TIERKV_ASSIGN_OR_RETURN(
          ChunkedPrefillResult own,
          ChunkedPrefill(model, &*private_store, r.prompt, w.separator, chunked,
                         &cold_cache));
      verified = own.output.logits == cached.output.logits ? "1" : "0";
    }
    const ChunkStoreStats after = store.stats();
    const ClientChunkSourceStats tier_after = tier.stats();
    out << "result id=" << r.id << " worker=" << o.worker_index
        << " cached_us=" << std::llround(Seconds(t1 - t0) * 1e6)
        << " cold_us=" << std::llround(Seconds(t3 - t2) * 1e6)
        << " pool=" << after.pool_hits - before.pool_hits
        << " host=" << tier_after.host_hits - tier_before.host_hits
        << " disk=" << tier_after.disk_hits - tier_before.disk_hits
        << " computed=" << after.computed - before.computed
        << " errors=" << after.tier_errors - before.tier_errors
        << " dev=" << std::setprecision(6)
        << RelativeL2(cached.output.logits, cold.logits)
        << " top1=" << (ArgMax(cached.output.logits) == ArgMax(cold.logits))
        << " verified=" << verified << '\n'
        << std::flush;
  }
  if (store.stats().tier_errors > 0) {
    std::cerr << "worker " << o.worker_index << ": "
              << store.stats().tier_errors
              << " chunk tier errors (chunks computed instead); last: "
              << store.last_tier_error().ToString() << '\n';
  }
  return Status::Ok();
}

}  // namespace tierkv::demo
