#include "kernels/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(ThreadPoolTest, SizeCountsTheCallerAndClampsToOne) {
  EXPECT_EQ(ThreadPool(0).size(), 1);
  EXPECT_EQ(ThreadPool(-3).size(), 1);
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
}

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t tasks : {0, 1, 2, 3, 7, 100, 1000}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool.ParallelFor(tasks, [&](int64_t t) { hits[t].fetch_add(1); });
      for (int64_t t = 0; t < tasks; ++t) {
        ASSERT_EQ(hits[t].load(), 1)
            << "task " << t << " of " << tasks << ", " << threads << " threads";
      }
    }
  }
}

TEST(ThreadPoolTest, NegativeTaskCountDoesNothing) {
  ThreadPool pool(2);
  int calls = 0;
  pool.ParallelFor(-5, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPoolTest, PoolOfOneRunsOnTheCallerInOrder) {
  ThreadPool pool(1);
  std::vector<int64_t> order;
  const std::thread::id caller = std::this_thread::get_id();
  bool all_on_caller = true;
  pool.ParallelFor(5, [&](int64_t t) {
    order.push_back(t);
    all_on_caller &= std::this_thread::get_id() == caller;
  });
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(all_on_caller);
}

// Each task waits for the others: only size() threads running at once,
// the caller among them, let all of them through.
TEST(ThreadPoolTest, TasksRunConcurrentlyOnAllThreadsIncludingTheCaller) {
  ThreadPool pool(3);
  std::atomic<int> arrived{0};
  std::atomic<bool> caller_ran{false};
  std::atomic<int> timed_out{0};
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(3, [&](int64_t) {
    if (std::this_thread::get_id() == caller) caller_ran = true;
    arrived.fetch_add(1);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (arrived.load() < 3) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out.fetch_add(1);
        return;
      }
      std::this_thread::yield();
    }
  });
  EXPECT_EQ(timed_out.load(), 0);
  EXPECT_TRUE(caller_ran.load());
}

TEST(ThreadPoolTest, CallsFromSeveralThreadsAllComplete) {
  ThreadPool pool(3);
  constexpr int kCallers = 4;
  constexpr int kCalls = 50;
  constexpr int64_t kTasks = 37;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int call = 0; call < kCalls; ++call) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(kTasks, [&](int64_t t) { sum.fetch_add(t + 1); });
        sums[i] += sum.load();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < kCallers; ++i) {
    EXPECT_EQ(sums[i], kCalls * kTasks * (kTasks + 1) / 2) << "caller " << i;
  }
}

TEST(ThreadPoolTest, ManyShortCallsInARow) {
  ThreadPool pool(2);
  int64_t total = 0;
  for (int call = 0; call < 2000; ++call) {
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(3, [&](int64_t t) { sum.fetch_add(t); });
    total += sum.load();
  }
  EXPECT_EQ(total, 2000 * 3);
}

}  // namespace
}  // namespace syncnorm
