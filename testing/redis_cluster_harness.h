// RedisClusterHarness: a real Redis Cluster on loopback for tests and
// benchmarks: redis-server processes (3 masters and 3 replicas by default),
// each in its own directory under a temporary directory, made a cluster by
// `redis-cli --cluster create`. It can kill a master and wait for its
// replica to take over, stop and restart the whole cluster from its
// directories (data and nodes.conf survive), freeze a node, and run admin
// commands on one node. Every process is killed and the directory removed
// when the harness is destroyed, whatever the test did.
// Not thread-safe: one thread drives a harness.
#ifndef TIERKV_TESTING_REDIS_CLUSTER_HARNESS_H_
#define TIERKV_TESTING_REDIS_CLUSTER_HARNESS_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tierkv/status.h"

namespace tierkv {

class ChildProcess;

struct RedisClusterHarnessOptions {
  // Default: 3 masters, each with 1 replica.
  int masters = 3;
  int replicas_per_master = 1;
  // cluster-node-timeout: how long a silent master stays up in the others'
  // view; a failover takes about twice this. Default: 1000 ms.
  std::chrono::milliseconds node_timeout{1000};
  // Snapshot on shutdown (save points on), so a stopped cluster restarts
  // with its data. Default: on.
  bool persistence = true;
  // Bound on starting, on a failover and on a restart. Default: 30 s.
  std::chrono::seconds deadline{30};
};

class RedisClusterHarness {
 public:
  // Starts the nodes and creates the cluster; returns once every node
  // reports cluster_state:ok with all 16384 slots served and every replica
  // is in sync. FailedPrecondition, saying what to install, when
  // redis-server or redis-cli is missing.
  static StatusOr<std::unique_ptr<RedisClusterHarness>> Start(
      const RedisClusterHarnessOptions& options = {});
  ~RedisClusterHarness();
  RedisClusterHarness(const RedisClusterHarness&) = delete;
  RedisClusterHarness& operator=(const RedisClusterHarness&) = delete;

  // "127.0.0.1:port,..." of every node.
  std::string Seeds() const;
  int num_nodes() const { return static_cast<int>(ports_.size()); }
  int port(int node) const { return ports_[node]; }
  bool alive(int node) const;

  // Runs one command on one node (its own short-lived connection). The
  // reply as text: a string, status or number as is, nil as "(nil)", an
  // array's elements one per line; an error reply is an Internal status.
  StatusOr<std::string> Command(int node, const std::vector<std::string>& args);

  // The live node that serves `slot` as master, as the cluster sees it.
  StatusOr<int> MasterOf(int slot);
  // The node's cluster id (CLUSTER MYID).
  StatusOr<std::string> NodeId(int node);

  // SIGKILLs a master and waits until one of its replicas serves its slots
  // and the cluster is healthy again; returns the replica that took over.
  StatusOr<int> KillMaster(int node);
  // SIGSTOP / SIGCONT of one node.
  void Freeze(int node);
  void Thaw(int node);

  // Stops every node (SIGTERM: each saves its data and exits) and starts
  // them again from their directories; returns once the cluster is healthy.
  Status StopAll();
  Status RestartAll();

  // Polls until every live node reports cluster_state:ok, all 16384 slots
  // ok, and every live replica's link to its master is up.
  Status WaitHealthy();

 private:
  RedisClusterHarness(RedisClusterHarnessOptions options, std::string root);

  // Picks ports and starts every node; AlreadyExists when a port turned
  // out to be taken.
  Status StartNodes();
  Status WriteConfig(int node);
  Status SpawnNode(int node);
  Status WaitAnswers(int node);
  Status CreateCluster();
  StatusOr<bool> NodeHealthy(int node);
  std::chrono::steady_clock::time_point Deadline() const;

  const RedisClusterHarnessOptions options_;
  const std::string root_;  // Removed with everything in it.
  std::string server_path_;
  std::string cli_path_;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<ChildProcess>> nodes_;  // nullptr: not running.
};

}  // namespace tierkv

#endif  // TIERKV_TESTING_REDIS_CLUSTER_HARNESS_H_
