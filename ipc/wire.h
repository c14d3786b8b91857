// The protocol's wire primitives (ipc/protocol.h): a little-endian Writer,
// a bounds-checked Reader, Put/Get of the types several messages share, and
// the per-message PutPayload/GetPayload overloads that Encode and Decode
// dispatch over (defined in protocol.cc, protocol_worker.cc,
// protocol_admin.cc and protocol_stats.cc). Internal to ipc/.
#ifndef TIERKV_IPC_WIRE_H_
#define TIERKV_IPC_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ipc/protocol.h"

namespace tierkv::ipc::wire {

// Little-endian writer over a byte vector.
class Writer {
 public:
  explicit Writer(std::vector<std::byte>* out) : out_(out) {}

  template <typename T>
  void Int(T v) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    auto u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_->push_back(static_cast<std::byte>(u & 0xFF));
      if constexpr (sizeof(T) > 1) u >>= 8;
    }
  }
  void Bool(bool v) { Int<uint8_t>(v ? 1 : 0); }
  void String(const std::string& s) {
    Int<uint32_t>(static_cast<uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_->insert(out_->end(), p, p + s.size());
  }
  template <typename T>
  void Ints(const std::vector<T>& v) {
    Ints(std::span<const T>(v));
  }
  template <typename T>
  void Ints(std::span<const T> v) {
    Int<uint32_t>(static_cast<uint32_t>(v.size()));
    if constexpr (std::endian::native == std::endian::little) {
      // The wire format is little-endian: the array is its own encoding.
      const auto* p = reinterpret_cast<const std::byte*>(v.data());
      out_->insert(out_->end(), p, p + v.size_bytes());
    } else {
      for (T x : v) Int<T>(x);
    }
  }

 private:
  std::vector<std::byte>* out_;
};

// Bounds-checked little-endian reader. After the first failure every read
// fails, so a decoder checks ok() once at the end.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  T Int() {
    static_assert(std::is_integral_v<T>);
    if (!Need(sizeof(T))) return T{};
    std::make_unsigned_t<T> u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      u |= static_cast<std::make_unsigned_t<T>>(
               static_cast<uint8_t>(in_[pos_ + i]))
           << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  bool Bool() {
    const auto v = Int<uint8_t>();
    if (v > 1) Fail("boolean out of range");
    return v == 1;
  }
  std::string String() {
    const auto n = Int<uint32_t>();
    if (n > kMaxString) {
      Fail("string of " + std::to_string(n) + " bytes");
      return {};
    }
    if (!Need(n)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> Ints(uint32_t max_count, const char* what) {
    std::vector<T> v;
    IntsInto(&v, max_count, what);
    return v;
  }
  // Into *v, whose capacity is reused: a vector of the same size is
  // overwritten without being filled with zeros first.
  template <typename T>
  void IntsInto(std::vector<T>* v, uint32_t max_count, const char* what) {
    v->clear();
    const auto n = Int<uint32_t>();
    if (n > max_count) {
      Fail(std::string(what) + " count " + std::to_string(n) + " exceeds " +
           std::to_string(max_count));
      return;
    }
    if (!Need(static_cast<size_t>(n) * sizeof(T))) return;
    v->resize(n);
    if constexpr (std::endian::native == std::endian::little) {
      if (n > 0) std::memcpy(v->data(), in_.data() + pos_, n * sizeof(T));
      pos_ += n * sizeof(T);
    } else {
      for (auto& x : *v) x = Int<T>();
    }
  }
  uint32_t Count(uint32_t max_count, const char* what) {
    const auto n = Int<uint32_t>();
    if (n > max_count) {
      Fail(std::string(what) + " count " + std::to_string(n) + " exceeds " +
           std::to_string(max_count));
      return 0;
    }
    return n;
  }
  void Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    pos_ = in_.size();
  }
  bool ok() const { return error_.empty(); }
  bool at_end() const { return pos_ == in_.size(); }
  const std::string& error() const { return error_; }
  size_t pos() const { return pos_; }

 private:
  bool Need(size_t n) {
    if (!error_.empty()) return false;
    if (in_.size() - pos_ < n) {
      Fail("truncated at byte " + std::to_string(pos_));
      return false;
    }
    return true;
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- Shared pieces (wire.cc) ---------------------------------------------

void Put(Writer& w, const KvLayout& l);
void Get(Reader& r, KvLayout* l);
void Put(Writer& w, const TransferEvent& e);
EventKind GetKind(Reader& r);
void Get(Reader& r, TransferEvent* e);
void Put(Writer& w, const EventLatency& l);
void Get(Reader& r, EventLatency* l);
void Put(Writer& w, const Status& s);
Status GetStatus(Reader& r);
void Put(Writer& w, const BlockKey& key);
BlockKey GetKey(Reader& r);

// ---- Per message ---------------------------------------------------------

// protocol.cc: the replies any request may get.
void PutPayload(Writer&, const ErrorReply&);
void PutPayload(Writer&, const OkReply&);
void GetPayload(Reader&, ErrorReply*);
void GetPayload(Reader&, OkReply*);

// protocol_worker.cc: a worker's messages.
void PutPayload(Writer&, const RegisterRequest&);
void PutPayload(Writer&, const RegisterReply&);
void PutPayload(Writer&, const LookupRequest&);
// A LookupRequest's payload, from the caller's tokens.
void PutLookup(Writer& w, RequestId request, int32_t num_computed_tokens,
               std::span<const TokenId> tokens, const RequestExtras& extras,
               uint32_t kept_tokens, uint64_t kept_tag);
void PutPayload(Writer&, const LookupChunkRequest&);
void PutPayload(Writer&, const LookupReply&);
void PutPayload(Writer&, const AllocateRequest&);
void PutPayload(Writer&, const AllocateReply&);
void PutPayload(Writer&, const CommitRequest&);
void PutPayload(Writer&, const CommitReply&);
void PutPayload(Writer&, const CompleteRequest&);
void PutPayload(Writer&, const FinishRequest&);
void GetPayload(Reader&, RegisterRequest*);
void GetPayload(Reader&, RegisterReply*);
void GetPayload(Reader&, LookupRequest*);
void GetPayload(Reader&, LookupChunkRequest*);
void GetPayload(Reader&, LookupReply*);
void GetPayload(Reader&, AllocateRequest*);
void GetPayload(Reader&, AllocateReply*);
void GetPayload(Reader&, CommitRequest*);
void GetPayload(Reader&, CommitReply*);
void GetPayload(Reader&, CompleteRequest*);
void GetPayload(Reader&, FinishRequest*);
void PutPayload(Writer&, const ReadyLoadsRequest&);
void PutPayload(Writer&, const WaitIdleRequest&);
void PutPayload(Writer&, const WaitIdleReply&);
void GetPayload(Reader&, WaitIdleRequest*);
void GetPayload(Reader&, WaitIdleReply*);
void PutPayload(Writer&, const ReadyLoadsReply&);
void GetPayload(Reader&, ReadyLoadsRequest*);
void GetPayload(Reader&, ReadyLoadsReply*);
void PutPayload(Writer&, const FetchChunkRequest&);
void PutPayload(Writer&, const FetchChunkReply&);
void PutPayload(Writer&, const PublishChunkRequest&);
void PutPayload(Writer&, const ChunkDoneRequest&);
void PutPayload(Writer&, const LookupBatchRequest&);
void PutPayload(Writer&, const LookupBatchReply&);
void GetPayload(Reader&, LookupBatchRequest*);
void GetPayload(Reader&, LookupBatchReply*);
void GetPayload(Reader&, FetchChunkRequest*);
void GetPayload(Reader&, FetchChunkReply*);
void GetPayload(Reader&, PublishChunkRequest*);
void GetPayload(Reader&, ChunkDoneRequest*);

// protocol_stats.cc: stats.
void PutPayload(Writer&, const StatsRequest&);
void PutPayload(Writer&, const StatsReply&);
void GetPayload(Reader&, StatsRequest*);
void GetPayload(Reader&, StatsReply*);

// protocol_admin.cc: tierkv-admin's events, clear and evict.
void PutPayload(Writer&, const EventsRequest&);
void PutPayload(Writer&, const EventsReply&);
void GetPayload(Reader&, EventsRequest*);
void GetPayload(Reader&, EventsReply*);
void PutPayload(Writer&, const ClearRequest&);
void PutPayload(Writer&, const ClearReply&);
void GetPayload(Reader&, ClearRequest*);
void GetPayload(Reader&, ClearReply*);
void PutPayload(Writer&, const EvictRequest&);
void PutPayload(Writer&, const EvictReply&);
void GetPayload(Reader&, EvictRequest*);
void GetPayload(Reader&, EvictReply*);
void PutPayload(Writer&, const HeldKeysRequest&);
void PutPayload(Writer&, const HeldKeysReply&);
void GetPayload(Reader&, HeldKeysRequest*);
void GetPayload(Reader&, HeldKeysReply*);
void PutPayload(Writer&, const RouteRequest&);
void PutPayload(Writer&, const RouteReply&);
void GetPayload(Reader&, RouteRequest*);
void GetPayload(Reader&, RouteReply*);
// A request's extra keys (RequestExtras), as a LookupRequest carries them.
void PutExtras(Writer& w, const RequestExtras& extras);
void GetExtras(Reader& r, RequestExtras* extras);

}  // namespace tierkv::ipc::wire

#endif  // TIERKV_IPC_WIRE_H_
