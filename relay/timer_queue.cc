#include "relay/timer_queue.h"

#include <utility>

namespace syncnorm {

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) {}

TimerQueue::~TimerQueue() { Stop(); }

void TimerQueue::At(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  due_.emplace(when, std::move(fn));
}

void TimerQueue::Stop() {
  std::multimap<absl::Time, std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(due_);
  }
  if (thread_.joinable()) thread_.join();
  // `dropped` goes here, outside the lock: its callbacks' captures may
  // take locks of their own when destroyed.
}

void TimerQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (due_.empty()) {
      mu_.Await(absl::Condition(
          +[](TimerQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return q->stopping_ || !q->due_.empty();
          },
          this));
      continue;
    }
    const absl::Time first = due_.begin()->first;
    if (absl::Now() < first) {
      // Wakes early when a sooner callback is added or on Stop.
      std::pair<TimerQueue*, size_t> seen(this, due_.size());
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](std::pair<TimerQueue*, size_t>* a)
                                     ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                       return a->first->stopping_ ||
                                              a->first->due_.size() !=
                                                  a->second;
                                     },
                                &seen),
                            first);
      continue;
    }
    std::function<void()> fn = std::move(due_.begin()->second);
    due_.erase(due_.begin());
    mu_.Unlock();
    fn();
    fn = nullptr;
    mu_.Lock();
  }
}

}  // namespace syncnorm
