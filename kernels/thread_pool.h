// A fixed set of worker threads for the CPU kernels.
#ifndef SYNCNORM_KERNELS_THREAD_POOL_H_
#define SYNCNORM_KERNELS_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace syncnorm {

// Runs ParallelFor calls over a fixed set of threads. Thread-safe: calls from
// several threads are serialized. The calling thread takes part in the work.
class ThreadPool {
 public:
  // threads: total parallelism including the caller; values < 1 mean 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task) for every task in [0, tasks) and returns when all are
  // done. Tasks run concurrently on up to size() threads, in no particular
  // order. tasks <= 0 does nothing.
  // REQUIRES: fn does not call ParallelFor on this pool (it would deadlock).
  void ParallelFor(int64_t tasks, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  // Runs tasks of the current call until none is left to claim.
  void RunTasks();

  absl::Mutex call_mu_;  // serializes ParallelFor calls

  absl::Mutex mu_;
  absl::CondVar work_cv_;  // a call started, or stop_ was set
  absl::CondVar done_cv_;  // done_ reached tasks_
  // The current call; fn_ == nullptr between calls.
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;         // next task to claim
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;         // tasks finished
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // calls started so far
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> workers_;  // constant after construction
};

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_THREAD_POOL_H_
