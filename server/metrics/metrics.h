// The aggregator's Prometheus endpoint (--metrics_listen): the registry, the
// HTTP server that serves it at /metrics, and what feeds it.
#ifndef SYNCNORM_SERVER_METRICS_METRICS_H_
#define SYNCNORM_SERVER_METRICS_METRICS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/registry.h"
#include "server/domain/limits.h"
#include "server/domain/round_observer.h"
#include "server/metrics/grpc_metrics.h"
#include "server/metrics/load_metrics.h"
#include "server/metrics/metrics_http.h"
#include "server/metrics/round_metrics.h"

namespace syncnorm {

// Serves the gRPC metrics (GrpcMetrics), syncnorm's rounds (RoundMetrics),
// its load against `limits` (LoadMetrics) and the process's memory, CPU and
// files (CollectProcessMetrics) over HTTP (MetricsHttpServer).
// The server gives round_observer() to the Aggregator,
// NewInterceptorFactories() to its ServerBuilder, call_observers() to its
// service and a load source to SetLoadSource(). Thread-safe; must outlive all
// three.
class Metrics {
 public:
  // Registers every metric and starts serving GET /metrics on `listen`
  // (HOST:PORT; port 0 picks a free one). UNAVAILABLE naming the address
  // when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(
      const std::string& listen, const Limits& limits = Limits(),
      MetricsHttpOptions http = {});

  ~Metrics();

  // The bound port.
  int port() const { return port_; }

  // Rounds and checkpoints, for the metrics (the server logs them itself).
  RoundObserver* round_observer() { return &rounds_; }

  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  NewInterceptorFactories();
  // What counts the calls those interceptors skip (call_observer.h).
  CallObserverFactory* call_observers() { return &grpc_; }

  // See LoadMetrics::SetSource: SetLoadSource({}) before what the source
  // reads goes away.
  void SetLoadSource(LoadMetrics::Source source) {
    load_.SetSource(std::move(source));
  }

 private:
  explicit Metrics(const Limits& limits);

  // The exposition of every metric, as GET /metrics answers it.
  std::string Render() const;

  // Constant after construction; the registry outlives what feeds it.
  const std::shared_ptr<prometheus::Registry> registry_;
  GrpcMetrics grpc_;
  RoundMetrics rounds_;
  LoadMetrics load_;
  // Last: stopped first, before what it renders goes away.
  std::unique_ptr<MetricsHttpServer> http_;
  int port_ = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_METRICS_H_
