// tierkv's host tier against Redis, the shared cache a user might pick
// instead: put and get of 2 MiB KV blocks (32 layers, 8 KV heads, head dim
// 128, 16-token blocks, bf16) from a second process.
//
// What is measured (wall clock; bytes/s counts kBlocks x 2 MiB per
// iteration, i.e. 64 MiB):
// - BM_TierkvPut: the bench starts a real tierkvd (TIERKVD_PATH, 1 GiB host
//   tier) and attaches to it as a worker whose device is an
//   EmulatedDeviceTier. One iteration is one request of kBlocks full blocks:
//   Lookup (a miss), Allocate, Commit -> one store event, copied device ->
//   shared-memory host tier by the client's copy engine -> WaitEvents ->
//   Complete -> Finish. Every iteration uses a fresh prompt, so every put
//   really stores; the host tier's LRU recycles slots. Before timing, every
//   host slot is written once, so timed puts see a full store's steady
//   state, not first-touch page faults of the fresh segment (worth about
//   10x on this path; see BENCHMARKS.md).
// - BM_TierkvGet: one prompt is stored before timing; one iteration is
//   Lookup(the prompt + 1 token) -> a hit of kBlocks blocks -> Allocate with
//   the hit -> one load event, copied host -> device -> WaitEvents ->
//   Complete -> Finish.
// - BM_RedisPut: the baseline. The bench starts redis-server on loopback
//   (no persistence) and speaks RESP by hand over one TCP connection (no
//   hiredis). One iteration pipelines kBlocks SETs of 2 MiB values (the same
//   keys each time, so Redis replaces values as tierkv recycles slots) taken
//   from a worker-side buffer, then reads the kBlocks +OK replies. One
//   untimed round of SETs runs first, as tierkv's warm-up does.
// - BM_RedisGet: kBlocks pipelined GETs; each 2 MiB bulk reply is read
//   straight into the worker-side buffer.
// Each get benchmark first checks, untimed, that the bytes it reads back are
// the bytes that were put.
//
// The ratios (tierkv / Redis, put and get) are taken from one run of this
// binary and kept, with the figures and the command, in BENCHMARKS.md.
// Redis is installed by `tools/run bench`, not by the tests; without it the
// Redis benchmarks report an error and the others still run.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/child_process.h"
#include "tierkv/client.h"
#include "tierkv/device_tier.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 32;  // Per put or get: 64 MiB.
constexpr const char* kHostCapacity = "1G";

KvLayout BenchLayout() {
  return KvLayout{.num_layers = 32,
                  .num_kv_heads = 8,
                  .head_dim = 128,
                  .block_size = kBlockSize,
                  .dtype = DType::kBF16};
}
const size_t kBlockBytes = BenchLayout().BlockBytes();  // 2 MiB.

std::string ErrnoText(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Deterministic bytes of block `b`, so a get can be checked against a put.
void FillBlock(std::span<std::byte> bytes, uint32_t b) {
  auto* words = reinterpret_cast<uint64_t*>(bytes.data());
  for (size_t i = 0; i < bytes.size() / 8; ++i) {
    words[i] = (i * 0x9E3779B97F4A7C15ull) ^ (uint64_t{b} << 48);
  }
}
bool BlockMatches(std::span<const std::byte> bytes, uint32_t b) {
  const auto* words = reinterpret_cast<const uint64_t*>(bytes.data());
  for (size_t i = 0; i < bytes.size() / 8; ++i) {
    if (words[i] != ((i * 0x9E3779B97F4A7C15ull) ^ (uint64_t{b} << 48))) {
      return false;
    }
  }
  return true;
}

std::string MakeTempDir() {
  char tmpl[] = "/tmp/redis_compare_bench.XXXXXX";
  return mkdtemp(tmpl) == nullptr ? std::string() : std::string(tmpl);
}

// ---------------------------------------------------------------- tierkv --

std::vector<TokenId> Prompt(uint32_t seed, int32_t tokens) {
  std::vector<TokenId> t(static_cast<size_t>(tokens));
  for (size_t i = 0; i < t.size(); ++i) t[i] = seed * 100003u + i * 7u + 1u;
  return t;
}

// A tierkvd child process and this process attached to it as a worker.
struct TierkvPeer {
  std::string dir;
  std::unique_ptr<ChildProcess> daemon;
  std::unique_ptr<EmulatedDeviceTier> device;
  std::unique_ptr<Client> client;
  std::vector<BlockId> device_blocks;  // 1..kBlocks + 1.
  uint32_t next_seed = 1;
  RequestId next_request = 1;

  static StatusOr<std::unique_ptr<TierkvPeer>> Start() {
    auto peer = std::make_unique<TierkvPeer>();
    peer->dir = MakeTempDir();
    if (peer->dir.empty()) return Status::Internal(ErrnoText("mkdtemp"));
    const std::string socket = peer->dir + "/tierkvd.sock";
    TIERKV_ASSIGN_OR_RETURN(
        peer->daemon,
        ChildProcess::Spawn({TIERKVD_PATH, "--store",
                             "redis-compare-" + std::to_string(getpid()),
                             "--socket", socket, "--layers", "32", "--kv-heads",
                             "8", "--head-dim", "128", "--block-size", "16",
                             "--dtype", "bf16", "--host-capacity",
                             kHostCapacity}));
    if (!peer->daemon->WaitForOutput("serving store",
                                     std::chrono::seconds(60))) {
      return Status::Unavailable("tierkvd did not start: " +
                                 peer->daemon->output());
    }
    TIERKV_ASSIGN_OR_RETURN(
        peer->device, EmulatedDeviceTier::Create(kBlocks + 2, kBlockBytes));
    for (BlockId b = 1; b <= kBlocks + 1; ++b) {
      peer->device_blocks.push_back(b);
      FillBlock(peer->device->block(b), static_cast<uint32_t>(b));
    }
    ClientOptions options;
    options.socket_path = socket;
    options.layout = BenchLayout();
    options.num_device_blocks = kBlocks + 2;
    options.name = "redis_compare_bench";
    options.device = peer->device.get();
    TIERKV_ASSIGN_OR_RETURN(peer->client, Client::Open(options));
    TIERKV_RETURN_IF_ERROR(peer->WarmUp());
    return peer;
  }

  ~TierkvPeer() {
    client.reset();  // Detach first, then stop the daemon.
    if (daemon != nullptr) daemon->Stop();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  // Writes every host slot once, untimed, so that timed puts recycle slots
  // as a full store does instead of paying tmpfs's first-touch page faults
  // (tierkvd does not prefault its host segment).
  Status WarmUp() {
    TIERKV_ASSIGN_OR_RETURN(CoordinatorStats stats, client->Stats());
    for (int64_t i = 0; i <= stats.host.capacity_slots / kBlocks; ++i) {
      TIERKV_RETURN_IF_ERROR(Put(Prompt(next_seed++, kBlocks * kBlockSize)));
    }
    return Status::Ok();
  }

  // Waits for `count` transfers and completes them.
  Status CompleteTransfers(size_t count) {
    while (count > 0) {
      std::vector<FinishedTransfer> done =
          client->WaitEvents(std::chrono::seconds(10));
      if (done.empty()) return Status::Unavailable("no copy finished in 10 s");
      for (const FinishedTransfer& f : done) TIERKV_RETURN_IF_ERROR(f.status);
      TIERKV_RETURN_IF_ERROR(client->Complete(done));
      count -= std::min(count, done.size());
    }
    return Status::Ok();
  }

  // Stores the kBlocks device blocks under `tokens` (kBlocks full blocks).
  Status Put(std::span<const TokenId> tokens) {
    const RequestId id = next_request++;
    const std::span<const BlockId> blocks =
        std::span<const BlockId>(device_blocks).first(kBlocks);
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, client->Lookup(id, tokens));
    if (hit.hit_tokens != 0) return Status::Internal("a put's prompt hit");
    TIERKV_ASSIGN_OR_RETURN(AllocateResult alloc,
                            client->Allocate(id, blocks, 0));
    TIERKV_RETURN_IF_ERROR(alloc.store_status);
    TIERKV_ASSIGN_OR_RETURN(
        CommitResult commit,
        client->Commit(id, static_cast<int32_t>(tokens.size()), blocks));
    size_t stored = 0;
    for (const TransferEvent& e : commit.stores) {
      stored += e.device_blocks.size();
    }
    if (stored != kBlocks) {
      return Status::Internal("a put stored " + std::to_string(stored) +
                              " blocks");
    }
    TIERKV_RETURN_IF_ERROR(CompleteTransfers(commit.stores.size()));
    return client->Finish(id);
  }

  // Loads the kBlocks blocks stored under `tokens` minus its last token.
  Status Get(std::span<const TokenId> tokens) {
    const RequestId id = next_request++;
    TIERKV_ASSIGN_OR_RETURN(LookupResult hit, client->Lookup(id, tokens));
    if (hit.hit_tokens != kBlocks * kBlockSize) {
      return Status::Internal("a get hit " + std::to_string(hit.hit_tokens) +
                              " tokens");
    }
    TIERKV_ASSIGN_OR_RETURN(
        AllocateResult alloc,
        client->Allocate(id, device_blocks, hit.hit_tokens));
    if (!alloc.load.has_value()) return Status::Internal("a get loaded none");
    TIERKV_RETURN_IF_ERROR(CompleteTransfers(1));
    return client->Finish(id);
  }
};

// Set by the first benchmark that needs a peer, stopped by main().
std::unique_ptr<TierkvPeer> g_tierkv;
std::unique_ptr<Status> g_tierkv_error;

TierkvPeer* TierkvOrSkip(benchmark::State& state) {
  if (g_tierkv == nullptr && g_tierkv_error == nullptr) {
    StatusOr<std::unique_ptr<TierkvPeer>> peer = TierkvPeer::Start();
    if (peer.ok()) {
      g_tierkv = std::move(*peer);
    } else {
      g_tierkv_error = std::make_unique<Status>(peer.status());
    }
  }
  if (g_tierkv_error != nullptr) {
    state.SkipWithError(g_tierkv_error->ToString().c_str());
  }
  return g_tierkv.get();
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kBlocks *
                          static_cast<int64_t>(kBlockBytes));
}

void BM_TierkvPut(benchmark::State& state) {
  TierkvPeer* peer = TierkvOrSkip(state);
  if (peer == nullptr) return;
  for (auto _ : state) {
    const std::vector<TokenId> tokens =
        Prompt(peer->next_seed++, kBlocks * kBlockSize);
    if (Status s = peer->Put(tokens); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetBytes(state);
}
BENCHMARK(BM_TierkvPut)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_TierkvGet(benchmark::State& state) {
  TierkvPeer* peer = TierkvOrSkip(state);
  if (peer == nullptr) return;
  std::vector<TokenId> tokens = Prompt(peer->next_seed++, kBlocks * kBlockSize);
  Status s = peer->Put(tokens);
  tokens.push_back(7);
  // Untimed check: the load brings back the bytes the put stored.
  for (BlockId b = 1; s.ok() && b <= kBlocks; ++b) {
    std::span<std::byte> bytes = peer->device->block(b);
    std::memset(bytes.data(), 0, bytes.size());
  }
  if (s.ok()) s = peer->Get(tokens);
  for (BlockId b = 1; s.ok() && b <= kBlocks; ++b) {
    if (!BlockMatches(peer->device->block(b), static_cast<uint32_t>(b))) {
      s = Status::DataLoss("block " + std::to_string(b) +
                           " loaded other bytes than were stored");
    }
  }
  if (!s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    if (s = peer->Get(tokens); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetBytes(state);
}
BENCHMARK(BM_TierkvGet)->UseRealTime()->Unit(benchmark::kMillisecond);

// ----------------------------------------------------------------- Redis --

std::optional<std::string> FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= dirs.size()) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(begin, end - begin) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  return std::nullopt;
}

// A loopback port nobody listens on now (the kernel's pick).
StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Internal(ErrnoText("socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return Status::Internal(ErrnoText("bind"));
  return static_cast<int>(ntohs(addr.sin_port));
}

StatusOr<int> ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Internal(ErrnoText("socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return Status::Unavailable(ErrnoText("connect"));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Blocking RESP connection: writes whole commands, reads replies through a
// buffer, and bulk payloads straight into the caller's memory.
class RespConnection {
 public:
  explicit RespConnection(int fd) : fd_(fd), buf_(1 << 16) {}
  ~RespConnection() { close(fd_); }

  Status Write(std::vector<iovec> iov) {
    size_t i = 0;
    while (i < iov.size()) {
      const ssize_t n =
          writev(fd_, iov.data() + i,
                 static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Unavailable(ErrnoText("writev to redis"));
      size_t left = static_cast<size_t>(n);
      while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
      if (left > 0) {
        iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
      }
    }
    return Status::Ok();
  }

  // One reply line without its CRLF.
  Status ReadLine(std::string* line) {
    line->clear();
    for (;;) {
      const char* begin = buf_.data() + begin_;
      const char* end = buf_.data() + end_;
      const char* lf = std::find(begin, end, '\n');
      if (lf != end) {
        line->append(begin, lf);
        begin_ += static_cast<size_t>(lf - begin) + 1;
        if (!line->empty() && line->back() == '\r') line->pop_back();
        return Status::Ok();
      }
      line->append(begin, end);
      begin_ = end_ = 0;
      TIERKV_RETURN_IF_ERROR(Fill());
    }
  }

  Status ReadExact(std::byte* out, size_t n) {
    const size_t buffered = std::min(n, end_ - begin_);
    std::memcpy(out, buf_.data() + begin_, buffered);
    begin_ += buffered;
    out += buffered;
    n -= buffered;
    while (n > 0) {
      const ssize_t got = recv(fd_, out, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Status::Unavailable("redis closed the connection");
      out += got;
      n -= static_cast<size_t>(got);
    }
    return Status::Ok();
  }

  Status Expect(const std::string& reply) {
    std::string line;
    TIERKV_RETURN_IF_ERROR(ReadLine(&line));
    if (line != reply) {
      return Status::Internal("redis answered '" + line + "', not '" + reply +
                              "'");
    }
    return Status::Ok();
  }

 private:
  Status Fill() {
    for (;;) {
      const ssize_t got = recv(fd_, buf_.data(), buf_.size(), 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Status::Unavailable("redis closed the connection");
      end_ = static_cast<size_t>(got);
      return Status::Ok();
    }
  }

  int fd_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
};

iovec Iov(const void* p, size_t n) { return {const_cast<void*>(p), n}; }

// redis-server as a child process, and one connection to it.
struct RedisPeer {
  std::string dir;
  std::unique_ptr<ChildProcess> server;
  std::unique_ptr<RespConnection> conn;
  std::vector<std::string> keys;
  std::vector<std::string> set_headers;  // "*3 SET key $len" per key.
  std::string get_commands;              // kBlocks GETs, pipelined.
  std::vector<std::byte> blocks;         // The worker's kBlocks blocks.

  static StatusOr<std::unique_ptr<RedisPeer>> Start() {
    const std::optional<std::string> binary = FindOnPath("redis-server");
    if (!binary.has_value()) {
      return Status::NotFound(
          "redis-server not installed; tools/run bench installs it");
    }
    auto peer = std::make_unique<RedisPeer>();
    peer->dir = MakeTempDir();
    if (peer->dir.empty()) return Status::Internal(ErrnoText("mkdtemp"));
    TIERKV_ASSIGN_OR_RETURN(int port, FreePort());
    TIERKV_ASSIGN_OR_RETURN(
        peer->server,
        ChildProcess::Spawn({*binary, "--port", std::to_string(port), "--save",
                             "", "--appendonly", "no", "--bind", "127.0.0.1",
                             "--dir", peer->dir}));
    TIERKV_RETURN_IF_ERROR(peer->Connect(port));
    peer->Prepare();
    TIERKV_RETURN_IF_ERROR(peer->Put());  // Warm-up: Redis allocates values.
    return peer;
  }

  ~RedisPeer() {
    conn.reset();
    if (server != nullptr) server->Stop();  // SIGTERM: exits, no save.
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  // Retries until redis answers PING, for up to 20 s.
  Status Connect(int port) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    Status last = Status::Unavailable("redis-server did not start");
    while (Clock::now() < deadline) {
      StatusOr<int> fd = ConnectLoopback(port);
      if (fd.ok()) {
        conn = std::make_unique<RespConnection>(*fd);
        static const char kPing[] = "*1\r\n$4\r\nPING\r\n";
        last = conn->Write({Iov(kPing, sizeof(kPing) - 1)});
        if (last.ok()) last = conn->Expect("+PONG");
        if (last.ok()) return last;
        conn.reset();
      } else {
        last = fd.status();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Status::Unavailable("redis-server did not answer PING: " +
                               last.ToString() + "\n" + server->output());
  }

  void Prepare() {
    blocks.resize(kBlocks * kBlockBytes);
    for (int32_t b = 0; b < kBlocks; ++b) FillBlock(Block(b), b + 1);
    for (int32_t b = 0; b < kBlocks; ++b) {
      keys.push_back("tierkv-bench:" + std::to_string(b));
      const std::string& k = keys.back();
      set_headers.push_back("*3\r\n$3\r\nSET\r\n$" + std::to_string(k.size()) +
                            "\r\n" + k + "\r\n$" + std::to_string(kBlockBytes) +
                            "\r\n");
      get_commands += "*2\r\n$3\r\nGET\r\n$" + std::to_string(k.size()) +
                      "\r\n" + k + "\r\n";
    }
  }

  std::span<std::byte> Block(int32_t b) {
    return std::span<std::byte>(blocks).subspan(b * kBlockBytes, kBlockBytes);
  }

  Status Put() {
    static const char kCrlf[] = "\r\n";
    std::vector<iovec> iov;
    for (int32_t b = 0; b < kBlocks; ++b) {
      iov.push_back(Iov(set_headers[b].data(), set_headers[b].size()));
      iov.push_back(Iov(Block(b).data(), kBlockBytes));
      iov.push_back(Iov(kCrlf, 2));
    }
    TIERKV_RETURN_IF_ERROR(conn->Write(std::move(iov)));
    for (int32_t b = 0; b < kBlocks; ++b) {
      TIERKV_RETURN_IF_ERROR(conn->Expect("+OK"));
    }
    return Status::Ok();
  }

  Status Get() {
    TIERKV_RETURN_IF_ERROR(
        conn->Write({Iov(get_commands.data(), get_commands.size())}));
    const std::string header = "$" + std::to_string(kBlockBytes);
    std::byte crlf[2];
    for (int32_t b = 0; b < kBlocks; ++b) {
      TIERKV_RETURN_IF_ERROR(conn->Expect(header));
      TIERKV_RETURN_IF_ERROR(conn->ReadExact(Block(b).data(), kBlockBytes));
      TIERKV_RETURN_IF_ERROR(conn->ReadExact(crlf, 2));
    }
    return Status::Ok();
  }
};

std::unique_ptr<RedisPeer> g_redis;
std::unique_ptr<Status> g_redis_error;

RedisPeer* RedisOrSkip(benchmark::State& state) {
  if (g_redis == nullptr && g_redis_error == nullptr) {
    StatusOr<std::unique_ptr<RedisPeer>> peer = RedisPeer::Start();
    if (peer.ok()) {
      g_redis = std::move(*peer);
    } else {
      g_redis_error = std::make_unique<Status>(peer.status());
    }
  }
  if (g_redis_error != nullptr) {
    state.SkipWithError(g_redis_error->message().c_str());
  }
  return g_redis.get();
}

void BM_RedisPut(benchmark::State& state) {
  RedisPeer* peer = RedisOrSkip(state);
  if (peer == nullptr) return;
  for (auto _ : state) {
    if (Status s = peer->Put(); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetBytes(state);
}
BENCHMARK(BM_RedisPut)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_RedisGet(benchmark::State& state) {
  RedisPeer* peer = RedisOrSkip(state);
  if (peer == nullptr) return;
  // Untimed check: GET returns the bytes SET stored.
  Status s = peer->Put();
  if (s.ok()) std::memset(peer->blocks.data(), 0, peer->blocks.size());
  if (s.ok()) s = peer->Get();
  for (int32_t b = 0; s.ok() && b < kBlocks; ++b) {
    if (!BlockMatches(peer->Block(b), static_cast<uint32_t>(b + 1))) {
      s = Status::DataLoss("GET returned other bytes than SET stored");
    }
  }
  if (!s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    if (s = peer->Get(); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  SetBytes(state);
}
BENCHMARK(BM_RedisGet)->UseRealTime()->Unit(benchmark::kMillisecond);

// Stops the child processes the benchmarks started.
void StopPeers() {
  g_tierkv.reset();
  g_redis.reset();
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  tierkv::StopPeers();
  benchmark::Shutdown();
  return 0;
}
