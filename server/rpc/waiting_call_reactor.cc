#include "server/rpc/waiting_call_reactor.h"

#include <utility>

namespace syncnorm {

WaitingCallReactor::WaitingCallReactor(UnaryFinisher* call,
                                       std::shared_ptr<WaitingCalls> waiting)
    : RefCountedReactor(2, call), waiting_(std::move(waiting)) {}

WaitingCallReactor::~WaitingCallReactor() {
  if (waiting_ != nullptr) waiting_->Leave();
}

bool WaitingCallReactor::Claim() {
  absl::MutexLock lock(&mu_);
  if (finished_) return false;
  finished_ = true;
  return true;
}

// Holds a reference while it runs, as ReduceReactor::OnCancel does.
void WaitingCallReactor::OnCancel() {
  Ref();
  if (Claim()) Finish(grpc::Status::CANCELLED);
  Unref();
}

}  // namespace syncnorm
