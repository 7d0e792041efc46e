#include "kernels/cpu_partition.h"

#include <algorithm>
#include <cstdint>
#include <functional>

#include "kernels/thread_pool.h"

namespace syncnorm {
namespace cpu {
namespace {

// Enough tasks to keep a large machine busy; few enough that folding the
// partial results costs nothing next to the pass over the data.
constexpr int64_t kTargetTasks = 64;
// A task's least work, so that small tensors do not pay for scheduling.
constexpr int64_t kMinTaskValues = 16384;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Parts per group: the split of `units` (holding `values` values) of each of
// `groups` groups.
int64_t PartsFor(int64_t groups, int64_t units, int64_t values) {
  const int64_t by_tasks = CeilDiv(kTargetTasks, groups);
  const int64_t by_size = CeilDiv(values, kMinTaskValues);
  return std::max<int64_t>(1, std::min({by_tasks, by_size, units}));
}

}  // namespace

Range PartRange(int64_t units, int64_t parts, int64_t p) {
  const int64_t base = units / parts;
  const int64_t extra = units % parts;
  Range r;
  r.begin = p * base + std::min(p, extra);
  r.end = r.begin + base + (p < extra ? 1 : 0);
  return r;
}

ReducePlan MakeReducePlan(const Geometry& g) {
  ReducePlan plan;
  if (g.inner == 1) {
    const int64_t width = std::min(g.channels, kChannelTile);
    plan.groups = CeilDiv(g.channels, kChannelTile);
    plan.units = g.outer;
    plan.parts = PartsFor(plan.groups, plan.units, g.outer * width);
  } else {
    plan.groups = g.channels;
    plan.segments = std::max<int64_t>(1, CeilDiv(g.inner, kBlock));
    plan.units = g.outer * plan.segments;
    plan.parts = PartsFor(plan.groups, plan.units, g.per_channel());
  }
  return plan;
}

int64_t ElementwiseTasks(const Geometry& g) {
  // At most kTargetTasks: each task a long contiguous stream, which the
  // hardware prefetcher keeps ahead of (a new task restarts it), and few
  // claims on the pool's lock.
  const int64_t by_size = CeilDiv(g.elements(), kMinTaskValues);
  return std::max<int64_t>(1, std::min(by_size, kTargetTasks));
}

void RunTasks(ThreadPool* pool, int64_t tasks,
              const std::function<void(int64_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(tasks, fn);
    return;
  }
  for (int64_t t = 0; t < tasks; ++t) fn(t);
}

}  // namespace cpu
}  // namespace syncnorm
