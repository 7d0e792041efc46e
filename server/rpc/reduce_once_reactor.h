// The server side of one ReduceOnce call.
#ifndef SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_
#define SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "server/domain/aggregator.h"
#include "server/domain/contribution.h"
#include "server/rpc/waiting_calls.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Hands one contribution to the Aggregator and finishes the call with its
// round's result, or with the round's failure as the RPC status (message
// and missing ranks included). A cancelled call finishes CANCELLED at once;
// the late outcome is then dropped.
//
// Lifetime: deletes itself after OnDone and the aggregator callback have
// both happened, and then leaves `waiting`: until then the call holds
// memory (gRPC's request, or its contribution in a round). Thread-safe.
class ReduceOnceReactor final : public grpc::ServerUnaryReactor {
 public:
  // Starts the contribution. `response` is owned by gRPC and valid until
  // Finish; `aggregator` must outlive the callback. `waiting` (null: not
  // counted) was entered for this call.
  ReduceOnceReactor(Aggregator* aggregator, v1::Contribution request,
                    v1::RoundResult* response,
                    std::shared_ptr<WaitingCalls> waiting = nullptr);

  void OnCancel() override;
  void OnDone() override;

 private:
  ~ReduceOnceReactor() override;

  void Answer(const Contribution& key, const RoundOutcome& outcome)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unref();

  v1::RoundResult* const response_;
  const std::shared_ptr<WaitingCalls> waiting_;
  // Owners: gRPC until OnDone, the outstanding aggregator callback, and
  // OnCancel while it runs.
  std::atomic<int> refs_{2};

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REDUCE_ONCE_REACTOR_H_
