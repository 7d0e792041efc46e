#include "server/reduce_reactor.h"

#include <utility>

#include "server/proto_convert.h"

namespace syncnorm {

// Invariants: gRPC's Start*/Finish are never called under mu_ (a reaction
// may run inline); a write is started only by the party that set writing_,
// and Finish only when !writing_, so no write is ever started after Finish.

ReduceReactor::ReduceReactor(Aggregator* aggregator) : aggregator_(aggregator) {
  StartRead(&request_);
}

void ReduceReactor::OnReadDone(bool ok) {
  if (!ok) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      finish = TakeFinish();
    }
    if (finish.has_value()) Finish(*std::move(finish));
    return;
  }
  Contribution c = ContributionFromProto(std::move(request_));
  request_.Clear();
  {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  refs_.fetch_add(1, std::memory_order_relaxed);
  // Safe even after Finish: this reaction holds the call open until it
  // returns, and a read on a finished call just fails.
  StartRead(&request_);
  Contribution key;
  key.job_id = c.job_id;
  key.layer = c.layer;
  key.step = c.step;
  key.phase = c.phase;
  aggregator_->Contribute(
      std::move(c), [this, key = std::move(key)](const RoundOutcome& outcome) {
        Answer(key, outcome);
        Unref();
      });
}

void ReduceReactor::Answer(const Contribution& key,
                           const RoundOutcome& outcome) {
  const v1::RoundResult* next = nullptr;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    --pending_;
    if (!cancelled_ && !finished_) {
      queue_.emplace_back();
      RoundResultToProto(key, outcome, queue_.back());
      if (!writing_) {
        writing_ = true;
        next = &queue_.front();
      }
    }
    finish = TakeFinish();
  }
  if (next != nullptr) StartWrite(next);
  if (finish.has_value()) Finish(*std::move(finish));
}

void ReduceReactor::OnWriteDone(bool ok) {
  const v1::RoundResult* next = nullptr;
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (!ok) cancelled_ = true;  // the stream is broken
    if (cancelled_) queue_.clear();
    if (queue_.empty()) {
      writing_ = false;
      finish = TakeFinish();
    } else {
      next = &queue_.front();  // deque references survive push_back
    }
  }
  if (next != nullptr) StartWrite(next);
  if (finish.has_value()) Finish(*std::move(finish));
}

void ReduceReactor::OnCancel() {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    finish = TakeFinish();
  }
  if (finish.has_value()) Finish(*std::move(finish));
}

std::optional<grpc::Status> ReduceReactor::TakeFinish() {
  if (finished_ || writing_) return std::nullopt;
  if (cancelled_) {
    finished_ = true;
    return grpc::Status::CANCELLED;
  }
  if (reads_done_ && pending_ == 0 && queue_.empty()) {
    finished_ = true;
    return grpc::Status::OK;
  }
  return std::nullopt;
}

void ReduceReactor::OnDone() { Unref(); }

void ReduceReactor::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace syncnorm
