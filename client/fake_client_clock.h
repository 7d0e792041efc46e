// A manually advanced ClientClock for tests.
#ifndef SYNCNORM_CLIENT_FAKE_CLIENT_CLOCK_H_
#define SYNCNORM_CLIENT_FAKE_CLIENT_CLOCK_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client_clock.h"

namespace syncnorm {

// A ClientClock whose time moves only by Advance() and by SleepFor(), which
// returns at once after moving the clock by the duration slept (and records
// it). Waits with a deadline notice an Advance() within about a millisecond
// of real time. Thread-safe.
class FakeClientClock final : public ClientClock {
 public:
  // Starts at `start` (default: the Unix epoch plus one day).
  explicit FakeClientClock(absl::Time start = absl::UnixEpoch() +
                                              absl::Hours(24))
      : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  void SleepFor(absl::Duration d) const override {
    absl::MutexLock lock(&mu_);
    sleeps_.push_back(d);
    if (d > absl::ZeroDuration()) now_ += d;
  }

  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (deadline == absl::InfiniteFuture()) {
      mu.Await(condition);
      return true;
    }
    // Real-time polls: this clock's time moves without signalling `mu`.
    while (!mu.AwaitWithTimeout(condition, absl::Milliseconds(1))) {
      if (Now() >= deadline) return condition.Eval();
    }
    return true;
  }

  // Sleeps (as SleepFor) until `deadline`, whatever the channel's state.
  void AwaitReady(grpc::Channel&, absl::Time deadline) const override {
    SleepFor(deadline - Now());
  }

  // Moves the clock forward by `d` (which may be zero).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

  // Every SleepFor duration so far, in call order.
  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_FAKE_CLIENT_CLOCK_H_
