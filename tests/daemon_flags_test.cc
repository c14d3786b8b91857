// tierkvd's flags and its --config file: what the file sets, what the
// command line overrides, and errors that name the file, line and key.
#include "tools/daemon/daemon_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/status_matchers.h"

namespace tierkv::daemon {
namespace {

using ::testing::HasSubstr;

class DaemonFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daemon_flags_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_ = dir_ + "/tierkvd.conf";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void WriteConfig(const std::string& text) { std::ofstream(config_) << text; }
  static StatusOr<DaemonCommand> Parse(std::vector<std::string> args) {
    std::vector<const char*> argv = {"tierkvd"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    return ParseDaemonFlags(static_cast<int>(argv.size()), argv.data());
  }
  // The message of a parse that must fail.
  static std::string Error(std::vector<std::string> args) {
    auto command = Parse(std::move(args));
    EXPECT_FALSE(command.ok());
    EXPECT_EQ(command.status().code(), StatusCode::kInvalidArgument);
    return command.ok() ? "" : command.status().message();
  }

  std::string dir_, config_;
};

constexpr char kLayout[] = "layers = 2\nkv-heads = 4\nhead-dim = 64\n";

TEST_F(DaemonFlagsTest, DefaultsWithoutConfig) {
  auto command =
      Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->server.host_capacity_bytes, size_t{1} << 30);
  EXPECT_EQ(command->log_file, "");
  EXPECT_EQ(command->stop_timeout, std::chrono::seconds(10));
  EXPECT_EQ(command->log_level, "info");
  EXPECT_EQ(command->server.model, "");  // The unnamed model.
  EXPECT_EQ(command->server.eviction, kDefaultTierEviction);
}

TEST_F(DaemonFlagsTest, EvictionPolicyByFlagAndFileAndBadOnesNamed) {
  auto flag = Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--eviction-policy", "lru"});
  ASSERT_THAT(flag, IsOk());
  EXPECT_EQ(flag->server.eviction, EvictionPolicy::kLru);
  WriteConfig(std::string(kLayout) + "eviction-policy = arc\n");
  auto file = Parse({"--config", config_});
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->server.eviction, EvictionPolicy::kArc);
  WriteConfig(std::string(kLayout) + "eviction-policy = lfu\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: eviction-policy: eviction policy must "
                                  "be lru or arc, got 'lfu'"));
}

TEST_F(DaemonFlagsTest, ConfigFileSetsEveryKindOfOption) {
  WriteConfig(
      "# tierkvd settings\n"
      "\n"
      "store = prod\n"
      "model = org/model-7b@v2\n"
      "socket = /run/tierkv/prod.sock\n"
      "host-capacity = 2G   # two GiB\n"
      "layers = 32\n"
      "  kv-heads=8\n"
      "head-dim = 128\n"
      "block-size = 32\n"
      "dtype = f16\n"
      "mode = 0660\n"
      "max-workers = 8\n"
      "log-level = debug\n"
      "log-file = /var/log/tierkv/tierkvd.log\n"
      "stop-timeout = 3\n"
      "stats-interval-ms = 250\n");
  auto command = Parse({"--config", config_});
  ASSERT_THAT(command, IsOk());
  const ipc::ServerOptions& s = command->server;
  EXPECT_EQ(s.store, "prod");
  EXPECT_EQ(s.model, "org/model-7b@v2");
  EXPECT_EQ(s.socket_path, "/run/tierkv/prod.sock");
  EXPECT_EQ(s.host_capacity_bytes, size_t{2} << 30);
  EXPECT_EQ(s.layout.num_layers, 32);
  EXPECT_EQ(s.layout.num_kv_heads, 8);
  EXPECT_EQ(s.layout.head_dim, 128);
  EXPECT_EQ(s.layout.block_size, 32);
  EXPECT_EQ(s.layout.dtype, DType::kF16);
  EXPECT_EQ(s.mode, 0660u);
  EXPECT_EQ(s.max_workers, 8u);
  EXPECT_EQ(command->log_level, "debug");
  EXPECT_EQ(command->log_file, "/var/log/tierkv/tierkvd.log");
  EXPECT_EQ(command->stop_timeout, std::chrono::seconds(3));
  EXPECT_EQ(s.stats_interval, std::chrono::milliseconds(250));
}

TEST_F(DaemonFlagsTest, CommandLineWinsOverTheFile) {
  WriteConfig(std::string(kLayout) + "host-capacity = 2G\ndtype = f16\n");
  // Before and after --config alike.
  for (auto args : std::vector<std::vector<std::string>>{
           {"--host-capacity", "512M", "--config", config_},
           {"--config", config_, "--host-capacity", "512M"}}) {
    auto command = Parse(args);
    ASSERT_THAT(command, IsOk());
    EXPECT_EQ(command->server.host_capacity_bytes, size_t{512} << 20);
    EXPECT_EQ(command->server.layout.dtype, DType::kF16);  // From the file.
    EXPECT_EQ(command->server.layout.num_layers, 2);
  }
}

TEST_F(DaemonFlagsTest, WorkerCapsAndVerifyLoads) {
  auto defaults =
      Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64"});
  ASSERT_THAT(defaults, IsOk());
  EXPECT_EQ(defaults->server.caps.worker_pin_share, 0.5);
  EXPECT_EQ(defaults->server.caps.uid_pin_share, 0.75);
  EXPECT_EQ(defaults->server.caps.max_request_bytes_per_worker,
            size_t{256} << 20);
  EXPECT_FALSE(defaults->server.verify_on_load);
  auto command = Parse({"--layers",
                        "2",
                        "--kv-heads",
                        "4",
                        "--head-dim",
                        "64",
                        "--worker-pin-share",
                        "0.25",
                        "--uid-pin-share",
                        "0.5",
                        "--max-requests-per-worker",
                        "10",
                        "--max-request-bytes-per-worker",
                        "64M",
                        "--max-events-per-worker",
                        "20",
                        "--max-workers-per-uid",
                        "3",
                        "--max-tenants-per-uid",
                        "2",
                        "--verify-loads"});
  ASSERT_THAT(command, IsOk());
  const ipc::ServerOptions& s = command->server;
  EXPECT_EQ(s.caps.worker_pin_share, 0.25);
  EXPECT_EQ(s.caps.uid_pin_share, 0.5);
  EXPECT_EQ(s.caps.max_requests_per_worker, 10u);
  EXPECT_EQ(s.caps.max_request_bytes_per_worker, size_t{64} << 20);
  EXPECT_EQ(s.caps.max_events_per_worker, 20u);
  EXPECT_EQ(s.caps.max_workers_per_uid, 3u);
  EXPECT_EQ(s.caps.max_tenants_per_uid, 2u);
  EXPECT_TRUE(s.verify_on_load);
  WriteConfig(std::string(kLayout) + "verify-loads = true\n");
  auto from_file = Parse({"--config", config_});
  ASSERT_THAT(from_file, IsOk());
  EXPECT_TRUE(from_file->server.verify_on_load);
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--worker-pin-share", "0"}),
              HasSubstr("--worker-pin-share must be in (0, 1]"));
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--uid-pin-share", "1.5"}),
              HasSubstr("--uid-pin-share must be in (0, 1]"));
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--max-request-bytes-per-worker", "0"}),
              HasSubstr("at least 1 byte"));
  // A negative count parses as a huge one: refused, not a lifted cap.
  for (const char* flag :
       {"--max-requests-per-worker", "--max-events-per-worker",
        "--max-workers-per-uid", "--max-tenants-per-uid",
        "--max-pending-connections"}) {
    SCOPED_TRACE(flag);
    const std::string error = Error(
        {"--layers", "2", "--kv-heads", "4", "--head-dim", "64", flag, "-1"});
    EXPECT_THAT(error, HasSubstr(std::string(flag) + " '"));
    EXPECT_THAT(error, HasSubstr("' must be "));
  }
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--max-requests-per-worker", "0"}),
              HasSubstr("must be 1 to 1048576"));
}

TEST_F(DaemonFlagsTest, KvEventsOffByDefaultAndSetByFlagOrFile) {
  auto command =
      Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->kv_events.endpoint, "");  // No events.
  EXPECT_EQ(command->kv_events.replay_endpoint, "");
  EXPECT_EQ(command->kv_events.topic, "");  // vLLM's default topic.
  EXPECT_EQ(command->kv_events.buffer_steps, 10000u);
  EXPECT_EQ(command->kv_events.max_queue_events, 100000u);
  EXPECT_EQ(command->kv_events.hash_format, "int");  // vLLM's default form.

  WriteConfig(std::string(kLayout) +
              "kv-events-endpoint = tcp://*:5557\n"
              "kv-events-replay-endpoint = tcp://*:5558\n"
              "kv-events-topic = kv\n"
              "kv-events-buffer-steps = 50\n"
              "kv-events-hash-format = bytes\n");
  command = Parse({"--config", config_, "--kv-events-queue", "7"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->kv_events.endpoint, "tcp://*:5557");
  EXPECT_EQ(command->kv_events.replay_endpoint, "tcp://*:5558");
  EXPECT_EQ(command->kv_events.topic, "kv");
  EXPECT_EQ(command->kv_events.buffer_steps, 50u);
  EXPECT_EQ(command->kv_events.max_queue_events, 7u);
  EXPECT_EQ(command->kv_events.hash_format, "bytes");
}

TEST_F(DaemonFlagsTest, RemoteTierOffByDefaultAndSetByFlagOrFile) {
  auto command =
      Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->server.remote_redis, "");  // No remote tier.
  EXPECT_EQ(command->server.remote_tenant, "default");
  EXPECT_EQ(command->server.remote_ttl, std::chrono::milliseconds(0));
  EXPECT_EQ(command->server.remote_capacity_bytes, 0u);
  EXPECT_EQ(command->server.remote_scan_interval,
            std::chrono::milliseconds(1000));
  EXPECT_EQ(command->server.remote_placement, RemotePlacement::kBeside);

  WriteConfig(std::string(kLayout) +
              "remote-redis = 127.0.0.1:7000,127.0.0.1:7001\n"
              "remote-tenant = team-a\n"
              "remote-ttl = 3600\n"
              "remote-capacity = 2G\n"
              "remote-placement = under\n"
              "disk-dir = /var/lib/tierkv/x\n");
  command = Parse({"--config", config_, "--remote-scan-interval-ms", "0"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->server.remote_redis, "127.0.0.1:7000,127.0.0.1:7001");
  EXPECT_EQ(command->server.remote_tenant, "team-a");
  EXPECT_EQ(command->server.remote_ttl, std::chrono::hours(1));
  EXPECT_EQ(command->server.remote_capacity_bytes, uint64_t{2} << 30);
  EXPECT_EQ(command->server.remote_scan_interval, std::chrono::milliseconds(0));
  EXPECT_EQ(command->server.remote_placement, RemotePlacement::kUnder);

  const std::vector<std::string> layout = {"--layers",   "2", "--kv-heads", "4",
                                           "--head-dim", "64"};
  auto with = [&layout](std::vector<std::string> more) {
    more.insert(more.begin(), layout.begin(), layout.end());
    return more;
  };
  EXPECT_THAT(Error(with({"--remote-tenant", "a b"})),
              HasSubstr("--remote-tenant"));
  EXPECT_THAT(Error(with({"--remote-ttl", "-1"})), HasSubstr("--remote-ttl"));
  EXPECT_THAT(Error(with({"--remote-capacity", "lots"})),
              HasSubstr("--remote-capacity"));
  EXPECT_THAT(Error(with({"--remote-scan-interval-ms", "-5"})),
              HasSubstr("--remote-scan-interval-ms"));
  EXPECT_THAT(Error(with({"--remote-redis", "nohost"})),
              HasSubstr("--remote-redis"));
  EXPECT_THAT(Error(with({"--remote-placement", "over"})),
              HasSubstr("--remote-placement 'over': beside or under"));
  // Under a disk tier that is not there.
  EXPECT_THAT(Error(with({"--remote-redis", "127.0.0.1:7000",
                          "--remote-placement", "under"})),
              HasSubstr("--disk-dir"));
}

TEST_F(DaemonFlagsTest, KvEventsBadValuesAreNamed) {
  const std::vector<std::string> layout = {"--layers",   "2", "--kv-heads", "4",
                                           "--head-dim", "64"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), layout.begin(), layout.end());
    return Error(more);
  };
  EXPECT_THAT(with({"--kv-events-replay-endpoint", "tcp://*:5558"}),
              HasSubstr("needs --kv-events-endpoint"));
  EXPECT_THAT(with({"--kv-events-endpoint", "tcp://*:5557",
                    "--kv-events-buffer-steps", "0"}),
              HasSubstr("--kv-events-buffer-steps '0'"));
  EXPECT_THAT(
      with({"--kv-events-endpoint", "tcp://*:5557", "--kv-events-queue", "0"}),
      HasSubstr("--kv-events-queue '0'"));
  EXPECT_THAT(
      with({"--kv-events-endpoint", "tcp://*:5557", "--kv-events-hash-format",
            "hex"}),
      HasSubstr("--kv-events-hash-format 'hex': expected int or bytes"));
  // The events group: an existing group, socket files to give it, and a
  // mode that lets it in.
  EXPECT_THAT(with({"--kv-events-endpoint", "ipc:///tmp/ev", "--mode", "0660",
                    "--kv-events-group", "no-such-group-tierkv"}),
              HasSubstr("no such group"));
  EXPECT_THAT(with({"--kv-events-group", "root", "--mode", "0660"}),
              HasSubstr("needs --kv-events-endpoint"));
  EXPECT_THAT(with({"--kv-events-endpoint", "ipc:///tmp/ev",
                    "--kv-events-group", "root"}),
              HasSubstr("--mode must give the group read and write"));
  EXPECT_THAT(with({"--kv-events-endpoint", "ipc:///tmp/ev",
                    "--kv-events-replay-endpoint", "ipc://*", "--mode", "0660",
                    "--kv-events-group", "root"}),
              HasSubstr("not an ipc:// socket file"));
}

TEST_F(DaemonFlagsTest, UnknownKeyNamesFileLineAndKey) {
  WriteConfig(std::string(kLayout) + "host-capacty = 2G\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: unknown key 'host-capacty'"));
}

TEST_F(DaemonFlagsTest, CommandLineOnlyOptionsAreUnknownKeysInTheFile) {
  WriteConfig(std::string(kLayout) + "config = /etc/other.conf\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: unknown key 'config'"));
}

TEST_F(DaemonFlagsTest, BadValuesNameFileLineAndKey) {
  WriteConfig("layers = two\nkv-heads = 4\nhead-dim = 64\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":1: layers = 'two' is not a valid value"));

  WriteConfig(std::string(kLayout) + "\nhost-capacity = 2Q\n");
  std::string error = Error({"--config", config_});
  EXPECT_THAT(error, HasSubstr(config_ + ":5: host-capacity: "));
  EXPECT_THAT(error, HasSubstr("unknown size unit in '2Q'"));

  WriteConfig(std::string(kLayout) + "dtype = f8\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: dtype 'f8': use f32, f16 or bf16"));

  WriteConfig(std::string(kLayout) + "mode = 0666\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: mode '0666'"));

  WriteConfig(std::string(kLayout) + "log-level = loud\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: log-level 'loud'"));

  WriteConfig(std::string(kLayout) + "stop-timeout = 0\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: stop-timeout '0': at least 1 second"));
  WriteConfig(std::string(kLayout) + "stats-interval-ms = 5\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: stats-interval-ms '5': 10 to 60000"));
  WriteConfig(std::string(kLayout) + "disk-codec = zstd\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: disk-codec 'zstd': use none, lz4"));

  WriteConfig(std::string(kLayout) + "disk-capacity = lots\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: disk-capacity: "));

  WriteConfig(std::string(kLayout) + "spill-high = 0.5\nspill-low = 0.8\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr("must satisfy 0 < low <= high <= 1"));

  WriteConfig(std::string(kLayout) + "disk-io-threads = 0\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: disk-io-threads must be 1 to 64"));
}

TEST_F(DaemonFlagsTest, ABadModelNameIsNamed) {
  WriteConfig(std::string(kLayout) + "model = " + std::string(129, 'm') + "\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: model: model name of 129 bytes"));
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--model", "caf\xc3\xa9"}),
              HasSubstr("--model: model name 'caf"));
  // '#' starts a comment in the config file: a name with one would be cut.
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--model", "org/m#rev"}),
              HasSubstr("without spaces or '#'"));
}

TEST_F(DaemonFlagsTest, MaxWorkersIsBoundedByWhatAStatsReplyLists) {
  WriteConfig(std::string(kLayout) + "max-workers = 5000\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: max-workers '5000': 1 to 4096"));
  WriteConfig(std::string(kLayout) + "max-workers = 0\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":4: max-workers '0'"));
}

TEST_F(DaemonFlagsTest, ABadFlagIsNamedAsTheFlagEvenWhenTheFileSetsItToo) {
  WriteConfig(std::string(kLayout) + "host-capacity = 2G\n");
  const std::string error =
      Error({"--config", config_, "--host-capacity", "2Q"});
  EXPECT_THAT(error, HasSubstr("--host-capacity: unknown size unit"));
  EXPECT_THAT(error, ::testing::Not(HasSubstr(config_)));
}

TEST_F(DaemonFlagsTest, MalformedLineAndRepeatedKeyNameTheirLines) {
  WriteConfig("layers = 2\nkv-heads 4\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":2: expected 'key = value', got "
                                  "'kv-heads 4'"));

  WriteConfig(std::string(kLayout) + "# again\nlayers = 3\n");
  EXPECT_THAT(Error({"--config", config_}),
              HasSubstr(config_ + ":5: layers is set twice (first at " +
                        config_ + ":1)"));
}

TEST_F(DaemonFlagsTest, UnreadableConfigIsNamed) {
  EXPECT_THAT(Error({"--config", dir_ + "/missing.conf"}),
              HasSubstr("--config " + dir_ +
                        "/missing.conf: cannot read: No such file"));
  EXPECT_THAT(Error({"--config", dir_}), HasSubstr("Is a directory"));
}

TEST_F(DaemonFlagsTest, RequiredLayoutFromNeitherIsAnError) {
  WriteConfig("layers = 2\nhead-dim = 64\n");
  EXPECT_THAT(Error({"--config", config_}), HasSubstr("kv-heads"));
}

TEST_F(DaemonFlagsTest, HelpListsConfigLogFileAndStopTimeout) {
  auto command = Parse({"--help"});
  ASSERT_THAT(command, IsOk());
  EXPECT_TRUE(command->show_help);
  EXPECT_THAT(command->help_text, HasSubstr("--config FILE"));
  EXPECT_THAT(command->help_text, HasSubstr("--log-file PATH"));
  EXPECT_THAT(command->help_text, HasSubstr("--stop-timeout arg (=10)"));
  EXPECT_THAT(command->help_text,
              HasSubstr("SIGHUP reopens --log-file and\nre-reads log-level "
                        "from --config"));
}

TEST_F(DaemonFlagsTest, RereadConfigReadsTheFileAgain) {
  WriteConfig(std::string(kLayout) + "log-level = info\n");
  auto command = Parse({"--config", config_});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->config_path, config_);
  EXPECT_FALSE(command->log_level_on_command_line);
  WriteConfig(std::string(kLayout) + "log-level = debug\n");
  EXPECT_EQ(RereadConfig(*command)->log_level, "debug");
  // Without the key: the default again.
  WriteConfig(kLayout);
  EXPECT_EQ(RereadConfig(*command)->log_level, "info");
}

TEST_F(DaemonFlagsTest, RereadConfigKeepsTheCommandLinesLevel) {
  WriteConfig(std::string(kLayout) + "log-level = info\n");
  auto command = Parse({"--log-level", "warn", "--config", config_});
  ASSERT_THAT(command, IsOk());
  EXPECT_TRUE(command->log_level_on_command_line);
  WriteConfig(std::string(kLayout) + "log-level = debug\n");
  EXPECT_EQ(RereadConfig(*command)->log_level, "warn");
}

TEST_F(DaemonFlagsTest, RereadConfigNamesTheLineOfABrokenFile) {
  WriteConfig(std::string(kLayout) + "log-level = info\n");
  auto command = Parse({"--config", config_});
  ASSERT_THAT(command, IsOk());
  WriteConfig(std::string(kLayout) + "log-level = loud\n");
  StatusOr<ConfigReread> level = RereadConfig(*command);
  ASSERT_FALSE(level.ok());
  EXPECT_THAT(level.status().message(),
              HasSubstr(config_ + ":4: log-level 'loud'"));
  WriteConfig(std::string(kLayout) + "log-level debug\n");
  EXPECT_THAT(RereadConfig(*command).status().message(),
              HasSubstr(config_ + ":4: expected 'key = value'"));
  std::filesystem::remove(config_);
  EXPECT_THAT(RereadConfig(*command).status().message(),
              HasSubstr("--config " + config_ + ": cannot read"));
}

TEST_F(DaemonFlagsTest, RereadConfigWithoutAConfigIsTheCommandLines) {
  auto command = Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                        "--log-level", "debug"});
  ASSERT_THAT(command, IsOk());
  EXPECT_EQ(command->config_path, "");
  EXPECT_EQ(RereadConfig(*command)->log_level, "debug");
}

TEST_F(DaemonFlagsTest, RereadConfigNamesTheSettingsThatWaitForARestart) {
  WriteConfig(std::string(kLayout) +
              "log-level = info\nhost-capacity = 64M\nspill-high = 0.8\n");
  auto command = Parse({"--config", config_, "--disk-capacity", "1G"});
  ASSERT_THAT(command, IsOk());
  StatusOr<ConfigReread> same = RereadConfig(*command);
  ASSERT_THAT(same, IsOk());
  EXPECT_THAT(same->needs_restart, ::testing::IsEmpty());

  // host-capacity changed, spill-high dropped, max-workers added,
  // log-level changed (applied), disk-capacity changed in the file but
  // set on the command line (the command line wins: no change at all).
  WriteConfig(std::string(kLayout) +
              "log-level = debug\nhost-capacity = 128M\nmax-workers = 8\n"
              "disk-capacity = 2G\n");
  StatusOr<ConfigReread> changed = RereadConfig(*command);
  ASSERT_THAT(changed, IsOk());
  EXPECT_EQ(changed->log_level, "debug");
  EXPECT_THAT(
      changed->needs_restart,
      ::testing::ElementsAre("host-capacity", "max-workers", "spill-high"));
}

TEST_F(DaemonFlagsTest, NamesEveryMissingLayoutFlagAtOnce) {
  EXPECT_THAT(Error({}), HasSubstr("missing --layers, --kv-heads, --head-dim"));
  EXPECT_THAT(Error({"--kv-heads", "4"}),
              HasSubstr("missing --layers, --head-dim: tierkvd needs the KV "
                        "layout"));
  WriteConfig("layers = 2\n");
  EXPECT_THAT(Error({"--config", config_, "--head-dim", "64"}),
              HasSubstr("missing --kv-heads:"));
}

TEST_F(DaemonFlagsTest, CapacitiesTooSmallForABlockNameTheirFlags) {
  // A block of this layout: 2 layers x 2 (K, V) x 4 heads x 64 x 16 tokens
  // x 2 bytes = 32 KiB.
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--host-capacity", "40K"}),
              HasSubstr("--host-capacity 40K: holds fewer than 2 blocks of "
                        "32768 bytes"));
  EXPECT_THAT(Error({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--disk-dir", dir_ + "/disk", "--disk-capacity", "0"}),
              HasSubstr("--disk-capacity 0: holds no block of 32768 bytes"));
  // Without a disk tier, --disk-capacity is not used.
  EXPECT_THAT(Parse({"--layers", "2", "--kv-heads", "4", "--head-dim", "64",
                     "--disk-capacity", "0"}),
              IsOk());
}

TEST_F(DaemonFlagsTest, ExampleConfigShowsEveryOptionWithItsDefault) {
  // systemd/tierkvd.conf: "# key = value" for each option.
  std::ifstream example(TIERKV_EXAMPLE_CONFIG);
  ASSERT_TRUE(example.good()) << TIERKV_EXAMPLE_CONFIG;
  const std::regex setting(R"(^# ([a-z-]+) = (.*)$)");
  std::set<std::string> keys;
  std::string line, uncommented;
  for (std::smatch m; std::getline(example, line);) {
    if (!std::regex_match(line, m, setting)) continue;
    keys.insert(m[1]);
    // The example's groups need not exist on this machine.
    if (m[1] != "group" && m[1] != "admin-group" && m[1] != "kv-events-group")
      uncommented += m[1].str() + " = " + m[2].str() + "\n";
  }
  auto help = Parse({"--help"});
  ASSERT_THAT(help, IsOk());
  const std::regex flag("--([a-z][a-z-]*)");
  int flags = 0;
  for (std::sregex_iterator
           it(help->help_text.begin(), help->help_text.end(), flag),
       end;
       it != end; ++it) {
    const std::string name = (*it)[1];
    if (name == "help" || name == "version" || name == "config") continue;
    ++flags;
    EXPECT_EQ(keys.count(name), 1u) << "the example lacks " << name;
  }
  EXPECT_GE(flags, 15);

  // Uncommented, the example gives what no config gives.
  WriteConfig(uncommented);
  auto from_example = Parse({"--config", config_});
  ASSERT_THAT(from_example, IsOk());
  auto defaults =
      Parse({"--layers", "32", "--kv-heads", "8", "--head-dim", "128"});
  ASSERT_THAT(defaults, IsOk());
  const ipc::ServerOptions& a = from_example->server;
  const ipc::ServerOptions& b = defaults->server;
  EXPECT_EQ(a.store, b.store);
  EXPECT_EQ(a.host_capacity_bytes, b.host_capacity_bytes);
  EXPECT_EQ(a.layout.ToString(), b.layout.ToString());
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.max_workers, b.max_workers);
  EXPECT_EQ(a.disk_capacity_bytes, b.disk_capacity_bytes);
  EXPECT_EQ(a.disk_codec, b.disk_codec);
  EXPECT_EQ(a.disk_io_threads, b.disk_io_threads);
  EXPECT_EQ(a.spill_high, b.spill_high);
  EXPECT_EQ(a.spill_low, b.spill_low);
  EXPECT_EQ(a.write_behind_spills, b.write_behind_spills);
  EXPECT_EQ(a.remote_placement, b.remote_placement);
  EXPECT_EQ(a.caps.worker_pin_share, b.caps.worker_pin_share);
  EXPECT_EQ(a.caps.uid_pin_share, b.caps.uid_pin_share);
  EXPECT_EQ(a.caps.max_requests_per_worker, b.caps.max_requests_per_worker);
  EXPECT_EQ(a.caps.max_request_bytes_per_worker,
            b.caps.max_request_bytes_per_worker);
  EXPECT_EQ(a.caps.max_events_per_worker, b.caps.max_events_per_worker);
  EXPECT_EQ(a.caps.max_workers_per_uid, b.caps.max_workers_per_uid);
  EXPECT_EQ(a.caps.max_tenants_per_uid, b.caps.max_tenants_per_uid);
  EXPECT_EQ(a.verify_on_load, b.verify_on_load);
  EXPECT_EQ(from_example->log_level, defaults->log_level);
  EXPECT_EQ(from_example->stop_timeout, defaults->stop_timeout);
}

}  // namespace
}  // namespace tierkv::daemon
