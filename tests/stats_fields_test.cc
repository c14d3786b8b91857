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
  s.model = "m";
  s.version = "v";
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
  EXPECT_EQ(reply->stats.workers, sent.workers);
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
  for (const WorkerStats& w : s.workers) {
    EachField(w, [&](const StatField& f, const std::string& v) {
      const std::string value =
          std::string(f.name) == "name" ? "\"" + v + "\"" : v;
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
  EachField(s.host, [&](const StatField& f, const std::string& v) {
    check("host", f, v, "");
  });
  EachField(*s.disk, [&](const StatField& f, const std::string& v) {
    check("disk", f, v, "");
  });
  for (const WorkerStats& w : s.workers) {
    const std::string labels =
        "{worker=\"" + std::to_string(w.id) + "\",name=\"" + w.name + "\"}";
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
}

}  // namespace
}  // namespace tierkv
