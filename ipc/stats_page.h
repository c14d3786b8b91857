// The stats page: a small shared-memory segment, /tierkv.<store>.stats, into
// which tierkvd publishes a snapshot of its CoordinatorStats a few times a
// second. tierkv-admin (stats, workers, metrics, watch) maps it read-only and
// reads the latest snapshot without asking tierkvd anything, so however often
// operators and scrapers read, tierkvd's request path pays only for the one
// snapshot per interval that the publisher takes.
//
// Layout: a fixed header (magic, page version, owner pid, socket path,
// capacity) and a payload of 64-bit words holding one encoded StatsReply
// frame (ipc/protocol.h). Writes are guarded by a sequence lock: the writer
// makes the sequence odd, stores the words, makes it even again; a reader
// copies the words between two equal even readings. Every shared word is a
// std::atomic, so readers and the writer never race on plain memory.
//
// StatsPageWriter: one per tierkvd (it owns and removes the name); not
// thread-safe, one publishing thread. StatsPageReader: any process that may
// read the segment; Read is safe from any thread.
#ifndef TIERKV_IPC_STATS_PAGE_H_
#define TIERKV_IPC_STATS_PAGE_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "src/coordinator.h"
#include "tierkv/status.h"
#include "tiers/shm_segment.h"

namespace tierkv::ipc {

// "/tierkv.<store>.stats", beside the store's other segments.
std::string StatsPageName(const std::string& store);

struct StatsPageOptions {
  std::string name;  // Required: StatsPageName(store).
  // tierkvd's socket, recorded so a reader can tell which tierkvd it is.
  std::string socket_path;
  // Bounds the snapshot: room for this many workers with names of the
  // longest length the protocol allows. Default: 64 (tierkvd's default).
  uint32_t max_workers = 64;
  // Read bits of the page (it is never writable by others): tierkvd gives
  // it to those who operate it.
  mode_t mode = 0600;
  std::optional<gid_t> group;
  // How often tierkvd publishes; recorded for readers judging staleness.
  std::chrono::milliseconds interval{100};
};

class StatsPageWriter {
 public:
  // Creates the segment. REQUIRES: the caller holds the store lock (the name
  // is the store's, like its other segments).
  static StatusOr<StatsPageWriter> Create(const StatsPageOptions& options);

  // Publishes `stats` as of `now`. ResourceExhausted (and nothing changes)
  // if its encoding exceeds the page, which max_workers rules out.
  Status Publish(const CoordinatorStats& stats,
                 std::chrono::system_clock::time_point now);

  const std::string& name() const { return segment_.name(); }
  uint64_t published() const { return published_; }  // Snapshots so far.

 private:
  explicit StatsPageWriter(ShmSegment segment) : segment_(std::move(segment)) {}

  ShmSegment segment_;
  uint64_t published_ = 0;
};

// One snapshot read from the page.
struct StatsPageSnapshot {
  CoordinatorStats stats;
  std::chrono::system_clock::time_point published_at;
  std::chrono::milliseconds interval{0};  // The publisher's interval.
  pid_t pid = 0;                          // The publishing tierkvd.
  std::string socket_path;                // Its socket.
};

class StatsPageReader {
 public:
  // Maps the page read-only. NotFound when no tierkvd publishes one under
  // this name, PermissionDenied when this user may not read it,
  // FailedPrecondition when it is not a stats page of this version, or
  // when the page belongs to a user this process would not trust: not this
  // user or root, nor (with `socket_path`) the socket's owner that
  // CheckDaemonUser (ipc/unix_socket.h) accepts as the tierkvd on it. Names
  // in /dev/shm are anyone's to take; nothing of an untrusted one is read.
  static StatusOr<StatsPageReader> Open(const std::string& name,
                                        const std::string& socket_path = {});

  // How long Read waits out a publisher that stays mid-update: far longer
  // than a snapshot takes, or a time slice of a preempted publisher, yet
  // short for a person at tierkv-admin when tierkvd is stopped.
  static constexpr std::chrono::milliseconds kDefaultPatience{1000};

  // The latest snapshot. Unavailable when nothing is published yet or the
  // page stayed mid-update for all of `patience` (0: one try); DataLoss
  // when the bytes do not decode (never expected from a tierkvd of the
  // same version).
  StatusOr<StatsPageSnapshot> Read(
      std::chrono::milliseconds patience = kDefaultPatience) const;

 private:
  explicit StatsPageReader(ShmSegment segment) : segment_(std::move(segment)) {}

  ShmSegment segment_;
};

// True when a snapshot published by a live tierkvd is no older than
// `max(3 s, 10 intervals)` at `now`: the page of a tierkvd that died
// (SIGKILL leaves the segment behind) or that stopped publishing is stale.
bool StatsPageIsFresh(const StatsPageSnapshot& snapshot,
                      std::chrono::system_clock::time_point now);

}  // namespace tierkv::ipc

#endif  // TIERKV_IPC_STATS_PAGE_H_
