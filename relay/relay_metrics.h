// The relay's Prometheus endpoint (--metrics_listen, as the aggregator's):
// gRPC's server metrics under go-grpc-prometheus's names, the relay's own
// under syncnorm_relay_, the process's, served by the aggregator's HTTP
// server (server/metrics).
#ifndef SYNCNORM_RELAY_RELAY_METRICS_H_
#define SYNCNORM_RELAY_RELAY_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "relay/relay.h"
#include "relay/relay_options.h"
#include "relay/relay_service.h"
#include "relay/upstream.h"
#include "server/metrics/grpc_metrics.h"
#include "server/metrics/metrics_http.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// What the relay did and holds, read at each scrape.
struct RelayLoad {
  RelayCounters relay;
  UpstreamCounters upstream;
  RelayServiceCounters service;
  // Reduce and ReduceOnce calls held (ConnectionGuard::calls_held()).
  int64_t grpc_calls = 0;
  // Connections the ConnectionGuard closed, by CloseReason.
  int64_t connections_closed[kCloseReasons] = {};
};

// The relay's own families for `load`, read when scraped, so never stale:
//   syncnorm_relay_contributions_total       contributions read from ranks
//   syncnorm_relay_answers_total{code}       answers given, by code ("OK",
//                                            "RESOURCE_EXHAUSTED", ...)
//   syncnorm_relay_refusals_total{code}      of them, the relay's own
//                                            refusals (its limits, tokens,
//                                            the message bound, a relay block)
//   syncnorm_relay_blocks_forwarded_total    merged blocks sent to a shard
//   syncnorm_relay_passed_through_total{reason}  contributions sent unmerged,
//                                            by PassReasonName
//   syncnorm_relay_block_rounds              block rounds held now
//   syncnorm_relay_jobs                      (job, shard) pairs known now
//   syncnorm_relay_upstream_calls_total{method}  ReduceOnce, GetJob
//   syncnorm_relay_upstream_retries_total    ReduceOnce resends
//   syncnorm_relay_upstream_failures_total{method,code}  calls that failed
//                                            after their resends
//   syncnorm_relay_open_streams, syncnorm_relay_waiting_calls  against
//                                            --max_streams, --max_waiting_calls
//   syncnorm_relay_held_bytes                what the streams hold: read and
//                                            not answered, answers not written
//   syncnorm_relay_idle_streams_closed_total  --stream_idle_timeout_ms
//   syncnorm_relay_grpc_calls                Reduce and ReduceOnce calls held
//   syncnorm_relay_connections_closed_total{reason}  as the aggregator's
//                                            syncnorm_connections_closed_total
std::vector<prometheus::MetricFamily> RelayFamilies(const RelayLoad& load);

// syncnorm_relay_limit{flag} (each bound's value, 0: none) and
// syncnorm_relay_build_info{version}.
std::vector<prometheus::MetricFamily> RelayConstantFamilies(
    const RelayOptions& options);

// Thread-safe; outlives the gRPC server whose calls it counts.
class RelayMetrics {
 public:
  // Serves GET /metrics on `options.metrics_listen`. UNAVAILABLE naming
  // the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<RelayMetrics>> Start(
      const RelayOptions& options);

  ~RelayMetrics();

  int port() const { return port_; }

  // For ServerBuilder's SetInterceptorCreators (every call but Reduce).
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory() {
    return grpc_.NewInterceptorFactory();
  }
  // What counts the Reduce streams (call_observer.h).
  CallObserverFactory* call_observers() { return &grpc_; }

  // Where RelayFamilies' load comes from; an empty one takes them away.
  // Returns once no scrape uses the previous one.
  using Source = std::function<RelayLoad()>;
  void SetSource(Source source) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit RelayMetrics(const RelayOptions& options);
  std::string Render() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<prometheus::Registry> registry_;
  GrpcMetrics grpc_;
  const std::vector<prometheus::MetricFamily> constant_;

  mutable absl::Mutex mu_;
  Source source_ ABSL_GUARDED_BY(mu_);

  // Last: stopped first, before what it renders goes away.
  std::unique_ptr<MetricsHttpServer> http_;
  int port_ = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_METRICS_H_
