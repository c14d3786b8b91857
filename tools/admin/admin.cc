#include "tools/admin/admin.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <sstream>

#include "ipc/server.h"
#include "ipc/socket_call.h"

namespace tierkv::admin {
namespace po = boost::program_options;
namespace {

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", bytes,
                kUnits[unit]);
  return buf;
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * part / whole);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

StatusOr<AdminCommand> ParseAdminFlags(int argc, const char* const* argv) {
  AdminCommand command;
  std::string store = "default";
  po::options_description desc(
      "tierkv-admin: inspect a running tierkvd.\n\n"
      "usage: tierkv-admin stats [--json] [--store NAME | --socket PATH]\n\n"
      "Commands:\n"
      "  stats   per tier (host, and disk when tierkvd has one): capacity,\n"
      "          used, cached, pinned, hits, misses, evictions, transfers\n"
      "          in flight; spills, promotions and checksum failures; then\n"
      "          the attached workers\n\n"
      "Options");
  desc.add_options()("help,h", "show this help and exit")(
      "store", po::value(&store)->default_value(store),
      "store name (finds the default socket)")(
      "socket", po::value(&command.socket_path),
      "tierkvd's socket (overrides --store)")(
      "json", po::bool_switch(&command.json), "machine-readable output");
  po::options_description hidden;
  hidden.add_options()("verb", po::value(&command.verb));
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description positional;
  positional.add("verb", 1);
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
    if (vm.count("help") != 0 || command.verb.empty()) {
      command.show_help = true;
      return command;
    }
  } catch (const po::error& e) {
    return Status::InvalidArgument(e.what());
  }
  if (command.verb != "stats") {
    return Status::InvalidArgument("unknown command '" + command.verb +
                                   "' (try: stats)");
  }
  if (command.socket_path.empty()) {
    command.socket_path = ipc::DefaultSocketPath(store);
  }
  return command;
}

std::string FormatStatsTable(const CoordinatorStats& stats) {
  const HostTierStats& h = stats.host;
  const int64_t used = h.used_slots;
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-6s %11s %11s %11s %8s %10s %10s %8s %10s %9s\n", "tier",
                "capacity", "used", "cached", "pinned", "hits", "misses",
                "hit rate", "evictions", "in flight");
  out << line;
  std::snprintf(line, sizeof(line),
                "%-6s %11s %11s %11s %8lld %10llu %10llu %8s %10llu %9llu\n",
                "host",
                HumanBytes(double(h.capacity_slots) * h.slot_bytes).c_str(),
                HumanBytes(double(used) * h.slot_bytes).c_str(),
                HumanBytes(double(h.cached_slots) * h.slot_bytes).c_str(),
                static_cast<long long>(h.pinned_slots),
                static_cast<unsigned long long>(h.hit_blocks),
                static_cast<unsigned long long>(h.miss_blocks),
                Percent(h.hit_blocks, h.lookup_blocks).c_str(),
                static_cast<unsigned long long>(h.evictions),
                static_cast<unsigned long long>(h.events_in_flight));
  out << line;
  out << "  (hits and misses count blocks; " << h.capacity_slots << " slots of "
      << HumanBytes(double(h.slot_bytes)) << "; stored " << h.stores_completed
      << ", loaded " << h.loads_completed << ", failed stores "
      << h.stores_failed << ", not stored (tier full) " << h.store_skipped
      << ")\n";
  if (stats.disk.has_value()) {
    const DiskTierStats& d = *stats.disk;
    std::snprintf(line, sizeof(line),
                  "%-6s %11s %11s %11s %8s %10llu %10llu %8s %10llu %9llu\n",
                  "disk", HumanBytes(double(d.capacity_bytes)).c_str(),
                  HumanBytes(double(d.bytes)).c_str(), "-", "-",
                  static_cast<unsigned long long>(h.disk_hit_blocks),
                  static_cast<unsigned long long>(d.misses),
                  Percent(h.disk_hit_blocks, h.lookup_blocks).c_str(),
                  static_cast<unsigned long long>(d.evictions),
                  static_cast<unsigned long long>(h.spills_in_flight +
                                                  h.promotions_in_flight));
    out << line;
    out << "  (" << d.keys << " blocks in " << HumanBytes(double(d.file_bytes))
        << " of files; spilled " << h.spills << ", dropped from host (already "
        << "on disk) " << h.spill_drops << ", failed spills "
        << h.spill_failures << "; promoted " << h.promotions
        << ", failed promotions " << h.promotion_failures
        << "; checksum failures " << d.checksum_failures << ", dropped on open "
        << d.dropped_on_open << ")\n";
  }
  out << "\n";
  out << "workers: " << stats.workers.size() << "\n";
  if (!stats.workers.empty()) {
    std::snprintf(line, sizeof(line), "  %-6s %-8s %-20s %8s %7s %7s\n", "id",
                  "pid", "name", "requests", "loads", "stores");
    out << line;
  }
  for (const WorkerStats& w : stats.workers) {
    std::snprintf(line, sizeof(line), "  %-6u %-8d %-20s %8u %7u %7u\n", w.id,
                  w.pid, w.name.substr(0, 20).c_str(), w.requests,
                  w.loads_in_flight, w.stores_in_flight);
    out << line;
  }
  return out.str();
}

std::string FormatStatsJson(const CoordinatorStats& stats) {
  const HostTierStats& h = stats.host;
  std::ostringstream out;
  out << "{\"tiers\":{\"host\":{"
      << "\"slot_bytes\":" << h.slot_bytes
      << ",\"capacity_slots\":" << h.capacity_slots
      << ",\"capacity_bytes\":" << h.capacity_slots * h.slot_bytes
      << ",\"free_slots\":" << h.free_slots
      << ",\"used_slots\":" << h.used_slots
      << ",\"cached_slots\":" << h.cached_slots
      << ",\"pinned_slots\":" << h.pinned_slots << ",\"lookups\":" << h.lookups
      << ",\"lookup_blocks\":" << h.lookup_blocks
      << ",\"hits\":" << h.hit_blocks << ",\"misses\":" << h.miss_blocks
      << ",\"evictions\":" << h.evictions
      << ",\"stores_completed\":" << h.stores_completed
      << ",\"loads_completed\":" << h.loads_completed
      << ",\"stores_failed\":" << h.stores_failed
      << ",\"store_skipped\":" << h.store_skipped
      << ",\"events_in_flight\":" << h.events_in_flight
      << ",\"disk_hits\":" << h.disk_hit_blocks << ",\"spills\":" << h.spills
      << ",\"spill_drops\":" << h.spill_drops
      << ",\"spill_failures\":" << h.spill_failures
      << ",\"promotions\":" << h.promotions
      << ",\"promotion_failures\":" << h.promotion_failures
      << ",\"spills_in_flight\":" << h.spills_in_flight
      << ",\"promotions_in_flight\":" << h.promotions_in_flight << "}";
  if (stats.disk.has_value()) {
    const DiskTierStats& d = *stats.disk;
    out << ",\"disk\":{\"capacity_bytes\":" << d.capacity_bytes
        << ",\"bytes\":" << d.bytes << ",\"keys\":" << d.keys
        << ",\"file_bytes\":" << d.file_bytes << ",\"puts\":" << d.puts
        << ",\"put_failures\":" << d.put_failures << ",\"gets\":" << d.gets
        << ",\"hits\":" << d.hits << ",\"misses\":" << d.misses
        << ",\"evictions\":" << d.evictions
        << ",\"checksum_failures\":" << d.checksum_failures
        << ",\"token_mismatches\":" << d.token_mismatches
        << ",\"dropped_on_open\":" << d.dropped_on_open
        << ",\"layout_mismatches\":" << d.layout_mismatches
        << ",\"payload_bytes_written\":" << d.payload_bytes_written
        << ",\"stored_bytes_written\":" << d.stored_bytes_written << "}";
  }
  out << "},\"workers\":[";
  for (size_t i = 0; i < stats.workers.size(); ++i) {
    const WorkerStats& w = stats.workers[i];
    out << (i ? "," : "") << "{\"id\":" << w.id << ",\"pid\":" << w.pid
        << ",\"name\":" << JsonString(w.name) << ",\"requests\":" << w.requests
        << ",\"loads_in_flight\":" << w.loads_in_flight
        << ",\"stores_in_flight\":" << w.stores_in_flight << "}";
  }
  out << "]}\n";
  return out.str();
}

int RunAdmin(const AdminCommand& command, std::ostream& out,
             std::ostream& err) {
  StatusOr<ipc::Message> reply =
      ipc::SocketCall(command.socket_path, ipc::StatsRequest{});
  if (!reply.ok()) {
    const Status& s = reply.status();
    if (s.code() == StatusCode::kPermissionDenied) {
      err << "tierkv-admin: permission denied on " << command.socket_path
          << " (run as tierkvd's user or a member of its --group)\n";
      return 1;
    }
    err << "tierkv-admin: " << s.message() << "\n";
    return 3;
  }
  if (Status s = ipc::StatusOf(*reply); !s.ok()) {
    err << "tierkv-admin: tierkvd refused: " << s.ToString() << "\n";
    return 1;
  }
  const auto* stats = std::get_if<ipc::StatsReply>(&*reply);
  if (stats == nullptr) {
    err << "tierkv-admin: unexpected reply from tierkvd\n";
    return 1;
  }
  out << (command.json ? FormatStatsJson(stats->stats)
                       : FormatStatsTable(stats->stats));
  return 0;
}

}  // namespace tierkv::admin
