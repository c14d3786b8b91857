#include "tierkv/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>

#include "ipc/channel.h"
#include "ipc/in_process_store.h"
#include "ipc/protocol.h"
#include "ipc/socket_call.h"
#include "ipc/unix_socket.h"
#include "tiers/host_tier.h"

namespace tierkv {
namespace ipc {
namespace {

// Drains a signal descriptor (an eventfd, or the read end of tierkvd's
// readiness pipe; non-blocking): whether it had been written since.
// Without one (-1) there is nothing to wait for: true.
bool TakeSignal(int fd) {
  if (fd < 0) return true;
  bool signalled = false;
  std::byte buf[64];
  while (read(fd, buf, sizeof(buf)) > 0) signalled = true;
  return signalled;
}

// Waits until `fd` is ready for `events`: DeadlineExceeded (naming `what`
// tierkvd did not do) once `deadline` passes first.
Status WaitReady(int fd, short events, Clock::time_point deadline,
                 const char* what) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Status::DeadlineExceeded(
          std::string("tierkvd did not ") + what +
          " in time (is it stopped, wedged or overloaded?)");
    }
    pollfd p{fd, events, 0};
    const int n = poll(
        &p, 1,
        static_cast<int>(std::min<int64_t>(left.count(), int64_t{60'000})));
    if (n > 0) return Status::Ok();
    if (n < 0 && errno != EINTR) {
      return Status::Unavailable(std::string("poll: ") + std::strerror(errno));
    }
  }
}

}  // namespace

StatusOr<Message> ReadFrame(int fd, Clock::time_point deadline,
                            std::vector<UniqueFd>* fds, size_t max_fds) {
  std::vector<std::byte> frame(kFrameHeaderBytes);
  auto read_all = [&](std::byte* p, size_t n) -> Status {
    while (n > 0) {
      const ssize_t got = RecvWithFds(fd, p, n, fds, max_fds);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        TIERKV_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, "answer"));
        continue;
      }
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

Status SendAll(int fd, std::span<const std::byte> bytes,
               Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TIERKV_RETURN_IF_ERROR(
          WaitReady(fd, POLLOUT, deadline, "take the request"));
      continue;
    }
    if (n <= 0) {
      return Status::Unavailable(std::string("send to tierkvd: ") +
                                 std::strerror(errno));
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return Status::Ok();
}

StatusOr<int> Connect(const std::string& path, Clock::time_point deadline,
                      std::optional<uid_t> daemon_uid) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("socket path too long: " + path);
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Unavailable(std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  // A Unix socket's connect waits while the listen queue is full (a
  // non-blocking one fails at once, with nothing to poll for): the send
  // timeout bounds that wait. Zero would mean no bound: at least 1 us.
  const auto timeout = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::microseconds>(deadline -
                                                               Clock::now())
             .count());
  timeval tv{.tv_sec = timeout / 1'000'000, .tv_usec = timeout % 1'000'000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  if (rc != 0) {
    close(fd);
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
      return Status::DeadlineExceeded(
          "tierkvd on " + path + " did not accept the connection within " +
          std::to_string(timeout / 1000) +
          " ms: its listen queue is full (is it overloaded or wedged?)");
    }
    const std::string msg = "no tierkvd answers on " + path + ": " +
                            std::strerror(err) + " (is tierkvd running?)";
    return err == EACCES ? Status::PermissionDenied(msg)
                         : Status::Unavailable(msg);
  }
  StatusOr<PeerIdentity> peer = PeerOf(fd);
  Status trusted =
      peer.ok() ? CheckDaemonUser(peer->uid, path, daemon_uid) : peer.status();
  if (!trusted.ok()) {
    close(fd);
    return trusted;
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    const std::string msg = std::string("fcntl: ") + std::strerror(errno);
    close(fd);
    return Status::Unavailable(msg);
  }
  return fd;
}

StatusOr<Message> SocketCall(const std::string& socket_path,
                             const Message& request,
                             std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  TIERKV_ASSIGN_OR_RETURN(int fd, Connect(socket_path, deadline));
  Status sent = SendAll(fd, Encode(request), deadline);
  StatusOr<Message> reply = sent.ok() ? ReadFrame(fd, deadline) : sent;
  close(fd);
  return reply;
}

}  // namespace ipc

using ipc::Clock;
using ipc::Message;

struct Client::Impl {
  // A copy running on the device tier.
  struct Copy {
    TransferEvent event;
    uint64_t session = 0;
  };

  ClientOptions options;
  WorkerId worker = 0;
  std::unique_ptr<DeviceTier> owned_device;
  DeviceTier* device = nullptr;
  // The host slots copies read and write: the attached tierkvd's mapping
  // (attached_host) or the in-process store's.
  const HostTier* host = nullptr;
  std::unique_ptr<HostTier> attached_host;
  // Attached mode.
  int socket_fd = -1;
  std::optional<ipc::ControlChannel> channel;
  std::vector<std::byte> request_bytes, response_bytes;
  Status channel_error;  // Set once the attachment is lost.
  // A request was posted (Post): its reply is collected before the next
  // request goes. What it was, to name it should it fail.
  bool reply_owed = false;
  ipc::MessageType posted = ipc::MessageType::kOk;
  ClientCallCounts counts;
  Status last_post_error;  // Client::last_post_error.
  uint64_t session = 1;
  // Embedded mode: the store in this process. ~Impl waits for the copies
  // into its slots before it goes.
  std::unique_ptr<ipc::InProcessStore> in_process;
  // Copies on the device tier, by their client-wide tag (event ids start
  // again at 0 in every attachment).
  std::map<uint64_t, Copy> in_flight;
  uint64_t next_tag = 1;
  // A copy went in with SubmitForWaiter and no wait has run it yet
  // (KickOwedCopies).
  bool kick_owed = false;
  // Loads waiting for promotions, by load id, as Allocate returned them:
  // their device blocks are pinned.
  std::map<uint64_t, TransferEvent> pending_loads;
  // Attached mode: the tokens the last Lookup of each open request sent
  // and the tag tierkvd named them with, so that the next Lookup of the
  // request sends only what changed (ipc::LookupRequest::kept_tokens). At
  // most kMaxSentLookups requests and kMaxSentTokens tokens in all;
  // forgotten with the request (Finish) or the attachment.
  struct SentLookup {
    std::vector<TokenId> tokens;
    uint64_t tag = 0;
  };
  static constexpr size_t kMaxSentLookups = 4096;
  static constexpr size_t kMaxSentTokens = size_t{1} << 24;  // 64 MiB.
  std::unordered_map<RequestId, SentLookup> sent_lookups;
  size_t sent_tokens = 0;  // Of every sent_lookups entry.
  // copies = caller: this attachment's events handed to the engine and not
  // completed yet, by kind and id. The engine's copies read and write their
  // host slots, which tierkvd keeps pinned for this worker until told the
  // copies ended or the socket closes: a lost attachment keeps its socket
  // open until every one of them is completed (CloseIfCopiesEnded).
  std::set<std::pair<EventKind, uint64_t>> engine_copies;
  // copies = client: the transfers PollEvents and WaitEvents handed to the
  // engine and not completed yet, by session, kind and id. Complete
  // unpins and reports each of them once: a second completion of one
  // would unpin device blocks a request still holds.
  // Their device blocks, still pinned in the engine, are unpinned by
  // ~Client for those never completed.
  std::map<std::tuple<uint64_t, EventKind, uint64_t>, std::vector<BlockId>>
      owed;
  // Finished transfers not handed out yet: loads lost with tierkvd, loads
  // whose copy could not start, and copies that finished while a lost
  // attachment waited for them.
  std::vector<FinishedTransfer> finished;
  // Readable once loads that wait for promotions are ready: the read end of
  // tierkvd's readiness pipe for this attachment (or the embedded store's
  // eventfd). WaitEvents
  // sleeps on it instead of asking tierkvd.
  ipc::UniqueFd ready_fd;
  // While loads are pending, tierkvd is asked for ready ones at this time
  // even without a signal: a wedged tierkvd is then found within the
  // call's deadline, as any call finds it.
  Clock::time_point ready_check_due = Clock::time_point::max();
  // Written by the device tier's copy thread on each completion
  // (DeviceTier::SetCompletionNotify), so WaitEvents sleeps on both at
  // once. Not valid when the device tier cannot notify.
  ipc::UniqueFd copies_fd;

  ~Impl() {
    // A posted completion is applied before the socket closes (a worker
    // that publishes and exits leaves its chunk stored).
    if (reply_owed && channel_error.ok()) (void)CollectPosted();
    // Every copy ends in `finished`, whose blocks are unpinned below.
    WaitForCopies();
    if (copies_fd.valid()) device->SetCompletionNotify(nullptr);
    for (const auto& [id, load] : pending_loads) Unpin(load.device_blocks);
    for (const FinishedTransfer& f : finished) Unpin(f.event.device_blocks);
    for (const auto& [ref, blocks] : owed) Unpin(blocks);
    if (socket_fd >= 0) close(socket_fd);
  }

  void Pin(std::span<const BlockId> blocks) {
    if (options.engine != nullptr) options.engine->PinBlocks(blocks);
  }
  void Unpin(std::span<const BlockId> blocks) {
    if (options.engine != nullptr) options.engine->UnpinBlocks(blocks);
  }

  bool PeerAlive() const {
    pollfd p{socket_fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return true;
    if (p.revents & (POLLHUP | POLLERR)) return false;
    char c;
    return recv(socket_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
  }

  // Registers with tierkvd over a new connection: a new worker id, host
  // mapping and control channel.
  Status Attach(const WorkerRegistration& registration,
                const std::string& fingerprint) {
    const std::string& path = options.socket_path;
    const Clock::time_point deadline = Clock::now() + options.call_timeout;
    TIERKV_ASSIGN_OR_RETURN(const int fd,
                            ipc::Connect(path, deadline, options.daemon_uid));
    if (socket_fd >= 0) close(socket_fd);
    socket_fd = fd;
    Status sent = ipc::SendAll(
        socket_fd, ipc::Encode(ipc::RegisterRequest{registration}), deadline);
    std::vector<ipc::UniqueFd> segments;
    StatusOr<Message> reply =
        sent.ok() ? ipc::ReadFrame(socket_fd, deadline, &segments,
                                   ipc::kRegisterReplyFds)
                  : sent;
    if (!reply.ok()) {
      return Status(reply.status().code(), "registering with tierkvd on " +
                                               path + ": " +
                                               reply.status().message());
    }
    TIERKV_RETURN_IF_ERROR(ipc::StatusOf(*reply));
    const auto* reg = std::get_if<ipc::RegisterReply>(&*reply);
    if (reg == nullptr) {
      return Status::DataLoss(
          "tierkvd answered registration with " +
          std::string(ipc::MessageTypeName(ipc::TypeOf(*reply))));
    }
    if (segments.size() != ipc::kRegisterReplyFds) {
      return Status::DataLoss("tierkvd on " + path + " passed " +
                              std::to_string(segments.size()) +
                              " segments with its registration reply, not " +
                              std::to_string(ipc::kRegisterReplyFds));
    }
    TIERKV_ASSIGN_OR_RETURN(
        std::unique_ptr<HostTier> mapped,
        HostTier::Attach(segments[0].release(), fingerprint,
                         options.layout.BlockBytes(), reg->host_slots));
    TIERKV_ASSIGN_OR_RETURN(ipc::ControlChannel attached_channel,
                            ipc::ControlChannel::Open(segments[1].release()));
    ready_fd = std::move(segments[2]);
    // Reads must not block; the flag is this worker's business alone.
    (void)fcntl(ready_fd.get(), F_SETFL,
                fcntl(ready_fd.get(), F_GETFL) | O_NONBLOCK);
    worker = reg->worker_id;
    attached_host = std::move(mapped);
    host = attached_host.get();
    channel.emplace(std::move(attached_channel));
    channel_error = Status::Ok();
    reply_owed = false;
    return Status::Ok();
  }

  // The attachment is gone (tierkvd died, or missed a deadline and may
  // answer late): every later call fails until Reconnect, and loads that
  // wait for promotions fail now. Their device blocks stay pinned until the
  // engine completes them.
  void LoseAttachment(const Status& why) {
    if (!channel_error.ok()) return;
    channel_error =
        Status::Unavailable("lost tierkvd on " + options.socket_path + " (" +
                            why.ToString() + "); Reconnect to attach again");
    for (auto& [id, load] : pending_loads) {
      finished.push_back({.event = std::move(load),
                          .status = channel_error,
                          .session = session});
    }
    pending_loads.clear();
    ForgetAllLookups();  // The next tierkvd keeps none of them.
    // A tierkvd that is only slow keeps this worker's host pins until the
    // socket closes. Copies still read or write those host slots: let them
    // finish, then close it, so tierkvd releases the pins at once.
    WaitForCopies();
    channel.reset();
    reply_owed = false;
    // The engine's own copies (copies = caller) cannot be waited for here:
    // the socket closes once it has completed them.
    CloseIfCopiesEnded();
  }

  // Lost, and no copy of the engine's still uses the attachment's slots:
  // the socket closes, and tierkvd releases the pins.
  void CloseIfCopiesEnded() {
    if (channel_error.ok() || !engine_copies.empty() || socket_fd < 0) return;
    close(socket_fd);
    socket_fd = -1;
  }

  // copies = caller: `events` go to the engine to copy.
  void HandOut(std::span<const TransferEvent> events) {
    if (options.copies != CopyMode::kCaller) return;
    for (const TransferEvent& e : events) {
      engine_copies.emplace(e.ref.kind, e.ref.id);
    }
  }

  // Waits for every copy in flight; their completions wait in `finished`.
  void WaitForCopies() {
    if (device == nullptr) return;  // The engine copies (kCaller, kRanks).
    KickOwedCopies();
    while (device->in_flight() > 0) {
      Collect(device->WaitCompleted(std::chrono::milliseconds(100)), &finished);
    }
    Collect(device->PollCompleted(), &finished);
  }

  // A channel wait that fails loses the attachment: a late reply could be
  // taken for the next call's.
  Status CheckChannel(Status s) {
    if (s.code() == StatusCode::kUnavailable ||
        s.code() == StatusCode::kDeadlineExceeded) {
      // Which tierkvd, and how long it was given: the first failure is the
      // one an operator reads.
      s = Status(s.code(), s.message() + " (tierkvd on " + options.socket_path +
                               ", call_timeout " +
                               std::to_string(options.call_timeout.count()) +
                               " ms)");
      LoseAttachment(s);
    }
    return s;
  }

  // Collects the reply a posted request is owed. Its error is counted and
  // returned, so that it is never lost: the call that collects it fails
  // with it, unsent.
  Status CollectPosted() {
    if (!reply_owed) return Status::Ok();
    reply_owed = false;
    TIERKV_RETURN_IF_ERROR(CheckChannel(channel->AwaitResponse(
        &response_bytes, [this] { return PeerAlive(); },
        std::chrono::steady_clock::now() + options.call_timeout)));
    StatusOr<Message> reply = ipc::Decode(response_bytes);
    Status s = reply.ok() ? ipc::StatusOf(*reply) : reply.status();
    if (s.ok()) return s;
    if (reply.ok()) CheckEnded(s);
    // Ended by that reply: the call that collects it cannot be sent.
    if (!channel_error.ok()) return channel_error;
    // Counted and kept, never returned by the call that collects it: that
    // call still goes, since it may complete or finish what would
    // otherwise stay pinned in tierkvd.
    ++counts.post_errors;
    last_post_error = Status(s.code(), std::string("the one-way ") +
                                           ipc::MessageTypeName(posted) +
                                           " failed: " + s.message());
    return Status::Ok();
  }

  StatusOr<Message> Call(const Message& request) {
    if (in_process != nullptr) {
      ++counts.calls;
      KickOwedCopies();  // The caller went on without waiting for them.
      return in_process->Call(worker, request);
    }
    request_bytes.clear();
    ipc::Encode(request, &request_bytes);
    return CallEncoded();
  }

  // Records that tierkvd keeps `tokens` for `request` under `tag` (0: it
  // keeps none to build on), the first `kept` of them already recorded.
  void RememberLookup(RequestId request, std::span<const TokenId> tokens,
                      size_t kept, uint64_t tag) {
    auto it = sent_lookups.find(request);
    const size_t before =
        it == sent_lookups.end() ? 0 : it->second.tokens.size();
    if (tag == 0 || sent_tokens - before + tokens.size() > kMaxSentTokens) {
      ForgetLookup(request);
      return;
    }
    if (it == sent_lookups.end()) {
      if (sent_lookups.size() >= kMaxSentLookups) return;
      it = sent_lookups.try_emplace(request).first;
    }
    std::vector<TokenId>& sent = it->second.tokens;
    sent.resize(kept);
    sent.insert(sent.end(), tokens.begin() + static_cast<std::ptrdiff_t>(kept),
                tokens.end());
    sent_tokens = sent_tokens - before + sent.size();
    it->second.tag = tag;
  }
  void ForgetLookup(RequestId request) {
    const auto it = sent_lookups.find(request);
    if (it == sent_lookups.end()) return;
    sent_tokens -= it->second.tokens.size();
    sent_lookups.erase(it);
  }
  void ForgetAllLookups() {
    sent_lookups.clear();
    sent_tokens = 0;
  }

  // What finishing `request` ends on this side: its lookup, its loads still
  // waiting for promotions (tierkvd's Finish cancels them) and its lost
  // loads not handed out yet, their device blocks unpinned. Returns the
  // failed completions tierkvd is owed for the lost loads whose copy never
  // started (it holds their slots until told). Calls nothing, so nothing it
  // walks changes under it.
  std::vector<CompletedEvent> ForgetRequest(RequestId request) {
    ForgetLookup(request);
    for (auto it = pending_loads.begin(); it != pending_loads.end();) {
      if (it->second.request != request) {
        ++it;
        continue;
      }
      Unpin(it->second.device_blocks);
      it = pending_loads.erase(it);
    }
    std::vector<CompletedEvent> never_started;
    std::erase_if(finished, [&](const FinishedTransfer& f) {
      if (f.event.request != request || f.event.ref.kind != EventKind::kLoad ||
          f.status.ok()) {
        return false;
      }
      Unpin(f.event.device_blocks);
      if (f.session == session) never_started.push_back({f.event.ref, false});
      return true;
    });
    return never_started;
  }

  // Sends request_bytes, an encoded request, over the channel (attached)
  // and waits for its reply.
  StatusOr<Message> CallEncoded() {
    ++counts.calls;
    KickOwedCopies();  // The caller went on without waiting for them.
    if (!channel_error.ok()) return channel_error;
    TIERKV_RETURN_IF_ERROR(CollectPosted());
    TIERKV_RETURN_IF_ERROR(CheckChannel(channel->Call(
        request_bytes, &response_bytes, [this] { return PeerAlive(); },
        std::chrono::steady_clock::now() + options.call_timeout)));
    StatusOr<Message> reply = ipc::Decode(response_bytes);
    if (reply.ok()) CheckEnded(ipc::StatusOf(*reply));
    return reply;
  }

  // tierkvd answers Unavailable when it ended the attachment (a scheduler
  // with an attachment tag that lost a rank): lost, as if tierkvd had gone.
  void CheckEnded(const Status& s) {
    if (s.code() == StatusCode::kUnavailable) LoseAttachment(s);
  }

  // Sends `request` without waiting for its reply (an OK or an error),
  // which the next Call or Post collects. Embedded, the store answers at
  // once: its error is returned now.
  Status Post(const Message& request) {
    ++counts.posts;
    KickOwedCopies();
    if (in_process != nullptr) {
      Status s = ipc::StatusOf(in_process->Call(worker, request));
      if (!s.ok()) {
        ++counts.post_errors;
        last_post_error = s;
      }
      return s;
    }
    if (!channel_error.ok()) return channel_error;
    TIERKV_RETURN_IF_ERROR(CollectPosted());
    request_bytes.clear();
    ipc::Encode(request, &request_bytes);
    TIERKV_RETURN_IF_ERROR(channel->Post(request_bytes));
    reply_owed = true;
    posted = ipc::TypeOf(request);
    return Status::Ok();
  }

  // The reply of type T, or the error the coordinator sent.
  template <typename T>
  StatusOr<T> CallFor(const Message& request) {
    return ReplyAs<T>(Call(request));
  }
  template <typename T>
  static StatusOr<T> ReplyAs(StatusOr<Message> reply) {
    TIERKV_RETURN_IF_ERROR(reply.status());
    if (auto* r = std::get_if<T>(&*reply)) return std::move(*r);
    Status s = ipc::StatusOf(*reply);
    if (!s.ok()) return s;
    return Status::DataLoss(std::string("unexpected reply ") +
                            ipc::MessageTypeName(ipc::TypeOf(*reply)));
  }

  // Starts the copies of a commit's stores (copies = client), or hands
  // them to the engine (copies = caller).
  Status StartStores(const CommitResult& commit, bool for_waiter = false) {
    HandOut(commit.stores);
    if (options.copies != CopyMode::kClient) return Status::Ok();
    // Each is started or reported failed (PinAndSubmit): one that cannot
    // start must not leave the others' slots waiting for a copy.
    Status first;
    for (const TransferEvent& store : commit.stores) {
      Status s = PinAndSubmit(store, for_waiter);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  // The completions of `finished` tierkvd is owed (events of a lost
  // attachment are not its any more). Unpins each transfer's device blocks:
  // the copies are over whatever tierkvd answers. A transfer not owed
  // (completed already, or never handed out) is skipped and counted in
  // *unknown: unpinned twice, its blocks would pass to another request
  // while one still reads them, and tierkvd would refuse the whole batch.
  std::vector<CompletedEvent> TakeCompletions(
      std::span<const FinishedTransfer> finished, size_t* unknown) {
    std::vector<CompletedEvent> events;
    for (const FinishedTransfer& f : finished) {
      const EventRef& ref = f.event.ref;
      bool known = true;
      std::vector<BlockId> pinned = f.event.device_blocks;
      if (options.copies == CopyMode::kClient) {
        // The blocks pinned for it, whatever the engine's copy of the event
        // now says.
        const auto it = owed.find(std::tuple(f.session, ref.kind, ref.id));
        known = it != owed.end();
        if (known) {
          pinned = std::move(it->second);
          owed.erase(it);
        }
      } else if (options.scheduler == 0) {
        // copies = caller: the events Allocate, Commit and the rest handed
        // out. (A rank client's come from its scheduler: not known here.)
        known =
            f.session == session && engine_copies.erase({ref.kind, ref.id}) > 0;
      }
      if (!known) {
        ++*unknown;
        continue;
      }
      if (f.session == session) events.push_back({ref, f.status.ok()});
      Unpin(pinned);
    }
    CloseIfCopiesEnded();
    return events;
  }

  // Transfers handed to the engine: owed a completion each.
  std::vector<FinishedTransfer> Owe(std::vector<FinishedTransfer> out) {
    if (options.copies != CopyMode::kClient) return out;
    for (const FinishedTransfer& f : out) {
      owed.emplace(std::tuple(f.session, f.event.ref.kind, f.event.ref.id),
                   f.event.device_blocks);
    }
    return out;
  }

  // Whether this attachment copies `ref`.
  bool Copying(const EventRef& ref) const {
    return std::ranges::any_of(in_flight, [&](const auto& entry) {
      return entry.second.event.ref == ref && entry.second.session == session;
    });
  }
  // AlreadyExists when this attachment copies `ref`, or has handed it out
  // finished and not had it completed.
  Status CheckNotStarted(const EventRef& ref) const {
    if (!Copying(ref) &&
        !owed.contains(std::tuple(session, ref.kind, ref.id))) {
      return Status::Ok();
    }
    return Status::AlreadyExists(
        std::string("this client has started ") + EventKindName(ref.kind) +
        " " + std::to_string(ref.id) +
        " already and not completed it: each event is started once");
  }

  // Tells tierkvd that a copy never ran, so it releases the event's slots.
  void ReportFailed(const EventRef& ref) {
    std::vector<CompletedEvent> failed{{ref, false}};
    (void)Call(ipc::CompleteRequest{failed});
  }

  // `events` came in a reply no working tierkvd sends (CheckHandedOut), and
  // none is copied. Attached, the attachment is given up: the socket's
  // close releases all tierkvd holds for it, where reporting the events
  // failed would not (a scheduler with ranks may not complete them).
  // Embedded, there is no socket to close: they are reported failed.
  void RefuseHandedOut(std::span<const TransferEvent> events,
                       const Status& why) {
    if (in_process == nullptr) {
      LoseAttachment(why);
      return;
    }
    for (const TransferEvent& e : events) ReportFailed(e.ref);
  }

  // Starts the copy of `event`, whose device blocks the caller pinned;
  // `for_waiter`: the caller waits for it at once (DeviceTier::
  // SubmitForWaiter), or the next call kicks the device tier's engine.
  Status Submit(const TransferEvent& event, bool for_waiter = false) {
    // A lost attachment's host slots are tierkvd's to reuse: no copy may
    // touch them any more.
    if (!channel_error.ok()) return channel_error;
    const uint64_t tag = next_tag++;
    CopyJob job{.tag = tag,
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
    if (for_waiter) {
      TIERKV_RETURN_IF_ERROR(device->SubmitForWaiter(std::move(job)));
      kick_owed = true;
    } else {
      TIERKV_RETURN_IF_ERROR(device->Submit(std::move(job)));
    }
    in_flight.emplace(tag, Copy{event, session});
    return Status::Ok();
  }

  // A copy submitted for a waiter that has not waited: the device tier's
  // engine is woken for it now.
  void KickOwedCopies() {
    if (!kick_owed) return;
    kick_owed = false;
    device->KickQueuedCopies();
  }

  // Pins the event's device blocks and starts its copy; on failure unpins
  // them and releases tierkvd's side.
  Status PinAndSubmit(const TransferEvent& event, bool for_waiter = false) {
    Pin(event.device_blocks);
    Status s = Submit(event, for_waiter);
    if (!s.ok()) {
      Unpin(event.device_blocks);
      ReportFailed(event.ref);
    }
    return s;
  }

  // Starts the copies of pending loads that tierkvd reports ready, when it
  // has said some are (ready_fd) or a liveness check is due; a round trip
  // only then.
  void StartReadyLoads() {
    if (pending_loads.empty()) return;
    if (!ipc::TakeSignal(ready_fd.get()) && Clock::now() < ready_check_due) {
      return;
    }
    ready_check_due = Clock::now() + options.call_timeout;
    StatusOr<ipc::ReadyLoadsReply> ready =
        CallFor<ipc::ReadyLoadsReply>(ipc::ReadyLoadsRequest{});
    if (!ready.ok()) {
      // Failed by LoseAttachment, or refused: ask again in a millisecond
      // (the signal was taken).
      ready_check_due = Clock::now() + std::chrono::milliseconds(1);
      return;
    }
    for (const TransferEvent& load : ready->loads) {
      auto it = pending_loads.find(load.ref.id);
      if (it == pending_loads.end()) {
        ReportFailed(load.ref);  // Cancelled here; never copied.
        continue;
      }
      // A load cut short copies fewer blocks: unpin the ones it dropped.
      // Any other change of destination would write into blocks this load
      // does not pin: refused.
      const std::vector<BlockId> pinned = std::move(it->second.device_blocks);
      pending_loads.erase(it);
      const bool prefix = load.device_blocks.size() <= pinned.size() &&
                          std::equal(load.device_blocks.begin(),
                                     load.device_blocks.end(), pinned.begin());
      if (!prefix) {
        TransferEvent refused = load;
        refused.device_blocks = pinned;
        finished.push_back(
            {.event = std::move(refused),
             .status = Status::DataLoss(
                 "tierkvd readied a load into device blocks it was not "
                 "allocated"),
             .session = session});
        continue;
      }
      Unpin(std::span(pinned).subspan(load.device_blocks.size()));
      if (Status s = Submit(load); !s.ok()) {
        // The copy never ran: the engine gets it back failed, and its
        // Complete tells tierkvd.
        finished.push_back({.event = load, .status = s, .session = session});
      }
    }
  }

  void Collect(std::vector<CopyCompletion> done,
               std::vector<FinishedTransfer>* out) {
    for (CopyCompletion& c : done) {
      auto it = in_flight.find(c.tag);
      if (it == in_flight.end()) continue;
      out->push_back({.event = std::move(it->second.event),
                      .status = std::move(c.status),
                      .session = it->second.session});
      in_flight.erase(it);
    }
  }

  std::vector<FinishedTransfer> TakeFinished() {
    std::vector<FinishedTransfer> out;
    out.swap(finished);
    return out;
  }
};

namespace {

// Completions of transfers not owed: done already, or never handed out.
Status UnknownCompletions(size_t n) {
  return Status::InvalidArgument(
      std::to_string(n) +
      " transfer(s) completed that this client does not owe a completion "
      "(completed already, or never handed out): ignored, nothing unpinned");
}

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

namespace {

WorkerRegistration RegistrationOf(const ClientOptions& options) {
  return {.layout = options.layout,
          .model = options.model,
          .num_device_blocks = options.num_device_blocks,
          .tenant = options.tenant,
          .pid = static_cast<int32_t>(getpid()),
          .name = options.name,
          .ranks = options.ranks,
          .scheduler = options.scheduler,
          .rank = options.rank,
          .attachment_tag = options.attachment_tag};
}

// DataLoss unless every device block of `events` is one of `passed`, the
// blocks the caller gave the call that made them, and each event names as
// many host slots: a reply from a broken tierkvd must not have the client
// write into another request's blocks.
Status CheckHandedOut(std::span<const TransferEvent> events,
                      std::span<const BlockId> passed) {
  if (events.empty()) return Status::Ok();  // Most commits store nothing.
  std::vector<BlockId> given(passed.begin(), passed.end());
  std::ranges::sort(given);
  for (const TransferEvent& e : events) {
    if (e.device_blocks.size() != e.host_blocks.size()) {
      return Status::DataLoss(
          "tierkvd handed out an event of " +
          std::to_string(e.device_blocks.size()) + " device blocks and " +
          std::to_string(e.host_blocks.size()) + " host slots");
    }
    for (BlockId b : e.device_blocks) {
      if (!std::ranges::binary_search(given, b)) {
        return Status::DataLoss("tierkvd handed out device block " +
                                std::to_string(b) +
                                ", not one of the blocks this call passed");
      }
    }
  }
  return Status::Ok();
}

// Whether a rank with `num_device_blocks` blocks can copy `event`.
Status CheckRankEvent(const TransferEvent& event, int32_t num_device_blocks) {
  if (event.device_blocks.size() != event.host_blocks.size()) {
    return Status::InvalidArgument(
        "the event names " + std::to_string(event.device_blocks.size()) +
        " device blocks and " + std::to_string(event.host_blocks.size()) +
        " host blocks");
  }
  for (BlockId b : event.device_blocks) {
    if (b < 0 || b >= num_device_blocks) {
      return Status::InvalidArgument(
          "device block " + std::to_string(b) + " is outside this rank's " +
          std::to_string(num_device_blocks) + " blocks");
    }
  }
  return Status::Ok();
}

Status CheckCopyRoles(const ClientOptions& options) {
  if (options.copies != CopyMode::kClient &&
      options.copies != CopyMode::kCaller &&
      options.copies != CopyMode::kRanks) {
    return Status::InvalidArgument("unknown copy mode");
  }
  if (options.copies != CopyMode::kClient &&
      (options.device != nullptr || options.engine != nullptr)) {
    return Status::InvalidArgument(
        std::string("copies = ") + CopyModeName(options.copies) +
        ": the engine copies, so the client takes no device tier and pins "
        "no engine blocks (leave device and engine null)");
  }
  if ((options.copies == CopyMode::kRanks) !=
      (options.ranks >= 1 && options.ranks <= kMaxRanks)) {
    return Status::InvalidArgument(
        "ranks is 1 to " + std::to_string(kMaxRanks) +
        " for a scheduler (copies = ranks) and 0 otherwise, not " +
        std::to_string(options.ranks));
  }
  if (options.scheduler != 0 && options.copies == CopyMode::kRanks) {
    return Status::InvalidArgument(
        "a rank client (scheduler set) copies events itself: copies is "
        "client or caller, not ranks");
  }
  if (options.scheduler != 0 &&
      (options.rank < 0 || options.rank >= kMaxRanks)) {
    return Status::InvalidArgument("rank " + std::to_string(options.rank) +
                                   " is outside [0, " +
                                   std::to_string(kMaxRanks) + ")");
  }
  return Status::Ok();
}

}  // namespace

const char* CopyModeName(CopyMode mode) {
  switch (mode) {
    case CopyMode::kClient:
      return "client";
    case CopyMode::kCaller:
      return "caller";
    case CopyMode::kRanks:
      return "ranks";
  }
  return "unknown";
}

// Checks the options and sets up the device side; the store side is
// Open's (attached) or OpenInProcess's (embedded).
StatusOr<std::unique_ptr<Client::Impl>> Client::NewImpl(
    const ClientOptions& options) {
  TIERKV_RETURN_IF_ERROR(options.layout.Validate());
  TIERKV_RETURN_IF_ERROR(ValidateModelName(options.model));
  if (options.num_device_blocks < 1) {
    return Status::InvalidArgument("num_device_blocks must be at least 1");
  }
  if (options.call_timeout <= std::chrono::milliseconds(0)) {
    return Status::InvalidArgument("call_timeout must be positive");
  }
  TIERKV_RETURN_IF_ERROR(CheckCopyRoles(options));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.copies != CopyMode::kClient) return impl;
  impl->device = options.device;
  if (impl->device == nullptr) {
    TIERKV_ASSIGN_OR_RETURN(
        impl->owned_device,
        EmulatedDeviceTier::Create(options.num_device_blocks,
                                   options.layout.BlockBytes()));
    impl->device = impl->owned_device.get();
  }
  if (impl->device->block_bytes() != options.layout.BlockBytes()) {
    return Status::InvalidArgument("device tier blocks hold " +
                                   std::to_string(impl->device->block_bytes()) +
                                   " bytes; the layout's blocks " +
                                   std::to_string(options.layout.BlockBytes()));
  }
  if (impl->device->num_blocks() < options.num_device_blocks) {
    return Status::InvalidArgument(
        "the device tier has " + std::to_string(impl->device->num_blocks()) +
        " blocks, fewer than num_device_blocks (" +
        std::to_string(options.num_device_blocks) + ")");
  }
  impl->copies_fd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->copies_fd.valid()) {
    return Status::ResourceExhausted(std::string("eventfd: ") +
                                     std::strerror(errno));
  }
  if (!impl->device->SetCompletionNotify(
          [fd = impl->copies_fd.get()] { (void)eventfd_write(fd, 1); })) {
    impl->copies_fd.reset();  // WaitEvents waits with WaitCompleted.
  }
  return impl;
}

StatusOr<std::unique_ptr<Client>> Client::Open(const ClientOptions& options) {
  if (options.socket_path.empty()) {
    return Status::InvalidArgument(
        "ClientOptions::socket_path is empty: name the tierkvd to attach to, "
        "or open a store in this process with OpenEmbedded "
        "(tierkv/embedded.h, library tierkv::embedded)");
  }
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, NewImpl(options));
  TIERKV_RETURN_IF_ERROR(
      impl->Attach(RegistrationOf(options),
                   StoreFingerprint(options.layout, options.model)));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

StatusOr<std::unique_ptr<Client>> Client::OpenInProcess(
    const ClientOptions& options, std::unique_ptr<ipc::InProcessStore> store) {
  if (options.copies == CopyMode::kRanks || options.scheduler != 0) {
    return Status::InvalidArgument(
        "an embedded store has no other processes: rank clients and "
        "schedulers with ranks attach to a tierkvd");
  }
  TIERKV_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, NewImpl(options));
  TIERKV_ASSIGN_OR_RETURN(impl->worker,
                          store->RegisterWorker(RegistrationOf(options)));
  impl->ready_fd.reset(fcntl(store->ready_fd(), F_DUPFD_CLOEXEC, 0));
  if (!impl->ready_fd.valid()) {
    return Status::ResourceExhausted(std::string("dup: ") +
                                     std::strerror(errno));
  }
  impl->host = &store->host();
  impl->in_process = std::move(store);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

StatusOr<LookupResult> Client::Lookup(RequestId request,
                                      std::span<const TokenId> tokens,
                                      int32_t num_computed_tokens,
                                      const RequestExtras& extras) {
  Impl& impl = *impl_;
  if (impl.in_process == nullptr) {
    // Asked again (an engine's scheduler asks every step for a request
    // still waiting): only the tokens after those that did not change go,
    // named by the tag tierkvd gave the last lookup's. The rest is encoded
    // straight from the caller's tokens (a request of 4,096 tokens is
    // 16 KiB: a copy less matters at a few microseconds per lookup).
    auto sent = impl.sent_lookups.find(request);
    size_t kept = 0;
    if (sent != impl.sent_lookups.end()) {
      const std::vector<TokenId>& before = sent->second.tokens;
      const size_t n = std::min(before.size(), tokens.size());
      kept = std::memcmp(before.data(), tokens.data(), n * sizeof(TokenId)) == 0
                 ? n
                 : static_cast<size_t>(std::mismatch(before.begin(),
                                                     before.begin() + n,
                                                     tokens.begin())
                                           .first -
                                       before.begin());
    }
    for (;;) {
      impl.request_bytes.clear();
      ipc::EncodeLookup(request, num_computed_tokens, tokens.subspan(kept),
                        extras, static_cast<uint32_t>(kept),
                        kept > 0 ? sent->second.tag : 0, &impl.request_bytes);
      impl.counts.lookup_tokens_sent += tokens.size() - kept;
      StatusOr<ipc::LookupReply> reply =
          Impl::ReplyAs<ipc::LookupReply>(impl.CallEncoded());
      if (!reply.ok() && kept > 0 &&
          reply.status().code() == StatusCode::kAborted) {
        // tierkvd keeps other tokens for the request by now: send them all.
        impl.ForgetLookup(request);
        kept = 0;
        continue;
      }
      if (!reply.ok()) {
        impl.ForgetLookup(request);
        return reply.status();
      }
      impl.RememberLookup(request, tokens, kept, reply->tokens_tag);
      return reply->result;
    }
  }
  TIERKV_ASSIGN_OR_RETURN(
      ipc::LookupReply reply,
      impl_->CallFor<ipc::LookupReply>(ipc::LookupRequest{
          .request = request,
          .num_computed_tokens = num_computed_tokens,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .extras = extras}));
  return reply.result;
}

StatusOr<std::vector<StatusOr<LookupResult>>> Client::LookupBatch(
    std::span<const LookupQuery> queries) {
  Impl& impl = *impl_;
  std::vector<StatusOr<LookupResult>> results;
  results.reserve(queries.size());
  if (impl.in_process != nullptr || queries.size() == 1) {
    // No transport to save: each is a call into the store, or one round
    // trip either way (a plain Lookup costs less to decode).
    for (const LookupQuery& q : queries) {
      results.push_back(
          Lookup(q.request, q.tokens, q.num_computed_tokens, q.extras));
      // A lost attachment fails the call, not the lookup.
      if (!impl.channel_error.ok()) return impl.channel_error;
    }
    return results;
  }
  if (!impl.channel_error.ok()) return impl.channel_error;
  // Batches as large as the channel takes both ways (a frame header and a
  // count besides the lookups, or their results), each a round trip.
  const size_t capacity = impl.channel->capacity();
  const size_t room = capacity - ipc::kFrameHeaderBytes - 4;
  while (results.size() < queries.size()) {
    const size_t first = results.size();
    if (ipc::LookupBatchEntryBytes(queries[first]) > room) {
      // Too large for the channel on its own: refused alone, as its Lookup
      // would be.
      results.push_back(Status::InvalidArgument(
          "a lookup of " + std::to_string(queries[first].tokens.size()) +
          " tokens exceeds the control channel's " + std::to_string(capacity) +
          " bytes"));
      continue;
    }
    size_t end = first, bytes = 0;
    while (end < queries.size() && end - first < ipc::kMaxBatchLookups &&
           (end - first + 1) * ipc::kMaxBatchResultBytes <= room) {
      const size_t entry = ipc::LookupBatchEntryBytes(queries[end]);
      if (bytes + entry > room) break;
      bytes += entry;
      ++end;
    }
    impl.request_bytes.clear();
    // A batched lookup sends all its tokens: tierkvd then keeps them
    // under a new tag, which only a plain Lookup learns.
    for (size_t q = first; q < end; ++q) {
      impl.ForgetLookup(queries[q].request);
    }
    ipc::EncodeLookupBatch(queries.subspan(first, end - first),
                           &impl.request_bytes);
    TIERKV_ASSIGN_OR_RETURN(
        ipc::LookupBatchReply reply,
        Impl::ReplyAs<ipc::LookupBatchReply>(impl.CallEncoded()));
    if (reply.results.size() != end - first) {
      return Status::DataLoss(
          "tierkvd answered " + std::to_string(reply.results.size()) +
          " lookups of a batch of " + std::to_string(end - first));
    }
    for (StatusOr<LookupResult>& r : reply.results) {
      if (!r.ok()) impl.CheckEnded(r.status());
      results.push_back(std::move(r));
    }
    // A lost attachment fails the call, as in the loop above: the lookups
    // that hit keep no pins once the socket closes.
    if (!impl.channel_error.ok()) return impl.channel_error;
  }
  return results;
}

StatusOr<RouteResult> Client::Route(std::span<const TokenId> tokens,
                                    const RequestExtras& extras) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::RouteReply reply,
      impl_->CallFor<ipc::RouteReply>(ipc::RouteRequest{
          .tenant = impl_->options.tenant,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .extras = extras}));
  return std::move(reply.result);
}

StatusOr<LookupResult> Client::LookupChunk(RequestId request,
                                           std::span<const TokenId> tokens,
                                           int64_t virtual_start,
                                           const BlockKey& variant) {
  impl_->ForgetLookup(request);  // tierkvd keeps the chunk's.
  TIERKV_ASSIGN_OR_RETURN(
      ipc::LookupReply reply,
      impl_->CallFor<ipc::LookupReply>(ipc::LookupChunkRequest{
          .request = request,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .virtual_start = virtual_start,
          .variant = variant}));
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
  if (reply.result.load.has_value()) {
    if (Status bad = CheckHandedOut({&*reply.result.load, 1}, device_blocks);
        !bad.ok()) {
      impl_->RefuseHandedOut({&*reply.result.load, 1}, bad);
      return bad;
    }
  }
  if (!reply.result.load.has_value() ||
      impl_->options.copies != CopyMode::kClient) {
    if (reply.result.load.has_value() && !reply.result.load_pending) {
      impl_->HandOut({&*reply.result.load, 1});
    }
    return reply.result;
  }
  const TransferEvent& load = *reply.result.load;
  if (reply.result.load_pending) {
    // Pinned from now on, so the blocks cannot pass to another request
    // before the copy that writes them has run or been cancelled.
    impl_->Pin(load.device_blocks);
    if (impl_->pending_loads.empty()) {
      impl_->ready_check_due = Clock::now() + impl_->options.call_timeout;
    }
    impl_->pending_loads.emplace(load.ref.id, load);
  } else {
    TIERKV_RETURN_IF_ERROR(impl_->PinAndSubmit(load));
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
  if (Status bad = CheckHandedOut(reply.result.stores, device_blocks);
      !bad.ok()) {
    impl_->RefuseHandedOut(reply.result.stores, bad);
    return bad;
  }
  TIERKV_RETURN_IF_ERROR(impl_->StartStores(reply.result));
  return reply.result;
}

StatusOr<ChunkFetchResult> Client::FetchChunk(
    RequestId request, std::span<const TokenId> tokens,
    std::chrono::milliseconds wait, const AllocateDeviceBlocks& allocate,
    int64_t virtual_start, const BlockKey& variant) {
  // The wait must end well within the call's own deadline.
  const auto bounded = std::clamp(wait, std::chrono::milliseconds(0),
                                  impl_->options.call_timeout / 2);
  TIERKV_ASSIGN_OR_RETURN(
      ipc::FetchChunkReply reply,
      impl_->CallFor<ipc::FetchChunkReply>(ipc::FetchChunkRequest{
          .request = request,
          .wait_ms = static_cast<uint32_t>(bounded.count()),
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .virtual_start = virtual_start,
          .variant = variant}));
  ChunkFetchResult& result = reply.result;
  if (!result.load.has_value()) return result;
  TransferEvent& load = *result.load;
  // A load cut short (verify_on_load) is of no use to a pool of whole
  // chunks: released unstarted, and handed back so the caller counts it.
  StatusOr<std::vector<BlockId>> blocks =
      load.failed_blocks > 0
          ? Status::DataLoss("the chunk's load was cut short")
          : allocate(static_cast<int32_t>(load.host_blocks.size()));
  if (blocks.ok() && blocks->size() != load.host_blocks.size()) {
    blocks = Status::InvalidArgument("allocate gave " +
                                     std::to_string(blocks->size()) +
                                     " device blocks for a chunk of " +
                                     std::to_string(load.host_blocks.size()));
  }
  if (!blocks.ok()) {
    // tierkvd releases the load's slots; nothing was copied.
    TIERKV_RETURN_IF_ERROR(impl_->Post(ipc::ChunkDoneRequest{
        .events = {{load.ref, /*ok=*/false}}, .finish = 0}));
    if (load.failed_blocks > 0) return result;
    return blocks.status();
  }
  load.device_blocks = std::move(*blocks);
  if (impl_->options.copies == CopyMode::kClient) {
    // A chunk pool waits for the chunk at once (ClientChunkSource): its
    // WaitEvents runs the copy, and any other call first wakes the
    // device tier's engine for it.
    TIERKV_RETURN_IF_ERROR(impl_->PinAndSubmit(load, /*for_waiter=*/true));
  } else {
    impl_->HandOut({&load, 1});
  }
  return result;
}

StatusOr<CommitResult> Client::PublishChunk(
    RequestId request, std::span<const TokenId> tokens,
    std::span<const BlockId> device_blocks, int64_t virtual_start,
    const BlockKey& variant) {
  TIERKV_ASSIGN_OR_RETURN(
      ipc::CommitReply reply,
      impl_->CallFor<ipc::CommitReply>(ipc::PublishChunkRequest{
          .request = request,
          .tokens = std::vector<TokenId>(tokens.begin(), tokens.end()),
          .device_blocks =
              std::vector<BlockId>(device_blocks.begin(), device_blocks.end()),
          .virtual_start = virtual_start,
          .variant = variant}));
  // As a fetch's load: a chunk pool waits for its publish at once.
  TIERKV_RETURN_IF_ERROR(impl_->StartStores(reply.result, /*for_waiter=*/true));
  return reply.result;
}

Status Client::CompleteOneWay(std::span<const FinishedTransfer> finished,
                              RequestId finish) {
  if (impl_->options.copies == CopyMode::kRanks) {
    return Status::FailedPrecondition(
        "a scheduler with ranks (copies = ranks) does not complete events");
  }
  size_t unknown = 0;
  ipc::ChunkDoneRequest request{
      .events = impl_->TakeCompletions(finished, &unknown), .finish = finish};
  // As Finish: the request's pending and lost loads end here too.
  if (finish != 0) {
    std::ranges::move(impl_->ForgetRequest(finish),
                      std::back_inserter(request.events));
  }
  Status status;
  if ((!request.events.empty() || finish != 0) && impl_->channel_error.ok()) {
    status = impl_->Post(request);
  }
  if (status.ok() && unknown > 0) return UnknownCompletions(unknown);
  return status;
}

const ClientCallCounts& Client::call_counts() const { return impl_->counts; }
const Status& Client::last_post_error() const { return impl_->last_post_error; }

std::vector<FinishedTransfer> Client::PollEvents() {
  impl_->KickOwedCopies();
  impl_->StartReadyLoads();
  std::vector<FinishedTransfer> out = impl_->TakeFinished();
  if (impl_->device != nullptr) {
    impl_->Collect(impl_->device->PollCompleted(), &out);
  }
  return impl_->Owe(std::move(out));
}

std::vector<FinishedTransfer> Client::WaitEvents(
    std::chrono::milliseconds timeout) {
  return impl_->Owe(WaitForEvents(timeout));
}

std::vector<FinishedTransfer> Client::WaitForEvents(
    std::chrono::milliseconds timeout) {
  // Without a device tier nothing is copied here: nothing to wait for.
  if (impl_->device == nullptr) return impl_->TakeFinished();
  Impl& impl = *impl_;
  using Clock = std::chrono::steady_clock;
  // Sleeps are bounded: now + timeout must not overflow.
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(
                         timeout, std::chrono::hours(24 * 365));
  for (;;) {
    // Taken before the device is polled: a completion after this read
    // raises it again, so the sleep below cannot miss it.
    (void)ipc::TakeSignal(impl.copies_fd.get());
    impl.StartReadyLoads();
    std::vector<FinishedTransfer> done = impl.TakeFinished();
    impl.Collect(impl.device->PollCompleted(), &done);
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (!done.empty() || left.count() <= 0) {
      impl.KickOwedCopies();  // Not waited for here: the engine runs them.
      return done;
    }
    // About to sleep for copies still queued: an emulated device tier runs
    // them on this thread now (DeviceTier::RunQueuedCopies), sparing the
    // hand-off to its copy thread and the wake-up back.
    const size_t ran = impl.device->RunQueuedCopies();
    // Whatever it left queued, the engine's thread runs after its job.
    impl.kick_owed = false;
    if (ran > 0) continue;
    // Sleep until a copy completes, tierkvd says loads are ready, or
    // tierkvd goes away (its socket closes): pending loads then fail now.
    const bool loads = !impl.pending_loads.empty();
    const auto wait =
        loads ? std::clamp(std::chrono::ceil<std::chrono::milliseconds>(
                               impl.ready_check_due - Clock::now()),
                           std::chrono::milliseconds(0), left)
              : left;
    if (!impl.copies_fd.valid()) {
      // A device tier that cannot notify: wait on it, and look at the
      // readiness signal (no round trip) every millisecond meanwhile.
      impl.Collect(
          impl.device->WaitCompleted(
              loads ? std::min(wait, std::chrono::milliseconds(1)) : wait),
          &done);
      if (!done.empty()) return done;
      if (loads && !impl.PeerAlive()) {
        impl.LoseAttachment(
            Status::Unavailable("tierkvd closed the connection"));
      }
      continue;
    }
    pollfd fds[3] = {{impl.copies_fd.get(), POLLIN, 0},
                     {impl.ready_fd.get(), POLLIN, 0},
                     {impl.socket_fd, POLLIN, 0}};
    const int n = poll(
        fds, loads ? 3 : 1,
        static_cast<int>(std::min<int64_t>(wait.count(), int64_t{60'000})));
    if (n > 0 && fds[2].revents != 0 && !impl.PeerAlive()) {
      impl.LoseAttachment(Status::Unavailable("tierkvd closed the connection"));
    }
  }
}

Status Client::Complete(std::span<const FinishedTransfer> finished) {
  if (impl_->options.copies == CopyMode::kRanks) {
    return Status::FailedPrecondition(
        "a scheduler with ranks (copies = ranks) does not complete events: "
        "each of its " +
        std::to_string(impl_->options.ranks) + " rank clients completes them");
  }
  size_t unknown = 0;
  const ipc::CompleteRequest request{
      impl_->TakeCompletions(finished, &unknown)};
  Status status;
  if (!request.events.empty() && impl_->channel_error.ok()) {
    TIERKV_ASSIGN_OR_RETURN(Message reply, impl_->Call(request));
    status = ipc::StatusOf(reply);
  }
  if (status.ok() && unknown > 0) return UnknownCompletions(unknown);
  return status;
}

Status Client::Finish(RequestId request) {
  std::vector<CompletedEvent> failed = impl_->ForgetRequest(request);
  // After ForgetRequest: a call that loses the attachment adds to
  // `finished`, which must not change while it is walked.
  if (!failed.empty() && impl_->channel_error.ok()) {
    (void)impl_->Call(ipc::CompleteRequest{std::move(failed)});
  }
  TIERKV_ASSIGN_OR_RETURN(Message reply,
                          impl_->Call(ipc::FinishRequest{request}));
  return ipc::StatusOf(reply);
}

StatusOr<CoordinatorStats> Client::Stats() {
  TIERKV_ASSIGN_OR_RETURN(ipc::StatsReply reply,
                          impl_->CallFor<ipc::StatsReply>(ipc::StatsRequest{}));
  return reply.stats;
}

Status Client::Reconnect() {
  Impl& impl = *impl_;
  if (impl.in_process != nullptr) return Status::Ok();
  if (impl.channel_error.ok()) {
    if (impl.PeerAlive()) return Status::Ok();
    impl.LoseAttachment(Status::Unavailable("tierkvd closed the connection"));
  }
  if (!impl.engine_copies.empty()) {
    // Their copies may still run against the old attachment's slots, and
    // their completions would name events of the new one.
    return Status::FailedPrecondition(
        std::to_string(impl.engine_copies.size()) +
        " transfer(s) handed to the engine before the attachment was lost "
        "are not completed: Complete them (failed, if their copies cannot "
        "run) before reconnecting");
  }
  if (impl.options.scheduler != 0) {
    // A restarted tierkvd numbers workers and events from 1 again: the same
    // scheduler id there is another scheduler, whose events this rank must
    // never copy.
    return Status::FailedPrecondition(
        "a rank client does not reconnect: once its scheduler has attached "
        "again, open a new rank client with the scheduler's new worker id");
  }
  if (!impl.options.attachment_tag.empty()) {
    // Its ranks would check the old tag against the new attachment, which
    // a restarted tierkvd may give the old id.
    return Status::FailedPrecondition(
        "a scheduler with an attachment tag does not reconnect: open a new "
        "client with a new tag, which its ranks then name");
  }
  // LoseAttachment let the old attachment's copies finish and closed it.
  const ClientOptions& o = impl.options;
  TIERKV_RETURN_IF_ERROR(
      impl.Attach(RegistrationOf(o), StoreFingerprint(o.layout, o.model)));
  ++impl.session;
  return Status::Ok();
}

StatusOr<std::vector<TransferEvent>> Client::TakeReadyLoads() {
  if (impl_->options.copies == CopyMode::kClient) {
    return std::vector<TransferEvent>{};
  }
  TIERKV_ASSIGN_OR_RETURN(
      ipc::ReadyLoadsReply reply,
      impl_->CallFor<ipc::ReadyLoadsReply>(ipc::ReadyLoadsRequest{}));
  impl_->HandOut(reply.loads);
  return std::move(reply.loads);
}

Status Client::Start(const TransferEvent& event) {
  const ClientOptions& o = impl_->options;
  if (o.scheduler == 0 || impl_->device == nullptr) {
    return Status::FailedPrecondition(
        o.scheduler == 0
            ? "Start is for rank clients (ClientOptions::scheduler): this "
              "client's own events start when Allocate or Commit hands them "
              "out"
            : "this rank client copies itself (copies = caller): copy "
              "through host_block and Complete");
  }
  // Started twice, the event would be pinned twice and finished twice,
  // yet completed once (Complete refuses the second): one pin would stay.
  // Refused before anything is pinned or reported, so the first copy and
  // the other ranks' parts go on.
  TIERKV_RETURN_IF_ERROR(impl_->CheckNotStarted(event.ref));
  // An event this rank can never copy: its part is reported failed, or
  // tierkvd would wait for it for good.
  if (Status invalid = CheckRankEvent(event, o.num_device_blocks);
      !invalid.ok()) {
    impl_->ReportFailed(event.ref);
    return invalid;
  }
  return impl_->PinAndSubmit(event);
}

Status Client::Decline(std::span<const TransferEvent> events) {
  if (impl_->options.scheduler == 0) {
    return Status::FailedPrecondition(
        "Decline is for rank clients (ClientOptions::scheduler): a client "
        "completes its own events");
  }
  std::vector<CompletedEvent> failed;
  for (const TransferEvent& event : events) {
    TIERKV_RETURN_IF_ERROR(impl_->CheckNotStarted(event.ref));
    failed.push_back({event.ref, false});
  }
  if (failed.empty()) return Status::Ok();
  TIERKV_ASSIGN_OR_RETURN(Message reply,
                          impl_->Call(ipc::CompleteRequest{std::move(failed)}));
  return ipc::StatusOf(reply);
}

StatusOr<std::span<std::byte>> Client::host_block(BlockId slot) {
  const Impl& impl = *impl_;
  if (!impl.channel_error.ok()) return impl.channel_error;
  if (slot <= 0 || slot >= impl.host->num_slots()) {
    return Status::OutOfRange("host slot " + std::to_string(slot) +
                              " is outside the store's slots [1, " +
                              std::to_string(impl.host->num_slots()) + ")");
  }
  return std::span<std::byte>(impl.host->slot(slot),
                              impl.options.layout.BlockBytes());
}

WorkerId Client::worker_id() const { return impl_->worker; }
CopyMode Client::copies() const { return impl_->options.copies; }
Status Client::WaitIdle(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    // Each call asks tierkvd to wait well within the call's own deadline.
    const auto wait = std::clamp(left, std::chrono::milliseconds(0),
                                 impl_->options.call_timeout / 2);
    TIERKV_ASSIGN_OR_RETURN(
        ipc::WaitIdleReply reply,
        impl_->CallFor<ipc::WaitIdleReply>(
            ipc::WaitIdleRequest{static_cast<uint32_t>(wait.count())}));
    if (reply.idle) return Status::Ok();
    if (left <= wait) {
      return Status::DeadlineExceeded(
          "the store's disk tier was still busy after " +
          std::to_string(timeout.count()) + " ms");
    }
  }
}

bool Client::embedded() const { return impl_->in_process != nullptr; }
const KvLayout& Client::layout() const { return impl_->options.layout; }
DeviceTier* Client::device() { return impl_->device; }
size_t Client::transfers_in_flight() const { return impl_->in_flight.size(); }
bool Client::copying(const EventRef& ref) const { return impl_->Copying(ref); }
size_t Client::loads_pending() const { return impl_->pending_loads.size(); }
bool Client::connected() const { return impl_->channel_error.ok(); }
const Status& Client::connection_status() const { return impl_->channel_error; }
uint64_t Client::session() const { return impl_->session; }

}  // namespace tierkv
