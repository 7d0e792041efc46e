#include "server/grpc_metrics.h"

#include <chrono>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

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

// A call the client cancelled this close to its deadline counts as past
// it. The server's deadline is the client's plus the time the request took
// to arrive (grpc-timeout is relative), so the client's cancellation at its
// own deadline can reach the server a moment before the server's deadline.
constexpr std::chrono::milliseconds kDeadlineSkew{250};

// Go's codes.Code.String(), which go-grpc-prometheus puts in grpc_code.
const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK",          "Canceled",          "Unknown",
      "InvalidArgument", "DeadlineExceeded", "NotFound",
      "AlreadyExists",   "PermissionDenied", "ResourceExhausted",
      "FailedPrecondition", "Aborted",      "OutOfRange",
      "Unimplemented",   "Internal",         "Unavailable",
      "DataLoss",        "Unauthenticated"};
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

// One call's observer. gRPC creates it when the call starts and deletes it
// when the call is done.
//
// The call's outcome is counted when it is over (POST_RECV_CLOSE), not when
// the service sends its status (PRE_SEND_STATUS): only then does gRPC say
// whether that status reached the client. A call gRPC cut short (the
// client cancelled it, its deadline passed, its connection broke, the
// transport's quota cancelled it) may have sent OK or nothing at all; a
// Reduce stream, for one, ends OK when its reads fail.
//
// Only a callback-API call may be asked IsCancelled() there. For a
// sync-API call (server reflection) gRPC runs POST_RECV_CLOSE from inside
// its own check for cancellation, once the call's completion queue is shut
// down; asking IsCancelled() again re-enters that check, which runs this
// hook again, without end (a stack overflow). Such a call counts the
// status its handler sent, which is the client's unless the call was cut
// short while the handler ran.
class GrpcMetrics::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(GrpcMetrics& metrics, ServerRpcInfo* info)
      : metrics_(metrics),
        context_(info->server_context()),
        callback_api_(dynamic_cast<grpc::CallbackServerContext*>(context_) !=
                      nullptr),
        start_(absl::Now()),
        deadline_(context_->deadline()) {
    const absl::string_view full = info->method();  // "/pkg.Service/Method"
    const size_t slash = full.rfind('/');
    labels_ = {
        {"grpc_type", TypeName(info->type())},
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

  // A call that never reached its end (the server stopped first) counts
  // as cut short.
  ~Interceptor() override { Handled(/*cancelled=*/true); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE)) {
      received_->Increment();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      sent_->Increment();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      absl::MutexLock lock(&mu_);
      sent_code_ = methods->GetSendStatus().error_code();
      sent_at_ = absl::Now();
    }
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_CLOSE)) {
      // A callback call's context knows by now whether it was cancelled.
      Handled(callback_api_ && context_->IsCancelled());
    }
    methods->Proceed();
  }

 private:
  // Counts the call's outcome once: the status the service sent, unless
  // `cancelled` (or none was sent): then DEADLINE_EXCEEDED if the deadline
  // had passed (give or take kDeadlineSkew), else CANCELLED. gRPC does not
  // tell the server why else it cut a call (its RESOURCE_EXHAUSTED of the
  // quota, a broken connection).
  void Handled(bool cancelled) {
    grpc::StatusCode code;
    absl::Time end;
    {
      absl::MutexLock lock(&mu_);
      if (handled_) return;
      handled_ = true;
      const bool delivered = sent_code_.has_value() && !cancelled;
      end = delivered ? sent_at_ : absl::Now();
      if (delivered) {
        code = *sent_code_;
      } else if (std::chrono::system_clock::now() + kDeadlineSkew >=
                 deadline_) {
        code = grpc::StatusCode::DEADLINE_EXCEEDED;
      } else {
        code = grpc::StatusCode::CANCELLED;
      }
    }
    prometheus::Labels with_code = labels_;
    with_code.emplace("grpc_code", CodeName(code));
    metrics_.handled_.Add(with_code).Increment();
    metrics_.handling_seconds_.Add(labels_, HandlingBuckets())
        .Observe(absl::ToDoubleSeconds(end - start_));
  }

  GrpcMetrics& metrics_;
  // Valid until the interceptor's destructor runs (the context destroys
  // its interceptors).
  grpc::ServerContextBase* const context_;
  // Whether IsCancelled() may be asked in POST_RECV_CLOSE (see above).
  const bool callback_api_;
  const absl::Time start_;
  const std::chrono::system_clock::time_point deadline_;
  prometheus::Labels labels_;
  prometheus::Counter* received_;
  prometheus::Counter* sent_;

  // Hook points of one call may run at once (a stream's read and write, a
  // status sent while the call is cancelled).
  absl::Mutex mu_;
  std::optional<grpc::StatusCode> sent_code_ ABSL_GUARDED_BY(mu_);
  absl::Time sent_at_ ABSL_GUARDED_BY(mu_);
  bool handled_ ABSL_GUARDED_BY(mu_) = false;
};

class GrpcMetrics::Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(GrpcMetrics& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
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

}  // namespace syncnorm
