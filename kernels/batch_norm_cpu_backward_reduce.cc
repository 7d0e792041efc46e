// BackwardReduce on the CPU: per-channel sum(dy) and sum(dy * (x - mean)) in
// double, under the fused ReLU's mask when y is given. Blocks of at most
// kBlock values are summed first (cpu_grad_sums_loops.h, the same bits on
// every Isa) and the block sums added in a fixed order, which keeps the
// rounding error small and the result independent of threads.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_grad_sums_loops.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_partition.h"

namespace syncnorm {
namespace cpu {
namespace {

// The tensors of one call and their per-task results, entry [c * parts + p].
template <typename T>
struct GradTask {
  const T* dy;
  const T* x;
  const T* y;  // mask source; nullptr: no mask
  const double* mean;
  std::vector<double> sum_dy, sum_dy_xmu;
};

// Task (channel c, part p) of a channels-first tensor.
template <typename T>
void FirstLayoutTask(Isa isa, const Geometry& g, const ReducePlan& plan,
                     int64_t c, int64_t p, GradTask<T>& t) {
  const Range blocks = PartRange(plan.units, plan.parts, p);
  double sum_dy = 0, sum_dy_xmu = 0;
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t o = b / plan.segments;
    const int64_t begin = (b % plan.segments) * kBlock;
    const int64_t len = std::min(kBlock, g.inner - begin);
    const int64_t offset = (o * g.channels + c) * g.inner + begin;
    double block_dy, block_dy_xmu;
    GradLaneSums(isa, t.dy + offset, t.x + offset,
                 t.y == nullptr ? nullptr : t.y + offset, len, t.mean[c],
                 block_dy, block_dy_xmu);
    sum_dy += block_dy;
    sum_dy_xmu += block_dy_xmu;
  }
  t.sum_dy[c * plan.parts + p] = sum_dy;
  t.sum_dy_xmu[c * plan.parts + p] = sum_dy_xmu;
}

// Task (channel tile tile, part p) of a channels-last tensor.
template <typename T>
void LastLayoutTask(Isa isa, const Geometry& g, const ReducePlan& plan,
                    int64_t tile, int64_t p, GradTask<T>& t) {
  const int64_t c0 = tile * kChannelTile;
  const int64_t width = std::min(kChannelTile, g.channels - c0);
  const int64_t rows_per_block = std::max<int64_t>(1, kBlock / width);
  const Range rows = PartRange(plan.units, plan.parts, p);
  std::array<double, kChannelTile> sum_dy{}, sum_dy_xmu{}, block_dy,
      block_dy_xmu;
  for (int64_t r = rows.begin; r < rows.end; r += rows_per_block) {
    const int64_t count = std::min(rows_per_block, rows.end - r);
    const int64_t offset = r * g.channels + c0;
    std::fill(block_dy.begin(), block_dy.end(), 0.0);
    std::fill(block_dy_xmu.begin(), block_dy_xmu.end(), 0.0);
    AddRowGradSums(isa, t.dy + offset, t.x + offset,
                   t.y == nullptr ? nullptr : t.y + offset, g.channels, count,
                   width, t.mean + c0, block_dy.data(), block_dy_xmu.data());
    for (int64_t j = 0; j < width; ++j) {
      sum_dy[j] += block_dy[j];
      sum_dy_xmu[j] += block_dy_xmu[j];
    }
  }
  for (int64_t j = 0; j < width; ++j) {
    t.sum_dy[(c0 + j) * plan.parts + p] = sum_dy[j];
    t.sum_dy_xmu[(c0 + j) * plan.parts + p] = sum_dy_xmu[j];
  }
}

}  // namespace

template <typename T>
void BackwardReduce(ThreadPool* pool, const Geometry& g,
                    const BackwardReduceArgs& args, GradSums* sums,
                    double* grad_weight, double* grad_bias) {
  const int64_t channels = g.channels;
  sums->sum_dy.assign(channels, 0.0);
  sums->sum_dy_xmu.assign(channels, 0.0);
  if (g.per_channel() > 0) {
    const ReducePlan plan = MakeReducePlan(g);
    GradTask<T> t{static_cast<const T*>(args.dy),
                  static_cast<const T*>(args.x),
                  static_cast<const T*>(args.y),
                  args.mean,
                  std::vector<double>(channels * plan.parts),
                  std::vector<double>(channels * plan.parts)};
    const Isa isa = BestIsa();
    RunTasks(pool, plan.tasks(), [&](int64_t task) {
      const int64_t group = task / plan.parts;
      const int64_t p = task % plan.parts;
      if (g.inner == 1) {
        LastLayoutTask(isa, g, plan, group, p, t);
      } else {
        FirstLayoutTask(isa, g, plan, group, p, t);
      }
    });
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < plan.parts; ++p) {
        sums->sum_dy[c] += t.sum_dy[c * plan.parts + p];
        sums->sum_dy_xmu[c] += t.sum_dy_xmu[c * plan.parts + p];
      }
    }
  }
  for (int64_t c = 0; c < channels; ++c) {
    if (grad_weight != nullptr) {
      grad_weight[c] = sums->sum_dy_xmu[c] * args.invstd[c];
    }
    if (grad_bias != nullptr) grad_bias[c] = sums->sum_dy[c];
  }
}

#define SYNCNORM_INSTANTIATE(T)                                         \
  template void BackwardReduce<T>(ThreadPool*, const Geometry&,         \
                                  const BackwardReduceArgs&, GradSums*, \
                                  double*, double*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
