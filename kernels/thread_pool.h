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
  // done. Tasks run concurrently on up to size() threads.
  void ParallelFor(int64_t tasks, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunTasks();

  absl::Mutex call_mu_;  // serializes ParallelFor calls
  absl::Mutex mu_;
  const std::function<void(int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // constant after construction
};

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_THREAD_POOL_H_
