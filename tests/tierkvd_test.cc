// tierkvd as a real process, with real worker processes attached over its
// socket and shared memory: seed 004's flow, cross-process reuse, a worker
// killed mid-transfer, malformed messages, permissions, a second daemon on
// the same store, a stale segment, and tierkv-admin (stats, metrics, the
// events in flight, evict and clear). With a disk tier: a working set ten times
// the host, spilling and promotion under two busy workers, and tierkvd
// SIGKILLed mid-spill and restarted. A worker of another model is refused
// (a disk tier of another model: tierkvd_disk_test.cc).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "ipc/channel.h"
#include "ipc/protocol.h"
#include "tests/block_pattern.h"
#include "tests/child_process.h"
#include "tests/fill_worker.h"
#include "tests/scratch.h"
#include "tests/seed004_scenario.h"
#include "tests/sequential_tokens.h"
#include "tests/status_matchers.h"
#include "tests/test_layout.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/client.h"
#include "tierkv/version.h"
#include "tiers/shm_segment.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Clock = std::chrono::steady_clock;

class TierkvdTest : public TierkvdFixture {
 protected:
  // The labels every metric of this store (of the unnamed model) carries.
  std::string Base() const { return "store=\"" + store_ + "\",model=\"\""; }
};

TEST_F(TierkvdTest, Seed004FlowThroughTheDaemon) {
  // 50 host slots including the null one, as in the seed.
  StartDaemon(std::to_string(50 * TestLayout().BlockBytes()));
  Seed004Engine w1 = Seed004Engine::Open(socket_, "engine-1");
  Seed004Engine w2 = Seed004Engine::Open(socket_, "engine-2");
  ASSERT_NE(w1.client, nullptr);
  ASSERT_NE(w2.client, nullptr);
  EXPECT_NE(w1.client->worker_id(), w2.client->worker_id());
  RunSeed004(w1, w2);
}

TEST_F(TierkvdTest, WorkerLoadsWhatAnotherWorkerStored) {
  StartDaemon();
  auto a = Worker("store", 7, 8);
  ASSERT_EQ(a->Wait(), 0) << a->output();
  const std::string out_a = a->output();
  const size_t pos = out_a.find("checksum ");
  ASSERT_NE(pos, std::string::npos) << out_a;
  const std::string sum = out_a.substr(pos + 9, 16);

  auto b = Worker("load", 7, 8);
  ASSERT_EQ(b->Wait(), 0) << b->output();
  EXPECT_THAT(b->output(), HasSubstr("hit 128 checksum " + sum));
  // Another prompt is a miss.
  auto c = Worker("load", 8, 8);
  ASSERT_EQ(c->Wait(), 0) << c->output();
  EXPECT_THAT(c->output(), HasSubstr("hit 0 "));
}

// A scheduler step's lookups in one round trip: each is looked up as
// Lookup would, a bad one fails alone, and a batch larger than the control
// channel goes in as many round trips as it needs.
TEST_F(TierkvdTest, LookupBatchIsOneRoundTripPerChannelFull) {
  StartDaemon();
  auto fill = ManyWorker("fill", 1, 8);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::unique_ptr<Client> c = Attach("scheduler");
  ASSERT_NE(c, nullptr);
  // The filler gone from tierkvd's workers too: its exit is noticed when
  // tierkvd sees its socket close.
  SettledStats(*c);

  std::vector<std::vector<TokenId>> tokens;
  for (int32_t r = 0; r < 8; ++r) {
    tokens.push_back(FillRequestTokens(1, r, 1));
    tokens.back().push_back(7);  // The stored block can hit.
  }
  tokens.push_back(FillRequestTokens(2, 0, 1));  // Never stored.
  std::vector<LookupQuery> queries;
  for (size_t i = 0; i < tokens.size(); ++i) {
    queries.push_back({.request = i + 1, .tokens = tokens[i]});
  }
  // Not a multiple of the block size: refused, alone.
  queries.push_back(
      {.request = 99, .tokens = tokens[0], .num_computed_tokens = 3});
  const uint64_t calls = c->call_counts().calls;
  auto results = c->LookupBatch(queries);
  ASSERT_THAT(results, IsOk());
  EXPECT_EQ(c->call_counts().calls - calls, 1u);
  ASSERT_EQ(results->size(), queries.size());
  for (int32_t r = 0; r < 8; ++r) {
    ASSERT_THAT((*results)[r], IsOk());
    EXPECT_EQ((*results)[r]->hit_tokens, 16) << "request " << r;
  }
  ASSERT_THAT((*results)[8], IsOk());
  EXPECT_EQ((*results)[8]->hit_tokens, 0);
  EXPECT_EQ((*results)[9].status().code(), StatusCode::kInvalidArgument);
  // The hits are pinned for their requests, as Lookup's are.
  const CoordinatorStats stats = c->Stats().value();
  ASSERT_EQ(stats.workers.size(), 1u);
  EXPECT_EQ(stats.workers[0].requests, 9u);
  EXPECT_EQ(stats.workers[0].pinned_slots, 8);

  // 300 lookups of 1,024 tokens: 1.2 MB, over the 1 MiB channel.
  const std::vector<TokenId> long_prompt = SequentialTokens(5, 1024);
  std::vector<LookupQuery> many(300);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i] = {.request = 1000 + i, .tokens = long_prompt};
  }
  const uint64_t before = c->call_counts().calls;
  auto many_results = c->LookupBatch(many);
  ASSERT_THAT(many_results, IsOk());
  EXPECT_EQ(c->call_counts().calls - before, 2u);
  ASSERT_EQ(many_results->size(), many.size());
  for (const StatusOr<LookupResult>& r : *many_results) {
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->hit_tokens, 0);
  }
  EXPECT_EQ(c->Stats().value().workers[0].requests, 309u);
}

// A request asked again sends only the tokens after those that did not
// change (ClientCallCounts::lookup_tokens_sent) and finds what a lookup of
// all its tokens finds (a second client's); when tierkvd keeps other
// tokens for the request by then (a chunk lookup under its id), the client
// sends them all again in the same Lookup call.
TEST_F(TierkvdTest, LookupAskedAgainSendsOnlyWhatChanged) {
  StartDaemon();
  auto store = Worker("store", 7, 8);
  ASSERT_EQ(store->Wait(), 0) << store->output();
  std::unique_ptr<Client> c = Attach("scheduler");
  std::unique_ptr<Client> fresh = Attach("fresh");
  ASSERT_NE(c, nullptr);
  ASSERT_NE(fresh, nullptr);
  std::vector<TokenId> tokens = StorePrompt(7, 8);
  tokens.resize(100);  // The prompt arrives in parts.
  RequestId fresh_id = 100;
  // Looks `tokens` up as request 1 of `c`; expects `sent` tokens to go and
  // the hits a lookup of all of them by another client gets.
  auto lookup = [&](uint64_t sent, uint64_t calls) {
    const ClientCallCounts before = c->call_counts();
    StatusOr<LookupResult> got = c->Lookup(1, tokens);
    StatusOr<LookupResult> want = fresh->Lookup(fresh_id, tokens);
    ASSERT_THAT(got, IsOk());
    ASSERT_THAT(want, IsOk());
    ASSERT_THAT(fresh->Finish(fresh_id++), IsOk());  // Its pins go.
    EXPECT_EQ(got->hit_tokens, want->hit_tokens);
    EXPECT_EQ(c->call_counts().lookup_tokens_sent - before.lookup_tokens_sent,
              sent);
    EXPECT_EQ(c->call_counts().calls - before.calls, calls);
  };
  lookup(100, 1);  // First: all.
  lookup(0, 1);    // Unchanged: none.
  const std::vector<TokenId> prompt = StorePrompt(7, 8);
  tokens.assign(prompt.begin(), prompt.end());
  tokens.push_back(5);
  lookup(29, 1);  // Grown to 129: the 29 new ones.
  EXPECT_EQ(c->Lookup(1, tokens).value().hit_tokens, 128);
  tokens[40] = 999'999;  // Changed in block 2: from there on.
  lookup(89, 1);
  EXPECT_EQ(c->Lookup(1, tokens).value().hit_tokens, 32);
  tokens.resize(50);  // Cut: nothing new to send.
  lookup(0, 1);
  // tierkvd keeps a chunk's tokens for request 1 now: refused, sent again.
  ASSERT_THAT(fresh->LookupChunk(1, tokens), IsOk());  // Another worker's.
  ASSERT_THAT(c->LookupChunk(1, tokens), IsOk());
  tokens.assign(prompt.begin(), prompt.end());
  tokens.push_back(5);
  lookup(129, 1);  // The client knew: it forgot what it had sent.
  // tierkvd forgets request 1 behind the client's back (a chunk fetch
  // under its id, a miss, finishes it): the change alone is refused
  // (Aborted, nothing changed) and the same call sends every token.
  ASSERT_THAT(c->FetchChunk(1, StorePrompt(9, 1), std::chrono::milliseconds(0),
                            [](int32_t) -> StatusOr<std::vector<BlockId>> {
                              return Status::Internal("a miss allocates none");
                            }),
              IsOk());
  lookup(129, 2);
  lookup(0, 1);
  ASSERT_THAT(c->Finish(1), IsOk());
  lookup(129, 1);  // Finished: a new request.
}

// A router asks where a prompt is cached: through a worker's client (its
// own tenant) or tierkv-admin route over several tierkvd sockets, one of
// which answers nothing. The answer names the node with the longest
// prefix and the workers that can load it, and pins nothing.
TEST_F(TierkvdTest, RouteNamesTheNodeAndWorkersHoldingAPrefix) {
  StartDaemon();
  auto store = Worker("store", 7, 8);
  ASSERT_EQ(store->Wait(), 0) << store->output();
  std::unique_ptr<Client> c = Attach("router-side");
  ASSERT_NE(c, nullptr);
  // The storing worker gone from tierkvd's workers too: its exit is noticed
  // when tierkvd sees its socket close.
  SettledStats(*c);
  std::vector<TokenId> prompt = StorePrompt(7, 8);
  prompt.push_back(5);
  const RouteResult route = c->Route(prompt).value();
  EXPECT_EQ(route.prompt_tokens, 128);
  EXPECT_EQ(route.cached_tokens, 128);
  EXPECT_EQ(route.lower_tokens, 0);
  ASSERT_EQ(route.workers.size(), 1u);
  EXPECT_EQ(route.workers[0].name, "router-side");
  EXPECT_EQ(route.workers[0].pid, getpid());
  EXPECT_EQ(c->Stats().value().host.pinned_slots, 0);
  EXPECT_EQ(c->Route(StorePrompt(8, 8)).value().cached_tokens, 0);

  std::string tokens;
  for (TokenId t : prompt) tokens += std::to_string(t) + " ";
  const std::string missing = socket_ + ".none";
  auto json = Spawn({TIERKV_ADMIN_PATH, "route", "--json", "--node",
                     "b=" + missing, "--node", "a=" + socket_, tokens});
  ASSERT_EQ(json->Wait(), 0) << json->output();
  EXPECT_THAT(json->output(),
              HasSubstr("\"node\":\"a\",\"socket\":\"" + socket_ +
                        "\",\"prompt_tokens\":128,\"cached_tokens\":128,"
                        "\"host_tokens\":128,\"lower_tokens\":0,"
                        "\"workers\":[{\"id\":"));
  EXPECT_THAT(json->output(), HasSubstr("\"name\":\"router-side\""));
  EXPECT_THAT(json->output(), HasSubstr("{\"node\":\"b\",\"socket\":\"" +
                                        missing + "\",\"error\":"));
  EXPECT_THAT(json->output(), HasSubstr("\"best\":\"a\"}"));
  auto table = Spawn({TIERKV_ADMIN_PATH, "route", "--socket", socket_, tokens});
  ASSERT_EQ(table->Wait(), 0) << table->output();
  EXPECT_THAT(table->output(),
              HasSubstr("longest cached prefix: local (128 tokens)"));
  EXPECT_THAT(table->output(), HasSubstr("router-side (pid"));
  // Another tenant's keys differ: cached nowhere for it.
  auto other = Spawn({TIERKV_ADMIN_PATH, "route", "--tenant", "t2", "--socket",
                      socket_, tokens});
  ASSERT_EQ(other->Wait(), 0) << other->output();
  EXPECT_THAT(other->output(), HasSubstr("cached nowhere"));
  EXPECT_THAT(other->output(), HasSubstr("none attached"));
  // No node answers: exit status 3, as for any command without a tierkvd.
  auto none =
      Spawn({TIERKV_ADMIN_PATH, "route", "--node", "b=" + missing, tokens});
  EXPECT_EQ(none->Wait(), 3) << none->output();
  auto bad = Spawn({TIERKV_ADMIN_PATH, "route", "--node", "nosocket", tokens});
  EXPECT_EQ(bad->Wait(), 2) << bad->output();
  EXPECT_THAT(bad->output(), HasSubstr("expected NAME=SOCKET"));
  EXPECT_EQ(c->Stats().value().host.pinned_slots, 0);
}

TEST_F(TierkvdTest, KilledWorkersPinsAreReleasedWithinOneSecond) {
  StartDaemon();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const HostTierStats before = observer->Stats().value().host;

  auto w = Worker("hang-store", 9, 8);
  ASSERT_TRUE(w->WaitForOutput("READY")) << w->output();
  HostTierStats during = observer->Stats().value().host;
  EXPECT_EQ(during.pinned_slots, before.pinned_slots + 8);
  EXPECT_EQ(during.events_in_flight, 1u);

  w->Signal(SIGKILL);
  const auto killed = Clock::now();
  w->Wait();
  HostTierStats after;
  do {  // Poll the observable state.
    after = observer->Stats().value().host;
  } while (after.pinned_slots != before.pinned_slots &&
           Clock::now() - killed < std::chrono::seconds(20));
  // Within a second on an idle machine (tierkvd sees the socket close at
  // once); five allow for the suite running ten times over on two cores.
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(5));
  EXPECT_EQ(after.pinned_slots, before.pinned_slots);
  EXPECT_EQ(after.free_slots, before.free_slots);
  EXPECT_EQ(after.events_in_flight, 0u);
  EXPECT_EQ(observer->Stats().value().workers.size(), 1u);
  // The slots it was writing never became visible.
  auto reader = Worker("load", 9, 8);
  ASSERT_EQ(reader->Wait(), 0) << reader->output();
  EXPECT_THAT(reader->output(), HasSubstr("hit 0 "));
}

TEST_F(TierkvdTest, MalformedMessagesGetErrorsAndOthersAreServed) {
  StartDaemon();
  std::unique_ptr<Client> good = Attach("good");
  std::unique_ptr<RawWorker> bad = RawAttach("bad");
  ASSERT_NE(good, nullptr);
  ASSERT_NE(bad, nullptr);
  // The bad worker's own channel, written by hand.
  auto channel = ipc::ControlChannel::Open(bad->channel.release());
  ASSERT_THAT(channel, IsOk());
  auto alive = [] { return true; };
  auto call = [&](std::vector<std::byte> frame) {
    std::vector<std::byte> response;
    EXPECT_THAT(channel->Call(frame, &response, alive), IsOk());
    auto reply = ipc::Decode(response);
    EXPECT_THAT(reply, IsOk());
    return reply.ok() ? ipc::StatusOf(*reply) : reply.status();
  };
  std::vector<TokenId> tokens = SequentialTokens(1, 40);
  std::vector<std::byte> lookup = ipc::Encode(ipc::LookupRequest{
      .request = 1, .num_computed_tokens = 0, .tokens = tokens, .extras = {}});
  // Truncated.
  std::vector<std::byte> cut(lookup.begin(), lookup.end() - 5);
  EXPECT_EQ(call(cut).code(), StatusCode::kInvalidArgument);
  // Wrong protocol version.
  std::vector<std::byte> old = lookup;
  old[4] = static_cast<std::byte>(ipc::kProtocolVersion + 1);
  EXPECT_EQ(call(old).code(), StatusCode::kFailedPrecondition);
  // Garbage.
  EXPECT_EQ(call(std::vector<std::byte>(64, std::byte{0x5A})).code(),
            StatusCode::kInvalidArgument);
  // Garbage in a loop is refused each time but logged at most once a
  // second, with how many were left out.
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(call(std::vector<std::byte>(64, std::byte{0x5A})).code(),
              StatusCode::kInvalidArgument);
  }
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::steady_clock::now() - begin)
                           .count();
  std::unique_ptr<Client> marker = Attach("marker");  // Logged after them.
  ASSERT_NE(marker, nullptr);
  ASSERT_TRUE(daemon_->WaitForOutput("'marker'")) << daemon_->output();
  const std::string log = daemon_->output();
  const std::string line = "worker " + std::to_string(bad->id) + ": ";
  size_t lines = 0;
  for (size_t at = log.find(line); at != std::string::npos;
       at = log.find(line, at + 1)) {
    ++lines;
  }
  EXPECT_LE(lines, 4u + static_cast<size_t>(seconds)) << log;
  const WorkerId marker_id = marker->worker_id();
  marker.reset();
  ASSERT_TRUE(
      daemon_->WaitForOutput("worker " + std::to_string(marker_id) + " (pid"))
      << daemon_->output();
  // Out-of-range device block ids.
  EXPECT_EQ(call(lookup).code(), StatusCode::kOk);
  EXPECT_EQ(
      call(ipc::Encode(ipc::AllocateRequest{.request = 1,
                                            .num_external_tokens = 0,
                                            .device_blocks = {1, 2, 1000000}}))
          .code(),
      StatusCode::kOutOfRange);
  // Another worker's event id: the good worker has a store in flight.
  ASSERT_THAT(good->Lookup(5, tokens), IsOk());
  ASSERT_THAT(good->Allocate(5, {{1, 2, 3}}, 0), IsOk());
  CommitResult commit = good->Commit(5, 40, {{1, 2, 3}}).value();
  ASSERT_EQ(commit.stores.size(), 1u);
  EXPECT_EQ(
      call(ipc::Encode(ipc::CompleteRequest{{{commit.stores[0].ref, true}}}))
          .code(),
      StatusCode::kNotFound);
  // A reply type sent as a request.
  EXPECT_EQ(call(ipc::Encode(ipc::OkReply{})).code(),
            StatusCode::kInvalidArgument);

  // The good worker is served throughout, and the daemon still runs.
  std::vector<FinishedTransfer> done;
  while (done.empty()) done = good->WaitEvents(std::chrono::seconds(10));
  ASSERT_THAT(good->Complete(done), IsOk());
  tokens.push_back(3);
  EXPECT_EQ(good->Lookup(6, tokens).value().hit_tokens, 32);
  EXPECT_EQ(good->Stats().value().workers.size(), 2u);
}

TEST_F(TierkvdTest, HostileChannelHeaderCannotHurtTheDaemon) {
  StartDaemon();
  std::unique_ptr<Client> good = Attach("good");
  std::unique_ptr<RawWorker> bad = RawAttach("bad");
  ASSERT_NE(good, nullptr);
  ASSERT_NE(bad, nullptr);
  auto raw = ShmSegment::MapSealed(bad->channel.release(), /*writable=*/true);
  ASSERT_THAT(raw, IsOk());
  // The channel header as ipc/channel.cc lays it out: capacity at byte 12,
  // request_seq and request_len at 64 and 68, response_seq at 128.
  auto word = [&](size_t offset) {
    return reinterpret_cast<uint32_t*>(raw->data() + offset);
  };
  *word(12) = 0xFFFFFFFFu;  // A capacity far past the mapping.
  *word(68) = 0xF0000000u;  // A request longer than the channel.
  const uint32_t seen = __atomic_load_n(word(128), __ATOMIC_ACQUIRE);
  __atomic_fetch_add(word(64), 1, __ATOMIC_SEQ_CST);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (__atomic_load_n(word(128), __ATOMIC_ACQUIRE) == seen &&
         Clock::now() < deadline) {
    std::this_thread::yield();  // Waiting on the daemon's reply itself.
  }
  ASSERT_NE(__atomic_load_n(word(128), __ATOMIC_ACQUIRE), seen)
      << daemon_->output();
  // The daemon answered (an error), is alive, and serves everyone.
  EXPECT_EQ(good->Lookup(1, SequentialTokens(1, 40)).status().code(),
            StatusCode::kOk);
  EXPECT_EQ(good->Stats().value().workers.size(), 2u);
}

// The readiness descriptor a worker gets is a pipe's read end: it cannot
// write it, and nothing it does to it (blocking mode included) reaches the
// write end tierkvd signals on with its store's mutex held.
TEST_F(TierkvdTest, ReadinessDescriptorIsAReadEndOnly) {
  StartDaemon();
  auto raw = RawAttach();
  ASSERT_NE(raw, nullptr);
  struct stat st {};
  ASSERT_EQ(fstat(raw->ready.get(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  const char byte = 1;
  EXPECT_EQ(write(raw->ready.get(), &byte, 1), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(TierkvdTest, SocketIsOwnerOnlyAndSegmentsHaveNoNames) {
  StartDaemon();
  std::unique_ptr<Client> c = Attach();
  ASSERT_NE(c, nullptr);
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // The host tier and the channels are sealed memfds: the stats page is
  // all tierkvd names in /dev/shm, and it is read-only.
  EXPECT_THAT(ShmNames(), ElementsAre("tierkv." + store_ + ".stats"));
  ASSERT_EQ(stat(("/dev/shm/tierkv." + store_ + ".stats").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);
}

// The KV event sockets are opened once the store is this tierkvd's: a
// second tierkvd refused for the store leaves the live one's ipc:// path
// (which ZeroMQ would unlink and bind again) where it is.
TEST_F(TierkvdTest, ARefusedDaemonLeavesTheLiveOnesEventSocket) {
  const std::string events = dir_ + "/kv-events";
  StartDaemon("1M", {"--kv-events-endpoint", "ipc://" + events});
  ASSERT_TRUE(daemon_->WaitForOutput("kv events: publishing on"));
  struct stat before {};
  ASSERT_EQ(stat(events.c_str(), &before), 0);
  std::vector<std::string> args = DaemonArgs("1M");
  args.insert(args.end(), {"--kv-events-endpoint", "ipc://" + events});
  auto second = Spawn(args);
  EXPECT_EQ(second->Wait(), 3) << second->output();
  EXPECT_THAT(second->output(), Not(HasSubstr("kv events: publishing")));
  struct stat after {};
  ASSERT_EQ(stat(events.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
}

TEST_F(TierkvdTest, ALiveDaemonIsNeverClobberedAStaleOneIsReplaced) {
  StartDaemon();
  std::unique_ptr<Client> c = Attach();
  ASSERT_NE(c, nullptr);
  // A second daemon on the same store refuses to start.
  auto second = Spawn(DaemonArgs("1M"));
  EXPECT_EQ(second->Wait(), 3);  // The store is busy.
  EXPECT_THAT(second->output(), HasSubstr("served by a live tierkvd"));
  EXPECT_EQ(c->Lookup(1, SequentialTokens(1, 20)).status().code(),
            StatusCode::kOk);

  // Nor does one on the same store behind another socket.
  std::vector<std::string> other_socket = DaemonArgs("1M");
  other_socket[4] = dir_ + "/other.sock";
  auto third = Spawn(other_socket);
  EXPECT_EQ(third->Wait(), 3);
  EXPECT_THAT(third->output(), HasSubstr("served by a live tierkvd"));

  // Killed, the daemon leaves its socket behind ...
  daemon_->Signal(SIGKILL);
  daemon_->Wait();
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  // ... the worker notices ...
  EXPECT_EQ(c->Lookup(2, SequentialTokens(1, 20)).status().code(),
            StatusCode::kUnavailable);
  // ... and a new daemon replaces them.
  StartDaemon();
  std::unique_ptr<Client> fresh = Attach();
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->Stats().value().host.cached_slots, 0);
}

TEST_F(TierkvdTest, AnotherLayoutIsRefusedWithBothNamed) {
  StartDaemon();
  ClientOptions options;
  options.socket_path = socket_;
  options.layout = TestLayout();
  options.layout.num_kv_heads = 8;
  options.num_device_blocks = 4;
  auto client = Client::Open(options);
  ASSERT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(), HasSubstr("kv_heads=2"));
  EXPECT_THAT(client.status().message(), HasSubstr("kv_heads=8"));
}

TEST_F(TierkvdTest, AnotherModelIsRefusedWithBothNamed) {
  StartDaemon("1M", {"--model", "org/model-a"});
  EXPECT_THAT(daemon_->output(), HasSubstr("model \"org/model-a\""));
  for (const std::string model : {"org/model-b", ""}) {
    ClientOptions options;
    options.socket_path = socket_;
    options.layout = TestLayout();
    options.model = model;
    options.num_device_blocks = 4;
    auto client = Client::Open(options);
    ASSERT_EQ(client.status().code(), StatusCode::kFailedPrecondition) << model;
    EXPECT_THAT(client.status().message(), HasSubstr("\"org/model-a\""));
    EXPECT_THAT(client.status().message(),
                HasSubstr(model.empty() ? "(unnamed)" : "\"org/model-b\""));
  }
  // The refused workers left nothing behind; one of the model attaches.
  std::unique_ptr<Client> a = Attach("engine-a", "org/model-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->Stats().value().model, "org/model-a");
  auto table = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  ASSERT_EQ(table->Wait(), 0) << table->output();
  EXPECT_THAT(table->output(), HasSubstr("model \"org/model-a\""));
  // The release tierkvd runs, in the table and as a metric.
  const std::string version(Version());
  EXPECT_THAT(table->output(), HasSubstr(", tierkvd " + version + "\n"));
  auto metrics = Spawn({TIERKV_ADMIN_PATH, "metrics", "--socket", socket_});
  ASSERT_EQ(metrics->Wait(), 0) << metrics->output();
  EXPECT_THAT(
      metrics->output(),
      HasSubstr("tierkv_build_info{store=\"" + store_ +
                "\",model=\"org/model-a\",version=\"" + version + "\"} 1\n"));
  auto printed = Spawn({TIERKVD_PATH, "--version"});
  EXPECT_EQ(printed->Wait(), 0);
  EXPECT_EQ(printed->output(), "tierkvd " + version + "\n");
}

TEST_F(TierkvdTest, NoDaemonIsAClearError) {
  ClientOptions options;
  options.socket_path = socket_;
  options.layout = TestLayout();
  options.num_device_blocks = 4;
  auto client = Client::Open(options);
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("is tierkvd running"));

  auto admin = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  EXPECT_EQ(admin->Wait(), 3);
  EXPECT_THAT(admin->output(), HasSubstr("is tierkvd running"));
}

TEST_F(TierkvdTest, AdminShowsTiersAndWorkers) {
  StartDaemon();
  std::unique_ptr<Client> c = Attach("engine-7");
  ASSERT_NE(c, nullptr);
  auto table = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  ASSERT_EQ(table->Wait(), 0) << table->output();
  EXPECT_THAT(table->output(), HasSubstr("host"));
  EXPECT_THAT(table->output(), HasSubstr("engine-7"));
  EXPECT_THAT(table->output(), HasSubstr("workers: 1"));
  auto json =
      Spawn({TIERKV_ADMIN_PATH, "stats", "--json", "--socket", socket_});
  ASSERT_EQ(json->Wait(), 0) << json->output();
  EXPECT_THAT(json->output(), HasSubstr("\"capacity_slots\":63"));
  EXPECT_THAT(json->output(), HasSubstr("\"name\":\"engine-7\""));
  auto workers = Spawn({TIERKV_ADMIN_PATH, "workers", "--socket", socket_});
  ASSERT_EQ(workers->Wait(), 0) << workers->output();
  EXPECT_THAT(workers->output(), HasSubstr("workers: 1"));
  EXPECT_THAT(workers->output(), HasSubstr("engine-7"));
  EXPECT_THAT(workers->output(), ::testing::Not(HasSubstr("capacity")));
  // watch redraws the table; --count bounds it.
  auto watch = Spawn({TIERKV_ADMIN_PATH, "watch", "--count", "3", "--interval",
                      "0.05", "--socket", socket_});
  ASSERT_EQ(watch->Wait(), 0) << watch->output();
  const std::string out = watch->output();
  size_t tables = 0;
  for (size_t at = out.find("hit rate"); at != std::string::npos;
       at = out.find("hit rate", at + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 3u) << out;
  // Each refresh after the first says how fast the counters grew.
  EXPECT_THAT(out, HasSubstr("per second: lookups "));
  // Without a disk tier there is no disk row.
  EXPECT_THAT(out, ::testing::Not(HasSubstr("disk ")));
  // An interval past a day, which the sleep could not count, is refused.
  for (const char* interval : {"1e300", "inf", "nan", "0.01"}) {
    auto bad = Spawn({TIERKV_ADMIN_PATH, "watch", "--count", "2", "--interval",
                      interval, "--socket", socket_});
    EXPECT_EQ(bad->Wait(), 2) << interval << ": " << bad->output();
    EXPECT_THAT(bad->output(), HasSubstr("--interval must be from 0.05"));
  }
}

TEST_F(TierkvdTest, AdminReadsTheStatsPageWithoutAskingTierkvd) {
  StartDaemon("1M", {"--stats-interval-ms", "20"});
  std::unique_ptr<Client> c = Attach("engine-7");
  ASSERT_NE(c, nullptr);
  auto admin = [&](const std::string& verb, const std::string& source) {
    return Spawn({TIERKV_ADMIN_PATH, verb, "--store", store_, "--socket",
                  socket_, "--source", source});
  };
  // The page shows the worker within a few snapshots of its attaching (the
  // first may not be published yet: exit 3).
  std::string out;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto page = admin("stats", "page");
    const int code = page->Wait();
    out = page->output();
    ASSERT_TRUE(code == 0 || code == 3) << out;
    if (code == 0 && out.find("engine-7") != std::string::npos) break;
    ASSERT_LT(Clock::now(), deadline) << out;
  }
  EXPECT_THAT(out, HasSubstr("workers: 1"));
  EXPECT_THAT(out, HasSubstr("engine-7"));
  EXPECT_THAT(out, ::testing::ContainsRegex("source: stats page, [0-9.]+ "
                                            "(us|ms|s) old\n"));
  auto socket = admin("stats", "socket");
  ASSERT_EQ(socket->Wait(), 0) << socket->output();
  EXPECT_THAT(socket->output(), HasSubstr("source: tierkvd's socket\n"));
  EXPECT_THAT(socket->output(), HasSubstr("engine-7"));
  // auto takes the page; metrics then say how old it is.
  auto metrics = admin("metrics", "auto");
  ASSERT_EQ(metrics->Wait(), 0) << metrics->output();
  EXPECT_THAT(metrics->output(), HasSubstr("tierkv_stats_age_seconds{"));
  EXPECT_THAT(metrics->output(),
              ::testing::ContainsRegex("tierkv_workers\\{[^}]*\\} 1\n"));
  // Without --store the page found is another store's (or none): the
  // socket answers.
  auto other = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  ASSERT_EQ(other->Wait(), 0) << other->output();
  EXPECT_THAT(other->output(), HasSubstr("source: tierkvd's socket\n"));

  // A stopped tierkvd answers nothing, yet its page still does. (A stop
  // that lands mid-snapshot leaves the page mid-update: stop it again once
  // a read shows the publisher finished that snapshot.)
  std::string frozen_out;
  int frozen_code = -1;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (frozen_code != 0 && Clock::now() < give_up) {
    daemon_->Signal(SIGSTOP);
    auto frozen = admin("workers", "page");
    frozen_code = frozen->Wait();
    frozen_out = frozen->output();
    daemon_->Signal(SIGCONT);
    while (frozen_code != 0 && admin("workers", "page")->Wait() != 0 &&
           Clock::now() < give_up) {
    }
  }
  EXPECT_EQ(frozen_code, 0) << frozen_out;
  EXPECT_THAT(frozen_out, HasSubstr("engine-7"));

  // A SIGKILLed tierkvd leaves its page behind, stale: page refuses it,
  // auto falls back to the socket, which says no tierkvd runs.
  c.reset();
  daemon_->Signal(SIGKILL);
  daemon_->Wait();
  daemon_.reset();
  ASSERT_TRUE(std::filesystem::exists("/dev/shm/tierkv." + store_ + ".stats"));
  auto stale = admin("stats", "page");
  EXPECT_EQ(stale->Wait(), 3);
  EXPECT_THAT(stale->output(), HasSubstr("is stale: tierkvd pid"));
  auto fallback = admin("stats", "auto");
  EXPECT_EQ(fallback->Wait(), 3);
  EXPECT_THAT(fallback->output(), HasSubstr("is tierkvd running"));
}

TEST_F(TierkvdTest, CleanStopRemovesTheStatsPage) {
  StartDaemon();
  const std::string page = "/dev/shm/tierkv." + store_ + ".stats";
  ASSERT_TRUE(std::filesystem::exists(page));
  struct stat st {};
  ASSERT_EQ(stat(page.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0400u);  // --mode 0600, read bits only.
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
  daemon_.reset();
  EXPECT_FALSE(std::filesystem::exists(page));
}

TEST_F(TierkvdTest, AdminListsEventsInFlightByAge) {
  StartDaemon();
  auto none = Spawn({TIERKV_ADMIN_PATH, "events", "--socket", socket_});
  ASSERT_EQ(none->Wait(), 0) << none->output();
  EXPECT_EQ(none->output(), "no events in flight\n");
  auto none_json =
      Spawn({TIERKV_ADMIN_PATH, "events", "--json", "--socket", socket_});
  ASSERT_EQ(none_json->Wait(), 0) << none_json->output();
  EXPECT_EQ(none_json->output(), "{\"in_flight\":0,\"events\":[]}\n");

  // A completed store shows in the latency histogram ...
  auto stored = Worker("store", 7, 2);
  ASSERT_EQ(stored->Wait(), 0) << stored->output();
  // ... and one that is never completed in the events.
  auto hung = Worker("hang-store", 9, 8);
  ASSERT_TRUE(hung->WaitForOutput("READY")) << hung->output();
  auto table = Spawn({TIERKV_ADMIN_PATH, "events", "--socket", socket_});
  ASSERT_EQ(table->Wait(), 0) << table->output();
  EXPECT_THAT(table->output(), HasSubstr("age  worker"));
  EXPECT_THAT(table->output(), ::testing::ContainsRegex(
                                   " (us|ms|s)  [0-9]+ +hang-store-9 +store +0 "
                                   "+1 +8  copying\n"));
  auto json =
      Spawn({TIERKV_ADMIN_PATH, "events", "--json", "--socket", socket_});
  ASSERT_EQ(json->Wait(), 0) << json->output();
  EXPECT_THAT(json->output(), HasSubstr("{\"in_flight\":1,\"events\":[{"));
  EXPECT_THAT(json->output(),
              HasSubstr("\"worker_name\":\"hang-store-9\",\"kind\":\"store\","
                        "\"id\":0,\"request\":1,\"blocks\":8,"
                        "\"state\":\"copying\"}"));
  auto metrics = Spawn({TIERKV_ADMIN_PATH, "metrics", "--socket", socket_});
  ASSERT_EQ(metrics->Wait(), 0) << metrics->output();
  EXPECT_THAT(metrics->output(),
              HasSubstr("# TYPE tierkv_event_seconds histogram\n"));
  EXPECT_THAT(metrics->output(), HasSubstr("tierkv_event_seconds_count{" +
                                           Base() + ",kind=\"store\"} 1\n"));
  EXPECT_THAT(metrics->output(),
              HasSubstr("tierkv_event_seconds_bucket{" + Base() +
                        ",kind=\"store\",le=\"+Inf\"} 1\n"));
  EXPECT_THAT(metrics->output(), HasSubstr("tierkv_event_seconds_count{" +
                                           Base() + ",kind=\"load\"} 0\n"));
  EXPECT_THAT(metrics->output(),
              HasSubstr("# TYPE tierkv_oldest_event_age_seconds gauge\n"));
  // Values print as the shortest text that reads back exactly, never as
  // 0.10000000000000001.
  EXPECT_THAT(metrics->output(), HasSubstr("le=\"0.1\""));
  EXPECT_THAT(metrics->output(),
              ::testing::Not(::testing::ContainsRegex("[0-9]\\.[0-9]{12,}")));
  auto stats = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  ASSERT_EQ(stats->Wait(), 0) << stats->output();
  EXPECT_THAT(stats->output(), HasSubstr("events in flight: 1, oldest "));

  // The worker's death takes its event with it.
  hung->Signal(SIGKILL);
  hung->Wait();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (observer->Stats().value().host.events_in_flight != 0 &&
         Clock::now() < deadline) {
    std::this_thread::yield();  // Polling the daemon's own state.
  }
  auto after = Spawn({TIERKV_ADMIN_PATH, "events", "--socket", socket_});
  ASSERT_EQ(after->Wait(), 0) << after->output();
  EXPECT_EQ(after->output(), "no events in flight\n");
}

// Blocks the store let go of by policy, each counted: host evictions of
// blocks not yet spilled, stores skipped for want of a slot, disk
// evictions, failed promotions.
uint64_t CountedLosses(const CoordinatorStats& s) {
  return s.host.evictions + s.host.store_skipped + s.host.promotion_failures +
         (s.disk.has_value() ? s.disk->evictions : 0);
}

TEST_F(TierkvdTest, DiskTierHoldsTenTimesTheHostBitExact) {
  StartDaemonWithDisk(16);
  auto fill = ManyWorker("fill", 1, 160);  // 160 one-block requests.
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  auto verify = ManyWorker("verify", 1, 160);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  const Tally t = ParseTally(verify->output());
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const CoordinatorStats s = observer->Stats().value();
  EXPECT_EQ(t.blocks, 160) << verify->output();
  EXPECT_EQ(t.wrong, 0);
  EXPECT_EQ(t.hit + t.missed, 160);
  EXPECT_LE(static_cast<uint64_t>(t.missed), CountedLosses(s));
  // All but what the host held came back through promotions.
  EXPECT_GE(static_cast<int64_t>(s.host.promotions),
            160 - 16 - static_cast<int64_t>(CountedLosses(s)));
  EXPECT_GT(s.host.spills, 0u);

  // tierkv-admin shows the disk tier.
  auto table = Spawn({TIERKV_ADMIN_PATH, "stats", "--socket", socket_});
  ASSERT_EQ(table->Wait(), 0) << table->output();
  EXPECT_THAT(table->output(), HasSubstr("disk"));
  EXPECT_THAT(table->output(), HasSubstr("spilled "));
  EXPECT_THAT(table->output(), HasSubstr("checksum failures 0"));
  auto json =
      Spawn({TIERKV_ADMIN_PATH, "stats", "--json", "--socket", socket_});
  ASSERT_EQ(json->Wait(), 0) << json->output();
  EXPECT_THAT(json->output(),
              HasSubstr("\"disk\":{\"capacity_bytes\":67108864"));
  // And the same numbers for Prometheus.
  auto metrics = Spawn({TIERKV_ADMIN_PATH, "metrics", "--socket", socket_});
  ASSERT_EQ(metrics->Wait(), 0) << metrics->output();
  EXPECT_THAT(metrics->output(),
              HasSubstr("# TYPE tierkv_moved_bytes_total counter"));
  EXPECT_THAT(metrics->output(),
              HasSubstr("tierkv_tier_capacity_bytes{" + Base() +
                        ",tier=\"disk\"} 67108864"));
  EXPECT_THAT(metrics->output(),
              HasSubstr("tierkv_host_disk_hit_blocks_total{" + Base() + "} " +
                        std::to_string(s.host.disk_hit_blocks) + "\n"));
  EXPECT_THAT(
      metrics->output(),
      HasSubstr("tierkv_moved_bytes_total{" + Base() +
                ",from=\"host\",to=\"disk\"} " +
                std::to_string(s.host.spills * s.host.slot_bytes) + "\n"));
}

TEST_F(TierkvdTest, AdminEvictAndClearDropStoredBlocks) {
  // In LRU order, without write-behind, whose copies pin blocks out of
  // it: the newest block must be on host and the oldest on disk only.
  StartDaemonWithDisk(
      16, {"--write-behind-spills", "0", "--eviction-policy", "lru"});
  auto fill = ManyWorker("fill", 1, 40);  // Past the host: some spill.
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  ASSERT_GT(SettledStats(*observer).disk->keys, 0u);

  // The newest block is on host, the oldest was spilled to disk.
  const std::string newest = FillKeyHex(1, 39), oldest = FillKeyHex(1, 0);
  const std::string unknown(32, '0');
  auto evict = Spawn({TIERKV_ADMIN_PATH, "evict", newest, oldest, unknown,
                      "--socket", socket_});
  ASSERT_EQ(evict->Wait(), 0) << evict->output();
  EXPECT_THAT(evict->output(), HasSubstr(newest + "  dropped from host"));
  EXPECT_THAT(evict->output(), HasSubstr(oldest + "  dropped from disk"));
  EXPECT_THAT(evict->output(), HasSubstr(unknown + "  not cached\n"));
  EXPECT_TRUE(daemon_->WaitForOutput("evict " + newest + ": dropped from"))
      << daemon_->output();
  auto bad_key =
      Spawn({TIERKV_ADMIN_PATH, "evict", "xyz", "--socket", socket_});
  EXPECT_EQ(bad_key->Wait(), 2);
  EXPECT_THAT(bad_key->output(), HasSubstr("block key 'xyz'"));

  auto clear =
      Spawn({TIERKV_ADMIN_PATH, "clear", "--tier", "all", "--socket", socket_});
  ASSERT_EQ(clear->Wait(), 0) << clear->output();
  // No worker holds a pin now.
  EXPECT_THAT(clear->output(),
              ::testing::ContainsRegex(
                  "host: dropped [1-9][0-9]* blocks, kept 0 pinned\n"));
  EXPECT_THAT(clear->output(),
              ::testing::ContainsRegex("disk: dropped [1-9][0-9]* blocks\n"));
  EXPECT_TRUE(daemon_->WaitForOutput("clear all: dropped"))
      << daemon_->output();
  const CoordinatorStats s = observer->Stats().value();
  EXPECT_EQ(s.host.cached_slots, 0);
  EXPECT_EQ(s.disk->keys, 0u);

  // Nothing of it is found again.
  auto verify = ManyWorker("verify", 1, 40);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  const Tally t = ParseTally(verify->output());
  EXPECT_EQ(t.blocks, 40) << verify->output();
  EXPECT_EQ(t.hit, 0);
  EXPECT_EQ(t.wrong, 0);
}

TEST_F(TierkvdTest, SpillAndPromotionUnderTwoBusyWorkers) {
  StartDaemonWithDisk(16);
  auto a = ManyWorker("churn", 11, 120);
  auto b = ManyWorker("churn", 12, 120);
  // No deadlock: both finish (ChildProcess output waits are bounded).
  ASSERT_TRUE(a->WaitForOutput("blocks ", std::chrono::seconds(120)))
      << a->output();
  ASSERT_TRUE(b->WaitForOutput("blocks ", std::chrono::seconds(120)))
      << b->output();
  ASSERT_EQ(a->Wait(), 0) << a->output();
  ASSERT_EQ(b->Wait(), 0) << b->output();
  const Tally ta = ParseTally(a->output());
  const Tally tb = ParseTally(b->output());
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  // Spills still running when the workers exit pin their slots.
  const CoordinatorStats s = SettledStats(*observer);
  EXPECT_EQ(ta.wrong, 0) << a->output();
  EXPECT_EQ(tb.wrong, 0) << b->output();
  EXPECT_EQ(ta.blocks + tb.blocks, 240);
  // Every block a worker stored reads back, or was let go and counted.
  EXPECT_LE(static_cast<uint64_t>(ta.missed + tb.missed), CountedLosses(s));
  EXPECT_GT(s.host.spills, 0u);
  EXPECT_GT(s.host.promotions, 0u);
  EXPECT_EQ(s.host.pinned_slots, 0);
  EXPECT_EQ(s.host.events_in_flight, 0u);
}

TEST_F(TierkvdTest, KilledMidSpillRestartsWithEverySpilledBlockIntact) {
  StartDaemonWithDisk(16);
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  auto fill = ManyWorker("fill", 21, 2000);
  // Wait until spilling is well under way, then kill tierkvd mid-stream.
  uint64_t spilled = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    StatusOr<CoordinatorStats> s = observer->Stats();
    ASSERT_THAT(s, IsOk());
    if (s->host.spills >= 200) {
      spilled = s->host.spills;  // Every one of these had completed.
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(spilled, 200u) << "spilling never got going";
  daemon_->Signal(SIGKILL);
  EXPECT_EQ(daemon_->Wait(), 128 + SIGKILL);
  daemon_.reset();
  fill->Wait();  // It fails now that tierkvd is gone.
  observer.reset();

  StartDaemonWithDisk(16);
  // The rebuild counts the values it read, not RocksDB's estimate: every
  // one is kept or dropped as bad.
  std::smatch rebuilt, opened;
  const std::string log = daemon_->output();
  ASSERT_TRUE(std::regex_search(
      log, rebuilt,
      std::regex("rebuilding the index: (\\d+) values, .* read \\(100%\\)")))
      << log;
  ASSERT_TRUE(std::regex_search(
      log, opened,
      std::regex("disk tier: (\\d+) blocks, .*dropped (\\d+) bad values")))
      << log;
  EXPECT_EQ(std::stoull(rebuilt[1]),
            std::stoull(opened[1]) + std::stoull(opened[2]))
      << log;
  auto verify = ManyWorker("verify", 21, 2000);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  const Tally t = ParseTally(verify->output());
  EXPECT_EQ(t.wrong, 0) << verify->output();  // Nothing torn is served.
  EXPECT_GE(static_cast<uint64_t>(t.hit), spilled) << verify->output();
}

TEST_F(TierkvdTest, SigtermStopsCleanlyAndRemovesItsFiles) {
  StartDaemon();
  daemon_->Signal(SIGTERM);
  EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
  EXPECT_THAT(ShmNames(), IsEmpty());
}

}  // namespace
}  // namespace tierkv
