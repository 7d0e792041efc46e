// What every call tells the ConnectionGuard: its connection, its start and
// its outcome.
#ifndef SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_
#define SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// What ServerBuilder's SetInterceptorCreators takes: an interceptor per
// call that reports the call's start (with its peer) and its end (with its
// CallOutcome) to `guard`; none for calls of kSelfReportingMethod, which
// report the same through CallStarted's observer. Thread-safe; `guard`
// must outlive the server.
class GuardInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface,
      public CallObserverFactory {
 public:
  explicit GuardInterceptorFactory(ConnectionGuard* guard) : guard_(guard) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

  std::unique_ptr<CallObserver> CallStarted(
      const grpc::ServerContextBase& context, absl::string_view method,
      grpc::experimental::ServerRpcInfo::Type type) override;

 private:
  class Call;
  class Interceptor;
  ConnectionGuard* const guard_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_
