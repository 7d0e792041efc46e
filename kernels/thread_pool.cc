#include "kernels/thread_pool.h"

#include <cstdint>
#include <functional>

#include "absl/synchronization/mutex.h"

namespace syncnorm {

ThreadPool::ThreadPool(int threads) {
  const int workers = threads > 1 ? threads - 1 : 0;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::ParallelFor(int64_t tasks,
                             const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  absl::MutexLock call_lock(&call_mu_);
  if (workers_.empty() || tasks == 1) {
    for (int64_t task = 0; task < tasks; ++task) fn(task);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    fn_ = &fn;
    tasks_ = tasks;
    next_ = 0;
    done_ = 0;
    ++generation_;
  }
  work_cv_.SignalAll();
  RunTasks();
  absl::MutexLock lock(&mu_);
  while (done_ < tasks_) done_cv_.Wait(&mu_);
  // fn_ must not outlive this call: a worker that wakes late finds no call.
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
  }
}

// A claimed task keeps its call alive: the caller waits for done_ == tasks_,
// so fn_, tasks_ and done_ cannot move to the next call while one runs.
void ThreadPool::RunTasks() {
  mu_.Lock();
  while (fn_ != nullptr && next_ < tasks_) {
    const std::function<void(int64_t)>* fn = fn_;
    const int64_t task = next_++;
    mu_.Unlock();
    (*fn)(task);
    mu_.Lock();
    if (++done_ == tasks_) done_cv_.Signal();
  }
  mu_.Unlock();
}

}  // namespace syncnorm
