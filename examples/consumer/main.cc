// A minimal engine using an installed tierkv. Attached (linked against
// tierkv::client only, no RocksDB): `consumer --socket PATH` attaches to the
// tierkvd serving PATH. Embedded (linked against tierkv::embedded): with no
// --socket, `consumer` runs a store in its own process. Either way it
// stores a computed block, then loads it back for a second request.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/status.h"  // The consumer's own header of that name.
#include "tierkv/client.h"
#include "tierkv/version.h"
#ifdef CONSUMER_EMBEDDED
#include "tierkv/embedded.h"
#endif

namespace {

int Fail(const std::string& what, const tierkv::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  static_assert(consumer::StatusOr::kFine != consumer::StatusOr::kBroken);
  tierkv::ClientOptions options;
  options.layout = {.num_layers = 2,
                    .num_kv_heads = 2,
                    .head_dim = 64,
                    .block_size = 16,
                    .dtype = tierkv::DType::kBF16};
  options.num_device_blocks = 8;
  options.name = "consumer";
  if (argc == 3 && std::strcmp(argv[1], "--socket") == 0) {
    options.socket_path = argv[2];
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: consumer [--socket PATH]\n");
    return 2;
  }
#ifdef CONSUMER_EMBEDDED
  auto client = options.socket_path.empty() ? tierkv::OpenEmbedded(options)
                                            : tierkv::Client::Open(options);
#else
  auto client = tierkv::Client::Open(options);
#endif
  if (!client.ok()) return Fail("open", client.status());
  // A prompt of this process's own, so that consumers sharing a tierkvd
  // each store theirs.
  std::vector<tierkv::TokenId> prompt(33);
  const auto base = static_cast<tierkv::TokenId>(getpid()) * 64;
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = base + i;
  tierkv::Client& c = **client;
  const std::vector<tierkv::BlockId> blocks = {1, 2, 3};
  // Request 1 computes two blocks and stores them.
  if (auto s = c.Lookup(1, prompt); !s.ok()) return Fail("lookup", s.status());
  if (auto s = c.Allocate(1, blocks, 0); !s.ok()) {
    return Fail("allocate", s.status());
  }
  auto commit = c.Commit(1, 32, blocks);
  if (!commit.ok()) return Fail("commit", commit.status());
  if (commit->stores.size() != 1) {
    std::fprintf(stderr, "consumer: expected one store event\n");
    return 1;
  }
  auto done = c.WaitEvents(std::chrono::seconds(10));
  if (done.size() != 1) {
    std::fprintf(stderr, "consumer: the store did not finish\n");
    return 1;
  }
  if (auto s = c.Complete(done); !s.ok()) return Fail("complete", s);
  if (auto s = c.Finish(1); !s.ok()) return Fail("finish", s);
  // Request 2 finds both blocks on host.
  auto hit = c.Lookup(2, prompt);
  if (!hit.ok()) return Fail("lookup", hit.status());
  if (hit->hit_tokens != 32) {
    std::fprintf(stderr, "consumer: %d tokens hit, expected 32\n",
                 hit->hit_tokens);
    return 1;
  }
  std::printf("tierkv %s consumer (%s): %d tokens hit on host\n",
              std::string(tierkv::Version()).c_str(),
              c.embedded() ? "embedded" : "attached", hit->hit_tokens);
  if (auto s = c.Finish(2); !s.ok()) return Fail("finish", s);
  return 0;
}
