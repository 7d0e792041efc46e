// The gRPC server metrics of go-grpc-prometheus, from a server interceptor.
#ifndef SYNCNORM_SERVER_METRICS_GRPC_METRICS_H_
#define SYNCNORM_SERVER_METRICS_GRPC_METRICS_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/rpc/call_observer.h"

namespace syncnorm {

// Registers, with go-grpc-prometheus's names, labels and buckets, so that
// its dashboards and alerts apply unchanged:
//   grpc_server_started_total{grpc_type,grpc_service,grpc_method}
//   grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}
//   grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}
//       (histogram, buckets .005 .. 10 s)
//   grpc_server_msg_received_total{...}, grpc_server_msg_sent_total{...}
// grpc_type is unary, client_stream, server_stream or bidi_stream;
// grpc_service e.g. syncnorm.v1.Aggregator; grpc_method e.g. Reduce;
// grpc_code the status name as Go spells it (OK, DeadlineExceeded, ...).
// grpc_code is the status the client got as far as the server can tell
// (see CallOutcome): the one the service sent when it reached the client;
// DeadlineExceeded or Canceled for a call gRPC cut short. A call's handling
// time runs from its start to the status it sends (to its end, when cut
// short).
//
// NewInterceptorFactory() is what ServerBuilder's SetInterceptorCreators
// takes; its interceptors skip calls of kSelfReportingMethod, which report
// themselves through CallStarted (call_observer.h) and are counted alike.
// Thread-safe; `registry` and this object must outlive the server.
class GrpcMetrics : public CallObserverFactory {
 public:
  explicit GrpcMetrics(prometheus::Registry& registry);

  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

  std::unique_ptr<CallObserver> CallStarted(
      const grpc::ServerContextBase& context, absl::string_view method,
      grpc::experimental::ServerRpcInfo::Type type) override;

 private:
  class Call;
  class Interceptor;
  class Factory;

  // Owned by the registry.
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& handling_seconds_;
  prometheus::Family<prometheus::Counter>& msg_received_;
  prometheus::Family<prometheus::Counter>& msg_sent_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_GRPC_METRICS_H_
