// Decode (ipc/protocol.h) of arbitrary bytes, as tierkvd decodes what a
// worker or any local user sends: never a crash, and a frame that decodes
// is a message Encode writes back. Checked: decoding is deterministic,
// PeekPayloadLength agrees with Decode about the frame, and
// Encode(Decode(frame)) decodes again to a message of the same type and
// status that encodes to the very same bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ipc/protocol.h"

namespace tierkv::ipc {
namespace {

void Run(std::span<const std::byte> frame) {
  StatusOr<Message> message = Decode(frame);
  StatusOr<uint32_t> announced = PeekPayloadLength(frame, UINT32_MAX);
  if (!message.ok()) {
    FUZZ_CHECK(!Decode(frame).ok(), "decoding the same bytes twice differs");
    return;
  }
  FUZZ_CHECK(announced.ok(), "Decode accepted a frame whose header fails: %s",
             announced.status().ToString().c_str());
  FUZZ_CHECK(kFrameHeaderBytes + *announced == frame.size(),
             "Decode accepted %zu bytes for a payload of %u", frame.size(),
             *announced);

  // Decode accepts a few encodings Encode never writes (bytes it ignores:
  // the header's reserved word, a value behind a cleared presence flag, the
  // text of an OK status), so a frame need not re-encode to itself; what
  // Encode writes is a fixed point.
  const std::vector<std::byte> encoded = Encode(*message);
  StatusOr<Message> again = Decode(encoded);
  FUZZ_CHECK(again.ok(), "re-encoded %s does not decode: %s",
             MessageTypeName(TypeOf(*message)),
             again.status().ToString().c_str());
  FUZZ_CHECK(again->index() == message->index(), "message type changed");
  FUZZ_CHECK(Encode(*again) == encoded, "%s does not round-trip",
             MessageTypeName(TypeOf(*message)));
  FUZZ_CHECK(StatusOf(*again).ToString() == StatusOf(*message).ToString(),
             "an error reply's status changed: %s",
             StatusOf(*again).ToString().c_str());
}

}  // namespace
}  // namespace tierkv::ipc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tierkv::ipc::Run(std::span(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
