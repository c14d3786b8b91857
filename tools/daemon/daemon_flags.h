// tierkvd's command line and config file: flags (Boost.Program_options) and
// an optional INI file of the same keys, to ServerOptions and the daemon's
// own settings. Kept out of main so tests can parse flags too. Stateless;
// thread-safe.
#ifndef TIERKV_TOOLS_DAEMON_DAEMON_FLAGS_H_
#define TIERKV_TOOLS_DAEMON_DAEMON_FLAGS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ipc/server.h"
#include "tierkv/status.h"

namespace tierkv::daemon {

// Where tierkvd serves Prometheus metrics over HTTP (--metrics-listen).
struct MetricsListen {
  std::string host = "127.0.0.1";  // An IPv4 or IPv6 literal.
  uint16_t port = 0;               // 0: any free port, logged.
};

// "9464" (loopback), "127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464".
// InvalidArgument naming the flag otherwise.
StatusOr<MetricsListen> ParseMetricsListen(const std::string& text);

// vLLM-format KV cache events (tools/daemon/kv_events.h): --kv-events-*.
struct KvEventsFlags {
  // Where the PUB socket binds ("tcp://*:5557", "ipc:///run/tierkv/ev").
  // Default: "" (no events).
  std::string endpoint;
  // Where the replay ROUTER socket binds. Default: "" (no replay).
  std::string replay_endpoint;
  std::string topic;  // Default: "" (vLLM's default topic).
  // Batches kept for replay, 1 to 10000000. Default: 10000 (vLLM's).
  size_t buffer_steps = 10000;
  // Events queued for the publisher thread at most; past it they are
  // dropped and counted. 1 to 100000000. Default: 100000 (vLLM's).
  size_t max_queue_events = 100000;
  // Block hashes on the wire: "int" (the key's low 64 bits, as vLLM sends
  // its hashes by default) or "bytes" (the whole 16-byte key). Default: int.
  std::string hash_format = "int";
  // The group ipc:// event sockets are given, so that its routers (and no
  // one else but tierkvd's user) subscribe: resolved from
  // --kv-events-group. Default: none (tierkvd's own group).
  std::optional<gid_t> group;
};

struct DaemonCommand {
  bool show_help = false;
  std::string help_text;
  ipc::ServerOptions server;
  std::string log_level = "info";
  bool log_level_on_command_line = false;  // It wins over --config's.
  // --config's FILE; empty without one. SIGHUP reads it again.
  std::string config_path;
  // argv as given, for reading --config again.
  std::vector<std::string> args;
  // The values --config's file gives the keys the command line leaves to
  // it, as text: what a SIGHUP compares the file with.
  std::map<std::string, std::string> config_values;
  // Where log lines go; SIGHUP reopens it. Default (empty): stderr.
  std::string log_file;
  // How long Server::Stop may take after SIGTERM before tierkvd gives up and
  // exits with status 1. Default: 10 s.
  std::chrono::seconds stop_timeout{10};
  // --metrics-listen: serve /metrics over HTTP. Default: none (off).
  std::optional<MetricsListen> metrics_listen;
  // --kv-events-*: publish KV cache events. Default: off.
  KvEventsFlags kv_events;
};

// Flags first; `--config FILE` then fills in every option the command line
// left unset from FILE ("key = value" lines, keys named as the long flags,
// '#' starts a comment). InvalidArgument with a message naming the flag, or
// the file, line and key, for anything malformed.
StatusOr<DaemonCommand> ParseDaemonFlags(int argc, const char* const* argv);

// What `command`'s --config file says now (SIGHUP).
struct ConfigReread {
  // The log level the command line and the file give now; the command line
  // still wins over the file. Without --config: command.log_level.
  std::string log_level;
  // Keys (log-level aside) the file now sets, changes or drops against
  // config_values: tierkvd applies them only when it starts again.
  std::vector<std::string> needs_restart;
};

// Reads the --config file again and checks it whole, as at start.
// InvalidArgument naming the file, line and key when it no longer parses.
StatusOr<ConfigReread> RereadConfig(const DaemonCommand& command);

// "512M", "2G", "1048576", "64KiB": bytes. InvalidArgument otherwise.
StatusOr<size_t> ParseBytes(const std::string& text);

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_DAEMON_FLAGS_H_
