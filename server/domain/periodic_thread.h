// A chore done every so often on a thread of its own: the aggregator's
// reaper of overdue rounds, the service's sweeper of idle streams, the
// reload of the tokens file, the heap trimmer.
#ifndef SYNCNORM_SERVER_DOMAIN_PERIODIC_THREAD_H_
#define SYNCNORM_SERVER_DOMAIN_PERIODIC_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace syncnorm {

// Calls `tick` once `period` has passed, then `period` after each call
// returns, on a thread it starts, until it is destroyed. Thread-safe.
class PeriodicThread {
 public:
  // Starts the thread. `tick` may use whatever outlives this object.
  // REQUIRES: period > 0.
  PeriodicThread(absl::Duration period, std::function<void()> tick);
  // Waits for a call of `tick` in progress, if any, and joins the thread;
  // no call starts afterwards. REQUIRES: not called from `tick`.
  ~PeriodicThread();

  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const absl::Duration period_;
  const std::function<void()> tick_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_PERIODIC_THREAD_H_
