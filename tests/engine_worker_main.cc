// tierkv_engine_worker: an engine-shaped worker for the engine stress test
// (tierkv_engine_stress). It runs its own prefix cache (KVCacheManager) over
// an emulated device and attaches to tierkvd as vLLM's scheduler and
// connector would: up to four requests at once over Zipf-shared prefixes,
// device hits, loads from host and disk (delayed caching), eager stores,
// random aborts (also while loads wait for promotions) and preemption when
// the main pool is full. The KV bytes of block b of a prompt are a function
// of the prompt's tokens up to the end of that block, so every byte it loads
// or hits is checked against what any worker would have computed.
//
// When tierkvd is lost (killed, restarted, stopped past the call deadline)
// it drops its requests, completes what the client hands back and
// reconnects; it never stops on its own unless --requests is reached.
//
// Output, one line each:
//   progress N          every 16 finished requests
//   WRONG ...           a block whose bytes differ (at once)
//   lost ...            the attachment was lost
//   reconnect failed: S a Reconnect attempt failed (retried every 20 ms)
//   reconnected N       attached again (session N)
//   report ...          at the end: counts of the last session, totals
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/block_pattern.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"
#include "tierkv/device_tier.h"
#include "tierkv/kv_cache_manager.h"

namespace tierkv {
namespace {

constexpr int32_t kBs = 16;
// The engine's main pool: tight, so freed blocks are reused at once and
// requests are preempted (4 requests of up to 9 blocks).
constexpr int32_t kPoolBlocks = 40;
constexpr size_t kMaxActive = 4;
constexpr int32_t kPrefixes = 48;

volatile sig_atomic_t g_stop = 0;
void OnTerm(int) { g_stop = 1; }

struct Flags {
  std::string socket;
  uint32_t seed = 1;
  int32_t index = 0;
  int64_t requests = 0;  // 0: until SIGTERM.
  int32_t abort_percent = 10;
  int32_t timeout_ms = 500;
  // Which process of this index (a replaced worker's suffixes differ).
  int64_t incarnation = 0;
};

// Shared by every worker: prefix p is 2..6 blocks of tokens of its own.
std::vector<TokenId> PrefixTokens(int32_t p) {
  const int32_t blocks = 2 + (p * 7) % 5;
  std::vector<TokenId> t(static_cast<size_t>(blocks) * kBs);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<TokenId>(p) * 100'000u + static_cast<TokenId>(i) + 1;
  }
  return t;
}

// The bytes of block `b` of a prompt: a stream seeded by every token up to
// the block's end (so a block served under another prefix is caught).
void ExpectedBlock(std::span<const TokenId> tokens, int32_t b,
                   std::span<std::byte> out) {
  const size_t end = std::min(tokens.size(), static_cast<size_t>(b + 1) * kBs);
  const uint64_t seed = XXH3_64bits(tokens.data(), end * sizeof(TokenId));
  FillBlock(static_cast<TokenId>(seed ^ (seed >> 32)), out);
}

struct Counts {
  int64_t lookups = 0, lookup_hit_blocks = 0, lookup_miss_blocks = 0,
          loaded_blocks = 0, stored_blocks = 0;
};

class EngineWorker {
 public:
  explicit EngineWorker(const Flags& flags)
      : flags_(flags),
        rng_(flags.seed * 7919u + static_cast<uint32_t>(flags.index)),
        hasher_(
            {.model_fingerprint = TestLayout().Fingerprint(), .tenant = ""}) {
    double sum = 0;
    for (int32_t p = 0; p < kPrefixes; ++p) {
      sum += 1.0 / (p + 1);
      zipf_cdf_.push_back(sum);
    }
    for (double& c : zipf_cdf_) c /= sum;
  }

  Status Open() {
    TIERKV_ASSIGN_OR_RETURN(
        KVCacheManager manager,
        KVCacheManager::Create({.pool = {.num_blocks = kPoolBlocks,
                                         .block_size = kBs,
                                         .reserve_null_block = true}}));
    manager_ = std::make_unique<KVCacheManager>(std::move(manager));
    TIERKV_ASSIGN_OR_RETURN(
        device_,
        EmulatedDeviceTier::Create(kPoolBlocks, TestLayout().BlockBytes()));
    ClientOptions options;
    options.socket_path = flags_.socket;
    options.layout = TestLayout();
    options.num_device_blocks = kPoolBlocks;
    options.name = "engine-" + std::to_string(flags_.index);
    options.device = device_.get();
    options.engine = manager_.get();
    options.call_timeout = std::chrono::milliseconds(flags_.timeout_ms);
    TIERKV_ASSIGN_OR_RETURN(client_, Client::Open(options));
    return Status::Ok();
  }

  int Run() {
    while (!g_stop && (flags_.requests == 0 || finished_ < flags_.requests)) {
      if (!client_->connected()) {
        RideThroughLoss(client_->connection_status());
        continue;
      }
      if (active_.size() < kMaxActive &&
          (flags_.requests == 0 ||
           finished_ + static_cast<int64_t>(active_.size()) <
               flags_.requests)) {
        Check(StartRequest());
      }
      std::vector<FinishedTransfer> events = client_->PollEvents();
      if (events.empty() && !active_.empty()) {
        events = client_->WaitEvents(std::chrono::milliseconds(5));
      }
      Check(HandleEvents(std::move(events)));
      MaybeAbort();
    }
    Shutdown();
    std::printf(
        "report requests %lld aborted %lld preempted %lld dropped %lld "
        "lost %lld "
        "sessions %llu wrong %lld device_hit_blocks %lld | session "
        "lookups %lld lookup_hit_blocks %lld lookup_miss_blocks %lld "
        "loaded_blocks %lld stored_blocks %lld\n",
        static_cast<long long>(finished_), static_cast<long long>(aborted_),
        static_cast<long long>(preempted_), static_cast<long long>(dropped_),
        static_cast<long long>(lost_),
        static_cast<unsigned long long>(client_->session()),
        static_cast<long long>(wrong_),
        static_cast<long long>(total_device_hits_),
        static_cast<long long>(session_.lookups),
        static_cast<long long>(session_.lookup_hit_blocks),
        static_cast<long long>(session_.lookup_miss_blocks),
        static_cast<long long>(session_.loaded_blocks),
        static_cast<long long>(session_.stored_blocks));
    std::fflush(stdout);
    return wrong_ == 0 ? 0 : 1;
  }

 private:
  struct Active {
    std::unique_ptr<Request> request;
    bool loading = false;
    int32_t load_first_block = 0;
    int32_t stores_left = 0;
  };

  // A failed call: a lost attachment is ridden through; anything else is a
  // bug in the driver or in tierkv, reported and fatal.
  void Check(const Status& s) {
    if (s.ok()) return;
    if (!client_->connected()) {
      RideThroughLoss(s);
      return;
    }
    std::printf("ERROR %s\n", s.ToString().c_str());
    std::fflush(stdout);
    std::_Exit(3);
  }

  std::vector<TokenId> NextPrompt() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const auto p = static_cast<int32_t>(
        std::lower_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u) -
        zipf_cdf_.begin());
    std::vector<TokenId> t = PrefixTokens(std::min(p, kPrefixes - 1));
    const int32_t suffix = 1 + static_cast<int32_t>(rng_() % (2 * kBs + 15));
    for (int32_t i = 0; i < suffix; ++i) {
      t.push_back(100'000'000u +
                  static_cast<TokenId>(flags_.index) * 10'000'000u +
                  static_cast<TokenId>(
                      (flags_.incarnation * 100'000 + started_) % 150'000) *
                      64u +
                  static_cast<TokenId>(i));
    }
    return t;
  }

  bool BlockIsRight(const Request& r, int32_t b, BlockId id) {
    ExpectedBlock(r.tokens(), b, expected_);
    return std::memcmp(device_->block(id).data(), expected_.data(),
                       expected_.size()) == 0;
  }

  void ReportWrong(const char* what, const Request& r, int32_t b) {
    ++wrong_;
    std::printf("WRONG %s request %llu block %d\n", what,
                static_cast<unsigned long long>(r.id()), b);
    std::fflush(stdout);
  }

  // The engine's forward pass: blocks [from, end) get their KV.
  void Compute(const Request& r, int32_t from_token) {
    std::span<const BlockId> blocks = manager_->blocks(r.id());
    const int32_t last = (r.num_tokens() + kBs - 1) / kBs;
    for (int32_t b = from_token / kBs; b < last; ++b) {
      ExpectedBlock(r.tokens(), b, device_->block(blocks[b]));
    }
  }

  // Frees room in the pool by preempting the newest other request.
  bool Preempt(RequestId keep) {
    for (auto it = active_.rbegin(); it != active_.rend(); ++it) {
      if (it->first == keep) continue;
      ++preempted_;
      AbortRequest(it->first);
      return true;
    }
    return false;
  }

  Status StartRequest() {
    const RequestId id = next_id_++;
    ++started_;
    auto request = std::make_unique<Request>(id, NextPrompt(), kBs, hasher_);
    const Request& r = *request;
    const ComputedBlocks computed = manager_->GetComputedBlocks(r);
    for (size_t i = 0; i < computed.blocks.size(); ++i) {
      ++total_device_hits_;
      if (!BlockIsRight(r, static_cast<int32_t>(i), computed.blocks[i])) {
        ReportWrong("device-hit", r, static_cast<int32_t>(i));
      }
    }
    TIERKV_ASSIGN_OR_RETURN(
        LookupResult hit, client_->Lookup(id, r.tokens(), computed.num_tokens));
    ++session_.lookups;
    session_.lookup_hit_blocks += hit.hit_tokens / kBs;
    // The blocks tierkvd could have hit: full ones past the device hit,
    // short of the last token.
    session_.lookup_miss_blocks +=
        (r.num_tokens() - 1 - computed.num_tokens) / kBs - hit.hit_tokens / kBs;
    // Mostly take the whole hit; sometimes none of it (its pins go back).
    const int32_t external = rng_() % 10 == 0 ? 0 : hit.hit_tokens;
    const int32_t fresh = r.num_tokens() - computed.num_tokens;
    StatusOr<std::vector<BlockId>> blocks =
        manager_->AllocateSlots(r, fresh, computed, external);
    // A full pool: preempt newer requests (vLLM's recompute preemption).
    while (!blocks.ok() &&
           blocks.status().code() == StatusCode::kResourceExhausted &&
           Preempt(id)) {
      blocks = manager_->AllocateSlots(r, fresh, computed, external);
    }
    if (!blocks.ok()) {
      ++dropped_;
      return client_->Finish(id);  // Releases the lookup's pins.
    }
    Active& a = active_[id];
    a.request = std::move(request);
    a.loading = external > 0;
    a.load_first_block = computed.num_tokens / kBs;
    // The forward pass runs in the step that allocated (and keyed) the
    // blocks, whatever the connector says.
    if (external == 0) Compute(r, computed.num_tokens);
    StatusOr<AllocateResult> alloc =
        client_->Allocate(id, manager_->blocks(id), external);
    Status s = alloc.status();
    if (s.ok() && external > 0 && !alloc->load.has_value()) {
      s = Status::Internal("a hit of " + std::to_string(external) +
                           " tokens came with no load");
    }
    if (s.ok() && external == 0) s = Commit(id);
    if (!s.ok() && active_.contains(id)) AbortRequest(id);
    return s;
  }

  Status Commit(RequestId id) {
    Active& a = active_.at(id);
    const Request& r = *a.request;
    StatusOr<CommitResult> commit =
        client_->Commit(id, r.num_tokens(), manager_->blocks(id));
    if (!commit.ok()) {
      AbortRequest(id);
      return commit.status();
    }
    a.stores_left = static_cast<int32_t>(commit->stores.size());
    if (a.stores_left == 0) return FinishRequest(id);
    return Status::Ok();
  }

  Status FinishRequest(RequestId id) {
    // Its stores have read every block: none may have changed since the
    // engine computed or loaded it.
    const Request& r = *active_.at(id).request;
    std::span<const BlockId> blocks = manager_->blocks(id);
    for (int32_t b = 0; b < (r.num_tokens() + kBs - 1) / kBs; ++b) {
      if (!BlockIsRight(r, b, blocks[b])) ReportWrong("overwritten", r, b);
    }
    TIERKV_RETURN_IF_ERROR(client_->Finish(id));
    TIERKV_RETURN_IF_ERROR(manager_->Free(id));
    active_.erase(id);
    if (++finished_ % 16 == 0) {
      std::printf("progress %lld\n", static_cast<long long>(finished_));
      std::fflush(stdout);
    }
    return Status::Ok();
  }

  Status OnLoad(const FinishedTransfer& f) {
    auto it = active_.find(f.event.request);
    if (it == active_.end() || !it->second.loading) return Status::Ok();
    Active& a = it->second;
    const Request& r = *a.request;
    const int32_t loaded = f.loaded_blocks();
    for (int32_t i = 0; i < loaded; ++i) {
      if (!BlockIsRight(r, a.load_first_block + i, f.event.device_blocks[i])) {
        ReportWrong("loaded", r, a.load_first_block + i);
      }
    }
    a.loading = false;
    TIERKV_ASSIGN_OR_RETURN(ExternalLoadResult landed,
                            manager_->CompleteExternalLoad(r, loaded * kBs));
    // The rest, from the first block that did not load, is scheduled now
    // (in blocks the request holds already).
    TIERKV_ASSIGN_OR_RETURN(
        std::vector<BlockId> more,
        manager_->AllocateSlots(r,
                                r.num_tokens() - landed.num_computed_tokens));
    (void)more;
    // The rest is computed in this step: its blocks are keyed now.
    Compute(r, landed.num_computed_tokens);
    if (!client_->connected()) return Status::Ok();  // Dropped right after.
    return Commit(r.id());
  }

  // Completes finished transfers and counts the blocks tierkvd counts:
  // those of this attachment whose copy succeeded.
  Status CompleteAndCount(const std::vector<FinishedTransfer>& events) {
    const bool connected = client_->connected();
    Status completed = client_->Complete(events);
    if (!completed.ok() || !connected) return completed;
    for (const FinishedTransfer& f : events) {
      if (!f.status.ok() || f.session != client_->session()) continue;
      (f.event.ref.kind == EventKind::kLoad ? session_.loaded_blocks
                                            : session_.stored_blocks) +=
          static_cast<int64_t>(f.event.host_blocks.size());
    }
    return completed;
  }

  Status HandleEvents(std::vector<FinishedTransfer> events) {
    if (events.empty()) return Status::Ok();
    Status first;
    for (const FinishedTransfer& f : events) {
      if (f.event.ref.kind != EventKind::kLoad) continue;
      Status s = OnLoad(f);
      if (first.ok()) first = s;
    }
    Status completed = CompleteAndCount(events);
    for (const FinishedTransfer& f : events) {
      if (f.event.ref.kind != EventKind::kStore) continue;
      auto it = active_.find(f.event.request);
      if (it == active_.end() || --it->second.stores_left > 0) continue;
      Status s = FinishRequest(f.event.request);
      if (first.ok()) first = s;
    }
    if (!first.ok()) return first;
    return completed;
  }

  // An engine aborting a request: whatever it waits for.
  void AbortRequest(RequestId id) {
    ++aborted_;
    (void)client_->Finish(id);  // Fails only with a lost attachment.
    (void)manager_->Free(id);
    active_.erase(id);
  }

  // Aborts a random request now and then, and a request whose load is
  // still on its way far more often (the case that must never leave a copy
  // running into blocks the engine gave to another request).
  void MaybeAbort() {
    if (active_.empty()) return;
    const auto roll = static_cast<int32_t>(rng_() % 100);
    if (client_->loads_pending() > 0 && roll < 3 * flags_.abort_percent) {
      for (auto& [id, a] : active_) {
        if (a.loading) {
          AbortRequest(id);
          return;
        }
      }
    }
    if (roll < flags_.abort_percent) AbortRequest(active_.begin()->first);
  }

  // Hands back everything in flight and completes it (which unpins).
  void Drain() {
    for (;;) {
      std::vector<FinishedTransfer> events = client_->PollEvents();
      if (events.empty() && client_->transfers_in_flight() == 0) return;
      if (events.empty()) {
        events = client_->WaitEvents(std::chrono::milliseconds(5));
      }
      (void)CompleteAndCount(events);
    }
  }

  void RideThroughLoss(const Status& why) {
    ++lost_;
    std::printf("lost %s\n", why.ToString().c_str());
    std::fflush(stdout);
    while (!active_.empty()) AbortRequest(active_.begin()->first);
    Drain();
    while (!g_stop) {
      const Status again = client_->Reconnect();
      if (!again.ok()) {
        std::printf("reconnect failed: %s\n", again.ToString().c_str());
        std::fflush(stdout);
      }
      if (again.ok()) {
        session_ = {};
        std::printf("reconnected %llu\n",
                    static_cast<unsigned long long>(client_->session()));
        std::fflush(stdout);
        return;
      }
      // A retry pause: tierkvd is being restarted or is stopped.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void Shutdown() {
    while (!active_.empty()) AbortRequest(active_.begin()->first);
    Drain();
  }

  Flags flags_;
  std::mt19937 rng_;
  KeyHasher hasher_;
  std::vector<double> zipf_cdf_;
  std::unique_ptr<KVCacheManager> manager_;
  std::unique_ptr<EmulatedDeviceTier> device_;
  std::unique_ptr<Client> client_;
  std::map<RequestId, Active> active_;
  std::vector<std::byte> expected_ =
      std::vector<std::byte>(TestLayout().BlockBytes());
  RequestId next_id_ = 1;
  int64_t started_ = 0, finished_ = 0, aborted_ = 0, preempted_ = 0,
          dropped_ = 0, lost_ = 0, wrong_ = 0, total_device_hits_ = 0;
  Counts session_;
};

int Usage() {
  std::fprintf(stderr,
               "usage: tierkv_engine_worker --socket PATH --seed S --index I "
               "[--requests N] [--abort-percent P] [--timeout-ms T] "
               "[--incarnation K]\n");
  return 2;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  tierkv::Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    if (name == "--socket") {
      flags.socket = value;
    } else if (name == "--seed") {
      flags.seed = static_cast<uint32_t>(std::stoul(value));
    } else if (name == "--index") {
      flags.index = std::stoi(value);
    } else if (name == "--requests") {
      flags.requests = std::stoll(value);
    } else if (name == "--abort-percent") {
      flags.abort_percent = std::stoi(value);
    } else if (name == "--timeout-ms") {
      flags.timeout_ms = std::stoi(value);
    } else if (name == "--incarnation") {
      flags.incarnation = std::stoll(value);
    } else {
      return tierkv::Usage();
    }
  }
  if (flags.socket.empty() || argc % 2 == 0) return tierkv::Usage();
  signal(SIGTERM, tierkv::OnTerm);
  signal(SIGINT, tierkv::OnTerm);
  tierkv::EngineWorker worker(flags);
  // tierkvd may be restarting right now: retry until it answers.
  for (;;) {
    tierkv::Status s = worker.Open();
    if (s.ok()) break;
    std::printf("open failed: %s\n", s.ToString().c_str());
    std::fflush(stdout);
    if (tierkv::g_stop) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return worker.Run();
}
