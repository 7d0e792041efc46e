// The server side of one Checkpoint call, which may wait for its step.
#ifndef SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_
#define SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_

#include <memory>

#include "grpcpp/server_context.h"
#include "server/domain/aggregator.h"
#include "server/rpc/waiting_call_reactor.h"
#include "server/rpc/waiting_calls.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Asks the Aggregator for the checkpoint, bounded by the call's deadline,
// and finishes the call with it or its error; no thread waits meanwhile.
// Cancellation and lifetime: see WaitingCallReactor (what it holds
// meanwhile is the aggregator's pending checkpoint with its tag).
// Thread-safe.
class CheckpointReactor final : public WaitingCallReactor {
 public:
  // `call` finishes it; `response` is the call's and valid until Finish;
  // `aggregator` must outlive the callback. `waiting` (null: not counted)
  // was entered for this call.
  CheckpointReactor(UnaryFinisher* call, Aggregator* aggregator,
                    const grpc::ServerContext& context,
                    const v1::CheckpointRequest& request,
                    v1::CheckpointInfo* response,
                    std::shared_ptr<WaitingCalls> waiting = nullptr);

 private:
  ~CheckpointReactor() override = default;

  void Answer(const absl::StatusOr<CheckpointMeta>& result);

  v1::CheckpointInfo* const response_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_CHECKPOINT_REACTOR_H_
