// LocalMoments on the CPU.
//
// Stability when |mean| >> std: each block of at most kBlock values gets its
// sum in double, then its M2 around its own mean in a second pass over the
// block while it is still in L1 (x is read once from memory). Blocks, then
// tasks, are folded by the Chan merge in a fixed order.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_partition.h"
#include "kernels/cpu_sums.h"
#include "kernels/formulas.h"

namespace syncnorm {
namespace cpu {
namespace {

// Per-task results, entry [c * parts + p].
struct PartialMoments {
  explicit PartialMoments(int64_t size) : n(size), mean(size), m2(size) {}
  std::vector<double> n, mean, m2;
};

// Task (channel c, part p) of a channels-first tensor.
template <typename T>
void FirstLayoutTask(const T* x, const Geometry& g, const ReducePlan& plan,
                     int64_t c, int64_t p, PartialMoments& out) {
  const Range blocks = PartRange(plan.units, plan.parts, p);
  double n = 0, mean = 0, m2 = 0;
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t o = b / plan.segments;
    const int64_t begin = (b % plan.segments) * kBlock;
    const int64_t len = std::min(kBlock, g.inner - begin);
    const T* v = x + (o * g.channels + c) * g.inner + begin;
    const double block_mean =
        LaneSum(len, [v](int64_t i) { return ToDouble(v[i]); }) /
        static_cast<double>(len);
    const double block_m2 = LaneSum(len, [v, block_mean](int64_t i) {
      const double d = ToDouble(v[i]) - block_mean;
      return d * d;
    });
    ChanMerge(n, mean, m2, static_cast<double>(len), block_mean, block_m2);
  }
  const int64_t k = c * plan.parts + p;
  out.n[k] = n;
  out.mean[k] = mean;
  out.m2[k] = m2;
}

// Mean and M2 of `rows` rows (`stride` apart) of `width` channels each.
template <typename T>
void RowBlockMoments(const T* x, int64_t stride, int64_t rows,
                     int64_t width, double* __restrict mean,
                     double* __restrict m2) {
  std::fill(mean, mean + width, 0.0);
  std::fill(m2, m2 + width, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    for (int64_t j = 0; j < width; ++j) mean[j] += ToDouble(row[j]);
  }
  const double n = static_cast<double>(rows);
  for (int64_t j = 0; j < width; ++j) mean[j] /= n;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    for (int64_t j = 0; j < width; ++j) {
      const double d = ToDouble(row[j]) - mean[j];
      m2[j] += d * d;
    }
  }
}

// Task (channel tile t, part p) of a channels-last tensor.
template <typename T>
void LastLayoutTask(const T* x, const Geometry& g, const ReducePlan& plan,
                    int64_t t, int64_t p, PartialMoments& out) {
  const int64_t c0 = t * kChannelTile;
  const int64_t width = std::min(kChannelTile, g.channels - c0);
  const int64_t rows_per_block = std::max<int64_t>(1, kBlock / width);
  const Range rows = PartRange(plan.units, plan.parts, p);
  std::array<double, kChannelTile> mean{}, m2{}, block_mean, block_m2;
  double n = 0;
  for (int64_t r = rows.begin; r < rows.end; r += rows_per_block) {
    const int64_t count = std::min(rows_per_block, rows.end - r);
    RowBlockMoments(x + r * g.channels + c0, g.channels, count, width,
                    block_mean.data(), block_m2.data());
    const double nb = static_cast<double>(count);
    for (int64_t j = 0; j < width; ++j) {
      double na = n;
      ChanMerge(na, mean[j], m2[j], nb, block_mean[j], block_m2[j]);
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
  PartialMoments partial(g.channels * plan.parts);
  RunTasks(pool, plan.tasks(), [&](int64_t task) {
    const int64_t group = task / plan.parts;
    const int64_t p = task % plan.parts;
    if (g.inner == 1) {
      LastLayoutTask(x, g, plan, group, p, partial);
    } else {
      FirstLayoutTask(x, g, plan, group, p, partial);
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

#define SYNCNORM_INSTANTIATE(T) \
  template void LocalMoments<T>(ThreadPool*, const T*, const Geometry&, \
                                Moments*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
