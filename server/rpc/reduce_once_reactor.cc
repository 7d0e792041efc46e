#include "server/rpc/reduce_once_reactor.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"

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
  absl::Status status = outcome.status;
  if (!outcome.missing_ranks.empty() &&
      status.message().find("ranks [") == absl::string_view::npos) {
    status = absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (missing ranks [",
                     absl::StrJoin(outcome.missing_ranks, ", "), "])"));
  }
  Finish(ToGrpcStatus(status));
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
