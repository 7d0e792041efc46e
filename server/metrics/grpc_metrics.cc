#include "server/metrics/grpc_metrics.h"

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/call_outcome.h"

namespace syncnorm {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

const char* TypeName(ServerRpcInfo::Type type) {
  switch (type) {
    case ServerRpcInfo::Type::UNARY:
      return "unary";
    case ServerRpcInfo::Type::CLIENT_STREAMING:
      return "client_stream";
    case ServerRpcInfo::Type::SERVER_STREAMING:
      return "server_stream";
    case ServerRpcInfo::Type::BIDI_STREAMING:
      return "bidi_stream";
  }
  return "unknown";
}

// Go's codes.Code.String(), which go-grpc-prometheus puts in grpc_code.
const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "Canceled",
                                           "Unknown",
                                           "InvalidArgument",
                                           "DeadlineExceeded",
                                           "NotFound",
                                           "AlreadyExists",
                                           "PermissionDenied",
                                           "ResourceExhausted",
                                           "FailedPrecondition",
                                           "Aborted",
                                           "OutOfRange",
                                           "Unimplemented",
                                           "Internal",
                                           "Unavailable",
                                           "DataLoss",
                                           "Unauthenticated"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "Unknown";
}

// go-grpc-prometheus's DefBuckets (Prometheus's defaults).
const prometheus::Histogram::BucketBoundaries& HandlingBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *buckets;
}

}  // namespace

// One call's metrics: counted started when it is made, then each message,
// then its outcome (CallOutcome) when it is over, not when the service sends
// its status: only then does gRPC say whether that status reached the
// client.
class GrpcMetrics::Call final : public CallObserver {
 public:
  Call(GrpcMetrics& metrics, absl::string_view full,
       ServerRpcInfo::Type type)  // full: "/pkg.Service/Method"
      : metrics_(metrics), start_(absl::Now()) {
    const size_t slash = full.rfind('/');
    labels_ = {{"grpc_type", TypeName(type)},
               {"grpc_service",
                std::string(slash == absl::string_view::npos || slash == 0
                                ? full
                                : full.substr(1, slash - 1))},
               {"grpc_method", std::string(slash == absl::string_view::npos
                                               ? full
                                               : full.substr(slash + 1))}};
    metrics_.started_.Add(labels_).Increment();
    // Looked up once: Family::Add takes the family's lock.
    received_ = &metrics_.msg_received_.Add(labels_);
    sent_ = &metrics_.msg_sent_.Add(labels_);
  }

  void MessageReceived() override { received_->Increment(); }
  void MessageSent() override { sent_->Increment(); }

  // Counts the call's outcome; its handling time runs from its start to
  // the status it sent (to its end, when cut short).
  void Ended(const CallOutcome::Result& r) override {
    prometheus::Labels with_code = labels_;
    with_code.emplace("grpc_code", CodeName(r.code));
    metrics_.handled_.Add(with_code).Increment();
    metrics_.handling_seconds_.Add(labels_, HandlingBuckets())
        .Observe(absl::ToDoubleSeconds(r.end - start_));
  }

 private:
  GrpcMetrics& metrics_;
  const absl::Time start_;
  prometheus::Labels labels_;
  prometheus::Counter* received_;
  prometheus::Counter* sent_;
};

// The same for a call that gRPC intercepts: it creates the interceptor when
// the call starts and deletes it when the call is done.
class GrpcMetrics::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(GrpcMetrics& metrics, ServerRpcInfo* info)
      : outcome_(info),
        call_(metrics, info->method() != nullptr ? info->method() : "",
              info->type()) {}

  // A call that never reached its end (the server stopped first) counts
  // as cut short.
  ~Interceptor() override {
    if (std::optional<CallOutcome::Result> r = outcome_.Abandon()) {
      call_.Ended(*r);
    }
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    // gRPC runs this hook for a stream's failed last read too (its end,
    // no message): go-grpc-prometheus counts only messages.
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() != nullptr) {
      call_.MessageReceived();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      call_.MessageSent();
    }
    if (std::optional<CallOutcome::Result> r = outcome_.Observe(methods)) {
      call_.Ended(*r);
    }
    methods->Proceed();
  }

 private:
  CallOutcome outcome_;
  Call call_;
};

class GrpcMetrics::Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(GrpcMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
    // A call of kSelfReportingMethod reports through CallStarted.
    if (IsSelfReporting(*info)) return nullptr;
    return new Interceptor(metrics_, info);  // gRPC deletes it
  }

 private:
  GrpcMetrics& metrics_;
};

GrpcMetrics::GrpcMetrics(prometheus::Registry& registry)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("Total number of RPCs started on the server.")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("Total number of RPCs completed on the server, "
                         "regardless of success or failure.")
                   .Register(registry)),
      handling_seconds_(prometheus::BuildHistogram()
                            .Name("grpc_server_handling_seconds")
                            .Help("Histogram of response latency (seconds) of "
                                  "gRPC that had been application-level "
                                  "handled by the server.")
                            .Register(registry)),
      msg_received_(prometheus::BuildCounter()
                        .Name("grpc_server_msg_received_total")
                        .Help("Total number of RPC stream messages received "
                              "on the server.")
                        .Register(registry)),
      msg_sent_(prometheus::BuildCounter()
                    .Name("grpc_server_msg_sent_total")
                    .Help("Total number of gRPC stream messages sent by the "
                          "server.")
                    .Register(registry)) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
GrpcMetrics::NewInterceptorFactory() {
  return std::make_unique<Factory>(*this);
}

std::unique_ptr<CallObserver> GrpcMetrics::CallStarted(
    const grpc::ServerContextBase& /*context*/, absl::string_view method,
    ServerRpcInfo::Type type) {
  return std::make_unique<Call>(*this, method, type);
}

}  // namespace syncnorm
