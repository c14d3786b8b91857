// The names and summaries of the coordinator's public and operator types
// (tierkv/transfer.h, tierkv/stats.h, src/coordinator_types.h). In the
// client library: workers and tierkv-admin print them too.
#include "src/coordinator_types.h"

#include <cstddef>
#include <iterator>
#include <string>

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
  if (b.host_dropped) {
    return b.disk_dropped ? "dropped from host and disk" : "dropped from host";
  }
  if (b.host_pinned) {
    return b.disk_dropped ? "pinned, kept; dropped from disk" : "pinned, kept";
  }
  return b.disk_dropped ? "dropped from disk" : "not cached";
}

void EventLatency::Record(uint64_t latency_us) {
  size_t b = 0;
  while (b < std::size(kBucketMicros) && latency_us > kBucketMicros[b]) ++b;
  ++buckets[b];
  ++count;
  sum_us += latency_us;
}

}  // namespace tierkv
