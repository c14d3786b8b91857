// The RAG demo on several machines (tierkv-demo --nodes N): a Redis
// Cluster for the remote tier, one tierkvd per node with its own host and
// disk tiers and its KV events on, workers node by node, and a router that
// follows every node's events the way a cache-aware router does.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "testing/redis_cluster_harness.h"
#include "tools/admin/admin.h"
#include "tools/daemon/kv_events.h"
#include "tools/demo/demo_process.h"
#include "tools/demo/rag_demo.h"
#include "tools/demo/rag_demo_internal.h"

namespace tierkv::demo {
namespace {

using Clock = std::chrono::steady_clock;

// CacheMedium as an index into RagNodeReport's per-medium arrays.
constexpr std::array<CacheMedium, 3> kMedia = {
    CacheMedium::kCpu, CacheMedium::kStorage, CacheMedium::kRemote};
size_t Index(CacheMedium m) { return static_cast<size_t>(m); }

// Every tierkvd of the demo shares the remote tier under this tenant.
std::string DemoTenant() { return "demo-" + std::to_string(getpid()); }

struct Node {
  std::string name;  // "a", "b", ...
  std::string dir;
  std::string socket;
  std::string log;
  std::string events;  // ZeroMQ endpoints (ipc://).
  std::string replay;
  std::unique_ptr<Child> daemon;
};

// What the router knows of one node: its event stream's next sequence
// number, and the index the events rebuilt (block hashes per medium; the
// events carry the keys' low words, vLLM's integer form).
struct NodeView {
  int64_t next_seq = 0;
  uint64_t batches = 0;
  uint64_t stored[4] = {};
  uint64_t removed[4] = {};
  uint64_t cleared = 0;
  // Replays that began past the number asked for: tierkvd dropped events
  // there (a full queue), and the index may hold blocks that are gone.
  uint64_t gaps = 0;
  std::unordered_set<uint64_t> held[4];
  std::string error;  // A batch that did not decode.
};

// A cache-aware router's side of tierkvd's KV events: per node a SUB
// socket on its events and a DEALER on its replay endpoint, one thread
// that applies every batch in sequence order. A gap (or a late start) is
// filled from the replay endpoint; CatchUp asks it again, for the batches
// ZeroMQ's asynchronous subscription can miss.
class Router {
 public:
  explicit Router(const std::vector<Node>& nodes)
      : catch_up_(nodes.size()), views_(nodes.size()) {
    for (const Node& n : nodes) {
      // No linger: a replay request queued for a tierkvd that has stopped
      // must not hold up the context's end.
      zmq::socket_t sub(context_, zmq::socket_type::sub);
      sub.set(zmq::sockopt::linger, 0);
      sub.set(zmq::sockopt::subscribe, "");
      sub.connect(n.events);
      zmq::socket_t dealer(context_, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.connect(n.replay);
      subs_.push_back(std::move(sub));
      dealers_.push_back(std::move(dealer));
    }
    for (auto& c : catch_up_) c.store(true);
    pending_.assign(nodes.size(), std::nullopt);
    thread_ = std::thread([this] { Run(); });
  }
  ~Router() {
    stop_.store(true);
    thread_.join();
  }
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Asks node `i`'s replay endpoint for every batch from the next one the
  // router lacks.
  void CatchUp(size_t i) { catch_up_[i].store(true); }

  NodeView View(size_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return views_[i];
  }

 private:
  static int64_t Seq(const zmq::message_t& frame) {
    if (frame.size() != 8) return -2;
    const auto* b = static_cast<const unsigned char*>(frame.data());
    uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = (v << 8) | b[k];
    return static_cast<int64_t>(v);
  }

  void Apply(size_t i, int64_t seq, const zmq::message_t& batch) {
    std::lock_guard<std::mutex> lock(mu_);
    NodeView& v = views_[i];
    if (seq != v.next_seq) return;  // A duplicate, or past a gap.
    StatusOr<daemon::DecodedKvEventBatch> decoded =
        daemon::DecodeKvEventBatch(batch.to_string_view());
    ++v.next_seq;
    ++v.batches;
    if (!decoded.ok()) {
      v.error = decoded.status().message();
      return;
    }
    for (const daemon::KvEvent& e : decoded->events) {
      const size_t m = Index(e.medium);
      switch (e.type) {
        case daemon::KvEvent::Type::kBlockStored:
          for (const BlockKey& k : e.keys) v.held[m].insert(k.lo);
          v.stored[m] += e.keys.size();
          break;
        case daemon::KvEvent::Type::kBlockRemoved:
          for (const BlockKey& k : e.keys) v.held[m].erase(k.lo);
          v.removed[m] += e.keys.size();
          break;
        case daemon::KvEvent::Type::kAllBlocksCleared:
          for (auto& held : v.held) held.clear();
          ++v.cleared;
          break;
      }
    }
  }

  int64_t NextSeq(size_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return views_[i].next_seq;
  }

  // A replay whose end marker has not come within this is asked again.
  static constexpr auto kReplayTimeout = std::chrono::seconds(1);

  void AskReplay(size_t i) {
    const uint64_t from = static_cast<uint64_t>(NextSeq(i));
    std::array<unsigned char, 8> seq{};
    for (int k = 0; k < 8; ++k)
      seq[k] = static_cast<unsigned char>(from >> (56 - 8 * k));
    dealers_[i].send(zmq::message_t(), zmq::send_flags::sndmore);
    dealers_[i].send(zmq::buffer(seq));
    pending_[i] = Clock::now() + kReplayTimeout;
  }

  void Run() {
    try {
      Serve();
    } catch (const zmq::error_t& e) {
      std::lock_guard<std::mutex> lock(mu_);
      for (NodeView& v : views_) v.error = std::string("ZeroMQ: ") + e.what();
    }
  }

  void Serve() {
    while (!stop_.load()) {
      for (size_t i = 0; i < subs_.size(); ++i) {
        if (pending_[i].has_value() && Clock::now() > *pending_[i]) {
          pending_[i].reset();
          catch_up_[i].store(true);
        }
        if (!pending_[i].has_value() && catch_up_[i].exchange(false)) {
          AskReplay(i);
        }
      }
      std::vector<zmq::pollitem_t> items;
      for (size_t i = 0; i < subs_.size(); ++i) {
        items.push_back({subs_[i].handle(), 0, ZMQ_POLLIN, 0});
        items.push_back({dealers_[i].handle(), 0, ZMQ_POLLIN, 0});
      }
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
      for (size_t i = 0; i < subs_.size(); ++i) {
        if ((items[2 * i].revents & ZMQ_POLLIN) != 0) ReadLive(i);
        if ((items[2 * i + 1].revents & ZMQ_POLLIN) != 0) ReadReplay(i);
      }
    }
  }

  // [topic, seq, batch].
  void ReadLive(size_t i) {
    std::vector<zmq::message_t> frames;
    (void)zmq::recv_multipart(subs_[i], std::back_inserter(frames),
                              zmq::recv_flags::dontwait);
    if (frames.size() != 3) return;
    const int64_t seq = Seq(frames[1]);
    if (seq > NextSeq(i)) {
      CatchUp(i);  // A gap: the replay has it.
      return;
    }
    Apply(i, seq, frames[2]);
  }

  // ["", seq, batch], then ["", -1, ""] at the end.
  void ReadReplay(size_t i) {
    std::vector<zmq::message_t> frames;
    (void)zmq::recv_multipart(dealers_[i], std::back_inserter(frames),
                              zmq::recv_flags::dontwait);
    if (frames.size() != 3) return;
    const int64_t seq = Seq(frames[1]);
    if (seq == -1) {
      pending_[i].reset();
      return;
    }
    SkipLost(i, seq);
    Apply(i, seq, frames[2]);
  }

  // A replay answers from the number asked for: a first batch past it means
  // the numbers between were never published (tierkvd dropped events). No
  // replay fills that gap; the router goes on from there, its view marked.
  void SkipLost(size_t i, int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    NodeView& v = views_[i];
    if (seq > v.next_seq) {
      ++v.gaps;
      v.next_seq = seq;
    }
  }

  zmq::context_t context_{1};
  std::vector<zmq::socket_t> subs_;
  std::vector<zmq::socket_t> dealers_;
  std::vector<std::atomic<bool>> catch_up_;
  // When a replay asked for is given up on; the router thread's own.
  std::vector<std::optional<Clock::time_point>> pending_;
  mutable std::mutex mu_;
  std::vector<NodeView> views_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Polls `done` until it holds or `timeout` passes; DeadlineExceeded
// naming `what` then.
template <typename F>
Status WaitFor(F done, std::chrono::seconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    TIERKV_ASSIGN_OR_RETURN(bool ok, done());
    if (ok) return Status::Ok();
    if (Clock::now() > deadline) {
      return Status::DeadlineExceeded(
          "waited " + std::to_string(timeout.count()) + " s for " + what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Until the node has no spill (write-behind copy included) and no transfer
// in flight: what it stored is on its lower tiers, the remote one too.
Status WaitCopiesDone(const Node& node) {
  return WaitFor(
      [&]() -> StatusOr<bool> {
        TIERKV_ASSIGN_OR_RETURN(CoordinatorStats s, FetchStats(node.socket));
        return s.host.spills_in_flight == 0 && s.host.events_in_flight == 0;
      },
      std::chrono::seconds(60), "node " + node.name + "'s spills");
}

// Whether the router's index of node `i` is what the node lists.
StatusOr<bool> IndexMatches(Router& router, size_t i, const Node& node) {
  TIERKV_ASSIGN_OR_RETURN(HeldKeys held, FetchHeldKeys(node.socket));
  const NodeView view = router.View(i);
  // A list cut at the reply's bound (tierkv-admin held's "#" line) cannot
  // be checked whole: not a match.
  auto same = [](const std::vector<BlockKey>& keys, uint64_t total,
                 const std::unordered_set<uint64_t>& index) {
    if (keys.size() != total || keys.size() != index.size()) return false;
    return std::all_of(keys.begin(), keys.end(),
                       [&](const BlockKey& k) { return index.contains(k.lo); });
  };
  return same(held.host, held.host_total,
              view.held[Index(CacheMedium::kCpu)]) &&
         same(held.disk, held.disk_total,
              view.held[Index(CacheMedium::kStorage)]) &&
         same(held.remote, held.remote_total,
              view.held[Index(CacheMedium::kRemote)]);
}

// Where a router following the events would find a request's chunks: per
// node, its blocks on host (CPU) and on disk (DISK), and the blocks in
// the shared remote tier (REMOTE, any node's).
struct Placement {
  std::vector<int64_t> host;
  std::vector<int64_t> disk;
  int64_t remote = 0;
  int64_t blocks = 0;
};

Placement Place(const std::vector<NodeView>& views,
                const std::vector<std::vector<BlockKey>>& chunks) {
  Placement p;
  p.host.assign(views.size(), 0);
  p.disk.assign(views.size(), 0);
  for (const std::vector<BlockKey>& keys : chunks) {
    for (const BlockKey& k : keys) {
      ++p.blocks;
      bool remote = false;
      for (size_t n = 0; n < views.size(); ++n) {
        const NodeView& v = views[n];
        if (v.held[Index(CacheMedium::kCpu)].contains(k.lo)) ++p.host[n];
        if (v.held[Index(CacheMedium::kStorage)].contains(k.lo)) ++p.disk[n];
        remote |= v.held[Index(CacheMedium::kRemote)].contains(k.lo);
      }
      if (remote) ++p.remote;
    }
  }
  return p;
}

void PrintNodes(const RagDemoOptions& o, const RagDemoReport& r,
                const std::vector<Node>& nodes, const RagWorkload& workload,
                const std::vector<NodeView>& views, std::ostream& out) {
  const double block = static_cast<double>(RagLayout().BlockBytes());
  out << "\nRequests node by node: where their chunks (system prompt, "
         "documents) came from, and the remote tier\n"
      << "  node  requests     pool    host   lower computed   written    "
         "read   known\n";
  for (const RagNodeReport& n : r.nodes) {
    int64_t pool = 0, host = 0;
    for (const RagRequestResult& q : r.requests) {
      if (q.id < n.first_request || q.id >= n.end_request) continue;
      pool += q.pool_hits;
      host += q.host_hits;
    }
    const RemoteTierStats remote = n.stats.remote.value_or(RemoteTierStats{});
    std::ostringstream range;
    range << n.first_request << "-" << n.end_request - 1;
    out << "  " << std::left << std::setw(6) << n.name << std::setw(9)
        << range.str() << std::right << std::setw(8) << pool << std::setw(8)
        << host << std::setw(8) << n.lower_hits << std::setw(9) << n.computed
        << std::setw(10) << remote.puts << std::setw(8) << remote.hits
        << std::setw(8) << remote.known_keys << '\n';
  }
  out << "  (pool: the worker's device chunk pool; host, lower: the node's "
         "host tier, and its disk\n   tier or the remote tier where its "
         "disk lacks the block; written, read: blocks of "
      << admin::HumanBytes(block)
      << "\n   the node wrote to and read (verified) from Redis; known: "
         "blocks its scans found there,\n   every node's)\n";
  for (size_t k = 1; k < r.nodes.size(); ++k) {
    const RagNodeReport& n = r.nodes[k];
    const RemoteTierStats remote = n.stats.remote.value_or(RemoteTierStats{});
    out << "Node " << n.name << ": " << n.lower_hits
        << " chunks from the lower tier, with " << remote.hits
        << " block reads ("
        << admin::HumanBytes(static_cast<double>(remote.hits) * block)
        << ") from the remote tier of blocks its own disk lacked.\n  It "
           "computed "
        << n.computed << " chunks that no tier held.\n";
  }
  if (o.verify) {
    out << "Verified: " << r.verified - r.mismatches << " of " << r.verified
        << " requests bit-identical to a private chunk store in the worker "
           "(cross-node loads included)\n";
  }

  out << "\nWhat a router saw: each node's KV events (vLLM format, ZeroMQ, "
         "replay for what it missed)\n"
      << "  node  batches   stored CPU    DISK REMOTE   removed CPU    DISK "
         "REMOTE   held CPU    DISK REMOTE  = held?\n";
  for (const RagNodeReport& n : r.nodes) {
    out << "  " << std::left << std::setw(6) << n.name << std::right
        << std::setw(7) << n.batches << std::setw(13)
        << n.stored[Index(CacheMedium::kCpu)] << std::setw(8)
        << n.stored[Index(CacheMedium::kStorage)] << std::setw(7)
        << n.stored[Index(CacheMedium::kRemote)] << std::setw(14)
        << n.removed[Index(CacheMedium::kCpu)] << std::setw(8)
        << n.removed[Index(CacheMedium::kStorage)] << std::setw(7)
        << n.removed[Index(CacheMedium::kRemote)] << std::setw(11)
        << n.held[Index(CacheMedium::kCpu)] << std::setw(8)
        << n.held[Index(CacheMedium::kStorage)] << std::setw(7)
        << n.held[Index(CacheMedium::kRemote)] << std::setw(9)
        << (n.index_matches ? "yes" : "NO") << '\n';
  }
  out << "  (= held?: the index rebuilt from the events equals what "
         "tierkv-admin held lists)\n";

  // Routing the first few requests again, by the events alone.
  const KeyHasher hasher(
      {.model_fingerprint = r.nodes.front().stats.key_fingerprint,
       .tenant = ""});
  out << "\nWhere the router would send a request now, by the events "
         "alone: its chunks' blocks\non each node's host and disk tiers, and "
         "in the remote tier (any node loads those);\nthe node with the most "
         "on host wins, then the most on disk:\n";
  // The workers' chunk stores key chunks with their RoPE config too.
  const BlockKey variant = ChunkVariant(RagModelConfig().Rope().ToString(), "");
  const size_t shown = std::min<size_t>(3, workload.requests.size());
  for (size_t q = 0; q < shown; ++q) {
    const RagRequest& req = workload.requests[q];
    std::vector<std::vector<BlockKey>> chunks = {
        hasher.ChunkKeys(workload.system, kBlockSize, 0, variant)};
    for (int32_t d : req.documents) {
      chunks.push_back(hasher.ChunkKeys(
          workload.documents[static_cast<size_t>(d)], kBlockSize, 0, variant));
    }
    const Placement p = Place(views, chunks);
    out << "  request " << req.id << " (" << p.blocks << " blocks):";
    size_t best = 0;
    for (size_t n = 0; n < nodes.size(); ++n) {
      out << " " << nodes[n].name << " host " << p.host[n] << ", disk "
          << p.disk[n] << ";";
      if (std::pair(p.host[n], p.disk[n]) >
          std::pair(p.host[best], p.disk[best])) {
        best = n;
      }
    }
    out << " remote tier " << p.remote << " -> node " << nodes[best].name
        << '\n';
  }
}

}  // namespace

StatusOr<RagDemoReport> RunNodesDemo(const RagDemoOptions& o, std::ostream& out,
                                     std::ostream& progress) {
  TIERKV_RETURN_IF_ERROR(ValidateRagOptions(o));
  const std::string tierkvd = TierkvdPath(o);
  const std::string worker = o.worker_path.empty() ? SelfPath() : o.worker_path;
  DirRemover cleanup;
  TIERKV_RETURN_IF_ERROR(MakeWorkDir(o.work_dir, &cleanup));
  const KvLayout layout = RagLayout();
  const RagWorkload workload = GenerateRagWorkload(o);
  const std::string tenant = DemoTenant();

  std::unique_ptr<RedisClusterHarness> cluster;
  std::string seeds = o.redis_seeds;
  if (seeds.empty()) {
    progress << "tierkv-demo: starting a Redis Cluster of 3 masters on "
                "loopback ports...\n"
             << std::flush;
    StatusOr<std::unique_ptr<RedisClusterHarness>> started =
        RedisClusterHarness::Start(
            {.masters = 3, .replicas_per_master = 0, .persistence = false});
    if (!started.ok()) {
      return Status(started.status().code(),
                    "--nodes needs a Redis Cluster: either redis-server and "
                    "redis-cli here (Debian: redis-server, redis-tools; "
                    "tools/run deps installs them) or --redis "
                    "HOST:PORT,...\n  " +
                        started.status().message());
    }
    cluster = std::move(*started);
    seeds = cluster->Seeds();
  }
  out << "tierkv multi-node RAG demo: " << o.nodes << " nodes, each a tierkvd "
      << "with " << o.workers << " workers, a host tier of "
      << admin::HumanBytes(static_cast<double>(o.host_bytes))
      << " and a disk tier of its own;\none remote tier for all of them on "
         "the Redis Cluster "
      << seeds << " (tenant " << tenant << ").\n"
      << o.requests << " requests: " << o.documents << " documents of "
      << o.document_tokens << " tokens, " << o.docs_per_prompt
      << " per prompt, Zipf " << o.zipf << ". Model: " << layout.ToString()
      << ".\n"
      << "The requests run node by node in equal shares; a node starts once "
         "the earlier nodes' blocks\nare in the remote tier and its scans "
         "have found them.\n"
      << std::flush;

  std::vector<Node> nodes;
  for (int32_t k = 0; k < o.nodes; ++k) {
    Node n;
    n.name = std::string(1, static_cast<char>('a' + k));
    n.dir = cleanup.dir + "/node-" + n.name;
    std::filesystem::create_directories(n.dir);
    n.socket = n.dir + "/tierkvd.sock";
    n.log = n.dir + "/tierkvd.log";
    n.events = "ipc://" + n.dir + "/events";
    n.replay = "ipc://" + n.dir + "/replay";
    std::vector<std::string> argv = TierkvdArgs(
        o, tierkvd, "demo-" + std::to_string(getpid()) + "-" + n.name, n.dir);
    for (auto [flag, value] :
         std::initializer_list<std::pair<const char*, std::string>>{
             {"--remote-redis", seeds},
             {"--remote-tenant", tenant},
             // The demo deletes what it wrote at the end; should it not get
             // there, an hour on, Redis does.
             {"--remote-ttl", "3600"},
             // Often, so that a node finds the earlier ones' blocks soon.
             {"--remote-scan-interval-ms", "100"},
             {"--kv-events-endpoint", n.events},
             {"--kv-events-replay-endpoint", n.replay}}) {
      argv.push_back(flag);
      argv.push_back(value);
    }
    TIERKV_ASSIGN_OR_RETURN(n.daemon, StartTierkvd(argv, n.socket, n.log));
    nodes.push_back(std::move(n));
  }
  std::optional<Router> router(std::in_place, nodes);

  RagDemoReport report;
  ProgressReporter bar(o.progress, static_cast<uint64_t>(o.requests),
                       "requests", progress);
  for (int32_t k = 0; k < o.nodes; ++k) {
    Node& node = nodes[static_cast<size_t>(k)];
    RagNodeReport n;
    n.name = node.name;
    n.first_request = static_cast<int32_t>(int64_t{o.requests} * k / o.nodes);
    n.end_request =
        static_cast<int32_t>(int64_t{o.requests} * (k + 1) / o.nodes);
    RagDemoOptions share = o;
    share.request_begin = n.first_request;
    share.request_end = n.end_request;
    std::vector<std::vector<std::string>> argvs;
    for (int32_t i = 0; i < o.workers; ++i) {
      std::vector<std::string> argv = {worker,           "worker",
                                       "--socket",       node.socket,
                                       "--worker-index", std::to_string(i)};
      for (std::string& a : WorkerArgs(share)) argv.push_back(std::move(a));
      argvs.push_back(std::move(argv));
    }
    TIERKV_RETURN_IF_ERROR(RunWorkers(argvs, bar, report.requests.size(),
                                      &report.requests, progress));
    for (const RagRequestResult& q : report.requests) {
      if (q.id < n.first_request || q.id >= n.end_request) continue;
      n.lower_hits += q.disk_hits;
      n.computed += q.computed;
    }
    report.nodes.push_back(std::move(n));
    if (k + 1 == o.nodes) break;
    // The next node starts once this node's copies to the lower tiers are
    // done and a scan of the next node's that began after them has ended.
    TIERKV_RETURN_IF_ERROR(WaitCopiesDone(node));
    const Node& next = nodes[static_cast<size_t>(k) + 1];
    TIERKV_ASSIGN_OR_RETURN(CoordinatorStats before, FetchStats(next.socket));
    const uint64_t passes =
        before.remote.value_or(RemoteTierStats{}).scan_passes;
    TIERKV_RETURN_IF_ERROR(WaitFor(
        [&]() -> StatusOr<bool> {
          TIERKV_ASSIGN_OR_RETURN(CoordinatorStats s, FetchStats(next.socket));
          return s.remote.value_or(RemoteTierStats{}).scan_passes >= passes + 2;
        },
        std::chrono::seconds(60), "node " + next.name + "'s scans"));
  }
  bar.Done();
  if (report.requests.size() != static_cast<size_t>(o.requests)) {
    return Status::Internal("the workers reported " +
                            std::to_string(report.requests.size()) + " of " +
                            std::to_string(o.requests) + " requests");
  }

  // The router's view, once it has every node's events: each node's
  // copies done, then the index the events rebuilt checked against what
  // the node lists (asking the replay endpoint again while they differ).
  std::vector<NodeView> views;
  for (size_t i = 0; i < nodes.size(); ++i) {
    RagNodeReport& n = report.nodes[i];
    TIERKV_RETURN_IF_ERROR(WaitCopiesDone(nodes[i]));
    Status matched = WaitFor(
        [&]() -> StatusOr<bool> {
          TIERKV_ASSIGN_OR_RETURN(bool same,
                                  IndexMatches(*router, i, nodes[i]));
          if (!same) router->CatchUp(i);
          return same;
        },
        std::chrono::seconds(10), "the router to match node " + n.name);
    n.index_matches = matched.ok();
    TIERKV_ASSIGN_OR_RETURN(n.stats, FetchStats(nodes[i].socket));
    NodeView v = router->View(i);
    if (!v.error.empty()) {
      return Status::DataLoss("node " + n.name +
                              ": a KV event batch did not decode: " + v.error);
    }
    n.batches = v.batches;
    n.cleared = v.cleared;
    for (CacheMedium m : kMedia) {
      n.stored[Index(m)] = v.stored[Index(m)];
      n.removed[Index(m)] = v.removed[Index(m)];
      n.held[Index(m)] = v.held[Index(m)].size();
    }
    views.push_back(std::move(v));
  }
  report.stats = report.nodes.front().stats;
  router.reset();
  // What the nodes wrote to the remote tier goes with them (a cluster of
  // --redis keeps nothing of the demo's); tierkvd runs the deletes queued
  // before it exits.
  for (Node& node : nodes) {
    TIERKV_RETURN_IF_ERROR(ClearTiers(node.socket));
    TIERKV_RETURN_IF_ERROR(StopTierkvd(*node.daemon, node.log));
  }
  TallyRequests(&report);
  PrintNodes(o, report, nodes, workload, views, out);
  return report;
}

}  // namespace tierkv::demo
