// A running relay: its service on a gRPC server, its rounds, its calls to
// the shards.
#ifndef SYNCNORM_RELAY_RELAY_SERVER_H_
#define SYNCNORM_RELAY_RELAY_SERVER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "relay/relay.h"
#include "relay/relay_options.h"
#include "relay/relay_service.h"
#include "relay/timer_queue.h"
#include "relay/upstream.h"
#include "server/rpc/auth.h"

namespace syncnorm {

// OK, or INVALID_ARGUMENT naming the option that is wrong (TLS options
// included: relay_tls.h CheckRelayTls). Files are not read.
absl::Status CheckRelayOptions(const RelayOptions& options);

// Thread-safe.
class RelayServer {
 public:
  // Serving when it returns. INVALID_ARGUMENT for bad options (a bad
  // shard list, a block size that is no power of two, plaintext on a
  // non-loopback address); the tokens file's and the TLS files' errors;
  // UNAVAILABLE when `listen` cannot be bound.
  static absl::StatusOr<std::unique_ptr<RelayServer>> Start(
      const RelayOptions& options);

  // Shutdown().
  ~RelayServer();

  RelayServer(const RelayServer&) = delete;
  RelayServer& operator=(const RelayServer&) = delete;

  // The port it serves on.
  int port() const { return port_; }

  RelayCounters counters() const { return relay_->counters(); }

  // Stops serving: calls still open get `grace` to end, then are
  // cancelled; calls to the shards are cancelled. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  RelayServer() = default;

  // Destroyed in reverse: the server first, the timers last.
  std::unique_ptr<TimerQueue> timers_;
  std::unique_ptr<Upstream> upstream_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Relay> relay_;
  std::unique_ptr<RelayService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_SERVER_H_
