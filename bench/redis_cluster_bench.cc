// The Redis Cluster remote tier's baseline: SET and GET of 2 MiB KV blocks
// on a real 6-node Redis Cluster (3 masters, 3 replicas, on loopback;
// testing/redis_cluster_harness.h, started once for the binary, snapshots
// off), with plain hiredis and through RedisClusterClient.
//
// What is measured (wall clock; bytes/s counts kBlocks x 2 MiB per
// iteration, i.e. 64 MiB, spread over the three masters by key slot):
// - BM_RawClusterSet: the baseline. One hiredis connection per master,
//   the keys grouped by master beforehand (no slot lookups, no redirect
//   handling). One iteration queues each master's SETs
//   (redisAppendCommandArgv), writes every master's pipeline out, then
//   reads every +OK (redisGetReply).
// - BM_RawClusterGet: the same with GETs; each 2 MiB reply is checked for
//   its length and freed, never copied.
// - BM_ClusterClientSet / BM_ClusterClientGet: one MultiSet / MultiGet of
//   the same keys and values through RedisClusterClient: slot per key,
//   grouping, per-node pipelines written out every 256 KiB, per-key
//   results; MultiGet copies each value into the std::string it returns.
// - BM_ClusterClientGetInto: MultiGetInto the same keys, each value read
//   off the socket into a caller's 2 MiB buffer allocated once (no
//   allocation per value, no copy through hiredis).
// - BM_RemotePut / BM_RemoteGet: the same bytes through RemoteTier
//   (tiers/remote_tier.h) as tierkvd drives it: kBlocks Spills of host
//   slots (each slot checked against its checksum, framed with the
//   verified header of 16 token ids, SET with one command per block by the
//   tier's I/O thread), all queued and then waited for; kBlocks Promotes
//   (pipelined GETs, each value read off the socket into its slot, header
//   aside, then verified there: header, fingerprint, key, token ids and
//   the payload's checksum). Scans are off; they run on a thread of their
//   own.
// Each get benchmark first checks, untimed, that the bytes it reads back
// are the bytes that were set. The ratios (client / raw) are kept, with
// the figures and the command, in BENCHMARKS.md.
#include <benchmark/benchmark.h>
#include <hiredis/hiredis.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <latch>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "testing/redis_cluster_harness.h"
#include "tiers/redis_cluster.h"
#include "tiers/remote_tier.h"

namespace tierkv {
namespace {

constexpr int kBlocks = 32;
constexpr size_t kBlockBytes = 2 << 20;

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

// The cluster, its keys by master, and the values; made once.
struct Fixture {
  std::unique_ptr<RedisClusterHarness> cluster;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::vector<std::string_view> views;
  // master node -> indexes into keys.
  std::map<int, std::vector<size_t>> by_master;
  std::string error;
};

// Made on first use; main destroys it, which stops the cluster and
// removes its directory.
std::unique_ptr<Fixture>& FixtureSlot() {
  static std::unique_ptr<Fixture> fixture;
  return fixture;
}

Fixture& GetFixture() {
  std::unique_ptr<Fixture>& slot = FixtureSlot();
  if (slot == nullptr) {
    slot = std::make_unique<Fixture>();
    Fixture* f = slot.get();
    RedisClusterHarnessOptions options;
    options.persistence = false;
    StatusOr<std::unique_ptr<RedisClusterHarness>> h =
        RedisClusterHarness::Start(options);
    if (!h.ok()) {
      f->error = h.status().ToString();
      return *f;
    }
    f->cluster = std::move(*h);
    for (int i = 0; i < kBlocks; ++i) {
      f->keys.push_back("bench:block:" + std::to_string(i));
      std::string value(kBlockBytes, '\0');
      for (size_t b = 0; b < kBlockBytes; b += 4096) {
        value[b] = static_cast<char>(i + b / 4096);
      }
      f->values.push_back(std::move(value));
      StatusOr<int> master = f->cluster->MasterOf(RedisKeySlot(f->keys[i]));
      if (!master.ok()) {
        f->error = master.status().ToString();
        return *f;
      }
      f->by_master[*master].push_back(static_cast<size_t>(i));
    }
    f->views.assign(f->values.begin(), f->values.end());
  }
  return *slot;
}

// One plain hiredis connection per master.
std::map<int, Context> ConnectMasters(Fixture& f) {
  std::map<int, Context> contexts;
  for (const auto& [master, list] : f.by_master) {
    Context c(redisConnect("127.0.0.1", f.cluster->port(master)));
    if (c == nullptr || c->err != 0) return {};
    contexts[master] = std::move(c);
  }
  return contexts;
}

bool FlushAll(std::map<int, Context>& contexts) {
  for (auto& [master, c] : contexts) {
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(c.get(), &done) != REDIS_OK) return false;
    }
  }
  return true;
}

// Queues each master's commands, writes them all out, reads every reply;
// `check` judges each reply. False on any failure.
template <typename Build, typename Check>
bool RawRound(Fixture& f, std::map<int, Context>& contexts, Build build,
              Check check) {
  for (auto& [master, list] : f.by_master) {
    for (const size_t i : list) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      build(i, &argv, &lens);
      redisAppendCommandArgv(contexts[master].get(),
                             static_cast<int>(argv.size()), argv.data(),
                             lens.data());
    }
  }
  if (!FlushAll(contexts)) return false;
  bool ok = true;
  for (auto& [master, list] : f.by_master) {
    for (const size_t i : list) {
      void* raw = nullptr;
      if (redisGetReply(contexts[master].get(), &raw) != REDIS_OK) return false;
      auto* reply = static_cast<redisReply*>(raw);
      ok = ok && check(i, *reply);
      freeReplyObject(reply);
    }
  }
  return ok;
}

void BuildSet(Fixture& f, size_t i, std::vector<const char*>* argv,
              std::vector<size_t>* lens) {
  *argv = {"SET", f.keys[i].data(), f.values[i].data()};
  *lens = {3, f.keys[i].size(), f.values[i].size()};
}

void BuildGet(Fixture& f, size_t i, std::vector<const char*>* argv,
              std::vector<size_t>* lens) {
  *argv = {"GET", f.keys[i].data()};
  *lens = {3, f.keys[i].size()};
}

void BM_RawClusterSet(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::map<int, Context> contexts = ConnectMasters(f);
  if (contexts.empty()) return state.SkipWithError("connecting failed");
  auto build = [&f](size_t i, auto* argv, auto* lens) {
    BuildSet(f, i, argv, lens);
  };
  auto check = [](size_t, const redisReply& r) {
    return r.type == REDIS_REPLY_STATUS;
  };
  for (auto _ : state) {
    if (!RawRound(f, contexts, build, check)) {
      return state.SkipWithError("a SET failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_RawClusterSet)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RawClusterGet(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::map<int, Context> contexts = ConnectMasters(f);
  if (contexts.empty()) return state.SkipWithError("connecting failed");
  auto build = [&f](size_t i, auto* argv, auto* lens) {
    BuildGet(f, i, argv, lens);
  };
  // Untimed: the bytes read back are the bytes set.
  const bool set = RawRound(
      f, contexts,
      [&f](size_t i, auto* argv, auto* lens) { BuildSet(f, i, argv, lens); },
      [](size_t, const redisReply& r) { return r.type == REDIS_REPLY_STATUS; });
  const bool same =
      RawRound(f, contexts, build, [&f](size_t i, const redisReply& r) {
        return r.type == REDIS_REPLY_STRING && r.len == f.values[i].size() &&
               std::memcmp(r.str, f.values[i].data(), r.len) == 0;
      });
  if (!set || !same) return state.SkipWithError("read back other bytes");
  auto check = [](size_t, const redisReply& r) {
    return r.type == REDIS_REPLY_STRING && r.len == kBlockBytes;
  };
  for (auto _ : state) {
    if (!RawRound(f, contexts, build, check)) {
      return state.SkipWithError("a GET failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_RawClusterGet)->Unit(benchmark::kMillisecond)->UseRealTime();

std::unique_ptr<RedisClusterClient> OpenClient(Fixture& f) {
  RedisClusterOptions options;
  options.seeds = f.cluster->Seeds();
  StatusOr<std::unique_ptr<RedisClusterClient>> client =
      RedisClusterClient::Open(options);
  return client.ok() ? std::move(*client) : nullptr;
}

void BM_ClusterClientSet(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::unique_ptr<RedisClusterClient> client = OpenClient(f);
  if (client == nullptr) return state.SkipWithError("Open failed");
  for (auto _ : state) {
    for (const Status& s : client->MultiSet(f.keys, f.views)) {
      if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_ClusterClientSet)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ClusterClientGet(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::unique_ptr<RedisClusterClient> client = OpenClient(f);
  if (client == nullptr) return state.SkipWithError("Open failed");
  for (const Status& s : client->MultiSet(f.keys, f.views)) {
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  const std::vector<StatusOr<std::string>> check = client->MultiGet(f.keys);
  for (int i = 0; i < kBlocks; ++i) {
    if (!check[i].ok() || *check[i] != f.values[i]) {
      return state.SkipWithError("read back other bytes");
    }
  }
  for (auto _ : state) {
    for (const StatusOr<std::string>& r : client->MultiGet(f.keys)) {
      if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_ClusterClientGet)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ClusterClientGetInto(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::unique_ptr<RedisClusterClient> client = OpenClient(f);
  if (client == nullptr) return state.SkipWithError("Open failed");
  for (const Status& s : client->MultiSet(f.keys, f.views)) {
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  std::vector<std::vector<char>> storage(kBlocks,
                                         std::vector<char>(kBlockBytes));
  std::vector<std::span<char>> buffers(storage.begin(), storage.end());
  client->MultiGetInto(f.keys, buffers);
  for (int i = 0; i < kBlocks; ++i) {
    if (std::memcmp(storage[i].data(), f.values[i].data(), kBlockBytes) != 0) {
      return state.SkipWithError("read back other bytes");
    }
  }
  for (auto _ : state) {
    for (const StatusOr<size_t>& r : client->MultiGetInto(f.keys, buffers)) {
      if (!r.ok()) return state.SkipWithError(r.status().ToString().c_str());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_ClusterClientGetInto)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A remote tier over 2 x kBlocks host slots of 2 MiB: the first kBlocks
// hold the fixture's values (the blocks spilled), the rest take promotions.
struct RemoteSlots {
  std::vector<std::vector<std::byte>> slots;
  std::vector<BlockKey> keys;
  std::vector<std::vector<TokenId>> tokens;
  std::vector<uint64_t> checksums;
  std::unique_ptr<RemoteTier> tier;
};

std::unique_ptr<RemoteSlots> OpenRemote(Fixture& f) {
  auto r = std::make_unique<RemoteSlots>();
  r->slots.assign(2 * kBlocks, std::vector<std::byte>(kBlockBytes));
  for (int i = 0; i < kBlocks; ++i) {
    std::memcpy(r->slots[i].data(), f.values[i].data(), kBlockBytes);
    r->keys.push_back(
        BlockKey{.lo = static_cast<uint64_t>(i) + 1, .hi = 0xbe7c4});
    std::vector<TokenId> tokens(16);
    for (int t = 0; t < 16; ++t) tokens[t] = i * 16 + t;
    r->tokens.push_back(std::move(tokens));
    r->checksums.push_back(XXH3_64bits(r->slots[i].data(), kBlockBytes));
  }
  RemoteTierOptions options;
  options.redis.seeds = f.cluster->Seeds();
  options.store_fingerprint = "bench-layout,model=bench";
  options.tenant = "bench";
  options.block_bytes = kBlockBytes;
  options.slot_memory = [slots = &r->slots](BlockId slot) {
    return std::span<std::byte>((*slots)[slot]);
  };
  StatusOr<std::unique_ptr<RemoteTier>> tier = RemoteTier::Open(options);
  if (!tier.ok()) return nullptr;
  r->tier = std::move(*tier);
  return r;
}

// Spills every block (slots 0..kBlocks-1) and waits for them; OK or the
// first failure.
Status SpillAll(RemoteSlots& r) {
  std::latch done(kBlocks);
  std::atomic<bool> failed{false};
  for (int i = 0; i < kBlocks; ++i) {
    r.tier->Spill(r.keys[i], r.tokens[i], static_cast<BlockId>(i),
                  r.checksums[i], [&](Status s) {
                    if (!s.ok()) failed = true;
                    done.count_down();
                  });
  }
  done.wait();
  return failed ? Status::Unavailable("a spill failed") : Status::Ok();
}

// Promotes every block into slots kBlocks..2 kBlocks-1 and waits.
Status PromoteAll(RemoteSlots& r) {
  std::latch done(kBlocks);
  std::atomic<bool> failed{false};
  for (int i = 0; i < kBlocks; ++i) {
    r.tier->Promote(r.keys[i], r.tokens[i], static_cast<BlockId>(kBlocks + i),
                    [&](StatusOr<uint64_t> s) {
                      if (!s.ok()) failed = true;
                      done.count_down();
                    });
  }
  done.wait();
  return failed ? Status::Unavailable("a promotion failed") : Status::Ok();
}

void BM_RemotePut(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::unique_ptr<RemoteSlots> r = OpenRemote(f);
  if (r == nullptr) return state.SkipWithError("RemoteTier::Open failed");
  for (auto _ : state) {
    if (Status s = SpillAll(*r); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_RemotePut)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RemoteGet(benchmark::State& state) {
  Fixture& f = GetFixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  std::unique_ptr<RemoteSlots> r = OpenRemote(f);
  if (r == nullptr) return state.SkipWithError("RemoteTier::Open failed");
  // Untimed: the bytes promoted are the bytes spilled.
  if (!SpillAll(*r).ok() || !PromoteAll(*r).ok()) {
    return state.SkipWithError("spill or promotion failed");
  }
  for (int i = 0; i < kBlocks; ++i) {
    if (r->slots[kBlocks + i] != r->slots[i]) {
      return state.SkipWithError("promoted other bytes");
    }
  }
  for (auto _ : state) {
    if (Status s = PromoteAll(*r); !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}
BENCHMARK(BM_RemoteGet)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tierkv

// The cluster shares the machine's cores with the benchmark: a load that
// comes and goes (another build, a scan) moves a whole benchmark's figure.
// Unless the command line says otherwise, each benchmark runs 5 times, the
// runs of all of them in a random interleaved order, and the median is the
// figure, so a client and its raw baseline see the same load.
int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  auto given = [&](std::string_view flag) {
    return std::any_of(args.begin(), args.end(), [&](const char* a) {
      return std::string_view(a).starts_with(flag);
    });
  };
  char repetitions[] = "--benchmark_repetitions=5";
  char interleave[] = "--benchmark_enable_random_interleaving=true";
  if (!given("--benchmark_repetitions")) args.push_back(repetitions);
  if (!given("--benchmark_enable_random_interleaving")) {
    args.push_back(interleave);
  }
  argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  argv = args.data();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  tierkv::FixtureSlot().reset();
  return 0;
}
