// Control-message round trip: one Lookup of a 256-block request (4,096
// tokens of 16-token blocks, a 16 KiB request frame) from a worker to the
// coordinator and back.
//
// What is measured: each iteration is one round trip timed with
// steady_clock (manual time, so the reported time is the mean round trip).
// Counters p50_us, p99_us and mean_us are taken over every iteration of a
// run; items/s is round trips per second.
// - BM_ControlRoundTrip/SharedMemory: Client::Lookup attached to an
//   ipc::Server started in this process. The server's session thread serves
//   the worker's shared-memory control channel, so request and reply cross
//   threads through the shared segment and its futex exactly as they do
//   with tierkvd in another process. Timed: the client encodes, the channel
//   call (spin, then futex), the server decodes, dispatches to the
//   coordinator under its mutex, encodes and responds; the client decodes.
// - BM_ControlRoundTrip/UnixSocket: the baseline. The same frames over a
//   connected Unix stream socket (socketpair) to a server thread that reads
//   the request frame fully, decodes it, dispatches it under a mutex to a
//   coordinator in the same state, encodes the reply and writes it back. The
//   client encodes the request and decodes the reply on every call, as
//   Client does. Both paths do the same work; only the transport differs.
// - BM_ControlRoundTrip/UnixSocketCannedReply: a stricter baseline. The
//   socket server still decodes the request but answers with pre-encoded
//   reply bytes (the same bytes) and never touches a coordinator, so this is
//   transport plus codec only.
// - .../SharedMemorySplitCpus and .../UnixSocketSplitCpus: the same two
//   paths with the client pinned to CPU 0 and the server thread to CPU 1.
//   The unpinned variants are the figures; these show how much of them is
//   the two ends sharing a CPU (the channel spins before it sleeps, so two
//   ends on one CPU cost each other a spin per hop; see BENCHMARKS.md).
// - BM_ControlRoundTripEmbedded: Client in embedded mode, for reference:
//   Dispatch is a function call (no encoding, no transport).
//
// Every lookup hits: the 256 blocks are stored once before timing, and a
// lookup reports 255 of them (at most num_tokens - 1 tokens may hit), pinned.
// All iterations reuse one request id with the same tokens, as an engine's
// scheduler asks again for a request it cannot schedule yet: the
// coordinator keeps the keys and pins of the blocks that did not change.
// - .../SharedMemory16: the same for a 16-block (256-token) request.
// - .../SharedMemoryFresh, .../SharedMemoryFresh16: every lookup is of other
//   tokens than the last (two stored prompts, alternately), so each one
//   hashes every key and probes and pins every block anew.
// - BM_LookupCost/blocks/fresh: the coordinator's own work for those four
//   (embedded, no transport).
// - BM_LookupStep/requests/batched: one scheduler step's lookups of 1, 8 or
//   64 waiting requests of 256 tokens, one Lookup each or one LookupBatch;
//   items/s is requests per second for one worker.
// - BM_PromotedLoadLatency: from a promotion from disk landing on host to
//   the worker starting the load's copy (tierkvd's readiness signal, the
//   worker waking, one ReadyLoads round trip). p50_us, p99_us, mean_us.
//
// Reading statistics (tierkv-admin stats, metrics, watch), and what readers
// cost the request path. One server in this process, as above, publishing
// its stats page every 100 ms (tierkvd's default).
// - BM_StatsRead/Page: StatsPageReader::Read of the server's page: copy the
//   snapshot under the sequence lock, decode it. No server thread runs.
// - BM_StatsRead/Socket: the baseline, what tierkv-admin did before the
//   page: ipc::SocketCall(StatsRequest) to the server's Unix socket
//   (connect, frame, the listener thread takes the coordinator's mutex for
//   a snapshot, reply).
// - BM_LookupWhileStatsPolled/<reader>/<pause_us>: the SharedMemory round
//   trip above, while a reader thread reads stats in a loop from the page
//   or the socket, pausing pause_us between reads (0: flat out, a runaway
//   scraper; 100: near the socket's flat-out rate, so both read about
//   equally often; 1000: a thousand reads a second). Quiet has no reader: the
//   baseline. Counter reads_per_s: the reader's rate.
//
// The bar (control-channel issue): SharedMemory's p50 at least 1.5x lower
// than UnixSocket's. Figures and the command that produced them are kept in
// BENCHMARKS.md.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/server.h"
#include "ipc/service.h"
#include "ipc/socket_call.h"
#include "ipc/stats_page.h"
#include "src/coordinator.h"
#include "tierkv/client.h"
#include "tierkv/device_tier.h"
#include "tierkv/embedded.h"

namespace tierkv {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 256;
constexpr int32_t kTokens = kBlocks * kBlockSize;
constexpr int32_t kExpectedHit = kTokens - kBlockSize;  // 255 blocks.
constexpr RequestId kStoreRequest = 1;
constexpr RequestId kLookupRequest = 2;
constexpr RequestId kOtherStoreRequest = 3;
// Both prompts (Tokens, OtherTokens) fit, with room to spare.
constexpr int32_t kHostSlots = 2 * kBlocks + 88;

KvLayout BenchLayout() {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 2,
                  .head_dim = 64,
                  .block_size = kBlockSize,
                  .dtype = DType::kBF16};
}

std::vector<TokenId> RandomTokens(uint64_t seed, int32_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<TokenId> dist(0, 128'000);  // Llama-3.
  std::vector<TokenId> v(n);
  for (TokenId& t : v) t = dist(rng);
  return v;
}

// The prompt every path stores and looks up.
const std::vector<TokenId>& Tokens() {
  static const std::vector<TokenId> tokens = RandomTokens(42, kTokens);
  return tokens;
}
// A second stored prompt, which the Fresh variants alternate with the
// first so that no lookup finds the previous one's keys to keep.
const std::vector<TokenId>& OtherTokens() {
  static const std::vector<TokenId> tokens = RandomTokens(43, kTokens);
  return tokens;
}

std::vector<BlockId> DeviceBlocks() {
  std::vector<BlockId> v(kBlocks);
  std::iota(v.begin(), v.end(), 1);  // Block 0 stays unused, as engines do.
  return v;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "control_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T ValueOrDie(StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + v.status().ToString());
  return std::move(*v);
}

void OkOrDie(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

// Stores both prompts' 256 blocks through a client, so later lookups hit.
void StoreThroughClient(Client& client) {
  const std::vector<BlockId> blocks = DeviceBlocks();
  for (const auto& [request, tokens] :
       {std::pair{kStoreRequest, &Tokens()},
        std::pair{kOtherStoreRequest, &OtherTokens()}}) {
    (void)ValueOrDie(client.Lookup(request, *tokens), "lookup");
    (void)ValueOrDie(client.Allocate(request, blocks, 0), "allocate");
    CommitResult commit =
        ValueOrDie(client.Commit(request, kTokens, blocks), "commit");
    size_t pending = commit.stores.size();
    while (pending > 0) {
      std::vector<FinishedTransfer> done =
          client.WaitEvents(std::chrono::seconds(10));
      OkOrDie(client.Complete(done), "complete");
      pending -= std::min(pending, done.size());
    }
    OkOrDie(client.Finish(request), "finish");
  }
}

// The same, straight on a coordinator: it only keeps metadata, so there is
// nothing to copy.
void StoreInCoordinator(Coordinator& c, WorkerId worker) {
  const std::vector<BlockId> blocks = DeviceBlocks();
  (void)ValueOrDie(c.Lookup(worker, kStoreRequest, Tokens(), 0, {}), "lookup");
  (void)ValueOrDie(c.Allocate(worker, kStoreRequest, blocks, 0), "allocate");
  CommitResult commit =
      ValueOrDie(c.Commit(worker, kStoreRequest, kTokens, blocks), "commit");
  std::vector<CompletedEvent> done;
  for (const TransferEvent& e : commit.stores) done.push_back({e.ref, true});
  OkOrDie(c.Complete(worker, done), "complete");
  OkOrDie(c.Finish(worker, kStoreRequest), "finish");
}

// Pins the calling thread to one CPU for its lifetime (threads it starts
// meanwhile inherit that), then restores its previous CPU set. cpu < 0: no-op.
class ScopedCpu {
 public:
  explicit ScopedCpu(int cpu) : active_(cpu >= 0) {
    if (!active_) return;
    pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
  }
  ~ScopedCpu() {
    if (active_)
      pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_);
  }
  ScopedCpu(const ScopedCpu&) = delete;
  ScopedCpu& operator=(const ScopedCpu&) = delete;

 private:
  bool active_;
  cpu_set_t saved_{};
};

// The split variants put the client on kClientCpu and the server thread on
// kServerCpu.
constexpr int kClientCpu = 0;
constexpr int kServerCpu = 1;

ClientOptions BaseClientOptions() {
  ClientOptions options;
  options.layout = BenchLayout();
  options.num_device_blocks = kBlocks + 1;
  options.name = "control_bench";
  return options;
}

// tierkvd's machinery in this process, and a worker attached to it. Built
// once per process: Google Benchmark calls a benchmark function several
// times per run.
struct SharedMemoryPath {
  std::string dir;
  std::string store;
  std::unique_ptr<ipc::Server> server;
  std::unique_ptr<Client> client;

  // server_cpu >= 0: the server's threads (its listener, and so the
  // session thread the listener starts) run on that CPU only.
  // `name` tells the paths' stores apart: each static path lives until exit.
  explicit SharedMemoryPath(int server_cpu = -1, const std::string& name = "") {
    char tmpl[] = "/tmp/control_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die(std::strerror(errno));
    dir = tmpl;
    ipc::ServerOptions options;
    options.store = "control-bench-" + std::to_string(getpid()) +
                    (server_cpu >= 0 ? "-split" : "") + name;
    store = options.store;
    options.socket_path = dir + "/tierkvd.sock";
    options.host_capacity_bytes = kHostSlots * BenchLayout().BlockBytes();
    options.layout = BenchLayout();
    // The one worker holds the whole request pinned; the default share
    // (half the host) would cut its lookups short.
    options.caps.worker_pin_share = 1.0;
    {
      ScopedCpu pin(server_cpu);
      server = ValueOrDie(ipc::Server::Start(options), "start server");
    }
    ClientOptions client_options = BaseClientOptions();
    client_options.socket_path = options.socket_path;
    client = ValueOrDie(Client::Open(client_options), "attach");
    StoreThroughClient(*client);
  }
  ~SharedMemoryPath() {
    if (client != nullptr) (void)client->Finish(kLookupRequest);
    client.reset();  // Detach before the server stops.
    server.reset();
    std::filesystem::remove_all(dir);
  }
};

struct EmbeddedPath {
  std::unique_ptr<Client> client;

  EmbeddedPath() {
    ClientOptions options = BaseClientOptions();
    EmbeddedOptions embedded;
    embedded.host_bytes = kHostSlots * BenchLayout().BlockBytes();
    client = ValueOrDie(OpenEmbedded(options, embedded), "open embedded");
    StoreThroughClient(*client);
  }
};

Status ReadAll(int fd, std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return Status::Unavailable(got == 0 ? "peer closed"
                                          : std::strerror(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

Status WriteAll(int fd, std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return Status::Unavailable(std::strerror(errno));
    p += put;
    n -= static_cast<size_t>(put);
  }
  return Status::Ok();
}

// One frame, header first (the payload length is in the header), as the
// client reads tierkvd's socket.
Status ReadFrame(int fd, std::vector<std::byte>* frame) {
  frame->resize(ipc::kFrameHeaderBytes);
  TIERKV_RETURN_IF_ERROR(ReadAll(fd, frame->data(), frame->size()));
  TIERKV_ASSIGN_OR_RETURN(uint32_t len,
                          ipc::PeekPayloadLength(*frame, 1 << 20));
  frame->resize(ipc::kFrameHeaderBytes + len);
  return ReadAll(fd, frame->data() + ipc::kFrameHeaderBytes, len);
}

// The baseline's server: a thread on one end of a Unix stream socketpair.
class SocketPath {
 public:
  // canned_reply: answer every request with these bytes instead of
  // dispatching it (it is still decoded).
  // server_cpu >= 0: the server thread runs on that CPU only.
  explicit SocketPath(std::vector<std::byte> canned_reply = {},
                      int server_cpu = -1)
      : canned_reply_(std::move(canned_reply)),
        coordinator_(
            ValueOrDie(Coordinator::Create({.layout = BenchLayout(),
                                            .host_slots = kHostSlots,
                                            .caps = {.worker_pin_share = 1.0}}),
                       "coordinator")) {
    worker_ = ValueOrDie(
        coordinator_.RegisterWorker({.layout = BenchLayout(),
                                     .num_device_blocks = kBlocks + 1,
                                     .tenant = "",
                                     .pid = static_cast<int32_t>(getpid()),
                                     .name = "control_bench"}),
        "register");
    StoreInCoordinator(coordinator_, worker_);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      Die(std::string("socketpair: ") + std::strerror(errno));
    }
    client_fd_ = fds[0];
    server_fd_ = fds[1];
    thread_ = std::thread([this, server_cpu] {
      ScopedCpu pin(server_cpu);
      Serve();
    });
  }
  ~SocketPath() {
    shutdown(client_fd_, SHUT_RDWR);  // The server's read sees EOF.
    thread_.join();
    close(client_fd_);
    close(server_fd_);
  }

  // One Lookup round trip, client side: what Client does, over the socket.
  StatusOr<int32_t> Lookup(std::span<const TokenId> tokens) {
    request_.clear();
    ipc::Encode(ipc::LookupRequest{.request = kLookupRequest,
                                   .num_computed_tokens = 0,
                                   .tokens = std::vector<TokenId>(
                                       tokens.begin(), tokens.end()),
                                   .extras = {}},
                &request_);
    TIERKV_RETURN_IF_ERROR(WriteAll(client_fd_, request_));
    TIERKV_RETURN_IF_ERROR(ReadFrame(client_fd_, &response_));
    TIERKV_ASSIGN_OR_RETURN(ipc::Message reply, ipc::Decode(response_));
    const auto* lookup = std::get_if<ipc::LookupReply>(&reply);
    if (lookup == nullptr) return ipc::StatusOf(reply);
    return lookup->result.hit_tokens;
  }

 private:
  void Serve() {
    std::vector<std::byte> request, response;
    while (ReadFrame(server_fd_, &request).ok()) {
      StatusOr<ipc::Message> message = ipc::Decode(request);
      std::span<const std::byte> out = canned_reply_;
      if (canned_reply_.empty()) {
        ipc::Message reply;
        if (!message.ok()) {
          reply = ipc::ErrorReply{message.status()};
        } else {
          std::lock_guard<std::mutex> guard(mu_);
          reply = ipc::Dispatch(coordinator_, worker_, *message);
        }
        response.clear();
        ipc::Encode(reply, &response);
        out = response;
      } else {
        benchmark::DoNotOptimize(message);
      }
      if (!WriteAll(server_fd_, out).ok()) break;
    }
  }

  const std::vector<std::byte> canned_reply_;
  std::mutex mu_;  // As tierkvd's sessions take around Dispatch.
  Coordinator coordinator_;
  WorkerId worker_ = 0;
  int client_fd_ = -1;
  int server_fd_ = -1;
  std::thread thread_;
  std::vector<std::byte> request_, response_;  // Client side.
};

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double p) {
  const auto rank = static_cast<size_t>(std::ceil(p * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// Times `call` (returns the lookup's hit tokens, `expected_hit` of them)
// once per iteration.
template <typename Call>
void TimeRoundTrips(benchmark::State& state, Call call,
                    int32_t expected_hit = kExpectedHit) {
  std::vector<double> us;
  us.reserve(1 << 16);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    StatusOr<int32_t> hit = call();
    const auto end = std::chrono::steady_clock::now();
    if (!hit.ok() || *hit != expected_hit) {
      state.SkipWithError(
          (hit.ok() ? "lookup hit " + std::to_string(*hit) + " tokens"
                    : hit.status().ToString())
              .c_str());
      return;
    }
    const double seconds = std::chrono::duration<double>(end - start).count();
    state.SetIterationTime(seconds);
    us.push_back(seconds * 1e6);
  }
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = Percentile(us, 0.50);
  state.counters["p99_us"] = Percentile(us, 0.99);
  state.counters["mean_us"] =
      std::accumulate(us.begin(), us.end(), 0.0) / us.size();
  state.SetItemsProcessed(state.iterations());
}

enum class Transport {
  kSharedMemory,
  kUnixSocket,
  kUnixSocketCannedReply,
  kSharedMemorySplitCpus,
  kUnixSocketSplitCpus,
  // The SharedMemory path with other requests (LookupVariant).
  kSharedMemory16,
  kSharedMemoryFresh,
  kSharedMemoryFresh16,
};

// A lookup of the first `blocks` blocks of the stored prompt by `client`
// under one request id, as an engine asks again for a waiting request;
// `fresh`: alternately of the two stored prompts, so each lookup is of
// other tokens than the last (every key hashed, every block probed and
// pinned anew). Every lookup hits all blocks but the last.
auto LookupVariant(Client* client, int32_t blocks, bool fresh) {
  return [client, blocks, fresh, odd = false]() mutable -> StatusOr<int32_t> {
    const std::vector<TokenId>& prompt =
        fresh && (odd = !odd) ? OtherTokens() : Tokens();
    TIERKV_ASSIGN_OR_RETURN(
        LookupResult r,
        client->Lookup(
            kLookupRequest,
            std::span(prompt).first(static_cast<size_t>(blocks) * kBlockSize)));
    return r.hit_tokens;
  };
}
constexpr int32_t HitOf(int32_t blocks) { return (blocks - 1) * kBlockSize; }

void BM_ControlRoundTrip(benchmark::State& state, Transport transport) {
  const std::vector<TokenId>& tokens = Tokens();
  auto shm_lookup = [&](SharedMemoryPath& path) {
    return [&tokens, client = path.client.get()]() -> StatusOr<int32_t> {
      TIERKV_ASSIGN_OR_RETURN(LookupResult r,
                              client->Lookup(kLookupRequest, tokens));
      return r.hit_tokens;
    };
  };
  switch (transport) {
    case Transport::kSharedMemory: {
      static SharedMemoryPath path;
      TimeRoundTrips(state, shm_lookup(path));
      break;
    }
    case Transport::kUnixSocket: {
      static SocketPath path;
      TimeRoundTrips(state, [&] { return path.Lookup(tokens); });
      break;
    }
    case Transport::kUnixSocketCannedReply: {
      static SocketPath path(ipc::Encode(
          ipc::LookupReply{LookupResult{.hit_tokens = kExpectedHit}}));
      TimeRoundTrips(state, [&] { return path.Lookup(tokens); });
      break;
    }
    case Transport::kSharedMemorySplitCpus: {
      static SharedMemoryPath path(kServerCpu);
      ScopedCpu pin(kClientCpu);
      TimeRoundTrips(state, shm_lookup(path));
      break;
    }
    case Transport::kUnixSocketSplitCpus: {
      static SocketPath path({}, kServerCpu);
      ScopedCpu pin(kClientCpu);
      TimeRoundTrips(state, [&] { return path.Lookup(tokens); });
      break;
    }
    case Transport::kSharedMemory16:
    case Transport::kSharedMemoryFresh:
    case Transport::kSharedMemoryFresh16: {
      static SharedMemoryPath path(-1, "-variants");
      const int32_t blocks =
          transport == Transport::kSharedMemoryFresh ? 256 : 16;
      TimeRoundTrips(state,
                     LookupVariant(path.client.get(), blocks,
                                   transport != Transport::kSharedMemory16),
                     HitOf(blocks));
      break;
    }
  }
}
BENCHMARK_CAPTURE(BM_ControlRoundTrip, SharedMemory, Transport::kSharedMemory)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, UnixSocket, Transport::kUnixSocket)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, UnixSocketCannedReply,
                  Transport::kUnixSocketCannedReply)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, SharedMemorySplitCpus,
                  Transport::kSharedMemorySplitCpus)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, UnixSocketSplitCpus,
                  Transport::kUnixSocketSplitCpus)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, SharedMemory16,
                  Transport::kSharedMemory16)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, SharedMemoryFresh,
                  Transport::kSharedMemoryFresh)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_ControlRoundTrip, SharedMemoryFresh16,
                  Transport::kSharedMemoryFresh16)
    ->UseManualTime();

void BM_ControlRoundTripEmbedded(benchmark::State& state) {
  static EmbeddedPath path;
  const std::vector<TokenId>& tokens = Tokens();
  TimeRoundTrips(state, [&]() -> StatusOr<int32_t> {
    TIERKV_ASSIGN_OR_RETURN(LookupResult r,
                            path.client->Lookup(kLookupRequest, tokens));
    return r.hit_tokens;
  });
}
BENCHMARK(BM_ControlRoundTripEmbedded)->UseManualTime();

// The coordinator's own work per lookup (embedded: no transport), for
// requests of range(0) blocks, repeated (range(1) == 0) or fresh (1), as
// LookupVariant.
void BM_LookupCost(benchmark::State& state) {
  static EmbeddedPath path;
  const auto blocks = static_cast<int32_t>(state.range(0));
  TimeRoundTrips(state,
                 LookupVariant(path.client.get(), blocks, state.range(1)),
                 HitOf(blocks));
}
BENCHMARK(BM_LookupCost)
    ->ArgNames({"blocks", "fresh"})
    ->ArgsProduct({{16, 256}, {0, 1}})
    ->UseManualTime();

// A scheduler step: the lookups of range(0) waiting requests (256 tokens
// each, none cached: each asks again every step, as vLLM's scheduler does
// for a request it cannot schedule yet), sent one Lookup at a time
// (range(1) == 0) or as one LookupBatch (1). items_per_second: requests
// looked up per second by one worker.
void BM_LookupStep(benchmark::State& state) {
  static SharedMemoryPath path(-1, "-step");
  const auto n = static_cast<size_t>(state.range(0));
  const bool batched = state.range(1) != 0;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<LookupQuery> queries;
  for (size_t i = 0; i < n; ++i) {
    prompts.push_back(RandomTokens(1000 + i, 16 * kBlockSize));
  }
  for (size_t i = 0; i < n; ++i) {
    queries.push_back({.request = 100 + i, .tokens = prompts[i]});
  }
  for (auto _ : state) {
    if (batched) {
      auto results = path.client->LookupBatch(queries);
      if (!results.ok()) {
        state.SkipWithError(results.status().ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(results->data());
      continue;
    }
    for (const LookupQuery& q : queries) {
      auto result = path.client->Lookup(q.request, q.tokens);
      if (!result.ok()) {
        state.SkipWithError(result.status().ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(result->hit_tokens);
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_LookupStep)
    ->ArgNames({"requests", "batched"})
    ->ArgsProduct({{1, 8, 64}, {0, 1}})
    ->UseRealTime();

// The server the stats benchmarks read from and look up through.
SharedMemoryPath& StatsPath() {
  static SharedMemoryPath path(-1, "-stats");
  return path;
}

enum class StatsSource { kNone, kPage, kSocket };

// One stats read from `source`; false (after SkipWithError) on failure.
class StatsReader {
 public:
  explicit StatsReader(StatsSource source) : source_(source) {
    SharedMemoryPath& path = StatsPath();
    socket_ = path.server->socket_path();
    if (source_ != StatsSource::kPage) return;
    // The first snapshot is published as the server starts.
    page_ =
        ValueOrDie(ipc::StatsPageReader::Open(ipc::StatsPageName(path.store)),
                   "open stats page");
  }

  Status Read() {
    if (source_ == StatsSource::kPage) {
      TIERKV_ASSIGN_OR_RETURN(ipc::StatsPageSnapshot snapshot, page_->Read());
      benchmark::DoNotOptimize(snapshot.stats.host.hit_blocks);
      return Status::Ok();
    }
    TIERKV_ASSIGN_OR_RETURN(ipc::Message reply,
                            ipc::SocketCall(socket_, ipc::StatsRequest{}));
    if (std::get_if<ipc::StatsReply>(&reply) == nullptr) {
      return ipc::StatusOf(reply).ok()
                 ? Status::Internal("unexpected reply to stats")
                 : ipc::StatusOf(reply);
    }
    return Status::Ok();
  }

 private:
  StatsSource source_;
  std::string socket_;
  std::optional<ipc::StatsPageReader> page_;
};

void BM_StatsRead(benchmark::State& state, StatsSource source) {
  StatsReader reader(source);
  for (auto _ : state) {
    if (Status s = reader.Read(); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_StatsRead, Page, StatsSource::kPage);
BENCHMARK_CAPTURE(BM_StatsRead, Socket, StatsSource::kSocket);

void BM_LookupWhileStatsPolled(benchmark::State& state, StatsSource source) {
  SharedMemoryPath& path = StatsPath();
  const auto pause = std::chrono::microseconds(state.range(0));
  std::atomic<bool> done{false};
  std::atomic<uint64_t> reads{0};
  std::string failure;
  std::thread poller;
  if (source != StatsSource::kNone) {
    poller = std::thread([&] {
      StatsReader reader(source);
      while (!done.load(std::memory_order_relaxed)) {
        if (Status s = reader.Read(); !s.ok()) {
          failure = s.ToString();
          return;
        }
        reads.fetch_add(1, std::memory_order_relaxed);
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
      }
    });
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId>& tokens = Tokens();
  TimeRoundTrips(state, [&]() -> StatusOr<int32_t> {
    TIERKV_ASSIGN_OR_RETURN(LookupResult r,
                            path.client->Lookup(kLookupRequest, tokens));
    return r.hit_tokens;
  });
  const std::chrono::duration<double> elapsed =
      std::chrono::steady_clock::now() - start;
  done.store(true);
  if (poller.joinable()) poller.join();
  if (!failure.empty()) state.SkipWithError(failure.c_str());
  state.counters["reads_per_s"] =
      static_cast<double>(reads.load()) / elapsed.count();
}
BENCHMARK_CAPTURE(BM_LookupWhileStatsPolled, Quiet, StatsSource::kNone)
    ->Arg(0)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_LookupWhileStatsPolled, Page, StatsSource::kPage)
    ->Arg(0)
    ->Arg(100)
    ->Arg(1000)
    ->UseManualTime();
BENCHMARK_CAPTURE(BM_LookupWhileStatsPolled, Socket, StatsSource::kSocket)
    ->Arg(0)
    ->Arg(100)
    ->Arg(1000)
    ->UseManualTime();

// A device tier that notes when each copy is submitted to it: the worker's
// copy start, for BM_PromotedLoadLatency.
class StampedDevice final : public DeviceTier {
 public:
  explicit StampedDevice(std::unique_ptr<EmulatedDeviceTier> inner)
      : inner_(std::move(inner)) {}
  int32_t num_blocks() const override { return inner_->num_blocks(); }
  size_t block_bytes() const override { return inner_->block_bytes(); }
  Status Submit(CopyJob job) override {
    last_submit_ = std::chrono::steady_clock::now();
    return inner_->Submit(std::move(job));
  }
  std::vector<CopyCompletion> PollCompleted() override {
    return inner_->PollCompleted();
  }
  std::vector<CopyCompletion> WaitCompleted(
      std::chrono::milliseconds timeout) override {
    return inner_->WaitCompleted(timeout);
  }
  size_t in_flight() const override { return inner_->in_flight(); }
  bool SetCompletionNotify(std::function<void()> notify) override {
    return inner_->SetCompletionNotify(std::move(notify));
  }
  std::chrono::steady_clock::time_point last_submit() const {
    return last_submit_;
  }

 private:
  std::unique_ptr<EmulatedDeviceTier> inner_;
  std::chrono::steady_clock::time_point last_submit_;
};

constexpr int kPromotedLoads = 300;  // Iterations of BM_PromotedLoadLatency.

// The tokens of one-block request `i` of the promotion path, and one more
// token (a lookup reports at most all but the last token).
std::vector<TokenId> OneBlockRequest(int i) {
  std::vector<TokenId> tokens(kBlockSize + 1);
  for (int32_t t = 0; t < kBlockSize; ++t) {
    tokens[t] = static_cast<TokenId>(i * kBlockSize + t);
  }
  tokens[kBlockSize] = 7;
  return tokens;
}

// The host tier's slots in the promotion path.
constexpr int kPromotionHostSlots = 64;

// tierkvd's machinery with a disk tier under a 64-slot host, and a worker
// that stores one-block requests in batches with the spills settled after
// each, so that all but the last 64 stored are on disk only; every load is
// of a request no load read before, and more are stored whenever the
// next one would not be on disk only (between timed spans).
struct PromotionPath {
  std::string dir;
  std::unique_ptr<ipc::Server> server;
  StampedDevice* device = nullptr;
  std::unique_ptr<StampedDevice> owned_device;
  std::unique_ptr<Client> client;
  // When the last promotion landed on host (the coordinator applied it).
  std::atomic<int64_t> promoted_ns{0};
  int next_load = 0;  // The next request to load.
  int stored = 0;     // Requests stored.

  PromotionPath() {
    char tmpl[] = "/tmp/control_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Die(std::strerror(errno));
    dir = tmpl;
    ipc::ServerOptions options;
    options.store = "control-bench-" + std::to_string(getpid()) + "-promote";
    options.socket_path = dir + "/tierkvd.sock";
    options.host_capacity_bytes =
        kPromotionHostSlots * BenchLayout().BlockBytes();
    options.layout = BenchLayout();
    options.disk_path = dir + "/disk";
    options.disk_capacity_bytes = uint64_t{64} << 20;
    options.caps.worker_pin_share = 1.0;
    options.block_trace = [this](const char* what, const BlockKey&, BlockId) {
      if (std::strcmp(what, "promoted") != 0) return;
      promoted_ns.store(
          std::chrono::steady_clock::now().time_since_epoch().count());
    };
    server = ValueOrDie(ipc::Server::Start(options), "start server");
    owned_device = std::make_unique<StampedDevice>(
        ValueOrDie(EmulatedDeviceTier::Create(4, BenchLayout().BlockBytes()),
                   "device tier"));
    device = owned_device.get();
    ClientOptions client_options = BaseClientOptions();
    client_options.socket_path = options.socket_path;
    client_options.num_device_blocks = 4;
    client_options.device = device;
    client = ValueOrDie(Client::Open(client_options), "attach");
  }
  ~PromotionPath() {
    client.reset();
    server.reset();
    owned_device.reset();
    std::filesystem::remove_all(dir);
  }

  // Stores requests [stored, stored + n).
  void StoreMore(int n) {
    const BlockId block[] = {1};
    for (int i = stored; i < stored + n; ++i) {
      const std::vector<TokenId> tokens = OneBlockRequest(i);
      const RequestId r = 1000 + i;
      (void)ValueOrDie(client->Lookup(r, tokens), "lookup");
      (void)ValueOrDie(client->Allocate(r, block, 0), "allocate");
      CommitResult commit =
          ValueOrDie(client->Commit(r, kBlockSize, block), "commit");
      for (size_t done = 0; done < commit.stores.size();) {
        std::vector<FinishedTransfer> finished =
            client->WaitEvents(std::chrono::seconds(10));
        OkOrDie(client->Complete(finished), "complete");
        done += finished.size();
      }
      OkOrDie(client->Finish(r), "finish");
      if (i % 8 == 7) {
        OkOrDie(client->WaitIdle(std::chrono::seconds(60)), "wait idle");
      }
    }
    OkOrDie(client->WaitIdle(std::chrono::seconds(60)), "wait idle");
    stored += n;
  }

  // Loads request `i`, which waits for its block's promotion; the time
  // from the promotion landing to the worker starting its copy.
  StatusOr<double> LoadSeconds() {
    if (next_load >= stored - kPromotionHostSlots) StoreMore(kPromotedLoads);
    const int i = next_load++;
    const std::vector<TokenId> tokens = OneBlockRequest(i);
    const RequestId r = 1;
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, client->Lookup(r, tokens));
    if (hit.disk_hit_tokens != kBlockSize) {
      return Status::Internal("request " + std::to_string(i) +
                              " is not on disk only");
    }
    const BlockId block[] = {2};
    TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                            client->Allocate(r, block, kBlockSize));
    if (!alloc.load_pending) {
      return Status::Internal("the load did not wait for a promotion");
    }
    std::vector<FinishedTransfer> done;
    while (done.empty()) done = client->WaitEvents(std::chrono::seconds(10));
    TIERKV_RETURN_IF_ERROR(done[0].status);
    TIERKV_RETURN_IF_ERROR(client->Complete(done));
    TIERKV_RETURN_IF_ERROR(client->Finish(r));
    const std::chrono::steady_clock::time_point promoted{
        std::chrono::steady_clock::duration(promoted_ns.load())};
    return std::chrono::duration<double>(device->last_submit() - promoted)
        .count();
  }
};

// From a promotion landing on host (the coordinator applies the disk
// tier's read: the "promoted" block trace) to the worker's copy of the
// load starting (its device tier's Submit). In between: tierkvd's
// readiness signal, the worker waking in WaitEvents, one ReadyLoads round
// trip. Manual time is that span; p50_us, p99_us and mean_us over all
// iterations.
void BM_PromotedLoadLatency(benchmark::State& state) {
  static PromotionPath path;
  std::vector<double> us;
  for (auto _ : state) {
    StatusOr<double> seconds = path.LoadSeconds();
    if (!seconds.ok()) {
      state.SkipWithError(seconds.status().ToString().c_str());
      return;
    }
    state.SetIterationTime(*seconds);
    us.push_back(*seconds * 1e6);
  }
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = Percentile(us, 0.50);
  state.counters["p99_us"] = Percentile(us, 0.99);
  state.counters["mean_us"] =
      std::accumulate(us.begin(), us.end(), 0.0) / us.size();
}
BENCHMARK(BM_PromotedLoadLatency)
    ->UseManualTime()
    ->Iterations(kPromotedLoads)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tierkv

BENCHMARK_MAIN();
