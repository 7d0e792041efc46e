// The aggregator's Prometheus endpoint (--metrics_listen): the registry, the
// HTTP exposer that serves it at /metrics, and what feeds it.
#ifndef SYNCNORM_SERVER_METRICS_H_
#define SYNCNORM_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "server/grpc_metrics.h"
#include "server/round_metrics.h"
#include "server/round_observer.h"

namespace syncnorm {

// Serves the gRPC metrics (GrpcMetrics) and syncnorm's own (RoundMetrics)
// over HTTP. The server gives round_observer() to the Aggregator and
// NewInterceptorFactories() to its ServerBuilder. Thread-safe; must outlive
// both.
class Metrics {
 public:
  // Registers every metric and starts serving GET /metrics on `listen`
  // (HOST:PORT; port 0 picks a free one). UNAVAILABLE naming the address
  // when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(
      const std::string& listen);

  ~Metrics();

  // The bound port.
  int port() const { return port_; }

  // Rounds and checkpoints, for the metrics (the server logs them itself).
  RoundObserver* round_observer() { return &rounds_; }

  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  NewInterceptorFactories();

 private:
  Metrics();

  // Constant after construction; the registry outlives what feeds it.
  const std::shared_ptr<prometheus::Registry> registry_;
  GrpcMetrics grpc_;
  RoundMetrics rounds_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_H_
