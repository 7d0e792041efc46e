// LocalMoments on the CPU.
//
// One streaming pass. Each value's channel accumulates the sum and the sum of
// squares of (x - shift) in double over a block of values, where `shift` is
// the task's running mean so far (the block's first value for the task's
// first block); the block's mean and M2 then fold into the task's by the
// Chan merge. Shifted by a value within a few standard deviations of the
// mean, M2 = S2 - S1^2 / n loses no more than a digit or two even when
// |mean| >> std; without the shift it would lose them all. A block is at
// most kBlock values of one channel (channels-first, summed in kLanes
// lanes) or kRowsPerMerge rows (channels-last, each channel summed row by
// row), so no accumulator adds more than kBlock / kLanes values. Both the
// shift and the order of additions depend only on the data and the
// geometry-based split (cpu_partition.h), and the loops give the same bits
// on every Isa (cpu_moments_loops.h), so results are bitwise independent of
// the thread count and the CPU. Tasks are folded by the Chan merge in task
// order.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_moments_loops.h"
#include "kernels/cpu_partition.h"
#include "kernels/formulas.h"

namespace syncnorm {
namespace cpu {
namespace {

// Per-task results, entry [c * parts + p].
struct PartialMoments {
  explicit PartialMoments(int64_t size) : n(size), mean(size), m2(size) {}
  std::vector<double> n, mean, m2;
};

// Prefetches the first 2 KiB of the block a task reads next: a block is a
// short run far from the previous one, too short for the hardware
// prefetcher to ramp up before it ends.
template <typename T>
void PrefetchBlockStart(const T* v) {
  for (int64_t i = 0; i < 2048; i += 64) {
    __builtin_prefetch(reinterpret_cast<const char*>(v) + i);
  }
}

// Mean and M2 of `n` values whose shifted sums are s1, s2.
inline void FromShifted(double n, double shift, double s1, double s2,
                        double& mean, double& m2) {
  const double d = s1 / n;
  mean = shift + d;
  m2 = std::max(0.0, s2 - s1 * d);
}

// Task (channel c, part p) of a channels-first tensor.
template <typename T>
void FirstLayoutTask(Isa isa, const T* x, const Geometry& g,
                     const ReducePlan& plan, int64_t c, int64_t p,
                     PartialMoments& out) {
  const Range blocks = PartRange(plan.units, plan.parts, p);
  double n = 0, mean = 0, m2 = 0;
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t o = b / plan.segments;
    const int64_t begin = (b % plan.segments) * kBlock;
    const int64_t len = std::min(kBlock, g.inner - begin);
    const T* v = x + (o * g.channels + c) * g.inner + begin;
    if (b + 1 < blocks.end) {
      const int64_t next = b + 1;
      PrefetchBlockStart(x + (next / plan.segments * g.channels + c) * g.inner +
                         next % plan.segments * kBlock);
    }
    const double shift = n > 0 ? mean : ToDouble(v[0]);
    double s1, s2, block_mean, block_m2;
    ShiftedSums(isa, v, len, shift, s1, s2);
    const double nb = static_cast<double>(len);
    FromShifted(nb, shift, s1, s2, block_mean, block_m2);
    ChanMerge(n, mean, m2, nb, block_mean, block_m2);
  }
  const int64_t k = c * plan.parts + p;
  out.n[k] = n;
  out.mean[k] = mean;
  out.m2[k] = m2;
}

// Task (channel tile t, part p) of a channels-last tensor: its rows in
// blocks of kRowsPerMerge, each block summed for all the tile's channels in
// one walk (AddRowShiftedSums) and merged into the running moments.
template <typename T>
void LastLayoutTask(Isa isa, const T* x, const Geometry& g,
                    const ReducePlan& plan, int64_t t, int64_t p,
                    PartialMoments& out) {
  const int64_t c0 = t * kChannelTile;
  const int64_t width = std::min(kChannelTile, g.channels - c0);
  const Range rows = PartRange(plan.units, plan.parts, p);
  std::array<double, kChannelTile> mean{}, m2{}, s1, s2, shift;
  double n = 0;
  for (int64_t r = rows.begin; r < rows.end; r += kRowsPerMerge) {
    const int64_t count = std::min(kRowsPerMerge, rows.end - r);
    const T* block = x + r * g.channels + c0;
    for (int64_t j = 0; j < width; ++j) {
      shift[j] = n > 0 ? mean[j] : ToDouble(block[j]);
      s1[j] = 0;
      s2[j] = 0;
    }
    AddRowShiftedSums(isa, block, g.channels, count, width, shift.data(),
                      s1.data(), s2.data());
    const double nb = static_cast<double>(count);
    for (int64_t j = 0; j < width; ++j) {
      double block_mean, block_m2, na = n;
      FromShifted(nb, shift[j], s1[j], s2[j], block_mean, block_m2);
      ChanMerge(na, mean[j], m2[j], nb, block_mean, block_m2);
    }
    n += nb;
  }
  for (int64_t j = 0; j < width; ++j) {
    const int64_t k = (c0 + j) * plan.parts + p;
    out.n[k] = n;
    out.mean[k] = mean[j];
    out.m2[k] = m2[j];
  }
}

}  // namespace

template <typename T>
void LocalMoments(ThreadPool* pool, const T* x, const Geometry& g,
                  Moments* out) {
  const int channels = static_cast<int>(g.channels);
  *out = Moments::Zero(channels);
  if (g.per_channel() == 0) return;
  const ReducePlan plan = MakeReducePlan(g);
  const Isa isa = BestIsa();
  PartialMoments partial(g.channels * plan.parts);
  RunTasks(pool, plan.tasks(), [&](int64_t task) {
    const int64_t group = task / plan.parts;
    const int64_t p = task % plan.parts;
    if (g.inner == 1) {
      LastLayoutTask(isa, x, g, plan, group, p, partial);
    } else {
      FirstLayoutTask(isa, x, g, plan, group, p, partial);
    }
  });
  for (int c = 0; c < channels; ++c) {
    double n = 0;
    for (int64_t p = 0; p < plan.parts; ++p) {
      const int64_t k = c * plan.parts + p;
      ChanMerge(n, out->mean[c], out->m2[c], partial.n[k], partial.mean[k],
                partial.m2[k]);
    }
  }
  out->count = g.per_channel();
}

#define SYNCNORM_INSTANTIATE(T)                                         \
  template void LocalMoments<T>(ThreadPool*, const T*, const Geometry&, \
                                Moments*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
