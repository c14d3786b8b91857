#include "tools/daemon/daemon_flags.h"

#include <fcntl.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <vector>

#include "ipc/protocol.h"
#include "tools/daemon/exit_status.h"

namespace tierkv::daemon {
namespace po = boost::program_options;

StatusOr<size_t> ParseBytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() &&
         std::isdigit(static_cast<unsigned char>(text[pos]))) {
    ++pos;
  }
  if (pos == 0 || pos > 18) {
    return Status::InvalidArgument("'" + text +
                                   "' is not a size (e.g. 512M, 2G)");
  }
  const size_t value = std::stoull(text.substr(0, pos));
  std::string unit = text.substr(pos);
  for (char& c : unit)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    shift = 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    shift = 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    shift = 30;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    shift = 40;
  } else {
    return Status::InvalidArgument("unknown size unit in '" + text +
                                   "' (use K, M, G or T; powers of 1024)");
  }
  if (shift > 0 && value > (SIZE_MAX >> shift)) {
    return Status::InvalidArgument("size '" + text + "' is too large");
  }
  return value << shift;
}

StatusOr<MetricsListen> ParseMetricsListen(const std::string& text) {
  MetricsListen out;
  std::string port = text;
  if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    out.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (out.host.size() >= 2 && out.host.front() == '[' &&
        out.host.back() == ']') {
      out.host = out.host.substr(1, out.host.size() - 2);
    }
  }
  const bool digits = !port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char c) {
                        return std::isdigit((unsigned char)c);
                      });
  if (!digits || std::stoul(port) > 65535 || out.host.empty()) {
    return Status::InvalidArgument(
        "--metrics-listen '" + text +
        "': expected PORT (on 127.0.0.1), ADDR:PORT or [IPV6]:PORT, with "
        "PORT 0 to 65535 (0: any free port)");
  }
  out.port = static_cast<uint16_t>(std::stoul(port));
  return out;
}

namespace {

// The layout flags a store cannot start without.
constexpr const char* kRequiredKeys[] = {"layers", "kv-heads", "head-dim"};

// The options as text, before they are checked and converted.
struct RawOptions {
  std::string capacity = "1G", dtype = "bf16", mode = "0600", group,
              admin_group, kv_events_group;
  std::string disk_capacity = "16G", codec = "none";
  std::string eviction{EvictionPolicyName(kDefaultTierEviction)};
  std::string request_bytes = "256M";
  int stop_timeout = 10;
  std::string metrics_listen;
  int stats_interval_ms = 100;
  KvEventsFlags kv_events;
  int pending_timeout_ms = 5000;
  std::string remote_capacity = "0";
  int64_t remote_ttl = 0;
  int remote_scan_interval_ms = 1000;
  std::string remote_placement = "beside";
};

std::string Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r");
  return std::string(text.substr(begin, end - begin + 1));
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  auto fail = [&](int error) {
    return Status::InvalidArgument("--config " + path +
                                   ": cannot read: " + std::strerror(error));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno);
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return fail(error);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// A config file's text, and where it sets each key: Boost's parser names
// the key of a bad line but not the line.
struct ConfigFile {
  struct Setting {
    int line;
    std::string value;
  };
  std::string path;
  std::string text;
  std::map<std::string, std::vector<Setting>> settings;

  // "path:line" of the `nth` setting of `key` (the last if fewer).
  std::string At(const std::string& key, size_t nth = 0) const {
    auto it = settings.find(key);
    if (it == settings.end() || it->second.empty()) return path;
    const Setting& s = it->second[std::min(nth, it->second.size() - 1)];
    return path + ":" + std::to_string(s.line);
  }
  std::string Value(const std::string& key) const {
    auto it = settings.find(key);
    return it == settings.end() ? "" : it->second.front().value;
  }
};

// Splits lines as Boost's parse_config_file does: text from '#' on is a
// comment, "[name]" prefixes later keys with "name.", the rest is
// "key = value". A line of any other shape is an error with its number.
StatusOr<ConfigFile> ReadConfigFile(const std::string& path) {
  ConfigFile file;
  file.path = path;
  TIERKV_ASSIGN_OR_RETURN(file.text, ReadWholeFile(path));
  std::istringstream lines(file.text);
  std::string line, section;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string s =
        Trim(std::string_view(line).substr(0, line.find('#')));
    if (s.empty()) continue;
    if (s.front() == '[' && s.back() == ']') {
      section = Trim(std::string_view(s).substr(1, s.size() - 2)) + ".";
      continue;
    }
    const size_t eq = s.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument(path + ":" + std::to_string(number) +
                                     ": expected 'key = value', got '" + s +
                                     "'");
    }
    file.settings[section + Trim(std::string_view(s).substr(0, eq))].push_back(
        {number, Trim(std::string_view(s).substr(eq + 1))});
  }
  return file;
}

// Adds the file's settings to `vm`. Options already set on the command line
// keep their values: po::store never overwrites an explicit value.
Status StoreConfigFile(const ConfigFile& file,
                       const po::options_description& keys,
                       po::variables_map& vm) {
  std::istringstream in(file.text);
  try {
    po::store(po::parse_config_file(in, keys), vm);
  } catch (const po::unknown_option& e) {
    const std::string key = e.get_option_name();
    return Status::InvalidArgument(
        file.At(key) + ": unknown key '" + key +
        "' (keys are tierkvd's long flag names, without the --)");
  } catch (const po::multiple_occurrences& e) {
    const std::string key = e.get_option_name();
    return Status::InvalidArgument(file.At(key, 1) + ": " + key +
                                   " is set twice (first at " + file.At(key) +
                                   ")");
  } catch (const po::validation_error& e) {
    const std::string key = e.get_option_name();
    return Status::InvalidArgument(file.At(key) + ": " + key + " = '" +
                                   file.Value(key) + "' is not a valid value");
  } catch (const po::error& e) {
    return Status::InvalidArgument(file.path + ": " + e.what());
  }
  return Status::Ok();
}

StatusOr<DType> ParseDType(const std::string& where, const std::string& text) {
  if (text == "f32" || text == "fp32" || text == "float32") return DType::kF32;
  if (text == "f16" || text == "fp16" || text == "float16") return DType::kF16;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  return Status::InvalidArgument(where + " '" + text +
                                 "': use f32, f16 or bf16");
}

StatusOr<mode_t> ParseMode(const std::string& where, const std::string& text) {
  size_t used = 0;
  unsigned long mode = 0;
  try {
    mode = std::stoul(text, &used, 8);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || mode > 0777 || (mode & 0600) != 0600 ||
      (mode & 0007) != 0) {
    return Status::InvalidArgument(
        where + " '" + text +
        "': octal, owner read-write, nothing for others (e.g. 0600, 0660)");
  }
  return static_cast<mode_t>(mode);
}

StatusOr<DiskCodec> ParseCodec(const std::string& where,
                               const std::string& text) {
  for (DiskCodec c :
       {DiskCodec::kNone, DiskCodec::kLz4, DiskCodec::kLz4BytePlanes}) {
    if (text == DiskCodecName(c)) return c;
  }
  return Status::InvalidArgument(where + " '" + text +
                                 "': use none, lz4 or lz4-byte-planes");
}

Status CheckLogLevel(const std::string& where, const std::string& level) {
  static const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                  "error", "critical", "off"};
  for (const char* l : kLevels) {
    if (level == l) return Status::Ok();
  }
  return Status::InvalidArgument(where + " '" + level +
                                 "': use trace, debug, info, warn, error "
                                 "or off");
}

// The options that --config's file may set too: every flag but --help and
// --config.
po::options_description SettingOptions(DaemonCommand& command,
                                       RawOptions& raw) {
  ipc::ServerOptions& s = command.server;
  po::options_description desc(
      "Options (on the command line, or as keys of "
      "the --config file)");
  desc.add_options()(
      "store", po::value(&s.store)->default_value(s.store),
      "store name; names the stats page /tierkv.<store>.stats and the lock "
      "file tierkv-<store>.store-lock next to the socket")(
      "socket", po::value(&s.socket_path),
      "control socket path (default: $XDG_RUNTIME_DIR/tierkv-<store>.sock,"
      " or /run/tierkv/tierkv-<store>.sock; its directory should be "
      "writable by tierkvd's user only)")(
      "host-capacity", po::value(&raw.capacity)->default_value(raw.capacity),
      "host DRAM for KV blocks (K, M, G, T suffixes, powers of 1024); "
      "reserved whole at start (about 0.35 s per GiB), refused when more "
      "than the memory available")(
      "model", po::value(&s.model)->value_name("NAME"),
      "the model whose KV this store serves, e.g. "
      "meta-llama/Llama-3.1-8B-Instruct; workers of another model are "
      "refused, and a disk tier written for another model is refused (see "
      "--disk-reset) "
      "(default: unnamed; name it whenever models share a KV layout)")(
      "layers", po::value(&s.layout.num_layers),
      "KV layout: number of layers (required)")(
      "kv-heads", po::value(&s.layout.num_kv_heads),
      "KV layout: KV heads per layer (required)")(
      "head-dim", po::value(&s.layout.head_dim),
      "KV layout: head dimension (required)")(
      "block-size",
      po::value(&s.layout.block_size)->default_value(s.layout.block_size),
      "KV layout: tokens per block")(
      "dtype", po::value(&raw.dtype)->default_value(raw.dtype),
      "KV layout: f32, f16 or bf16")(
      "mode", po::value(&raw.mode)->default_value(raw.mode),
      "permission bits of the socket (octal; the stats page is readable "
      "by tierkvd's user and --admin-group only); the disk tier's files "
      "and the log file get no more")(
      "group", po::value(&raw.group),
      "let this group's workers attach and read stats too (their own "
      "user's workers only), as primary or supplementary group (needs "
      "--mode 0660)")(
      "admin-group", po::value(&raw.admin_group),
      "let this group give operator orders too (tierkv-admin clear, evict) "
      "and see every user's workers and the stats page; without it only "
      "tierkvd's user and root may")(
      "disk-dir", po::value(&s.disk_path),
      "disk tier: a directory (created if missing; the blocks' value file "
      "and a RocksDB index of them) that blocks spill to when host memory "
      "runs short, and that survives restarts (default: no disk tier)")(
      "disk-capacity",
      po::value(&raw.disk_capacity)->default_value(raw.disk_capacity),
      "disk tier: bound on its bytes on disk, RocksDB's log and memtables "
      "included (at least 4M); least recently used blocks are evicted")(
      "disk-reset",
      po::value(&s.disk_reset)
          ->default_value(s.disk_reset, "false")
          ->implicit_value(true, "true"),
      "disk tier: start empty when --disk-dir holds blocks of another "
      "--model or layout, or files RocksDB cannot open (without it tierkvd "
      "refuses to start and names them); a usable disk tier is kept")(
      "disk-codec", po::value(&raw.codec)->default_value(raw.codec),
      "disk tier: none, lz4 or lz4-byte-planes (see BENCHMARKS.md)")(
      "disk-io-threads",
      po::value(&s.disk_io_threads)->default_value(s.disk_io_threads),
      "disk tier: threads that spill and promote (1 to 64): the queue depth "
      "the disk sees; more pay on disks with parallelism (NVMe), see "
      "BENCHMARKS.md")(
      "spill-high",
      po::value(&s.spill_high)->default_value(s.spill_high, "0.9"),
      "spill to disk once this fraction of host slots is in use")(
      "spill-low", po::value(&s.spill_low)->default_value(s.spill_low, "0.7"),
      "spilling stops once at most this fraction is in use")(
      "write-behind-spills",
      po::value(&s.write_behind_spills)->default_value(s.write_behind_spills),
      "copies of newly stored blocks to disk in flight at most (write-behind: "
      "evicting them later loses nothing); 0 spills only past spill-high")(
      "eviction-policy", po::value(&raw.eviction)->default_value(raw.eviction),
      "which cached block the host and disk tiers evict first: arc "
      "(adaptive replacement: LRU order until blocks used again come back "
      "after their eviction, then blocks used once leave first, in shares "
      "that adapt to the load; on disk, a block read back counts as used "
      "again) or lru (the least recently used); see BENCHMARKS.md, "
      "\"Eviction\"")("max-workers",
                      po::value(&s.max_workers)->default_value(s.max_workers),
                      "most workers attached at once (1 to 4096)")(
      "max-tenants", po::value(&s.max_tenants)->default_value(s.max_tenants),
      "most tenants the store holds host memory for (1 to 1024); each gets "
      "host memory of its own that only its workers map. One more takes the "
      "memory of the tenant idle longest (no worker attached), whose host "
      "blocks are then dropped; the first tenant's is never taken")(
      "worker-pin-share",
      po::value(&s.caps.worker_pin_share)
          ->default_value(s.caps.worker_pin_share, "0.5"),
      "the share of the host slots one worker may pin at once (lookup hits, "
      "loads, stores being written), so a stopped or hostile worker leaves "
      "the rest to others; over it a worker is told ResourceExhausted")(
      "uid-pin-share",
      po::value(&s.caps.uid_pin_share)
          ->default_value(s.caps.uid_pin_share, "0.75"),
      "the share of the host slots all the workers of one user (uid) may "
      "pin at once, so one user's many workers leave the rest to other "
      "users; tierkvd's own user, root and --admin-group are not held to "
      "it")("max-requests-per-worker",
            po::value(&s.caps.max_requests_per_worker)
                ->default_value(s.caps.max_requests_per_worker),
            "requests one worker may have open (looked up, not finished; 1 to "
            "1048576); lookups past it are refused")(
      "max-request-bytes-per-worker",
      po::value(&raw.request_bytes)->default_value(raw.request_bytes),
      "bytes of state (token ids, block keys) one worker's open requests may "
      "keep in tierkvd (K, M, G suffixes); lookups past it are refused")(
      "max-events-per-worker",
      po::value(&s.caps.max_events_per_worker)
          ->default_value(s.caps.max_events_per_worker),
      "transfer events one worker may have in flight (1 to 1048576); it "
      "stores nothing more until some complete")(
      "max-workers-per-uid",
      po::value(&s.caps.max_workers_per_uid)
          ->default_value(s.caps.max_workers_per_uid),
      "workers one user (uid) may have attached at once (1 to 65536)")(
      "max-tenants-per-uid",
      po::value(&s.caps.max_tenants_per_uid)
          ->default_value(s.caps.max_tenants_per_uid),
      "tenants one user (uid) may have brought to this store at once (1 to "
      "1024), so that no one user takes every one of --max-tenants; "
      "tierkvd's own user, root and --admin-group are not held to it")(
      "verify-loads",
      po::value(&s.verify_on_load)
          ->default_value(s.verify_on_load, "false")
          ->implicit_value(true, "true"),
      "check each host block's checksum (taken when its store completed) "
      "before a worker loads it: a block another worker wrote into is a "
      "miss, dropped (blocks are always checked before they spill to "
      "disk); costs a checksum of every block loaded")(
      "max-pending-connections",
      po::value(&s.max_pending_connections)
          ->default_value(s.max_pending_connections),
      "most socket connections not registered as workers (tierkv-admin, "
      "workers about to register) open at once; past it the one idle "
      "longest is closed (0 to 65536; 0: 4 x max-workers + 16)")(
      "pending-timeout-ms",
      po::value(&raw.pending_timeout_ms)->default_value(raw.pending_timeout_ms),
      "an unregistered connection that goes this long without a request "
      "is closed (10 to 600000)")(
      "stats-interval-ms",
      po::value(&raw.stats_interval_ms)->default_value(raw.stats_interval_ms),
      "milliseconds between snapshots in the stats page "
      "(/dev/shm/tierkv.<store>.stats) that tierkv-admin reads")(
      "log-level", po::value(&command.log_level)->default_value("info"),
      "trace, debug, info, warn, error or off; SIGHUP re-reads it from "
      "--config")(
      "log-file", po::value(&command.log_file)->value_name("PATH"),
      "append log lines to PATH instead of stderr; SIGHUP reopens it")(
      "stop-timeout",
      po::value(&raw.stop_timeout)->default_value(raw.stop_timeout),
      "seconds a stop may take after SIGTERM before tierkvd exits with "
      "status 1; three quarters of it may go to spilling the host tier to "
      "--disk-dir")(
      "metrics-listen",
      po::value(&raw.metrics_listen)->value_name("[ADDR:]PORT"),
      "serve the statistics in Prometheus text format (what tierkv-admin "
      "metrics prints) over HTTP at http://ADDR:PORT/metrics. A port alone "
      "listens on 127.0.0.1 only; 0.0.0.0:PORT or [::]:PORT exposes them to "
      "the network. PORT 0: any free port, logged. Default: off")(
      "remote-redis",
      po::value(&s.remote_redis)->value_name("HOST:PORT[,HOST:PORT...]"),
      "a remote tier on this Redis Cluster (any of its nodes as seeds), "
      "shared with the other tierkvds of this model, layout and "
      "--remote-tenant: spills go there (with --disk-dir, which lookups "
      "read first, as --remote-placement says), and blocks other tierkvds "
      "wrote are found by scanning it. Default: none")(
      "remote-tenant",
      po::value(&s.remote_tenant)->default_value(s.remote_tenant),
      "part of every Redis key (1 to 64 of A-Z a-z 0-9 _ . -): tierkvds "
      "share blocks within one tenant")(
      "remote-ttl", po::value(&raw.remote_ttl)->default_value(raw.remote_ttl),
      "seconds each block lives in the remote tier; 0: until deleted")(
      "remote-placement",
      po::value(&raw.remote_placement)->default_value(raw.remote_placement),
      "with --disk-dir, where the remote tier sits: beside (each spill from "
      "host goes to disk and to Redis, so other tierkvds can load a block as "
      "soon as this one spills it) or under (spills go to disk only; the "
      "blocks the disk tier evicts for room go on to Redis, which then "
      "holds what this machine's disk gave up)")(
      "remote-capacity",
      po::value(&raw.remote_capacity)->default_value(raw.remote_capacity),
      "bound on the bytes this tierkvd keeps in the remote tier (the least "
      "recently used of the blocks it wrote are deleted past it; K, M, G, T "
      "suffixes); 0: none")(
      "remote-scan-interval-ms",
      po::value(&raw.remote_scan_interval_ms)
          ->default_value(raw.remote_scan_interval_ms),
      "milliseconds between scans of the remote tier for blocks other "
      "tierkvds wrote (0 to 3600000; 0: never, only this tierkvd's blocks "
      "are found there)")(
      "kv-events-endpoint",
      po::value(&raw.kv_events.endpoint)->value_name("ENDPOINT"),
      "publish KV cache events in vLLM's format (ZeroMQ PUB, msgpack) for "
      "cache-aware routers: tcp://*:5557 or ipc://PATH binds, tcp://HOST:PORT "
      "connects. Default: off")(
      "kv-events-replay-endpoint",
      po::value(&raw.kv_events.replay_endpoint)->value_name("ENDPOINT"),
      "bind a ZeroMQ ROUTER here that replays recent event batches from a "
      "sequence number a subscriber asks for. Needs --kv-events-endpoint. "
      "Default: off")(
      "kv-events-topic",
      po::value(&raw.kv_events.topic)->default_value(raw.kv_events.topic),
      "the topic frame of every event message (vLLM's default: empty)")(
      "kv-events-buffer-steps",
      po::value(&raw.kv_events.buffer_steps)
          ->default_value(raw.kv_events.buffer_steps),
      "event batches kept for replay, at most 256 MiB of them (1 to "
      "10000000)")(
      "kv-events-queue",
      po::value(&raw.kv_events.max_queue_events)
          ->default_value(raw.kv_events.max_queue_events),
      "events waiting for the publisher thread at most; an event that finds "
      "it full drops what waits (counted and logged) and routers are sent "
      "AllBlocksCleared in its place (1 to 100000000)")(
      "kv-events-hash-format",
      po::value(&raw.kv_events.hash_format)
          ->default_value(raw.kv_events.hash_format),
      "block hashes in events: int (a block key's low 64 bits, as vLLM "
      "sends its hashes by default) or bytes (the whole 16-byte key)")(
      "kv-events-group", po::value(&raw.kv_events_group)->value_name("GROUP"),
      "give the ipc:// event sockets to this group, so that its routers "
      "subscribe (needs --mode 0660; the events carry every tenant's token "
      "ids, so name a group of routers, not --group's engine users). "
      "Default: tierkvd's own group");
  return desc;
}

// "--key", or "file:line: key" when the key's value came from the file.
using Where = std::function<std::string(const std::string& key)>;

Status CheckKvEvents(const KvEventsFlags& flags, mode_t mode,
                     const Where& where) {
  // The group of the event sockets' files; the mode comes from the umask
  // of --mode (daemon.cc, UmaskFor).
  if (flags.group.has_value()) {
    for (const std::string* endpoint :
         {&flags.endpoint, &flags.replay_endpoint}) {
      if (endpoint->empty()) continue;
      const bool ipc = endpoint->starts_with("ipc://");
      if (!ipc || endpoint->starts_with("ipc://@") ||
          endpoint->find('*') != std::string::npos) {
        return Status::InvalidArgument(
            where("kv-events-group") + ": " + *endpoint +
            " is not an ipc:// socket file whose group it can set (an "
            "ipc://PATH without '@' or '*')");
      }
    }
    if (flags.endpoint.empty()) {
      return Status::InvalidArgument(where("kv-events-group") +
                                     ": needs --kv-events-endpoint");
    }
    if ((mode & 0060) != 0060) {
      return Status::InvalidArgument(
          where("kv-events-group") +
          " lets a group subscribe, so --mode must give the group read and "
          "write (such as 0660)");
    }
  }
  if (!flags.replay_endpoint.empty() && flags.endpoint.empty()) {
    return Status::InvalidArgument(
        where("kv-events-replay-endpoint") +
        ": replays events, so it needs --kv-events-endpoint");
  }
  if (flags.buffer_steps < 1 || flags.buffer_steps > 10'000'000) {
    return Status::InvalidArgument(where("kv-events-buffer-steps") + " '" +
                                   std::to_string(flags.buffer_steps) +
                                   "': 1 to 10000000 batches");
  }
  if (flags.hash_format != "int" && flags.hash_format != "bytes") {
    return Status::InvalidArgument(where("kv-events-hash-format") + " '" +
                                   flags.hash_format +
                                   "': expected int or bytes");
  }
  if (flags.max_queue_events < 1 || flags.max_queue_events > 100'000'000) {
    return Status::InvalidArgument(where("kv-events-queue") + " '" +
                                   std::to_string(flags.max_queue_events) +
                                   "': 1 to 100000000 events");
  }
  return Status::Ok();
}

// The --remote-* flags. Only --remote-redis turns the remote tier on; the
// rest are checked either way.
Status FinishRemote(const RawOptions& raw, const Where& where,
                    ipc::ServerOptions& s) {
  auto capacity = ParseBytes(raw.remote_capacity);
  if (!capacity.ok()) {
    return Status::InvalidArgument(where("remote-capacity") + ": " +
                                   capacity.status().message());
  }
  s.remote_capacity_bytes = *capacity;
  if (raw.remote_ttl < 0 || raw.remote_ttl > int64_t{1} << 31) {
    return Status::InvalidArgument(where("remote-ttl") + " '" +
                                   std::to_string(raw.remote_ttl) +
                                   "': 0 to 2147483648 seconds");
  }
  s.remote_ttl = std::chrono::seconds(raw.remote_ttl);
  if (raw.remote_scan_interval_ms < 0 ||
      raw.remote_scan_interval_ms > 3'600'000) {
    return Status::InvalidArgument(where("remote-scan-interval-ms") + " '" +
                                   std::to_string(raw.remote_scan_interval_ms) +
                                   "': 0 to 3600000 milliseconds");
  }
  s.remote_scan_interval =
      std::chrono::milliseconds(raw.remote_scan_interval_ms);
  const std::string& tenant = s.remote_tenant;
  const bool tenant_ok = !tenant.empty() && tenant.size() <= 64 &&
                         std::all_of(tenant.begin(), tenant.end(), [](char c) {
                           return std::isalnum(static_cast<unsigned char>(c)) ||
                                  c == '_' || c == '.' || c == '-';
                         });
  if (!tenant_ok) {
    return Status::InvalidArgument(where("remote-tenant") + " '" + tenant +
                                   "': 1 to 64 of A-Z a-z 0-9 _ . -");
  }
  if (raw.remote_placement == "beside") {
    s.remote_placement = RemotePlacement::kBeside;
  } else if (raw.remote_placement == "under") {
    s.remote_placement = RemotePlacement::kUnder;
  } else {
    return Status::InvalidArgument(where("remote-placement") + " '" +
                                   raw.remote_placement + "': beside or under");
  }
  if (s.remote_placement == RemotePlacement::kUnder &&
      !s.remote_redis.empty() && s.disk_path.empty()) {
    return Status::InvalidArgument(
        where("remote-placement") +
        " under: the remote tier goes under the disk tier, and there is "
        "none (--disk-dir); without one the remote tier is under host "
        "already");
  }
  if (!s.remote_redis.empty() &&
      s.remote_redis.find(':') == std::string::npos) {
    return Status::InvalidArgument(where("remote-redis") + " '" +
                                   s.remote_redis +
                                   "': expected HOST:PORT[,HOST:PORT...]");
  }
  return Status::Ok();
}

// Checks and converts what the flags and the file gave.
StatusOr<DaemonCommand> Finish(DaemonCommand command, const RawOptions& raw,
                               const Where& where) {
  ipc::ServerOptions& s = command.server;
  auto capacity = ParseBytes(raw.capacity);
  if (!capacity.ok()) {
    return Status::InvalidArgument(where("host-capacity") + ": " +
                                   capacity.status().message());
  }
  s.host_capacity_bytes = *capacity;
  TIERKV_ASSIGN_OR_RETURN(s.layout.dtype,
                          ParseDType(where("dtype"), raw.dtype));
  TIERKV_ASSIGN_OR_RETURN(s.mode, ParseMode(where("mode"), raw.mode));
  auto disk_capacity = ParseBytes(raw.disk_capacity);
  if (!disk_capacity.ok()) {
    return Status::InvalidArgument(where("disk-capacity") + ": " +
                                   disk_capacity.status().message());
  }
  s.disk_capacity_bytes = *disk_capacity;
  TIERKV_ASSIGN_OR_RETURN(s.disk_codec,
                          ParseCodec(where("disk-codec"), raw.codec));
  if (auto eviction = ParseEvictionPolicy(raw.eviction); eviction.ok()) {
    s.eviction = *eviction;
  } else {
    return Status::InvalidArgument(where("eviction-policy") + ": " +
                                   eviction.status().message());
  }
  auto request_bytes = ParseBytes(raw.request_bytes);
  if (!request_bytes.ok() || *request_bytes == 0) {
    return Status::InvalidArgument(
        where("max-request-bytes-per-worker") + ": " +
        (request_bytes.ok() ? "at least 1 byte"
                            : request_bytes.status().message()));
  }
  s.caps.max_request_bytes_per_worker = *request_bytes;
  if (!(s.caps.worker_pin_share > 0 && s.caps.worker_pin_share <= 1)) {
    return Status::InvalidArgument(where("worker-pin-share") +
                                   " must be in (0, 1]");
  }
  if (!(s.caps.uid_pin_share > 0 && s.caps.uid_pin_share <= 1)) {
    return Status::InvalidArgument(where("uid-pin-share") +
                                   " must be in (0, 1]");
  }
  // Bounded above too: a negative value ("-1") parses as a huge unsigned
  // one, which would lift the cap it sets.
  const struct {
    const char* flag;
    uint64_t value, min, max;
  } counts[] = {
      {"max-requests-per-worker", s.caps.max_requests_per_worker, 1,
       uint64_t{1} << 20},
      {"max-events-per-worker", s.caps.max_events_per_worker, 1,
       uint64_t{1} << 20},
      {"max-workers-per-uid", s.caps.max_workers_per_uid, 1, uint64_t{1} << 16},
      {"max-tenants-per-uid", s.caps.max_tenants_per_uid, 1, ipc::kMaxTenants},
      {"max-pending-connections", s.max_pending_connections, 0,
       uint64_t{1} << 16},
  };
  for (const auto& c : counts) {
    if (c.value < c.min || c.value > c.max) {
      return Status::InvalidArgument(
          where(c.flag) + " '" + std::to_string(c.value) + "' must be " +
          std::to_string(c.min) + " to " + std::to_string(c.max));
    }
  }
  if (s.disk_io_threads < 1 || s.disk_io_threads > 64) {
    return Status::InvalidArgument(where("disk-io-threads") +
                                   " must be 1 to 64");
  }
  if (s.write_behind_spills < 0) {
    return Status::InvalidArgument(where("write-behind-spills") +
                                   " must be at least 0");
  }
  if (!(s.spill_low > 0 && s.spill_low <= s.spill_high && s.spill_high <= 1)) {
    return Status::InvalidArgument(where("spill-low") + " and " +
                                   where("spill-high") +
                                   " must satisfy 0 < low <= high <= 1");
  }
  for (auto [flag, name, gid] :
       {std::tuple{"group", &raw.group, &s.group},
        std::tuple{"admin-group", &raw.admin_group, &s.admin_group},
        std::tuple{"kv-events-group", &raw.kv_events_group,
                   &command.kv_events.group}}) {
    if (name->empty()) continue;
    const struct group* g = getgrnam(name->c_str());
    if (g == nullptr) {
      return Status::InvalidArgument(where(flag) + " '" + *name +
                                     "': no such group");
    }
    *gid = g->gr_gid;
  }
  if (Status m = ValidateModelName(s.model); !m.ok()) {
    return Status::InvalidArgument(where("model") + ": " + m.message());
  }
  if (Status v = s.layout.Validate(); !v.ok()) {
    return Status::InvalidArgument("layout: " + v.message());
  }
  // Against the layout's block size, so the message can name the flags.
  const size_t block_bytes = s.layout.BlockBytes();
  if (s.host_capacity_bytes / block_bytes < 2) {
    return Status::InvalidArgument(
        where("host-capacity") + " " + raw.capacity + ": holds fewer than 2 " +
        "blocks of " + std::to_string(block_bytes) +
        " bytes (this layout's block; one slot is reserved)");
  }
  if (!s.disk_path.empty() && s.disk_capacity_bytes < block_bytes) {
    return Status::InvalidArgument(where("disk-capacity") + " " +
                                   raw.disk_capacity + ": holds no block of " +
                                   std::to_string(block_bytes) +
                                   " bytes (this layout's block)");
  }
  TIERKV_RETURN_IF_ERROR(CheckLogLevel(where("log-level"), command.log_level));
  if (raw.stop_timeout < 1) {
    return Status::InvalidArgument(where("stop-timeout") + " '" +
                                   std::to_string(raw.stop_timeout) +
                                   "': at least 1 second");
  }
  command.stop_timeout = std::chrono::seconds(raw.stop_timeout);
  if (!raw.metrics_listen.empty()) {
    StatusOr<MetricsListen> listen = ParseMetricsListen(raw.metrics_listen);
    if (!listen.ok()) {
      return Status::InvalidArgument(
          where("metrics-listen") +
          listen.status().message().substr(
              std::string_view("--metrics-listen").size()));
    }
    command.metrics_listen = *listen;
  }
  const std::optional<gid_t> events_group = command.kv_events.group;
  command.kv_events = raw.kv_events;
  command.kv_events.group = events_group;
  TIERKV_RETURN_IF_ERROR(CheckKvEvents(command.kv_events, s.mode, where));
  if (s.max_workers < 1 || s.max_workers > ipc::kMaxWorkersListed) {
    return Status::InvalidArgument(where("max-workers") + " '" +
                                   std::to_string(s.max_workers) + "': 1 to " +
                                   std::to_string(ipc::kMaxWorkersListed));
  }
  if (s.max_tenants < 1 || s.max_tenants > ipc::kMaxTenants) {
    return Status::InvalidArgument(where("max-tenants") + " '" +
                                   std::to_string(s.max_tenants) + "': 1 to " +
                                   std::to_string(ipc::kMaxTenants));
  }
  if (raw.stats_interval_ms < 10 || raw.stats_interval_ms > 60000) {
    return Status::InvalidArgument(where("stats-interval-ms") + " '" +
                                   std::to_string(raw.stats_interval_ms) +
                                   "': 10 to 60000 milliseconds");
  }
  s.stats_interval = std::chrono::milliseconds(raw.stats_interval_ms);
  if (raw.pending_timeout_ms < 10 || raw.pending_timeout_ms > 600000) {
    return Status::InvalidArgument(where("pending-timeout-ms") + " '" +
                                   std::to_string(raw.pending_timeout_ms) +
                                   "': 10 to 600000 milliseconds");
  }
  s.pending_timeout = std::chrono::milliseconds(raw.pending_timeout_ms);
  TIERKV_RETURN_IF_ERROR(FinishRemote(raw, where, s));
  return command;
}

}  // namespace

StatusOr<DaemonCommand> ParseDaemonFlags(int argc, const char* const* argv) {
  DaemonCommand command;
  command.args.assign(argv, argv + argc);
  RawOptions raw;
  po::options_description general(
      "tierkvd: the tierkv coordinator. Owns the index, LRU and pins of the\n"
      "host tier (shared memory) for one store and serves engine workers.\n"
      "Stops cleanly on SIGINT or SIGTERM (at any stage, start-up included),\n"
      "spilling its host blocks to --disk-dir first; SIGHUP reopens --log-file "
      "and\n"
      "re-reads log-level from --config. Under systemd with WatchdogSec=, it\n"
      "notifies the watchdog while it makes progress.\n\n"
      "Command line only");
  general.add_options()("help,h", "show this help and exit")(
      "version", "print tierkvd's version and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "read options from FILE: 'key = value' lines, keys named as the long "
      "flags (host-capacity = 2G); the command line wins over FILE");
  const po::options_description settings = SettingOptions(command, raw);
  po::options_description all;
  all.add(general).add(settings);
  std::ostringstream help;
  help
      << general << "\n"
      << settings
      << "\nExample:\n  tierkvd --model meta-llama/Llama-3.1-8B-Instruct "
         "--layers 32 --kv-heads 8 \\\n      --head-dim 128 --host-capacity 8G "
         "--disk-dir /var/lib/tierkv/default \\\n      --disk-capacity 200G\n"
      << "\n"
      << kExitStatusHelp;
  command.help_text = help.str();

  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, all), vm);
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  if (vm.count("help") != 0) {
    command.show_help = true;
    return command;
  }
  std::set<std::string> on_command_line;
  for (const auto& [key, value] : vm) {
    if (!value.defaulted()) on_command_line.insert(key);
  }
  command.log_level_on_command_line = on_command_line.count("log-level") != 0;
  std::optional<ConfigFile> file;
  if (vm.count("config") != 0) {
    command.config_path = vm["config"].as<std::string>();
    TIERKV_ASSIGN_OR_RETURN(file, ReadConfigFile(command.config_path));
    TIERKV_RETURN_IF_ERROR(StoreConfigFile(*file, settings, vm));
    for (const auto& [key, values] : file->settings) {
      if (on_command_line.count(key) == 0 && !values.empty()) {
        command.config_values[key] = values.front().value;
      }
    }
  }
  // Named together: one run tells what a first-time command line lacks.
  std::vector<std::string> missing;
  for (const char* key : kRequiredKeys) {
    if (vm.count(key) == 0) missing.push_back(std::string("--") + key);
  }
  if (!missing.empty()) {
    std::string list;
    for (const std::string& flag : missing) {
      list += (list.empty() ? "" : ", ") + flag;
    }
    return Status::InvalidArgument(
        "missing " + list +
        ": tierkvd needs the KV layout it serves (--layers, --kv-heads and "
        "--head-dim), on the command line or in --config");
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  const Where where = [&](const std::string& key) {
    if (file.has_value() && on_command_line.count(key) == 0 &&
        file->settings.count(key) != 0) {
      return file->At(key) + ": " + key;
    }
    return "--" + key;
  };
  return Finish(std::move(command), raw, where);
}

StatusOr<ConfigReread> RereadConfig(const DaemonCommand& command) {
  if (command.config_path.empty()) return ConfigReread{command.log_level, {}};
  std::vector<const char*> argv;
  for (const std::string& arg : command.args) argv.push_back(arg.c_str());
  TIERKV_ASSIGN_OR_RETURN(
      DaemonCommand now,
      ParseDaemonFlags(static_cast<int>(argv.size()), argv.data()));
  ConfigReread reread{now.log_level, {}};
  std::set<std::string> keys;
  for (const auto& values : {command.config_values, now.config_values}) {
    for (const auto& [key, value] : values) keys.insert(key);
  }
  for (const std::string& key : keys) {
    if (key == "log-level") continue;
    auto before = command.config_values.find(key);
    auto after = now.config_values.find(key);
    const bool same = before != command.config_values.end() &&
                      after != now.config_values.end() &&
                      before->second == after->second;
    if (!same) reread.needs_restart.push_back(key);
  }
  return reread;
}

}  // namespace tierkv::daemon
