#include "server/reduce_once_reactor.h"

#include <string>
#include <utility>

#include "server/grpc_status.h"
#include "server/proto_convert.h"
#include "wire/round_error.h"

namespace syncnorm {

ReduceOnceReactor::ReduceOnceReactor(Aggregator* aggregator,
                                     v1::Contribution request,
                                     v1::RoundResult* response,
                                     std::shared_ptr<WaitingCalls> waiting)
    : response_(response), waiting_(std::move(waiting)) {
  Contribution c = ContributionFromProto(std::move(request));
  Contribution key;
  key.job_id = c.job_id;
  key.layer = c.layer;
  key.step = c.step;
  key.phase = c.phase;
  aggregator->Contribute(
      std::move(c), [this, key = std::move(key)](const RoundOutcome& outcome) {
        Answer(key, outcome);
        Unref();
      });
}

void ReduceOnceReactor::Answer(const Contribution& key,
                               const RoundOutcome& outcome) {
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
  }
  if (outcome.status.ok()) {
    RoundResultToProto(key, outcome, *response_);
    Finish(grpc::Status::OK);
    return;
  }
  Finish(ToGrpcStatus(WithMissingRanks(outcome.status, outcome.missing_ranks)));
}

// Holds a reference while it runs, as ReduceReactor::OnCancel does.
void ReduceOnceReactor::OnCancel() {
  refs_.fetch_add(1, std::memory_order_relaxed);
  bool finish = false;
  {
    absl::MutexLock lock(&mu_);
    finish = !finished_;
    finished_ = true;
  }
  if (finish) Finish(grpc::Status::CANCELLED);
  Unref();
}

ReduceOnceReactor::~ReduceOnceReactor() {
  if (waiting_ != nullptr) waiting_->Leave();
}

void ReduceOnceReactor::OnDone() { Unref(); }

void ReduceOnceReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace syncnorm
