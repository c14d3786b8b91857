// The wire protocol: every message survives a round trip, and every way a
// frame can be broken (each truncation, a flipped version, an unknown type,
// trailing bytes, counts past the limits, bad enum values) is an error,
// never a crash or a guess.
#include "ipc/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/status_matchers.h"
#include "tests/test_layout.h"

namespace tierkv::ipc {
namespace {

using ::testing::HasSubstr;

std::vector<Message> Samples() {
  TransferEvent event{.ref = {EventKind::kLoad, 7},
                      .request = 42,
                      .device_blocks = {3, 4},
                      .host_blocks = {9, 10}};
  RequestExtras extras;
  extras.lora_id = 5;
  extras.mm_items.push_back({.hash = {1, 2}, .start = 3, .length = 4});
  extras.cache_salt = "salt";
  CoordinatorStats stats;
  stats.host.capacity_slots = 49;
  stats.host.hit_blocks = 12;
  stats.host.promotions = 3;
  stats.disk.emplace();
  stats.disk->keys = 8;
  stats.disk->checksum_failures = 1;
  TransferEvent cut_load = event;
  cut_load.failed_blocks = 2;
  stats.workers.push_back({.id = 1,
                           .pid = 77,
                           .name = "w",
                           .requests = 2,
                           .loads_in_flight = 1,
                           .stores_in_flight = 0});
  stats.load_latency.Record(250);
  stats.store_latency.Record(20);
  stats.store_latency.Record(3'000'000);
  stats.oldest_event_age_us = 1234;
  stats.model = "org/model@rev";
  EventsReply events{.in_flight = 3,
                     .events = {{.worker = 2,
                                 .worker_name = "engine-2",
                                 .ref = {EventKind::kLoad, 5},
                                 .request = 11,
                                 .blocks = 4,
                                 .state = EventState::kPromoting,
                                 .age_us = 90'000},
                                {.worker = 1,
                                 .worker_name = "engine-1",
                                 .ref = {EventKind::kStore, 8},
                                 .request = 12,
                                 .blocks = 1,
                                 .state = EventState::kCopying,
                                 .age_us = 40}}};
  return {
      ErrorReply{Status::NotFound("gone")},
      OkReply{},
      RegisterRequest{{.layout = TestLayout(),
                       .model = "org/model@rev",
                       .num_device_blocks = 100,
                       .tenant = "t",
                       .pid = 5,
                       .name = "n"}},
      RegisterReply{.worker_id = 3,
                    .host_slots = 50,
                    .slot_bytes = 16384,
                    .store_fingerprint = "kv1:...,model=org/model@rev"},
      LookupRequest{.request = 1,
                    .num_computed_tokens = 16,
                    .tokens = {1, 2, 3},
                    .extras = extras},
      LookupReply{{.hit_tokens = 32, .disk_hit_tokens = 16}},
      LookupRequest{.request = 1,
                    .num_computed_tokens = 0,
                    .tokens = {9},
                    .extras = {},
                    .kept_tokens = 4096,
                    .kept_tag = 77},
      LookupReply{{.hit_tokens = 4080, .disk_hit_tokens = 0}, 78},
      LookupChunkRequest{.request = 7, .tokens = {4, 5, 6, 7}},
      LookupChunkRequest{
          .request = 8,
          .tokens = {4},
          .virtual_start = (int64_t{1} << 48) - 1,
          .variant = {.lo = 0x1122334455667788, .hi = 0x99aabbccddeeff00}},
      AllocateRequest{
          .request = 1, .num_external_tokens = 16, .device_blocks = {1, 2}},
      AllocateReply{{.load = event,
                     .load_pending = true,
                     .store_status = Status::ResourceExhausted("full")}},
      CommitRequest{
          .request = 1, .num_computed_tokens = 32, .device_blocks = {1, 2}},
      CommitReply{{.stores = {event},
                   .skipped_blocks = 2,
                   .store_status = Status::ResourceExhausted("cap")}},
      CompleteRequest{
          {{{EventKind::kStore, 3}, true}, {{EventKind::kLoad, 4}, false}}},
      FinishRequest{9},
      StatsRequest{},
      StatsReply{stats},
      ReadyLoadsRequest{},
      ReadyLoadsReply{{event, cut_load}},
      EventsRequest{},
      events,
      ClearRequest{TierSelection::kDisk},
      ClearReply{{.host_dropped = 5,
                  .host_kept_pinned = 2,
                  .disk_dropped = 40,
                  .disk_cleared = true,
                  .remote_dropped = 7,
                  .remote_cleared = true}},
      ClearReply{
          {.disk_dropped = 3, .disk_cleared = true, .disk_undeleted = true}},
      EvictRequest{{{1, 2}, {3, 4}}},
      EvictReply{
          {{.key = {1, 2}, .host_dropped = true, .disk_dropped = true},
           {.key = {3, 4}, .host_pinned = true, .remote_dropped = true},
           {.key = {5, 6}},
           {.key = {7, 8}, .disk_dropped = true, .disk_undeleted = true}}},
      FetchChunkRequest{.request = 3, .wait_ms = 250, .tokens = {4, 5, 6}},
      FetchChunkRequest{.request = 3,
                        .wait_ms = 0,
                        .tokens = {4},
                        .virtual_start = 100,
                        .variant = {.lo = 1, .hi = 2}},
      FetchChunkReply{{.lookup = {.hit_tokens = 3},
                       .load = TransferEvent{.ref = {EventKind::kLoad, 2},
                                             .request = 3,
                                             .device_blocks = {},
                                             .host_blocks = {9, 10},
                                             .failed_blocks = 1},
                       .lease = false,
                       .waited = true}},
      FetchChunkReply{{.lookup = {.hit_tokens = 16, .disk_hit_tokens = 0},
                       .load = std::nullopt,
                       .lease = true,
                       .waited = false}},
      PublishChunkRequest{
          .request = 4, .tokens = {4, 5, 6}, .device_blocks = {1}},
      PublishChunkRequest{.request = 4,
                          .tokens = {4},
                          .device_blocks = {1},
                          .virtual_start = 4096,
                          .variant = {.lo = 3, .hi = 4}},
      ChunkDoneRequest{.events = {{{EventKind::kStore, 3}, true},
                                  {{EventKind::kLoad, 2}, false}},
                       .finish = 4},
      LookupBatchRequest{
          {{.request = 1,
            .num_computed_tokens = 0,
            .tokens = {1, 2, 3},
            .extras = {}},
           {.request = 2,
            .num_computed_tokens = 16,
            .tokens = {4, 5},
            .extras = {.lora_id = 7, .mm_items = {}, .cache_salt = ""}}}},
      LookupBatchReply{{LookupResult{.hit_tokens = 32, .disk_hit_tokens = 16},
                        Status::ResourceExhausted("past the cap"),
                        LookupResult{}}},
      RouteRequest{.tenant = "uid1000/t",
                   .tokens = {1, 2, 3},
                   .extras = {.lora_id = 4, .mm_items = {}, .cache_salt = "s"}},
      RouteReply{{.prompt_tokens = 48,
                  .cached_tokens = 32,
                  .lower_tokens = 16,
                  .workers = {{.id = 3, .name = "engine", .pid = 99},
                              {.id = 4, .name = "", .pid = 100}}}},
      HeldKeysRequest{},
      HeldKeysReply{{.host_total = 3,
                     .disk_total = 1,
                     .remote_total = 2,
                     .host = {BlockKey{.lo = 1, .hi = 2}},
                     .disk = {BlockKey{.lo = 3, .hi = 4}},
                     .remote = {BlockKey{.lo = 5, .hi = 6}}}},
      ErrorReply{Status::Aborted("send it whole")},
  };
}

TEST(Protocol, EveryMessageRoundTrips) {
  for (const Message& m : Samples()) {
    const std::vector<std::byte> bytes = Encode(m);
    StatusOr<Message> back = Decode(bytes);
    ASSERT_THAT(back, IsOk())
        << MessageTypeName(TypeOf(m)) << ": " << back.status().ToString();
    EXPECT_EQ(TypeOf(*back), TypeOf(m));
    EXPECT_EQ(Encode(*back), bytes) << MessageTypeName(TypeOf(m));
  }
}

// The client encodes its lookups from the caller's tokens: the same bytes
// as the messages, whose decoding the tests above check.
TEST(Protocol, LookupsEncodedFromSpansAreTheMessagesBytes) {
  const std::vector<TokenId> a = {1, 2, 3, 4}, b = {9, 8};
  const RequestExtras extras{
      .lora_id = 3,
      .mm_items = {{.hash = {1, 2}, .start = 0, .length = 2}},
      .cache_salt = "salt"};
  std::vector<std::byte> bytes;
  EncodeLookup(5, 0, a, extras, 0, 0, &bytes);
  EXPECT_EQ(bytes, Encode(LookupRequest{.request = 5,
                                        .num_computed_tokens = 0,
                                        .tokens = a,
                                        .extras = extras}));
  bytes.clear();
  EncodeLookup(5, 16, b, {}, 32, 9, &bytes);
  EXPECT_EQ(bytes, Encode(LookupRequest{.request = 5,
                                        .num_computed_tokens = 16,
                                        .tokens = b,
                                        .extras = {},
                                        .kept_tokens = 32,
                                        .kept_tag = 9}));
  const LookupQuery queries[] = {
      {.request = 1, .tokens = a, .num_computed_tokens = 0, .extras = extras},
      {.request = 2, .tokens = b, .num_computed_tokens = 0, .extras = {}}};
  bytes.clear();
  EncodeLookupBatch(queries, &bytes);
  EXPECT_EQ(bytes, Encode(LookupBatchRequest{{{.request = 1,
                                               .num_computed_tokens = 0,
                                               .tokens = a,
                                               .extras = extras},
                                              {.request = 2,
                                               .num_computed_tokens = 0,
                                               .tokens = b,
                                               .extras = {}}}}));
  // The client splits batches by these sizes.
  EXPECT_EQ(bytes.size(), kFrameHeaderBytes + 4 +
                              LookupBatchEntryBytes(queries[0]) +
                              LookupBatchEntryBytes(queries[1]));
}

TEST(Protocol, TheModelTravels) {
  StatusOr<Message> reg = Decode(Encode(Samples()[2]));
  ASSERT_THAT(reg, IsOk());
  EXPECT_EQ(std::get<RegisterRequest>(*reg).registration.model,
            "org/model@rev");
  StatsReply stats;
  stats.stats.model = "org/model@rev";
  StatusOr<Message> back = Decode(Encode(stats));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(std::get<StatsReply>(*back).stats.model, "org/model@rev");
}

TEST(Protocol, EveryTruncationIsAnError) {
  for (const Message& m : Samples()) {
    const std::vector<std::byte> bytes = Encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      StatusOr<Message> d = Decode(std::span<const std::byte>(bytes).first(n));
      EXPECT_FALSE(d.ok()) << MessageTypeName(TypeOf(m)) << " cut to " << n;
    }
  }
}

TEST(Protocol, TruncatedPayloadWithPatchedLengthIsAnError) {
  // A frame whose header agrees with its shortened payload still fails on
  // the payload itself.
  const std::vector<std::byte> bytes = Encode(Samples()[4]);  // Lookup.
  for (size_t cut = 1; cut < bytes.size() - kFrameHeaderBytes; ++cut) {
    std::vector<std::byte> frame(bytes.begin(), bytes.end() - cut);
    const auto len = static_cast<uint32_t>(frame.size() - kFrameHeaderBytes);
    for (int i = 0; i < 4; ++i) {
      frame[8 + i] = static_cast<std::byte>((len >> (8 * i)) & 0xFF);
    }
    StatusOr<Message> d = Decode(frame);
    ASSERT_FALSE(d.ok()) << "cut " << cut;
    EXPECT_THAT(d.status().message(), HasSubstr("Lookup"));
  }
}

TEST(Protocol, HeaderProblemsAreNamed) {
  std::vector<std::byte> bytes = Encode(FinishRequest{1});
  std::vector<std::byte> bad = bytes;
  bad[0] = std::byte{0};
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("magic"));
  bad = bytes;
  bad[4] = std::byte{kProtocolVersion + 1};
  EXPECT_EQ(Decode(bad).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      Decode(bad).status().message(),
      HasSubstr("protocol version " + std::to_string(kProtocolVersion + 1)));
  bad = bytes;
  bad[6] = std::byte{0xEE};
  EXPECT_THAT(Decode(bad).status().message(),
              HasSubstr("unknown message type"));
  bad = bytes;
  bad.push_back(std::byte{0});
  EXPECT_FALSE(Decode(bad).ok());
  EXPECT_EQ(PeekPayloadLength(bytes, 4).status().code(),
            StatusCode::kInvalidArgument);  // 8-byte payload over a limit of 4.
}

TEST(Protocol, CountsPastTheLimitsAreRefusedBeforeAllocating) {
  // A Lookup announcing 2^31 tokens in a tiny frame.
  std::vector<std::byte> bytes = Encode(LookupRequest{});
  const size_t count_at = kFrameHeaderBytes + 8 + 4;
  bytes[count_at + 3] = std::byte{0x80};
  StatusOr<Message> d = Decode(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("token count"));
}

TEST(Protocol, BadEnumValuesAreRefused) {
  std::vector<std::byte> bytes =
      Encode(CompleteRequest{{{{EventKind::kStore, 3}, true}}});
  std::vector<std::byte> bad = bytes;
  bad[kFrameHeaderBytes + 4] = std::byte{9};  // Event kind.
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("event kind"));
  bad = bytes;
  bad.back() = std::byte{2};  // Boolean.
  EXPECT_THAT(Decode(bad).status().message(), HasSubstr("boolean"));
}

TEST(Protocol, ARouteCachingMoreThanItsPromptIsRefused) {
  for (const RouteResult& r :
       {RouteResult{.prompt_tokens = 16, .cached_tokens = 32},
        RouteResult{
            .prompt_tokens = 32, .cached_tokens = 16, .lower_tokens = 32},
        RouteResult{.prompt_tokens = -16}}) {
    EXPECT_THAT(Decode(Encode(RouteReply{r})).status().message(),
                HasSubstr("cached tokens outside the prompt"));
  }
}

TEST(Protocol, InconsistentLoadsAreRefused) {
  // A disk hit larger than the hit.
  std::vector<std::byte> bytes =
      Encode(LookupReply{{.hit_tokens = 16, .disk_hit_tokens = 32}});
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("disk hit"));
  // A pending load with no load.
  AllocateReply pending;
  pending.result.load_pending = true;
  bytes = Encode(pending);
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("pending load"));
  // A store among ready loads.
  TransferEvent store;
  store.ref = {EventKind::kStore, 1};
  bytes = Encode(ReadyLoadsReply{{store}});
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("is a store"));
  // A negative failed-block count.
  TransferEvent load;
  load.ref = {EventKind::kLoad, 1};
  load.failed_blocks = -1;
  bytes = Encode(ReadyLoadsReply{{load}});
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("failed block"));
}

TEST(Protocol, InconsistentChunkFetchesAreRefused) {
  // A compute lease on a hit: the worker would compute what it loads.
  FetchChunkReply reply{{.lookup = {.hit_tokens = 16},
                         .load = TransferEvent{.ref = {EventKind::kLoad, 1},
                                               .request = 2,
                                               .device_blocks = {},
                                               .host_blocks = {5}},
                         .lease = true,
                         .waited = false}};
  EXPECT_THAT(Decode(Encode(reply)).status().message(),
              HasSubstr("lease on a hit"));
  // Hits out of range.
  reply = {};
  reply.result.lookup = {.hit_tokens = 16, .disk_hit_tokens = 32};
  EXPECT_THAT(Decode(Encode(reply)).status().message(),
              HasSubstr("hit tokens out of range"));
  reply = {};
  reply.result.lookup = {.hit_tokens = -1};
  EXPECT_THAT(Decode(Encode(reply)).status().message(),
              HasSubstr("hit tokens out of range"));
  // A negative failed-block count in the load.
  reply = {{.lookup = {.hit_tokens = 16},
            .load = TransferEvent{.ref = {EventKind::kLoad, 1},
                                  .request = 2,
                                  .device_blocks = {},
                                  .host_blocks = {5},
                                  .failed_blocks = -1}}};
  EXPECT_THAT(Decode(Encode(reply)).status().message(),
              HasSubstr("failed block"));
  // A bad event kind among a ChunkDone's completions.
  std::vector<std::byte> bytes = Encode(ChunkDoneRequest{
      .events = {{{EventKind::kStore, 3}, true}}, .finish = 0});
  bytes[kFrameHeaderBytes + 4] = std::byte{9};  // After the count.
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("event kind"));
  // Token counts past the limit, refused before allocating.
  bytes = Encode(FetchChunkRequest{.request = 1, .wait_ms = 0, .tokens = {1}});
  const uint32_t huge = kMaxTokens + 1;
  std::memcpy(bytes.data() + kFrameHeaderBytes + 12, &huge, sizeof(huge));
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("token"));
  // A chunk's virtual start outside the RoPE positions tierkv remaps.
  for (int64_t start : {int64_t{-1}, kMaxChunkVirtualStart}) {
    EXPECT_THAT(
        Decode(Encode(LookupChunkRequest{
                   .request = 1, .tokens = {1}, .virtual_start = start}))
            .status()
            .message(),
        HasSubstr("virtual start"));
    EXPECT_THAT(Decode(Encode(PublishChunkRequest{.request = 1,
                                                  .tokens = {1},
                                                  .device_blocks = {1},
                                                  .virtual_start = start}))
                    .status()
                    .message(),
                HasSubstr("virtual start"));
  }
}

TEST(Protocol, InconsistentEventListsAreRefused) {
  EventsReply reply{.in_flight = 1, .events = {EventInfo{}, EventInfo{}}};
  EXPECT_THAT(Decode(Encode(reply)).status().message(),
              HasSubstr("more events listed than in flight"));
  reply = {.in_flight = 1, .events = {EventInfo{}}};
  std::vector<std::byte> bytes = Encode(reply);
  bytes[bytes.size() - 9] = std::byte{7};  // The state, before the age.
  EXPECT_THAT(Decode(bytes).status().message(),
              HasSubstr("unknown event state 7"));
  // Latency buckets that disagree with their count.
  StatsReply stats;
  stats.stats.load_latency.count = 1;
  EXPECT_THAT(Decode(Encode(stats)).status().message(),
              HasSubstr("latency buckets"));
}

TEST(Protocol, BadOperatorOrdersAreRefused) {
  std::vector<std::byte> bytes = Encode(ClearRequest{TierSelection::kHost});
  bytes.back() = std::byte{4};
  EXPECT_THAT(Decode(bytes).status().message(),
              HasSubstr("unknown tier selection 4"));
  // Dropped from host and pinned there at once.
  bytes = Encode(EvictReply{{{.key = {1, 2}}}});
  bytes.back() = std::byte{3};
  EXPECT_THAT(Decode(bytes).status().message(),
              HasSubstr("bad evicted block flags 3"));
  // More keys than kMaxBlocks.
  bytes = Encode(EvictRequest{});
  bytes[kFrameHeaderBytes + 3] = std::byte{0x80};
  EXPECT_THAT(Decode(bytes).status().message(), HasSubstr("key count"));
}

TEST(Protocol, RandomBytesNeverCrash) {
  std::mt19937_64 rng(123);
  const std::vector<Message> samples = Samples();
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    // Mutate a valid frame so the decoder gets past the header often.
    std::vector<std::byte> bytes = Encode(samples[i % samples.size()]);
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      bytes[kFrameHeaderBytes / 2 +
            rng() % (bytes.size() - kFrameHeaderBytes / 2)] =
          static_cast<std::byte>(rng());
    }
    decoded += Decode(bytes).ok() ? 1 : 0;
  }
  // Many mutations land in values (ids, tokens) and still decode; some
  // must not. The point is that none crashed or read out of bounds (ASan).
  EXPECT_GT(decoded, 0);
  EXPECT_LT(decoded, 20000);
}

}  // namespace
}  // namespace tierkv::ipc
