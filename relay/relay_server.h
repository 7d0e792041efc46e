// A running relay: its service on a gRPC server, its rounds, its calls to
// the shards, its health service, metrics and connection guard.
#ifndef SYNCNORM_RELAY_RELAY_SERVER_H_
#define SYNCNORM_RELAY_RELAY_SERVER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "relay/relay.h"
#include "relay/relay_metrics.h"
#include "relay/relay_options.h"
#include "relay/relay_service.h"
#include "relay/timer_queue.h"
#include "relay/upstream.h"
#include "server/domain/clock.h"
#include "server/memory_trimmer.h"
#include "server/rpc/auth.h"
#include "server/rpc/connection_guard.h"
#include "server/rpc/guard_interceptor.h"
#include "server/rpc/health_service.h"
#include "server/rpc/read_flood.h"
#include "server/rpc/rpc_loop.h"
#include "server/rpc/socket_closer.h"

namespace syncnorm {

// OK, or INVALID_ARGUMENT naming the option that is wrong (TLS options
// included: relay_tls.h CheckRelayTls; max_transport_bytes below twice
// max_message_bytes). Files are not read.
absl::Status CheckRelayOptions(const RelayOptions& options);

// Thread-safe.
class RelayServer {
 public:
  // Serving when it returns, its health service SERVING. INVALID_ARGUMENT
  // for bad options (a bad shard list, a block size that is no power of
  // two, plaintext on a non-loopback address); the tokens file's and the
  // TLS files' errors; UNAVAILABLE when `listen` or `metrics_listen`
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<RelayServer>> Start(
      const RelayOptions& options);

  // Shutdown().
  ~RelayServer();

  RelayServer(const RelayServer&) = delete;
  RelayServer& operator=(const RelayServer&) = delete;

  // The port it serves on.
  int port() const { return port_; }
  // The port of the Prometheus endpoint; 0 without one.
  int metrics_port() const {
    return metrics_ == nullptr ? 0 : metrics_->port();
  }

  RelayCounters counters() const { return relay_->counters(); }
  // Everything the metrics show.
  RelayLoad load() const;

  // Stops serving: health NOT_SERVING; each Reduce stream ends
  // UNAVAILABLE once it has answered what it read; calls still open get
  // `grace` to end, then are cancelled; calls to the shards are
  // cancelled. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  RelayServer() = default;

  // Destroyed in reverse: the server first, then the relay (what its
  // rounds hold of the streams goes with it), then the services, the
  // calls to the shards, the timers and the loop that served them all;
  // the metrics and the guard outlive the server, whose calls report to
  // them.
  std::unique_ptr<RelayMetrics> metrics_;
  std::unique_ptr<Clock> clock_;
  std::unique_ptr<MemoryTrimmer> trimmer_;  // null: none
  std::unique_ptr<SocketCloser> closer_;
  std::unique_ptr<ConnectionGuard> guard_;
  std::unique_ptr<GuardInterceptorFactory> guard_calls_;
  std::unique_ptr<ReadFloodBreaker> read_flood_;
  // The one thread that polls gRPC: the served calls' and the calls to the
  // shards'.
  std::unique_ptr<RpcLoop> loop_;
  std::unique_ptr<TimerQueue> timers_;
  std::unique_ptr<Upstream> upstream_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RelayService> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<Relay> relay_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_SERVER_H_
