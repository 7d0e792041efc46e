// For tests: records the outcomes the Aggregator delivers to callbacks.
#ifndef SYNCNORM_SERVER_DOMAIN_OUTCOME_RECORDER_H_
#define SYNCNORM_SERVER_DOMAIN_OUTCOME_RECORDER_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/domain/contribution.h"

namespace syncnorm {

// n slots; Slot(i) is a callback that counts its calls and keeps the last
// outcome it got. Thread-safe.
class OutcomeRecorder {
 public:
  explicit OutcomeRecorder(int n) : calls_(n, 0), got_(n) {}

  RoundCallback Slot(int i) {
    return [this, i](const RoundOutcome& o) {
      absl::MutexLock lock(&mu_);
      ++calls_[i];
      got_[i] = o;
    };
  }
  int calls(int i) const {
    absl::MutexLock lock(&mu_);
    return calls_[i];
  }
  RoundOutcome get(int i) const {
    absl::MutexLock lock(&mu_);
    return got_[i];
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<RoundOutcome> got_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_OUTCOME_RECORDER_H_
