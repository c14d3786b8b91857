// A minimal engine using an installed tierkv, embedded (no daemon): store a
// computed block, then load it back for a second request.
#include <cstdio>
#include <vector>

#include "ipc/client.h"

int main() {
  tierkv::ClientOptions options;
  options.layout = {.num_layers = 2,
                    .num_kv_heads = 2,
                    .head_dim = 64,
                    .block_size = 16,
                    .dtype = tierkv::DType::kBF16};
  options.num_device_blocks = 8;
  options.embedded_host_bytes = 1 << 20;
  auto client = tierkv::Client::Open(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<tierkv::TokenId> prompt(33);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 100 + i;
  tierkv::Client& c = **client;
  // Request 1 computes two blocks and stores them.
  if (!c.Lookup(1, prompt).ok() || !c.Allocate(1, {{1, 2, 3}}, 0).ok())
    return 1;
  auto commit = c.Commit(1, 32, {{1, 2, 3}});
  if (!commit.ok() || commit->stores.size() != 1) return 1;
  auto done = c.WaitEvents(std::chrono::seconds(10));
  if (done.size() != 1 || !c.Complete(done).ok() || !c.Finish(1).ok()) return 1;
  // Request 2 finds both blocks on host.
  auto hit = c.Lookup(2, prompt);
  if (!hit.ok() || hit->hit_tokens != 32) return 1;
  std::printf("tierkv consumer: %d tokens hit on host\n", hit->hit_tokens);
  return c.Finish(2).ok() ? 0 : 1;
}
