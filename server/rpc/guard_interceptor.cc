#include "server/rpc/guard_interceptor.h"

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/support/interceptor.h"
#include "server/rpc/call_outcome.h"

namespace syncnorm {

// One call's report to the guard: its connection when it starts, its
// outcome and lifetime when it ends.
class GuardInterceptorFactory::Call final : public CallObserver {
 public:
  Call(ConnectionGuard* guard, const grpc::ServerContextBase& context)
      : guard_(guard),
        start_(absl::Now()),
        connection_(guard_->CallStarted(context.peer())) {}

  void MessageSent() override {
    if (connection_ != nullptr) guard_->MessageAnswered(*connection_);
  }

  void Ended(const CallOutcome::Result& r) override {
    if (connection_ == nullptr) return;
    guard_->CallEnded(*connection_, static_cast<absl::StatusCode>(r.code),
                      r.end - start_);
  }

 private:
  ConnectionGuard* const guard_;
  const absl::Time start_;
  const std::shared_ptr<ConnectionGuard::Connection> connection_;
};

// The same for a call that gRPC intercepts: it creates the interceptor when
// the call starts and deletes it when the call is done. The call is
// reported from the interceptor's first hook on: an asynchronous-API call's
// context is bound to its call (and knows its peer) only after gRPC has
// created its interceptors.
class GuardInterceptorFactory::Interceptor final
    : public grpc::experimental::Interceptor {
 public:
  Interceptor(ConnectionGuard* guard, grpc::experimental::ServerRpcInfo* info)
      : guard_(guard), context_(info->server_context()), outcome_(info) {}

  ~Interceptor() override {
    absl::MutexLock lock(&mu_);
    // A call cancelled before it reached the server runs no hook: it is
    // reported now, when its context is bound, as one cut short at once.
    if (!call_.has_value()) call_.emplace(guard_, *context_);
    if (std::optional<CallOutcome::Result> r = outcome_.Abandon()) {
      call_->Ended(*r);
    }
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    {
      absl::MutexLock lock(&mu_);
      if (!call_.has_value()) call_.emplace(guard_, *context_);
      if (std::optional<CallOutcome::Result> r = outcome_.Observe(methods)) {
        call_->Ended(*r);
      }
    }
    methods->Proceed();
  }

 private:
  ConnectionGuard* const guard_;
  grpc::ServerContextBase* const context_;
  CallOutcome outcome_;
  // A callback-API call's last hook and the destruction of its context
  // (which deletes this) may run on different threads, ordered by gRPC
  // alone: the lock shows ThreadSanitizer that order.
  absl::Mutex mu_;
  // Set by the first hook, the arrival of the call's metadata, which runs
  // before gRPC hands the call to the server: before any later hook.
  std::optional<Call> call_ ABSL_GUARDED_BY(mu_);
};

grpc::experimental::Interceptor*
GuardInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (IsSelfReporting(*info)) return nullptr;
  return new Interceptor(guard_, info);  // gRPC deletes it
}

std::unique_ptr<CallObserver> GuardInterceptorFactory::CallStarted(
    const grpc::ServerContextBase& context, absl::string_view /*method*/,
    grpc::experimental::ServerRpcInfo::Type /*type*/) {
  return std::make_unique<Call>(guard_, context);
}

}  // namespace syncnorm
