#include "ipc/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include "ipc/channel.h"
#include "ipc/protocol.h"
#include "ipc/service.h"
#include "ipc/socket_call.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"
#include "tiers/slot_disk.h"

namespace tierkv {
namespace {

using ipc::Message;

uint64_t TagOf(const EventRef& ref) {
  return (ref.id << 1) | (ref.kind == EventKind::kLoad ? 1 : 0);
}

// Reads exactly one frame from a blocking socket.
StatusOr<Message> ReadFrame(int fd) {
  std::vector<std::byte> frame(ipc::kFrameHeaderBytes);
  auto read_all = [fd](std::byte* p, size_t n) -> Status {
    while (n > 0) {
      const ssize_t got = recv(fd, p, n, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return Status::Unavailable(got == 0 ? "tierkvd closed the connection"
                                            : std::string("recv: ") +
                                                  std::strerror(errno));
      }
      p += got;
      n -= static_cast<size_t>(got);
    }
    return Status::Ok();
  };
  TIERKV_RETURN_IF_ERROR(read_all(frame.data(), frame.size()));
  TIERKV_ASSIGN_OR_RETURN(uint32_t len, ipc::PeekPayloadLength(frame, 1 << 20));
  frame.resize(ipc::kFrameHeaderBytes + len);
  TIERKV_RETURN_IF_ERROR(read_all(frame.data() + ipc::kFrameHeaderBytes, len));
  return ipc::Decode(frame);
}

StatusOr<int> Connect(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path too long: " + path);
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    const std::string msg = "no tierkvd answers on " + path + ": " +
                            std::strerror(err) + " (is tierkvd running?)";
    return err == EACCES ? Status::PermissionDenied(msg)
                         : Status::Unavailable(msg);
  }
  timeval tv{.tv_sec = 10, .tv_usec = 0};  // A daemon that never answers.
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

}  // namespace

namespace ipc {

StatusOr<Message> SocketCall(const std::string& socket_path,
                             const Message& request) {
  TIERKV_ASSIGN_OR_RETURN(int fd, Connect(socket_path));
  const std::vector<std::byte> bytes = Encode(request);
  const bool sent = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(bytes.size());
  StatusOr<Message> reply =
      sent ? ReadFrame(fd) : Status::Unavailable("send to tierkvd failed");
  close(fd);
  return reply;
}

}  // namespace ipc

struct Client::Impl {
  ClientOptions options;
  WorkerId worker = 0;
  std::unique_ptr<DeviceTier> owned_device;
  DeviceTier* device = nullptr;
  std::unique_ptr<HostTier> host;
  // Attached mode.
  int socket_fd = -1;
  std::optional<ipc::ControlChannel> channel;
  std::vector<std::byte> request_bytes, response_bytes;
  Status channel_error;  // Set once tierkvd is gone; every call fails.
  // Embedded mode. The disk tier is destroyed (waiting for its I/O into
  // host slots) before the host tier.
  std::unique_ptr<DiskTier> disk;
  std::unique_ptr<SlotDisk> slot_disk;
  std::optional<Coordinator> coordinator;
  std::map<uint64_t, TransferEvent> in_flight;      // By copy-job tag.
  std::map<uint64_t, TransferEvent> pending_loads;  // By load id.

  ~Impl() {
    if (device != nullptr) {
      while (device->in_flight() > 0) {
        device->WaitCompleted(std::chrono::milliseconds(100));
      }
    }
    if (socket_fd >= 0) close(socket_fd);
  }

  bool PeerAlive() const {
    pollfd p{socket_fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return true;
    if (p.revents & (POLLHUP | POLLERR)) return false;
    char c;
    return recv(socket_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
  }

  StatusOr<Message> Call(const Message& request) {
    if (coordinator.has_value()) {
      // No tier thread in embedded mode: each call applies what the disk
      // tier has finished (tierkvd's tier thread does this for workers).
      coordinator->PumpLowerTier();
      return ipc::Dispatch(*coordinator, worker, request);
    }
    if (!channel_error.ok()) return channel_error;
    request_bytes.clear();
    ipc::Encode(request, &request_bytes);
    Status s = channel->Call(request_bytes, &response_bytes,
                             [this] { return PeerAlive(); });
    if (s.code() == StatusCode::kUnavailable) {
      // A late reply could be taken for the next call's: stay failed.
      channel_error = s;
    }
    TIERKV_RETURN_IF_ERROR(s);
    return ipc::Decode(response_bytes);
  }

  // The reply of type T, or the error the coordinator sent.
  template <typename T>
  StatusOr<T> CallFor(const Message& request) {
    TIERKV_ASSIGN_OR_RETURN(Message reply, Call(request));
    if (auto* r = std::get_if<T>(&reply)) return std::move(*r);
    Status s = ipc::StatusOf(reply);
    if (!s.ok()) return s;
    return Status::DataLoss(std::string("unexpected reply ") +
                            ipc::MessageTypeName(ipc::TypeOf(reply)));
  }

  Status Submit(const TransferEvent& event) {
    CopyJob job{.tag = TagOf(event.ref),
                .direction = event.ref.kind == EventKind::kLoad
                                 ? CopyDirection::kHostToDevice
                                 : CopyDirection::kDeviceToHost,
                .device_blocks = event.device_blocks,
                .host_blocks = {}};
    for (BlockId slot : event.host_blocks) {
      if (slot <= 0 || slot >= host->num_slots()) {
        return Status::DataLoss("event names host slot " +
                                std::to_string(slot));
      }
      job.host_blocks.push_back(host->slot(slot));
    }
    if (options.engine != nullptr)
      options.engine->PinBlocks(event.device_blocks);
    Status s = device->Submit(std::move(job));
    if (!s.ok()) {
      if (options.engine != nullptr) {
        options.engine->UnpinBlocks(event.device_blocks);
      }
      return s;
    }
    in_flight.emplace(TagOf(event.ref), event);
    return Status::Ok();
  }

  // Starts the copies of pending loads that tierkvd reports ready.
  void StartReadyLoads() {
    if (pending_loads.empty()) return;
    StatusOr<ipc::ReadyLoadsReply> ready =
        CallFor<ipc::ReadyLoadsReply>(ipc::ReadyLoadsRequest{});
    if (!ready.ok()) return;  // Retried on the next poll.
    for (const TransferEvent& load : ready->loads) {
      pending_loads.erase(load.ref.id);
      if (!Submit(load).ok()) {
        std::vector<CompletedEvent> failed{{load.ref, false}};
        (void)Call(ipc::CompleteRequest{failed});
      }
    }
  }

  std::vector<FinishedTransfer> Collect(std::vector<CopyCompletion> done) {
    std::vector<FinishedTransfer> out;
    for (CopyCompletion& c : done) {
      auto it = in_flight.find(c.tag);
      if (it == in_flight.end()) continue;
      out.push_back({std::move(it->second), std::move(c.status)});
      in_flight.erase(it);
    }
    return out;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Open(const ClientOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.num_device_blocks < 1) {
    return Status::InvalidArgument("num_device_blocks must be at least 1");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->device = options.device;
  if (impl->device == nullptr) {
    TIERKV_ASSIGN_OR_RETURN(
        impl->owned_device,
        EmulatedDeviceTier::Create(options.num_device_blocks,
                                   options.layout.BlockBytes()));
    impl->device = impl->owned_device.get();
  }
  if (impl->device->block_bytes() != options.layout.BlockBytes()) {
    return Status::InvalidArgument("device tier blocks are not layout-sized");
  }
  const WorkerRegistration registration{
      .layout = options.layout,
      .model = options.model,
      .num_device_blocks = options.num_device_blocks,
      .tenant = options.tenant,
      .pid = static_cast<int32_t>(getpid()),
      .name = options.name};

  const std::string fingerprint =
      StoreFingerprint(options.layout, options.model);
  if (options.socket_path.empty()) {
    const int32_t slots = HostTier::SlotsFor(options.embedded_host_bytes,
                                             options.layout.BlockBytes());
    HostTierOptions host;
    host.num_slots = slots;
    host.slot_bytes = options.layout.BlockBytes();
    host.layout_fingerprint = fingerprint;
    TIERKV_ASSIGN_OR_RETURN(impl->host, HostTier::Create(host));
    CoordinatorOptions coordinator_options{
        .layout = options.layout, .model = options.model, .host_slots = slots};
    if (!options.embedded_disk_path.empty()) {
      TIERKV_ASSIGN_OR_RETURN(
          impl->disk,
          DiskTier::Open({.storage = {.path = options.embedded_disk_path},
                          .capacity_bytes = options.embedded_disk_bytes,
                          .layout_fingerprint = fingerprint,
                          .block_bytes = options.layout.BlockBytes(),
                          .element_bytes = static_cast<int32_t>(
                              options.layout.ElementSize())}));
      impl->slot_disk =
          std::make_unique<SlotDisk>(impl->disk.get(), impl->host.get());
      coordinator_options.lower = impl->slot_disk.get();
    }
    TIERKV_ASSIGN_OR_RETURN(Coordinator coordinator,
                            Coordinator::Create(coordinator_options));
    impl->coordinator.emplace(std::move(coordinator));
    TIERKV_ASSIGN_OR_RETURN(impl->worker,
                            impl->coordinator->RegisterWorker(registration));
    return std::unique_ptr<Client>(new Client(std::move(impl)));
  }

  TIERKV_ASSIGN_OR_RETURN(impl->socket_fd, Connect(options.socket_path));
  const std::vector<std::byte> hello =
      ipc::Encode(ipc::RegisterRequest{registration});
  if (send(impl->socket_fd, hello.data(), hello.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(hello.size())) {
    return Status::Unavailable("cannot register with tierkvd on " +
                               options.socket_path);
  }
  TIERKV_ASSIGN_OR_RETURN(Message reply, ReadFrame(impl->socket_fd));
  TIERKV_RETURN_IF_ERROR(ipc::StatusOf(reply));
  const auto* reg = std::get_if<ipc::RegisterReply>(&reply);
  if (reg == nullptr) {
    return Status::DataLoss(
        "tierkvd answered registration with " +
        std::string(ipc::MessageTypeName(ipc::TypeOf(reply))));
  }
  impl->worker = reg->worker_id;
  TIERKV_ASSIGN_OR_RETURN(
      impl->host,
      HostTier::Attach(reg->host_segment, fingerprint,
                       options.layout.BlockBytes(), reg->host_slots));
  TIERKV_ASSIGN_OR_RETURN(ipc::ControlChannel channel,
                          ipc::ControlChannel::Open(reg->control_segment));
  impl->channel.emplace(std::move(channel));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

StatusOr<LookupResult> Client::Lookup(RequestId request,
                                      std::span<const TokenId> tokens,
                                      int32_t num_computed_tokens,
                                      const RequestExtras& extras) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::LookupReply reply,
      impl_->CallFor<ipc::LookupReply>(ipc::LookupRequest{
          .request = request,
          .num_computed_tokens = num_computed_tokens,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .extras = extras}));
  return reply.result;
}

StatusOr<LookupResult> Client::LookupChunk(RequestId request,
                                           std::span<const TokenId> tokens) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::LookupReply reply,
      impl_->CallFor<ipc::LookupReply>(ipc::LookupChunkRequest{
          .request = request,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end())}));
  return reply.result;
}

StatusOr<AllocateResult> Client::Allocate(
    RequestId request, std::span<const BlockId> device_blocks,
    int32_t num_external_tokens) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::AllocateReply reply,
      impl_->CallFor<ipc::AllocateReply>(ipc::AllocateRequest{
          .request = request,
          .num_external_tokens = num_external_tokens,
          .device_blocks = std::vector<BlockId>(device_blocks.begin(),
                                                device_blocks.end())}));
  if (reply.result.load_pending) {
    impl_->pending_loads.emplace(reply.result.load->ref.id, *reply.result.load);
  } else if (reply.result.load.has_value()) {
    Status s = impl_->Submit(*reply.result.load);
    if (!s.ok()) {
      // Release the coordinator's pins: the copy never started.
      std::vector<CompletedEvent> failed{{reply.result.load->ref, false}};
      (void)impl_->Call(ipc::CompleteRequest{failed});
      return s;
    }
  }
  return reply.result;
}

StatusOr<CommitResult> Client::Commit(RequestId request,
                                      int32_t num_computed_tokens,
                                      std::span<const BlockId> device_blocks) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::CommitReply reply,
      impl_->CallFor<ipc::CommitReply>(
          ipc::CommitRequest{.request = request,
                             .num_computed_tokens = num_computed_tokens,
                             .device_blocks = std::vector<BlockId>(
                                 device_blocks.begin(), device_blocks.end())}));
  for (const TransferEvent& store : reply.result.stores) {
    Status s = impl_->Submit(store);
    if (!s.ok()) {
      std::vector<CompletedEvent> failed{{store.ref, false}};
      (void)impl_->Call(ipc::CompleteRequest{failed});
      return s;
    }
  }
  return reply.result;
}

std::vector<FinishedTransfer> Client::PollEvents() {
  impl_->StartReadyLoads();
  return impl_->Collect(impl_->device->PollCompleted());
}

std::vector<FinishedTransfer> Client::WaitEvents(
    std::chrono::milliseconds timeout) {
  // While loads wait for promotions, ask for them every millisecond (a
  // control-channel round trip is tens of microseconds).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    impl_->StartReadyLoads();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto wait = impl_->pending_loads.empty()
                          ? left
                          : std::min(left, std::chrono::milliseconds(1));
    std::vector<FinishedTransfer> done =
        impl_->Collect(impl_->device->WaitCompleted(std::max(wait, {})));
    if (!done.empty() || std::chrono::steady_clock::now() >= deadline) {
      return done;
    }
  }
}

Status Client::Complete(std::span<const FinishedTransfer> finished) {
  ipc::CompleteRequest request;
  for (const FinishedTransfer& f : finished) {
    request.events.push_back({f.event.ref, f.status.ok()});
  }
  StatusOr<Message> reply = impl_->Call(request);
  // The copies are over whatever tierkvd answers: the device blocks are
  // free to use again.
  if (impl_->options.engine != nullptr) {
    for (const FinishedTransfer& f : finished) {
      impl_->options.engine->UnpinBlocks(f.event.device_blocks);
    }
  }
  if (!reply.ok()) return reply.status();
  return ipc::StatusOf(*reply);
}

Status Client::Finish(RequestId request) {
  TIERKV_ASSIGN_OR_RETURN(Message reply,
                          impl_->Call(ipc::FinishRequest{request}));
  return ipc::StatusOf(reply);
}

StatusOr<CoordinatorStats> Client::Stats() {
  TIERKV_ASSIGN_OR_RETURN(ipc::StatsReply reply,
                          impl_->CallFor<ipc::StatsReply>(ipc::StatsRequest{}));
  return reply.stats;
}

WorkerId Client::worker_id() const { return impl_->worker; }
bool Client::embedded() const { return impl_->coordinator.has_value(); }
const KvLayout& Client::layout() const { return impl_->options.layout; }
DeviceTier& Client::device() { return *impl_->device; }
const std::byte* Client::host_slot(BlockId slot) const {
  return impl_->host->slot(slot);
}
size_t Client::transfers_in_flight() const { return impl_->in_flight.size(); }
size_t Client::loads_pending() const { return impl_->pending_loads.size(); }

}  // namespace tierkv
