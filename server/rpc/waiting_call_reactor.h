// What the service's unary calls that may wait have in common: a ReduceOnce
// waits for its round, a Checkpoint for its step to be committed.
#ifndef SYNCNORM_SERVER_RPC_WAITING_CALL_REACTOR_H_
#define SYNCNORM_SERVER_RPC_WAITING_CALL_REACTOR_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc/async_call.h"
#include "server/rpc/ref_counted_reactor.h"
#include "server/rpc/waiting_calls.h"

namespace syncnorm {

// A unary call that hands its request to the aggregator and finishes with
// its answer, whichever comes first of that answer and a cancellation: a
// cancelled call finishes CANCELLED at once, and the late answer is then
// dropped.
//
// Lifetime: deletes itself after OnDone and the aggregator callback have
// both happened, and then leaves `waiting`: until then the call holds
// memory (gRPC's request, or what the aggregator keeps of it). Thread-safe.
class WaitingCallReactor : public RefCountedReactor<UnaryReactor> {
 public:
  void OnCancel() final;
  void OnDone() final { Unref(); }

 protected:
  // `waiting` (null: not counted) was entered for this call. The reactor
  // starts with gRPC's reference and one for the aggregator callback, which
  // the subclass releases (Unref) once its answer is handled.
  // `call` is the call it finishes.
  WaitingCallReactor(UnaryFinisher* call,
                     std::shared_ptr<WaitingCalls> waiting);
  ~WaitingCallReactor() override;

  // True once: for the aggregator's answer, which then finishes the call,
  // or for OnCancel. False for the one that comes second.
  bool Claim() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::shared_ptr<WaitingCalls> waiting_;

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_WAITING_CALL_REACTOR_H_
