// The stats page (ipc/stats_page.h) on real POSIX shared memory: a snapshot
// round trip, a page nobody has published to, permissions, a snapshot too
// large for the page, something that is not a page, freshness, and a reader
// racing a writer that never lets it see a torn snapshot.
#include "ipc/stats_page.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <new>
#include <string>
#include <thread>

#include "tests/status_matchers.h"
#include "tiers/shm_segment.h"

namespace tierkv::ipc {
namespace {

using ::testing::HasSubstr;
using SystemClock = std::chrono::system_clock;

class StatsPageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = StatsPageName(
        "t" + std::to_string(getpid()) + "-" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { ShmSegment::Remove(name_); }

  StatsPageWriter Create(uint32_t max_workers = 4) {
    auto writer = StatsPageWriter::Create({.name = name_,
                                           .socket_path = "/run/x/t.sock",
                                           .max_workers = max_workers,
                                           .mode = 0660,
                                           .group = std::nullopt,
                                           .interval = {}});
    EXPECT_THAT(writer, IsOk());
    return std::move(writer).value();
  }

  std::string name_;
};

// Stats whose fields all derive from `n`, so a reader can tell a snapshot
// that mixes two publications from a whole one.
CoordinatorStats NumberedStats(uint64_t n) {
  CoordinatorStats s;
  s.host.hit_blocks = n;
  s.host.miss_blocks = 3 * n;
  s.host.capacity_slots = static_cast<int64_t>(n % 1000);
  s.load_latency.count = n;
  s.load_latency.buckets[2] = n;  // The buckets add up to the count.
  s.oldest_event_age_us = 7 * n;
  for (uint32_t i = 0; i < n % 4; ++i) {
    s.workers.push_back({.id = i,
                         .pid = static_cast<int32_t>(n),
                         .name = "engine-" + std::to_string(n),
                         .requests = static_cast<uint32_t>(n),
                         .loads_in_flight = 0,
                         .stores_in_flight = 0});
  }
  return s;
}

bool Whole(const CoordinatorStats& s) {
  const uint64_t n = s.host.hit_blocks;
  if (s.host.miss_blocks != 3 * n || s.load_latency.count != n ||
      s.oldest_event_age_us != 7 * n ||
      s.host.capacity_slots != static_cast<int64_t>(n % 1000) ||
      s.workers.size() != n % 4) {
    return false;
  }
  for (const WorkerStats& w : s.workers) {
    if (w.name != "engine-" + std::to_string(n) || w.requests != n) {
      return false;
    }
  }
  return true;
}

TEST_F(StatsPageTest, ReadsWhatWasPublished) {
  StatsPageWriter writer = Create();
  auto reader = StatsPageReader::Open(name_);
  ASSERT_THAT(reader, IsOk());

  const auto at = SystemClock::now() - std::chrono::milliseconds(250);
  ASSERT_THAT(writer.Publish(NumberedStats(7), at), IsOk());
  auto snapshot = reader->Read();
  ASSERT_THAT(snapshot, IsOk());
  EXPECT_TRUE(Whole(snapshot->stats));
  EXPECT_EQ(snapshot->stats.host.hit_blocks, 7u);
  ASSERT_EQ(snapshot->stats.workers.size(), 3u);
  EXPECT_EQ(snapshot->stats.workers[2].name, "engine-7");
  EXPECT_EQ(snapshot->pid, getpid());
  EXPECT_EQ(snapshot->socket_path, "/run/x/t.sock");
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::microseconds>(
                snapshot->published_at.time_since_epoch()),
            std::chrono::duration_cast<std::chrono::microseconds>(
                at.time_since_epoch()));

  // The next snapshot replaces it whole, shorter worker list included.
  ASSERT_THAT(writer.Publish(NumberedStats(8), SystemClock::now()), IsOk());
  snapshot = reader->Read();
  ASSERT_THAT(snapshot, IsOk());
  EXPECT_EQ(snapshot->stats.host.hit_blocks, 8u);
  EXPECT_TRUE(snapshot->stats.workers.empty());
  EXPECT_EQ(writer.published(), 2u);
}

TEST_F(StatsPageTest, NothingPublishedYetIsUnavailable) {
  StatsPageWriter writer = Create();
  auto reader = StatsPageReader::Open(name_);
  ASSERT_THAT(reader, IsOk());
  auto snapshot = reader->Read();
  EXPECT_EQ(snapshot.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(snapshot.status().message(), HasSubstr("not published"));
}

TEST_F(StatsPageTest, NoPageIsNotFound) {
  auto reader = StatsPageReader::Open(name_);
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
}

TEST_F(StatsPageTest, PageIsReadOnlyToEveryone) {
  StatsPageWriter writer = Create();
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + name_).c_str(), &st), 0);
  // The socket's read bits (0660 -> 0440), and no write bit for anyone.
  EXPECT_EQ(st.st_mode & 0777, 0440u);
  if (geteuid() != 0) {  // Root opens it read-write regardless.
    EXPECT_EQ(ShmSegment::Open(name_).status().code(),
              StatusCode::kPermissionDenied);
  }

  // A reader's mapping is PROT_READ: a stray write faults in the reader,
  // it cannot change what tierkvd published.
  auto reader = ShmSegment::OpenReadOnly(name_);
  ASSERT_THAT(reader, IsOk());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGSEGV, SIG_DFL);  // Not a sanitizer's handler: die of it.
    reader->data()[0] = std::byte{1};
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
}

TEST_F(StatsPageTest, SnapshotTooLargeKeepsThePreviousOne) {
  StatsPageWriter writer = Create(/*max_workers=*/1);
  ASSERT_THAT(writer.Publish(NumberedStats(5), SystemClock::now()), IsOk());
  CoordinatorStats huge;
  for (uint32_t i = 0; i < 8; ++i) {
    huge.workers.push_back({.id = i,
                            .pid = 1,
                            .name = std::string(4000, 'w'),
                            .requests = 0,
                            .loads_in_flight = 0,
                            .stores_in_flight = 0});
  }
  const Status s = writer.Publish(huge, SystemClock::now());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  auto reader = StatsPageReader::Open(name_);
  ASSERT_THAT(reader, IsOk());
  auto snapshot = reader->Read();
  ASSERT_THAT(snapshot, IsOk());
  EXPECT_EQ(snapshot->stats.host.hit_blocks, 5u);
  EXPECT_TRUE(Whole(snapshot->stats));
}

TEST_F(StatsPageTest, SegmentThatIsNotAPageIsRefused) {
  auto other = ShmSegment::Create(
      {.name = name_, .bytes = 4096, .mode = 0600, .group = std::nullopt});
  ASSERT_THAT(other, IsOk());
  auto reader = StatsPageReader::Open(name_);
  EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(reader.status().message(), HasSubstr("not a stats page"));
}

// Anyone may make names in /dev/shm. A FIFO at the page's name must not
// block a reader's open (tierkvd probes its name at start, tierkv-admin
// reads it), and a page is replaced over it.
TEST_F(StatsPageTest, AFifoAtThePageNameIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo(("/dev/shm" + name_).c_str(), 0666), 0);
  auto reader = StatsPageReader::Open(name_);
  EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(reader.status().message(), HasSubstr("not a regular file"));
  StatsPageWriter writer = Create();
  ASSERT_THAT(writer.Publish(NumberedStats(3), SystemClock::now()), IsOk());
  EXPECT_THAT(StatsPageReader::Open(name_), IsOk());
}

// A page another user owns is refused before any byte of it is read: it
// could be anything, and shrink under the mapping.
TEST_F(StatsPageTest, AnotherUsersPageIsNotRead) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the page away";
  StatsPageWriter writer = Create();
  ASSERT_EQ(chown(("/dev/shm" + name_).c_str(), 65534, 65534), 0);
  auto reader = StatsPageReader::Open(name_);
  EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(reader.status().message(), HasSubstr("belongs to uid 65534"));
}

TEST_F(StatsPageTest, FreshOnlyWhileItsTierkvdLivesAndPublishes) {
  StatsPageSnapshot snapshot;
  snapshot.pid = getpid();
  snapshot.interval = std::chrono::milliseconds(100);
  const auto now = SystemClock::now();
  snapshot.published_at = now - std::chrono::milliseconds(200);
  EXPECT_TRUE(StatsPageIsFresh(snapshot, now));
  // Ten intervals, but never under 3 s: a slow publisher is not stale.
  snapshot.published_at = now - std::chrono::milliseconds(2900);
  EXPECT_TRUE(StatsPageIsFresh(snapshot, now));
  snapshot.published_at = now - std::chrono::seconds(4);
  EXPECT_FALSE(StatsPageIsFresh(snapshot, now));
  snapshot.interval = std::chrono::seconds(1);
  EXPECT_TRUE(StatsPageIsFresh(snapshot, now));

  // A SIGKILLed tierkvd leaves its page behind; its pid is gone.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  snapshot.pid = child;
  snapshot.published_at = now;
  EXPECT_FALSE(StatsPageIsFresh(snapshot, now));
}

TEST_F(StatsPageTest, ReaderNeverSeesATornSnapshot) {
  StatsPageWriter writer = Create();
  auto reader = StatsPageReader::Open(name_);
  ASSERT_THAT(reader, IsOk());
  ASSERT_THAT(writer.Publish(NumberedStats(1), SystemClock::now()), IsOk());

  std::atomic<bool> done{false};
  std::thread publisher([&] {
    for (uint64_t n = 2; !done.load(std::memory_order_relaxed); ++n) {
      Status s = writer.Publish(NumberedStats(n), SystemClock::now());
      if (!s.ok()) ADD_FAILURE() << s.ToString();
      // Far oftener than tierkvd publishes, yet with gaps: a writer that
      // never pauses starves a sequence-lock reader by design.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  uint64_t last = 0, changes = 0;
  std::string failure;
  // At least 20000 reads, and on until they have seen the publisher move
  // on more than ten times: on a loaded machine the publisher may wake
  // rarely while the reader spins.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int i = 0; (i < 20000 || changes <= 10) && failure.empty() &&
                  std::chrono::steady_clock::now() < deadline;
       ++i) {
    auto snapshot = reader->Read();
    if (!snapshot.ok()) {
      failure = snapshot.status().ToString();
    } else if (!Whole(snapshot->stats)) {
      failure = "torn snapshot: hits " +
                std::to_string(snapshot->stats.host.hit_blocks) + ", misses " +
                std::to_string(snapshot->stats.host.miss_blocks);
    } else if (snapshot->stats.host.hit_blocks < last) {
      failure = "went back from " + std::to_string(last);
    } else {
      changes += snapshot->stats.host.hit_blocks != last;
      last = snapshot->stats.host.hit_blocks;
    }
  }
  done.store(true);
  publisher.join();
  EXPECT_EQ(failure, "");
  // The reads overlapped publications: the race was exercised.
  EXPECT_GT(changes, 10u);
}

// A publisher descheduled mid-snapshot (a loaded machine, SIGSTOP) is
// waited out, not reported as stuck after a burst of tries that spans
// less than its time slice. The publisher is a child process that
// publishes without pause; it is stopped until a stop lands mid-update (a
// one-try read then finds the page busy), and resumed only after the
// patient read has begun. Between two stops the child must publish again,
// so on a busy machine a child that is not scheduled after SIGCONT is not
// stopped at the same instruction over and over.
TEST_F(StatsPageTest, AReaderWaitsOutAPublisherStoppedMidUpdate) {
  StatsPageWriter writer = Create();
  ASSERT_THAT(writer.Publish(NumberedStats(1), SystemClock::now()), IsOk());
  // Publications so far, counted by the child in memory both processes see.
  void* shared =
      mmap(nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* published = new (shared) std::atomic<uint64_t>(0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Gone with the test, whatever ends it.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1) _exit(1);
    // Never in a system call, so a stop lands anywhere in a snapshot.
    for (uint64_t n = 2;; ++n) {
      if (!writer.Publish(NumberedStats(n), SystemClock::now()).ok()) _exit(1);
      published->fetch_add(1, std::memory_order_release);
    }
  }
  struct Reaper {
    pid_t pid;
    void* shared;
    ~Reaper() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      munmap(shared, sizeof(std::atomic<uint64_t>));
    }
  } reaper{child, shared};
  auto reader = StatsPageReader::Open(name_);
  ASSERT_THAT(reader, IsOk());
  bool caught = false;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::minutes(1);
  for (uint64_t attempt = 0;
       !caught && std::chrono::steady_clock::now() < deadline; ++attempt) {
    // Let the child publish once more, then a varying while longer, so
    // successive stops land at different points of a publication.
    const uint64_t before = published->load(std::memory_order_acquire);
    while (published->load(std::memory_order_acquire) == before &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    for (uint64_t spin = 0; spin < attempt % 97 * 16; ++spin) {
      published->load(std::memory_order_relaxed);
    }
    ASSERT_EQ(kill(child, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
    ASSERT_TRUE(WIFSTOPPED(status));
    auto once = reader->Read(std::chrono::milliseconds(0));
    caught = !once.ok();
    if (caught) {
      EXPECT_EQ(once.status().code(), StatusCode::kUnavailable);
      EXPECT_THAT(once.status().message(), HasSubstr("mid-update"));
    } else {
      ASSERT_EQ(kill(child, SIGCONT), 0);
    }
  }
  ASSERT_TRUE(caught) << "no stop landed mid-update";

  // The resumer waits until the read has begun, then sleeps one time slice
  // and more before the publisher may finish.
  std::atomic<bool> reading{false};
  std::thread resumer([&] {
    while (!reading.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(child, SIGCONT);
  });
  reading.store(true);
  auto snapshot = reader->Read(std::chrono::seconds(60));
  resumer.join();
  ASSERT_THAT(snapshot, IsOk());
  EXPECT_TRUE(Whole(snapshot->stats));
}

}  // namespace
}  // namespace tierkv::ipc
