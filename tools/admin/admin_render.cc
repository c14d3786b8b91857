// tierkv-admin's renderings: the stats table, workers, JSON, Prometheus
// metrics, events by age, and what clear and evict dropped.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "src/printable.h"
#include "tierkv/block_key.h"
#include "tools/admin/admin.h"
#include "tools/admin/admin_internal.h"

namespace tierkv::admin {
namespace {

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * part / whole);
  return buf;
}

// A Prometheus label value, quoted and escaped.
std::string LabelValue(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
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

std::string FormatAge(uint64_t age_us) {
  char buf[32];
  if (age_us < 1'000) {
    std::snprintf(buf, sizeof(buf), "%llu us",
                  static_cast<unsigned long long>(age_us));
  } else if (age_us < 1'000'000) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", age_us / 1e3);
  } else if (age_us < 60'000'000) {
    std::snprintf(buf, sizeof(buf), "%.1f s", age_us / 1e6);
  } else {
    const unsigned long long s = age_us / 1'000'000;
    if (s < 3600) {
      std::snprintf(buf, sizeof(buf), "%llum%02llus", s / 60, s % 60);
    } else {
      std::snprintf(buf, sizeof(buf), "%lluh%02llum", s / 3600, s / 60 % 60);
    }
  }
  return buf;
}

namespace {

// " (mean 1.2 ms)", or nothing before the first event.
std::string MeanAge(const EventLatency& latency) {
  if (latency.count == 0) return "";
  return " (mean " + FormatAge(latency.sum_us / latency.count) + ")";
}

}  // namespace

namespace {

// The remote tier's row of the stats table, and a line of its details.
std::string FormatRemoteRow(const RemoteTierStats& r) {
  char line[256];
  std::snprintf(
      line, sizeof(line),
      "%-6s %11s %11s %11s %8s %10llu %10llu %8s %10llu  %s\n", "remote",
      r.capacity_bytes == 0 ? "-"
                            : HumanBytes(double(r.capacity_bytes)).c_str(),
      HumanBytes(double(r.bytes)).c_str(), "-", "-",
      static_cast<unsigned long long>(r.hits),
      static_cast<unsigned long long>(r.misses),
      Percent(r.hits, r.gets).c_str(),
      static_cast<unsigned long long>(r.evictions),
      ("errors " + std::to_string(r.errors)).c_str());
  std::ostringstream out;
  out << line;
  out << "  (" << r.keys << " blocks written here, " << r.known_keys
      << " known (scans: " << r.scan_passes << " whole, " << r.scan_failures
      << " cut short); puts " << r.puts << ", failed puts " << r.put_failures
      << "; read " << HumanBytes(double(r.bytes_read)) << ", written "
      << HumanBytes(double(r.bytes_written)) << "; checksum failures "
      << r.checksum_failures << ", other blocks under a key "
      << r.token_mismatches << ")\n";
  return out.str();
}

}  // namespace

std::string FormatStatsTable(const CoordinatorStats& stats) {
  const HostTierStats& h = stats.host;
  const int64_t used = h.used_slots;
  std::ostringstream out;
  out << "model " << ModelDisplayName(stats.model);
  if (!stats.store.empty()) out << ", store " << stats.store;
  if (!stats.version.empty()) out << ", tierkvd " << stats.version;
  out << "\n";
  // Each tier's hits and misses are over its own lookups (blocks): host
  // sees every block looked up, disk the blocks host did not hold.
  const uint64_t host_misses = h.lookup_blocks - h.hit_blocks;
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-6s %11s %11s %11s %8s %10s %10s %8s %10s  %s\n", "tier",
                "capacity", "used", "cached", "pinned", "hits", "misses",
                "hit rate", "evictions", "in flight");
  out << line;
  std::snprintf(line, sizeof(line),
                "%-6s %11s %11s %11s %8lld %10llu %10llu %8s %10llu  %s\n",
                "host",
                HumanBytes(double(h.capacity_slots) * h.slot_bytes).c_str(),
                HumanBytes(double(used) * h.slot_bytes).c_str(),
                HumanBytes(double(h.cached_slots) * h.slot_bytes).c_str(),
                static_cast<long long>(h.pinned_slots),
                static_cast<unsigned long long>(h.hit_blocks),
                static_cast<unsigned long long>(host_misses),
                Percent(h.hit_blocks, h.lookup_blocks).c_str(),
                static_cast<unsigned long long>(h.evictions),
                ("transfers " + std::to_string(h.events_in_flight)).c_str());
  out << line;
  out << "  (hits and misses count blocks; " << h.capacity_slots << " slots of "
      << HumanBytes(double(h.slot_bytes)) << "; stored " << h.stores_completed
      << ", loaded " << h.loads_completed << ", failed stores "
      << h.stores_failed << ", not stored (tier full) " << h.store_skipped
      << ")\n";
  if (stats.disk.has_value()) {
    const DiskTierStats& d = *stats.disk;
    const std::string in_flight =
        "spills " + std::to_string(h.spills_in_flight) + ", promotions " +
        std::to_string(h.promotions_in_flight);
    std::snprintf(line, sizeof(line),
                  "%-6s %11s %11s %11s %8s %10llu %10llu %8s %10llu  %s\n",
                  "disk", HumanBytes(double(d.capacity_bytes)).c_str(),
                  HumanBytes(double(d.bytes)).c_str(), "-", "-",
                  static_cast<unsigned long long>(h.disk_hit_blocks),
                  static_cast<unsigned long long>(h.miss_blocks),
                  Percent(h.disk_hit_blocks, host_misses).c_str(),
                  static_cast<unsigned long long>(d.evictions),
                  in_flight.c_str());
    out << line;
    out << "  (" << d.keys << " blocks in ";
    if (d.file_bytes == 0 && d.keys > 0) {
      out << "files not flushed yet";
    } else {
      out << HumanBytes(double(d.file_bytes)) << " of files";
    }
    out << "; spilled " << h.spills << ", dropped from host (already "
        << "on disk) " << h.spill_drops << ", failed spills "
        << h.spill_failures << ", evicted from host unspilled "
        << h.evicted_unspilled << "; promoted " << h.promotions
        << ", failed promotions " << h.promotion_failures
        << "; checksum failures " << d.checksum_failures << ", read errors "
        << d.read_errors << ", dropped on open " << d.dropped_on_open
        << " (of another layout or model " << d.layout_mismatches << "))\n";
  }
  if (stats.remote.has_value()) out << FormatRemoteRow(*stats.remote);
  out << "events in flight: " << h.events_in_flight;
  if (h.loads_cancelled > 0) {
    out << " (loads cancelled by an aborted request: " << h.loads_cancelled
        << ")";
  }
  if (h.events_in_flight > 0) {
    out << ", oldest " << FormatAge(stats.oldest_event_age_us);
  }
  out << "; completed: loads " << stats.load_latency.count
      << MeanAge(stats.load_latency) << ", stores " << stats.store_latency.count
      << MeanAge(stats.store_latency) << "\n";
  const AttachStats& a = stats.attach;
  out << "workers attached " << a.attached << ", detached " << a.detached
      << ", refused " << a.refused << "\n\n";
  out << FormatWorkers(stats);
  return out.str();
}

std::string FormatRates(const CoordinatorStats& before,
                        const CoordinatorStats& after, double seconds) {
  if (!(seconds > 0)) return "";
  const HostTierStats& a = before.host;
  const HostTierStats& b = after.host;
  // Counters only grow; a restarted tierkvd starts them again at 0.
  auto rate = [seconds](uint64_t from, uint64_t to) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f",
                  to >= from ? double(to - from) / seconds : 0.0);
    return std::string(buf);
  };
  std::ostringstream out;
  out << "per second: lookups " << rate(a.lookups, b.lookups)
      << ", blocks looked up " << rate(a.lookup_blocks, b.lookup_blocks)
      << ", host hits " << rate(a.hit_blocks, b.hit_blocks);
  if (after.disk.has_value()) {
    out << ", disk hits " << rate(a.disk_hit_blocks, b.disk_hit_blocks);
  }
  out << ", misses " << rate(a.miss_blocks, b.miss_blocks) << "\n  stored "
      << rate(a.stores_completed, b.stores_completed) << ", loaded "
      << rate(a.loads_completed, b.loads_completed) << ", host evictions "
      << rate(a.evictions, b.evictions);
  if (after.disk.has_value()) {
    out << ", spilled " << rate(a.spills, b.spills) << ", promoted "
        << rate(a.promotions, b.promotions);
    if (before.disk.has_value()) {
      out << ", disk evictions "
          << rate(before.disk->evictions, after.disk->evictions);
    }
  }
  out << "\n";
  return out.str();
}

std::string FormatWorkers(const CoordinatorStats& stats) {
  std::ostringstream out;
  char line[256];
  out << "workers: " << stats.workers.size() << "\n";
  if (!stats.workers.empty()) {
    std::snprintf(line, sizeof(line), "  %-6s %-8s %-20s %8s %7s %7s  %s\n",
                  "id", "pid", "name", "requests", "loads", "stores", "role");
    out << line;
  }
  for (const WorkerStats& w : stats.workers) {
    std::snprintf(line, sizeof(line), "  %-6u %-8d %-20s %8u %7u %7u  %s\n",
                  w.id, w.pid, PrintableName(w.name).substr(0, 20).c_str(),
                  w.requests, w.loads_in_flight, w.stores_in_flight,
                  w.role.c_str());
    out << line;
  }
  return out.str();
}

namespace {

// A stats struct as a JSON object's members, one per field of its table
// (tierkv/stats.h), in table order.
template <typename Stats>
void JsonFields(std::ostringstream& out, const Stats& s) {
  bool first = true;
  Stats::ForEachField(s, [&](const StatField& f, const auto& v) {
    out << (first ? "" : ",") << "\"" << f.name << "\":";
    first = false;
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      out << JsonString(v);
    } else {
      out << +v;
    }
  });
}

// "name value  help" lines, one per field of a table.
template <typename Stats>
void FieldLines(std::ostringstream& out, const Stats& s) {
  Stats::ForEachField(s, [&](const StatField& f, const auto& v) {
    std::ostringstream value;
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
      value << v;
    } else {
      value << +v;
    }
    char line[512];
    std::snprintf(line, sizeof(line), "  %-22s %14s  %s\n", f.name,
                  value.str().c_str(), f.help);
    out << line;
  });
}

}  // namespace

std::string FormatStatsJson(const CoordinatorStats& stats) {
  const HostTierStats& h = stats.host;
  std::ostringstream out;
  out << "{\"store\":" << JsonString(stats.store)
      << ",\"model\":" << JsonString(stats.model)
      << ",\"version\":" << JsonString(stats.version)
      << ",\"tiers\":{\"host\":{";
  JsonFields(out, h);
  out << ",\"capacity_bytes\":" << h.capacity_slots * h.slot_bytes << "}";
  if (stats.disk.has_value()) {
    out << ",\"disk\":{";
    JsonFields(out, *stats.disk);
    out << "}";
  }
  if (stats.remote.has_value()) {
    out << ",\"remote\":{";
    JsonFields(out, *stats.remote);
    out << "}";
  }
  out << "},\"events\":{\"in_flight\":" << h.events_in_flight
      << ",\"oldest_age_us\":" << stats.oldest_event_age_us
      << ",\"loads_completed\":" << stats.load_latency.count
      << ",\"load_us_sum\":" << stats.load_latency.sum_us
      << ",\"stores_completed\":" << stats.store_latency.count
      << ",\"store_us_sum\":" << stats.store_latency.sum_us
      << ",\"spills_finished\":" << stats.spill_latency.count
      << ",\"spill_us_sum\":" << stats.spill_latency.sum_us
      << ",\"promotions_finished\":" << stats.promotion_latency.count
      << ",\"promotion_us_sum\":" << stats.promotion_latency.sum_us;
  out << "},\"attach\":{";
  JsonFields(out, stats.attach);
  out << "},\"workers\":[";
  for (size_t i = 0; i < stats.workers.size(); ++i) {
    out << (i ? "," : "") << "{";
    JsonFields(out, stats.workers[i]);
    out << "}";
  }
  out << "]}\n";
  return out.str();
}

std::string FormatStatsFields(const CoordinatorStats& stats) {
  std::ostringstream out;
  out << "model " << ModelDisplayName(stats.model);
  if (!stats.store.empty()) out << ", store " << stats.store;
  if (!stats.version.empty()) out << ", tierkvd " << stats.version;
  out << "\nhost tier:\n";
  FieldLines(out, stats.host);
  if (stats.disk.has_value()) {
    out << "disk tier:\n";
    FieldLines(out, *stats.disk);
  }
  if (stats.remote.has_value()) {
    out << "remote tier:\n";
    FieldLines(out, *stats.remote);
  }
  out << "workers attaching:\n";
  FieldLines(out, stats.attach);
  for (const WorkerStats& w : stats.workers) {
    out << "worker " << w.id << " (" << PrintableName(w.name) << "):\n";
    FieldLines(out, w);
  }
  return out.str();
}

// The shortest text that reads back as exactly `value` ("0.1", not
// "0.10000000000000001"; "1048576", not "1.048576e+06").
std::string MetricValue(double value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : "NaN";
}

namespace {

// One metric family: its HELP and TYPE lines, then one sample per label set.
class MetricWriter {
 public:
  // `base`: the labels every sample carries (store and model), so that
  // series of several stores on one host keep apart.
  MetricWriter(std::ostringstream* out, std::string base)
      : out_(out), base_(std::move(base)) {}
  void Family(const char* name, const char* type, const char* help) {
    name_ = name;
    *out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " "
          << type << "\n";
  }
  void Sample(double value, const std::string& labels = "") {
    Sample("", value, labels);
  }
  // A sample of a histogram's _bucket, _sum or _count series.
  void Sample(const char* suffix, double value, const std::string& labels) {
    *out_ << name_ << suffix << "{" << base_
          << (labels.empty() ? "" : "," + labels) << "} " << MetricValue(value)
          << "\n";
  }
  // One histogram of event latencies, cumulative as Prometheus wants it.
  void Histogram(const EventLatency& latency, const std::string& labels) {
    uint64_t cumulative = 0;
    for (size_t b = 0; b < EventLatency::kBuckets; ++b) {
      cumulative += latency.buckets[b];
      char le[32] = "+Inf";
      if (b < std::size(EventLatency::kBucketMicros)) {
        std::snprintf(le, sizeof(le), "%g",
                      EventLatency::kBucketMicros[b] / 1e6);
      }
      Sample("_bucket", double(cumulative),
             labels + (labels.empty() ? "" : ",") + "le=\"" + std::string(le) +
                 "\"");
    }
    Sample("_sum", latency.sum_us / 1e6, labels);
    Sample("_count", double(latency.count), labels);
  }

 private:
  std::ostringstream* out_;
  const std::string base_;
  std::string name_;
};

}  // namespace

namespace {

// One metric family per numeric field of a table: tierkv_<prefix>_<field>,
// with _total for counters, its HELP from the table; one sample per
// (labels, stats) pair.
template <typename Stats>
void FieldFamilies(
    MetricWriter& m, const std::string& prefix,
    const std::vector<std::pair<std::string, const Stats*>>& samples) {
  if (samples.empty()) return;
  // One pass per sample: values[s][i] is field i of sample s (labels: 0).
  std::vector<StatField> fields;
  Stats::ForEachField(*samples[0].second, [&](const StatField& f, const auto&) {
    fields.push_back(f);
  });
  std::vector<std::vector<double>> values;
  for (const auto& sample : samples) {
    std::vector<double>& row = values.emplace_back();
    Stats::ForEachField(*sample.second, [&](const StatField&, const auto& v) {
      if constexpr (std::is_arithmetic_v<std::decay_t<decltype(v)>>) {
        row.push_back(static_cast<double>(v));
      } else {
        row.push_back(0);
      }
    });
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].kind == StatKind::kLabel) continue;
    const bool counter = fields[i].kind == StatKind::kCounter;
    const std::string family =
        "tierkv_" + prefix + "_" + fields[i].name + (counter ? "_total" : "");
    m.Family(family.c_str(), counter ? "counter" : "gauge", fields[i].help);
    for (size_t s = 0; s < samples.size(); ++s) {
      m.Sample(values[s][i], samples[s].first);
    }
  }
}

}  // namespace

std::string MetricBaseLabels(const CoordinatorStats& stats) {
  return "store=" + LabelValue(stats.store) +
         ",model=" + LabelValue(stats.model);
}

// Every field of every stats table as its own family (FieldFamilies), and
// the few families derived from several fields (bytes per tier and moved
// between tiers, latencies, the oldest event, the workers).
std::string FormatMetrics(const CoordinatorStats& stats) {
  const HostTierStats& h = stats.host;
  const double slot = static_cast<double>(h.slot_bytes);
  const bool disk = stats.disk.has_value();
  std::ostringstream out;
  MetricWriter m(&out, MetricBaseLabels(stats));
  m.Family("tierkv_build_info", "gauge",
           "Always 1: the tierkvd release serving the store.");
  m.Sample(1, "version=" + LabelValue(stats.version));
  m.Family("tierkv_tier_capacity_bytes", "gauge", "Bytes a tier can hold.");
  m.Sample(double(h.capacity_slots) * slot, "tier=\"host\"");
  if (disk) m.Sample(double(stats.disk->capacity_bytes), "tier=\"disk\"");
  if (stats.remote.has_value() && stats.remote->capacity_bytes > 0) {
    m.Sample(double(stats.remote->capacity_bytes), "tier=\"remote\"");
  }
  m.Family("tierkv_tier_used_bytes", "gauge",
           "Bytes of KV blocks a tier holds (host: keyed or being written).");
  m.Sample(double(h.used_slots) * slot, "tier=\"host\"");
  if (disk) m.Sample(double(stats.disk->bytes), "tier=\"disk\"");
  if (stats.remote.has_value()) {
    m.Sample(double(stats.remote->bytes), "tier=\"remote\"");
  }
  m.Family("tierkv_moved_bytes_total", "counter",
           "Bytes of KV blocks moved between tiers.");
  m.Sample(double(h.stores_completed) * slot, "from=\"device\",to=\"host\"");
  m.Sample(double(h.loads_completed) * slot, "from=\"host\",to=\"device\"");
  if (disk) {
    m.Sample(double(h.spills) * slot, "from=\"host\",to=\"disk\"");
    m.Sample(double(h.promotions) * slot, "from=\"disk\",to=\"host\"");
  }
  m.Family("tierkv_event_seconds", "histogram",
           "Transfer events from creation (allocate or commit) to "
           "completion, by kind.");
  m.Histogram(stats.load_latency, "kind=\"load\"");
  m.Histogram(stats.store_latency, "kind=\"store\"");
  m.Family("tierkv_spill_seconds", "histogram",
           "Spills from the coordinator starting one to it applying the disk "
           "tier's result (failed and discarded ones included).");
  m.Histogram(stats.spill_latency, "");
  m.Family("tierkv_promotion_seconds", "histogram",
           "Promotions from the coordinator starting one to it applying the "
           "disk tier's result (failed ones included).");
  m.Histogram(stats.promotion_latency, "");
  m.Family("tierkv_oldest_event_age_seconds", "gauge",
           "Age of the oldest transfer event in flight (0: none).");
  m.Sample(stats.oldest_event_age_us / 1e6);
  m.Family("tierkv_workers", "gauge", "Attached workers.");
  m.Sample(double(stats.workers.size()));
  FieldFamilies<AttachStats>(m, "workers", {{"", &stats.attach}});
  FieldFamilies<HostTierStats>(m, "host", {{"", &h}});
  if (disk) FieldFamilies<DiskTierStats>(m, "disk", {{"", &*stats.disk}});
  if (stats.remote.has_value()) {
    FieldFamilies<RemoteTierStats>(m, "remote", {{"", &*stats.remote}});
  }
  std::vector<std::pair<std::string, const WorkerStats*>> workers;
  for (const WorkerStats& w : stats.workers) {
    workers.emplace_back(
        "worker=\"" + std::to_string(w.id) + "\",name=" + LabelValue(w.name),
        &w);
  }
  FieldFamilies<WorkerStats>(m, "worker", workers);
  return out.str();
}

std::string FormatKeys(const CoordinatorStats& stats, const std::string& tenant,
                       const RequestExtras& extras,
                       const std::vector<TokenId>& tokens) {
  const KeyHasher hasher(
      {.model_fingerprint = stats.key_fingerprint, .tenant = tenant});
  const auto block_size = static_cast<int32_t>(stats.block_size);
  std::vector<BlockKey> keys;
  hasher.AppendPrefixKeys(tokens, block_size, extras, &keys);
  std::ostringstream out;
  for (size_t b = 0; b < keys.size(); ++b) {
    out << keys[b].ToHex() << "  block " << b << ": tokens " << b * block_size
        << ".." << (b + 1) * block_size - 1 << "\n";
  }
  const size_t rest = tokens.size() - keys.size() * block_size;
  if (rest > 0) {
    out << "(" << rest << (rest == 1 ? " token" : " tokens")
        << " after the last full block of " << block_size
        << ": never stored)\n";
  }
  return out.str();
}

std::string FormatEventsTable(const std::vector<EventInfo>& events,
                              uint64_t in_flight) {
  if (in_flight == 0) return "no events in flight\n";
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof(line), "%10s  %-6s %-20s %-5s %8s %10s %6s  %s\n",
                "age", "worker", "name", "kind", "id", "request", "blocks",
                "state");
  out << line;
  for (const EventInfo& e : events) {
    std::snprintf(
        line, sizeof(line), "%10s  %-6u %-20s %-5s %8llu %10llu %6u  %s\n",
        FormatAge(e.age_us).c_str(), e.worker,
        PrintableName(e.worker_name).substr(0, 20).c_str(),
        EventKindName(e.ref.kind), static_cast<unsigned long long>(e.ref.id),
        static_cast<unsigned long long>(e.request), e.blocks,
        EventStateName(e.state));
    out << line;
  }
  if (events.size() < in_flight) {
    out << "(the oldest " << events.size() << " of " << in_flight
        << " events in flight)\n";
  }
  return out.str();
}

std::string FormatEventsJson(const std::vector<EventInfo>& events,
                             uint64_t in_flight) {
  std::ostringstream out;
  out << "{\"in_flight\":" << in_flight << ",\"events\":[";
  for (size_t i = 0; i < events.size(); ++i) {
    const EventInfo& e = events[i];
    out << (i ? "," : "") << "{\"age_us\":" << e.age_us
        << ",\"worker\":" << e.worker
        << ",\"worker_name\":" << JsonString(e.worker_name) << ",\"kind\":\""
        << EventKindName(e.ref.kind) << "\",\"id\":" << e.ref.id
        << ",\"request\":" << e.request << ",\"blocks\":" << e.blocks
        << ",\"state\":\"" << EventStateName(e.state) << "\"}";
  }
  out << "]}\n";
  return out.str();
}

std::string FormatClear(TierSelection tiers, const ClearResult& result) {
  std::ostringstream out;
  if (tiers != TierSelection::kDisk) {
    out << "host: dropped " << result.host_dropped << " blocks, kept "
        << result.host_kept_pinned << " pinned\n";
  }
  if (result.disk_cleared) {
    out << "disk: dropped " << result.disk_dropped << " blocks\n";
    if (result.disk_undeleted) {
      out << "  warning: the disk tier takes no writes until tierkvd restarts "
             "(tierkvd's log says why): those blocks were forgotten, not "
             "deleted, and a restart serves them again; to be rid of them, "
             "stop tierkvd and empty its --disk-dir\n";
    }
  } else if (tiers != TierSelection::kHost) {
    out << "disk: none (tierkvd has no disk tier)\n";
  }
  if (result.remote_cleared) {
    out << "remote: forgot " << result.remote_dropped
        << " keys (deleted those this tierkvd wrote; a scan finds again "
           "what other machines wrote)\n";
  }
  return out.str();
}

std::string FormatClearJson(TierSelection tiers, const ClearResult& result) {
  std::ostringstream out;
  out << "{\"tier\":\"" << TierSelectionName(tiers) << "\"";
  if (tiers != TierSelection::kDisk) {
    out << ",\"host\":{\"dropped\":" << result.host_dropped
        << ",\"kept_pinned\":" << result.host_kept_pinned << "}";
  }
  if (result.disk_cleared) {
    out << ",\"disk\":{\"dropped\":" << result.disk_dropped
        << ",\"undeleted\":" << (result.disk_undeleted ? "true" : "false")
        << "}";
  }
  if (result.remote_cleared) {
    out << ",\"remote\":{\"dropped\":" << result.remote_dropped << "}";
  }
  out << "}\n";
  return out.str();
}

std::string FormatEvict(const std::vector<EvictedBlock>& blocks) {
  std::ostringstream out;
  for (const EvictedBlock& b : blocks) {
    out << b.key.ToHex() << "  " << EvictedBlockSummary(b) << "\n";
  }
  return out.str();
}

std::string FormatEvictJson(const std::vector<EvictedBlock>& blocks) {
  std::ostringstream out;
  out << "{\"keys\":[";
  for (size_t i = 0; i < blocks.size(); ++i) {
    const EvictedBlock& b = blocks[i];
    out << (i ? "," : "") << "{\"key\":\"" << b.key.ToHex()
        << "\",\"host_dropped\":" << (b.host_dropped ? "true" : "false")
        << ",\"host_pinned\":" << (b.host_pinned ? "true" : "false")
        << ",\"disk_dropped\":" << (b.disk_dropped ? "true" : "false")
        << ",\"disk_undeleted\":" << (b.disk_undeleted ? "true" : "false")
        << ",\"remote_dropped\":" << (b.remote_dropped ? "true" : "false")
        << "}";
  }
  out << "]}\n";
  return out.str();
}

std::string FormatHeldKeys(const HeldKeys& keys) {
  std::ostringstream out;
  for (const BlockKey& key : keys.host) out << "CPU " << key.ToHex() << "\n";
  for (const BlockKey& key : keys.disk) {
    out << "DISK " << key.ToHex() << "\n";
  }
  for (const BlockKey& key : keys.remote) {
    out << "REMOTE " << key.ToHex() << "\n";
  }
  if (keys.host.size() < keys.host_total) {
    out << "# host: " << keys.host.size() << " of " << keys.host_total
        << " keys listed\n";
  }
  if (keys.disk.size() < keys.disk_total) {
    out << "# disk: " << keys.disk.size() << " of " << keys.disk_total
        << " keys listed\n";
  }
  if (keys.remote.size() < keys.remote_total) {
    out << "# remote: " << keys.remote.size() << " of " << keys.remote_total
        << " keys listed\n";
  }
  return out.str();
}

std::string FormatHeldKeysJson(const HeldKeys& keys) {
  std::ostringstream out;
  auto list = [&](const std::vector<BlockKey>& tier) {
    out << "[";
    for (size_t i = 0; i < tier.size(); ++i) {
      out << (i ? "," : "") << "\"" << tier[i].ToHex() << "\"";
    }
    out << "]";
  };
  out << "{\"host_total\":" << keys.host_total
      << ",\"disk_total\":" << keys.disk_total
      << ",\"remote_total\":" << keys.remote_total << ",\"host\":";
  list(keys.host);
  out << ",\"disk\":";
  list(keys.disk);
  out << ",\"remote\":";
  list(keys.remote);
  out << "}\n";
  return out.str();
}

namespace {

// The node with the longest cached prefix: the first of those that tie,
// none when no node has any.
const NodeRoute* BestRoute(const std::vector<NodeRoute>& nodes) {
  const NodeRoute* best = nullptr;
  for (const NodeRoute& n : nodes) {
    if (!n.route.ok() || n.route->cached_tokens == 0) continue;
    if (best == nullptr ||
        n.route->cached_tokens > best->route->cached_tokens) {
      best = &n;
    }
  }
  return best;
}

std::string RouteWorkers(const std::vector<RouteWorker>& workers) {
  if (workers.empty()) return "none attached";
  std::string out;
  for (const RouteWorker& w : workers) {
    if (!out.empty()) out += ", ";
    out += w.name.empty() ? "worker " + std::to_string(w.id) : w.name;
    out += " (pid " + std::to_string(w.pid) + ")";
  }
  return out;
}

}  // namespace

std::string FormatRoute(const std::vector<NodeRoute>& nodes) {
  std::ostringstream out;
  size_t width = 4;
  for (const NodeRoute& n : nodes) width = std::max(width, n.node.size());
  out << std::left << std::setw(static_cast<int>(width)) << "node" << std::right
      << "  " << std::setw(8) << "cached"
      << "  " << std::setw(8) << "host"
      << "  " << std::setw(8) << "lower"
      << "  workers of the tenant\n";
  int32_t prompt = -1;
  for (const NodeRoute& n : nodes) {
    out << std::left << std::setw(static_cast<int>(width)) << n.node
        << std::right << "  ";
    if (!n.route.ok()) {
      out << "no answer from " << n.socket << ": " << n.route.status().message()
          << "\n";
      continue;
    }
    const RouteResult& r = *n.route;
    prompt = r.prompt_tokens;
    out << std::setw(8) << r.cached_tokens << "  " << std::setw(8)
        << r.cached_tokens - r.lower_tokens << "  " << std::setw(8)
        << r.lower_tokens << "  " << RouteWorkers(r.workers) << "\n";
  }
  if (prompt >= 0) {
    out << "prompt: " << prompt << " tokens in full blocks; ";
  }
  const NodeRoute* best = BestRoute(nodes);
  if (best == nullptr) {
    out << "cached nowhere\n";
  } else {
    out << "longest cached prefix: " << best->node << " ("
        << best->route->cached_tokens << " tokens)\n";
  }
  return out.str();
}

std::string FormatRouteJson(const std::vector<NodeRoute>& nodes) {
  std::ostringstream out;
  out << "{\"nodes\":[";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeRoute& n = nodes[i];
    out << (i ? "," : "") << "{\"node\":" << JsonString(n.node)
        << ",\"socket\":" << JsonString(n.socket);
    if (!n.route.ok()) {
      out << ",\"error\":" << JsonString(n.route.status().ToString()) << "}";
      continue;
    }
    const RouteResult& r = *n.route;
    out << ",\"prompt_tokens\":" << r.prompt_tokens
        << ",\"cached_tokens\":" << r.cached_tokens
        << ",\"host_tokens\":" << r.cached_tokens - r.lower_tokens
        << ",\"lower_tokens\":" << r.lower_tokens << ",\"workers\":[";
    for (size_t k = 0; k < r.workers.size(); ++k) {
      out << (k ? "," : "") << "{\"id\":" << r.workers[k].id
          << ",\"name\":" << JsonString(r.workers[k].name)
          << ",\"pid\":" << r.workers[k].pid << "}";
    }
    out << "]}";
  }
  const NodeRoute* best = BestRoute(nodes);
  out << "],\"best\":"
      << (best == nullptr ? std::string("null") : JsonString(best->node))
      << "}\n";
  return out.str();
}

}  // namespace tierkv::admin
