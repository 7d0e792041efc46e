#include "server/rpc/guard_interceptor.h"

#include <memory>
#include <optional>

#include "absl/time/clock.h"
#include "grpcpp/support/interceptor.h"
#include "server/rpc/call_outcome.h"

namespace syncnorm {

// One call's report: gRPC creates it when the call starts and deletes it
// when the call is done.
class GuardInterceptorFactory::Interceptor final
    : public grpc::experimental::Interceptor {
 public:
  Interceptor(ConnectionGuard* guard, grpc::experimental::ServerRpcInfo* info)
      : guard_(guard),
        outcome_(info),
        start_(absl::Now()),
        connection_(guard_->CallStarted(info->server_context()->peer())) {}

  ~Interceptor() override {
    if (std::optional<CallOutcome::Result> r = outcome_.Abandon()) Ended(*r);
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (std::optional<CallOutcome::Result> r = outcome_.Observe(methods)) {
      Ended(*r);
    }
    methods->Proceed();
  }

 private:
  void Ended(const CallOutcome::Result& r) {
    if (connection_ == nullptr) return;
    guard_->CallEnded(*connection_, static_cast<absl::StatusCode>(r.code),
                      r.end - start_);
  }

  ConnectionGuard* const guard_;
  CallOutcome outcome_;
  const absl::Time start_;
  const std::shared_ptr<ConnectionGuard::Connection> connection_;
};

grpc::experimental::Interceptor*
GuardInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new Interceptor(guard_, info);  // gRPC deletes it
}

}  // namespace syncnorm
