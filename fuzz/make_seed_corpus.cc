// Writes the fuzzers' seed corpus, fuzz/corpus/<harness>/<seed>: a few valid
// inputs per harness, made with tierkv's own encoders so that they follow
// the formats exactly (frames, channel headers, disk values). Run it after
// a format changes and commit what changed:
//   build-clang/fuzz/make_seed_corpus fuzz/corpus
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ipc/protocol.h"
#include "tiers/disk_internal.h"
#include "tiers/disk_tier.h"

namespace tierkv {
namespace {

using Bytes = std::vector<std::byte>;

std::filesystem::path root;

void Write(const std::string& harness, const std::string& name,
           std::span<const std::byte> bytes) {
  const std::filesystem::path dir = root / harness;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void Write(const std::string& harness, const std::string& name,
           std::string_view text) {
  Write(
      harness, name,
      std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

template <typename T>
void Append(Bytes* out, T value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out->insert(out->end(), p, p + sizeof(value));
}

// ---- protocol_decode_fuzz: one frame of each kind -------------------------

void ProtocolSeeds() {
  const KvLayout layout{.num_layers = 2,
                        .num_kv_heads = 2,
                        .head_dim = 64,
                        .block_size = 16,
                        .dtype = DType::kBF16};
  const TransferEvent event{.ref = {EventKind::kLoad, 7},
                            .request = 42,
                            .device_blocks = {3, 4},
                            .host_blocks = {9, 10}};
  RequestExtras extras;
  extras.lora_id = 5;
  extras.mm_items.push_back({.hash = {1, 2}, .start = 3, .length = 4});
  extras.cache_salt = "salt";
  CoordinatorStats stats;
  stats.host.capacity_slots = 49;
  stats.disk.emplace();
  stats.disk->keys = 8;
  stats.workers.push_back({.id = 1, .pid = 77, .name = "w", .requests = 2});
  stats.load_latency.Record(250);
  stats.model = "org/model@rev";
  const std::vector<std::pair<const char*, ipc::Message>> messages = {
      {"error", ipc::ErrorReply{Status::NotFound("gone")}},
      {"ok", ipc::OkReply{}},
      {"register", ipc::RegisterRequest{{.layout = layout,
                                         .model = "org/model@rev",
                                         .num_device_blocks = 100,
                                         .tenant = "t",
                                         .pid = 5,
                                         .name = "n"}}},
      {"register_reply", ipc::RegisterReply{.worker_id = 3,
                                            .host_slots = 50,
                                            .slot_bytes = 16384,
                                            .store_fingerprint = "kv1"}},
      {"lookup", ipc::LookupRequest{.request = 1,
                                    .num_computed_tokens = 16,
                                    .tokens = {1, 2, 3},
                                    .extras = extras}},
      {"lookup_reply", ipc::LookupReply{{.hit_tokens = 32}}},
      {"lookup_chunk", ipc::LookupChunkRequest{.request = 7, .tokens = {4, 5}}},
      {"allocate",
       ipc::AllocateRequest{
           .request = 1, .num_external_tokens = 16, .device_blocks = {1, 2}}},
      {"allocate_reply",
       ipc::AllocateReply{{.load = event,
                           .load_pending = true,
                           .store_status = Status::ResourceExhausted("full")}}},
      {"commit",
       ipc::CommitRequest{
           .request = 1, .num_computed_tokens = 32, .device_blocks = {1, 2}}},
      {"commit_reply", ipc::CommitReply{{.stores = {event}}}},
      {"complete", ipc::CompleteRequest{{{{EventKind::kStore, 3}, true},
                                         {{EventKind::kLoad, 4}, false}}}},
      {"finish", ipc::FinishRequest{9}},
      {"stats", ipc::StatsRequest{}},
      {"stats_reply", ipc::StatsReply{stats}},
      {"ready_loads", ipc::ReadyLoadsRequest{}},
      {"ready_loads_reply", ipc::ReadyLoadsReply{{event}}},
      {"events", ipc::EventsRequest{}},
      {"events_reply",
       ipc::EventsReply{.in_flight = 1,
                        .events = {{.worker = 2,
                                    .worker_name = "engine-2",
                                    .ref = {EventKind::kLoad, 5},
                                    .request = 11,
                                    .blocks = 4,
                                    .state = EventState::kPromoting}}}},
      {"clear", ipc::ClearRequest{TierSelection::kDisk}},
      {"clear_reply", ipc::ClearReply{{.host_dropped = 5}}},
      {"evict", ipc::EvictRequest{{{1, 2}, {3, 4}}}},
      {"evict_reply", ipc::EvictReply{{{.key = {1, 2}, .host_dropped = true}}}},
      {"wait_idle", ipc::WaitIdleRequest{250}},
      {"wait_idle_reply", ipc::WaitIdleReply{true}},
      {"fetch_chunk",
       ipc::FetchChunkRequest{
           .request = 3, .wait_ms = 100, .tokens = {4, 5, 6}}},
      {"fetch_chunk_reply",
       ipc::FetchChunkReply{{.lookup = {.hit_tokens = 3},
                             .load = TransferEvent{.ref = {EventKind::kLoad, 2},
                                                   .request = 3,
                                                   .device_blocks = {},
                                                   .host_blocks = {9}},
                             .lease = false,
                             .waited = true}}},
      {"publish_chunk",
       ipc::PublishChunkRequest{
           .request = 4, .tokens = {4, 5, 6}, .device_blocks = {1}}},
      {"chunk_done",
       ipc::ChunkDoneRequest{.events = {{{EventKind::kStore, 3}, true}},
                             .finish = 4}},
      {"lookup_batch", ipc::LookupBatchRequest{{{.request = 1,
                                                 .num_computed_tokens = 0,
                                                 .tokens = {1, 2, 3},
                                                 .extras = {}},
                                                {.request = 2,
                                                 .num_computed_tokens = 0,
                                                 .tokens = {4, 5},
                                                 .extras = {}}}}},
      {"lookup_batch_reply",
       ipc::LookupBatchReply{
           {LookupResult{.hit_tokens = 16}, Status::ResourceExhausted("cap")}}},
      {"held_keys", ipc::HeldKeysRequest{}},
      {"held_keys_reply",
       ipc::HeldKeysReply{{.host_total = 1,
                           .disk_total = 0,
                           .remote_total = 1,
                           .host = {BlockKey{.lo = 1, .hi = 2}},
                           .disk = {},
                           .remote = {BlockKey{.lo = 3, .hi = 4}}}}},
      {"route",
       ipc::RouteRequest{
           .tenant = "t",
           .tokens = {1, 2, 3, 4},
           .extras = {.lora_id = 2, .mm_items = {}, .cache_salt = ""}}},
      {"route_reply",
       ipc::RouteReply{{.prompt_tokens = 32,
                        .cached_tokens = 32,
                        .lower_tokens = 16,
                        .workers = {{.id = 1, .name = "w", .pid = 7}}}}},
      {"lookup_again", ipc::LookupRequest{.request = 1,
                                          .num_computed_tokens = 0,
                                          .tokens = {9},
                                          .extras = {},
                                          .kept_tokens = 32,
                                          .kept_tag = 5}},
  };
  for (const auto& [name, message] : messages) {
    Write("protocol_decode_fuzz", name, ipc::Encode(message));
  }
}

// ---- worker_sequence_fuzz: records of a control byte and a frame ---------

class Sequence {
 public:
  // Worker `worker` (0 or 1) sends `message`; `reconnect`: it disconnects
  // and registers again first.
  Sequence& Send(int worker, const ipc::Message& message,
                 bool reconnect = false) {
    bytes_.push_back(static_cast<std::byte>(worker | (reconnect ? 2 : 0)));
    ipc::Encode(message, &bytes_);
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
};

std::vector<TokenId> Tokens(int first, int count) {
  std::vector<TokenId> t;
  for (int i = 0; i < count; ++i) t.push_back(first + i);
  return t;
}

void WorkerSequenceSeeds() {
  using ipc::AllocateRequest;
  using ipc::CommitRequest;
  using ipc::CompleteRequest;
  using ipc::FinishRequest;
  using ipc::LookupRequest;
  const EventRef store0{EventKind::kStore, 0};
  const EventRef load0{EventKind::kLoad, 0};
  // Blocks of 4 tokens. Worker 0 stores a 12-token prompt; worker 1 hits
  // its first 8 tokens, loads them and stores the rest of its own.
  std::vector<TokenId> longer = Tokens(1, 12);
  longer.push_back(100);
  longer.push_back(101);
  longer.push_back(102);
  longer.push_back(103);
  Sequence share;
  share.Send(0, LookupRequest{.request = 1, .tokens = Tokens(1, 12)})
      .Send(0, AllocateRequest{.request = 1, .device_blocks = {0, 1, 2}})
      .Send(0, CommitRequest{.request = 1,
                             .num_computed_tokens = 12,
                             .device_blocks = {0, 1, 2}})
      .Send(0, CompleteRequest{{{store0, true}}})
      .Send(0, FinishRequest{1})
      .Send(1, LookupRequest{.request = 2, .tokens = longer})
      .Send(1, AllocateRequest{.request = 2,
                               .num_external_tokens = 8,
                               .device_blocks = {5, 6, 7, 8}})
      .Send(1, CompleteRequest{{{load0, true}}})
      .Send(1, CommitRequest{.request = 2,
                             .num_computed_tokens = 16,
                             .device_blocks = {5, 6, 7, 8}})
      .Send(1, CompleteRequest{{{store0, true}}})
      .Send(1, ipc::StatsRequest{})
      .Send(1, FinishRequest{2});
  Write("worker_sequence_fuzz", "store_then_load", share.bytes());

  // A chunk stored, then looked up by the other worker, which dies while it
  // loads; a failed store; a wait and the ready loads.
  Sequence chunk;
  chunk.Send(0, ipc::LookupChunkRequest{.request = 3, .tokens = Tokens(50, 6)})
      .Send(0, AllocateRequest{.request = 3, .device_blocks = {10, 11}})
      .Send(0, CommitRequest{.request = 3,
                             .num_computed_tokens = 6,
                             .device_blocks = {10, 11}})
      .Send(0, CompleteRequest{{{store0, true}}})
      .Send(1, ipc::LookupChunkRequest{.request = 4, .tokens = Tokens(50, 6)})
      .Send(1, AllocateRequest{.request = 4,
                               .num_external_tokens = 6,
                               .device_blocks = {20, 21}})
      .Send(1, ipc::ReadyLoadsRequest{}, /*reconnect=*/true)
      .Send(0, CommitRequest{.request = 5, .device_blocks = {1}})
      .Send(0, ipc::WaitIdleRequest{10})
      .Send(0, FinishRequest{3});
  Write("worker_sequence_fuzz", "chunk_and_reconnect", chunk.bytes());

  // Chunks in one round trip: both workers miss one chunk (the first takes
  // its compute lease), the first publishes it and completes one-way, the
  // second fetches it; a lease given up by finishing its fetch.
  Sequence flight;
  flight.Send(0, ipc::FetchChunkRequest{.request = 6, .tokens = Tokens(70, 20)})
      .Send(1, ipc::FetchChunkRequest{.request = 7, .tokens = Tokens(70, 20)})
      .Send(0, ipc::PublishChunkRequest{.request = 8,
                                        .tokens = Tokens(70, 20),
                                        .device_blocks = {1, 2, 3}})
      .Send(0, ipc::ChunkDoneRequest{.events = {{store0, true}}, .finish = 0})
      .Send(1, ipc::FetchChunkRequest{.request = 9, .tokens = Tokens(70, 20)})
      .Send(1, ipc::ChunkDoneRequest{.events = {{load0, true}}, .finish = 0})
      .Send(1, ipc::FetchChunkRequest{.request = 10, .tokens = Tokens(80, 5)})
      .Send(1, FinishRequest{10});
  Write("worker_sequence_fuzz", "chunk_single_flight", flight.bytes());

  // More stores than host slots, none completed, then one failed.
  Sequence full;
  for (int r = 0; r < 4; ++r) {
    const std::vector<BlockId> blocks = {4 * r, 4 * r + 1, 4 * r + 2};
    const auto request = static_cast<RequestId>(10 + r);
    full.Send(r & 1, LookupRequest{.request = request,
                                   .tokens = Tokens(1000 * (r + 1), 12)})
        .Send(r & 1,
              AllocateRequest{.request = request, .device_blocks = blocks})
        .Send(r & 1, CommitRequest{.request = request,
                                   .num_computed_tokens = 12,
                                   .device_blocks = blocks});
  }
  full.Send(0, CompleteRequest{{{store0, false}}})
      .Send(1, FinishRequest{11})
      .Send(0, ipc::EvictRequest{{{1, 2}}});
  Write("worker_sequence_fuzz", "host_full", full.bytes());
}

// ---- channel_frame_fuzz: a channel header and request, or a stream -------

void ChannelSeeds() {
  const Bytes lookup =
      ipc::Encode(ipc::LookupRequest{.request = 1, .tokens = Tokens(1, 20)});
  // WorkerView in channel_frame_fuzz.cc: magic, version, capacity, then
  // the request words at 64 and the response words at 128.
  auto header = [](uint32_t request_seq, uint32_t request_len) {
    Bytes h(192);
    const uint64_t magic = 0x314C4E4843564B54ull;
    const uint32_t version = 1, capacity = 4096;
    std::memcpy(h.data(), &magic, 8);
    std::memcpy(h.data() + 8, &version, 4);
    std::memcpy(h.data() + 12, &capacity, 4);
    std::memcpy(h.data() + 64, &request_seq, 4);
    std::memcpy(h.data() + 68, &request_len, 4);
    return h;
  };
  for (const auto& [name, len] :
       {std::pair<const char*, uint32_t>{"channel_lookup",
                                         static_cast<uint32_t>(lookup.size())},
        {"channel_overlong", 1u << 20}}) {
    Bytes seed = {std::byte{1}};
    const Bytes h = header(7, len);
    seed.insert(seed.end(), h.begin(), h.end());
    seed.insert(seed.end(), lookup.begin(), lookup.end());
    Write("channel_frame_fuzz", name, seed);
  }
  // Socket: a registration and a stats request, read 8 bytes at a time.
  Bytes stream = {std::byte{7 << 1}};
  ipc::Encode(ipc::RegisterRequest{{.layout = {.num_layers = 2,
                                               .num_kv_heads = 2,
                                               .head_dim = 64,
                                               .block_size = 16,
                                               .dtype = DType::kBF16},
                                    .num_device_blocks = 64,
                                    .name = "w"}},
              &stream);
  ipc::Encode(ipc::StatsRequest{}, &stream);
  ipc::Encode(ipc::EventsRequest{}, &stream);
  Write("channel_frame_fuzz", "socket_register_stats", stream);
}

// ---- disk_value_fuzz: values, a storage key, a payload --------------------

void DiskSeeds() {
  namespace disk = disk_internal;
  std::string payload(256, '\0');
  for (size_t i = 0; i < payload.size(); ++i) {
    payload[i] = static_cast<char>(i % 7 == 0 ? i : 0);
  }
  const std::vector<TokenId> tokens = {11, 12, 13, 14};
  const std::string token_bytes(reinterpret_cast<const char*>(tokens.data()),
                                tokens.size() * sizeof(TokenId));
  for (DiskCodec codec :
       {DiskCodec::kNone, DiskCodec::kLz4, DiskCodec::kLz4BytePlanes}) {
    const auto raw = std::span(
        reinterpret_cast<const std::byte*>(payload.data()), payload.size());
    std::vector<std::byte> out(MaxEncodedBytes(codec, 2, raw.size()));
    StatusOr<EncodedPayload> encoded = EncodePayload(codec, 2, raw, out);
    if (!encoded.ok()) continue;
    disk::ValueFields f;
    f.codec = encoded->codec;
    f.element_bytes = 2;
    f.sequence = 9;
    f.payload_bytes = payload.size();
    f.fingerprint = "kv1:layers=2";
    f.token_bytes = token_bytes;
    f.stored = encoded->codec == DiskCodec::kNone
                   ? std::string_view(payload)
                   : disk::AsChars(std::span(out).first(encoded->bytes));
    f.stored_bytes = f.stored.size();
    f.stored_checksum = disk::Checksum(f.stored);
    f.payload_checksum = disk::Checksum(payload);
    f.slot = 3;
    const std::string value = std::string(1, '\0') + disk::EncodeHeader(f);
    Write("disk_value_fuzz",
          std::string("value_") + std::string(DiskCodecName(codec)), value);
  }
  Write("disk_value_fuzz", "storage_key",
        std::string(1, '\0') + DiskStorageKey({.lo = 1, .hi = 2}));
  // Mode 1: codec lz4, element size 2, sequence, payload size 16, payload
  // checksum, an empty fingerprint, one token, then the stored bytes.
  std::string checksummed =
      std::string(1, '\1') + '\1' + '\2' + std::string(8, '\0') + '\x10' +
      '\0' + std::string(8, '\0') + '\0' + '\0' + "\x10stored bytes";
  Write("disk_value_fuzz", "checksummed_lz4", checksummed);
  // Mode 2: byte planes of 2-byte elements over a payload.
  Write("disk_value_fuzz", "codec_byte_planes",
        std::string("\2\2\1") + payload.substr(0, 64));
}

// ---- config_fuzz: tierkvd --config files ----------------------------------

void ConfigSeeds() {
  Write("config_fuzz", "full",
        "# tierkvd\n"
        "model = org/model@rev\n"
        "layers = 32\nkv-heads = 8\nhead-dim = 128\nblock-size = 16\n"
        "dtype = bf16\nstore = default\nhost-capacity = 8G\n"
        "max-workers = 64\nstats-interval-ms = 100\n"
        "disk-dir = /var/lib/tierkv/default\ndisk-capacity = 200G\n"
        "disk-codec = lz4-byte-planes\nspill-high = 0.9\nspill-low = 0.7\n"
        "mode = 0660\nlog-level = debug\nstop-timeout = 10\n");
  Write("config_fuzz", "minimal", "layers = 2\nkv-heads = 2\nhead-dim = 64\n");
  Write("config_fuzz", "section_and_errors",
        "[server]\nlayers = 2\n\nkv-heads=2  # comment\nhead-dim = x\n"
        "host-capacity = 64KiB\nnot a setting\n");
  Write("config_fuzz", "size", "512M");
}

// ---- separator_fuzz: a separator length and block size, then tokens ------

void SeparatorSeeds() {
  auto seed = [](int separator_len, int block_size,
                 std::vector<uint8_t> tokens) {
    std::string s(1, static_cast<char>(separator_len | (block_size << 3)));
    for (uint8_t t : tokens) s.push_back(static_cast<char>(t));
    return s;
  };
  Write("separator_fuzz", "two_documents",
        seed(2, 4, {3, 3, 0, 1, 0, 3, 3, 1, 2, 1, 2, 1,
                    3, 3, 1, 2, 1, 2, 1, 3, 3, 0, 0}));
  Write("separator_fuzz", "repeated_document",
        seed(1, 2, {3, 0, 1, 3, 2, 2, 3, 2, 2, 3, 1}));
  Write("separator_fuzz", "overlapping_separator",
        seed(3, 3, {1, 1, 2, 0, 1, 1, 1, 2, 0, 1, 1, 2, 0}));
  Write("separator_fuzz", "empty_segment", seed(1, 1, {3, 0, 3, 3, 0}));
}

}  // namespace
}  // namespace tierkv

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seed_corpus fuzz/corpus\n");
    return 2;
  }
  tierkv::root = argv[1];
  tierkv::ProtocolSeeds();
  tierkv::WorkerSequenceSeeds();
  tierkv::ChannelSeeds();
  tierkv::DiskSeeds();
  tierkv::ConfigSeeds();
  tierkv::SeparatorSeeds();
  return 0;
}
