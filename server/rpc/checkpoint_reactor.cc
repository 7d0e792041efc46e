#include "server/rpc/checkpoint_reactor.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"

namespace syncnorm {

CheckpointReactor::CheckpointReactor(UnaryFinisher* call,
                                     Aggregator* aggregator,
                                     const grpc::ServerContext& context,
                                     const v1::CheckpointRequest& request,
                                     v1::CheckpointInfo* response,
                                     std::shared_ptr<WaitingCalls> waiting)
    : WaitingCallReactor(call, std::move(waiting)), response_(response) {
  // A call without a deadline carries the far future; the aggregator caps
  // the wait (AggregatorOptions::max_checkpoint_wait). The answer is due a
  // little before the caller gives up, so that it gets the reason (which
  // layers lag) rather than a bare DEADLINE_EXCEEDED of its own.
  absl::Time deadline = absl::FromChrono(context.deadline());
  const absl::Duration left = deadline - absl::Now();
  deadline -= std::min(absl::Milliseconds(100), left / 4);
  aggregator->Checkpoint(request.job_id(), request.step(), request.tag(),
                         deadline,
                         [this](const absl::StatusOr<CheckpointMeta>& result) {
                           Answer(result);
                           Unref();
                         });
}

void CheckpointReactor::Answer(const absl::StatusOr<CheckpointMeta>& result) {
  if (!Claim()) return;
  if (result.ok()) CheckpointToProto(*result, *response_);
  Finish(ToGrpcStatus(result.status()));
}

}  // namespace syncnorm
