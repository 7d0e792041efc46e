// How the CPU kernels split their work into tasks.
//
// Reductions split by geometry alone, never by thread count, and fold the
// tasks' partial results in task order: their results are bitwise identical
// for every pool size, including no pool. Elementwise kernels split a flat
// element range; they have no order to keep.
#ifndef SYNCNORM_KERNELS_CPU_PARTITION_H_
#define SYNCNORM_KERNELS_CPU_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "kernels/batch_norm.h"
#include "kernels/cpu_sums.h"

namespace syncnorm {
namespace cpu {

// Values in one reduction block: 16 KiB of float, so a second pass over the
// block reads L1, not memory.
inline constexpr int64_t kBlock = 4096;
// Channels-last reductions: channels per task, so per-channel accumulators
// stay in L1 however many channels there are.
inline constexpr int64_t kChannelTile = 256;
// Channels-last reductions: rows per block. Each channel adds a block's rows
// into one accumulator, as many values as a channels-first block gives each
// of its kLanes lanes; the per-block merge then costs one Chan merge per
// channel per 512 rows, nothing next to reading them.
inline constexpr int64_t kRowsPerMerge = kBlock / kLanes;

// [begin, end) of a part.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};

// Part p of `units` split into `parts` near-equal consecutive parts.
// REQUIRES: parts >= 1, 0 <= p < parts.
Range PartRange(int64_t units, int64_t parts, int64_t p);

// A reduction's fixed split: groups x parts tasks; task t works on group
// t / parts and part t % parts. Channels-first (inner > 1): a group is one
// channel, its units are blocks of at most kBlock values within its rows
// (segments blocks per row). Channels-last (inner == 1): a group is a tile of
// up to kChannelTile channels, its units are rows of the tensor.
struct ReducePlan {
  int64_t groups = 0;
  int64_t parts = 1;
  int64_t units = 0;
  int64_t segments = 1;

  int64_t tasks() const { return groups * parts; }
};

// REQUIRES: g is valid (see ValidateGeometry in batch_norm.cc).
ReducePlan MakeReducePlan(const Geometry& g);

// The number of tasks an elementwise kernel splits g.elements() into. The
// split changes no result, only the speed.
int64_t ElementwiseTasks(const Geometry& g);

// Runs fn(task) for every task in [0, tasks): on `pool` when given, else on
// the calling thread in order.
void RunTasks(ThreadPool* pool, int64_t tasks,
              const std::function<void(int64_t)>& fn);

// Calls fn(pos, rows, len, c) for runs of the flat element range r: `rows`
// consecutive rows of `len` elements from element pos. Whole rows are
// grouped into one run; a part of a row is a run of its own (rows == 1).
// Channels-first (inner > 1): row k of the run holds channel c + k (a run
// ends with the batch item). Channels-last: each row of the run holds
// channels [c, c + len).
template <typename Fn>
void ForEachRowRun(const Geometry& g, Range r, Fn&& fn) {
  const bool last = g.inner == 1;
  const int64_t row_len = last ? g.channels : g.inner;
  for (int64_t pos = r.begin; pos < r.end;) {
    const int64_t row = pos / row_len;
    const int64_t offset = pos % row_len;
    const int64_t c = last ? offset : row % g.channels;
    const int64_t len = std::min(row_len - offset, r.end - pos);
    int64_t rows = 1;
    if (len == row_len) {
      rows = (r.end - pos) / row_len;
      if (!last) rows = std::min(rows, g.channels - c);
    }
    fn(pos, rows, len, c);
    pos += rows * len;
  }
}

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_PARTITION_H_
