// One thread that runs callbacks at given times: the relay's block waits
// and upstream retry backoffs, without a thread per wait.
#ifndef SYNCNORM_RELAY_TIMER_QUEUE_H_
#define SYNCNORM_RELAY_TIMER_QUEUE_H_

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace syncnorm {

// Runs each callback once, on its own thread, at or soon after its time,
// in time order. Thread-safe.
class TimerQueue {
 public:
  TimerQueue();
  // Stop().
  ~TimerQueue();

  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` at `when` (at once when past). After Stop, drops it.
  void At(absl::Time when, std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for a running callback, drops the others and joins the thread.
  // Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::multimap<absl::Time, std::function<void()>> due_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Last: started once the fields above exist.
  std::thread thread_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_TIMER_QUEUE_H_
