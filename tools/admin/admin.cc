#include "tools/admin/admin.h"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "ipc/server.h"
#include "ipc/socket_call.h"
#include "ipc/stats_page.h"
#include "tools/admin/admin_internal.h"

namespace tierkv::admin {
namespace po = boost::program_options;
namespace {

// clear's --tier and evict's keys; no other verb takes either.
Status ParseOrderArgs(const std::string& tier,
                      const std::vector<std::string>& args,
                      AdminCommand* command) {
  if (command->verb == "clear") {
    if (tier == "host") {
      command->tiers = TierSelection::kHost;
    } else if (tier == "disk") {
      command->tiers = TierSelection::kDisk;
    } else if (tier == "all") {
      command->tiers = TierSelection::kAll;
    } else {
      return Status::InvalidArgument(
          tier.empty() ? "clear needs --tier host, disk or all"
                       : "--tier '" + tier + "': expected host, disk or all");
    }
  } else if (!tier.empty()) {
    return Status::InvalidArgument("--tier is for clear only");
  }
  if (command->verb == "keys" || command->verb == "route") {
    std::string joined;
    for (const std::string& arg : args) joined += arg + " ";
    TIERKV_ASSIGN_OR_RETURN(command->tokens, ParseTokenIds(joined));
    command->tokens_from_stdin = args.empty();
    return Status::Ok();
  }
  if (command->verb != "evict") {
    if (!args.empty()) {
      return Status::InvalidArgument("unexpected argument '" + args[0] + "'");
    }
    return Status::Ok();
  }
  if (args.empty()) {
    return Status::InvalidArgument("evict needs at least one block key");
  }
  if (args.size() > ipc::kMaxBlocks) {
    return Status::InvalidArgument("evict takes at most " +
                                   std::to_string(ipc::kMaxBlocks) + " keys");
  }
  for (const std::string& arg : args) {
    TIERKV_ASSIGN_OR_RETURN(BlockKey key, BlockKey::FromHex(arg));
    command->keys.push_back(key);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<TokenId>> ParseTokenIds(const std::string& text) {
  std::vector<TokenId> tokens;
  std::string word;
  auto take = [&]() -> Status {
    if (word.empty()) return Status::Ok();
    TokenId id = 0;
    const auto [end, error] =
        std::from_chars(word.data(), word.data() + word.size(), id);
    if (error != std::errc() || end != word.data() + word.size()) {
      return Status::InvalidArgument("token id '" + word +
                                     "': expected a number from 0 to " +
                                     std::to_string(UINT32_MAX));
    }
    tokens.push_back(id);
    word.clear();
    return Status::Ok();
  };
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '[' ||
        c == ']') {
      TIERKV_RETURN_IF_ERROR(take());
    } else {
      word += c;
    }
  }
  TIERKV_RETURN_IF_ERROR(take());
  return tokens;
}

StatusOr<AdminCommand> ParseAdminFlags(int argc, const char* const* argv) {
  AdminCommand command;
  std::string store = "default";
  std::string tier;
  std::vector<std::string> args;
  std::vector<std::string> nodes;
  po::options_description desc(
      "tierkv-admin: inspect a running tierkvd, or drop its cached blocks.\n\n"
      "usage: tierkv-admin COMMAND [--store NAME | --socket PATH] [options]\n\n"
      "Commands:\n"
      "  stats   per tier (host, and disk when tierkvd has one): capacity,\n"
      "          used, cached, pinned, hits, misses and hit rate (of the\n"
      "          tier's own lookups: disk sees the blocks host missed),\n"
      "          evictions, transfers in flight; spills, promotions and\n"
      "          checksum failures; workers attached, detached, refused; then\n"
      "          the attached workers (--json: machine-readable; --all:\n"
      "          every counter of every tier and worker, with what it means)\n"
      "  workers the attached workers: id, pid, name, requests, transfers\n"
      "  metrics the statistics in Prometheus text format, every series\n"
      "          labelled with the store and model (for a textfile collector;\n"
      "          tierkvd --metrics-listen serves the same text over HTTP)\n"
      "  watch   the stats table, refreshed every --interval seconds, with\n"
      "          the counters' rates per second since the refresh before\n"
      "  events  the transfer events in flight, oldest first: age, worker,\n"
      "          kind (load, store), id, request, blocks, state (promoting:\n"
      "          a load waiting for blocks from disk; ready: waiting for its\n"
      "          worker to take it; copying: the worker has not completed\n"
      "          it) (--json: machine-readable)\n"
      "  clear --tier host|disk|all\n"
      "          drop every cached block of the tier that nothing pins\n"
      "          (blocks pinned by lookups, loads, stores, spills or\n"
      "          promotions stay); disk means every tier below host (disk\n"
      "          and remote); says how many were dropped per tier (a block\n"
      "          on both disk and remote counts in each) and how many were\n"
      "          kept because pinned\n"
      "  evict KEY [KEY...]\n"
      "          drop these blocks (32 hex digits each, as tierkvd logs\n"
      "          them) from host, unless pinned, and from disk and remote;\n"
      "          says per key the tiers it was dropped from, \"pinned,\n"
      "          kept\" or \"not cached\"\n"
      "  keys [TOKEN...]\n"
      "          the block keys tierkvd stores a prompt under, from its token\n"
      "          ids (arguments, or standard input when none are given:\n"
      "          numbers separated by spaces or commas), one line per full\n"
      "          block: the key, as evict takes it, and the block's tokens.\n"
      "          Keys depend on the store's model and layout (asked of\n"
      "          tierkvd) and on --tenant, --lora and --cache-salt as the\n"
      "          engine passed them; with --log-level debug tierkvd logs\n"
      "          each key it stores, spills and promotes\n"
      "  held    the keys each tier serves now, one line each: CPU (host),\n"
      "          DISK or REMOTE (the blocks this tierkvd wrote to\n"
      "          --remote-redis), then the key; what tierkvd's KV cache\n"
      "          events (--kv-events-endpoint) describe. At most 16384 per\n"
      "          tier; a '#' line says when the list is cut (--json:\n"
      "          machine-readable). Operators only: it lists every\n"
      "          tenant's keys\n"
      "  route [TOKEN...]\n"
      "          where a prompt (token ids, as keys takes them) is cached,\n"
      "          for a router: per tierkvd (--node NAME=SOCKET, repeated;\n"
      "          default the one --store or --socket names) the tokens of\n"
      "          the longest cached prefix, how many are on host and how\n"
      "          many only on the lower tier (disk, remote), and the\n"
      "          workers of --tenant attached there, which can all load it;\n"
      "          then the node with the longest prefix. Pins nothing\n"
      "          (--json: machine-readable)\n\n"
      "Options");
  desc.add_options()("help,h", "show this help and exit")(
      "version", "print tierkv-admin's version and exit")(
      "store", po::value(&store)->default_value(store),
      "store name (finds the default socket)")(
      "socket", po::value(&command.socket_path),
      "tierkvd's socket (overrides --store)")(
      "json", po::bool_switch(&command.json),
      "stats, events, held, route, clear, evict: machine-readable output")(
      "all", po::bool_switch(&command.all),
      "stats: every field of every tier and worker, one per line, with its "
      "meaning")(
      "source", po::value(&command.source)->default_value(command.source),
      "stats, workers, metrics, watch: where the numbers come from. page: "
      "tierkvd's stats page (/dev/shm/tierkv.<store>.stats), read without "
      "asking tierkvd anything; socket: ask tierkvd; auto: the page when it "
      "is fresh and its tierkvd serves --socket, else the socket")(
      "tier", po::value(&tier), "clear: host, disk or all")(
      "node", po::value(&nodes),
      "route: a tierkvd to ask, as NAME=SOCKET (repeat for each node)")(
      "tenant", po::value(&command.tenant),
      "keys, route: the worker's tenant as tierkvd records it (another "
      "user's worker's tenant T is uid<UID>/T). Default: none")(
      "lora", po::value<uint64_t>(),
      "keys, route: the request's LoRA adapter id. Default: none")(
      "cache-salt", po::value(&command.extras.cache_salt),
      "keys, route: the request's cache salt. Default: none")(
      "interval", po::value(&command.interval_seconds)->default_value(1.0, "1"),
      "watch: seconds between refreshes, 0.05 to 86400")(
      "count", po::value(&command.count)->default_value(0),
      "watch: stop after this many refreshes (0: until interrupted)");
  po::options_description hidden;
  hidden.add_options()("verb", po::value(&command.verb))("args",
                                                         po::value(&args));
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description positional;
  positional.add("verb", 1).add("args", -1);
  std::ostringstream help;
  help << desc;
  command.help_text = help.str();
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv)
                  .options(all)
                  .positional(positional)
                  .run(),
              vm);
    po::notify(vm);
    if (vm.count("lora") != 0) {
      command.extras.lora_id = vm["lora"].as<uint64_t>();
    }
    if (vm.count("help") != 0 || command.verb.empty()) {
      command.show_help = true;
      return command;
    }
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  if (command.verb != "stats" && command.verb != "workers" &&
      command.verb != "metrics" && command.verb != "watch" &&
      command.verb != "events" && command.verb != "clear" &&
      command.verb != "evict" && command.verb != "keys" &&
      command.verb != "held" && command.verb != "route") {
    return Status::InvalidArgument(
        "unknown command '" + command.verb +
        "' (try: stats, workers, metrics, watch, events, clear, evict, "
        "keys, held, route)");
  }
  if (!nodes.empty() && command.verb != "route") {
    return Status::InvalidArgument("--node is for route only");
  }
  for (const std::string& node : nodes) {
    const size_t eq = node.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == node.size()) {
      return Status::InvalidArgument("--node '" + node +
                                     "': expected NAME=SOCKET");
    }
    command.nodes.emplace_back(node.substr(0, eq), node.substr(eq + 1));
  }
  TIERKV_RETURN_IF_ERROR(ParseOrderArgs(tier, args, &command));
  // A day at most: a longer sleep would overflow the clock's nanoseconds.
  if (!(command.interval_seconds >= 0.05 &&
        command.interval_seconds <= 86400) ||
      command.count < 0) {
    return Status::InvalidArgument(
        "--interval must be from 0.05 to 86400 s and --count at least 0");
  }
  if (command.source != "auto" && command.source != "page" &&
      command.source != "socket") {
    return Status::InvalidArgument("--source '" + command.source +
                                   "': use auto, page or socket");
  }
  command.socket_given = !command.socket_path.empty();
  if (!command.socket_given) {
    command.socket_path = ipc::DefaultSocketPath(store);
  }
  command.stats_page = ipc::StatsPageName(store);
  return command;
}

namespace {

// tierkvd's reply to `request`; nullopt after saying on `err` why there is
// none, with the exit code in *code.
std::optional<ipc::Message> Ask(const std::string& socket_path,
                                const ipc::Message& request, std::ostream& err,
                                int* code) {
  StatusOr<ipc::Message> reply = ipc::SocketCall(socket_path, request);
  if (!reply.ok()) {
    const Status& s = reply.status();
    if (s.code() == StatusCode::kPermissionDenied) {
      err << "tierkv-admin: permission denied on " << socket_path
          << " (run as tierkvd's user or a member of its --group)\n";
      *code = 1;
    } else {
      err << "tierkv-admin: " << s.message() << "\n";
      *code = 3;
    }
    return std::nullopt;
  }
  if (Status s = ipc::StatusOf(*reply); !s.ok()) {
    err << "tierkv-admin: tierkvd refused: " << s.ToString() << "\n";
    *code = 1;
    return std::nullopt;
  }
  return std::move(*reply);
}

// keys, route: the token ids given, or read from `in` when none were;
// nullopt after saying on `err` why they cannot be read.
std::optional<std::vector<TokenId>> CommandTokens(const AdminCommand& command,
                                                  std::istream& in,
                                                  std::ostream& err) {
  if (!command.tokens_from_stdin) return command.tokens;
  std::ostringstream text;
  text << in.rdbuf();
  StatusOr<std::vector<TokenId>> tokens = ParseTokenIds(text.str());
  if (!tokens.ok()) {
    err << "tierkv-admin: standard input: " << tokens.status().message()
        << "\n";
    return std::nullopt;
  }
  return std::move(*tokens);
}

int Unexpected(std::ostream& err) {
  err << "tierkv-admin: unexpected reply from tierkvd\n";
  return 1;
}

// Statistics and where they came from.
struct StatsRead {
  CoordinatorStats stats;
  // Set when read from the stats page: how old the snapshot was.
  std::optional<std::chrono::system_clock::duration> page_age;
};

// The snapshot in the stats page, or why it will not do.
StatusOr<StatsRead> ReadStatsPage(const AdminCommand& command) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::StatsPageReader reader,
      ipc::StatsPageReader::Open(command.stats_page, command.socket_path));
  TIERKV_ASSIGN_OR_RETURN(ipc::StatsPageSnapshot snapshot, reader.Read());
  const auto now = std::chrono::system_clock::now();
  if (!ipc::StatsPageIsFresh(snapshot, now)) {
    return Status::Unavailable(
        "stats page " + command.stats_page + " is stale: tierkvd pid " +
        std::to_string(snapshot.pid) + " is gone or stopped publishing");
  }
  if (command.socket_given && snapshot.socket_path != command.socket_path) {
    return Status::FailedPrecondition(
        "stats page " + command.stats_page + " belongs to the tierkvd at " +
        snapshot.socket_path + ", not " + command.socket_path +
        " (give --store too)");
  }
  return StatsRead{std::move(snapshot.stats), now - snapshot.published_at};
}

// The statistics, from the page or the socket as --source says; nullopt
// after saying on `err` why there are none, with the exit code in *code.
std::optional<StatsRead> ReadStats(const AdminCommand& command,
                                   std::ostream& err, int* code) {
  if (command.source != "socket") {
    StatusOr<StatsRead> page = ReadStatsPage(command);
    if (page.ok()) return std::move(*page);
    if (command.source == "page") {
      err << "tierkv-admin: " << page.status().message() << "\n";
      // 3 says no tierkvd publishes; a page that is there but will not do
      // (another tierkvd's, another version's, unreadable) is a failure.
      const StatusCode c = page.status().code();
      *code =
          c == StatusCode::kNotFound || c == StatusCode::kUnavailable ? 3 : 1;
      return std::nullopt;
    }
  }
  std::optional<ipc::Message> reply =
      Ask(command.socket_path, ipc::StatsRequest{}, err, code);
  if (!reply.has_value()) return std::nullopt;
  auto* stats = std::get_if<ipc::StatsReply>(&*reply);
  if (stats == nullptr) {
    *code = Unexpected(err);
    return std::nullopt;
  }
  return StatsRead{std::move(stats->stats), std::nullopt};
}

std::string SourceLine(const StatsRead& read) {
  if (!read.page_age.has_value()) return "source: tierkvd's socket\n";
  const auto age =
      std::chrono::duration_cast<std::chrono::microseconds>(*read.page_age);
  return "source: stats page, " +
         FormatAge(static_cast<uint64_t>(std::max<int64_t>(0, age.count()))) +
         " old\n";
}

// The stats table every --interval seconds, with the counters' rates since
// the refresh before.
int Watch(const AdminCommand& command, std::ostream& out, std::ostream& err) {
  const bool redraw = &out == &std::cout && isatty(STDOUT_FILENO);
  std::optional<CoordinatorStats> before;
  std::chrono::steady_clock::time_point read_at;
  for (int64_t i = 0; command.count == 0 || i < command.count; ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(
          std::chrono::duration<double>(command.interval_seconds));
    }
    int code = 0;
    std::optional<StatsRead> read = ReadStats(command, err, &code);
    if (!read.has_value()) return code;
    const auto now = std::chrono::steady_clock::now();
    if (redraw) out << "\033[H\033[2J";  // Home, clear: redraw in place.
    out << FormatStatsTable(read->stats) << SourceLine(*read);
    if (before.has_value()) {
      out << FormatRates(*before, read->stats,
                         std::chrono::duration<double>(now - read_at).count());
    }
    out.flush();
    before = std::move(read->stats);
    read_at = now;
  }
  return 0;
}

}  // namespace

int RunAdmin(const AdminCommand& command, std::ostream& out, std::ostream& err,
             std::istream& in) {
  if (command.verb == "watch") return Watch(command, out, err);
  int code = 0;
  if (command.verb == "clear") {
    std::optional<ipc::Message> reply =
        Ask(command.socket_path, ipc::ClearRequest{command.tiers}, err, &code);
    if (!reply.has_value()) return code;
    const auto* clear = std::get_if<ipc::ClearReply>(&*reply);
    if (clear == nullptr) return Unexpected(err);
    out << (command.json ? FormatClearJson(command.tiers, clear->result)
                         : FormatClear(command.tiers, clear->result));
    return 0;
  }
  if (command.verb == "evict") {
    std::optional<ipc::Message> reply =
        Ask(command.socket_path, ipc::EvictRequest{command.keys}, err, &code);
    if (!reply.has_value()) return code;
    const auto* evict = std::get_if<ipc::EvictReply>(&*reply);
    if (evict == nullptr || evict->blocks.size() != command.keys.size()) {
      return Unexpected(err);
    }
    out << (command.json ? FormatEvictJson(evict->blocks)
                         : FormatEvict(evict->blocks));
    return 0;
  }
  if (command.verb == "held") {
    std::optional<ipc::Message> reply =
        Ask(command.socket_path, ipc::HeldKeysRequest{}, err, &code);
    if (!reply.has_value()) return code;
    const auto* held = std::get_if<ipc::HeldKeysReply>(&*reply);
    if (held == nullptr) return Unexpected(err);
    out << (command.json ? FormatHeldKeysJson(held->keys)
                         : FormatHeldKeys(held->keys));
    return 0;
  }
  if (command.verb == "route") {
    std::optional<std::vector<TokenId>> tokens =
        CommandTokens(command, in, err);
    if (!tokens.has_value()) return 2;
    std::vector<std::pair<std::string, std::string>> asked = command.nodes;
    if (asked.empty()) asked.emplace_back("local", command.socket_path);
    std::vector<NodeRoute> routes;
    bool any = false;
    for (const auto& [node, socket] : asked) {
      NodeRoute& r =
          routes.emplace_back(NodeRoute{.node = node, .socket = socket});
      StatusOr<ipc::Message> reply =
          ipc::SocketCall(socket, ipc::RouteRequest{.tenant = command.tenant,
                                                    .tokens = *tokens,
                                                    .extras = command.extras});
      if (!reply.ok()) {
        r.route = reply.status();
      } else if (Status s = ipc::StatusOf(*reply); !s.ok()) {
        r.route = s;
      } else if (const auto* route = std::get_if<ipc::RouteReply>(&*reply)) {
        r.route = route->result;
        any = true;
      } else {
        r.route = Status::DataLoss("unexpected reply from tierkvd");
      }
    }
    out << (command.json ? FormatRouteJson(routes) : FormatRoute(routes));
    return any ? 0 : 3;
  }
  if (command.verb == "events") {
    std::optional<ipc::Message> reply =
        Ask(command.socket_path, ipc::EventsRequest{}, err, &code);
    if (!reply.has_value()) return code;
    const auto* events = std::get_if<ipc::EventsReply>(&*reply);
    if (events == nullptr) return Unexpected(err);
    out << (command.json
                ? FormatEventsJson(events->events, events->in_flight)
                : FormatEventsTable(events->events, events->in_flight));
    return 0;
  }
  std::optional<StatsRead> read = ReadStats(command, err, &code);
  if (!read.has_value()) return code;
  if (command.verb == "keys") {
    std::optional<std::vector<TokenId>> tokens =
        CommandTokens(command, in, err);
    if (!tokens.has_value()) return 2;
    out << FormatKeys(read->stats, command.tenant, command.extras, *tokens);
  } else if (command.verb == "workers") {
    out << FormatWorkers(read->stats);
  } else if (command.verb == "metrics") {
    out << FormatMetrics(read->stats);
    if (read->page_age.has_value()) {
      out << "# HELP tierkv_stats_age_seconds How old the stats page's "
             "snapshot was when read.\n"
             "# TYPE tierkv_stats_age_seconds gauge\n"
             "tierkv_stats_age_seconds{"
          << MetricBaseLabels(read->stats) << "} "
          << MetricValue(std::chrono::duration<double>(*read->page_age).count())
          << "\n";
    }
  } else if (command.json) {
    out << FormatStatsJson(read->stats);
  } else if (command.all) {
    out << FormatStatsFields(read->stats) << SourceLine(*read);
  } else {
    out << FormatStatsTable(read->stats) << SourceLine(*read);
  }
  return 0;
}

}  // namespace tierkv::admin
