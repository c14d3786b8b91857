// tierkvd's Prometheus endpoint (--metrics-listen) and what it exports: a
// real tierkvd scraped over real TCP; every number of tierkv-admin stats
// --json is a metric with the same value; the Grafana dashboard asks for
// exported series only; tierkv-admin keys prints the keys a worker stored.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

// Boost.PropertyTree's JSON parser still includes <boost/bind.hpp>, which
// asks for this to keep its placeholders global without a warning.
#define BOOST_BIND_GLOBAL_PLACEHOLDERS
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "ipc/unique_fd.h"
#include "tests/tierkvd_fixture.h"
#include "tierkv/stats.h"
#include "tierkv/version.h"
#include "tools/daemon/daemon_flags.h"

namespace tierkv {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Connects to 127.0.0.1:port; an invalid fd (and a test failure) if not.
ipc::UniqueFd ConnectTcp(uint16_t port) {
  ipc::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0)
      << std::strerror(errno);
  return fd;
}

// Sends `request` and reads the response until tierkvd closes the
// connection (each response closes it), or 10 s pass.
std::string Exchange(uint16_t port, const std::string& request) {
  ipc::UniqueFd fd = ConnectTcp(port);
  EXPECT_EQ(send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[65536];
  for (;;) {
    pollfd p{.fd = fd.get(), .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 10'000) != 1) {
      ADD_FAILURE() << "no response within 10 s; so far: " << response;
      return response;
    }
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0) return response;
    response.append(buf, static_cast<size_t>(n));
  }
}

std::string Get(uint16_t port, const std::string& path) {
  return Exchange(port, "GET " + path +
                            " HTTP/1.1\r\nHost: localhost\r\nUser-Agent: "
                            "test\r\n\r\n");
}

std::string Body(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

// One sample of the exposition text.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The exposition text's samples and its families' types (# TYPE lines).
struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;

  // The value of the one sample of `name` whose labels include `labels`;
  // nullopt when there is none.
  std::optional<double> Value(
      const std::string& name,
      const std::map<std::string, std::string>& labels = {}) const {
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      if (match) return s.value;
    }
    return std::nullopt;
  }
};

Exposition Parse(const std::string& text) {
  Exposition out;
  std::istringstream lines(text);
  std::string line;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$)");
  const std::regex label(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  while (std::getline(lines, line)) {
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      out.types[name] = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not a sample line: " << line;
      continue;
    }
    Sample s{.name = m[1], .labels = {}, .value = std::stod(m[4])};
    const std::string labels = m[3];
    for (std::sregex_iterator it(labels.begin(), labels.end(), label), end;
         it != end; ++it) {
      s.labels[(*it)[1]] = (*it)[2];
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

// The family a sample belongs to: histograms' _bucket, _sum and _count
// series are their family's.
std::string FamilyOf(const std::string& series,
                     const std::map<std::string, std::string>& types) {
  if (types.contains(series)) return series;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (series.ends_with(suffix)) {
      const std::string base =
          series.substr(0, series.size() - std::strlen(suffix));
      auto it = types.find(base);
      if (it != types.end() && it->second == "histogram") return base;
    }
  }
  return "";
}

class MetricsHttpTest : public TierkvdFixture {
 protected:
  // Starts tierkvd over a disk tier with --metrics-listen 127.0.0.1:0 and
  // learns the port it logs.
  void StartWithMetrics(const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"--metrics-listen", "127.0.0.1:0"};
    args.insert(args.end(), more.begin(), more.end());
    StartDaemonWithDisk(16, args);
    ASSERT_TRUE(daemon_->WaitForOutput("metrics: serving http://127.0.0.1:"))
        << daemon_->output();
    std::smatch m;
    const std::string out = daemon_->output();
    ASSERT_TRUE(std::regex_search(
        out, m, std::regex(R"(metrics: serving http://127\.0\.0\.1:(\d+)/)")))
        << out;
    port_ = static_cast<uint16_t>(std::stoi(m[1]));
  }
  std::string AdminJson() {
    auto json = Spawn({TIERKV_ADMIN_PATH, "stats", "--json", "--source",
                       "socket", "--socket", socket_});
    EXPECT_EQ(json->Wait(), 0) << json->output();
    return json->output();
  }

  uint16_t port_ = 0;
};

TEST_F(MetricsHttpTest, ServesLabelledMetricsOverHttp) {
  StartWithMetrics({"--model", "m-1"});
  const std::string response = Get(port_, "/metrics");
  ASSERT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(response,
              HasSubstr("Content-Type: text/plain; version=0.0.4\r\n"));
  const std::string body = Body(response);
  EXPECT_THAT(
      response,
      HasSubstr("Content-Length: " + std::to_string(body.size()) + "\r\n"));
  const Exposition e = Parse(body);
  ASSERT_GT(e.samples.size(), 50u);
  for (const Sample& s : e.samples) {
    EXPECT_EQ(s.labels.count("store"), 1u) << s.name;
    EXPECT_EQ(s.labels.at("store"), store_) << s.name;
    EXPECT_EQ(s.labels.count("model"), 1u) << s.name;
    EXPECT_EQ(s.labels.at("model"), "m-1") << s.name;
    EXPECT_NE(FamilyOf(s.name, e.types), "") << s.name << " has no # TYPE";
  }
  EXPECT_EQ(e.Value("tierkv_build_info", {{"version", std::string(Version())}}),
            1);
  for (const char* family : {"tierkv_spill_seconds", "tierkv_promotion_seconds",
                             "tierkv_event_seconds"}) {
    EXPECT_EQ(e.types.at(family), "histogram") << family;
  }
  for (const char* family :
       {"tierkv_workers_attached_total", "tierkv_workers_detached_total",
        "tierkv_workers_refused_total", "tierkv_host_lookups_total",
        "tierkv_disk_file_bytes", "tierkv_disk_payload_bytes_written_total",
        "tierkv_disk_stored_bytes_written_total",
        "tierkv_host_spill_drops_total", "tierkv_disk_dropped_on_open",
        "tierkv_disk_layout_mismatches", "tierkv_disk_token_mismatches_total",
        "tierkv_disk_put_failures_total"}) {
    EXPECT_TRUE(e.types.contains(family)) << family;
  }
}

TEST_F(MetricsHttpTest, EveryJsonNumberIsAMetricOfTheSameValue) {
  StartWithMetrics();
  // Spills, promotions and a worker that stays: every section has numbers.
  auto fill = ManyWorker("fill", 1, 40);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  auto verify = ManyWorker("verify", 1, 40);
  ASSERT_EQ(verify->Wait(), 0) << verify->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  const CoordinatorStats settled = SettledStats(*observer);
  ASSERT_GT(settled.host.spills, 0u);
  ASSERT_GT(settled.host.promotions, 0u);

  boost::property_tree::ptree json;
  std::istringstream json_text(AdminJson());
  boost::property_tree::read_json(json_text, json);
  const Exposition e = Parse(Body(Get(port_, "/metrics")));
  EXPECT_EQ(json.get<std::string>("store"), store_);
  EXPECT_GT(json.get<double>("events.spills_finished"), 0);
  EXPECT_GT(json.get<double>("events.promotions_finished"), 0);
  // fill, verify and observer came; fill and verify left.
  EXPECT_GE(json.get<double>("attach.attached"), 3);
  EXPECT_GE(json.get<double>("attach.detached"), 2);

  // A table field's family: tierkv_<prefix>_<field>[_total].
  auto field = [&](const std::string& prefix, const std::string& key) {
    const std::string name = "tierkv_" + prefix + "_" + key;
    return e.types.contains(name) ? name : name + "_total";
  };
  using Labels = std::map<std::string, std::string>;
  const std::map<std::string, std::pair<std::string, Labels>> events = {
      {"in_flight", {"tierkv_host_events_in_flight", {}}},
      {"oldest_age_us", {"tierkv_oldest_event_age_seconds", {}}},
      {"loads_completed", {"tierkv_event_seconds_count", {{"kind", "load"}}}},
      {"load_us_sum", {"tierkv_event_seconds_sum", {{"kind", "load"}}}},
      {"stores_completed", {"tierkv_event_seconds_count", {{"kind", "store"}}}},
      {"store_us_sum", {"tierkv_event_seconds_sum", {{"kind", "store"}}}},
      {"spills_finished", {"tierkv_spill_seconds_count", {}}},
      {"spill_us_sum", {"tierkv_spill_seconds_sum", {}}},
      {"promotions_finished", {"tierkv_promotion_seconds_count", {}}},
      {"promotion_us_sum", {"tierkv_promotion_seconds_sum", {}}},
  };
  std::set<std::string> worker_labels;
  const WorkerStats no_worker;
  WorkerStats::ForEachField(no_worker, [&](const StatField& f, const auto&) {
    if (f.kind == StatKind::kLabel) worker_labels.insert(f.name);
  });
  int checked = 0;
  auto check = [&](const std::string& path, const std::string& text,
                   const std::string& metric,
                   const std::map<std::string, std::string>& labels,
                   double scale) {
    std::optional<double> got = e.Value(metric, labels);
    ASSERT_TRUE(got.has_value()) << path << ": no metric " << metric;
    EXPECT_NEAR(*got * scale, std::stod(text), 1e-6 * std::stod(text) + 1e-6)
        << path << " vs " << metric;
    ++checked;
  };
  for (const auto& [section, body] : json) {
    if (section == "store" || section == "model" || section == "version") {
      continue;
    }
    if (section == "tiers") {
      for (const auto& [tier, fields] : body) {
        for (const auto& [key, value] : fields) {
          if (tier == "host" && key == "capacity_bytes") {
            check("tiers.host.capacity_bytes", value.data(),
                  "tierkv_tier_capacity_bytes", {{"tier", "host"}}, 1);
          } else {
            check("tiers." + tier + "." + key, value.data(), field(tier, key),
                  {}, 1);
          }
        }
      }
    } else if (section == "events") {
      for (const auto& [key, value] : body) {
        auto it = events.find(key);
        ASSERT_NE(it, events.end()) << "events." << key << " has no metric";
        const bool seconds = key.ends_with("_us") || key.ends_with("_us_sum");
        check("events." + key, value.data(), it->second.first,
              it->second.second, seconds ? 1e6 : 1);
      }
    } else if (section == "attach") {
      for (const auto& [key, value] : body) {
        check("attach." + key, value.data(), field("workers", key), {}, 1);
      }
    } else if (section == "workers") {
      for (const auto& [unused, worker] : body) {
        const std::string id = worker.get<std::string>("id");
        for (const auto& [key, value] : worker) {
          if (worker_labels.contains(key)) continue;
          check("workers[" + id + "]." + key, value.data(),
                field("worker", key), {{"worker", id}}, 1);
        }
      }
    } else {
      ADD_FAILURE() << "stats --json section '" << section
                    << "' is not checked against the metrics";
    }
  }
  EXPECT_GT(checked, 60);
}

TEST_F(MetricsHttpTest, AnswersNotFoundAndMethodNotAllowed) {
  StartWithMetrics();
  EXPECT_THAT(Get(port_, "/other"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(Get(port_, "/"), StartsWith("HTTP/1.1 404 Not Found\r\n"));
  const std::string post =
      Exchange(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD\r\n"));
  EXPECT_THAT(Exchange(port_, "garbage\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  // Query strings do not change the path.
  EXPECT_THAT(Get(port_, "/metrics?x=1"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsHttpTest, SilentClientsDoNotBlockAScrape) {
  StartWithMetrics();
  // More idle connections than tierkvd keeps open: each new one closes the
  // oldest, and none holds the thread that answers.
  std::vector<ipc::UniqueFd> silent;
  for (int i = 0; i < 40; ++i) silent.push_back(ConnectTcp(port_));
  // Half a request, never finished.
  const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  ASSERT_EQ(send(silent.back().get(), half.data(), half.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(half.size()));
  const std::string response = Get(port_, "/metrics");
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(Body(response), HasSubstr("tierkv_build_info{"));
  // Accepted before the scrape, in order: the oldest are closed (EOF), the
  // newest 15 (16 with the scrape's) are still open.
  auto closed = [](const ipc::UniqueFd& fd) {
    char byte;
    return recv(fd.get(), &byte, 1, MSG_DONTWAIT) == 0;
  };
  for (size_t i = 0; i < silent.size(); ++i) {
    EXPECT_EQ(closed(silent[i]), i < silent.size() - 15) << i;
  }
  // And the socket's clients are served meanwhile.
  std::unique_ptr<Client> client = Attach("during");
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->Stats(), IsOk());
}

TEST_F(MetricsHttpTest, AFailingPollDropsTheScrapesAndServesOn) {
  StartDaemon("1M", {"--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(daemon_->WaitForOutput("metrics: serving http://127.0.0.1:"))
      << daemon_->output();
  std::smatch m;
  const std::string out = daemon_->output();
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(metrics: serving http://127\.0\.0\.1:(\d+)/)")));
  const auto port = static_cast<uint16_t>(std::stoi(m[1]));
  std::vector<ipc::UniqueFd> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(ConnectTcp(port));
  // Served after the idle ones were accepted (the same round or later).
  ASSERT_THAT(Get(port, "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
  const pid_t pid = daemon_->pid();
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  const rlimit before = limit;
  // Fewer descriptors than the metrics thread watches (its wake pipe, its
  // socket and four scrapes): poll fails with EINVAL, and dropping the
  // scrapes lets it work again, the limit still lowered.
  limit.rlim_cur = 3;
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &limit, nullptr), 0);
  ASSERT_TRUE(daemon_->WaitForOutput("dropping 4 scrapes"))
      << daemon_->output();
  ASSERT_TRUE(daemon_->WaitForOutput("metrics: poll works again"))
      << daemon_->output();
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &before, nullptr), 0);
  EXPECT_THAT(Get(port, "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
  // The dropped scrapes were closed.
  for (const ipc::UniqueFd& fd : idle) {
    char c;
    EXPECT_EQ(recv(fd.get(), &c, 1, 0), 0);
  }
}

TEST_F(MetricsHttpTest, OversizedRequestIsRefused) {
  StartWithMetrics();
  const std::string big =
      "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(16 * 1024, 'a') +
      "\r\n\r\n";
  EXPECT_THAT(Exchange(port_, big),
              StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  // tierkvd still answers.
  EXPECT_THAT(Get(port_, "/metrics"), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsHttpTest, CountsAttachDetachAndRefusals) {
  StartWithMetrics({"--model", "right"});
  {
    std::unique_ptr<Client> client = Attach("a", "right");
    ASSERT_NE(client, nullptr);
  }
  auto wrong = Client::Open(ClientOptionsFor("b", "wrong"));
  EXPECT_FALSE(wrong.ok());
  std::unique_ptr<Client> observer = Attach("observer", "right");
  ASSERT_NE(observer, nullptr);
  const CoordinatorStats s = SettledStats(*observer);
  EXPECT_EQ(s.attach.attached, 2u);
  EXPECT_EQ(s.attach.detached, 1u);
  EXPECT_EQ(s.attach.refused_mismatch, 1u);
  EXPECT_EQ(s.attach.refused, 1u);
  const Exposition e = Parse(Body(Get(port_, "/metrics")));
  EXPECT_EQ(e.Value("tierkv_workers_refused_mismatch_total"), 1);
  EXPECT_EQ(e.Value("tierkv_workers_attached_total"), 2);
}

TEST_F(MetricsHttpTest, BusyPortIsAClearError) {
  // A port this test holds.
  ipc::UniqueFd holder(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(
      bind(holder.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(holder.get(), 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(holder.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  std::vector<std::string> args = DaemonArgs("1M");
  args.insert(args.end(), {"--metrics-listen", port});
  auto daemon = Spawn(args);
  EXPECT_NE(daemon->Wait(), 0);
  EXPECT_THAT(daemon->output(),
              HasSubstr("--metrics-listen 127.0.0.1:" + port +
                        ": cannot listen: Address already in use (choose "
                        "another port, or 0 for any free one)"));
}

TEST(MetricsHttpFlags, PortAloneListensOnLoopback) {
  auto port = daemon::ParseMetricsListen("9464");
  ASSERT_THAT(port, IsOk());
  EXPECT_EQ(port->host, "127.0.0.1");
  EXPECT_EQ(port->port, 9464);
  auto any = daemon::ParseMetricsListen("0.0.0.0:80");
  ASSERT_THAT(any, IsOk());
  EXPECT_EQ(any->host, "0.0.0.0");
  auto v6 = daemon::ParseMetricsListen("[::1]:0");
  ASSERT_THAT(v6, IsOk());
  EXPECT_EQ(v6->host, "::1");
  for (const char* bad : {"", "x", "1:2:", "127.0.0.1:65536", ":80"}) {
    auto parsed = daemon::ParseMetricsListen(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("--metrics-listen"));
  }
}

// Every series a panel of tools/grafana/tierkv.json asks for is one that
// tierkvd exports (names in its PromQL expressions that start tierkv_).
TEST_F(MetricsHttpTest, GrafanaDashboardUsesExportedSeries) {
  StartWithMetrics();
  const Exposition e = Parse(Body(Get(port_, "/metrics")));
  std::ifstream file(TIERKV_GRAFANA_DASHBOARD);
  ASSERT_TRUE(file.good()) << TIERKV_GRAFANA_DASHBOARD;
  boost::property_tree::ptree dashboard;
  boost::property_tree::read_json(file, dashboard);
  std::vector<std::string> exprs;
  std::function<void(const boost::property_tree::ptree&)> walk =
      [&](const boost::property_tree::ptree& node) {
        for (const auto& [key, child] : node) {
          if (key == "expr") exprs.push_back(child.data());
          walk(child);
        }
      };
  walk(dashboard);
  ASSERT_GT(exprs.size(), 8u);
  const std::regex name(R"(\btierkv_[a-z0-9_]+)");
  int names = 0;
  for (const std::string& expr : exprs) {
    for (std::sregex_iterator it(expr.begin(), expr.end(), name), end;
         it != end; ++it) {
      EXPECT_NE(FamilyOf(it->str(), e.types), "")
          << it->str() << " in " << expr << " is not exported";
      ++names;
    }
  }
  EXPECT_GT(names, 8);
}

// tierkv-admin keys prints the keys a worker stored a prompt under: evict
// of a printed key drops that block.
TEST_F(MetricsHttpTest, AdminKeysPrintsTheKeysAWorkerStored) {
  StartWithMetrics({"--log-level", "debug"});
  auto fill = ManyWorker("fill", 1, 4);
  ASSERT_EQ(fill->Wait(), 0) << fill->output();
  std::unique_ptr<Client> observer = Attach("observer");
  ASSERT_NE(observer, nullptr);
  (void)SettledStats(*observer);
  // fill's request 2 of seed 1 (worker_main.cc): 16 tokens.
  std::vector<std::string> args = {TIERKV_ADMIN_PATH, "keys", "--socket",
                                   socket_};
  for (uint32_t i = 0; i < 16; ++i) {
    args.push_back(std::to_string((1 * 1000003u + 2 * 4099u) * 16u + i));
  }
  args.push_back("7");  // Past the last full block: no key.
  auto keys = Spawn(args);
  ASSERT_EQ(keys->Wait(), 0) << keys->output();
  const std::string out = keys->output();
  ASSERT_GE(out.size(), 32u) << out;
  const std::string key = out.substr(0, 32);
  EXPECT_THAT(out, HasSubstr("  block 0: tokens 0..15\n"));
  EXPECT_THAT(out, HasSubstr("(1 token after the last full block of 16"));
  // tierkvd logged it when the store completed, at debug level.
  EXPECT_TRUE(daemon_->WaitForOutput("block " + key + ": stored"))
      << daemon_->output();
  auto evict = Spawn({TIERKV_ADMIN_PATH, "evict", key, "--socket", socket_});
  ASSERT_EQ(evict->Wait(), 0) << evict->output();
  EXPECT_THAT(evict->output(), HasSubstr(key + "  dropped from host"));
}

}  // namespace
}  // namespace tierkv
