// EmulatedDeviceTier: copies land byte-exact, every job completes exactly
// once in submission order, bad jobs are refused before anything is queued,
// and the destructor runs what is still queued. Synchronisation is always on
// the completion itself; timeouts only bound a failing test.
#include "tierkv/device_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/status_matchers.h"
#include "tiers/copy_engine.h"

namespace tierkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Only a failure bound: a passing test returns as soon as the copy is done.
constexpr std::chrono::milliseconds kFailAfter{60'000};

std::unique_ptr<EmulatedDeviceTier> MakeTier(int32_t num_blocks,
                                             size_t block_bytes) {
  auto tier = EmulatedDeviceTier::Create(num_blocks, block_bytes);
  EXPECT_THAT(tier, IsOk());
  return std::move(tier).value();
}

// Fills `bytes` with a pattern that differs per seed and per offset.
void Fill(std::span<std::byte> bytes, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (std::byte& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
}

std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  Fill(v, seed);
  return v;
}

bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// Collects completions until `count` have arrived; a wait that times out
// ends the collection early (the caller's size check then fails).
std::vector<CopyCompletion> Collect(DeviceTier& tier, size_t count) {
  std::vector<CopyCompletion> all;
  while (all.size() < count) {
    std::vector<CopyCompletion> got = tier.WaitCompleted(kFailAfter);
    if (got.empty()) break;
    all.insert(all.end(), got.begin(), got.end());
  }
  return all;
}

std::vector<uint64_t> Tags(const std::vector<CopyCompletion>& completions) {
  std::vector<uint64_t> tags;
  for (const CopyCompletion& c : completions) {
    EXPECT_THAT(c.status, IsOk())
        << "tag " << c.tag << ": " << c.status.ToString();
    tags.push_back(c.tag);
  }
  return tags;
}

TEST(DeviceTierCreate, RejectsBadShape) {
  for (int32_t n : {0, -1, std::numeric_limits<int32_t>::min()}) {
    auto tier = EmulatedDeviceTier::Create(n, 64);
    ASSERT_FALSE(tier.ok()) << n;
    EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
  }
  auto zero_bytes = EmulatedDeviceTier::Create(4, 0);
  ASSERT_FALSE(zero_bytes.ok());
  EXPECT_EQ(zero_bytes.status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceTierCreate, ArenaTooLargeIsResourceExhausted) {
  // num_blocks * block_bytes overflows size_t.
  auto overflow = EmulatedDeviceTier::Create(
      std::numeric_limits<int32_t>::max(), size_t{1} << 40);
  ASSERT_FALSE(overflow.ok());
  EXPECT_EQ(overflow.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(overflow.status().message(), HasSubstr("device arena"));
  // 2^20 blocks of 128 MiB: 128 TiB, at least the whole user address space.
  auto huge = EmulatedDeviceTier::Create(1 << 20, size_t{1} << 27);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("device arena"));
}

TEST(DeviceTierCreate, BlocksArePageAlignedAndDisjoint) {
  auto tier = MakeTier(3, 100);
  EXPECT_EQ(tier->num_blocks(), 3);
  EXPECT_EQ(tier->block_bytes(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tier->block(0).data()) % 4096, 0u);
  for (BlockId id = 0; id < 3; ++id) {
    EXPECT_EQ(tier->block(id).size(), 100u);
    Fill(tier->block(id), id);
  }
  for (BlockId id = 0; id < 3; ++id) {
    EXPECT_TRUE(SameBytes(tier->block(id), Pattern(100, id))) << id;
  }
  EXPECT_EQ(tier->in_flight(), 0u);
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
}

TEST(DeviceTierCopy, StoreCopiesDeviceBlocksIntoHostExactly) {
  constexpr size_t kBytes = 4096 + 7;  // Not a multiple of anything useful.
  auto tier = MakeTier(4, kBytes);
  for (BlockId id = 0; id < 4; ++id) Fill(tier->block(id), 10 + id);
  // Host slots with guard bytes on both sides to catch overruns.
  constexpr size_t kGuard = 64;
  std::vector<std::byte> host(3 * (kBytes + 2 * kGuard), std::byte{0xAB});
  auto slot = [&](int i) {
    return host.data() + kGuard + i * (kBytes + 2 * kGuard);
  };

  CopyJob job{.tag = 7,
              .direction = CopyDirection::kDeviceToHost,
              .device_blocks = {2, 0, 3},
              .host_blocks = {slot(0), slot(1), slot(2)}};
  ASSERT_THAT(tier->Submit(std::move(job)), IsOk());
  EXPECT_THAT(Tags(Collect(*tier, 1)), ElementsAre(7u));

  const BlockId expected[] = {2, 0, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(SameBytes({slot(i), kBytes}, tier->block(expected[i]))) << i;
    for (size_t g = 1; g <= kGuard; ++g) {
      ASSERT_EQ(slot(i)[-static_cast<ptrdiff_t>(g)], std::byte{0xAB});
      ASSERT_EQ(slot(i)[kBytes + g - 1], std::byte{0xAB});
    }
  }
  EXPECT_EQ(tier->in_flight(), 0u);
}

TEST(DeviceTierCopy, LoadCopiesHostIntoDeviceBlocksOnly) {
  constexpr size_t kBytes = 8192;
  auto tier = MakeTier(5, kBytes);
  for (BlockId id = 0; id < 5; ++id) Fill(tier->block(id), 100 + id);
  std::vector<std::byte> a = Pattern(kBytes, 1);
  std::vector<std::byte> b = Pattern(kBytes, 2);

  ASSERT_THAT(tier->Submit(CopyJob{.tag = 1,
                                   .direction = CopyDirection::kHostToDevice,
                                   .device_blocks = {3, 1},
                                   .host_blocks = {a.data(), b.data()}}),
              IsOk());
  EXPECT_THAT(Tags(Collect(*tier, 1)), ElementsAre(1u));

  EXPECT_TRUE(SameBytes(tier->block(3), a));
  EXPECT_TRUE(SameBytes(tier->block(1), b));
  for (BlockId untouched : {0, 2, 4}) {
    EXPECT_TRUE(
        SameBytes(tier->block(untouched), Pattern(kBytes, 100 + untouched)))
        << untouched;
  }
  // The host side of a load is only read.
  EXPECT_TRUE(SameBytes(a, Pattern(kBytes, 1)));
}

TEST(DeviceTierCopy, StoreThenLoadRoundTripsInSubmissionOrder) {
  // The load is queued behind the store of the same host slot, so it must see
  // the stored bytes: jobs run in order.
  constexpr size_t kBytes = 1 << 16;
  auto tier = MakeTier(2, kBytes);
  Fill(tier->block(0), 5);
  std::vector<std::byte> slot(kBytes);
  ASSERT_THAT(tier->Submit(CopyJob{.tag = 1,
                                   .direction = CopyDirection::kDeviceToHost,
                                   .device_blocks = {0},
                                   .host_blocks = {slot.data()}}),
              IsOk());
  ASSERT_THAT(tier->Submit(CopyJob{.tag = 2,
                                   .direction = CopyDirection::kHostToDevice,
                                   .device_blocks = {1},
                                   .host_blocks = {slot.data()}}),
              IsOk());
  EXPECT_THAT(Tags(Collect(*tier, 2)), ElementsAre(1u, 2u));
  EXPECT_TRUE(SameBytes(tier->block(1), Pattern(kBytes, 5)));
}

TEST(DeviceTierCompletion, TagsReturnedOnceEachInSubmissionOrder) {
  auto tier = MakeTier(8, 256);
  std::vector<std::vector<std::byte>> host(64, std::vector<std::byte>(256));
  std::vector<uint64_t> submitted;
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t tag = 1000 + (i * 37) % 64;  // Tags need not be sorted.
    submitted.push_back(tag);
    ASSERT_THAT(tier->Submit(CopyJob{
                    .tag = tag,
                    .direction = i % 2 == 0 ? CopyDirection::kDeviceToHost
                                            : CopyDirection::kHostToDevice,
                    .device_blocks = {static_cast<BlockId>(i % 8)},
                    .host_blocks = {host[i].data()}}),
                IsOk());
  }
  std::vector<CopyCompletion> all = Collect(*tier, 64);
  EXPECT_EQ(Tags(all), submitted);
  // Nothing is handed out twice.
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
  EXPECT_THAT(tier->WaitCompleted(std::chrono::milliseconds(0)), IsEmpty());
  EXPECT_EQ(tier->in_flight(), 0u);
}

TEST(DeviceTierCompletion, InFlightCountsUntilTheCompletionIsReturned) {
  auto tier = MakeTier(2, 512);
  std::vector<std::byte> host(512);
  EXPECT_EQ(tier->in_flight(), 0u);
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 1, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  // Finished or not, the job is in flight until its completion is handed out.
  EXPECT_EQ(tier->in_flight(), 1u);
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 2, .device_blocks = {1}, .host_blocks = {host.data()}}),
      IsOk());
  EXPECT_EQ(tier->in_flight(), 2u);
  size_t seen = 0;
  while (seen < 2) {
    std::vector<CopyCompletion> got = tier->WaitCompleted(kFailAfter);
    ASSERT_THAT(got, testing::Not(IsEmpty()));
    seen += got.size();
    EXPECT_EQ(tier->in_flight(), 2u - seen);
  }
  EXPECT_EQ(tier->in_flight(), 0u);
}

TEST(DeviceTierCompletion, WaitWakesOnTheCompletionFromAnotherThread) {
  auto tier = MakeTier(1, 4096);
  std::vector<std::byte> host(4096);
  std::vector<CopyCompletion> got;
  // Whether the waiter blocks before or after the submit, it must return
  // with the completion, long before the failure bound.
  std::thread waiter([&] { got = tier->WaitCompleted(kFailAfter); });
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 42, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  waiter.join();
  EXPECT_THAT(Tags(got), ElementsAre(42u));
  EXPECT_EQ(tier->in_flight(), 0u);
}

TEST(DeviceTierCompletion, WaitTimesOutEmptyWhenNothingFinishes) {
  auto tier = MakeTier(1, 64);
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
  EXPECT_THAT(tier->WaitCompleted(std::chrono::milliseconds(0)), IsEmpty());
  EXPECT_THAT(tier->WaitCompleted(std::chrono::milliseconds(-5)), IsEmpty());
  EXPECT_THAT(tier->WaitCompleted(std::chrono::milliseconds(20)), IsEmpty());
}

TEST(DeviceTierCompletion, WaitForeverTimeoutDoesNotOverflow) {
  auto tier = MakeTier(1, 64);
  std::vector<std::byte> host(64);
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 3, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  EXPECT_THAT(Tags(tier->WaitCompleted(std::chrono::milliseconds::max())),
              ElementsAre(3u));
}

TEST(DeviceTierCompletion, EmptyJobCompletesInOrderAsAFence) {
  auto tier = MakeTier(2, 64);
  std::vector<std::byte> host(64);
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 1, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  ASSERT_THAT(
      tier->Submit(CopyJob{.tag = 2, .device_blocks = {}, .host_blocks = {}}),
      IsOk());
  EXPECT_THAT(Tags(Collect(*tier, 2)), ElementsAre(1u, 2u));
}

TEST(DeviceTierSubmit, InvalidJobsAreRejectedWithNothingQueued) {
  constexpr size_t kBytes = 128;
  auto tier = MakeTier(4, kBytes);
  Fill(tier->block(0), 9);
  std::vector<std::byte> host(kBytes, std::byte{0});
  std::byte* h = host.data();

  std::vector<CopyJob> bad;
  bad.push_back({.tag = 1, .device_blocks = {0, 1}, .host_blocks = {h}});
  bad.push_back({.tag = 2, .device_blocks = {}, .host_blocks = {h}});
  bad.push_back({.tag = 3, .device_blocks = {0, 4}, .host_blocks = {h, h}});
  bad.push_back({.tag = 4, .device_blocks = {0, -1}, .host_blocks = {h, h}});
  bad.push_back({.tag = 5,
                 .direction = CopyDirection::kHostToDevice,
                 .device_blocks = {std::numeric_limits<BlockId>::min()},
                 .host_blocks = {h}});
  bad.push_back(
      {.tag = 6, .device_blocks = {0, 1}, .host_blocks = {h, nullptr}});
  for (CopyJob& job : bad) {
    const uint64_t tag = job.tag;
    Status s = tier->Submit(std::move(job));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << tag;
    EXPECT_THAT(s.message(), HasSubstr("tag " + std::to_string(tag))) << tag;
    EXPECT_EQ(tier->in_flight(), 0u) << tag;
  }
  // Jobs run in order, so once this later job completes any queued bad job
  // would have completed (and copied block 0 into `host`) before it.
  ASSERT_THAT(
      tier->Submit(CopyJob{.tag = 99, .device_blocks = {}, .host_blocks = {}}),
      IsOk());
  EXPECT_THAT(Tags(Collect(*tier, 1)), ElementsAre(99u));
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
  EXPECT_EQ(tier->in_flight(), 0u);
  EXPECT_TRUE(SameBytes(host, std::vector<std::byte>(kBytes, std::byte{0})));
}

TEST(DeviceTierConcurrency, TwoSubmittersEveryJobCompletesOnce) {
  constexpr int kPerThread = 500;
  constexpr int32_t kBlocks = 16;
  constexpr size_t kBytes = 256;
  std::unique_ptr<DeviceTier> tier = MakeTier(kBlocks, kBytes);
  auto* emulated = static_cast<EmulatedDeviceTier*>(tier.get());
  for (BlockId id = 0; id < kBlocks; ++id) Fill(emulated->block(id), id);
  // One host slot per job; thread t's job i has tag t * kPerThread + i.
  std::vector<std::vector<std::byte>> host(2 * kPerThread,
                                           std::vector<std::byte>(kBytes));
  auto submit_all = [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      const int tag = t * kPerThread + i;
      Status s = tier->Submit(
          CopyJob{.tag = static_cast<uint64_t>(tag),
                  .device_blocks = {static_cast<BlockId>(tag % kBlocks)},
                  .host_blocks = {host[tag].data()}});
      EXPECT_THAT(s, IsOk());
    }
  };
  std::thread a(submit_all, 0);
  std::thread b(submit_all, 1);
  // Collect while the submitters are still going.
  std::vector<CopyCompletion> all = Collect(*tier, 2 * kPerThread);
  a.join();
  b.join();

  ASSERT_THAT(all, SizeIs(2 * kPerThread));
  std::vector<int> times_seen(2 * kPerThread, 0);
  uint64_t last_of[2] = {0, 0};
  bool any_of[2] = {false, false};
  for (uint64_t tag : Tags(all)) {
    ASSERT_LT(tag, 2u * kPerThread);
    ++times_seen[tag];
    // Each thread's own jobs complete in the order it submitted them.
    const int t = static_cast<int>(tag / kPerThread);
    if (any_of[t]) {
      EXPECT_GT(tag, last_of[t]);
    }
    last_of[t] = tag;
    any_of[t] = true;
  }
  EXPECT_THAT(times_seen, testing::Each(1));
  for (int tag = 0; tag < 2 * kPerThread; ++tag) {
    ASSERT_TRUE(SameBytes(host[tag], Pattern(kBytes, tag % kBlocks))) << tag;
  }
  EXPECT_THAT(tier->PollCompleted(), IsEmpty());
  EXPECT_EQ(tier->in_flight(), 0u);
}

TEST(DeviceTierLifetime, DestructorRunsQueuedJobsThenStops) {
  constexpr int kJobs = 8;
  constexpr int32_t kBlocks = 4;
  constexpr size_t kBytes = 256 << 10;
  std::vector<std::vector<std::byte>> host(kJobs * kBlocks,
                                           std::vector<std::byte>(kBytes));
  {
    auto tier = MakeTier(kBlocks, kBytes);
    for (BlockId id = 0; id < kBlocks; ++id) Fill(tier->block(id), 50 + id);
    for (int j = 0; j < kJobs; ++j) {
      CopyJob job;
      job.tag = static_cast<uint64_t>(j);
      for (BlockId id = 0; id < kBlocks; ++id) {
        job.device_blocks.push_back(id);
        job.host_blocks.push_back(host[j * kBlocks + id].data());
      }
      ASSERT_THAT(tier->Submit(std::move(job)), IsOk());
    }
    EXPECT_EQ(tier->in_flight(), static_cast<size_t>(kJobs));
    // Destroyed with jobs queued and completions never collected.
  }
  for (int j = 0; j < kJobs; ++j) {
    for (BlockId id = 0; id < kBlocks; ++id) {
      ASSERT_TRUE(SameBytes(host[j * kBlocks + id], Pattern(kBytes, 50 + id)))
          << "job " << j << " block " << id;
    }
  }
}

TEST(DeviceTierLifetime, IdleTierIsDestroyedPromptly) {
  for (int i = 0; i < 50; ++i) {
    auto tier = MakeTier(1, 64);
  }
}

// A caller about to wait runs queued jobs itself (RunQueued), and only
// while the engine's thread runs none. Made deterministic by holding the
// thread in the notify callback of job 1: it has finished that job (no job
// runs) but cannot take the next, so jobs 2 and 3 can only run on the
// caller's thread.
TEST(CopyEngineRunQueued, CallerRunsQueuedJobsInOrderWithoutNotify) {
  std::mutex mu;
  std::vector<std::pair<uint64_t, std::thread::id>> ran;  // Guarded by mu.
  std::latch job1_started(1), release_job1(1), release_notify(1);
  std::latch notified_once(1);
  auto engine = CopyEngine::Start([&](const CopyJob& job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ran.emplace_back(job.tag, std::this_thread::get_id());
    }
    if (job.tag == 1) {
      job1_started.count_down();
      release_job1.wait();
    }
  });
  ASSERT_THAT(engine, IsOk());
  int notifies = 0;  // Written by the engine's thread only.
  (*engine)->SetNotify([&] {
    if (++notifies == 1) {
      notified_once.count_down();
      release_notify.wait();
    }
  });
  (*engine)->Submit(CopyJob{.tag = 1});
  job1_started.wait();
  (*engine)->Submit(CopyJob{.tag = 2});
  (*engine)->Submit(CopyJob{.tag = 3});
  // The thread runs job 1: nothing runs here.
  EXPECT_EQ((*engine)->RunQueued(), 0u);
  release_job1.count_down();
  notified_once.wait();  // Job 1 done; the thread is held in its notify.
  EXPECT_EQ((*engine)->RunQueued(), 2u);
  EXPECT_EQ((*engine)->RunQueued(), 0u);  // Nothing left.
  release_notify.count_down();
  std::vector<CopyCompletion> done = (*engine)->Poll();
  EXPECT_THAT(Tags(done), ElementsAre(1u, 2u, 3u));
  engine->reset();         // Joins the thread: `notifies` is final.
  EXPECT_EQ(notifies, 1);  // Jobs a caller ran are polled, not notified.
  ASSERT_THAT(ran, SizeIs(3));
  EXPECT_EQ(ran[1].first, 2u);
  EXPECT_EQ(ran[2].first, 3u);
  EXPECT_EQ(ran[1].second, std::this_thread::get_id());
  EXPECT_EQ(ran[2].second, std::this_thread::get_id());
  EXPECT_NE(ran[0].second, std::this_thread::get_id());
}

// A job queued without waking the thread (SubmitForWaiter) runs once the
// thread is kicked, or is waited for, or a later job wakes the thread.
TEST(CopyEngineRunQueued, AJobForAWaiterRunsOnAKickAWaitOrTheNextSubmit) {
  constexpr size_t kBytes = 4096;
  auto tier = MakeTier(1, kBytes);
  Fill(tier->block(0), 11);
  std::vector<std::byte> host(kBytes);
  ASSERT_THAT(
      tier->SubmitForWaiter(CopyJob{.tag = 1,
                                    .direction = CopyDirection::kDeviceToHost,
                                    .device_blocks = {0},
                                    .host_blocks = {host.data()}}),
      IsOk());
  // Polled, never waited for: only the kick gets it run.
  auto poll = [&](size_t count) {
    std::vector<CopyCompletion> all;
    const auto fail_after = std::chrono::steady_clock::now() + kFailAfter;
    while (all.size() < count &&
           std::chrono::steady_clock::now() < fail_after) {
      std::vector<CopyCompletion> got = tier->PollCompleted();
      all.insert(all.end(), got.begin(), got.end());
      std::this_thread::yield();
    }
    return all;
  };
  tier->KickQueuedCopies();
  EXPECT_THAT(Tags(poll(1)), ElementsAre(1u));
  EXPECT_TRUE(SameBytes(host, Pattern(kBytes, 11)));
  // WaitCompleted alone: it wakes the thread for the job.
  ASSERT_THAT(
      tier->SubmitForWaiter(CopyJob{
          .tag = 2, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  EXPECT_THAT(Tags(tier->WaitCompleted(kFailAfter)), ElementsAre(2u));
  // A plain Submit behind it wakes the thread for both, in order.
  ASSERT_THAT(
      tier->SubmitForWaiter(CopyJob{
          .tag = 3, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  ASSERT_THAT(
      tier->Submit(CopyJob{
          .tag = 4, .device_blocks = {0}, .host_blocks = {host.data()}}),
      IsOk());
  EXPECT_THAT(Tags(poll(2)), ElementsAre(3u, 4u));
  // Invalid jobs are refused as Submit refuses them.
  EXPECT_THAT(
      tier->SubmitForWaiter(CopyJob{
          .tag = 5, .device_blocks = {3}, .host_blocks = {host.data()}}),
      StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(tier->in_flight(), 0u);
}

// Callers and the thread share one queue: a chain in which every load reads
// the host slot the store before it wrote comes out right only if jobs run
// one at a time in submission order, whoever runs them.
TEST(CopyEngineRunQueued, CallersAndTheThreadKeepSubmissionOrder) {
  constexpr int kLinks = 400;
  constexpr size_t kBytes = 4096;
  auto tier = MakeTier(kLinks + 1, kBytes);
  Fill(tier->block(0), 7);
  std::vector<std::byte> slot(kBytes);
  std::atomic<bool> done{false};
  std::atomic<size_t> ran_by_helper{0};
  std::thread helper([&] {
    while (!done.load()) ran_by_helper += tier->RunQueuedCopies();
  });
  size_t ran_here = 0;
  std::vector<uint64_t> submitted;
  for (int i = 0; i < kLinks; ++i) {
    // Device block i -> slot -> device block i + 1.
    for (int k = 0; k < 2; ++k) {
      const auto tag = static_cast<uint64_t>(2 * i + k);
      submitted.push_back(tag);
      ASSERT_THAT(tier->Submit(CopyJob{
                      .tag = tag,
                      .direction = k == 0 ? CopyDirection::kDeviceToHost
                                          : CopyDirection::kHostToDevice,
                      .device_blocks = {static_cast<BlockId>(i + k)},
                      .host_blocks = {slot.data()}}),
                  IsOk());
    }
    if (i % 3 == 0) ran_here += tier->RunQueuedCopies();
  }
  std::vector<CopyCompletion> all = Collect(*tier, 2 * kLinks);
  done = true;
  helper.join();
  EXPECT_EQ(Tags(all), submitted);
  for (int i = 0; i <= kLinks; ++i) {
    ASSERT_TRUE(SameBytes(tier->block(i), Pattern(kBytes, 7))) << i;
  }
  EXPECT_LE(ran_here + ran_by_helper.load(), 2u * kLinks);
  EXPECT_EQ(tier->in_flight(), 0u);
}

}  // namespace
}  // namespace tierkv
