// MetricsHttpServer: tierkvd's Prometheus endpoint (--metrics-listen). One
// thread answers GET /metrics over HTTP/1.1 with the text a render callback
// gives (the same text tierkv-admin metrics prints), one response per
// connection. It never waits on a client: every socket is non-blocking and
// polled, a request must arrive whole within a deadline and under a size
// cap, and past a bound on open connections a new one closes the one open
// longest. So a slow or hostile client costs a few KiB and a descriptor, and
// never stalls a scrape or any other tierkvd thread.
// Thread-safety: Start, port and the destructor from any one thread.
#ifndef TIERKV_TOOLS_DAEMON_METRICS_HTTP_H_
#define TIERKV_TOOLS_DAEMON_METRICS_HTTP_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tierkv/status.h"

namespace tierkv::daemon {

struct MetricsHttpOptions {
  // An IPv4 or IPv6 literal to bind. Default: loopback only.
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (port() says which).
  // The exposition text of one scrape; called on the server's thread.
  std::function<std::string()> render;
  // Connections open at once; past it a new one closes the oldest.
  // Default: 16.
  size_t max_connections = 16;
  // A connection must have sent its whole request, and then taken the whole
  // response, within this time of being accepted. Default: 5 s.
  std::chrono::milliseconds deadline{5000};
  // Bytes of request line and headers; more is answered 431. Default: 8 KiB.
  size_t max_request_bytes = 8192;
};

class MetricsHttpServer {
 public:
  // InvalidArgument for a host that is no address literal, and (naming the
  // address and why) when it cannot listen there: both are option values
  // this host cannot take (tierkvd exits 2).
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      MetricsHttpOptions options);
  ~MetricsHttpServer();  // Stops the thread; closes every connection.
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const;
  // "127.0.0.1:9464", "[::1]:9464".
  std::string address() const;

 private:
  struct Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierkv::daemon

#endif  // TIERKV_TOOLS_DAEMON_METRICS_HTTP_H_
