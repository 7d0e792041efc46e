// The server side of one Checkpoint call, which may wait for its step.
#ifndef SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_
#define SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "server/domain/aggregator.h"
#include "server/rpc/waiting_calls.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Asks the Aggregator for the checkpoint, bounded by the call's deadline,
// and finishes the call with it or its error; no thread waits meanwhile. A
// cancelled call finishes CANCELLED at once; the late answer is dropped.
//
// Lifetime: deletes itself after OnDone and the aggregator callback have
// both happened, and then leaves `waiting`: until then the call holds
// memory (gRPC's request, or the aggregator's pending checkpoint with its
// tag). Thread-safe.
class CheckpointReactor final : public grpc::ServerUnaryReactor {
 public:
  // `response` is owned by gRPC and valid until Finish; `aggregator` must
  // outlive the callback. `waiting` (null: not counted) was entered for
  // this call.
  CheckpointReactor(Aggregator* aggregator,
                    grpc::CallbackServerContext* context,
                    const v1::CheckpointRequest& request,
                    v1::CheckpointInfo* response,
                    std::shared_ptr<WaitingCalls> waiting = nullptr);

  void OnCancel() override;
  void OnDone() override;

 private:
  ~CheckpointReactor() override;

  void Answer(const absl::StatusOr<CheckpointMeta>& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unref();

  v1::CheckpointInfo* const response_;
  const std::shared_ptr<WaitingCalls> waiting_;
  // Owners: gRPC until OnDone, the outstanding aggregator callback, and
  // OnCancel while it runs.
  std::atomic<int> refs_{2};

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_
