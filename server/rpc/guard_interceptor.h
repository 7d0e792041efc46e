// What every call tells the ConnectionGuard: its connection, its start and
// its outcome.
#ifndef SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_
#define SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_

#include "grpcpp/support/server_interceptor.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// What ServerBuilder's SetInterceptorCreators takes: an interceptor per
// call that reports the call's start (with its peer) and its end (with its
// CallOutcome) to `guard`. Thread-safe; `guard` must outlive the server.
class GuardInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit GuardInterceptorFactory(ConnectionGuard* guard) : guard_(guard) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  class Interceptor;
  ConnectionGuard* const guard_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_GUARD_INTERCEPTOR_H_
