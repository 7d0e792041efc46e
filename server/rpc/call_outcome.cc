#include "server/rpc/call_outcome.h"

#include "absl/time/clock.h"
#include "grpcpp/support/interceptor.h"

namespace syncnorm {

using grpc::experimental::InterceptionHookPoints;

CallOutcome::CallOutcome(grpc::experimental::ServerRpcInfo* info)
    : context_(info->server_context()),
      knows_cancellation_(
          dynamic_cast<grpc::CallbackServerContext*>(context_) != nullptr ||
          dynamic_cast<LoopServerContext*>(context_) != nullptr) {}

CallOutcome::CallOutcome(grpc::ServerContextBase* context)
    : context_(context), knows_cancellation_(true) {}

void CallOutcome::StatusSent(grpc::StatusCode code) {
  absl::MutexLock lock(&mu_);
  sent_code_ = code;
  sent_at_ = absl::Now();
}

std::optional<CallOutcome::Result> CallOutcome::Done() {
  return Decide(context_->IsCancelled());
}

std::optional<CallOutcome::Result> CallOutcome::Observe(
    grpc::experimental::InterceptorBatchMethods* methods) {
  if (methods->QueryInterceptionHookPoint(
          InterceptionHookPoints::PRE_SEND_STATUS)) {
    StatusSent(methods->GetSendStatus().error_code());
  }
  if (methods->QueryInterceptionHookPoint(
          InterceptionHookPoints::POST_RECV_CLOSE)) {
    // Such a call's context knows by now whether it was cancelled.
    return Decide(knows_cancellation_ && context_->IsCancelled());
  }
  return std::nullopt;
}

std::optional<CallOutcome::Result> CallOutcome::Abandon() {
  return Decide(/*cancelled=*/true);
}

std::optional<CallOutcome::Result> CallOutcome::Decide(bool cancelled) {
  absl::MutexLock lock(&mu_);
  if (decided_) return std::nullopt;
  decided_ = true;
  if (sent_code_.has_value() && !cancelled)
    return Result{*sent_code_, sent_at_};
  // Read now: an asynchronous-API call's context is not yet bound to its
  // call when gRPC creates its interceptors.
  const bool past_deadline =
      std::chrono::system_clock::now() + kDeadlineSkew >= context_->deadline();
  return Result{past_deadline ? grpc::StatusCode::DEADLINE_EXCEEDED
                              : grpc::StatusCode::CANCELLED,
                absl::Now()};
}

}  // namespace syncnorm
