// The CUDA reductions: LocalMoments and BackwardReduce.
//
// Numerics: each thread folds chunks of kChunk values, the chunk's mean and
// M2 taken in float around the chunk's own mean and Chan-merged into the
// thread's float moments (gradient sums: chunk sums in float, added in
// double). Threads, warps and blocks are then merged in double in a fixed
// tree order, and a second kernel folds the blocks of each channel in block
// order, so the result depends only on the input and its geometry (never on
// timing or the GPU model).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_common.cuh"
#include "kernels/formulas.h"

namespace syncnorm {
namespace cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 4;
// Channels-last: a block covers kTile channels x kRowLanes rows at a time.
constexpr int kTile = 32;
constexpr int kRowLanes = kThreads / kTile;
// Least values per block, and about how many blocks fill a large GPU.
constexpr int64_t kValuesPerBlock = 16384;
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMaxGridY = 65535;

// ---- device helpers ---------------------------------------------------------

struct Range {
  int64_t begin;
  int64_t end;
};

// Part p of `units` split into `parts` near-equal consecutive parts.
__device__ __forceinline__ Range PartRange(int64_t units, int64_t parts,
                                           int64_t p) {
  const int64_t base = units / parts;
  const int64_t extra = units % parts;
  Range r;
  r.begin = p * base + (p < extra ? p : extra);
  r.end = r.begin + base + (p < extra ? 1 : 0);
  return r;
}

struct MomentsD {
  double n, mean, m2;
};

struct SumsD {
  double dy, dy_xmu;
};

// Folds a chunk of `count` values (v[u] for u < count; the rest are 0) into
// the thread's float moments. REQUIRES count >= 1.
__device__ __forceinline__ void AddChunk(float& n, float& mean, float& m2,
                                         const float (&v)[kChunk],
                                         int count) {
  float sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kChunk; ++u) sum += v[u];
  const float chunk_mean = sum / static_cast<float>(count);
  float chunk_m2 = 0.0f;
#pragma unroll
  for (int u = 0; u < kChunk; ++u) {
    const float d = v[u] - chunk_mean;
    if (u < count) chunk_m2 += d * d;
  }
  ChanMerge(n, mean, m2, static_cast<float>(count), chunk_mean, chunk_m2);
}

// Lane 0 gets the warp's merge, in a fixed tree order.
__device__ __forceinline__ MomentsD WarpMerge(MomentsD a) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double n = __shfl_down_sync(0xffffffffu, a.n, offset);
    const double mean = __shfl_down_sync(0xffffffffu, a.mean, offset);
    const double m2 = __shfl_down_sync(0xffffffffu, a.m2, offset);
    ChanMerge(a.n, a.mean, a.m2, n, mean, m2);
  }
  return a;
}

__device__ __forceinline__ SumsD WarpSum(SumsD a) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    a.dy += __shfl_down_sync(0xffffffffu, a.dy, offset);
    a.dy_xmu += __shfl_down_sync(0xffffffffu, a.dy_xmu, offset);
  }
  return a;
}

// Thread 0 of a 1-D block of kThreads gets the block's merge.
__device__ __forceinline__ MomentsD BlockMerge(MomentsD a) {
  __shared__ MomentsD warp_part[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  a = WarpMerge(a);
  if (lane == 0) warp_part[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < kWarps ? warp_part[lane] : MomentsD{0.0, 0.0, 0.0};
    a = WarpMerge(a);
  }
  return a;
}

__device__ __forceinline__ SumsD BlockSum(SumsD a) {
  __shared__ SumsD warp_part[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  a = WarpSum(a);
  if (lane == 0) warp_part[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < kWarps ? warp_part[lane] : SumsD{0.0, 0.0};
    a = WarpSum(a);
  }
  return a;
}

// Per-block partial results, entry [part * channels + c].
struct MomentParts {
  double* n;
  double* mean;
  double* m2;
};

struct SumParts {
  double* dy;
  double* dy_xmu;
};

// Per-channel inputs of the backward reduction: mean as a float pair.
struct MeanPair {
  float hi, lo;
};

// dy under the fused ReLU's mask (y > 0) when y is given.
template <typename T>
__device__ __forceinline__ float MaskedDy(const T* dy, const T* y, int64_t i) {
  const float d = Load(dy + i);
  if (y == nullptr) return d;
  return Load(y + i) > 0.0f ? d : 0.0f;
}

// ---- kernels ------------------------------------------------------------------

// Channels-first moments: block (c = blockIdx.x, part = blockIdx.y) over the
// per-channel index k = o * inner + j of one slice of outer rows.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MomentsFirstKernel(const T* x, int64_t channels, int64_t inner,
                       FastDivmod inner_div, int64_t per_channel,
                       MomentParts out) {
  const int64_t c = blockIdx.x;
  const int64_t part = blockIdx.y;
  const Range r = PartRange(per_channel, gridDim.y, part);
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  for (int64_t k = r.begin + threadIdx.x; k < r.end;
       k += kChunk * kThreads) {
    float v[kChunk];
    int count = 0;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int64_t kk = k + u * kThreads;
      v[u] = 0.0f;
      if (kk < r.end) {
        const int64_t o = inner_div.Div(static_cast<uint32_t>(kk));
        const int64_t j = kk - o * inner;
        v[u] = Load(x + (o * channels + c) * inner + j);
        ++count;
      }
    }
    AddChunk(n, mean, m2, v, count);
  }
  const MomentsD block = BlockMerge(MomentsD{n, mean, m2});
  if (threadIdx.x == 0) {
    const int64_t e = part * channels + c;
    out.n[e] = block.n;
    out.mean[e] = block.mean;
    out.m2[e] = block.m2;
  }
}

// Channels-last moments: block (tile = blockIdx.x, part = blockIdx.y);
// thread (tx, ty) reads channel tile * kTile + tx of rows ty, ty +
// kRowLanes, ... of the part. rows x channels is one slice.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MomentsLastKernel(const T* x, int64_t channels, int64_t rows,
                      MomentParts out) {
  const int tx = threadIdx.x % kTile;
  const int ty = threadIdx.x / kTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const bool active = c < channels;
  const int64_t part = blockIdx.y;
  const Range r = PartRange(rows, gridDim.y, part);
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  if (active) {
    for (int64_t row = r.begin + ty; row < r.end;
         row += kChunk * kRowLanes) {
      float v[kChunk];
      int count = 0;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const int64_t rr = row + u * kRowLanes;
        v[u] = 0.0f;
        if (rr < r.end) {
          v[u] = Load(x + rr * channels + c);
          ++count;
        }
      }
      AddChunk(n, mean, m2, v, count);
    }
  }
  __shared__ MomentsD lanes[kRowLanes][kTile];
  lanes[ty][tx] = MomentsD{n, mean, m2};
  __syncthreads();
  if (ty == 0 && active) {
    MomentsD acc = lanes[0][tx];
    for (int q = 1; q < kRowLanes; ++q) {
      ChanMerge(acc.n, acc.mean, acc.m2, lanes[q][tx].n, lanes[q][tx].mean,
                lanes[q][tx].m2);
    }
    const int64_t e = part * channels + c;
    out.n[e] = acc.n;
    out.mean[e] = acc.mean;
    out.m2[e] = acc.m2;
  }
}

// Folds the `parts` partial moments of channel blockIdx.x: thread t takes
// parts t, t + kThreads, ... in order, then the block merges in tree order.
__global__ void __launch_bounds__(kThreads)
    MomentsFinalizeKernel(MomentParts in, int64_t parts, int64_t channels,
                          double* mean, double* m2) {
  const int64_t c = blockIdx.x;
  MomentsD acc{0.0, 0.0, 0.0};
  for (int64_t p = threadIdx.x; p < parts; p += kThreads) {
    const int64_t e = p * channels + c;
    ChanMerge(acc.n, acc.mean, acc.m2, in.n[e], in.mean[e], in.m2[e]);
  }
  acc = BlockMerge(acc);
  if (threadIdx.x == 0) {
    mean[c] = acc.mean;
    m2[c] = acc.m2;
  }
}

// Channels-first backward sums; see MomentsFirstKernel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SumsFirstKernel(const T* dy, const T* x, const T* y,
                    const MeanPair* means, int64_t channels, int64_t inner,
                    FastDivmod inner_div, int64_t per_channel, SumParts out) {
  const int64_t c = blockIdx.x;
  const int64_t part = blockIdx.y;
  const Range r = PartRange(per_channel, gridDim.y, part);
  const MeanPair m = means[c];
  SumsD acc{0.0, 0.0};
  for (int64_t k = r.begin + threadIdx.x; k < r.end;
       k += kChunk * kThreads) {
    float s_dy = 0.0f, s_dy_xmu = 0.0f;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int64_t kk = k + u * kThreads;
      if (kk < r.end) {
        const int64_t o = inner_div.Div(static_cast<uint32_t>(kk));
        const int64_t i = (o * channels + c) * inner + (kk - o * inner);
        const float d = MaskedDy(dy, y, i);
        s_dy += d;
        s_dy_xmu += d * Centered(Load(x + i), m.hi, m.lo);
      }
    }
    acc.dy += s_dy;
    acc.dy_xmu += s_dy_xmu;
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) {
    out.dy[part * channels + c] = acc.dy;
    out.dy_xmu[part * channels + c] = acc.dy_xmu;
  }
}

// Channels-last backward sums; see MomentsLastKernel.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SumsLastKernel(const T* dy, const T* x, const T* y, const MeanPair* means,
                   int64_t channels, int64_t rows, SumParts out) {
  const int tx = threadIdx.x % kTile;
  const int ty = threadIdx.x / kTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const bool active = c < channels;
  const int64_t part = blockIdx.y;
  const Range r = PartRange(rows, gridDim.y, part);
  SumsD acc{0.0, 0.0};
  if (active) {
    const MeanPair m = means[c];
    for (int64_t row = r.begin + ty; row < r.end;
         row += kChunk * kRowLanes) {
      float s_dy = 0.0f, s_dy_xmu = 0.0f;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const int64_t rr = row + u * kRowLanes;
        if (rr < r.end) {
          const int64_t i = rr * channels + c;
          const float d = MaskedDy(dy, y, i);
          s_dy += d;
          s_dy_xmu += d * Centered(Load(x + i), m.hi, m.lo);
        }
      }
      acc.dy += s_dy;
      acc.dy_xmu += s_dy_xmu;
    }
  }
  __shared__ SumsD lanes[kRowLanes][kTile];
  lanes[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && active) {
    SumsD total = lanes[0][tx];
    for (int q = 1; q < kRowLanes; ++q) {
      total.dy += lanes[q][tx].dy;
      total.dy_xmu += lanes[q][tx].dy_xmu;
    }
    out.dy[part * channels + c] = total.dy;
    out.dy_xmu[part * channels + c] = total.dy_xmu;
  }
}

// Sums the `parts` partial sums of channel blockIdx.x in a fixed order.
__global__ void __launch_bounds__(kThreads)
    SumsFinalizeKernel(SumParts in, int64_t parts, int64_t channels,
                       double* sum_dy, double* sum_dy_xmu) {
  const int64_t c = blockIdx.x;
  SumsD acc{0.0, 0.0};
  for (int64_t p = threadIdx.x; p < parts; p += kThreads) {
    acc.dy += in.dy[p * channels + c];
    acc.dy_xmu += in.dy_xmu[p * channels + c];
  }
  acc = BlockSum(acc);
  if (threadIdx.x == 0) {
    sum_dy[c] = acc.dy;
    sum_dy_xmu[c] = acc.dy_xmu;
  }
}

// ---- host side ------------------------------------------------------------------

// How a reduction is cut: per slice of outer rows, a grid of
// (channels or channel tiles) x parts blocks. Depends on the geometry only.
struct ReducePlan {
  bool last = false;
  Slices slices;
  std::vector<int64_t> parts;  // per slice
  int64_t total_parts = 0;

  int64_t Rows(int64_t slice, const Geometry& g) const {
    return std::min(slices.rows_per_slice,
                    g.outer - slice * slices.rows_per_slice);
  }
};

ReducePlan MakePlan(const Geometry& g) {
  ReducePlan plan;
  plan.last = g.inner == 1;
  plan.slices = MakeSlices(g);
  const int64_t groups = plan.last ? CeilDiv(g.channels, kTile) : g.channels;
  for (int64_t s = 0; s < plan.slices.count; ++s) {
    const int64_t rows = plan.Rows(s, g);
    const int64_t values = plan.last ? rows * std::min<int64_t>(g.channels, kTile)
                                     : rows * g.inner;
    const int64_t units = plan.last ? rows : rows * g.inner;
    int64_t parts = std::min(CeilDiv(values, kValuesPerBlock),
                             std::max<int64_t>(1, kTargetBlocks / groups));
    parts = std::max<int64_t>(1, std::min({parts, units, kMaxGridY}));
    plan.parts.push_back(parts);
    plan.total_parts += parts;
  }
  return plan;
}

// Whether dim fits a grid's x dimension.
Result CheckGridX(const char* fn, int64_t blocks) {
  if (blocks <= std::numeric_limits<int32_t>::max()) return Result{};
  return Fail(Code::kInvalidArgument,
              std::string(fn) + ": too many channels for one grid");
}

template <typename T>
Result RunMoments(cudaStream_t stream, const T* x, const Geometry& g,
                  double* mean, double* m2) {
  constexpr char kFn[] = "LocalMoments (CUDA)";
  const ReducePlan plan = MakePlan(g);
  const int64_t entries = plan.total_parts * g.channels;
  StreamBuffer buffer(stream);
  SYNCNORM_CUDA_TRY(buffer.Allocate((3 * entries + 2 * g.channels) *
                                    sizeof(double)));
  double* base = buffer.as<double>();
  const MomentParts parts{base, base + entries, base + 2 * entries};
  double* dev_mean = base + 3 * entries;
  double* dev_m2 = dev_mean + g.channels;
  const FastDivmod inner_div(static_cast<uint32_t>(g.inner));
  int64_t offset = 0;  // first part of the slice
  for (int64_t s = 0; s < plan.slices.count; ++s) {
    const int64_t rows = plan.Rows(s, g);
    const T* xs = x + s * plan.slices.rows_per_slice * g.channels * g.inner;
    const MomentParts out{parts.n + offset * g.channels,
                          parts.mean + offset * g.channels,
                          parts.m2 + offset * g.channels};
    if (plan.last) {
      const dim3 grid(static_cast<unsigned>(CeilDiv(g.channels, kTile)),
                      static_cast<unsigned>(plan.parts[s]));
      MomentsLastKernel<T><<<grid, kThreads, 0, stream>>>(xs, g.channels,
                                                          rows, out);
    } else {
      const dim3 grid(static_cast<unsigned>(g.channels),
                      static_cast<unsigned>(plan.parts[s]));
      MomentsFirstKernel<T><<<grid, kThreads, 0, stream>>>(
          xs, g.channels, g.inner, inner_div, rows * g.inner, out);
    }
    SYNCNORM_CUDA_CHECK_LAUNCH();
    offset += plan.parts[s];
  }
  MomentsFinalizeKernel<<<static_cast<unsigned>(g.channels), kThreads, 0,
                          stream>>>(parts, plan.total_parts, g.channels,
                                    dev_mean, dev_m2);
  SYNCNORM_CUDA_CHECK_LAUNCH();
  const size_t bytes = g.channels * sizeof(double);
  SYNCNORM_CUDA_TRY(
      cudaMemcpyAsync(mean, dev_mean, bytes, cudaMemcpyDeviceToHost, stream));
  SYNCNORM_CUDA_TRY(
      cudaMemcpyAsync(m2, dev_m2, bytes, cudaMemcpyDeviceToHost, stream));
  SYNCNORM_CUDA_TRY(cudaStreamSynchronize(stream));
  return Result{};
}

template <typename T>
Result RunSums(cudaStream_t stream, const Geometry& g,
               const BackwardReduceArgs& args, double* sum_dy,
               double* sum_dy_xmu) {
  constexpr char kFn[] = "BackwardReduce (CUDA)";
  const ReducePlan plan = MakePlan(g);
  const int64_t entries = plan.total_parts * g.channels;
  std::vector<MeanPair> means(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    SplitDouble(args.mean[c], &means[c].hi, &means[c].lo);
  }
  StreamBuffer buffer(stream);
  SYNCNORM_CUDA_TRY(buffer.Allocate((2 * entries + 2 * g.channels) *
                                        sizeof(double) +
                                    g.channels * sizeof(MeanPair)));
  double* base = buffer.as<double>();
  const SumParts parts{base, base + entries};
  double* dev_dy = base + 2 * entries;
  double* dev_dy_xmu = dev_dy + g.channels;
  auto* dev_means = reinterpret_cast<MeanPair*>(dev_dy_xmu + g.channels);
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(dev_means, means.data(),
                                    g.channels * sizeof(MeanPair),
                                    cudaMemcpyHostToDevice, stream));
  const auto* dy = static_cast<const T*>(args.dy);
  const auto* x = static_cast<const T*>(args.x);
  const auto* y = static_cast<const T*>(args.y);
  const FastDivmod inner_div(static_cast<uint32_t>(g.inner));
  int64_t offset = 0;
  for (int64_t s = 0; s < plan.slices.count; ++s) {
    const int64_t rows = plan.Rows(s, g);
    const int64_t first = s * plan.slices.rows_per_slice * g.channels * g.inner;
    const SumParts out{parts.dy + offset * g.channels,
                       parts.dy_xmu + offset * g.channels};
    const T* ys = y == nullptr ? nullptr : y + first;
    if (plan.last) {
      const dim3 grid(static_cast<unsigned>(CeilDiv(g.channels, kTile)),
                      static_cast<unsigned>(plan.parts[s]));
      SumsLastKernel<T><<<grid, kThreads, 0, stream>>>(
          dy + first, x + first, ys, dev_means, g.channels, rows, out);
    } else {
      const dim3 grid(static_cast<unsigned>(g.channels),
                      static_cast<unsigned>(plan.parts[s]));
      SumsFirstKernel<T><<<grid, kThreads, 0, stream>>>(
          dy + first, x + first, ys, dev_means, g.channels, g.inner,
          inner_div, rows * g.inner, out);
    }
    SYNCNORM_CUDA_CHECK_LAUNCH();
    offset += plan.parts[s];
  }
  SumsFinalizeKernel<<<static_cast<unsigned>(g.channels), kThreads, 0,
                       stream>>>(parts, plan.total_parts, g.channels, dev_dy,
                                 dev_dy_xmu);
  SYNCNORM_CUDA_CHECK_LAUNCH();
  const size_t bytes = g.channels * sizeof(double);
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(sum_dy, dev_dy, bytes,
                                    cudaMemcpyDeviceToHost, stream));
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(sum_dy_xmu, dev_dy_xmu, bytes,
                                    cudaMemcpyDeviceToHost, stream));
  SYNCNORM_CUDA_TRY(cudaStreamSynchronize(stream));
  return Result{};
}

}  // namespace
}  // namespace detail

int VisibleDevices(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it, so later calls do not see it
    if (why != nullptr) {
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    }
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device is visible";
  return count;
}

Result LocalMoments(void* stream, DType dtype, const void* x,
                    const Geometry& g, double* mean, double* m2) {
  using namespace detail;  // NOLINT: the launcher's own helpers
  constexpr char kFn[] = "LocalMoments (CUDA)";
  Result r = CheckGeometry(kFn, g);
  if (r.ok()) r = DispatchDType(kFn, dtype, [](auto) { return Result{}; });
  if (r.ok()) r = RequireTensor(kFn, x, g, "x");
  if (r.ok()) r = Require(kFn, mean, "mean");
  if (r.ok()) r = Require(kFn, m2, "m2");
  if (r.ok()) r = CheckGridX(kFn, g.channels);
  if (!r.ok()) return r;
  std::fill(mean, mean + g.channels, 0.0);
  std::fill(m2, m2 + g.channels, 0.0);
  if (g.per_channel() == 0) return r;
  r = CheckDevice(kFn);
  if (r.ok()) r = CheckDevicePointer(kFn, x, "x");
  if (!r.ok()) return r;
  return DispatchDType(kFn, dtype, [&](auto tag) {
    using T = decltype(tag);
    return RunMoments<T>(static_cast<cudaStream_t>(stream),
                         static_cast<const T*>(x), g, mean, m2);
  });
}

Result BackwardReduce(void* stream, DType dtype, const Geometry& g,
                      const BackwardReduceArgs& args, double* sum_dy,
                      double* sum_dy_xmu) {
  using namespace detail;  // NOLINT: the launcher's own helpers
  constexpr char kFn[] = "BackwardReduce (CUDA)";
  Result r = CheckGeometry(kFn, g);
  if (r.ok()) r = DispatchDType(kFn, dtype, [](auto) { return Result{}; });
  if (r.ok()) r = RequireTensor(kFn, args.dy, g, "args.dy");
  if (r.ok()) r = RequireTensor(kFn, args.x, g, "args.x");
  if (r.ok()) r = Require(kFn, args.mean, "args.mean");
  if (r.ok()) r = Require(kFn, args.invstd, "args.invstd");
  if (r.ok()) r = Require(kFn, sum_dy, "sum_dy");
  if (r.ok()) r = Require(kFn, sum_dy_xmu, "sum_dy_xmu");
  if (r.ok()) r = CheckGridX(kFn, g.channels);
  if (!r.ok()) return r;
  std::fill(sum_dy, sum_dy + g.channels, 0.0);
  std::fill(sum_dy_xmu, sum_dy_xmu + g.channels, 0.0);
  if (g.per_channel() == 0) return r;
  r = CheckDevice(kFn);
  if (r.ok()) r = CheckDevicePointer(kFn, args.dy, "args.dy");
  if (r.ok()) r = CheckDevicePointer(kFn, args.x, "args.x");
  if (r.ok()) r = CheckDevicePointer(kFn, args.y, "args.y");
  if (!r.ok()) return r;
  return DispatchDType(kFn, dtype, [&](auto tag) {
    using T = decltype(tag);
    return RunSums<T>(static_cast<cudaStream_t>(stream), g, args, sum_dy,
                      sum_dy_xmu);
  });
}

}  // namespace cuda
}  // namespace syncnorm
