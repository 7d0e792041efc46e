#include "server/rpc/call_outcome.h"

#include "absl/time/clock.h"
#include "grpcpp/support/interceptor.h"

namespace syncnorm {

using grpc::experimental::InterceptionHookPoints;

CallOutcome::CallOutcome(grpc::experimental::ServerRpcInfo* info)
    : context_(info->server_context()),
      callback_api_(dynamic_cast<grpc::CallbackServerContext*>(context_) !=
                    nullptr),
      deadline_(context_->deadline()) {}

CallOutcome::CallOutcome(grpc::CallbackServerContext* context)
    : context_(context), callback_api_(true), deadline_(context->deadline()) {}

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
    // A callback call's context knows by now whether it was cancelled.
    return Decide(callback_api_ && context_->IsCancelled());
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
  const bool past_deadline =
      std::chrono::system_clock::now() + kDeadlineSkew >= deadline_;
  return Result{past_deadline ? grpc::StatusCode::DEADLINE_EXCEEDED
                              : grpc::StatusCode::CANCELLED,
                absl::Now()};
}

}  // namespace syncnorm
