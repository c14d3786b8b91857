#include "tools/daemon/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <string_view>
#include <thread>
#include <vector>

#include "ipc/unique_fd.h"

namespace tierkv::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using ipc::UniqueFd;

// While poll fails, the thread tries again this often.
constexpr std::chrono::milliseconds kPollRetry{100};

// One client: its request as it arrives, then the response as it leaves.
struct HttpConnection {
  UniqueFd fd;
  Clock::time_point deadline = {};
  uint64_t serial = 0;  // Accept order.
  std::string input = {};
  std::string output = {};  // Set once the request is whole.
  size_t sent = 0;
};

std::string Response(int code, const char* reason, std::string_view body,
                     const char* content_type, bool head,
                     const char* extra = "") {
  std::string out = "HTTP/1.1 " + std::to_string(code) + " " + reason +
                    "\r\nContent-Type: " + content_type +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n" + extra + "\r\n";
  if (!head) out.append(body);
  return out;
}

// The response to one whole request: `head` is its request line and headers.
std::string Answer(std::string_view head,
                   const std::function<std::string()>& render) {
  const std::string_view line = head.substr(0, head.find("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 =
      sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  constexpr char kText[] = "text/plain; charset=utf-8";
  if (sp2 == std::string_view::npos ||
      !line.substr(sp2 + 1).starts_with("HTTP/1.")) {
    return Response(400, "Bad Request", "malformed request line\n", kText,
                    false);
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return Response(405, "Method Not Allowed", "only GET is served\n", kText,
                    false, "Allow: GET, HEAD\r\n");
  }
  if (target != "/metrics") {
    return Response(404, "Not Found", "tierkvd serves /metrics only\n", kText,
                    head_only);
  }
  // Prometheus text exposition format, version 0.0.4.
  return Response(200, "OK", render(), "text/plain; version=0.0.4", head_only);
}

StatusOr<sockaddr_storage> ParseAddress(const std::string& host, uint16_t port,
                                        socklen_t* len) {
  sockaddr_storage addr{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(*v6);
  } else {
    return Status::InvalidArgument("--metrics-listen: '" + host +
                                   "' is not an IPv4 or IPv6 address");
  }
  return addr;
}

}  // namespace

struct MetricsHttpServer::Impl {
  MetricsHttpOptions options;
  UniqueFd listen_fd;
  UniqueFd wake_read, wake_write;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};
  std::map<int, HttpConnection> connections;  // The thread's alone.
  uint64_t accepted = 0;
  Clock::time_point accept_paused_until;
  bool poll_failing = false;  // Logged once per episode.
  std::thread thread;

  void Run();
  void Accept(Clock::time_point now);
  // False when the connection is done with (answered, failed or gone).
  bool Read(HttpConnection* c);
  bool Write(HttpConnection* c);
  void CloseOldest();
};

void MetricsHttpServer::Impl::CloseOldest() {
  auto oldest = connections.begin();
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    if (it->second.serial < oldest->second.serial) oldest = it;
  }
  if (oldest != connections.end()) connections.erase(oldest);
}

void MetricsHttpServer::Impl::Accept(Clock::time_point now) {
  // At most this many a round, so a flood of connections cannot keep the
  // thread from answering the ones it has.
  constexpr int kAcceptsPerRound = 64;
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    UniqueFd fd(accept4(listen_fd.get(), nullptr, nullptr,
                        SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      // Out of descriptors or memory: the listen socket stays readable, so
      // trying again at once would spin.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        accept_paused_until = now + std::chrono::milliseconds(100);
      }
      return;
    }
    if (connections.size() >= options.max_connections) CloseOldest();
    const int key = fd.get();
    connections.emplace(key, HttpConnection{.fd = std::move(fd),
                                            .deadline = now + options.deadline,
                                            .serial = ++accepted});
  }
}

bool MetricsHttpServer::Impl::Read(HttpConnection* c) {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(c->fd.get(), buf, sizeof(buf), 0);
    if (n == 0) return false;  // Closed before a whole request.
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    c->input.append(buf, static_cast<size_t>(n));
    const size_t end = c->input.find("\r\n\r\n");
    if (end != std::string::npos && end + 4 <= options.max_request_bytes) {
      c->output =
          Answer(std::string_view(c->input).substr(0, end + 2), options.render);
      break;
    }
    if (c->input.size() > options.max_request_bytes) {
      c->output =
          Response(431, "Request Header Fields Too Large",
                   "request larger than " +
                       std::to_string(options.max_request_bytes) + " bytes\n",
                   "text/plain; charset=utf-8", false);
      break;
    }
  }
  c->input.clear();
  c->input.shrink_to_fit();
  return Write(c);
}

bool MetricsHttpServer::Impl::Write(HttpConnection* c) {
  while (c->sent < c->output.size()) {
    const ssize_t n = send(c->fd.get(), c->output.data() + c->sent,
                           c->output.size() - c->sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    c->sent += static_cast<size_t>(n);
  }
  return false;  // All sent: Connection: close.
}

void MetricsHttpServer::Impl::Run() {
  std::vector<pollfd> fds;
  while (!stopping.load()) {
    auto now = Clock::now();
    for (auto it = connections.begin(); it != connections.end();) {
      it = now >= it->second.deadline ? connections.erase(it) : std::next(it);
    }
    fds.clear();
    fds.push_back({.fd = wake_read.get(), .events = POLLIN, .revents = 0});
    const bool accepting = now >= accept_paused_until;
    fds.push_back({.fd = listen_fd.get(),
                   .events = static_cast<short>(accepting ? POLLIN : 0),
                   .revents = 0});
    Clock::time_point wake = now + std::chrono::seconds(1);
    if (!accepting) wake = std::min(wake, accept_paused_until);
    for (const auto& [fd, c] : connections) {
      const short events = c.output.empty() ? POLLIN : POLLOUT;
      fds.push_back({.fd = fd, .events = events, .revents = 0});
      wake = std::min(wake, c.deadline);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(wake - now);
    if (poll(fds.data(), fds.size(),
             static_cast<int>(std::max<int64_t>(wait.count(), 0) + 1)) < 0) {
      // EINTR; or ENOMEM, or EINVAL (more descriptors than a lowered
      // RLIMIT_NOFILE allows), which may pass: the thread serves on once
      // poll works again rather than ending for good. Scrapes are cheap to
      // drop: closing them is what lets poll watch fewer descriptors.
      const int err = errno;
      if (err == EINTR) continue;
      if (!poll_failing) {
        poll_failing = true;
        spdlog::error(
            "metrics: poll over {} descriptors: {}; dropping {} "
            "scrapes and trying again every {} ms",
            fds.size(), std::strerror(err), connections.size(),
            kPollRetry.count());
      }
      if (err == EINVAL) connections.clear();
      std::this_thread::sleep_for(kPollRetry);
      continue;
    }
    if (poll_failing) {
      poll_failing = false;
      spdlog::info("metrics: poll works again");
    }
    now = Clock::now();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections.find(fds[i].fd);
      HttpConnection& c = it->second;
      const bool open = c.output.empty() ? Read(&c) : Write(&c);
      if (!open) connections.erase(it);
    }
    if ((fds[1].revents & POLLIN) != 0) Accept(now);
  }
  connections.clear();
}

StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    MetricsHttpOptions options) {
  socklen_t len = 0;
  TIERKV_ASSIGN_OR_RETURN(sockaddr_storage addr,
                          ParseAddress(options.host, options.port, &len));
  const std::string where =
      "--metrics-listen " +
      (addr.ss_family == AF_INET6 ? "[" + options.host + "]" : options.host) +
      ":" + std::to_string(options.port);
  auto impl = std::make_unique<Impl>();
  impl->listen_fd.reset(
      socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (!impl->listen_fd.valid() ||
      setsockopt(impl->listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one,
                 sizeof(one)) != 0 ||
      bind(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), len) !=
          0 ||
      listen(impl->listen_fd.get(), 64) != 0) {
    const int err = errno;
    // Not a busy port: this process may not use that address at all.
    const bool not_allowed =
        err == EAFNOSUPPORT || err == EPERM || err == EADDRNOTAVAIL;
    // An option value this host cannot take: a usage error (exit 2).
    return Status::InvalidArgument(
        where + ": cannot listen: " + std::strerror(err) +
        (not_allowed
             ? " (give an address of this host; under systemd the unit's "
               "RestrictAddressFamilies= and PrivateNetwork= must allow it)"
             : " (choose another port, or 0 for any free one)"));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&bound),
              &bound_len);
  impl->port = ntohs(bound.ss_family == AF_INET6
                         ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                         : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status::Unavailable(where + ": pipe: " + std::strerror(errno));
  }
  impl->wake_read.reset(pipe_fds[0]);
  impl->wake_write.reset(pipe_fds[1]);
  impl->options = std::move(options);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

MetricsHttpServer::~MetricsHttpServer() {
  impl_->stopping.store(true);
  const char byte = 1;
  if (write(impl_->wake_write.get(), &byte, 1) < 0) {
    // The thread polls with a timeout of at most a second; it will notice.
  }
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t MetricsHttpServer::port() const { return impl_->port; }

std::string MetricsHttpServer::address() const {
  const std::string& host = impl_->options.host;
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(impl_->port);
}

}  // namespace tierkv::daemon
