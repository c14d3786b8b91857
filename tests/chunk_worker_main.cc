// tierkv_chunk_worker: a worker process for the chunk tests, with a device
// chunk pool backed by tierkvd (ClientChunkSource).
//   tierkv_chunk_worker SOCKET SEED TOKENS WAIT_MS compute|hold|abandon
// Fetches the chunk of TOKENS tokens derived from SEED, waiting at most
// WAIT_MS for another worker's publish (single_flight_wait), and prints
// "fetch hit=<0|1> lease=<0|1> waited=<0|1> calls=<n> ms=<elapsed>"; on a
// hit, "bytes ok" or "bytes wrong" for what was loaded (every block's bytes
// are a function of its first token, tests/block_pattern.h). On a miss:
// compute: fills the blocks and publishes them; prints "published calls=<n>
//   posts=<n>".
// hold: a miss with the compute lease prints "lease" and waits for SIGUSR1,
//   then computes and publishes as compute does.
// abandon: as hold, but on SIGUSR1 finishes the fetch's request without
//   publishing; prints "abandoned".
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/block_pattern.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tierkv/client_chunk_source.h"

namespace tierkv {
namespace {

int Fail(const Status& s) {
  std::printf("error %s\n", s.ToString().c_str());
  return 1;
}

std::vector<TokenId> ChunkTokens(uint32_t seed, int32_t tokens) {
  std::vector<TokenId> t(static_cast<size_t>(tokens));
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 7919u + i * 3u + 1u;
  return t;
}

void WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  int sig = 0;
  sigwait(&set, &sig);
}

int Run(const std::string& socket, uint32_t seed, int32_t tokens,
        int32_t wait_ms, const std::string& mode) {
  ClientOptions options;
  options.socket_path = socket;
  options.layout = TestLayout();
  options.num_device_blocks = 64;
  options.name = "chunk-" + mode;
  StatusOr<std::unique_ptr<Client>> opened = Client::Open(options);
  if (!opened.ok()) return Fail(opened.status());
  Client& client = **opened;
  ClientChunkSource source(
      &client, {.single_flight_wait = std::chrono::milliseconds(wait_ms)});
  const std::vector<TokenId> chunk = ChunkTokens(seed, tokens);
  const int32_t bs = options.layout.block_size;
  std::vector<BlockId> blocks;
  for (int32_t b = 0; b < (tokens + bs - 1) / bs; ++b) blocks.push_back(b + 1);
  auto* device = static_cast<EmulatedDeviceTier*>(client.device());

  const uint64_t calls = client.call_counts().calls;
  const auto start = std::chrono::steady_clock::now();
  StatusOr<bool> hit = source.Fetch(
      chunk, 0, {},
      [&](int32_t) -> StatusOr<std::vector<BlockId>> { return blocks; });
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  if (!hit.ok()) return Fail(hit.status());
  const ClientChunkSourceStats& stats = source.stats();
  std::printf(
      "fetch hit=%d lease=%d waited=%d calls=%llu ms=%lld\n", *hit ? 1 : 0,
      stats.leases > 0 ? 1 : 0, stats.waited > 0 ? 1 : 0,
      static_cast<unsigned long long>(client.call_counts().calls - calls),
      static_cast<long long>(ms));
  std::fflush(stdout);
  if (*hit) {
    bool ok = true;
    std::vector<std::byte> expected(options.layout.BlockBytes());
    for (size_t j = 0; j < blocks.size(); ++j) {
      FillBlock(chunk[j * static_cast<size_t>(bs)], expected);
      const std::span<std::byte> got = device->block(blocks[j]);
      ok = ok && std::equal(got.begin(), got.end(), expected.begin());
    }
    std::printf("bytes %s\n", ok ? "ok" : "wrong");
    return 0;
  }
  if (stats.leases > 0 && mode != "compute") {
    std::printf("lease\n");
    std::fflush(stdout);
    WaitForSignal();
    if (mode == "abandon") {
      if (Status s = client.Finish(1); !s.ok()) return Fail(s);
      std::printf("abandoned\n");
      return 0;
    }
  }
  for (size_t j = 0; j < blocks.size(); ++j) {
    FillBlock(chunk[j * static_cast<size_t>(bs)], device->block(blocks[j]));
  }
  const ClientCallCounts before = client.call_counts();
  if (Status s = source.Publish(chunk, 0, {}, blocks); !s.ok()) return Fail(s);
  std::printf("published calls=%llu posts=%llu\n",
              static_cast<unsigned long long>(client.call_counts().calls -
                                              before.calls),
              static_cast<unsigned long long>(client.call_counts().posts -
                                              before.posts));
  return 0;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: tierkv_chunk_worker SOCKET SEED TOKENS WAIT_MS "
                 "compute|hold|abandon\n");
    return 2;
  }
  // Blocked before any thread starts, so sigwait alone takes it.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return tierkv::Run(argv[1], static_cast<uint32_t>(std::stoul(argv[2])),
                     std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
}
