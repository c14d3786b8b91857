// tierkvd's remote tier across machines, with real processes: a Redis
// Cluster of 3 masters and 3 replicas (testing/redis_cluster_harness.h) and
// two tierkvds, "node A" and "node B", each with its own store, socket, host
// tier and (A only) disk. Blocks a worker stores through A reach the cluster
// by write-behind; B's scans find them and a worker on B loads them
// bit-exact. A master killed while B loads costs misses and counted errors,
// never a wrong byte, and loads resume once its replica has taken over;
// after a full cluster restart B serves the blocks again. With the remote
// tier under A's disk tier, only what that disk evicts reaches B.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/redis_cluster_harness.h"
#include "tests/child_process.h"
#include "tests/fill_worker.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tierkv/stats.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

constexpr int kRequests = 48;  // One block each.
constexpr auto kWait = std::chrono::seconds(20);

class TierkvdRedisClusterTest : public ::testing::Test {
 protected:
  struct Node {
    std::string store, socket;
    std::unique_ptr<ChildProcess> daemon;
  };

  void SetUp() override {
    StatusOr<std::unique_ptr<RedisClusterHarness>> h =
        RedisClusterHarness::Start();
    ASSERT_THAT(h, IsOk());
    cluster_ = std::move(*h);
  }
  void TearDown() override {
    for (Node* node : {&a_, &b_}) {
      if (node->daemon == nullptr) continue;
      node->daemon->Signal(SIGTERM);
      node->daemon->Wait();
      node->daemon.reset();
      RemoveStoreSegments(node->store);
    }
  }

  // Starts tierkvd `name` with `slots` host slots on the cluster, scanning
  // it every 50 ms, and waits until it serves.
  void StartNode(Node* node, const std::string& name, int slots,
                 const std::vector<std::string>& more = {}) {
    node->store = "r" + std::to_string(getpid()) + name;
    node->socket = dir_ + "/" + name + ".sock";
    std::vector<std::string> args = {
        TIERKVD_PATH,
        "--store",
        node->store,
        "--socket",
        node->socket,
        "--layers",
        "2",
        "--kv-heads",
        "2",
        "--head-dim",
        "64",
        "--dtype",
        "bf16",
        "--host-capacity",
        std::to_string((slots + 1) * TestLayout().BlockBytes()),
        "--remote-redis",
        cluster_->Seeds(),
        "--remote-scan-interval-ms",
        "50"};
    args.insert(args.end(), more.begin(), more.end());
    StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Spawn(std::move(args));
    ASSERT_THAT(child, IsOk());
    node->daemon = std::move(*child);
    ASSERT_TRUE(node->daemon->WaitForOutput("serving store"))
        << node->daemon->output();
  }

  // A fill or verify worker process of kRequests one-block requests of
  // `seed` on `node`, run to its end; verify's tally.
  static Tally RunWorker(const Node& node, const std::string& mode, int seed) {
    StatusOr<std::unique_ptr<ChildProcess>> worker =
        ChildProcess::Spawn({TEST_WORKER_PATH, mode, node.socket,
                             std::to_string(seed), std::to_string(kRequests)});
    EXPECT_THAT(worker, IsOk());
    if (!worker.ok()) return {};
    EXPECT_EQ((*worker)->Wait(), 0) << (*worker)->output();
    return ParseTally((*worker)->output());
  }

  // `node`'s stats once `done` holds of them; the last ones read when it
  // does not within kWait.
  static CoordinatorStats WaitStats(
      const Node& node,
      const std::function<bool(const CoordinatorStats&)>& done) {
    ClientOptions options;
    options.socket_path = node.socket;
    options.layout = TestLayout();
    options.num_device_blocks = 4;
    options.name = "observer";
    StatusOr<std::unique_ptr<Client>> observer = Client::Open(options);
    EXPECT_THAT(observer, IsOk());
    if (!observer.ok()) return {};
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    for (;;) {
      StatusOr<CoordinatorStats> s = (*observer)->Stats();
      EXPECT_THAT(s, IsOk());
      if (!s.ok()) return {};
      if (done(*s) || std::chrono::steady_clock::now() > deadline) return *s;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  static RemoteTierStats Remote(const CoordinatorStats& s) {
    EXPECT_TRUE(s.remote.has_value());
    return s.remote.value_or(RemoteTierStats{});
  }
  // Waits until A has written every block of a fill to the cluster and B
  // has found them all.
  void WaitShared() {
    const RemoteTierStats a = Remote(WaitStats(a_, [](const auto& s) {
      return s.remote.has_value() && s.remote->puts >= kRequests;
    }));
    ASSERT_GE(a.puts, uint64_t{kRequests});
    const RemoteTierStats b = Remote(WaitStats(b_, [](const auto& s) {
      return s.remote.has_value() && s.remote->known_keys >= kRequests;
    }));
    ASSERT_EQ(b.known_keys, uint64_t{kRequests});
  }
  // Waits for B's next whole scan of the cluster.
  // Until every replica of `master` has acknowledged all its writes
  // (INFO replication: each slave's offset reaches master_repl_offset).
  void WaitReplicated(int master) {
    const auto fail_after =
        std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      StatusOr<std::string> info =
          cluster_->Command(master, {"INFO", "replication"});
      ASSERT_THAT(info, IsOk());
      long long master_offset = -1, lowest = -1;
      std::istringstream lines(*info);
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("master_repl_offset:", 0) == 0) {
          master_offset = std::stoll(line.substr(19));
        } else if (line.rfind("slave", 0) == 0 &&
                   line.find("offset=") != std::string::npos) {
          const long long offset =
              std::stoll(line.substr(line.find("offset=") + 7));
          lowest = lowest < 0 ? offset : std::min(lowest, offset);
        }
      }
      if (master_offset >= 0 && lowest >= master_offset) return;
      ASSERT_LT(std::chrono::steady_clock::now(), fail_after)
          << "replicas never caught up: " << *info;
      std::this_thread::yield();
    }
  }

  void WaitNextScan() {
    const uint64_t passes =
        Remote(WaitStats(b_, [](const auto&) { return true; })).scan_passes;
    EXPECT_GT(Remote(WaitStats(b_,
                               [passes](const auto& s) {
                                 return s.remote->scan_passes > passes;
                               }))
                  .scan_passes,
              passes);
  }
  std::string Admin(const Node& node, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {TIERKV_ADMIN_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--socket", node.socket});
    StatusOr<std::unique_ptr<ChildProcess>> admin =
        ChildProcess::Spawn(std::move(argv));
    EXPECT_THAT(admin, IsOk());
    if (!admin.ok()) return "";
    EXPECT_EQ((*admin)->Wait(), 0) << (*admin)->output();
    return (*admin)->output();
  }

  const TempDir scratch_{"tierkvd_remote_test"};
  const std::string dir_ = scratch_.path();
  std::unique_ptr<RedisClusterHarness> cluster_;
  Node a_, b_;
};

// A stores through its disk and the cluster (write-through); B, remote tier
// only and a host tier far smaller than the blocks, loads every one of them
// bit-exact from the cluster.
TEST_F(TierkvdRedisClusterTest, BlocksStoredThroughOneNodeLoadThroughAnother) {
  StartNode(&a_, "a", 128,
            {"--disk-dir", dir_ + "/a-disk", "--disk-capacity", "64M"});
  StartNode(&b_, "b", 8);
  ASSERT_FALSE(HasFailure());
  RunWorker(a_, "fill", 5);
  WaitShared();
  const CoordinatorStats a = WaitStats(a_, [](const CoordinatorStats& s) {
    return s.disk.has_value() && s.disk->puts >= kRequests;
  });
  ASSERT_TRUE(a.disk.has_value());
  EXPECT_GE(a.disk->puts, uint64_t{kRequests});
  EXPECT_EQ(Remote(a).keys, uint64_t{kRequests});

  const Tally t = RunWorker(b_, "verify", 5);
  EXPECT_EQ(t.hit, kRequests);
  EXPECT_EQ(t.missed, 0);
  EXPECT_EQ(t.wrong, 0);
  const CoordinatorStats b = WaitStats(b_, [](const auto&) { return true; });
  EXPECT_FALSE(b.disk.has_value());
  const RemoteTierStats r = Remote(b);
  EXPECT_GE(r.hits, uint64_t{kRequests});
  EXPECT_EQ(r.keys, 0u);  // B wrote none of them.
  EXPECT_EQ(r.checksum_failures, 0u);
  EXPECT_EQ(r.token_mismatches, 0u);
  EXPECT_GE(b.host.disk_hit_blocks, uint64_t{kRequests});

  // Blocks of a seed A never stored: misses on B too.
  const Tally none = RunWorker(b_, "verify", 6);
  EXPECT_EQ(none.hit, 0);
  EXPECT_EQ(none.wrong, 0);

  // The remote tier in tierkv-admin's table, fields and metrics.
  EXPECT_THAT(Admin(b_, {"stats"}), HasSubstr("remote "));
  EXPECT_THAT(Admin(b_, {"stats", "--json"}), HasSubstr("\"remote\":{"));
  const std::string metrics = Admin(b_, {"metrics"});
  EXPECT_THAT(metrics, HasSubstr("tierkv_remote_hits_total"));
  EXPECT_THAT(metrics, HasSubstr("tierkv_remote_known_keys"));
}

// --remote-placement under: A copies blocks to its disk alone, and only
// the blocks its small disk tier evicts go on to the cluster; B loads
// exactly those, bit-exact, and misses the ones only A's disk still holds.
TEST_F(TierkvdRedisClusterTest, UnderTheDiskOnlyWhatTheDiskEvictsIsShared) {
  // RocksDB's reserve at this size (3 MiB: tiers/disk_storage.cc) and room
  // for about 16 values of a block.
  const uint64_t disk_bytes =
      (uint64_t{3} << 20) + 16 * (TestLayout().BlockBytes() + 1024);
  // A's host holds every block; write-behind copies each to the disk tier,
  // which holds a third of them.
  StartNode(&a_, "a", 64,
            {"--disk-dir", dir_ + "/a-disk", "--disk-capacity",
             std::to_string(disk_bytes), "--remote-placement", "under"});
  StartNode(&b_, "b", 8);
  ASSERT_FALSE(HasFailure());
  RunWorker(a_, "fill", 11);
  // Until A's copies have settled: every disk eviction written on.
  const CoordinatorStats a = WaitStats(a_, [](const CoordinatorStats& s) {
    return s.disk.has_value() && s.remote.has_value() &&
           s.disk->puts >= kRequests && s.host.spills_in_flight == 0 &&
           s.remote->puts + s.remote->put_failures == s.disk->evictions;
  });
  ASSERT_TRUE(a.disk.has_value());
  const RemoteTierStats ar = Remote(a);
  ASSERT_GE(a.disk->puts, uint64_t{kRequests}) << Admin(a_, {"stats"});
  ASSERT_GT(a.disk->evictions, 0u);
  EXPECT_EQ(ar.put_failures, 0u);
  EXPECT_EQ(ar.puts, a.disk->evictions);
  EXPECT_EQ(ar.keys, a.disk->evictions);
  EXPECT_LT(ar.puts, uint64_t{kRequests});  // Not written through.
  EXPECT_EQ(a.host.evicted_unspilled, 0u);

  const RemoteTierStats br = Remote(WaitStats(b_, [&ar](const auto& s) {
    return s.remote.has_value() && s.remote->known_keys >= ar.keys;
  }));
  ASSERT_EQ(br.known_keys, ar.keys);
  const Tally t = RunWorker(b_, "verify", 11);
  EXPECT_EQ(t.hit, static_cast<long long>(ar.keys));
  EXPECT_EQ(t.missed, kRequests - t.hit);
  EXPECT_EQ(t.wrong, 0);
  // A itself still serves every block: with its host tier cleared, from
  // its disk or from the cluster.
  EXPECT_THAT(Admin(a_, {"clear", "--tier", "host"}), HasSubstr("host"));
  const Tally own = RunWorker(a_, "verify", 11);
  EXPECT_EQ(own.hit, kRequests);
  EXPECT_EQ(own.wrong, 0);
  const CoordinatorStats after =
      WaitStats(a_, [](const auto&) { return true; });
  EXPECT_GE(Remote(after).hits, ar.keys);
}

// B loads while a master is SIGKILLed: failed reads are misses and counted
// errors, never wrong bytes and never a hang; once a replica serves the
// master's slots B loads every block again.
TEST_F(TierkvdRedisClusterTest, AMasterKilledWhileANodeLoads) {
  StartNode(&a_, "a", 128);
  StartNode(&b_, "b", 8);
  ASSERT_FALSE(HasFailure());
  RunWorker(a_, "fill", 7);
  WaitShared();
  ASSERT_FALSE(HasFailure());

  StatusOr<int> master = cluster_->MasterOf(0);
  ASSERT_THAT(master, IsOk());
  // Redis replicates asynchronously: a master killed before its replica
  // has every write loses them. The test is of tierkv, not of that.
  WaitReplicated(*master);
  std::future<StatusOr<int>> killed = std::async(
      std::launch::async, [&] { return cluster_->KillMaster(*master); });
  int runs = 0;
  long long hit = 0, missed = 0;
  do {
    const Tally t = RunWorker(b_, "verify", 7);
    ASSERT_EQ(t.wrong, 0);
    ASSERT_EQ(t.hit + t.missed, kRequests);
    hit += t.hit;
    missed += t.missed;
    ++runs;
  } while (killed.wait_for(std::chrono::seconds(0)) !=
           std::future_status::ready);
  ASSERT_THAT(killed.get(), IsOk());
  const RemoteTierStats during =
      Remote(WaitStats(b_, [](const auto&) { return true; }));
  EXPECT_GT(during.errors, 0u)
      << runs << " runs, " << hit << " hits, " << missed << " misses";
  EXPECT_GT(missed, 0);

  // The replica serves the slots now: every block loads again, once B's
  // client has followed the failover (a scan pass, a redirect or its
  // backoff after the dead node's errors), within a bound.
  const auto fail_after =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  Tally after;
  do {
    WaitNextScan();
    after = RunWorker(b_, "verify", 7);
    ASSERT_EQ(after.wrong, 0);
  } while (after.hit < kRequests &&
           std::chrono::steady_clock::now() < fail_after);
  EXPECT_EQ(after.hit, kRequests);
}

// While the whole cluster is down B's loads miss (counted, no hang); after
// it restarts from its snapshots B loads every block bit-exact again. B has
// a disk tier of its own here, which holds none of A's blocks: its loads
// fall through disk to the cluster.
TEST_F(TierkvdRedisClusterTest, AFullClusterRestart) {
  StartNode(&a_, "a", 128);
  StartNode(&b_, "b", 8,
            {"--disk-dir", dir_ + "/b-disk", "--disk-capacity", "64M"});
  ASSERT_FALSE(HasFailure());
  RunWorker(a_, "fill", 9);
  WaitShared();
  ASSERT_FALSE(HasFailure());

  ASSERT_THAT(cluster_->StopAll(), IsOk());
  const Tally down = RunWorker(b_, "verify", 9);
  EXPECT_EQ(down.wrong, 0);
  EXPECT_EQ(down.hit + down.missed, kRequests);
  EXPECT_GT(down.missed, 0);
  const RemoteTierStats r =
      Remote(WaitStats(b_, [](const auto&) { return true; }));
  EXPECT_GT(r.errors, 0u);
  // A scan cut short forgets nothing.
  EXPECT_EQ(r.known_keys, uint64_t{kRequests});

  ASSERT_THAT(cluster_->RestartAll(), IsOk());
  WaitNextScan();
  const Tally after = RunWorker(b_, "verify", 9);
  EXPECT_EQ(after.hit, kRequests);
  EXPECT_EQ(after.wrong, 0);
  const CoordinatorStats b = WaitStats(b_, [](const auto&) { return true; });
  ASSERT_TRUE(b.disk.has_value());
  EXPECT_EQ(b.disk->hits, 0u);
  EXPECT_GE(Remote(b).hits, uint64_t{kRequests});
}

}  // namespace
}  // namespace tierkv
