// tierkv_engine_stress: tierkvd and engine-shaped workers
// (tierkv_engine_worker) under faults, checking that no worker is ever
// served wrong KV. `tools/run soak` runs it long; ctest runs it short
// (EngineStress).
//
// 1. Chaos: tierkvd with a small host tier over a small disk tier (so
//    spills, promotions and disk evictions all happen) and --workers
//    workers. Whenever a worker reports progress, one fault may strike: a
//    worker SIGKILLed and replaced, a worker SIGSTOPped for a while,
//    tierkvd SIGSTOPped past the workers' call deadline, tierkvd SIGKILLed
//    and restarted on its disk directory. Every kind strikes at least once.
// 2. Dead workers: every worker is SIGKILLed; tierkvd must release all
//    they held (no pins, no events in flight, no workers left).
// 3. Audit: tierkvd is restarted once more and fresh workers run a fixed
//    number of requests (with aborts) without faults; tierkvd's counts of
//    lookups, hits, loads and stores must equal the workers' own.
// Pass: no worker saw a wrong byte, 2 and 3 hold. Exit 0 on pass, 1 on
// failure, 2 on bad flags; the last line says which.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/child_process.h"
#include "tests/scratch.h"
#include "tests/test_layout.h"
#include "tierkv/client.h"

namespace tierkv {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int seconds = 20;
  uint32_t seed = 1;
  int workers = 4;
  int audit_requests = 150;
  std::string tierkvd = TIERKVD_PATH;
  std::string worker = ENGINE_WORKER_PATH;
};

enum Fault { kNone, kKillWorker, kStopWorker, kStopTierkvd, kKillTierkvd };
constexpr const char* kFaultNames[] = {"none", "kill-worker", "stop-worker",
                                       "stop-tierkvd", "kill-tierkvd"};
constexpr int kFaults = 5;
constexpr int kTimeoutMs = 300;  // The workers' call deadline.

class Stress {
 public:
  explicit Stress(const Flags& flags)
      : flags_(flags),
        rng_(flags.seed),
        store_("stress" + std::to_string(getpid())),
        socket_(dir_.path() + "/tierkvd.sock") {}
  ~Stress() {
    workers_.clear();
    if (daemon_ != nullptr) daemon_->Stop();
    RemoveStoreSegments(store_);
  }

  bool Run() {
    if (!StartDaemon()) return false;
    for (int i = 0; i < flags_.workers; ++i) workers_.push_back(Spawn(i, 0));
    const bool chaos = Chaos();
    const bool dead = KillAllWorkers() && CheckNothingHeld("dead workers");
    const bool audit = Audit();
    std::printf("wrong blocks: %lld, faults:", static_cast<long long>(wrong_));
    for (int f = 1; f < kFaults; ++f) {
      std::printf(" %s %d", kFaultNames[f], fault_count_[f]);
    }
    std::printf("\n");
    return chaos && dead && audit && wrong_ == 0;
  }

 private:
  struct Worker {
    std::unique_ptr<ChildProcess> process;
    int index = 0;
    long long progress = 0;  // The last "progress N" waited for.
  };

  std::unique_ptr<ChildProcess> Start(std::vector<std::string> argv) {
    auto child = ChildProcess::Spawn(std::move(argv));
    if (!child.ok()) {
      std::printf("cannot start: %s\n", child.status().ToString().c_str());
      return nullptr;
    }
    return std::move(*child);
  }

  bool StartDaemon() {
    // 24 host slots, a disk tier of about 160 blocks besides RocksDB's
    // reserve (two 1 MiB memtables and 1 MiB).
    const size_t block = TestLayout().BlockBytes();
    daemon_ = Start({flags_.tierkvd,
                     "--store",
                     store_,
                     "--socket",
                     socket_,
                     "--layers",
                     "2",
                     "--kv-heads",
                     "2",
                     "--head-dim",
                     "64",
                     "--dtype",
                     "bf16",
                     "--host-capacity",
                     std::to_string(25 * block),
                     "--disk-dir",
                     dir_.path() + "/disk",
                     "--disk-capacity",
                     std::to_string((3 << 20) + 160 * (block + 256)),
                     "--spill-high",
                     "0.5",
                     "--spill-low",
                     "0.25"});
    if (daemon_ == nullptr || !daemon_->WaitForOutput("serving store")) {
      std::printf("tierkvd did not start: %s\n",
                  daemon_ ? daemon_->output().c_str() : "");
      return false;
    }
    return true;
  }

  bool RestartDaemon() {
    AddWrong(*daemon_);
    daemon_->Signal(SIGKILL);
    daemon_->Wait();
    return StartDaemon();
  }

  // A worker process; the audit's (requests > 0) get a deadline long enough
  // that no call misses it on a busy machine.
  Worker Spawn(int index, int requests) {
    Worker w;
    w.index = index;
    w.process =
        Start({flags_.worker, "--socket", socket_, "--seed",
               std::to_string(flags_.seed), "--index", std::to_string(index),
               "--requests", std::to_string(requests), "--timeout-ms",
               std::to_string(requests > 0 ? 10 * kTimeoutMs : kTimeoutMs),
               "--incarnation", std::to_string(spawned_++)});
    if (w.process == nullptr) std::exit(1);
    return w;
  }

  // Waits for the worker's next progress line; false if it never comes.
  bool NextProgress(Worker& w) {
    w.progress += 16;
    return w.process->WaitForOutput("progress " + std::to_string(w.progress) +
                                    "\n");
  }

  Worker& AnyWorker() { return workers_[rng_() % workers_.size()]; }

  static long long CountOf(const std::string& text, const std::string& what) {
    long long n = 0;
    for (size_t at = text.find(what); at != std::string::npos;
         at = text.find(what, at + 1)) {
      ++n;
    }
    return n;
  }
  static std::string Tail(const std::string& text) {
    return text.substr(text.size() - std::min<size_t>(text.size(), 2000));
  }
  void AddWrong(ChildProcess& p) {
    const long long wrong = CountOf(p.output(), "WRONG ");
    if (wrong > 0) std::printf("%s", p.output().c_str());
    wrong_ += wrong;
  }

  bool Strike(Fault fault) {
    ++fault_count_[fault];
    Worker& w = AnyWorker();
    if (fault != kNone) {
      std::printf("fault: %s (worker %d at progress %lld)\n",
                  kFaultNames[fault], w.index, w.progress);
    }
    switch (fault) {
      case kNone:
        return true;
      case kKillWorker: {
        w.process->Signal(SIGKILL);
        w.process->Wait();
        AddWrong(*w.process);
        w = Spawn(w.index, 0);
        return true;
      }
      case kStopWorker: {
        w.process->Freeze();
        Worker& other = workers_[(w.index + 1) % workers_.size()];
        const bool ok = NextProgress(other);
        w.process->Thaw();
        return ok;
      }
      case kStopTierkvd: {
        // Until a worker's call (or reconnect attempt) misses its deadline.
        const size_t from = w.process->output().size();
        daemon_->Freeze();
        const bool missed = w.process->WaitFor([&](const std::string& out) {
          return out.find("DeadlineExceeded", from) != std::string::npos;
        });
        daemon_->Thaw();
        if (!missed) std::printf("%s\n", Tail(w.process->output()).c_str());
        return missed;
      }
      case kKillTierkvd:
        return RestartDaemon();
    }
    return false;
  }

  bool Chaos() {
    const auto end = Clock::now() + std::chrono::seconds(flags_.seconds);
    // Every kind of fault once first, then at random.
    std::vector<Fault> plan = {kKillWorker, kStopWorker, kStopTierkvd,
                               kKillTierkvd};
    std::shuffle(plan.begin(), plan.end(), rng_);
    size_t next = 0;
    while (Clock::now() < end || next < plan.size()) {
      Worker& w = AnyWorker();
      if (!NextProgress(w)) {
        std::printf("FAIL: worker %d made no progress:\n%s\n", w.index,
                    w.process->output().c_str());
        return false;
      }
      Fault fault = kNone;
      if (next < plan.size()) {
        fault = plan[next++];
      } else if (rng_() % 2 == 0) {
        fault = static_cast<Fault>(1 + rng_() % (kFaults - 1));
      }
      if (!Strike(fault)) {
        std::printf("FAIL: %s did not recover\n", kFaultNames[fault]);
        return false;
      }
    }
    return true;
  }

  bool KillAllWorkers() {
    for (Worker& w : workers_) {
      w.process->Signal(SIGKILL);
      w.process->Wait();
      AddWrong(*w.process);
    }
    workers_.clear();
    return true;
  }

  // Once tierkvd has noticed every worker gone: nothing pinned, no events,
  // no worker but the observer.
  // A client that only reads tierkvd's stats (it looks nothing up).
  StatusOr<std::unique_ptr<Client>> Observer() const {
    ClientOptions options;
    options.socket_path = socket_;
    options.layout = TestLayout();
    options.num_device_blocks = 1;
    options.name = "observer";
    return Client::Open(options);
  }

  bool CheckNothingHeld(const char* when) {
    auto observer = Observer();
    if (!observer.ok()) {
      std::printf("FAIL: %s: %s\n", when, observer.status().ToString().c_str());
      return false;
    }
    CoordinatorStats s;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    do {  // tierkvd notices closed sockets and drains its disk I/O.
      auto stats = (*observer)->Stats();
      if (!stats.ok()) return false;
      s = *stats;
      if (s.workers.size() == 1 && s.host.pinned_slots == 0 &&
          s.host.events_in_flight == 0 && s.host.spills_in_flight == 0 &&
          s.host.promotions_in_flight == 0) {
        std::printf(
            "%s: nothing held (%lld cached host blocks, %llu on "
            "disk)\n",
            when, static_cast<long long>(s.host.cached_slots),
            static_cast<unsigned long long>(s.disk->keys));
        return true;
      }
      std::this_thread::yield();
    } while (Clock::now() < deadline);
    std::printf(
        "FAIL: %s: %zu workers, %lld pinned slots, %llu events in "
        "flight\n",
        when, s.workers.size(), static_cast<long long>(s.host.pinned_slots),
        static_cast<unsigned long long>(s.host.events_in_flight));
    return false;
  }

  // Fresh tierkvd (same disk), fresh workers, no faults: counts must agree.
  bool Audit() {
    if (!RestartDaemon()) return false;
    const int n = std::max(3, flags_.workers - 1);
    for (int i = 0; i < n; ++i) {
      workers_.push_back(Spawn(100 + i, flags_.audit_requests));
    }
    long long lookups = 0, hits = 0, misses = 0, loads = 0, stores = 0;
    // A worker that lost its attachment counts its last attachment only:
    // the audit needs every one to have kept its first.
    const std::regex report(
        "lost 0 sessions 1 .* session lookups (\\d+) lookup_hit_blocks "
        "(\\d+) lookup_miss_blocks (\\d+) loaded_blocks (\\d+) "
        "stored_blocks (\\d+)");
    for (Worker& w : workers_) {
      const int code = w.process->Wait();
      const std::string out = w.process->output();
      AddWrong(*w.process);
      std::smatch m;
      if (code != 0 || !std::regex_search(out, m, report)) {
        std::printf("FAIL: audit worker %d exited %d:\n%s\n", w.index, code,
                    out.c_str());
        return false;
      }
      lookups += std::stoll(m[1]);
      hits += std::stoll(m[2]);
      misses += std::stoll(m[3]);
      loads += std::stoll(m[4]);
      stores += std::stoll(m[5]);
    }
    workers_.clear();
    if (!CheckNothingHeld("after the audit")) return false;
    auto observer = Observer();
    StatusOr<CoordinatorStats> stats =
        observer.ok() ? (*observer)->Stats() : observer.status();
    if (!stats.ok()) {
      std::printf("FAIL: audit: %s\n", stats.status().ToString().c_str());
      return false;
    }
    const HostTierStats h = stats->host;
    const long long t_hits =
        static_cast<long long>(h.hit_blocks + h.disk_hit_blocks);
    const uint64_t disk_evictions = stats->disk ? stats->disk->evictions : 0;
    std::printf(
        "audit (tierkvd / workers): lookups %llu / %lld, hit blocks %lld / "
        "%lld, missed blocks %llu / %lld, loaded blocks %llu / %lld, stored "
        "blocks %llu / %lld; spills %llu, promotions %llu, disk evictions "
        "%llu, loads cancelled %llu, evicted unspilled %llu\n",
        static_cast<unsigned long long>(h.lookups), lookups, t_hits, hits,
        static_cast<unsigned long long>(h.miss_blocks), misses,
        static_cast<unsigned long long>(h.loads_completed), loads,
        static_cast<unsigned long long>(h.stores_completed), stores,
        static_cast<unsigned long long>(h.spills),
        static_cast<unsigned long long>(h.promotions),
        static_cast<unsigned long long>(disk_evictions),
        static_cast<unsigned long long>(h.loads_cancelled),
        static_cast<unsigned long long>(h.evicted_unspilled));
    const bool agree = static_cast<long long>(h.lookups) == lookups &&
                       t_hits == hits &&
                       static_cast<long long>(h.miss_blocks) == misses &&
                       static_cast<long long>(h.loads_completed) == loads &&
                       static_cast<long long>(h.stores_completed) == stores;
    if (!agree)
      std::printf("FAIL: tierkvd's counts differ from the workers'\n");
    return agree;
  }

  Flags flags_;
  std::mt19937 rng_;
  TempDir dir_{"tierkv_stress"};
  std::string store_, socket_;
  std::unique_ptr<ChildProcess> daemon_;
  std::vector<Worker> workers_;
  long long wrong_ = 0;
  int fault_count_[kFaults] = {};
  int spawned_ = 0;
};

int Usage() {
  std::fprintf(stderr,
               "usage: tierkv_engine_stress [--seconds N] [--seed S] "
               "[--workers W] [--audit-requests N] [--tierkvd PATH]\n"
               "  Runs tierkvd and W engine-shaped workers (default 4, at "
               "least 3) under\n"
               "  faults for N seconds (default 20), then audits what "
               "tierkvd holds and\n"
               "  counts. Exit 0: no wrong KV served and the audit "
               "agrees.\n"
               "  --tierkvd: the tierkvd program (default: this build's).\n");
  return 2;
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  tierkv::Flags flags;
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name == "--help" || i + 1 >= argc) return tierkv::Usage();
    const std::string value = argv[i + 1];
    try {
      if (name == "--seconds") {
        flags.seconds = std::stoi(value);
      } else if (name == "--seed") {
        flags.seed = static_cast<uint32_t>(std::stoul(value));
      } else if (name == "--workers") {
        flags.workers = std::stoi(value);
      } else if (name == "--audit-requests") {
        flags.audit_requests = std::stoi(value);
      } else if (name == "--tierkvd") {
        flags.tierkvd = value;
      } else {
        return tierkv::Usage();
      }
    } catch (const std::exception&) {
      return tierkv::Usage();
    }
  }
  if (flags.workers < 3 || flags.seconds < 0 || flags.audit_requests < 1) {
    return tierkv::Usage();
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("engine stress: seed %u, %d workers, %d s of faults\n",
              flags.seed, flags.workers, flags.seconds);
  tierkv::Stress stress(flags);
  const bool pass = stress.Run();
  std::printf("engine stress: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
