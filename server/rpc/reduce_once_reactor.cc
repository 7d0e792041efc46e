#include "server/rpc/reduce_once_reactor.h"

#include <string>
#include <utility>

#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"
#include "wire/round_error.h"

namespace syncnorm {

ReduceOnceReactor::ReduceOnceReactor(UnaryFinisher* call,
                                     Aggregator* aggregator, Contribution c,
                                     v1::RoundResult* response,
                                     std::shared_ptr<WaitingCalls> waiting)
    : WaitingCallReactor(call, std::move(waiting)), response_(response) {
  Contribution key;
  key.job_id = c.job_id;
  key.layer = c.layer;
  key.step = c.step;
  key.phase = c.phase;
  key.backward = c.backward;
  aggregator->Contribute(
      std::move(c), [this, key = std::move(key)](const RoundOutcome& outcome) {
        Answer(key, outcome);
        Unref();
      });
}

void ReduceOnceReactor::Answer(const Contribution& key,
                               const RoundOutcome& outcome) {
  if (!Claim()) return;
  if (outcome.status.ok()) {
    RoundResultToProto(key, outcome, *response_);
    Finish(grpc::Status::OK);
    return;
  }
  Finish(ToGrpcStatus(WithMissingRanks(outcome.status, outcome.missing_ranks)));
}

}  // namespace syncnorm
