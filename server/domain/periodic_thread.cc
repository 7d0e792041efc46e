#include "server/domain/periodic_thread.h"

#include <utility>

namespace syncnorm {

PeriodicThread::PeriodicThread(absl::Duration period,
                               std::function<void()> tick)
    : period_(period), tick_(std::move(tick)), thread_([this] { Loop(); }) {}

PeriodicThread::~PeriodicThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PeriodicThread::Loop() {
  mu_.Lock();
  // The wait ends early when stop_ is set, so destruction does not wait out
  // a period.
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) {
    mu_.Unlock();
    tick_();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace syncnorm
