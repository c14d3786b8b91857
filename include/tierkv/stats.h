// What a store reports about itself: its host tier, its disk tier, its
// transfer events and its workers (Client::Stats, tierkv-admin, the stats
// page, metrics).
//
// Each stats struct's fields are defined once, in a field table (the
// TIERKV_*_STATS_FIELDS lists below): the struct members, their wire
// encoding, tierkv-admin's listing, its JSON and its Prometheus metrics
// are all generated from the table, in its order. A field added to a table
// shows up everywhere at once (and changes the wire format: bump
// the protocol version).
#ifndef TIERKV_INCLUDE_TIERKV_STATS_H_
#define TIERKV_INCLUDE_TIERKV_STATS_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "tierkv/types.h"

namespace tierkv {

// How a field behaves over time (its Prometheus type).
enum class StatKind : uint8_t {
  kGauge,    // A level: may go up and down.
  kCounter,  // Counts events since the store started: only goes up.
  kLabel,    // Names something (a worker's id, pid, name): not a metric.
};

// One field of a field table.
struct StatField {
  const char* name;  // The member's name, and its JSON key.
  StatKind kind;
  const char* help;  // One line for people.
};

// X(type, name, kind, help) for each field, in wire order.
#define TIERKV_HOST_TIER_STATS_FIELDS(X)                                       \
  X(uint64_t, slot_bytes, kGauge, "Bytes of one KV block (one host slot).")    \
  X(int64_t, capacity_slots, kGauge,                                           \
    "Usable host slots (the null slot excluded).")                             \
  X(int64_t, free_slots, kGauge,                                               \
    "Host slots in the free queue, cached or not.")                            \
  X(int64_t, used_slots, kGauge,                                               \
    "Host slots keyed, or being written by a store or promotion.")             \
  X(int64_t, cached_slots, kGauge, "Host slots keyed: visible to lookups.")    \
  X(int64_t, pinned_slots, kGauge,                                             \
    "Host slots pinned by lookups, transfers, spills or promotions.")          \
  X(uint64_t, lookups, kCounter, "Lookups.")                                   \
  X(uint64_t, lookup_blocks, kCounter, "Blocks lookups could have hit.")       \
  X(uint64_t, hit_blocks, kCounter, "Blocks lookups found on host.")           \
  X(uint64_t, miss_blocks, kCounter, "Blocks lookups found in no tier.")       \
  X(uint64_t, evictions, kCounter,                                             \
    "Keyed host blocks whose slot was taken for capacity (on disk too or "     \
    "not: see evicted_unspilled).")                                            \
  X(uint64_t, evicted_unspilled, kCounter,                                     \
    "Of evictions, blocks the disk tier did not hold: lost to every tier "     \
    "(0 without a disk tier).")                                                \
  X(uint64_t, stores_completed, kCounter,                                      \
    "Blocks stored from device to host.")                                      \
  X(uint64_t, loads_completed, kCounter, "Blocks loaded from host to device.") \
  X(uint64_t, stores_failed, kCounter,                                         \
    "Blocks whose store failed or was lost with its worker.")                  \
  X(uint64_t, store_skipped, kCounter, "Blocks not stored: no free slot.")     \
  X(uint64_t, events_in_flight, kGauge, "Transfer events in flight.")          \
  X(uint64_t, disk_hit_blocks, kCounter,                                       \
    "Blocks lookups found only on the disk tier.")                             \
  X(uint64_t, spills, kCounter,                                                \
    "Blocks copied down to disk: past the high watermark (then dropped from "  \
    "host) or by write-behind (spills_kept).")                                 \
  X(uint64_t, spills_kept, kCounter,                                           \
    "Of spills, write-behind copies made soon after the block's store and "    \
    "kept on host: evicting the block later loses nothing.")                   \
  X(uint64_t, spill_drops, kCounter,                                           \
    "Blocks dropped from host because the disk tier had them already.")        \
  X(uint64_t, spill_failures, kCounter,                                        \
    "Spills that failed: the block stayed on host.")                           \
  X(uint64_t, promotions, kCounter, "Blocks copied up from disk for a load.")  \
  X(uint64_t, promotion_failures, kCounter,                                    \
    "Promotions that failed: value missing or corrupt, or no free slot.")      \
  X(uint64_t, loads_cancelled, kCounter,                                       \
    "Load events cancelled before their copy: the request finished while "     \
    "its promotions ran.")                                                     \
  X(uint64_t, spills_in_flight, kGauge, "Spills the disk tier is running.")    \
  X(uint64_t, promotions_in_flight, kGauge,                                    \
    "Promotions the disk tier is running.")                                    \
  X(uint64_t, corrupt_slots_dropped, kCounter,                                 \
    "Host blocks whose bytes changed after their store completed (found "      \
    "before a spill, or before a load with verify-on-load): dropped, never "   \
    "spilled or loaded.")                                                      \
  X(uint64_t, request_state_bytes, kGauge,                                     \
    "Bytes of state the workers' open requests keep (token ids, keys).")       \
  X(uint64_t, quota_pin_refusals, kCounter,                                    \
    "Host slots refused to a worker at its share of pins: lookups cut, "       \
    "blocks not stored, promotions not started.")                              \
  X(uint64_t, quota_request_refusals, kCounter,                                \
    "Lookups refused: the worker had its cap of open requests.")               \
  X(uint64_t, quota_request_bytes_refusals, kCounter,                          \
    "Lookups refused: the worker's requests had their cap of state bytes.")    \
  X(uint64_t, quota_event_refusals, kCounter,                                  \
    "Blocks not stored: the worker had its cap of events in flight.")          \
  X(uint64_t, quota_registration_refusals, kCounter,                           \
    "Workers refused: their uid had its cap of registered workers, or the "    \
    "store its cap of tenants.")                                               \
  X(uint64_t, tenants_reclaimed, kCounter,                                     \
    "Idle tenants whose host segment passed to a new tenant past the "         \
    "store's cap of tenants (their host blocks dropped).")                     \
  X(uint64_t, slot_reserve_failures, kCounter,                                 \
    "Blocks not stored or promoted: the memory of their slot could not be "    \
    "reserved in the tenant's host segment.")                                  \
  X(uint64_t, chunk_leases, kGauge,                                            \
    "Chunks whose compute lease a worker holds (single flight): it computes "  \
    "or stores them, and other workers' fetches of them wait.")                \
  X(uint64_t, chunk_lease_waits, kCounter,                                     \
    "Chunk fetches that waited for another worker's compute lease.")           \
  X(uint64_t, chunk_fetches_waiting, kGauge,                                   \
    "Chunk fetches waiting for another worker's compute lease now.")

#define TIERKV_DISK_TIER_STATS_FIELDS(X)                                     \
  X(uint64_t, capacity_bytes, kGauge, "The bound on the disk tier's bytes.") \
  X(uint64_t, bytes, kGauge, "Value bytes held (being written and stored).") \
  X(uint64_t, keys, kGauge, "Blocks stored.")                                \
  X(uint64_t, puts, kCounter, "Values written.")                             \
  X(uint64_t, put_failures, kCounter,                                        \
    "Writes that failed (superseded ones excluded).")                        \
  X(uint64_t, gets, kCounter, "Values read.")                                \
  X(uint64_t, hits, kCounter, "Reads that found their block.")               \
  X(uint64_t, misses, kCounter,                                              \
    "Reads of a block not stored, or stored for other tokens.")              \
  X(uint64_t, evictions, kCounter, "Blocks evicted for capacity.")           \
  X(uint64_t, checksum_failures, kCounter,                                   \
    "Values that failed verification on read; each was deleted.")            \
  X(uint64_t, read_errors, kCounter,                                         \
    "Reads the storage failed. A block it cannot read (an I/O error) was "   \
    "dropped, so it is a miss and is stored anew; one that may read later "  \
    "(no memory, a timeout) was kept.")                                      \
  X(uint64_t, token_mismatches, kCounter,                                    \
    "Reads whose token ids differ from the stored block's (a key "           \
    "collision): a miss, the stored block is kept.")                         \
  X(uint64_t, dropped_on_open, kGauge,                                       \
    "Values the last open dropped: malformed, failed checksum, or of "       \
    "another layout or model.")                                              \
  X(uint64_t, layout_mismatches, kGauge,                                     \
    "Of dropped_on_open, values of another layout or model.")                \
  X(uint64_t, payload_bytes_written, kCounter,                               \
    "Payload bytes of the values written.")                                  \
  X(uint64_t, stored_bytes_written, kCounter,                                \
    "Bytes stored for them (after compression).")                            \
  X(uint64_t, file_bytes, kGauge,                                            \
    "Bytes of every file in the disk tier's directory (values, write-ahead " \
    "log, metadata).")                                                       \
  X(uint64_t, degraded, kGauge,                                              \
    "1 while the disk tier takes no writes (a write failed, the filesystem " \
    "is nearly full, or it opened read-only); it still serves reads.")       \
  X(uint64_t, write_errors, kCounter,                                        \
    "Storage writes that failed. The first degrades the tier until "         \
    "restart, unless it only found the value file's filesystem full: then "  \
    "writes resume once there is room.")                                     \
  X(uint64_t, space_refusals, kCounter,                                      \
    "Writes refused because the filesystem's free space was below the "      \
    "storage's reserve.")                                                    \
  X(uint64_t, damaged_files, kGauge,                                         \
    "Files the last open found damaged; their values were dropped.")         \
  X(uint64_t, writes_stopped, kGauge,                                        \
    "1 once a storage write failed or the storage opened read-only: the "    \
    "tier takes no writes, and blocks it drops are forgotten, not deleted, " \
    "until tierkvd restarts.")                                               \
  X(uint64_t, undeleted_removals, kCounter,                                  \
    "Blocks dropped (cleared, evicted, found corrupt) while writes were "    \
    "stopped: forgotten, not deleted, so the next start serves them again.")

// The remote tier on a Redis Cluster shared by several machines (tierkvd
// --remote-redis). Its blocks are those this store wrote (keys, bytes) and
// those a periodic SCAN found (known_keys counts both).
#define TIERKV_REMOTE_TIER_STATS_FIELDS(X)                                    \
  X(uint64_t, capacity_bytes, kGauge,                                         \
    "The bound on the value bytes this store keeps in the remote tier (0: "   \
    "none).")                                                                 \
  X(uint64_t, bytes, kGauge, "Value bytes this store wrote and still lists.") \
  X(uint64_t, keys, kGauge, "Blocks this store wrote and still lists.")       \
  X(uint64_t, known_keys, kGauge,                                             \
    "Blocks lookups see in the remote tier: this store's and those the last " \
    "scans found, other machines' included.")                                 \
  X(uint64_t, puts, kCounter, "Values written (SET acknowledged).")           \
  X(uint64_t, put_failures, kCounter,                                         \
    "Writes that failed (a node down or silent, the slot changed, or a "      \
    "demoted block refused: too many were waiting to be written).")           \
  X(uint64_t, gets, kCounter, "Values read for promotions.")                  \
  X(uint64_t, hits, kCounter, "Reads that found and verified their block.")   \
  X(uint64_t, misses, kCounter,                                               \
    "Reads that served nothing: no value, another store's or block's value, " \
    "or a failed read.")                                                      \
  X(uint64_t, errors, kCounter,                                               \
    "Redis operations that failed (keys of a node down or silent, failed "    \
    "scans of a master).")                                                    \
  X(uint64_t, checksum_failures, kCounter,                                    \
    "Values that failed verification (torn or damaged); each was deleted.")   \
  X(uint64_t, token_mismatches, kCounter,                                     \
    "Values of another block under the key (a collision or a forgery): a "    \
    "miss, left alone.")                                                      \
  X(uint64_t, evictions, kCounter,                                            \
    "Blocks this store deleted for its byte bound.")                          \
  X(uint64_t, bytes_written, kCounter, "Value bytes written.")                \
  X(uint64_t, bytes_read, kCounter, "Payload bytes of the blocks read.")      \
  X(uint64_t, scan_passes, kCounter,                                          \
    "Scans of every master that ran to their end.")                           \
  X(uint64_t, scan_failures, kCounter,                                        \
    "Scans cut short by a master that failed: they only add keys.")           \
  X(uint64_t, known_keys_dropped, kCounter,                                   \
    "Keys a scan found but did not keep: past the bound on known keys.")

// Workers coming and going (tierkvd's socket; zero in embedded mode). Each
// refused registration counts in `refused` and in one refused_* reason.
#define TIERKV_ATTACH_STATS_FIELDS(X)                                       \
  X(uint64_t, attached, kCounter, "Workers that registered.")               \
  X(uint64_t, detached, kCounter,                                           \
    "Workers that left: their socket closed, or tierkvd dropped them.")     \
  X(uint64_t, refused, kCounter, "Connections and registrations refused.")  \
  X(uint64_t, refused_access, kCounter,                                     \
    "Refused: the peer is not this store's user or of its --group.")        \
  X(uint64_t, refused_mismatch, kCounter,                                   \
    "Refused: the worker's layout or model differs from the store's.")      \
  X(uint64_t, refused_limit, kCounter,                                      \
    "Refused: a cap was reached (--max-workers, workers per uid, tenants) " \
    "or a segment could not be made.")                                      \
  X(uint64_t, refused_malformed, kCounter,                                  \
    "Refused: a malformed request, or one of another protocol version.")

#define TIERKV_WORKER_STATS_FIELDS(X)                                       \
  X(WorkerId, id, kLabel, "The worker's id in this store.")                 \
  X(int32_t, pid, kLabel, "The worker's process id.")                       \
  X(std::string, name, kLabel, "The worker's name (ClientOptions::name).")  \
  X(uint32_t, requests, kGauge, "Requests the worker has open.")            \
  X(uint32_t, loads_in_flight, kGauge, "The worker's loads in flight.")     \
  X(uint32_t, stores_in_flight, kGauge, "The worker's stores in flight.")   \
  X(uint32_t, uid, kLabel, "The worker's user id.")                         \
  X(int64_t, pinned_slots, kGauge,                                          \
    "Host slot pins held for the worker (at most its share).")              \
  X(uint64_t, request_state_bytes, kGauge,                                  \
    "Bytes of state its open requests keep.")                               \
  X(std::string, role, kLabel,                                              \
    "Who copies its events: empty for the worker itself, \"scheduler of N " \
    "ranks\", or \"rank R of worker S\" (ClientOptions::copies).")

// A struct's members and ForEachField, from its field table:
// ForEachField(stats, f) calls f(const StatField&, member) for each field in
// table order (member is const when stats is).
#define TIERKV_STATS_MEMBER_(type, name, kind, help) type name = {};
#define TIERKV_STATS_VISIT_(type, name, kind, help) \
  f(StatField{#name, StatKind::kind, help}, self.name);
#define TIERKV_STATS_STRUCT_(Struct, FIELDS)                        \
  struct Struct {                                                   \
    FIELDS(TIERKV_STATS_MEMBER_)                                    \
    template <typename Self, typename F>                            \
    static void ForEachField(Self& self, F&& f) {                   \
      FIELDS(TIERKV_STATS_VISIT_)                                   \
    }                                                               \
    friend bool operator==(const Struct&, const Struct&) = default; \
  }

TIERKV_STATS_STRUCT_(HostTierStats, TIERKV_HOST_TIER_STATS_FIELDS);
TIERKV_STATS_STRUCT_(DiskTierStats, TIERKV_DISK_TIER_STATS_FIELDS);
TIERKV_STATS_STRUCT_(RemoteTierStats, TIERKV_REMOTE_TIER_STATS_FIELDS);
TIERKV_STATS_STRUCT_(AttachStats, TIERKV_ATTACH_STATS_FIELDS);
TIERKV_STATS_STRUCT_(WorkerStats, TIERKV_WORKER_STATS_FIELDS);

#undef TIERKV_STATS_STRUCT_
#undef TIERKV_STATS_VISIT_
#undef TIERKV_STATS_MEMBER_

// A latency histogram: of completed transfer events, from Allocate or
// Commit to Complete (failed copies included); of spills and promotions,
// from the coordinator starting one to it applying the disk tier's result.
struct EventLatency {
  // Upper bounds of the buckets (100 us .. 10 s); a last bucket takes the
  // rest.
  static constexpr uint64_t kBucketMicros[] = {
      100, 1'000, 5'000, 10'000, 50'000, 100'000, 1'000'000, 10'000'000};
  static constexpr size_t kBuckets = std::size(kBucketMicros) + 1;
  // Events per bucket (not cumulative); the last: above every bound.
  uint64_t buckets[kBuckets] = {};
  uint64_t count = 0;
  uint64_t sum_us = 0;

  void Record(uint64_t latency_us);
  friend bool operator==(const EventLatency&, const EventLatency&) = default;
};

// A whole store's statistics.
struct CoordinatorStats {
  HostTierStats host;
  EventLatency load_latency;
  EventLatency store_latency;
  EventLatency spill_latency;      // Spills, failed and discarded included.
  EventLatency promotion_latency;  // Promotions, failed ones included.
  // Age of the oldest transfer event in flight; 0 when none is.
  uint64_t oldest_event_age_us = 0;
  std::optional<DiskTierStats> disk;  // With a disk tier only.
  // With a remote tier only (tierkvd --remote-redis).
  std::optional<RemoteTierStats> remote;
  AttachStats attach;
  std::string model = {};  // The model the store serves.
  // The store's name (tierkvd's --store); empty in embedded mode.
  std::string store = {};
  // What the store's block keys are derived from (KeyNamespace's
  // model_fingerprint, StoreFingerprint(layout, model)) and its tokens per
  // block: with them tierkv-admin keys prints a prompt's keys.
  std::string key_fingerprint = {};
  uint32_t block_size = 0;
  std::string version = {};  // tierkv's release (Version()).
  std::vector<WorkerStats> workers;
};

}  // namespace tierkv

#endif  // TIERKV_INCLUDE_TIERKV_STATS_H_
