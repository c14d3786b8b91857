// tierkv_test_worker: a worker process for the tierkvd integration tests.
// Every mode takes optional leading `--model NAME` (ClientOptions::model;
// default: the unnamed model) and `--tenant NAME` (ClientOptions::tenant;
// default: the shared tenant), in that order.
//   tierkv_test_worker store|load|hang-store SOCKET SEED BLOCKS
// store: computes BLOCKS blocks of a prompt derived from SEED, fills them
//   with bytes derived from SEED, stores them; prints "checksum <hex>".
// load: looks the same prompt up (plus one token), loads the hit; prints
//   "hit <tokens> checksum <hex>" over the loaded device blocks.
// hang-store: as store, but never completes the store: prints "READY" once
//   the store event is in flight, then waits to be killed.
//   tierkv_test_worker fill|verify|churn SOCKET SEED REQUESTS [BLOCKS]
// Requests 0..REQUESTS-1 of BLOCKS blocks (default 1) each, derived from
// SEED; every block's bytes are a function of its first token, so any
// worker can check a block another stored.
// fill: stores every request; prints "stored <requests>".
// verify: loads every request back (promotions from disk included) and
//   checks each loaded block's bytes; prints "blocks <n> hit <h> missed <m>
//   wrong <w>" (missed: blocks the store no longer had).
// churn: stores request r, then loads a random earlier one, for every r;
//   then verifies every request as verify does, printing the same line.
//   tierkv_test_worker workers SOCKET
// workers: attaches (named "workers-0") and prints "worker <name>" for each
//   worker its stats show, as they come over its channel.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/block_pattern.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"

namespace tierkv {
namespace {

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

// A device of blocks + 2 blocks and a client attached to tierkvd with it.
struct Attached {
  std::unique_ptr<EmulatedDeviceTier> device;
  std::unique_ptr<Client> client;
};
// --tenant's NAME: the same for every client of the process.
std::string tenant;

StatusOr<Attached> Attach(const std::string& model, const std::string& mode,
                          const std::string& socket, uint32_t seed,
                          int32_t blocks) {
  Attached out;
  TIERKV_ASSIGN_OR_RETURN(
      out.device,
      EmulatedDeviceTier::Create(blocks + 2, TestLayout().BlockBytes()));
  ClientOptions options;
  options.socket_path = socket;
  options.layout = TestLayout();
  options.model = model;
  options.tenant = tenant;
  options.num_device_blocks = blocks + 2;
  options.name = mode + "-" + std::to_string(seed);
  options.device = out.device.get();
  TIERKV_ASSIGN_OR_RETURN(out.client, Client::Open(options));
  return out;
}

// ---- fill / verify / churn ------------------------------------------------

std::vector<TokenId> RequestTokens(uint32_t seed, int32_t request,
                                   int32_t blocks) {
  return FillRequestTokens(seed, request, blocks);
}

struct Tally {
  int64_t blocks = 0, hit = 0, missed = 0, wrong = 0;
};

class RequestRunner {
 public:
  RequestRunner(Client& c, EmulatedDeviceTier& device, int32_t blocks)
      : c_(c), device_(device), blocks_(blocks) {
    for (BlockId b = 1; b <= blocks + 1; ++b) device_blocks_.push_back(b);
  }

  Status Store(const std::vector<TokenId>& tokens) {
    const RequestId id = next_id_++;
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, c_.Lookup(id, tokens));
    (void)hit;
    TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                            c_.Allocate(id, device_blocks_, 0));
    (void)alloc;
    for (int32_t b = 0; b < blocks_; ++b) {
      FillBlock(tokens[b * 16], device_.block(b + 1));
    }
    TIERKV_ASSIGN_OR_RETURN(CommitResult commit,
                            c_.Commit(id, blocks_ * 16, device_blocks_));
    TIERKV_RETURN_IF_ERROR(Drain(commit.stores.size()));
    return c_.Finish(id);
  }

  // Loads the request's hit and checks every loaded block.
  Status Verify(std::vector<TokenId> tokens, Tally* tally) {
    const RequestId id = next_id_++;
    tokens.push_back(7);  // So every full block can hit.
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, c_.Lookup(id, tokens));
    TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                            c_.Allocate(id, device_blocks_, hit.hit_tokens));
    int32_t loaded = 0;
    if (alloc.load.has_value()) {
      std::vector<FinishedTransfer> done;
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (done.empty()) {
        if (std::chrono::steady_clock::now() > deadline) {
          return Status::Unavailable("a load never finished");
        }
        done = c_.WaitEvents(std::chrono::seconds(1));
      }
      TIERKV_RETURN_IF_ERROR(done[0].status);
      loaded = static_cast<int32_t>(done[0].event.device_blocks.size());
      TIERKV_RETURN_IF_ERROR(c_.Complete(done));
    }
    std::vector<std::byte> expected(device_.block_bytes());
    for (int32_t b = 0; b < loaded; ++b) {
      FillBlock(tokens[b * 16], expected);
      std::span<std::byte> got = device_.block(b + 1);
      if (std::memcmp(got.data(), expected.data(), expected.size()) != 0) {
        ++tally->wrong;
      }
    }
    tally->blocks += blocks_;
    tally->hit += loaded;
    tally->missed += blocks_ - loaded;
    return c_.Finish(id);
  }

 private:
  Status Drain(size_t events) {
    while (events > 0) {
      std::vector<FinishedTransfer> done =
          c_.WaitEvents(std::chrono::seconds(10));
      if (done.empty()) return Status::Unavailable("a store never finished");
      TIERKV_RETURN_IF_ERROR(c_.Complete(done));
      events -= done.size();
    }
    return Status::Ok();
  }

  Client& c_;
  EmulatedDeviceTier& device_;
  int32_t blocks_;
  std::vector<BlockId> device_blocks_;
  RequestId next_id_ = 1;
};

int RunMany(const std::string& model, const std::string& mode,
            const std::string& socket, uint32_t seed, int32_t requests,
            int32_t blocks) {
  auto attached = Attach(model, mode, socket, seed, blocks);
  if (!attached.ok()) return Fail(attached.status());
  auto& [device, client] = *attached;
  RequestRunner runner(*client, *device, blocks);
  Tally tally;
  std::mt19937 rng(seed);
  if (mode == "fill" || mode == "churn") {
    for (int32_t r = 0; r < requests; ++r) {
      Status s = runner.Store(RequestTokens(seed, r, blocks));
      if (s.ok() && mode == "churn") {
        Tally ignored;  // Checked for wrong bytes below, not for misses.
        s = runner.Verify(RequestTokens(seed, rng() % (r + 1), blocks),
                          &ignored);
        tally.wrong += ignored.wrong;
      }
      if (!s.ok()) return Fail(s);
    }
    if (mode == "fill") {
      std::printf("stored %d\n", requests);
      return 0;
    }
  }
  for (int32_t r = 0; r < requests; ++r) {
    if (Status s = runner.Verify(RequestTokens(seed, r, blocks), &tally);
        !s.ok()) {
      return Fail(s);
    }
  }
  std::printf("blocks %lld hit %lld missed %lld wrong %lld\n",
              static_cast<long long>(tally.blocks),
              static_cast<long long>(tally.hit),
              static_cast<long long>(tally.missed),
              static_cast<long long>(tally.wrong));
  return 0;
}

int Run(const std::string& model, const std::string& mode,
        const std::string& socket, uint32_t seed, int32_t blocks) {
  auto attached = Attach(model, mode, socket, seed, blocks);
  if (!attached.ok()) return Fail(attached.status());
  auto& [device, client] = *attached;
  Client& c = *client;
  std::vector<BlockId> device_blocks;
  for (BlockId b = 1; b <= blocks + 1; ++b) device_blocks.push_back(b);

  std::vector<TokenId> tokens = StorePrompt(seed, blocks);
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
                    Checksum(*device, hit->hit_tokens / 16)));
    return c.Finish(1).ok() ? 0 : 1;
  }
  for (BlockId b = 1; b <= blocks; ++b) {
    std::span<std::byte> bytes = device->block(b);
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
              static_cast<unsigned long long>(Checksum(*device, blocks)));
  return c.Finish(1).ok() ? 0 : 1;
}

int ListWorkers(const std::string& model, const std::string& socket) {
  StatusOr<Attached> attached = Attach(model, "workers", socket, 0, 1);
  if (!attached.ok()) return Fail(attached.status());
  StatusOr<CoordinatorStats> stats = attached->client->Stats();
  if (!stats.ok()) return Fail(stats.status());
  for (const WorkerStats& w : stats->workers) {
    std::printf("worker %s\n", w.name.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  std::string model;
  if (argc > 2 && std::string(argv[1]) == "--model") {
    model = argv[2];
    argv += 2;  // argv[0] is not used below.
    argc -= 2;
  }
  if (argc > 2 && std::string(argv[1]) == "--tenant") {
    tierkv::tenant = argv[2];
    argv += 2;
    argc -= 2;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "workers" && argc == 3)
    return tierkv::ListWorkers(model, argv[2]);
  if ((mode == "fill" || mode == "verify" || mode == "churn") &&
      (argc == 5 || argc == 6)) {
    return tierkv::RunMany(
        model, mode, argv[2], static_cast<uint32_t>(std::stoul(argv[3])),
        std::stoi(argv[4]), argc == 6 ? std::stoi(argv[5]) : 1);
  }
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: tierkv_test_worker [--model NAME] [--tenant NAME] "
                 "store|load|hang-store SOCKET SEED BLOCKS\n"
                 "       tierkv_test_worker [--model NAME] [--tenant NAME] "
                 "fill|verify|churn "
                 "SOCKET SEED REQUESTS [BLOCKS]\n"
                 "       tierkv_test_worker [--model NAME] [--tenant NAME] "
                 "workers SOCKET\n");
    return 2;
  }
  return tierkv::Run(model, argv[1], argv[2],
                     static_cast<uint32_t>(std::stoul(argv[3])),
                     std::stoi(argv[4]));
}
