// BackwardReduce on the CPU: per-channel sum(dy) and sum(dy * (x - mean)) in
// double, under the fused ReLU's mask when y is given. Blocks of at most
// kBlock values are summed first and the block sums added in a fixed order,
// which keeps the rounding error small and the result independent of threads.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_partition.h"
#include "kernels/cpu_sums.h"

namespace syncnorm {
namespace cpu {
namespace {

// The tensors of one call and their per-task results, entry [c * parts + p].
template <typename T>
struct GradTask {
  const T* dy;
  const T* x;
  const T* y;  // mask source; read only when kMask
  const double* mean;
  std::vector<double> sum_dy, sum_dy_xmu;
};

// dy where the fused ReLU let the value through.
template <bool kMask, typename T>
inline double MaskedDy(const T* dy, const T* y, int64_t i) {
  if (kMask) return ToDouble(y[i]) > 0.0 ? ToDouble(dy[i]) : 0.0;
  return ToDouble(dy[i]);
}

// Task (channel c, part p) of a channels-first tensor.
template <bool kMask, typename T>
void FirstLayoutTask(const Geometry& g, const ReducePlan& plan, int64_t c,
                     int64_t p, GradTask<T>& t) {
  const Range blocks = PartRange(plan.units, plan.parts, p);
  const double mean = t.mean[c];
  double sum_dy = 0, sum_dy_xmu = 0;
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t o = b / plan.segments;
    const int64_t begin = (b % plan.segments) * kBlock;
    const int64_t len = std::min(kBlock, g.inner - begin);
    const int64_t offset = (o * g.channels + c) * g.inner + begin;
    const T* dy = t.dy + offset;
    const T* x = t.x + offset;
    const T* y = t.y == nullptr ? nullptr : t.y + offset;
    sum_dy +=
        LaneSum(len, [=](int64_t i) { return MaskedDy<kMask>(dy, y, i); });
    sum_dy_xmu += LaneSum(len, [=](int64_t i) {
      return MaskedDy<kMask>(dy, y, i) * (ToDouble(x[i]) - mean);
    });
  }
  t.sum_dy[c * plan.parts + p] = sum_dy;
  t.sum_dy_xmu[c * plan.parts + p] = sum_dy_xmu;
}

// Adds the sums of `rows` rows (`stride` apart) of `width` channels starting
// at element `offset` into sum_dy and sum_dy_xmu.
template <bool kMask, typename T>
void RowBlockSums(const GradTask<T>& t, int64_t offset, int64_t stride,
                  int64_t rows, int64_t width, const double* mean,
                  double* __restrict sum_dy, double* __restrict sum_dy_xmu) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = offset + r * stride;
    const T* dy = t.dy + row;
    const T* x = t.x + row;
    const T* y = t.y == nullptr ? nullptr : t.y + row;
    for (int64_t j = 0; j < width; ++j) {
      const double d = MaskedDy<kMask>(dy, y, j);
      sum_dy[j] += d;
      sum_dy_xmu[j] += d * (ToDouble(x[j]) - mean[j]);
    }
  }
}

// Task (channel tile tile, part p) of a channels-last tensor.
template <bool kMask, typename T>
void LastLayoutTask(const Geometry& g, const ReducePlan& plan, int64_t tile,
                    int64_t p, GradTask<T>& t) {
  const int64_t c0 = tile * kChannelTile;
  const int64_t width = std::min(kChannelTile, g.channels - c0);
  const int64_t rows_per_block = std::max<int64_t>(1, kBlock / width);
  const Range rows = PartRange(plan.units, plan.parts, p);
  std::array<double, kChannelTile> sum_dy{}, sum_dy_xmu{}, block_dy,
      block_dy_xmu;
  for (int64_t r = rows.begin; r < rows.end; r += rows_per_block) {
    const int64_t count = std::min(rows_per_block, rows.end - r);
    std::fill(block_dy.begin(), block_dy.end(), 0.0);
    std::fill(block_dy_xmu.begin(), block_dy_xmu.end(), 0.0);
    RowBlockSums<kMask>(t, r * g.channels + c0, g.channels, count, width,
                        t.mean + c0, block_dy.data(), block_dy_xmu.data());
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

template <bool kMask, typename T>
void RunTask(const Geometry& g, const ReducePlan& plan, int64_t task,
             GradTask<T>& t) {
  const int64_t group = task / plan.parts;
  const int64_t p = task % plan.parts;
  if (g.inner == 1) {
    LastLayoutTask<kMask>(g, plan, group, p, t);
  } else {
    FirstLayoutTask<kMask>(g, plan, group, p, t);
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
    const bool mask = args.y != nullptr;
    RunTasks(pool, plan.tasks(), [&](int64_t task) {
      if (mask) {
        RunTask<true>(g, plan, task, t);
      } else {
        RunTask<false>(g, plan, task, t);
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

#define SYNCNORM_INSTANTIATE(T) \
  template void BackwardReduce<T>(ThreadPool*, const Geometry&,       \
                                  const BackwardReduceArgs&, GradSums*, \
                                  double*, double*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
