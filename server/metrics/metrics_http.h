// The HTTP side of the Prometheus endpoint (--metrics_listen): GET /metrics
// served from one thread that waits on every connection at once, so idle,
// slow or abandoned connections cannot keep a scrape from being answered.
#ifndef SYNCNORM_SERVER_METRICS_METRICS_HTTP_H_
#define SYNCNORM_SERVER_METRICS_METRICS_HTTP_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace syncnorm {

struct MetricsHttpOptions {
  // A connection must send its whole request (request line and headers)
  // within this long of being accepted, and take the whole response within
  // this long of its start; else it is closed. A deadline, not an idle
  // timeout: trickling a byte at a time does not extend it. Default 10 s.
  absl::Duration request_timeout = absl::Seconds(10);
  // Connections open at once. One more closes the oldest connection that
  // has not sent a whole request yet (a scraper sends its request as soon
  // as it connects); refused when every open one is being answered.
  // Default 64.
  int max_connections = 64;
  // Largest request head, in bytes; a longer one is answered 431.
  // Default 8192.
  size_t max_request_bytes = 8192;
};

// Answers GET and HEAD /metrics with `render()` as Prometheus's text format
// (HTTP/1.0 and 1.1, one request per connection, then closed); 404 for any
// other path, 405 for any other method, 400 for what is not HTTP. One
// thread, no thread or blocking call per connection; it holds at most
// max_connections x (max_request_bytes + one response). Thread-safe;
// `render` is called on the server's thread, one call at a time.
class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;

  // Binds `listen` (HOST:PORT; HOST an IPv4 address, a bracketed IPv6
  // address or a name, of which the first address is used; port 0 picks a
  // free one) and starts serving. UNAVAILABLE naming --metrics_listen when
  // it cannot be resolved or bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, Render render,
      MetricsHttpOptions options = {});

  // Stops serving and closes every connection.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }

 private:
  class Loop;

  MetricsHttpServer(int port, std::unique_ptr<Loop> loop);

  const int port_;
  const std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_METRICS_HTTP_H_
