// A manually advanced clock for tests.
#ifndef SYNCNORM_SERVER_DOMAIN_FAKE_CLOCK_H_
#define SYNCNORM_SERVER_DOMAIN_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/clock.h"

namespace syncnorm {

// A Clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  // Starts at `start` (default: the Unix epoch plus one day).
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Moves the clock forward by `d` (which may be zero).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_FAKE_CLOCK_H_
