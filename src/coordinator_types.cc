// The names and summaries of the coordinator's public and operator types
// (tierkv/transfer.h, tierkv/stats.h, src/coordinator_types.h). In the
// client library: workers and tierkv-admin print them too.
#include "src/coordinator_types.h"

#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "tierkv/stats.h"
#include "tierkv/transfer.h"

namespace tierkv {

const char* EventKindName(EventKind kind) {
  return kind == EventKind::kLoad ? "load" : "store";
}

const char* EventStateName(EventState state) {
  switch (state) {
    case EventState::kPromoting:
      return "promoting";
    case EventState::kReady:
      return "ready";
    case EventState::kCopying:
      return "copying";
  }
  return "?";
}

const char* TierSelectionName(TierSelection tiers) {
  switch (tiers) {
    case TierSelection::kHost:
      return "host";
    case TierSelection::kDisk:
      return "disk";
    case TierSelection::kAll:
      return "all";
  }
  return "?";
}

std::string EvictedBlockSummary(const EvictedBlock& b) {
  std::vector<std::string_view> tiers;
  if (b.host_dropped) tiers.push_back("host");
  if (b.disk_dropped) tiers.push_back("disk");
  if (b.remote_dropped) tiers.push_back("remote");
  std::string dropped;
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (i > 0) dropped += i + 1 == tiers.size() ? " and " : ", ";
    dropped += tiers[i];
  }
  if (!dropped.empty()) dropped = "dropped from " + dropped;
  if (b.disk_undeleted) {
    dropped +=
        " (disk: forgotten, not deleted: the disk tier takes no writes until "
        "tierkvd restarts, which serves it again)";
  }
  if (b.host_pinned) {
    return dropped.empty() ? "pinned, kept" : "pinned, kept; " + dropped;
  }
  return dropped.empty() ? "not cached" : dropped;
}

void EventLatency::Record(uint64_t latency_us) {
  size_t b = 0;
  while (b < std::size(kBucketMicros) && latency_us > kBucketMicros[b]) ++b;
  ++buckets[b];
  ++count;
  sum_us += latency_us;
}

}  // namespace tierkv
