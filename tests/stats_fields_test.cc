// The stats field tables (tierkv/stats.h) drive every rendering: each field
// of each table, set to a value of its own, must come back from the wire
// and show up in tierkv-admin's JSON, its Prometheus metrics and its
// --all listing, under the field's name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <variant>

#include "ipc/protocol.h"
#include "tests/status_matchers.h"
#include "tierkv/stats.h"
#include "tools/admin/admin.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;

// Gives every field of `s` a distinct value, starting at `next`.
template <typename Stats>
void Number(Stats& s, uint64_t& next) {
  Stats::ForEachField(s, [&](const StatField&, auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) {
      v = "w" + std::to_string(next++);
    } else {
      v = static_cast<T>(next++);
    }
  });
}

CoordinatorStats NumberedStats() {
  uint64_t next = 1001;
  CoordinatorStats s;
  Number(s.host, next);
  Number(s.disk.emplace(), next);
  Number(s.workers.emplace_back(), next);
  Number(s.workers.emplace_back(), next);
  Number(s.attach, next);
  Number(s.remote.emplace(), next);
  s.model = "m";
  s.store = "s";
  s.version = "v";
  s.key_fingerprint = "f";
  s.block_size = 16;
  s.spill_latency.Record(3);
  s.promotion_latency.Record(4);
  return s;
}

template <typename Stats>
std::string ValueText(const Stats& s, const char* name) {
  std::string out;
  Stats::ForEachField(s, [&](const StatField& f, const auto& v) {
    if (std::string(f.name) != name) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      out = v;
    } else {
      out = std::to_string(v);
    }
  });
  return out;
}

// Every field of `s`: f(field, its value as text).
template <typename Stats, typename F>
void EachField(const Stats& s, F&& f) {
  Stats::ForEachField(s, [&](const StatField& field, const auto&) {
    f(field, ValueText(s, field.name));
  });
}

TEST(StatsFields, EveryFieldCrossesTheWire) {
  const CoordinatorStats sent = NumberedStats();
  auto decoded = ipc::Decode(ipc::Encode(ipc::StatsReply{sent}));
  ASSERT_THAT(decoded, IsOk());
  const auto* reply = std::get_if<ipc::StatsReply>(&*decoded);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->stats.host, sent.host);
  EXPECT_EQ(reply->stats.disk, sent.disk);
  EXPECT_EQ(reply->stats.remote, sent.remote);
  EXPECT_EQ(reply->stats.workers, sent.workers);
  EXPECT_EQ(reply->stats.attach, sent.attach);
  EXPECT_EQ(reply->stats.spill_latency, sent.spill_latency);
  EXPECT_EQ(reply->stats.promotion_latency, sent.promotion_latency);
  EXPECT_EQ(reply->stats.store, sent.store);
  EXPECT_EQ(reply->stats.key_fingerprint, sent.key_fingerprint);
  EXPECT_EQ(reply->stats.block_size, sent.block_size);
}

TEST(StatsFields, EveryFieldIsInTheJson) {
  const CoordinatorStats s = NumberedStats();
  const std::string json = admin::FormatStatsJson(s);
  EachField(s.host, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(json, HasSubstr("\"" + std::string(f.name) + "\":" + v));
  });
  EachField(*s.disk, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(json, HasSubstr("\"" + std::string(f.name) + "\":" + v));
  });
  EachField(*s.remote, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(json, HasSubstr("\"" + std::string(f.name) + "\":" + v));
  });
  EachField(s.attach, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(json, HasSubstr("\"" + std::string(f.name) + "\":" + v));
  });
  for (const WorkerStats& w : s.workers) {
    EachField(w, [&](const StatField& f, const std::string& v) {
      const std::string field = f.name;  // The text fields are quoted.
      const std::string value =
          field == "name" || field == "role" ? "\"" + v + "\"" : v;
      EXPECT_THAT(json, HasSubstr("\"" + std::string(f.name) + "\":" + value));
    });
  }
}

TEST(StatsFields, EveryNumericFieldIsAMetricWithItsHelp) {
  const CoordinatorStats s = NumberedStats();
  const std::string metrics = admin::FormatMetrics(s);
  auto check = [&](const char* prefix, const StatField& f, const std::string& v,
                   const std::string& labels) {
    if (f.kind == StatKind::kLabel) return;
    const std::string family = std::string("tierkv_") + prefix + "_" + f.name +
                               (f.kind == StatKind::kCounter ? "_total" : "");
    EXPECT_THAT(metrics, HasSubstr("# HELP " + family + " " + f.help + "\n"));
    EXPECT_THAT(metrics, HasSubstr("# TYPE " + family + " " +
                                   (f.kind == StatKind::kCounter ? "counter"
                                                                 : "gauge")));
    EXPECT_THAT(metrics, HasSubstr(family + labels + " " + v + "\n"));
  };
  // Every sample names its store and model.
  const std::string base = "store=\"s\",model=\"m\"";
  EachField(s.host, [&](const StatField& f, const std::string& v) {
    check("host", f, v, "{" + base + "}");
  });
  EachField(*s.disk, [&](const StatField& f, const std::string& v) {
    check("disk", f, v, "{" + base + "}");
  });
  EachField(*s.remote, [&](const StatField& f, const std::string& v) {
    check("remote", f, v, "{" + base + "}");
  });
  EachField(s.attach, [&](const StatField& f, const std::string& v) {
    check("workers", f, v, "{" + base + "}");
  });
  for (const WorkerStats& w : s.workers) {
    const std::string labels = "{" + base + ",worker=\"" +
                               std::to_string(w.id) + "\",name=\"" + w.name +
                               "\"}";
    EachField(w, [&](const StatField& f, const std::string& v) {
      check("worker", f, v, labels);
    });
  }
}

TEST(StatsFields, AllListsEveryFieldWithItsHelp) {
  const CoordinatorStats s = NumberedStats();
  const std::string all = admin::FormatStatsFields(s);
  EachField(s.host, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(all, HasSubstr(f.name));
    EXPECT_THAT(all, HasSubstr(" " + v + "  " + f.help));
  });
  EachField(*s.disk, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(all, HasSubstr(" " + v + "  " + f.help));
  });
  EachField(*s.remote, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(all, HasSubstr(" " + v + "  " + f.help));
  });
  EachField(s.attach, [&](const StatField& f, const std::string& v) {
    EXPECT_THAT(all, HasSubstr(" " + v + "  " + f.help));
  });
}

// The table's hit rates are each tier's own: host over every block looked
// up, disk over the blocks host did not hold; not a rate of all lookups.
TEST(StatsTable, EachTierHitRateIsOverItsOwnLookups) {
  CoordinatorStats s;
  s.host.lookup_blocks = 100;
  s.host.hit_blocks = 60;
  s.host.disk_hit_blocks = 30;
  s.host.miss_blocks = 10;
  s.host.spills_in_flight = 2;
  s.host.promotions_in_flight = 1;
  s.disk.emplace().keys = 500;  // Written, not flushed to files yet.
  const std::string table = admin::FormatStatsTable(s);
  EXPECT_THAT(table, ::testing::ContainsRegex(
                         "host .* 60 +40 +60\\.0% .* transfers 0\n"));
  EXPECT_THAT(table,
              ::testing::ContainsRegex(
                  "disk .* 30 +10 +75\\.0% .* spills 2, promotions 1\n"));
  EXPECT_THAT(table, HasSubstr("500 blocks in files not flushed yet;"));
  s.disk->file_bytes = 2048;
  EXPECT_THAT(admin::FormatStatsTable(s),
              HasSubstr("500 blocks in 2.0 KiB of files;"));
}

TEST(StatsTable, WatchShowsRatesPerSecond) {
  CoordinatorStats before, after;
  before.host.lookups = 10;
  after.host.lookups = 30;
  after.host.stores_completed = 5;
  before.disk.emplace();
  after.disk.emplace().evictions = 8;
  const std::string rates = admin::FormatRates(before, after, 2.0);
  EXPECT_THAT(rates, HasSubstr("per second: lookups 10.0,"));
  EXPECT_THAT(rates, HasSubstr("stored 2.5,"));
  EXPECT_THAT(rates, HasSubstr("disk evictions 4.0\n"));
}

TEST(AdminKeys, ParsesTokenIdsInCommonShapes) {
  for (const char* text : {"1 2 3", "1,2,3", "[1, 2, 3]\n", " 1\t2 ,3 "}) {
    auto tokens = admin::ParseTokenIds(text);
    ASSERT_THAT(tokens, IsOk()) << text;
    EXPECT_EQ(*tokens, (std::vector<TokenId>{1, 2, 3})) << text;
  }
  for (const char* text : {"1 x 3", "4294967296", "-1", "1.5"}) {
    auto tokens = admin::ParseTokenIds(text);
    EXPECT_FALSE(tokens.ok()) << text;
    EXPECT_THAT(tokens.status().message(), HasSubstr("token id '")) << text;
  }
}

// tierkv-admin held: one line per key and tier, the remote tier's apart
// from the disk tier's, and a '#' line for each list cut at the bound.
TEST(AdminHeld, ListsEachTierAndSaysWhereAListIsCut) {
  const BlockKey a{.lo = 1, .hi = 2}, b{.lo = 3, .hi = 4}, c{.lo = 5, .hi = 6};
  const HeldKeys held{.host_total = 1,
                      .disk_total = 3,
                      .remote_total = 1,
                      .host = {a},
                      .disk = {b},
                      .remote = {c}};
  EXPECT_EQ(admin::FormatHeldKeys(held),
            "CPU " + a.ToHex() + "\nDISK " + b.ToHex() + "\nREMOTE " +
                c.ToHex() + "\n# disk: 1 of 3 keys listed\n");
  EXPECT_EQ(admin::FormatHeldKeysJson(held),
            "{\"host_total\":1,\"disk_total\":3,\"remote_total\":1,"
            "\"host\":[\"" +
                a.ToHex() + "\"],\"disk\":[\"" + b.ToHex() +
                "\"],\"remote\":[\"" + c.ToHex() + "\"]}\n");
}

}  // namespace
}  // namespace tierkv
