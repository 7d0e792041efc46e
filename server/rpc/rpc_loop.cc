#include "server/rpc/rpc_loop.h"

#include <pthread.h>
#include <time.h>

#include <deque>
#include <utility>

#include "server/rpc/connection_guard.h"

namespace syncnorm {

namespace {

// CPU time `clock` has used; zero if it cannot be read.
absl::Duration CpuTime(clockid_t clock) {
  timespec ts{};
  if (::clock_gettime(clock, &ts) != 0) return absl::ZeroDuration();
  return absl::DurationFromTimespec(ts);
}

}  // namespace

RpcLoop::RpcLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq,
                 ConnectionGuard* guard, int workers, PassWatcher* watcher)
    : cq_(std::move(cq)), guard_(guard), workers_(workers), watcher_(watcher) {}

RpcLoop::~RpcLoop() = default;

void RpcLoop::Start() {
  poller_ = std::thread([this] { Poll(); });
  for (int i = 0; i < workers_; ++i) {
    threads_.emplace_back([this] { Work(); });
  }
  if (watcher_ != nullptr) watchdog_ = std::thread([this] { Watch(); });
}

void RpcLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    mu_.Await(absl::Condition(
        +[](int64_t* calls) { return *calls == 0; }, &calls_));
    stopping_ = true;
  }
  if (watchdog_.joinable()) {  // before the thread it watches ends
    {
      absl::MutexLock lock(&watch_mu_);
      watch_stop_ = true;
    }
    watchdog_.join();
  }
  // The server is shut down: what is left on the queue are the requests
  // posted for calls that never came, each of which deletes itself.
  cq_->Shutdown();
  if (poller_.joinable()) {
    poller_.join();
  } else {
    Poll();  // never started: drain here
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void RpcLoop::Poll() {
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    in_grpc_.store(true, std::memory_order_relaxed);
    const bool more = cq_->Next(&tag, &ok);
    in_grpc_.store(false, std::memory_order_relaxed);
    events_.fetch_add(1, std::memory_order_relaxed);
    if (!more) return;
    static_cast<CqTag*>(tag)->Run(ok);
  }
}

void RpcLoop::Watch() {
  clockid_t clock;
  if (::pthread_getcpuclockid(poller_.native_handle(), &clock) != 0) return;
  // The loop thread's CPU clock at the last kBusyWindow looks, oldest
  // first: a thread that shares its core with others is still busy when it
  // gets a tenth of it, and a look or two without it does not end a pass.
  std::deque<std::pair<absl::Time, absl::Duration>> window;
  int64_t events = events_.load(std::memory_order_relaxed);
  absl::Duration last_cpu = CpuTime(clock);
  int idle_looks = 0;
  bool in_pass = false;
  int64_t resident_at_start = 0;
  for (;;) {
    {
      absl::MutexLock lock(&watch_mu_);
      if (watch_mu_.AwaitWithTimeout(absl::Condition(&watch_stop_),
                                     kWatchPeriod)) {
        return;
      }
    }
    const int64_t events_now = events_.load(std::memory_order_relaxed);
    const absl::Time now = absl::Now();
    const absl::Duration cpu_now = CpuTime(clock);
    window.emplace_back(now, cpu_now);
    if (window.size() > kBusyWindow) window.pop_front();
    const bool busy =
        in_grpc_.load(std::memory_order_relaxed) && events_now == events &&
        window.size() > 1 &&
        cpu_now - window.front().second >= (now - window.front().first) / 10;
    // The loop's thread slept through the whole look: it read nothing.
    const bool idle = events_now == events && cpu_now == last_cpu;
    events = events_now;
    last_cpu = cpu_now;
    if (!busy) {
      in_pass = false;
      // An idle server's memory is sampled every kIdleLooks looks only:
      // reading it at every look was most of an idle server's CPU.
      if (idle && ++idle_looks < kIdleLooks) continue;
      idle_looks = 0;
      watcher_->Serving(now, ReadProcessMemory().resident);
    } else if (!in_pass) {
      in_pass = true;
      resident_at_start = ReadProcessMemory().resident;
      watcher_->PassBegan();
    } else {
      watcher_->PassGoesOn(ReadProcessMemory().resident - resident_at_start);
    }
  }
}

void RpcLoop::CallArrived() {
  if (guard_ != nullptr) guard_->CallArrived();
  absl::MutexLock lock(&mu_);
  ++calls_;
}

void RpcLoop::CallReleased() {
  if (guard_ != nullptr) guard_->CallReleased();
  absl::MutexLock lock(&mu_);
  --calls_;
}

void RpcLoop::Post(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  work_.push_back(std::move(work));
}

void RpcLoop::Work() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](RpcLoop* loop) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop->mu_) {
            return loop->stopping_ || !loop->work_.empty();
          },
          this));
      if (work_.empty()) return;  // stopping, and nothing left
      work = std::move(work_.front());
      work_.pop_front();
    }
    work();
  }
}

}  // namespace syncnorm
