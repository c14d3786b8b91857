// RedisClusterHarness (redis_cluster_harness.h): redis-server processes,
// their configuration files, and the polls that wait for the cluster.
#include "testing/redis_cluster_harness.h"

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "tests/child_process.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

std::optional<std::string> FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path == nullptr ? "/usr/bin:/bin" : path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// True when nothing is bound to 127.0.0.1:port now.
bool PortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

// `count` client ports whose cluster bus ports (port + 10000) are free too.
// Drawn from [20000, 30000), below Linux's ephemeral range (32768 up), so
// that outgoing connections do not take them between the check and
// redis-server's bind.
StatusOr<std::vector<int>> PickPorts(int count) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(20000, 29999);
  std::vector<int> ports;
  for (int tries = 0; tries < 10000 && static_cast<int>(ports.size()) < count;
       ++tries) {
    const int p = pick(rng);
    if (std::find(ports.begin(), ports.end(), p) != ports.end()) continue;
    if (PortFree(p) && PortFree(p + 10000)) ports.push_back(p);
  }
  if (static_cast<int>(ports.size()) < count) {
    return Status::ResourceExhausted("no free loopback port pairs for Redis");
  }
  return ports;
}

std::string ReplyToText(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_INTEGER:
      return std::to_string(r.integer);
    case REDIS_REPLY_NIL:
      return "(nil)";
    case REDIS_REPLY_ARRAY: {
      std::string text;
      for (size_t i = 0; i < r.elements; ++i) {
        text += (i == 0 ? "" : "\n") + ReplyToText(*r.element[i]);
      }
      return text;
    }
    default:
      return std::string(r.str, r.len);
  }
}

// "key:value" lines of INFO / CLUSTER INFO: the value of `key`.
std::string InfoField(const std::string& info, const std::string& key) {
  const size_t at = info.find(key + ":");
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() + 1;
  const size_t end = info.find_first_of("\r\n", start);
  return info.substr(start, end - start);
}

}  // namespace

RedisClusterHarness::RedisClusterHarness(RedisClusterHarnessOptions options,
                                         std::string root)
    : options_(std::move(options)), root_(std::move(root)) {}

RedisClusterHarness::~RedisClusterHarness() {
  nodes_.clear();  // ChildProcess's destructor SIGKILLs and reaps.
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

StatusOr<std::unique_ptr<RedisClusterHarness>> RedisClusterHarness::Start(
    const RedisClusterHarnessOptions& options) {
  const std::optional<std::string> server = FindOnPath("redis-server");
  const std::optional<std::string> cli = FindOnPath("redis-cli");
  if (!server || !cli) {
    return Status::FailedPrecondition(
        "redis-server or redis-cli not found on PATH: the Redis Cluster "
        "tests need Debian's redis-server and redis-tools (tools/run deps)");
  }
  std::string pattern = "/tmp/tierkv-redis-cluster.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return Status::Internal("mkdtemp " + pattern + ": " + strerror(errno));
  }
  std::unique_ptr<RedisClusterHarness> h(
      new RedisClusterHarness(options, pattern));
  h->server_path_ = *server;
  h->cli_path_ = *cli;
  // Another process (a test running beside this one) may bind a port
  // between PickPorts and redis-server: start again on other ports.
  Status started;
  for (int attempt = 0; attempt < 3; ++attempt) {
    started = h->StartNodes();
    if (started.code() != StatusCode::kAlreadyExists) break;
  }
  TIERKV_RETURN_IF_ERROR(started);
  TIERKV_RETURN_IF_ERROR(h->CreateCluster());
  TIERKV_RETURN_IF_ERROR(h->WaitHealthy());
  return h;
}

Status RedisClusterHarness::StartNodes() {
  nodes_.clear();
  const int n = options_.masters * (1 + options_.replicas_per_master);
  TIERKV_ASSIGN_OR_RETURN(ports_, PickPorts(n));
  nodes_.resize(n);
  for (int i = 0; i < n; ++i) {
    std::error_code ignored;
    std::filesystem::remove_all(root_ + "/node" + std::to_string(i), ignored);
    TIERKV_RETURN_IF_ERROR(WriteConfig(i));
    TIERKV_RETURN_IF_ERROR(SpawnNode(i));
  }
  for (int i = 0; i < n; ++i) TIERKV_RETURN_IF_ERROR(WaitAnswers(i));
  return Status::Ok();
}

Clock::time_point RedisClusterHarness::Deadline() const {
  return Clock::now() + options_.deadline;
}

Status RedisClusterHarness::WriteConfig(int node) {
  const std::string dir = root_ + "/node" + std::to_string(node);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Internal("mkdir " + dir + ": " + ec.message());
  std::ofstream conf(dir + "/redis.conf");
  conf << "port " << ports_[node] << "\n"
       << "bind 127.0.0.1\n"
       << "protected-mode no\n"
       << "daemonize no\n"
       << "dir " << dir << "\n"
       << "cluster-enabled yes\n"
       << "cluster-config-file nodes.conf\n"
       << "cluster-node-timeout " << options_.node_timeout.count()
       << "\n"
       // A replica takes over however long it was cut off from its master.
       << "cluster-replica-validity-factor 0\n"
       // Replicas sync at once (Redis waits 5 s for more replicas by
       // default before a diskless transfer).
       << "repl-diskless-sync-delay 0\n"
       << "appendonly no\n"
       // A save point turns on the snapshot that SIGTERM's shutdown writes.
       << "save " << (options_.persistence ? "\"3600 1\"" : "\"\"") << "\n"
       << "dbfilename dump.rdb\n"
       << "loglevel warning\n";
  conf.close();
  if (!conf) return Status::Internal("writing " + dir + "/redis.conf failed");
  return Status::Ok();
}

Status RedisClusterHarness::SpawnNode(int node) {
  const std::string conf =
      root_ + "/node" + std::to_string(node) + "/redis.conf";
  TIERKV_ASSIGN_OR_RETURN(nodes_[node],
                          ChildProcess::Spawn({server_path_, conf}));
  return Status::Ok();
}

bool RedisClusterHarness::alive(int node) const {
  return nodes_[node] != nullptr;
}

std::string RedisClusterHarness::Seeds() const {
  std::string seeds;
  for (const int p : ports_) {
    seeds += (seeds.empty() ? "" : ",") + std::string("127.0.0.1:") +
             std::to_string(p);
  }
  return seeds;
}

StatusOr<std::string> RedisClusterHarness::Command(
    int node, const std::vector<std::string>& args) {
  const timeval timeout{.tv_sec = 5, .tv_usec = 0};
  redisContext* ctx =
      redisConnectWithTimeout("127.0.0.1", ports_[node], timeout);
  if (ctx == nullptr || ctx->err != 0) {
    const std::string why = ctx == nullptr ? "out of memory" : ctx->errstr;
    if (ctx != nullptr) redisFree(ctx);
    return Status::Unavailable("node " + std::to_string(node) + ": " + why);
  }
  redisSetTimeout(ctx, timeout);
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(redisCommandArgv(
      ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
  StatusOr<std::string> result = Status::Unavailable(
      "node " + std::to_string(node) + ": " + std::string(ctx->errstr));
  if (reply != nullptr) {
    const std::string text = ReplyToText(*reply);
    result = reply->type == REDIS_REPLY_ERROR
                 ? StatusOr<std::string>(Status::Internal(
                       "node " + std::to_string(node) + " replied " + text))
                 : StatusOr<std::string>(text);
    freeReplyObject(reply);
  }
  redisFree(ctx);
  return result;
}

Status RedisClusterHarness::WaitAnswers(int node) {
  const Clock::time_point deadline = Deadline();
  const std::string port = std::to_string(ports_[node]);
  Status last;
  while (Clock::now() < deadline) {
    // redis-server logs this and exits when its client or bus port is taken.
    if (nodes_[node]->output().find("Address already in use") !=
        std::string::npos) {
      return Status::AlreadyExists("port " + port +
                                   " or its bus port is taken");
    }
    // The port answers: but is it this node, or another test's?
    StatusOr<std::string> info = Command(node, {"INFO", "server"});
    if (info.ok()) {
      if (InfoField(*info, "process_id") ==
          std::to_string(nodes_[node]->pid())) {
        return Status::Ok();
      }
      return Status::AlreadyExists("port " + port +
                                   " is served by another redis-server");
    }
    last = info.status();
    std::this_thread::sleep_for(kPollInterval);
  }
  return Status::DeadlineExceeded("redis-server node " + std::to_string(node) +
                                  " did not answer: " + last.ToString() +
                                  "; its output: " + nodes_[node]->output());
}

Status RedisClusterHarness::CreateCluster() {
  std::vector<std::string> argv = {cli_path_, "--cluster", "create"};
  for (const int p : ports_) argv.push_back("127.0.0.1:" + std::to_string(p));
  argv.insert(argv.end(),
              {"--cluster-replicas",
               std::to_string(options_.replicas_per_master), "--cluster-yes"});
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> cli,
                          ChildProcess::Spawn(argv));
  // redis-cli prints this once the slots are assigned and every node
  // agrees on the configuration, then exits.
  const bool created =
      cli->WaitForOutput("All 16384 slots covered", options_.deadline);
  const int code = created ? cli->Wait() : -1;
  if (!created || code != 0) {
    return Status::Internal("redis-cli --cluster create failed (exit " +
                            std::to_string(code) + "): " + cli->output());
  }
  return Status::Ok();
}

StatusOr<bool> RedisClusterHarness::NodeHealthy(int node) {
  TIERKV_ASSIGN_OR_RETURN(const std::string info,
                          Command(node, {"CLUSTER", "INFO"}));
  if (InfoField(info, "cluster_state") != "ok" ||
      InfoField(info, "cluster_slots_ok") != "16384") {
    return false;
  }
  TIERKV_ASSIGN_OR_RETURN(const std::string repl,
                          Command(node, {"INFO", "replication"}));
  if (InfoField(repl, "role") == "slave" &&
      InfoField(repl, "master_link_status") != "up") {
    return false;
  }
  return true;
}

Status RedisClusterHarness::WaitHealthy() {
  const Clock::time_point deadline = Deadline();
  std::string last = "not checked";
  while (Clock::now() < deadline) {
    bool all = true;
    for (int i = 0; i < num_nodes() && all; ++i) {
      if (!alive(i)) continue;
      StatusOr<bool> ok = NodeHealthy(i);
      if (!ok.ok() || !*ok) {
        last = "node " + std::to_string(i) + ": " +
               (ok.ok() ? "not ok yet" : ok.status().ToString());
        all = false;
      }
    }
    if (all) return Status::Ok();
    std::this_thread::sleep_for(kPollInterval);
  }
  return Status::DeadlineExceeded("Redis Cluster not healthy within " +
                                  std::to_string(options_.deadline.count()) +
                                  " s; last: " + last);
}

StatusOr<std::string> RedisClusterHarness::NodeId(int node) {
  return Command(node, {"CLUSTER", "MYID"});
}

StatusOr<int> RedisClusterHarness::MasterOf(int slot) {
  for (int asked = 0; asked < num_nodes(); ++asked) {
    if (!alive(asked)) continue;
    TIERKV_ASSIGN_OR_RETURN(const std::string nodes,
                            Command(asked, {"CLUSTER", "NODES"}));
    // "<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link>
    //  <slot ranges>..."
    std::istringstream lines(nodes);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string id, addr, flags, master, ping, pong, epoch, link, range;
      words >> id >> addr >> flags >> master >> ping >> pong >> epoch >> link;
      if (flags.find("master") == std::string::npos) continue;
      while (words >> range) {
        if (range.front() == '[') continue;  // A slot being migrated.
        const size_t dash = range.find('-');
        const int first = std::stoi(range.substr(0, dash));
        const int last = dash == std::string::npos
                             ? first
                             : std::stoi(range.substr(dash + 1));
        if (slot < first || slot > last) continue;
        const int port = std::stoi(addr.substr(addr.find(':') + 1));
        for (int i = 0; i < num_nodes(); ++i) {
          if (ports_[i] == port) return i;
        }
      }
    }
    return Status::NotFound("no master serves slot " + std::to_string(slot));
  }
  return Status::Unavailable("no Redis node is running");
}

StatusOr<int> RedisClusterHarness::KillMaster(int node) {
  TIERKV_ASSIGN_OR_RETURN(const std::string id, NodeId(node));
  std::vector<int> replicas;
  for (int i = 0; i < num_nodes(); ++i) {
    if (i == node || !alive(i)) continue;
    TIERKV_ASSIGN_OR_RETURN(const std::string info,
                            Command(i, {"INFO", "replication"}));
    if (InfoField(info, "master_port") == std::to_string(ports_[node])) {
      replicas.push_back(i);
    }
  }
  if (replicas.empty()) {
    return Status::FailedPrecondition("node " + std::to_string(node) +
                                      " is not a master with a replica");
  }
  nodes_[node].reset();  // SIGKILL, reaped.
  const Clock::time_point deadline = Deadline();
  while (Clock::now() < deadline) {
    for (const int r : replicas) {
      StatusOr<std::string> info = Command(r, {"INFO", "replication"});
      if (info.ok() && InfoField(*info, "role") == "master") {
        TIERKV_RETURN_IF_ERROR(WaitHealthy());
        return r;
      }
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return Status::DeadlineExceeded(
      "no replica of node " + std::to_string(node) + " (" + id +
      ") took over within " + std::to_string(options_.deadline.count()) + " s");
}

void RedisClusterHarness::Freeze(int node) {
  if (alive(node)) nodes_[node]->Freeze();
}

void RedisClusterHarness::Thaw(int node) {
  if (alive(node)) nodes_[node]->Thaw();
}

Status RedisClusterHarness::StopAll() {
  for (int i = 0; i < num_nodes(); ++i) {
    if (!alive(i)) continue;
    nodes_[i]->Signal(SIGTERM);
    const int code = nodes_[i]->Wait();
    const std::string output = nodes_[i]->output();
    nodes_[i].reset();
    if (code != 0) {
      return Status::Internal("redis-server node " + std::to_string(i) +
                              " exited with " + std::to_string(code) +
                              " on SIGTERM: " + output);
    }
  }
  return Status::Ok();
}

Status RedisClusterHarness::RestartAll() {
  for (int i = 0; i < num_nodes(); ++i) {
    if (!alive(i)) TIERKV_RETURN_IF_ERROR(SpawnNode(i));
  }
  for (int i = 0; i < num_nodes(); ++i) TIERKV_RETURN_IF_ERROR(WaitAnswers(i));
  return WaitHealthy();
}

}  // namespace tierkv
