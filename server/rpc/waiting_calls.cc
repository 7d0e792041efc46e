#include "server/rpc/waiting_calls.h"

#include "absl/strings/str_cat.h"
#include "server/domain/limits.h"

namespace syncnorm {

absl::Status WaitingCalls::Enter(absl::string_view what) {
  int calls = calls_.load(std::memory_order_acquire);
  // Never above the limit, not even for a moment: a call refused here must
  // not make a concurrent one be refused too.
  do {
    if (max_calls_ > 0 && calls >= max_calls_) {
      return LimitExceeded(
          absl::StrCat(what,
                       ": the number of ReduceOnce and Checkpoint calls in "
                       "progress on this server"),
          "max_waiting_calls", max_calls_);
    }
  } while (!calls_.compare_exchange_weak(calls, calls + 1,
                                         std::memory_order_acq_rel));
  return absl::OkStatus();
}

}  // namespace syncnorm
