// tierkvd's listener against peers that misbehave (ctest -R ListenerStall):
// peers that never read their replies, idle connections past the cap and
// past their deadline, a tierkvd out of descriptors, and a client facing a
// listen queue that is full. OutputQueueTest: the listener's writes, and
// descriptors passed with them.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <span>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "ipc/output_queue.h"
#include "ipc/protocol.h"
#include "ipc/server.h"
#include "ipc/socket_call.h"
#include "ipc/unique_fd.h"
#include "tests/scratch.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client.h"

namespace tierkv {
namespace {

using ipc::UniqueFd;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// A connection to the socket at `path`; invalid when connect fails (a
// non-blocking one, when the listen queue is full).
UniqueFd ConnectTo(const std::string& path, bool nonblocking = false) {
  UniqueFd fd(socket(
      AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0),
      0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    return UniqueFd();
  }
  return fd;
}

// Whether the other end has closed `fd` (read from or not).
bool HungUp(int fd) {
  pollfd p{fd, 0, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) != 0;
}

// Waits until the other end has closed at least `count` of `fds`, or
// `timeout` passes; how many it has closed.
size_t WaitHungUp(const std::vector<UniqueFd>& fds, size_t count,
                  milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::vector<pollfd> open;
    for (const UniqueFd& fd : fds) {
      if (!HungUp(fd.get())) open.push_back({fd.get(), 0, 0});
    }
    const size_t hung = fds.size() - open.size();
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (hung >= count || left.count() <= 0 || open.empty()) return hung;
    // Sleeps until one of the rest hangs up (poll always reports POLLHUP).
    poll(open.data(), open.size(), static_cast<int>(left.count()));
  }
}

// One reply on a blocking socket, within `timeout`.
StatusOr<ipc::Message> ReadReply(int fd, milliseconds timeout) {
  timeval tv{.tv_sec = timeout.count() / 1000,
             .tv_usec = (timeout.count() % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::vector<std::byte> frame(ipc::kFrameHeaderBytes);
  auto read_all = [fd](std::byte* p, size_t n) {
    while (n > 0) {
      const ssize_t got = recv(fd, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  if (!read_all(frame.data(), frame.size())) {
    return Status::Unavailable("no reply");
  }
  TIERKV_ASSIGN_OR_RETURN(uint32_t len, ipc::PeekPayloadLength(frame, 1 << 20));
  frame.resize(ipc::kFrameHeaderBytes + len);
  if (!read_all(frame.data() + ipc::kFrameHeaderBytes, len)) {
    return Status::Unavailable("reply cut short");
  }
  return ipc::Decode(frame);
}

// CPU time `pid` has used (user and system), in milliseconds.
int64_t CpuMs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), {});
  // Fields after the command's closing parenthesis, from field 3 on;
  // utime and stime are fields 14 and 15.
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  int64_t ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stoll(field);
  }
  return ticks * 1000 / sysconf(_SC_CLK_TCK);
}

size_t OpenFds(pid_t pid) {
  const std::filesystem::directory_iterator dir("/proc/" + std::to_string(pid) +
                                                "/fd");
  return static_cast<size_t>(std::distance(begin(dir), end(dir)));
}

// tierkvd in this process, so a test can ask it for CheckProgress.
class ListenerStallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = "ls" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    server_.reset();  // Stops it.
    RemoveStoreSegments(store_);
  }

  void StartServer(ipc::ServerOptions options) {
    options.store = store_;
    options.socket_path = socket_;
    options.host_capacity_bytes = size_t{1} << 20;
    options.layout = TestLayout();
    auto server = ipc::Server::Start(options);
    ASSERT_THAT(server, IsOk()) << server.status().ToString();
    server_ = std::move(*server);
  }
  StatusOr<std::unique_ptr<Client>> Open(milliseconds call_timeout,
                                         const std::string& path = "") {
    ClientOptions options;
    options.socket_path = path.empty() ? socket_ : path;
    options.layout = TestLayout();
    options.num_device_blocks = 16;
    options.name = "worker";
    options.call_timeout = call_timeout;
    return Client::Open(options);
  }

  const TempDir scratch_{"listener_stall_test"};
  const std::string socket_ = scratch_.path() + "/tierkvd.sock";
  std::string store_;
  std::unique_ptr<ipc::Server> server_;
};

TEST_F(ListenerStallTest, PeersThatNeverReadStallNoOne) {
  ipc::ServerOptions options;
  options.pending_timeout = std::chrono::minutes(1);  // Only the bound.
  StartServer(options);
  // Each peer asks for 2 MiB of stats replies and reads none: more than its
  // socket holds and than tierkvd queues for it.
  const std::vector<std::byte> ask = ipc::Encode(ipc::StatsRequest{});
  const size_t reply = ipc::Encode(ipc::StatsReply{server_->stats()}).size();
  std::vector<std::byte> flood;
  for (size_t i = 0; i <= (size_t{2} << 20) / reply; ++i) {
    flood.insert(flood.end(), ask.begin(), ask.end());
  }
  constexpr size_t kPeers = 25;
  std::vector<UniqueFd> peers;
  std::vector<size_t> sent(kPeers, 0);
  auto send_more = [&](size_t i) {
    const ssize_t n = send(peers[i].get(), flood.data() + sent[i],
                           flood.size() - sent[i], MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) sent[i] += static_cast<size_t>(n);
    if (n < 0 && errno != EAGAIN) sent[i] = flood.size();  // Disconnected.
  };
  for (size_t i = 0; i < kPeers; ++i) {
    peers.push_back(ConnectTo(socket_, /*nonblocking=*/true));
    ASSERT_TRUE(peers.back().valid());
    const int least = 1;  // The kernel rounds it up to its minimum.
    setsockopt(peers.back().get(), SOL_SOCKET, SO_RCVBUF, &least,
               sizeof(least));
    send_more(i);  // tierkvd has all the work it can take from here on.
  }
  // The rest of the requests as each socket takes them.
  std::jthread flooder([&](std::stop_token stop) {
    const auto give_up = Clock::now() + seconds(20);
    while (!stop.stop_requested() && Clock::now() < give_up) {
      std::vector<pollfd> waiting;
      for (size_t i = 0; i < kPeers; ++i) {
        if (sent[i] < flood.size()) send_more(i);
        if (sent[i] < flood.size())
          waiting.push_back({peers[i].get(), POLLOUT, 0});
      }
      if (waiting.empty()) return;
      poll(waiting.data(), waiting.size(), 100);
    }
  });

  // Meanwhile a worker registers and tierkv-admin asks for the stats.
  // (Deadlines past the bounds below, so that the bounds decide.)
  const auto start = Clock::now();
  auto worker = Open(seconds(10));
  const int64_t register_ms = MsSince(start);
  ASSERT_THAT(worker, IsOk()) << worker.status().ToString();
  const auto asked = Clock::now();
  StatusOr<ipc::Message> stats =
      ipc::SocketCall(socket_, ipc::StatsRequest{}, seconds(10));
  const int64_t stats_ms = MsSince(asked);
  ASSERT_THAT(stats, IsOk()) << stats.status().ToString();
  EXPECT_TRUE(std::holds_alternative<ipc::StatsReply>(*stats));
  // Served within a round or two of the listener's (a second per peer,
  // when it waited on each; bounds wide enough for a loaded machine).
  EXPECT_LT(register_ms, 5000);
  EXPECT_LT(stats_ms, 5000);
  EXPECT_THAT(server_->CheckProgress(seconds(2)), IsOk());

  // Past the bound on unread replies, every one of them is disconnected.
  EXPECT_EQ(WaitHungUp(peers, kPeers, seconds(10)), kPeers);
  flooder.join();  // Done: every peer is disconnected.
  EXPECT_THAT(server_->CheckProgress(seconds(2)), IsOk());
  StatusOr<CoordinatorStats> after = (*worker)->Stats();
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(after->workers.size(), 1u);
}

TEST_F(ListenerStallTest, ConnectionsPastTheCapCloseTheLongestIdle) {
  ipc::ServerOptions options;
  options.max_pending_connections = 8;
  options.pending_timeout = std::chrono::minutes(1);  // Only the cap.
  StartServer(options);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 20; ++i) {
    idle.push_back(ConnectTo(socket_));
    ASSERT_TRUE(idle.back().valid());
  }
  // The 12 oldest made room for the 8 newest.
  EXPECT_EQ(WaitHungUp(idle, 12, seconds(5)), 12u);
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_EQ(HungUp(idle[i].get()), i < 12) << i;
  }
  // A worker still registers (the oldest idle one makes room), and
  // tierkv-admin's call is answered.
  auto worker = Open(seconds(2));
  ASSERT_THAT(worker, IsOk()) << worker.status().ToString();
  StatusOr<ipc::Message> stats =
      ipc::SocketCall(socket_, ipc::StatsRequest{}, seconds(2));
  ASSERT_THAT(stats, IsOk()) << stats.status().ToString();
  EXPECT_EQ(WaitHungUp(idle, 13, seconds(5)), 13u);
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_EQ(HungUp(idle[i].get()), i < 13) << i;
  }
  EXPECT_EQ(server_->stats().workers.size(), 1u);
}

TEST_F(ListenerStallTest, IdleConnectionsTimeOutRegisteredWorkersDoNot) {
  ipc::ServerOptions options;
  // Long enough that the asking peer's gaps never reach it under load.
  options.pending_timeout = milliseconds(2000);
  StartServer(options);
  auto worker = Open(seconds(2));
  ASSERT_THAT(worker, IsOk()) << worker.status().ToString();
  const auto opened = Clock::now();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 10; ++i) {
    idle.push_back(ConnectTo(socket_));
    ASSERT_TRUE(idle.back().valid());
  }
  // A peer whose requests are answered (every 50 ms) stays open.
  UniqueFd asking = ConnectTo(socket_);
  const std::vector<std::byte> ask = ipc::Encode(ipc::StatsRequest{});
  size_t hung = 0;
  while (hung < idle.size() && MsSince(opened) < 20000) {
    ASSERT_EQ(send(asking.get(), ask.data(), ask.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(ask.size()));
    StatusOr<ipc::Message> reply = ReadReply(asking.get(), seconds(2));
    ASSERT_THAT(reply, IsOk()) << "after " << MsSince(opened) << " ms";
    hung = WaitHungUp(idle, idle.size(), milliseconds(50));
  }
  EXPECT_EQ(hung, idle.size());
  EXPECT_GE(MsSince(opened), 1990);  // Not before their deadline.
  EXPECT_FALSE(HungUp(asking.get()));
  // The worker, idle on its socket all along, is still attached.
  StatusOr<CoordinatorStats> stats = (*worker)->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->workers.size(), 1u);
}

TEST_F(ListenerStallTest, FullListenQueueIsADeadlineNotAHang) {
  // A "tierkvd" that listens with a backlog of 0 and never accepts.
  const std::string path = scratch_.path() + "/full.sock";
  UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ASSERT_EQ(
      bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
      0);
  ASSERT_EQ(listen(listener.get(), 0), 0);
  std::vector<UniqueFd> queued;
  for (UniqueFd fd = ConnectTo(path, true); fd.valid() && queued.size() < 16;
       fd = ConnectTo(path, true)) {
    queued.push_back(std::move(fd));
  }
  ASSERT_LT(queued.size(), 16u) << "the listen queue never filled";

  auto start = Clock::now();
  auto client = Open(milliseconds(300), path);
  int64_t took = MsSince(start);
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded)
      << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("listen queue is full"));
  EXPECT_LT(took, 2000);
  start = Clock::now();
  StatusOr<ipc::Message> stats =
      ipc::SocketCall(path, ipc::StatsRequest{}, milliseconds(300));
  took = MsSince(start);
  EXPECT_EQ(stats.status().code(), StatusCode::kDeadlineExceeded)
      << stats.status().ToString();
  EXPECT_LT(took, 2000);

  // With room in the queue, a connection nobody answers: a deadline too.
  queued.clear();
  UniqueFd taken(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  start = Clock::now();
  client = Open(milliseconds(300), path);
  took = MsSince(start);
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded)
      << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("did not answer"));
  EXPECT_LT(took, 2000);
}

// tierkvd as a child process, whose descriptor limit the test lowers.
class ListenerStallDaemonTest : public TierkvdFixture {};

TEST_F(ListenerStallDaemonTest, OutOfDescriptorsPausesAcceptingNoSpinning) {
  StartDaemon();
  const pid_t pid = daemon_->pid();
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  // Eight to spare, then none: a worker's registration takes six (its
  // socket, channel, readiness eventfd and the three copies passed).
  limit.rlim_cur = OpenFds(pid) + 8;
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &limit, nullptr), 0)
      << std::strerror(errno);
  std::vector<UniqueFd> peers;
  for (int i = 0; i < 16; ++i) {
    peers.push_back(ConnectTo(socket_));
    ASSERT_TRUE(peers.back().valid());
  }
  ASSERT_TRUE(daemon_->WaitForOutput("accept: Too many open files"))
      << daemon_->output();
  // A worker meanwhile waits in the listen queue until its deadline; the
  // listener, out of descriptors all the while, does not spin.
  const int64_t cpu_before = CpuMs(pid);
  const auto start = Clock::now();
  ClientOptions options;
  options.socket_path = socket_;
  options.layout = TestLayout();
  options.num_device_blocks = 16;
  options.call_timeout = milliseconds(500);
  auto late = Client::Open(options);
  const int64_t window_ms = MsSince(start);
  const int64_t cpu_ms = CpuMs(pid) - cpu_before;
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded)
      << late.status().ToString();
  EXPECT_LT(cpu_ms * 5, window_ms)
      << cpu_ms << " ms of CPU in " << window_ms << " ms";
  // Once connections close it accepts again, and a worker attaches.
  peers.clear();
  ASSERT_TRUE(daemon_->WaitForOutput("accepting connections again"))
      << daemon_->output();
  std::unique_ptr<Client> worker = Attach("after");
  ASSERT_NE(worker, nullptr) << daemon_->output();
  EXPECT_EQ(worker->Stats().value().workers.size(), 1u);
}

TEST_F(ListenerStallDaemonTest, AFailingPollPausesTheListenerNotEndsIt) {
  StartDaemon();
  const pid_t pid = daemon_->pid();
  std::unique_ptr<Client> first = Attach("first");
  std::unique_ptr<Client> second = Attach("second");
  ASSERT_NE(second, nullptr);
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  const rlimit before = limit;
  // Fewer descriptors than the listener watches (its wake pipe, the
  // socket and two workers'): poll fails with EINVAL.
  limit.rlim_cur = 3;
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &limit, nullptr), 0)
      << std::strerror(errno);
  ASSERT_TRUE(daemon_->WaitForOutput("Invalid argument")) << daemon_->output();
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &before, nullptr), 0);
  ASSERT_TRUE(daemon_->WaitForOutput("poll works again")) << daemon_->output();
  // The workers stayed, and the listener accepts and registers a third.
  std::unique_ptr<Client> third = Attach("third");
  ASSERT_NE(third, nullptr) << daemon_->output();
  StatusOr<CoordinatorStats> stats = first->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->workers.size(), 3u);
}

TEST(OutputQueueTest, PassesDescriptorsWithTheFirstByte) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd sender(pair[0]), receiver(pair[1]);
  ASSERT_EQ(fcntl(sender.get(), F_SETFL, O_NONBLOCK), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
  UniqueFd read_end(pipe_fds[0]);
  // More bytes than the socket holds: written over several flushes.
  std::vector<std::byte> bytes(4 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7);
  ipc::Outgoing out{.bytes = bytes, .fds = {}};
  out.fds.emplace_back(pipe_fds[1]);
  ipc::OutputQueue queue;
  ASSERT_THAT(queue.Push(std::move(out)), IsOk());
  ASSERT_THAT(queue.Push({.bytes = {std::byte{42}}, .fds = {}}), IsOk());
  EXPECT_EQ(queue.bytes(), bytes.size() + 1);

  std::vector<std::byte> got;
  std::vector<int> passed;
  std::vector<std::byte> buf(64 << 10);
  while (got.size() < bytes.size() + 1) {
    ASSERT_THAT(queue.Flush(sender.get()), IsOk());
    iovec iov{.iov_base = buf.data(), .iov_len = buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(receiver.get(), &msg, MSG_CMSG_CLOEXEC);
    ASSERT_GT(n, 0) << std::strerror(errno);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      ASSERT_EQ(c->cmsg_type, SCM_RIGHTS);
      ASSERT_EQ(got.size(), 0u) << "descriptors after the first byte";
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        passed.push_back(fd);
      }
    }
    got.insert(got.end(), buf.begin(), buf.begin() + n);
  }
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.bytes(), 0u);
  ASSERT_EQ(got.size(), bytes.size() + 1);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), got.begin()));
  EXPECT_EQ(got.back(), std::byte{42});
  // The one passed is the pipe's write end ...
  ASSERT_EQ(passed.size(), 1u);
  UniqueFd write_end(passed[0]);
  ASSERT_EQ(write(write_end.get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');
  // ... and the queue closed its own copy: with the received one closed,
  // the pipe has no writer left.
  write_end.reset();
  EXPECT_EQ(read(read_end.get(), &c, 1), 0);
}

TEST(OutputQueueTest, RefusesWhatItCannotSendAndReportsAGonePeer) {
  ipc::OutputQueue queue;
  EXPECT_EQ(queue.Push({}).code(), StatusCode::kInvalidArgument);
  ipc::Outgoing crowded{.bytes = {std::byte{1}}, .fds = {}};
  crowded.fds.resize(ipc::kMaxPassedFds + 1);
  EXPECT_EQ(queue.Push(std::move(crowded)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(queue.empty());

  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd sender(pair[0]);
  close(pair[1]);
  ASSERT_THAT(queue.Push({.bytes = {std::byte{1}}, .fds = {}}), IsOk());
  EXPECT_EQ(queue.Flush(sender.get()).code(), StatusCode::kUnavailable);
}

// A call whose reply could not fit the worker's control channel is refused
// before it changes anything: a reply that does not fit could never tell
// the worker of the events the call made, whose slots would stay pinned.
// The same blocks store in calls whose replies fit.
TEST(ReplyRoomTest, ACallWhoseReplyCannotFitIsRefusedAndLeavesNothing) {
  const TempDir dir{"reply_room_test"};
  const std::string store = "rr" + std::to_string(getpid());
  const KvLayout layout{.num_layers = 1,
                        .num_kv_heads = 1,
                        .head_dim = 8,
                        .block_size = 1,
                        .dtype = DType::kF32};
  ipc::ServerOptions options;
  options.store = store;
  options.socket_path = dir.path() + "/tierkvd.sock";
  options.layout = layout;
  options.host_capacity_bytes = 4096 * layout.BlockBytes();
  options.channel_bytes = 16384;  // Replies of about 1,000 blocks.
  auto server = ipc::Server::Start(options);
  ASSERT_THAT(server, IsOk());
  ClientOptions client_options;
  client_options.socket_path = options.socket_path;
  client_options.layout = layout;
  client_options.num_device_blocks = 4096;
  client_options.copies = CopyMode::kCaller;
  client_options.name = "worker";
  auto client = Client::Open(client_options);
  ASSERT_THAT(client, IsOk());
  Client& c = **client;

  // 2,500 blocks: a store event of 20 KB, past the channel.
  std::vector<TokenId> tokens(2500);
  std::iota(tokens.begin(), tokens.end(), 1);
  std::vector<BlockId> device(tokens.size());
  std::iota(device.begin(), device.end(), 1);
  ASSERT_THAT(c.Lookup(1, tokens, 0), IsOk());
  const StatusOr<AllocateResult> allocated = c.Allocate(1, device, 0);
  const Status committed =
      allocated.ok() ? c.Commit(1, 2500, device).status() : allocated.status();
  EXPECT_THAT(committed, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(committed.message(), HasSubstr("control channel"));
  ASSERT_THAT(c.Finish(1), IsOk());
  CoordinatorStats s = c.Stats().value();
  EXPECT_EQ(s.host.pinned_slots, 0);
  EXPECT_EQ(s.host.events_in_flight, 0u);
  EXPECT_THAT(allocated, StatusIs(StatusCode::kResourceExhausted));

  // In five requests of 500 blocks, each reply fits.
  for (RequestId r = 2; r <= 6; ++r) {
    const size_t from = static_cast<size_t>(r - 2) * 500;
    const std::span<const TokenId> part(tokens.data() + from, 500);
    const std::span<const BlockId> blocks(device.data() + from, 500);
    ASSERT_THAT(c.Lookup(r, part, 0), IsOk());
    ASSERT_THAT(c.Allocate(r, blocks, 0), IsOk());
    const CommitResult commit = c.Commit(r, 500, blocks).value();
    ASSERT_EQ(commit.stores.size(), 1u);
    EXPECT_EQ(commit.stores[0].host_blocks.size(), 500u);
    std::vector<FinishedTransfer> done = {{.event = commit.stores[0],
                                           .status = Status::Ok(),
                                           .session = c.session()}};
    ASSERT_THAT(c.Complete(done), IsOk());
    ASSERT_THAT(c.Finish(r), IsOk());
  }
  s = c.Stats().value();
  EXPECT_EQ(s.host.pinned_slots, 0);
  EXPECT_EQ(s.host.cached_slots, 2500);
  client->reset();
  server->reset();
  RemoveStoreSegments(store);
}

}  // namespace
}  // namespace tierkv
