// tierkv_test_worker: a worker process for the tierkvd integration tests.
//   tierkv_test_worker store|load|hang-store SOCKET SEED BLOCKS
// store: computes BLOCKS blocks of a prompt derived from SEED, fills them
//   with bytes derived from SEED, stores them; prints "checksum <hex>".
// load: looks the same prompt up (plus one token), loads the hit; prints
//   "hit <tokens> checksum <hex>" over the loaded device blocks.
// hang-store: as store, but never completes the store: prints "READY" once
//   the store event is in flight, then waits to be killed.
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ipc/client.h"
#include "tests/test_layout.h"

namespace tierkv {
namespace {

std::vector<TokenId> Prompt(uint32_t seed, int32_t blocks) {
  std::vector<TokenId> t(static_cast<size_t>(blocks) * 16);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 100003u + i * 7u + 1u;
  return t;
}

uint64_t Checksum(EmulatedDeviceTier& device, int32_t blocks) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (BlockId b = 1; b <= blocks; ++b) {
    std::span<std::byte> bytes = device.block(b);
    XXH3_64bits_update(state, bytes.data(), bytes.size());
  }
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

int Fail(const Status& s) {
  std::printf("error %s\n", s.ToString().c_str());
  return 1;
}

int Run(const std::string& mode, const std::string& socket, uint32_t seed,
        int32_t blocks) {
  auto device =
      EmulatedDeviceTier::Create(blocks + 2, TestLayout().BlockBytes());
  if (!device.ok()) return Fail(device.status());
  ClientOptions options;
  options.socket_path = socket;
  options.layout = TestLayout();
  options.num_device_blocks = blocks + 2;
  options.name = mode + "-" + std::to_string(seed);
  options.device = device->get();
  auto client = Client::Open(options);
  if (!client.ok()) return Fail(client.status());
  Client& c = **client;
  std::vector<BlockId> device_blocks;
  for (BlockId b = 1; b <= blocks + 1; ++b) device_blocks.push_back(b);

  std::vector<TokenId> tokens = Prompt(seed, blocks);
  if (mode == "load") tokens.push_back(7);
  auto hit = c.Lookup(1, tokens);
  if (!hit.ok()) return Fail(hit.status());
  auto alloc =
      c.Allocate(1, device_blocks, mode == "load" ? hit->hit_tokens : 0);
  if (!alloc.ok()) return Fail(alloc.status());
  if (mode == "load") {
    if (alloc->load.has_value()) {
      std::vector<FinishedTransfer> done;
      while (done.empty()) done = c.WaitEvents(std::chrono::seconds(10));
      if (!done[0].status.ok()) return Fail(done[0].status);
      if (Status s = c.Complete(done); !s.ok()) return Fail(s);
    }
    std::printf("hit %d checksum %016llx\n", hit->hit_tokens,
                static_cast<unsigned long long>(
                    Checksum(**device, hit->hit_tokens / 16)));
    return c.Finish(1).ok() ? 0 : 1;
  }
  for (BlockId b = 1; b <= blocks; ++b) {
    std::span<std::byte> bytes = (*device)->block(b);
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::byte>((i * 2654435761u + b * 97 + seed) >> 7);
    }
  }
  auto commit = c.Commit(1, blocks * 16, device_blocks);
  if (!commit.ok()) return Fail(commit.status());
  if (mode == "hang-store") {
    std::printf("READY\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  size_t pending = commit->stores.size();
  while (pending > 0) {
    std::vector<FinishedTransfer> done = c.WaitEvents(std::chrono::seconds(10));
    if (Status s = c.Complete(done); !s.ok()) return Fail(s);
    pending -= done.size();
  }
  std::printf("checksum %016llx\n",
              static_cast<unsigned long long>(Checksum(**device, blocks)));
  return c.Finish(1).ok() ? 0 : 1;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: tierkv_test_worker store|load|hang-store SOCKET SEED "
                 "BLOCKS\n");
    return 2;
  }
  return tierkv::Run(argv[1], argv[2],
                     static_cast<uint32_t>(std::stoul(argv[3])),
                     std::stoi(argv[4]));
}
