#include "server/rpc/stream_set.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "server/domain/limits.h"
#include "server/domain/log.h"
#include "server/rpc/reduce_reactor.h"

namespace syncnorm {
namespace {

struct ReleaseHooks {
  absl::Mutex mu;
  StreamSet::ReleaseHook before ABSL_GUARDED_BY(mu);
  StreamSet::ReleaseHook after ABSL_GUARDED_BY(mu);
};

ReleaseHooks& Hooks() {
  static ReleaseHooks* const hooks = new ReleaseHooks();
  return *hooks;
}

}  // namespace

void StreamSet::SetReleaseHooksForTest(ReleaseHook before, ReleaseHook after) {
  ReleaseHooks& hooks = Hooks();
  absl::MutexLock lock(&hooks.mu);
  hooks.before = std::move(before);
  hooks.after = std::move(after);
}

int StreamSet::held_for_test() const {
  absl::MutexLock lock(&held_mu_);
  return static_cast<int>(held_.size());
}

StreamSet::StreamSet(int max_streams, absl::Duration idle_timeout,
                     const Clock* clock)
    : max_streams_(max_streams), idle_timeout_(idle_timeout), clock_(clock) {
  if (idle_timeout_ > absl::ZeroDuration()) {
    const absl::Duration period =
        std::clamp(idle_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
    sweeper_ =
        std::make_unique<PeriodicThread>(period, [this] { CloseIdle(); });
  }
  releaser_ = std::thread([this] { ReleaseLoop(); });
}

StreamSet::~StreamSet() {
  {
    absl::MutexLock lock(&held_mu_);
    stop_ = true;
  }
  stopping_.Notify();
  releaser_.join();
}

absl::Status StreamSet::Enter(ReduceReactor* stream) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::UnavailableError(
        "the server is shutting down; open the stream on a running server");
  }
  if (max_streams_ > 0 && open_.size() >= static_cast<size_t>(max_streams_)) {
    return LimitExceeded("a new Reduce stream: the open streams", "max_streams",
                         max_streams_);
  }
  open_.insert(stream);
  return absl::OkStatus();
}

void StreamSet::Leave(ReduceReactor* stream) {
  absl::MutexLock lock(&mu_);
  open_.erase(stream);
}

void StreamSet::CloseAll() {
  std::vector<ReduceReactor*> streams;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (ReduceReactor* s : open_) {
      s->Ref();  // kept alive until Close() returns
      streams.push_back(s);
    }
  }
  // Not under mu_: closing may end a stream inline, which removes it.
  for (ReduceReactor* s : streams) {
    s->Close();
    s->Unref();
  }
}

int StreamSet::CloseIdle() {
  std::vector<ReduceReactor*> streams;
  {
    absl::MutexLock lock(&mu_);
    for (ReduceReactor* s : open_) {
      s->Ref();
      streams.push_back(s);
    }
  }
  const absl::Time now = clock_->Now();
  int closed = 0;
  for (ReduceReactor* s : streams) {
    if (s->CloseIfIdle(now, idle_timeout_)) ++closed;
    s->Unref();
  }
  if (closed > 0) {
    LogLine("streams_idle_closed")
        .Add("streams", closed)
        .Add("idle_timeout_ms", absl::ToInt64Milliseconds(idle_timeout_));
  }
  return closed;
}

void StreamSet::Hold(ReduceReactor* stream) {
  absl::MutexLock lock(&held_mu_);
  held_.emplace(stream, tick_);
}

void StreamSet::Unhold(ReduceReactor* stream) {
  absl::MutexLock lock(&held_mu_);
  held_.erase(stream);
}

void StreamSet::ReleaseLoop() {
  std::vector<ReduceReactor*> due;
  while (true) {
    {
      // Asleep while nothing is held; a Hold wakes it (absl::Mutex checks
      // the condition as the holder unlocks).
      absl::MutexLock lock(&held_mu_);
      held_mu_.Await(absl::Condition(this, &StreamSet::HeldOrStopped));
      if (stop_) return;
    }
    if (stopping_.WaitForNotificationWithTimeout(kHoldTick)) return;
    {
      absl::MutexLock lock(&held_mu_);
      ++tick_;
      // Held in tick t, released once the tick is t + 2: a whole tick
      // later.
      for (auto it = held_.begin(); it != held_.end();) {
        if (it->second <= tick_ - 2) {
          // Alive: held, so its answer (and Unhold) has not come yet.
          it->first->Ref();
          due.push_back(it->first);
          held_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    ReleaseHook before, after;
    if (!due.empty()) {
      ReleaseHooks& hooks = Hooks();
      absl::MutexLock lock(&hooks.mu);
      before = hooks.before;
      after = hooks.after;
    }
    if (before) before(*this);
    for (ReduceReactor* s : due) {
      s->ReleaseHeldRead();
      s->Unref();
    }
    if (after) after(*this);
    due.clear();
  }
}

int StreamSet::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(open_.size());
}

}  // namespace syncnorm
