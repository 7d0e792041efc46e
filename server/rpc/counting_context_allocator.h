// The server contexts of callback-API calls, counted for the
// ConnectionGuard.
#ifndef SYNCNORM_SERVER_RPC_COUNTING_CONTEXT_ALLOCATOR_H_
#define SYNCNORM_SERVER_RPC_COUNTING_CONTEXT_ALLOCATOR_H_

#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server_context.h"
#include "server/rpc/connection_guard.h"

namespace syncnorm {

// What ServerBuilder's SetContextAllocator takes. gRPC makes a context for
// each callback-API call (the service's, health, an unknown method's) as
// the call arrives, before any of its work is queued, and releases it once
// the call is done: between the two, the call and all gRPC keeps for it
// are held. So ConnectionGuard::calls_held() counts what a flood of
// requests piles up, also while the calls wait for a thread. Thread-safe;
// `guard` must outlive the server.
class CountingContextAllocator final : public grpc::ContextAllocator {
 public:
  explicit CountingContextAllocator(ConnectionGuard* guard) : guard_(guard) {}

  // gRPC's interface: it owns each context until it hands it back.
  grpc::CallbackServerContext* NewCallbackServerContext() override {
    guard_->CallArrived();
    return new grpc::CallbackServerContext();
  }
  grpc::GenericCallbackServerContext* NewGenericCallbackServerContext()
      override {
    guard_->CallArrived();
    return new grpc::GenericCallbackServerContext();
  }
  void Release(grpc::CallbackServerContext* context) override {
    delete context;
    guard_->CallReleased();
  }
  void Release(grpc::GenericCallbackServerContext* context) override {
    delete context;
    guard_->CallReleased();
  }

 private:
  ConnectionGuard* const guard_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_COUNTING_CONTEXT_ALLOCATOR_H_
