// RemoteTier (remote_tier.h): the value format, the index and LRU, and the
// I/O thread that runs spills, promotions and deletes against Redis.
#include "tiers/remote_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

namespace tierkv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the remote tier's value format assumes a little-endian host");

constexpr uint32_t kMagic = 0x52564b54;  // "TKVR" read as little-endian.
constexpr uint16_t kFormatVersion = 1;
// magic, version, fingerprint length, token count, key hi, key lo,
// payload bytes, payload checksum.
constexpr size_t kFixedHeaderBytes = 4 + 2 + 2 + 4 + 8 + 8 + 8 + 8;
constexpr size_t kMaxFingerprintBytes = 0xffff;
constexpr uint32_t kMaxTokens = 1 << 16;
// Promotions read in one pipelined batch at most.
constexpr size_t kPromoteBatch = 64;

size_t HeaderBytes(size_t fingerprint_bytes, size_t tokens) {
  return kFixedHeaderBytes + fingerprint_bytes + 4 * tokens + 8;
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T Take(std::string_view* in) {
  T value;
  std::memcpy(&value, in->data(), sizeof(value));
  in->remove_prefix(sizeof(value));
  return value;
}

// The value of a block whose bytes are `payload`, and in `*payload_sum` the
// XXH3-64 of the bytes it holds. The payload is read once: copied, then
// the copy hashed, so a slot written meanwhile (by a worker that does not
// own it) gives a value whose checksum is of what it holds, and the caller
// compares that with the checksum the block was stored with.
std::string EncodeValue(const std::string& fingerprint, const BlockKey& key,
                        std::span<const TokenId> tokens,
                        std::span<const std::byte> payload,
                        uint64_t* payload_sum) {
  const size_t header_bytes = HeaderBytes(fingerprint.size(), tokens.size());
  std::string out;
  out.reserve(header_bytes + payload.size());
  Put<uint32_t>(&out, kMagic);
  Put<uint16_t>(&out, kFormatVersion);
  Put<uint16_t>(&out, static_cast<uint16_t>(fingerprint.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(tokens.size()));
  Put<uint64_t>(&out, key.hi);
  Put<uint64_t>(&out, key.lo);
  Put<uint64_t>(&out, payload.size());
  const size_t sum_at = out.size();
  Put<uint64_t>(&out, 0);  // The payload's checksum, below.
  out += fingerprint;
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes());
  const size_t header_sum_at = out.size();
  Put<uint64_t>(&out, 0);  // The header's checksum, below.
  out.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  *payload_sum = XXH3_64bits(out.data() + header_bytes, payload.size());
  std::memcpy(out.data() + sum_at, payload_sum, sizeof(*payload_sum));
  const uint64_t header_sum = XXH3_64bits(out.data(), header_sum_at);
  std::memcpy(out.data() + header_sum_at, &header_sum, sizeof(header_sum));
  return out;
}

// What a value read back is, for this store, key and tokens.
enum class Verdict {
  kServe,    // The payload may be copied into the slot.
  kDamaged,  // Torn, malformed or failing a checksum: delete it.
  // Another fingerprint, or another format version (a tierkvd of another
  // release sharing the cluster): not ours, a miss, never deleted.
  kOtherStore,
  kOtherBlock,  // Another key or other tokens: a collision, a miss.
};

struct Decoded {
  Verdict verdict = Verdict::kDamaged;
  std::string_view payload;
  uint64_t payload_sum = 0;  // XXH3-64 of the payload, once verified.
};

// The header's length as its own fields give it; 0 when `value` is too
// short to hold them.
size_t StatedHeaderBytes(std::string_view value) {
  if (value.size() < kFixedHeaderBytes) return 0;
  uint16_t fp_bytes;
  uint32_t n_tokens;
  std::memcpy(&fp_bytes, value.data() + 6, sizeof(fp_bytes));
  std::memcpy(&n_tokens, value.data() + 8, sizeof(n_tokens));
  return HeaderBytes(fp_bytes, n_tokens);
}

// The verdict on a value whose header (as long as its fields say) is
// `header` and whose payload is `payload`: the two need not be adjacent in
// memory, so a value read into two buffers is judged where it lies.
Decoded DecodeParts(std::string_view header, std::string_view payload,
                    const std::string& fingerprint, const BlockKey& key,
                    std::span<const TokenId> tokens, size_t block_bytes) {
  Decoded d;
  std::string_view in = header;
  if (in.size() < kFixedHeaderBytes) return d;
  const uint32_t magic = Take<uint32_t>(&in);
  const uint16_t version = Take<uint16_t>(&in);
  const uint16_t fp_bytes = Take<uint16_t>(&in);
  const uint32_t n_tokens = Take<uint32_t>(&in);
  const uint64_t hi = Take<uint64_t>(&in);
  const uint64_t lo = Take<uint64_t>(&in);
  const uint64_t payload_bytes = Take<uint64_t>(&in);
  const uint64_t payload_sum = Take<uint64_t>(&in);
  if (magic != kMagic) return d;
  if (version != kFormatVersion) {
    // Its other fields may mean other things: read no further.
    d.verdict = Verdict::kOtherStore;
    return d;
  }
  if (n_tokens > kMaxTokens) return d;
  if (header.size() != HeaderBytes(fp_bytes, n_tokens) ||
      payload.size() != payload_bytes) {
    return d;
  }
  uint64_t header_sum;
  std::memcpy(&header_sum, header.data() + header.size() - 8, 8);
  if (XXH3_64bits(header.data(), header.size() - 8) != header_sum) return d;
  const std::string_view stored_fp = in.substr(0, fp_bytes);
  in.remove_prefix(fp_bytes);
  d.payload = payload;
  if (XXH3_64bits(d.payload.data(), d.payload.size()) != payload_sum) {
    return d;
  }
  if (stored_fp != fingerprint || payload_bytes != block_bytes) {
    d.verdict = Verdict::kOtherStore;
    return d;
  }
  if (hi != key.hi || lo != key.lo || n_tokens != tokens.size() ||
      std::memcmp(in.data(), tokens.data(), tokens.size_bytes()) != 0) {
    d.verdict = Verdict::kOtherBlock;
    return d;
  }
  d.verdict = Verdict::kServe;
  d.payload_sum = payload_sum;
  return d;
}

// Whether `value` starts with this format's magic and another version:
// told before any other field is read, since another version's header may
// lay them out otherwise.
bool OfAnotherVersion(std::string_view value) {
  if (value.size() < sizeof(uint32_t) + sizeof(uint16_t)) return false;
  uint32_t magic;
  uint16_t version;
  std::memcpy(&magic, value.data(), sizeof(magic));
  std::memcpy(&version, value.data() + sizeof(magic), sizeof(version));
  return magic == kMagic && version != kFormatVersion;
}

Decoded OtherStore() {
  Decoded d;
  d.verdict = Verdict::kOtherStore;
  return d;
}

// The verdict on a whole value.
Decoded DecodeValue(std::string_view value, const std::string& fingerprint,
                    const BlockKey& key, std::span<const TokenId> tokens,
                    size_t block_bytes) {
  if (OfAnotherVersion(value)) return OtherStore();
  const size_t header = StatedHeaderBytes(value);
  if (header == 0 || value.size() < header) return Decoded{};
  return DecodeParts(value.substr(0, header), value.substr(header), fingerprint,
                     key, tokens, block_bytes);
}

// The verdict on a value read as `head` (as long as this store's header for
// these tokens) and `body` (the rest, in a slot): DecodeValue's on the two
// joined. Only a value whose own header is as long as `head` can be served;
// any other is joined in a copy to be judged (damaged, or another store's
// or block's), its payload not kept.
Decoded DecodeSplit(std::string_view head, std::string_view body,
                    const std::string& fingerprint, const BlockKey& key,
                    std::span<const TokenId> tokens, size_t block_bytes) {
  if (OfAnotherVersion(head)) return OtherStore();
  if (StatedHeaderBytes(head) == head.size()) {
    return DecodeParts(head, body, fingerprint, key, tokens, block_bytes);
  }
  std::string whole(head);
  whole.append(body);
  Decoded d = DecodeValue(whole, fingerprint, key, tokens, block_bytes);
  // Its payload is not where the slot's bytes are: never served, even
  // should a format ever let such a value verify.
  if (d.verdict == Verdict::kServe) d.verdict = Verdict::kOtherBlock;
  d.payload = {};
  return d;
}

bool ValidTenant(const std::string& tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  return std::all_of(tenant.begin(), tenant.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

std::string KeyPrefix(const RemoteTierOptions& options) {
  char hash[17];
  std::snprintf(
      hash, sizeof(hash), "%016llx",
      static_cast<unsigned long long>(XXH3_64bits(
          options.store_fingerprint.data(), options.store_fingerprint.size())));
  return "tierkv:" + std::string(hash) + ":" + options.tenant + ":";
}

}  // namespace

struct RemoteTier::Job {
  enum class Kind { kSpill, kPromote, kDelete };
  Kind kind = Kind::kSpill;
  BlockKey key;
  std::vector<TokenId> tokens;
  BlockId slot = 0;
  std::optional<uint64_t> checksum;
  std::vector<std::byte> payload;  // kSpill of a Demote: the block's bytes.
  uint64_t clears = 0;             // A Demote's: clears_ when it was queued.
  Done done;
  PromoteDone promote_done;
  std::vector<BlockKey> deleted;  // kDelete: the blocks whose values go.
};

StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(
    RemoteTierOptions options) {
  if (options.store_fingerprint.empty() ||
      options.store_fingerprint.size() > kMaxFingerprintBytes) {
    return Status::InvalidArgument(
        "RemoteTier: store_fingerprint is required (at most 65535 bytes)");
  }
  if (!ValidTenant(options.tenant)) {
    return Status::InvalidArgument("RemoteTier: tenant '" + options.tenant +
                                   "' is not 1 to 64 of [A-Za-z0-9_.-]");
  }
  if (options.block_bytes == 0 || !options.slot_memory) {
    return Status::InvalidArgument(
        "RemoteTier: block_bytes and slot_memory are required");
  }
  if (options.scan_interval.count() < 0 || options.scan_count == 0 ||
      options.max_known_keys == 0) {
    return Status::InvalidArgument(
        "RemoteTier: scan_interval must be >= 0, scan_count and "
        "max_known_keys > 0");
  }
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<RedisClusterClient> client,
                          RedisClusterClient::Open(options.redis));
  std::unique_ptr<RedisClusterClient> scan_client;
  if (options.scan_interval.count() > 0) {
    TIERKV_ASSIGN_OR_RETURN(scan_client,
                            RedisClusterClient::Open(options.redis));
  }
  return std::unique_ptr<RemoteTier>(new RemoteTier(
      std::move(options), std::move(client), std::move(scan_client)));
}

RemoteTier::RemoteTier(RemoteTierOptions options,
                       std::unique_ptr<RedisClusterClient> client,
                       std::unique_ptr<RedisClusterClient> scan_client)
    : options_(std::move(options)),
      key_prefix_(KeyPrefix(options_)),
      client_(std::move(client)),
      scan_client_(std::move(scan_client)) {
  {
    MutexLock lock(&mu_);
    stats_.capacity_bytes = options_.capacity_bytes;
  }
  thread_ = std::thread([this] { RunJobs(); });
  if (scan_client_ != nullptr) {
    scan_thread_ = std::thread([this] { RunScans(); });
  }
}

RemoteTier::~RemoteTier() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.NotifyAll();
  scan_wake_.NotifyAll();
  thread_.join();
  if (scan_thread_.joinable()) scan_thread_.join();
}

std::string RemoteTier::RedisKey(const BlockKey& key) const {
  return key_prefix_ + key.ToHex();
}

bool RemoteTier::Contains(const BlockKey& key,
                          std::span<const TokenId> tokens) const {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (const auto it = index_.find(key); it != index_.end()) {
    // A block this tier wrote whose TTL ran out is gone, though a scan from
    // before then may still list it.
    if (now >= it->second.expires) return false;
    if (std::ranges::equal(tokens, it->second.tokens)) return true;
  }
  return known_.contains(key);
}

bool RemoteTier::Covers(const BlockKey& key,
                        std::span<const TokenId> tokens) const {
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  if (const auto it = index_.find(key); it != index_.end()) {
    return now < it->second.expires &&
           std::ranges::equal(tokens, it->second.tokens);
  }
  return options_.ttl.count() == 0 && known_.contains(key);
}

void RemoteTier::Spill(const BlockKey& key, std::span<const TokenId> tokens,
                       BlockId slot, std::optional<uint64_t> checksum,
                       Done done) {
  Job job;
  job.kind = Job::Kind::kSpill;
  job.key = key;
  job.tokens.assign(tokens.begin(), tokens.end());
  job.slot = slot;
  job.checksum = checksum;
  job.done = std::move(done);
  Enqueue(std::move(job));
}

void RemoteTier::Demote(const BlockKey& key, std::span<const TokenId> tokens,
                        std::vector<std::byte> payload, Done done) {
  Status refused;
  {
    MutexLock lock(&mu_);
    if (payload.size() != options_.block_bytes) {
      refused = Status::InvalidArgument(
          "remote tier: a demoted block of " + std::to_string(payload.size()) +
          " bytes, a block is " + std::to_string(options_.block_bytes));
    } else if (demotion_backlog_bytes_ > 0 &&
               demotion_backlog_bytes_ + payload.size() >
                   options_.max_demotion_backlog_bytes) {
      refused = Status::ResourceExhausted(
          "remote tier: " + std::to_string(demotion_backlog_bytes_) +
          " bytes of demoted blocks are waiting for Redis already");
    }
    if (!refused.ok()) {
      ++stats_.put_failures;
    } else {
      demotion_backlog_bytes_ += payload.size();
      ++writing_[key];
      Job job;
      job.kind = Job::Kind::kSpill;
      job.key = key;
      job.tokens.assign(tokens.begin(), tokens.end());
      job.payload = std::move(payload);
      job.clears = clears_;
      job.done = std::move(done);
      jobs_.push_back(std::move(job));
    }
  }
  if (!refused.ok()) return done(refused);
  work_.NotifyOne();
}

void RemoteTier::Promote(const BlockKey& key, std::span<const TokenId> tokens,
                         BlockId slot, PromoteDone done) {
  Job job;
  job.kind = Job::Kind::kPromote;
  job.key = key;
  job.tokens.assign(tokens.begin(), tokens.end());
  job.slot = slot;
  job.promote_done = std::move(done);
  Enqueue(std::move(job));
}

void RemoteTier::DropExpiredLocked(std::chrono::steady_clock::time_point now) {
  while (!expiries_.empty() && expiries_.front().first <= now) {
    const BlockKey key = expiries_.front().second;
    expiries_.pop_front();
    const auto it = index_.find(key);
    if (it != index_.end() && it->second.expires <= now) EraseLocked(key);
  }
}

uint64_t RemoteTier::EraseLocked(const BlockKey& key, bool report) {
  const auto it = index_.find(key);
  if (it == index_.end()) return 0;
  const uint64_t bytes = it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  if (!known_.contains(key)) --index_unscanned_;
  stats_.bytes -= bytes;
  stats_.keys = index_.size();
  if (report && options_.cache_events != nullptr) {
    options_.cache_events->BlockRemoved(CacheMedium::kRemote, key);
  }
  return bytes;
}

void RemoteTier::AddKnownLocked(const BlockKey& key) {
  if (!known_.insert(key).second) return;
  if (index_.contains(key)) --index_unscanned_;
}

void RemoteTier::DropKnownLocked(const BlockKey& key) {
  if (known_.erase(key) == 0) return;
  if (index_.contains(key)) ++index_unscanned_;
}

void RemoteTier::BeginDeleteLocked(const BlockKey& key) {
  DropKnownLocked(key);
  // Kept until the next scan starts: without scans, never needed.
  if (scan_client_ != nullptr) removed_in_scan_.insert(key);
  ++deleting_[key];
}

void RemoteTier::EndDeletesLocked(std::span<const BlockKey> keys) {
  for (const BlockKey& key : keys) {
    const auto it = deleting_.find(key);
    if (it != deleting_.end() && --it->second == 0) deleting_.erase(it);
  }
}

LowerRemoval RemoteTier::Remove(const BlockKey& key) {
  bool held = false;
  {
    MutexLock lock(&mu_);
    ++removals_;
    const bool known = known_.contains(key);
    held = EraseLocked(key) > 0 || known;
    BeginDeleteLocked(key);
  }
  Job job;
  job.kind = Job::Kind::kDelete;
  job.deleted.push_back(key);
  Enqueue(std::move(job));
  return {.remote = held ? 1u : 0u};
}

LowerRemoval RemoteTier::RemoveSpilled(const BlockKey& key) {
  {
    MutexLock lock(&mu_);
    if (known_.contains(key) && !index_.contains(key) &&
        !writing_.contains(key)) {
      return {};
    }
  }
  return Remove(key);
}

LowerRemoval RemoteTier::RemoveAll() {
  Job job;
  job.kind = Job::Kind::kDelete;
  uint64_t forgotten = 0;
  {
    MutexLock lock(&mu_);
    ++removals_;
    ++clears_;
    for (const auto& [key, entry] : index_) {
      job.deleted.push_back(key);
      ++deleting_[key];
    }
    forgotten = known_.size() + index_unscanned_;
    if (options_.cache_events != nullptr) {
      for (const auto& [key, entry] : index_) {
        options_.cache_events->BlockRemoved(CacheMedium::kRemote, key);
      }
    }
    index_.clear();
    lru_.clear();
    expiries_.clear();
    known_.clear();
    index_unscanned_ = 0;
    cleared_in_scan_ = true;
    stats_.bytes = 0;
    stats_.keys = 0;
    if (job.deleted.empty()) return {.remote = forgotten};
  }
  Enqueue(std::move(job));
  return {.remote = forgotten};
}

std::vector<BlockKey> RemoteTier::StoredKeys(size_t max,
                                             uint64_t* total) const {
  MutexLock lock(&mu_);
  *total = index_.size();
  std::vector<BlockKey> out;
  for (auto it = lru_.begin(); it != lru_.end() && out.size() < max; ++it) {
    out.push_back(*it);
  }
  return out;
}

DiskTierStats RemoteTier::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::optional<RemoteTierStats> RemoteTier::remote_stats() const {
  MutexLock lock(&mu_);
  RemoteTierStats out;
  out.capacity_bytes = stats_.capacity_bytes;
  out.bytes = stats_.bytes;
  out.keys = stats_.keys;
  out.known_keys = known_.size() + index_unscanned_;
  out.puts = stats_.puts;
  out.put_failures = stats_.put_failures;
  out.gets = stats_.gets;
  out.hits = stats_.hits;
  out.misses = stats_.misses;
  out.errors = io_errors_ + scan_errors_;
  out.checksum_failures = stats_.checksum_failures;
  out.token_mismatches = stats_.token_mismatches;
  out.evictions = stats_.evictions;
  out.bytes_written = stats_.stored_bytes_written;
  out.bytes_read = bytes_read_;
  out.scan_passes = scan_passes_;
  out.scan_failures = scan_failures_;
  out.known_keys_dropped = known_keys_dropped_;
  return out;
}

void RemoteTier::WaitQueued() {
  MutexLock lock(&mu_);
  while (!jobs_.empty() || running_job_) idle_.Wait(&mu_);
}

void RemoteTier::Enqueue(Job job) {
  {
    MutexLock lock(&mu_);
    if (job.kind == Job::Kind::kSpill) ++writing_[job.key];
    jobs_.push_back(std::move(job));
  }
  work_.NotifyOne();
}

void RemoteTier::RunJobs() {
  for (;;) {
    Job job;
    std::vector<Job> promotes;
    {
      MutexLock lock(&mu_);
      running_job_ = false;
      if (jobs_.empty()) idle_.NotifyAll();
      while (jobs_.empty() && !stopping_) work_.Wait(&mu_);
      if (jobs_.empty()) return;  // Stopping, and every job has run.
      job = std::move(jobs_.front());
      jobs_.pop_front();
      demotion_backlog_bytes_ -= job.payload.size();
      running_job_ = true;
      // Promotions queued right behind it go in the same pipeline.
      if (job.kind == Job::Kind::kPromote) {
        promotes.push_back(std::move(job));
        while (!jobs_.empty() && promotes.size() < kPromoteBatch &&
               jobs_.front().kind == Job::Kind::kPromote) {
          promotes.push_back(std::move(jobs_.front()));
          jobs_.pop_front();
        }
      }
    }
    switch (job.kind) {
      case Job::Kind::kSpill:
        RunSpill(job);
        break;
      case Job::Kind::kPromote:
        RunPromotes(promotes);
        break;
      case Job::Kind::kDelete:
        DeleteValues(std::move(job.deleted));
        break;
    }
    // Only this thread uses client_: its mutex is free.
    const uint64_t errors = client_->stats().errors;
    MutexLock lock(&mu_);
    io_errors_ = errors;
  }
}

void RemoteTier::DeleteValues(std::vector<BlockKey> keys) {
  // Failed DELs retried per batch at most: a long outage leaves many, and
  // each batch must stay short on this one thread.
  constexpr size_t kDeleteRetriesPerBatch = 1024;
  // Each key, with the deletes (BeginDeleteLocked) its DEL ends.
  std::vector<std::pair<BlockKey, int>> batch;
  batch.reserve(keys.size());
  for (const BlockKey& key : keys) batch.emplace_back(key, 1);
  {
    MutexLock lock(&mu_);
    auto it = failed_deletes_.begin();
    for (size_t n = 0;
         it != failed_deletes_.end() && n < kDeleteRetriesPerBatch; ++n) {
      batch.emplace_back(*it);
      it = failed_deletes_.erase(it);
    }
  }
  if (batch.empty()) return;
  std::vector<std::string> redis_keys;
  redis_keys.reserve(batch.size());
  for (const auto& [key, deletes] : batch) redis_keys.push_back(RedisKey(key));
  const std::vector<StatusOr<bool>> deleted = client_->MultiDel(redis_keys);
  std::vector<BlockKey> done;
  done.reserve(batch.size());
  MutexLock lock(&mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& [key, deletes] = batch[i];
    if (!deleted[i].ok()) {
      failed_deletes_[key] += deletes;
      continue;
    }
    done.insert(done.end(), static_cast<size_t>(deletes), key);
    // A scan running now may have listed the key before its DEL landed.
    if (scan_client_ != nullptr) removed_in_scan_.insert(key);
  }
  EndDeletesLocked(done);
}

void RemoteTier::RunSpill(Job& job) {
  const std::span<const std::byte> slot =
      job.payload.empty() ? options_.slot_memory(job.slot)
                          : std::span<const std::byte>(job.payload);
  uint64_t payload_sum = 0;
  const std::string value = EncodeValue(options_.store_fingerprint, job.key,
                                        job.tokens, slot, &payload_sum);
  if (job.checksum.has_value() && payload_sum != *job.checksum) {
    {
      MutexLock lock(&mu_);
      ++stats_.put_failures;
    }
    return FinishWrite(
        job,
        Status::DataLoss("host slot " + std::to_string(job.slot) +
                         " changed since its block was stored; not spilled"));
  }
  // Redis counts the TTL from when it runs the SET, after this.
  const auto expires = options_.ttl.count() > 0
                           ? std::chrono::steady_clock::now() + options_.ttl
                           : std::chrono::steady_clock::time_point::max();
  Status set = client_->Set(RedisKey(job.key), value, options_.ttl);
  std::vector<BlockKey> evicted;
  bool cleared = false;
  {
    MutexLock lock(&mu_);
    if (!set.ok()) {
      ++stats_.put_failures;
    } else if (deleting_.contains(job.key)) {
      // Removed after this write was queued: the DEL queued behind it
      // deletes what it wrote, and the index must not say otherwise.
      set = Status::Aborted("remote tier: block " + job.key.ToHex() +
                            " removed while its write was queued");
    } else if (!job.payload.empty() && job.clears != clears_) {
      // A block the disk tier evicted before a RemoveAll: what the
      // operator cleared does not come back (deleted below). A host
      // slot's spill lands as RemoveAll promises.
      cleared = true;
      BeginDeleteLocked(job.key);
      set = Status::Aborted("remote tier: block " + job.key.ToHex() +
                            " cleared while its demotion was queued");
    } else {
      // A block written again stays one entry (and one BlockStored).
      if (EraseLocked(job.key, /*report=*/false) == 0 &&
          options_.cache_events != nullptr) {
        options_.cache_events->BlockStored({.medium = CacheMedium::kRemote,
                                            .key = job.key,
                                            .parent = std::nullopt,
                                            .tokens = job.tokens,
                                            .block_size = options_.block_size,
                                            .lora_id = std::nullopt});
      }
      DropExpiredLocked(std::chrono::steady_clock::now());
      lru_.push_front(job.key);
      if (options_.ttl.count() > 0) expiries_.emplace_back(expires, job.key);
      index_[job.key] = Entry{.tokens = std::move(job.tokens),
                              .bytes = value.size(),
                              .lru = lru_.begin(),
                              .scan = scans_started_,
                              .expires = expires};
      if (!known_.contains(job.key)) ++index_unscanned_;
      stats_.bytes += value.size();
      ++stats_.puts;
      stats_.payload_bytes_written += slot.size();
      stats_.stored_bytes_written += value.size();
      while (options_.capacity_bytes > 0 &&
             stats_.bytes > options_.capacity_bytes && lru_.size() > 1) {
        const BlockKey victim = lru_.back();
        EraseLocked(victim);
        BeginDeleteLocked(victim);  // Deleted as Remove deletes.
        evicted.push_back(victim);
        ++stats_.evictions;
      }
      stats_.keys = index_.size();
    }
  }
  if (cleared) evicted.push_back(job.key);
  if (!evicted.empty()) DeleteValues(std::move(evicted));
  FinishWrite(job, std::move(set));
}

void RemoteTier::FinishWrite(Job& job, Status status) {
  {
    // Before `done`: the owner may undo the spill (RemoveSpilled) as soon
    // as it hears of it, and must find the write over by then.
    MutexLock lock(&mu_);
    const auto it = writing_.find(job.key);
    if (it != writing_.end() && --it->second == 0) writing_.erase(it);
  }
  job.done(std::move(status));
}

struct RemoteTier::Read {
  Status got;  // The GET's: OK (a value), NotFound, or why it failed.
  Verdict verdict = Verdict::kOtherStore;
  uint64_t checksum = 0;  // Of the slot's bytes, when kServe.
  // The value's header, when the value was read in place (its payload is
  // then in the slot).
  std::string header;
};

void RemoteTier::RunPromotes(std::vector<Job>& batch) {
  uint64_t removals_before = 0;
  {
    MutexLock lock(&mu_);
    removals_before = removals_;
    stats_.gets += batch.size();
  }
  std::vector<std::string> keys;
  for (const Job& job : batch) keys.push_back(RedisKey(job.key));
  std::vector<Read> reads(batch.size());
  // A slot shorter than a block (slot_memory broke its contract) is never
  // written: the value is read aside and not served.
  auto slot_chars = [&](size_t i) -> std::optional<std::span<char>> {
    const std::span<std::byte> slot = options_.slot_memory(batch[i].slot);
    if (slot.size() < options_.block_bytes) return std::nullopt;
    return std::span<char>(reinterpret_cast<char*>(slot.data()),
                           options_.block_bytes);
  };
  // A value as long as one of this block's is read straight from the
  // socket: its header into reads[i].header, its payload into the slot, no
  // copy on the way. It is verified there, all of it, before the promotion
  // may succeed (the slot holds garbage until then, which Promote allows).
  // A value of any other length is read whole and judged: it is never
  // served.
  const ValueSink sink{
      .place = [&](size_t i, size_t length) -> std::optional<ValueBuffers> {
        const size_t header = HeaderBytes(options_.store_fingerprint.size(),
                                          batch[i].tokens.size());
        const std::optional<std::span<char>> slot = slot_chars(i);
        if (length != header + options_.block_bytes || !slot.has_value()) {
          return std::nullopt;
        }
        reads[i].header.resize(header);
        return ValueBuffers{.head = reads[i].header, .body = *slot};
      },
      .placed =
          [&](size_t i) {
            const Job& job = batch[i];
            const std::span<char> slot = *slot_chars(i);  // Placed there.
            const Decoded d = DecodeSplit(
                reads[i].header, std::string_view(slot.data(), slot.size()),
                options_.store_fingerprint, job.key, job.tokens,
                options_.block_bytes);
            reads[i].verdict = d.verdict;
            if (d.verdict == Verdict::kServe) reads[i].checksum = d.payload_sum;
            return Status::Ok();
          },
      .take =
          [&](size_t i, std::string_view value) {
            const Job& job = batch[i];
            const Decoded d =
                DecodeValue(value, options_.store_fingerprint, job.key,
                            job.tokens, options_.block_bytes);
            const std::optional<std::span<char>> slot = slot_chars(i);
            reads[i].verdict = d.verdict;
            if (d.verdict == Verdict::kServe && !slot.has_value()) {
              reads[i].verdict = Verdict::kOtherBlock;
            } else if (d.verdict == Verdict::kServe) {
              std::memcpy(slot->data(), d.payload.data(), d.payload.size());
              reads[i].checksum = d.payload_sum;
            }
            return Status::Ok();
          },
  };
  const std::vector<Status> got = client_->MultiGetInPlace(keys, sink);
  for (size_t i = 0; i < batch.size(); ++i) {
    reads[i].got = got[i];
    FinishPromote(batch[i], keys[i], reads[i], removals_before);
  }
}

void RemoteTier::FinishPromote(Job& job, const std::string& redis_key,
                               const Read& read, uint64_t removals_before) {
  const Status& got = read.got;
  const Verdict verdict = read.verdict;
  Status failure;
  {
    MutexLock lock(&mu_);
    if (!got.ok()) {
      ++stats_.misses;  // Not there (NotFound), or Redis failed.
      failure = got;
      if (failure.code() == StatusCode::kNotFound) {
        // Expired, or deleted by another machine: no longer known.
        EraseLocked(job.key);
        DropKnownLocked(job.key);
      }
    } else if (verdict == Verdict::kDamaged) {
      ++stats_.checksum_failures;
      ++stats_.misses;
      EraseLocked(job.key);
      DropKnownLocked(job.key);
      failure = Status::DataLoss("remote value " + redis_key +
                                 " failed verification; deleted");
    } else if (verdict == Verdict::kOtherStore) {
      ++stats_.misses;
      DropKnownLocked(job.key);
      failure = Status::NotFound("remote value " + redis_key +
                                 " belongs to another store");
    } else if (verdict == Verdict::kOtherBlock) {
      ++stats_.token_mismatches;
      ++stats_.misses;
      // Until a scan finds the key again: each lookup would fail here.
      DropKnownLocked(job.key);
      failure = Status::NotFound("remote value " + redis_key +
                                 " holds another block (a key collision)");
    } else if (removals_ != removals_before && !index_.contains(job.key) &&
               !known_.contains(job.key)) {
      ++stats_.misses;
      failure = Status::NotFound("block removed while it was being promoted");
    } else {
      ++stats_.hits;
      bytes_read_ += options_.block_bytes;
      const auto it = index_.find(job.key);
      if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
    }
  }
  if (!failure.ok()) {
    if (got.ok() && verdict == Verdict::kDamaged) {
      (void)client_->MultiDel(std::span<const std::string>(&redis_key, 1));
    }
    return job.promote_done(failure);
  }
  job.promote_done(read.checksum);
}

void RemoteTier::RunScans() {
  for (;;) {
    RunScan();
    MutexLock lock(&mu_);
    const auto until =
        std::chrono::steady_clock::now() + options_.scan_interval;
    while (!stopping_ && scan_wake_.WaitUntil(&mu_, until)) {
    }
    if (stopping_) return;
  }
}

void RemoteTier::RunScan() {
  uint64_t scan = 0;
  bool retry_deletes = false;
  {
    MutexLock lock(&mu_);
    scan = ++scans_started_;
    removed_in_scan_.clear();
    cleared_in_scan_ = false;
    retry_deletes = !failed_deletes_.empty();
  }
  // DELs that failed go again (DeleteValues takes them): their keys stay
  // deleting, which this scan respects.
  if (retry_deletes) {
    Job retry;
    retry.kind = Job::Kind::kDelete;
    Enqueue(std::move(retry));
  }
  std::vector<BlockKey> found;
  const Status whole = scan_client_->ScanMasters(
      key_prefix_ + "*", options_.scan_count, [&](std::string_view redis_key) {
        if (!redis_key.starts_with(key_prefix_)) return;
        StatusOr<BlockKey> key =
            BlockKey::FromHex(redis_key.substr(key_prefix_.size()));
        if (key.ok()) found.push_back(*key);
      });
  const uint64_t errors = scan_client_->stats().errors;
  KeySet keys(found.begin(), found.end());
  found = {};
  {
    MutexLock lock(&mu_);
    scan_errors_ = errors;
    ApplyScanLocked(scan, &keys, whole.ok());
  }
  // `keys` holds the known keys the scan replaced: freed here, unlocked.
}

void RemoteTier::ApplyScanLocked(uint64_t scan, KeySet* found, bool whole) {
  if (!whole) {
    ++scan_failures_;
  } else {
    ++scan_passes_;
  }
  DropExpiredLocked(std::chrono::steady_clock::now());
  // RemoveAll meanwhile: what the scan saw may be deleted by now.
  if (cleared_in_scan_) return;
  if (whole) {
    // Written before the scan began and not found: expired, deleted by
    // another machine, or lost with a master.
    std::vector<BlockKey> gone;
    for (const auto& [key, entry] : index_) {
      if (entry.scan < scan && !found->contains(key)) gone.push_back(key);
    }
    for (const BlockKey& key : gone) EraseLocked(key);
  }
  for (const BlockKey& key : removed_in_scan_) found->erase(key);
  for (const auto& [key, deletes] : deleting_) found->erase(key);
  if (whole) {
    // The found keys replace the known ones (freed by the caller).
    while (found->size() > options_.max_known_keys) {
      found->erase(found->begin());
      ++known_keys_dropped_;
    }
    known_.swap(*found);
    index_unscanned_ = 0;
    for (const auto& [key, entry] : index_) {
      if (!known_.contains(key)) ++index_unscanned_;
    }
  } else {
    for (const BlockKey& key : *found) {
      if (known_.contains(key)) continue;
      if (known_.size() >= options_.max_known_keys) {
        ++known_keys_dropped_;
        continue;
      }
      AddKnownLocked(key);
    }
  }
  stats_.keys = index_.size();
}

}  // namespace tierkv
