// The admission of the unary calls of a service that may wait (a ReduceOnce
// for its round, a Checkpoint for its step to be committed): their number
// (--max_waiting_calls).
#ifndef SYNCNORM_SERVER_RPC_WAITING_CALLS_H_
#define SYNCNORM_SERVER_RPC_WAITING_CALLS_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace syncnorm {

// An admission counter (the shape in server/domain/limits.h), without a
// shutdown state of its own. Thread-safe.
class WaitingCalls {
 public:
  // max_calls <= 0: no limit.
  explicit WaitingCalls(int max_calls) : max_calls_(max_calls) {}

  // Admits a call before anything is done with it: OK (call Leave() once
  // gRPC is done with the call), or RESOURCE_EXHAUSTED naming
  // --max_waiting_calls and its value when that many are in progress.
  // `what` names the call, e.g. "a ReduceOnce call".
  absl::Status Enter(absl::string_view what);
  // REQUIRES: a matching Enter() returned OK.
  void Leave() { calls_.fetch_sub(1, std::memory_order_acq_rel); }

  // Calls in progress now.
  int size() const { return calls_.load(std::memory_order_acquire); }

 private:
  const int max_calls_;
  std::atomic<int> calls_{0};
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_WAITING_CALLS_H_
