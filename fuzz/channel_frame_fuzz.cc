// tierkvd's side of what a worker can write: the shared-memory control
// channel (ipc/channel.h) and the Unix socket's byte stream. The first
// input byte picks which; bit 0 set: the channel, clear: the socket.
//
// Channel: the rest of the input is what a hostile worker wrote into its
// mapping of the channel segment: over the shared header first (magic,
// capacity, sequence words, lengths, wait flags: anything), then over the
// request buffer and on into the response buffer. tierkvd's Receive must
// return a request of at most the capacity it read when the channel was
// created (exactly the bytes the worker announced, or none when it
// announced too many), and its Respond must publish the reply whole,
// whatever the header now says. The worker's view of the header is
// mirrored below; a round trip at start-up checks that the mirror matches
// channel.cc's layout.
//
// Socket: the rest of the input arrives in reads of (first byte >> 1) + 1
// bytes and is split into frames with PeekPayloadLength and Decode as the
// listener (ipc/server_listener.cc) does: a frame is taken only whole,
// never past kMaxSocketPayload, a bad header or frame disconnects, and the
// bytes waiting for the rest of a frame stay bounded.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ipc/channel.h"
#include "ipc/protocol.h"
#include "ipc/server_impl.h"
#include "tiers/shm_segment.h"

namespace tierkv::ipc {
namespace {

constexpr uint32_t kCapacity = 4096;
constexpr size_t kBuffersOffset = 4096;  // channel.cc: the header's page.

// ControlChannel::Header as channel.cc lays it out: what a worker sees.
struct WorkerView {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  alignas(64) std::atomic<uint32_t> request_seq;
  uint32_t request_len;
  std::atomic<uint32_t> response_waiting;
  alignas(64) std::atomic<uint32_t> response_seq;
  uint32_t response_len;
  std::atomic<uint32_t> request_waiting;
};

class ChannelHarness {
 public:
  ChannelHarness() {
    StatusOr<ControlChannel> channel =
        ControlChannel::Create(kCapacity, "fuzz.channel");
    FUZZ_CHECK(channel.ok(), "%s", channel.status().ToString().c_str());
    channel_ = std::make_unique<ControlChannel>(std::move(*channel));
    // The worker's mapping, from the descriptor tierkvd would pass it.
    StatusOr<ShmSegment> mapping =
        ShmSegment::MapSealed(dup(channel_->segment_fd()), /*writable=*/true);
    FUZZ_CHECK(mapping.ok(), "%s", mapping.status().ToString().c_str());
    worker_mapping_ = std::make_unique<ShmSegment>(std::move(*mapping));
    CheckMirror();
  }

  void Run(std::span<const std::byte> input) {
    std::byte* base = worker_mapping_->data();
    const size_t header = std::min(input.size(), sizeof(WorkerView));
    std::memcpy(base, input.data(), header);
    input = input.subspan(header);
    const size_t body = std::min(input.size(), 2 * size_t{kCapacity});
    std::memcpy(base + kBuffersOffset, input.data(), body);
    // The worker publishes: its sequence word moves (a worker that does not
    // move it only leaves tierkvd waiting).
    if (view()->request_seq.load() == last_seq_) view()->request_seq++;
    const uint32_t announced = view()->request_len;

    std::vector<std::byte> request;
    const std::atomic<bool> stop{false};
    FUZZ_CHECK(channel_->Receive(&request, stop, std::chrono::milliseconds(1)),
               "Receive missed a published request");
    last_seq_ = view()->request_seq.load();
    FUZZ_CHECK(channel_->capacity() == kCapacity,
               "the capacity tierkvd uses changed to %u", channel_->capacity());
    if (announced <= kCapacity) {
      FUZZ_CHECK(
          request.size() == announced &&
              std::equal(request.begin(), request.end(), base + kBuffersOffset),
          "received %zu bytes of the %u announced", request.size(), announced);
    } else {
      FUZZ_CHECK(request.empty(), "received %zu bytes past the capacity",
                 request.size());
    }

    // tierkvd's answer (Server::Impl::Serve): the decoded request, or the
    // error; here always the error reply, which is what a bad frame gets.
    StatusOr<Message> message = Decode(request);
    const Message reply = ErrorReply{
        message.ok() ? Status::Unimplemented("fuzz") : message.status()};
    std::vector<std::byte> response = Encode(reply);
    if (response.size() > kCapacity) {
      response = Encode(ErrorReply{Status::ResourceExhausted("too long")});
    }
    const Status responded = channel_->Respond(response);
    FUZZ_CHECK(responded.ok(), "%s", responded.ToString().c_str());
    FUZZ_CHECK(view()->response_len == response.size() &&
                   std::equal(response.begin(), response.end(),
                              base + kBuffersOffset + kCapacity),
               "the response buffer does not hold the response");
    const std::vector<std::byte> too_long(kCapacity + 1);
    FUZZ_CHECK(!channel_->Respond(too_long).ok(),
               "a response past the capacity was accepted");
  }

 private:
  WorkerView* view() const {
    return reinterpret_cast<WorkerView*>(worker_mapping_->data());
  }

  // One honest call from a worker's ControlChannel, seen through the
  // mirror: the fields it names are where channel.cc put them.
  void CheckMirror() {
    FUZZ_CHECK(view()->capacity == kCapacity && view()->version == 1,
               "WorkerView does not mirror ControlChannel::Header");
    StatusOr<ControlChannel> worker =
        ControlChannel::Open(dup(channel_->segment_fd()));
    FUZZ_CHECK(worker.ok(), "%s", worker.status().ToString().c_str());
    const std::vector<std::byte> sent(20, std::byte{7});
    std::vector<std::byte> answer;
    std::thread caller([&] {
      const Status called = worker->Call(sent, &answer, [] { return true; });
      FUZZ_CHECK(called.ok(), "%s", called.ToString().c_str());
    });
    std::vector<std::byte> request;
    const std::atomic<bool> stop{false};
    FUZZ_CHECK(channel_->Receive(&request, stop), "no request");
    FUZZ_CHECK(request == sent && view()->request_seq.load() == 1 &&
                   view()->request_len == sent.size(),
               "WorkerView's request words are not channel.cc's");
    last_seq_ = 1;
    const std::vector<std::byte> reply(3, std::byte{9});
    FUZZ_CHECK(channel_->Respond(reply).ok(), "respond");
    caller.join();
    FUZZ_CHECK(answer == reply && view()->response_seq.load() == 1 &&
                   view()->response_len == reply.size(),
               "WorkerView's response words are not channel.cc's");
  }

  std::unique_ptr<ControlChannel> channel_;
  std::unique_ptr<ShmSegment> worker_mapping_;
  uint32_t last_seq_ = 0;  // What tierkvd's Receive saw last.
};

// The listener's frame splitting (Server::Impl::ReadFrom) over a stream
// that arrives `read` bytes at a time.
void RunSocket(std::span<const std::byte> stream, size_t read) {
  std::vector<std::byte> input;
  while (!stream.empty()) {
    const size_t n = std::min(read, stream.size());
    input.insert(input.end(), stream.begin(), stream.begin() + n);
    stream = stream.subspan(n);
    while (input.size() >= kFrameHeaderBytes) {
      StatusOr<uint32_t> len = PeekPayloadLength(input, kMaxSocketPayload);
      if (!len.ok()) return;  // Refused; the peer is disconnected.
      FUZZ_CHECK(*len <= kMaxSocketPayload, "a payload of %u bytes", *len);
      const size_t frame = kFrameHeaderBytes + *len;
      if (input.size() < frame) break;
      StatusOr<Message> message =
          Decode(std::span<const std::byte>(input).first(frame));
      input.erase(input.begin(), input.begin() + static_cast<long>(frame));
      if (!message.ok()) return;  // Refused; the peer is disconnected.
    }
    FUZZ_CHECK(input.size() < kFrameHeaderBytes + kMaxSocketPayload,
               "%zu bytes wait for the rest of a frame", input.size());
  }
}

}  // namespace
}  // namespace tierkv::ipc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto input = std::span(reinterpret_cast<const std::byte*>(data), size);
  if ((data[0] & 1) != 0) {
    static auto* channel = new tierkv::ipc::ChannelHarness();
    channel->Run(input.subspan(1));
  } else {
    tierkv::ipc::RunSocket(input.subspan(1),
                           static_cast<size_t>(data[0] >> 1) + 1);
  }
  return 0;
}
