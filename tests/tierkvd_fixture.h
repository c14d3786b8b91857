// TierkvdFixture: a real tierkvd process for integration tests, in a
// scratch directory with a store name of its own, plus helpers to attach
// clients and spawn worker processes (tests/worker_main.cc). TearDown stops
// tierkvd cleanly and removes what a killed one left behind.
// Needs TIERKVD_PATH and TEST_WORKER_PATH defined by the build.
#ifndef TIERKV_TESTS_TIERKVD_FIXTURE_H_
#define TIERKV_TESTS_TIERKVD_FIXTURE_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ipc/protocol.h"
#include "ipc/socket_call.h"
#include "ipc/unix_socket.h"
#include "tests/child_process.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"

namespace tierkv {

class TierkvdFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = "t" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    socket_ = dir_ + "/tierkvd.sock";
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      daemon_->Signal(SIGTERM);  // A clean stop removes its files.
      daemon_->Wait();
      daemon_.reset();
    }
    RemoveStoreSegments(store_);  // Whatever a killed daemon left behind.
  }

  static std::unique_ptr<ChildProcess> Spawn(std::vector<std::string> argv) {
    auto child = ChildProcess::Spawn(std::move(argv));
    EXPECT_THAT(child, IsOk()) << child.status().ToString();
    return std::move(child).value();
  }
  std::vector<std::string> DaemonArgs(const std::string& capacity) const {
    return {TIERKVD_PATH, "--store",         store_,  "--socket",
            socket_,      "--layers",        "2",     "--kv-heads",
            "2",          "--head-dim",      "64",    "--dtype",
            "bf16",       "--host-capacity", capacity};
  }
  // Starts tierkvd and waits for the line it logs once it serves.
  void StartDaemon(const std::string& capacity = "1M",
                   const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = DaemonArgs(capacity);
    args.insert(args.end(), more.begin(), more.end());
    daemon_ = Spawn(args);
    ASSERT_TRUE(daemon_->WaitForOutput("serving store")) << daemon_->output();
  }
  // A host tier of `slots` usable slots over a disk tier in dir_/disk,
  // spilling early so the disk keeps up with fast workers.
  void StartDaemonWithDisk(int slots,
                           const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {
        "--disk-dir",   dir_ + "/disk", "--disk-capacity", "64M",
        "--spill-high", "0.5",          "--spill-low",     "0.25"};
    args.insert(args.end(), more.begin(), more.end());
    StartDaemon(std::to_string((slots + 1) * TestLayout().BlockBytes()), args);
  }
  // SIGTERM: a clean stop, which lets the disk tier finish its writes.
  void StopDaemon() {
    daemon_->Signal(SIGTERM);
    EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
    daemon_.reset();
  }
  std::unique_ptr<ChildProcess> ManyWorker(const std::string& mode, int seed,
                                           int requests,
                                           const std::string& model = "") {
    return Spawn({TEST_WORKER_PATH, "--model", model, mode, socket_,
                  std::to_string(seed), std::to_string(requests)});
  }
  // A client of this tierkvd, named `name`.
  ClientOptions ClientOptionsFor(const std::string& name,
                                 const std::string& model = "") const {
    ClientOptions options;
    options.socket_path = socket_;
    options.layout = TestLayout();
    options.model = model;
    options.num_device_blocks = 64;
    options.name = name;
    return options;
  }
  std::unique_ptr<Client> Attach(const std::string& name = "test",
                                 const std::string& model = "") {
    auto client = Client::Open(ClientOptionsFor(name, model));
    EXPECT_THAT(client, IsOk()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }
  std::unique_ptr<ChildProcess> Worker(const std::string& mode, int seed,
                                       int blocks) {
    return Spawn({TEST_WORKER_PATH, mode, socket_, std::to_string(seed),
                  std::to_string(blocks)});
  }
  // tierkvd's stats once it is settled: no worker but `observer` (a worker
  // that exited is noticed when tierkvd sees its socket close, so this
  // waits for that), no transfer in flight, and the disk tier idle
  // (Client::WaitIdle: every spill and promotion finished and applied).
  static CoordinatorStats SettledStats(Client& observer) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      EXPECT_THAT(observer.WaitIdle(std::chrono::seconds(20)), IsOk());
      StatusOr<CoordinatorStats> s = observer.Stats();
      EXPECT_THAT(s, IsOk());
      if (!s.ok()) return {};
      if ((s->host.events_in_flight == 0 && s->workers.size() == 1 &&
           s->host.spills_in_flight == 0 &&
           s->host.promotions_in_flight == 0) ||
          std::chrono::steady_clock::now() > deadline) {
        return *s;
      }
      std::this_thread::yield();
    }
  }
  // A worker that registers by hand over the socket and keeps what tierkvd
  // passed it, its segments' descriptors, as a hostile worker would.
  struct RawWorker {
    ipc::UniqueFd socket;  // Closing it detaches the worker.
    WorkerId id = 0;
    ipc::UniqueFd host, channel;
    ipc::UniqueFd ready;  // Read end of tierkvd's readiness pipe.
  };
  std::unique_ptr<RawWorker> RawAttach(const std::string& name = "raw",
                                       const std::string& tenant = "") {
    auto raw = std::make_unique<RawWorker>();
    const auto deadline = ipc::Clock::now() + std::chrono::seconds(10);
    StatusOr<int> fd = ipc::Connect(socket_, deadline);
    EXPECT_THAT(fd, IsOk());
    if (!fd.ok()) return nullptr;
    raw->socket.reset(*fd);
    WorkerRegistration registration;
    registration.layout = TestLayout();
    registration.num_device_blocks = 64;
    registration.name = name;
    registration.tenant = tenant;
    const std::vector<std::byte> hello =
        ipc::Encode(ipc::RegisterRequest{std::move(registration)});
    EXPECT_THAT(ipc::SendAll(*fd, hello, deadline), IsOk());
    std::vector<ipc::UniqueFd> fds;
    StatusOr<ipc::Message> reply =
        ipc::ReadFrame(*fd, deadline, &fds, ipc::kRegisterReplyFds);
    EXPECT_THAT(reply, IsOk());
    const auto* reg =
        reply.ok() ? std::get_if<ipc::RegisterReply>(&*reply) : nullptr;
    EXPECT_NE(reg, nullptr);
    EXPECT_EQ(fds.size(), size_t{ipc::kRegisterReplyFds});
    if (reg == nullptr || fds.size() != ipc::kRegisterReplyFds) return nullptr;
    raw->id = reg->worker_id;
    raw->host = std::move(fds[0]);
    raw->channel = std::move(fds[1]);
    raw->ready = std::move(fds[2]);
    return raw;
  }
  // What tierkvd has under /dev/shm: the names starting tierkv.<store>.
  std::vector<std::string> ShmNames() const {
    std::vector<std::string> names;
    const std::string prefix = "tierkv." + store_ + ".";
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix)) names.push_back(name);
    }
    return names;
  }

  const TempDir scratch_{"tierkvd_test"};
  const std::string dir_ = scratch_.path();
  std::string store_, socket_;
  std::unique_ptr<ChildProcess> daemon_;
};

}  // namespace tierkv

#endif  // TIERKV_TESTS_TIERKVD_FIXTURE_H_
