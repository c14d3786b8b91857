// An engine's request loop over a tierkvd, one request at a time, riding
// through tierkvd restarts. It shows the order of calls an engine makes:
//
//   device prefix hit  KVCacheManager::GetComputedBlocks
//   tierkvd hit        Client::Lookup (after the device hit)
//   main-pool blocks   KVCacheManager::AllocateSlots(..., num_external)
//                      (the loaded blocks are keyed only once they land)
//   load               Client::Allocate, then WaitEvents until it is back
//   landed             Client::Complete, KVCacheManager::CompleteExternalLoad,
//                      then AllocateSlots for the rest, from its
//                      num_computed_tokens (no new blocks; keys them)
//   forward pass       fill the blocks from there
//   eager store        Client::Commit, WaitEvents, Complete
//   done               Client::Finish, KVCacheManager::Free
//
// When tierkvd goes away (killed, restarting, stopped past the call
// deadline), every call fails; the engine drops the request, completes what
// the client hands back (a lost load comes back failed, so nothing is
// keyed without its bytes) and calls Reconnect until tierkvd answers again.
//
//   tierkv_example_engine SOCKET [REQUESTS]   (default: until SIGTERM)
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tierkv/client.h"
#include "tierkv/kv_cache_manager.h"

namespace {

using namespace tierkv;

volatile sig_atomic_t g_stop = 0;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 64;

// Waits for `n` finished transfers, completing them as they come.
StatusOr<std::vector<FinishedTransfer>> WaitFor(Client& client, size_t n) {
  std::vector<FinishedTransfer> all;
  while (all.size() < n) {
    std::vector<FinishedTransfer> done =
        client.WaitEvents(std::chrono::seconds(1));
    TIERKV_RETURN_IF_ERROR(client.Complete(done));
    all.insert(all.end(), done.begin(), done.end());
    if (!client.connected() && client.transfers_in_flight() == 0 &&
        client.loads_pending() == 0 && done.empty()) {
      return client.connection_status();
    }
  }
  return all;
}

// One request through device, tierkvd, forward pass and eager store.
// Returns the tokens it did not compute.
StatusOr<int32_t> Serve(KVCacheManager& engine, Client& client,
                        const Request& r) {
  const ComputedBlocks device = engine.GetComputedBlocks(r);
  TIERKV_ASSIGN_OR_RETURN(LookupResult hit,
                          client.Lookup(r.id(), r.tokens(), device.num_tokens));
  TIERKV_ASSIGN_OR_RETURN(
      std::vector<BlockId> fresh,
      engine.AllocateSlots(r, r.num_tokens() - device.num_tokens, device,
                           hit.hit_tokens));
  (void)fresh;
  std::span<const BlockId> blocks = engine.blocks(r.id());
  TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                          client.Allocate(r.id(), blocks, hit.hit_tokens));
  int32_t computed = device.num_tokens;
  if (alloc.load.has_value()) {
    TIERKV_ASSIGN_OR_RETURN(std::vector<FinishedTransfer> load,
                            WaitFor(client, 1));
    TIERKV_ASSIGN_OR_RETURN(
        ExternalLoadResult landed,
        engine.CompleteExternalLoad(r, load[0].loaded_blocks() * kBlockSize));
    // Schedule the rest (the blocks are held already): this keys them.
    computed = landed.num_computed_tokens;
    TIERKV_RETURN_IF_ERROR(
        engine.AllocateSlots(r, r.num_tokens() - computed).status());
  }
  // The forward pass would compute tokens [computed, num_tokens) here.
  TIERKV_ASSIGN_OR_RETURN(CommitResult commit,
                          client.Commit(r.id(), r.num_tokens(), blocks));
  TIERKV_RETURN_IF_ERROR(WaitFor(client, commit.stores.size()).status());
  return computed;
}

int Run(const std::string& socket, long requests) {
  auto engine = KVCacheManager::Create({.pool = {.num_blocks = kBlocks,
                                                 .block_size = kBlockSize,
                                                 .reserve_null_block = true}});
  ClientOptions options;
  options.socket_path = socket;
  options.layout = {.num_layers = 2,
                    .num_kv_heads = 2,
                    .head_dim = 64,
                    .block_size = kBlockSize,
                    .dtype = DType::kBF16};
  options.num_device_blocks = kBlocks;
  options.engine = &*engine;
  options.name = "example-engine";
  auto client = Client::Open(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  const KeyHasher hasher(
      {.model_fingerprint = options.layout.Fingerprint(), .tenant = ""});
  Client& c = **client;
  for (long id = 1; !g_stop && (requests == 0 || id <= requests); ++id) {
    // Eight documents shared by every request, then a question of its own.
    std::vector<TokenId> tokens;
    for (int32_t i = 0; i < 4 * kBlockSize; ++i) {
      tokens.push_back(static_cast<TokenId>((id % 8) * 1000 + i));
    }
    for (int32_t i = 0; i < 20; ++i) {
      tokens.push_back(static_cast<TokenId>(1'000'000 + id * 32 + i));
    }
    const Request r(static_cast<RequestId>(id), tokens, kBlockSize, hasher);
    StatusOr<int32_t> computed = Serve(*engine, c, r);
    (void)c.Finish(r.id());
    (void)engine->Free(r.id());
    if (computed.ok()) {
      std::printf("request %ld: %d of %d tokens cached\n", id, *computed,
                  r.num_tokens());
    } else if (!c.connected()) {
      std::printf("request %ld dropped: %s\n", id,
                  computed.status().ToString().c_str());
      while (!g_stop && !c.Reconnect().ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (!g_stop) std::printf("reconnected to tierkvd\n");
    } else {
      std::fprintf(stderr, "%s\n", computed.status().ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s SOCKET [REQUESTS]\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGTERM, [](int) { g_stop = 1; });
  signal(SIGINT, [](int) { g_stop = 1; });
  return Run(argv[1], argc == 3 ? std::stol(argv[2]) : 0);
}
