// The CUDA reductions: LocalMoments and BackwardReduce.
//
// Numerics: every thread accumulates in float64 (moments as the sums of
// d = x - p and d * d, p the thread's first value, so that |mean| >> std
// costs nothing; gradient sums as dy and dy * (x - mean)), and threads,
// warps, blocks and parts are merged in float64 (Chan's rule for moments)
// in a fixed order. Which thread reads which elements depends only on the
// geometry and the dtype, so results are bitwise the same on every run
// and every GPU, whatever the timing or the tensor's alignment.
//
// Two ways of reading, both coalesced:
//  - Column (channels-last, and channels-first with inner < 32): a block
//    reads rows of the [rows, C * inner] matrix, W consecutive columns
//    (whole channels) of many rows at once; with C * inner <= 32 a warp
//    reads 32 consecutive elements spanning rows.
//  - Plane (channels-first with inner >= 32): a warp per (channel, part)
//    walks its part of the channel's planes, each lane a group of 16 bytes
//    at a time (one vector load when the tensors are aligned).
// A channel's parts are then folded by a second kernel (none when there is
// one part). Indices are 64-bit: any tensor size works without slicing.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_memory.cuh"
#include "kernels/formulas.h"

namespace syncnorm {
namespace cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
// Plane reads channels whose planes hold at least this many values.
constexpr int64_t kPlaneMinInner = 32;
// About how much work makes one block (column) or warp (plane), and about
// how many of them fill a large GPU.
constexpr int64_t kValuesPerBlock = 16384;
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kValuesPerWarp = 4096;
constexpr int64_t kTargetWarps = 8192;
constexpr int64_t kMaxParts = 1024;
constexpr int64_t kMaxGridY = 65535;

// ---- partial results and their merge ----------------------------------------

struct MomentsD {
  double n, mean, m2;
};

// n counts the values summed (a check that none was skipped).
struct SumsD {
  double n, dy, dy_xmu;
};

__device__ __forceinline__ void Merge(MomentsD& a, const MomentsD& b) {
  ChanMerge(a.n, a.mean, a.m2, b.n, b.mean, b.m2);
}
__device__ __forceinline__ void Merge(SumsD& a, const SumsD& b) {
  a.n += b.n;
  a.dy += b.dy;
  a.dy_xmu += b.dy_xmu;
}

// Lane i gets lane i + offset's partial (or its own past the warp's end).
__device__ __forceinline__ MomentsD ShuffleDown(const MomentsD& p, int offset) {
  return MomentsD{__shfl_down_sync(0xffffffffu, p.n, offset),
                  __shfl_down_sync(0xffffffffu, p.mean, offset),
                  __shfl_down_sync(0xffffffffu, p.m2, offset)};
}
__device__ __forceinline__ SumsD ShuffleDown(const SumsD& p, int offset) {
  return SumsD{__shfl_down_sync(0xffffffffu, p.n, offset),
               __shfl_down_sync(0xffffffffu, p.dy, offset),
               __shfl_down_sync(0xffffffffu, p.dy_xmu, offset)};
}

// Lane 0 gets the warp's merge, in a fixed tree order. Every lane of the
// warp must call it.
template <typename Partial>
__device__ __forceinline__ Partial WarpMerge(Partial p) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    Merge(p, ShuffleDown(p, offset));
  }
  return p;
}

// ---- what a thread accumulates ----------------------------------------------

// Moments of x. REQUIRES for AddGroup: G consecutive elements from i.
template <typename T>
struct MomentsOp {
  using Partial = MomentsD;
  struct Acc {
    double n = 0, pivot = 0, s = 0, q = 0;
  };
  const T* x;

  __device__ __forceinline__ void Begin(Acc&, int64_t) const {}
  __device__ __forceinline__ static void Push(Acc& a, float v) {
    if (a.n == 0.0) a.pivot = v;
    const double d = static_cast<double>(v) - a.pivot;  // exact
    a.n += 1.0;
    a.s += d;
    a.q += d * d;
  }
  __device__ __forceinline__ void Add(Acc& a, int64_t i) const {
    Push(a, Load(x + i));
  }
  template <int G, bool kVectorLoads>
  __device__ __forceinline__ void AddGroup(Acc& a, int64_t i) const {
    if (kVectorLoads) {
      const Pack<T, G> v = LoadPack<T, G>(x + i);
#pragma unroll
      for (int u = 0; u < G; ++u) Push(a, ToFloat(v.v[u]));
    } else {
#pragma unroll
      for (int u = 0; u < G; ++u) Push(a, Load(x + i + u));
    }
  }
  __device__ __forceinline__ static Partial Finish(const Acc& a) {
    if (a.n == 0.0) return Partial{0.0, 0.0, 0.0};
    const double dm = a.s / a.n;
    return Partial{a.n, a.pivot + dm, fmax(0.0, a.q - a.s * dm)};
  }
};

// sum(dy) and sum(dy * (x - mean)), dy masked by y > 0 when y is given.
template <typename T>
struct SumsOp {
  using Partial = SumsD;
  struct Acc {
    double n = 0, dy = 0, dy_xmu = 0, mean = 0;
  };
  const T* dy;
  const T* x;
  const T* y;  // optional
  const double* mean;

  __device__ __forceinline__ void Begin(Acc& a, int64_t channel) const {
    a.mean = mean[channel];
  }
  __device__ __forceinline__ static void Push(Acc& a, float d, float xv,
                                              bool keep) {
    const double dd = keep ? static_cast<double>(d) : 0.0;
    a.n += 1.0;
    a.dy += dd;
    a.dy_xmu += dd * (static_cast<double>(xv) - a.mean);
  }
  __device__ __forceinline__ void Add(Acc& a, int64_t i) const {
    Push(a, Load(dy + i), Load(x + i), y == nullptr || Load(y + i) > 0.0f);
  }
  template <int G, bool kVectorLoads>
  __device__ __forceinline__ void AddGroup(Acc& a, int64_t i) const {
    if (kVectorLoads) {
      const Pack<T, G> d = LoadPack<T, G>(dy + i);
      const Pack<T, G> xv = LoadPack<T, G>(x + i);
      Pack<T, G> yv = d;
      if (y != nullptr) yv = LoadPack<T, G>(y + i);
#pragma unroll
      for (int u = 0; u < G; ++u) {
        Push(a, ToFloat(d.v[u]), ToFloat(xv.v[u]),
             y == nullptr || ToFloat(yv.v[u]) > 0.0f);
      }
    } else {
#pragma unroll
      for (int u = 0; u < G; ++u) Add(a, i + u);
    }
  }
  __device__ __forceinline__ static Partial Finish(const Acc& a) {
    return Partial{a.n, a.dy, a.dy_xmu};
  }
};

// ---- kernels
// ------------------------------------------------------------------

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

// The [rows, channels * inner] view read by ColumnKernel: a block covers
// channels_per_tile whole channels (width = channels_per_tile * inner
// columns) of `lanes` rows at a time.
struct ColumnShape {
  int64_t rows;
  int64_t row_stride;  // channels * inner
  int64_t channels;
  int inner;
  int channels_per_tile;
  int lanes;
};

// Shared memory of a block's column merge, one partial per thread.
template <typename Partial>
__device__ __forceinline__ Partial* BlockPartials() {
  __shared__ Partial partials[kThreads];
  return partials;
}

// Block (tile = blockIdx.x, part = blockIdx.y) writes the partial of each
// of its channels for its part of the rows: out[part * channels + c].
template <typename Op>
__global__ void __launch_bounds__(kThreads)
    ColumnKernel(Op op, ColumnShape shape, typename Op::Partial* out) {
  using Partial = typename Op::Partial;
  const int width = shape.channels_per_tile * shape.inner;
  const int t = threadIdx.x;
  const int lx = t % width;
  const int ly = t / width;
  const int64_t channel =
      static_cast<int64_t>(blockIdx.x) * shape.channels_per_tile +
      lx / shape.inner;
  const bool active = ly < shape.lanes && channel < shape.channels;
  const Range rows = PartRange(shape.rows, gridDim.y, blockIdx.y);
  typename Op::Acc acc;
  if (active) {
    op.Begin(acc, channel);
    const int64_t column = static_cast<int64_t>(blockIdx.x) * width + lx;
    for (int64_t r = rows.begin + ly; r < rows.end; r += shape.lanes) {
      op.Add(acc, r * shape.row_stride + column);
    }
  }
  Partial* partial = BlockPartials<Partial>();
  partial[t] = Op::Finish(acc);
  // The row lanes of each column, folded pairwise in a fixed tree.
  for (int step = 1; step < shape.lanes; step *= 2) {
    __syncthreads();  // every partial of the previous level is written
    if (ly % (2 * step) == 0 && ly + step < shape.lanes) {
      Merge(partial[t], partial[t + step * width]);
    }
  }
  __syncthreads();
  // The first column of each channel folds the channel's columns in order.
  if (active && ly == 0 && lx % shape.inner == 0) {
    Partial p = partial[lx];
    for (int k = 1; k < shape.inner; ++k) Merge(p, partial[lx + k]);
    out[static_cast<int64_t>(blockIdx.y) * shape.channels + channel] = p;
  }
}

// The channels-first view read by PlaneKernel: unit u = part * channels + c
// is warp u's, which reads groups of G consecutive values of its part of
// channel c's per-channel values (index k = o * inner + j).
struct PlaneShape {
  int64_t channels;
  int64_t inner;
  int64_t row_stride;  // channels * inner
  int64_t per_channel;
  int64_t parts;
  int64_t units;
};

template <typename Op, int G, bool kVectorLoads>
__global__ void __launch_bounds__(kThreads)
    PlaneKernel(Op op, PlaneShape shape, typename Op::Partial* out) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock +
                       threadIdx.x / kWarpSize;
  if (unit >= shape.units) return;  // whole warps: no warp call is split
  const int64_t channel = unit % shape.channels;
  const int64_t part = unit / shape.channels;
  const Range groups = PartRange(shape.per_channel / G, shape.parts, part);
  typename Op::Acc acc;
  op.Begin(acc, channel);
  int64_t g = groups.begin + lane;
  if (g < groups.end) {
    // (o, j) of k = g * G, advanced without dividing.
    int64_t o = g * G / shape.inner;
    int64_t j = g * G - o * shape.inner;
    const int64_t base = channel * shape.inner;
    for (; g < groups.end; g += kWarpSize) {
      op.template AddGroup<G, kVectorLoads>(acc,
                                            o * shape.row_stride + base + j);
      j += kWarpSize * G;
      while (j >= shape.inner) {
        j -= shape.inner;
        ++o;
      }
    }
  }
  const typename Op::Partial p = WarpMerge(Op::Finish(acc));
  if (lane == 0) out[unit] = p;
}

// Folds the `parts` partials of each channel (in[part * channels + c]): a
// warp per channel, lane l taking parts l, l + 32, ... in order, then the
// warp's tree.
template <typename Partial>
__global__ void __launch_bounds__(kThreads)
    FinalizeKernel(const Partial* in, int64_t parts, int64_t channels,
                   Partial* out) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock +
                    threadIdx.x / kWarpSize;
  if (c >= channels) return;  // whole warps
  Partial acc{};
  for (int64_t p = lane; p < parts; p += kWarpSize) {
    Merge(acc, in[p * channels + c]);
  }
  acc = WarpMerge(acc);
  if (lane == 0) out[c] = acc;
}

// ---- host side
// ------------------------------------------------------------------

// How a reduction is cut. Depends on the geometry and dtype only.
struct ReducePlan {
  bool plane = false;
  int64_t parts = 1;
  // Column.
  ColumnShape column{};
  int64_t tiles = 0;
  int threads = kThreads;
  // Plane: values per group.
  PlaneShape shape{};
  int group = 1;
};

ReducePlan MakePlan(const Geometry& g, int vector) {
  ReducePlan p;
  const int64_t c = g.channels;
  if (g.inner >= kPlaneMinInner) {
    p.plane = true;
    p.group = g.inner % vector == 0 ? vector : 1;
    const int64_t per_channel = g.outer * g.inner;
    p.parts =
        std::min({std::max<int64_t>(1, CeilDiv(per_channel, kValuesPerWarp)),
                  std::max<int64_t>(1, kTargetWarps / c), kMaxParts,
                  per_channel / p.group});
    p.shape =
        PlaneShape{c, g.inner, c * g.inner, per_channel, p.parts, p.parts * c};
    return p;
  }
  const int inner = static_cast<int>(std::max<int64_t>(1, g.inner));
  const int per_tile =
      static_cast<int>(std::min<int64_t>(c, std::max(1, kWarpSize / inner)));
  const int width = per_tile * inner;
  const int lanes = static_cast<int>(
      std::min<int64_t>(kThreads / width, std::max<int64_t>(1, g.outer)));
  p.column = ColumnShape{g.outer, c * inner, c, inner, per_tile, lanes};
  p.tiles = CeilDiv(c, per_tile);
  p.threads = static_cast<int>(CeilDiv(lanes * width, kWarpSize) * kWarpSize);
  p.parts = std::min(
      {std::max<int64_t>(1, CeilDiv(g.outer * width, kValuesPerBlock)),
       std::max<int64_t>(1, kTargetBlocks / p.tiles), g.outer, kMaxGridY});
  return p;
}

// Launches the kernel of `plan` writing the partials of `op` to `out`.
// `vector_loads`: every tensor `op` reads is 16-byte aligned.
template <typename Op>
Result LaunchReduce(const char* kFn, cudaStream_t stream,
                    const ReducePlan& plan, const Op& op, bool vector_loads,
                    typename Op::Partial* out) {
  using T = std::remove_cv_t<std::remove_pointer_t<decltype(op.x)>>;
  if (!plan.plane) {
    const dim3 grid(static_cast<unsigned>(plan.tiles),
                    static_cast<unsigned>(plan.parts));
    SYNCNORM_LAUNCH(grid, plan.threads, 0, stream, ColumnKernel<Op>)
    (op, plan.column, out);
  } else {
    const unsigned blocks =
        static_cast<unsigned>(CeilDiv(plan.shape.units, kWarpsPerBlock));
    constexpr int kG = kVector<T>;
    if (plan.group == 1) {
      SYNCNORM_LAUNCH(blocks, kThreads, 0, stream, PlaneKernel<Op, 1, false>)
      (op, plan.shape, out);
    } else if (vector_loads) {
      SYNCNORM_LAUNCH(blocks, kThreads, 0, stream, PlaneKernel<Op, kG, true>)
      (op, plan.shape, out);
    } else {
      SYNCNORM_LAUNCH(blocks, kThreads, 0, stream, PlaneKernel<Op, kG, false>)
      (op, plan.shape, out);
    }
  }
  SYNCNORM_CUDA_CHECK_LAUNCH();
  return Result{};
}

// Runs the reduction of `op` over geometry g with the partials at
// device_offset of `ws`: *host_results gets the per-channel results, in
// the pinned memory of `ws` at host_offset, once the stream is
// synchronized. INTERNAL when a channel's count is not g.per_channel().
template <typename Op>
Result Reduce(const char* kFn, Workspace& ws, size_t device_offset,
              size_t host_offset, const Geometry& g, const Op& op,
              bool vector_loads, typename Op::Partial** host_results) {
  using Partial = typename Op::Partial;
  using T = std::remove_cv_t<std::remove_pointer_t<decltype(op.x)>>;
  const ReducePlan plan = MakePlan(g, kVector<T>);
  const int64_t c = g.channels;
  auto* partials = reinterpret_cast<Partial*>(ws.device() + device_offset);
  SYNCNORM_RETURN_IF_ERROR(
      LaunchReduce(kFn, ws.stream(), plan, op, vector_loads, partials));
  const Partial* results = partials;
  if (plan.parts > 1) {
    Partial* folded = partials + plan.parts * c;
    const unsigned blocks = static_cast<unsigned>(CeilDiv(c, kWarpsPerBlock));
    SYNCNORM_LAUNCH(blocks, kThreads, 0, ws.stream(), FinalizeKernel<Partial>)
    (partials, plan.parts, c, folded);
    SYNCNORM_CUDA_CHECK_LAUNCH();
    results = folded;
  }
  auto* host = reinterpret_cast<Partial*>(ws.host() + host_offset);
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(host, results, c * sizeof(Partial),
                                    cudaMemcpyDeviceToHost, ws.stream()));
  SYNCNORM_CUDA_TRY(cudaStreamSynchronize(ws.stream()));
  const double expected = static_cast<double>(g.per_channel());
  for (int64_t k = 0; k < c; ++k) {
    if (host[k].n != expected) {
      char counted[32];
      std::snprintf(counted, sizeof(counted), "%.17g", host[k].n);
      return Fail(Code::kInternal, std::string(kFn) + ": the kernels counted " +
                                       counted + " values of channel " +
                                       std::to_string(k) + ", expected " +
                                       std::to_string(g.per_channel()));
    }
  }
  *host_results = host;
  return Result{};
}

// Device bytes a reduction of g needs for its partials.
template <typename Partial, typename T>
size_t PartialBytes(const Geometry& g) {
  const ReducePlan plan = MakePlan(g, kVector<T>);
  const int64_t entries = (plan.parts + (plan.parts > 1 ? 1 : 0)) * g.channels;
  return static_cast<size_t>(entries) * sizeof(Partial);
}

template <typename T>
Result RunMoments(cudaStream_t stream, const T* x, const Geometry& g,
                  double* mean, double* m2) {
  constexpr char kFn[] = "LocalMoments (CUDA)";
  Workspace ws(stream);
  SYNCNORM_RETURN_IF_ERROR(ws.Reserve(kFn, PartialBytes<MomentsD, T>(g),
                                      g.channels * sizeof(MomentsD)));
  MomentsD* host = nullptr;
  SYNCNORM_RETURN_IF_ERROR(
      Reduce(kFn, ws, 0, 0, g, MomentsOp<T>{x}, Aligned(x, 16), &host));
  for (int64_t c = 0; c < g.channels; ++c) {
    mean[c] = host[c].mean;
    m2[c] = host[c].m2;
  }
  return Result{};
}

template <typename T>
Result RunSums(cudaStream_t stream, const Geometry& g,
               const BackwardReduceArgs& args, double* sum_dy,
               double* sum_dy_xmu) {
  constexpr char kFn[] = "BackwardReduce (CUDA)";
  const size_t mean_bytes = g.channels * sizeof(double);
  // Device: the means, then the partials. Host: the means to upload, then
  // the results.
  const size_t offset = CeilDiv(mean_bytes, 256) * 256;
  Workspace ws(stream);
  SYNCNORM_RETURN_IF_ERROR(ws.Reserve(kFn, offset + PartialBytes<SumsD, T>(g),
                                      offset + g.channels * sizeof(SumsD)));
  auto* host_mean = reinterpret_cast<double*>(ws.host());
  std::copy(args.mean, args.mean + g.channels, host_mean);
  auto* dev_mean = reinterpret_cast<double*>(ws.device());
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(dev_mean, host_mean, mean_bytes,
                                    cudaMemcpyHostToDevice, stream));
  const SumsOp<T> op{static_cast<const T*>(args.dy),
                     static_cast<const T*>(args.x),
                     static_cast<const T*>(args.y), dev_mean};
  const bool aligned =
      Aligned(op.dy, 16) && Aligned(op.x, 16) && Aligned(op.y, 16);
  SumsD* host = nullptr;
  SYNCNORM_RETURN_IF_ERROR(
      Reduce(kFn, ws, offset, offset, g, op, aligned, &host));
  for (int64_t c = 0; c < g.channels; ++c) {
    sum_dy[c] = host[c].dy;
    sum_dy_xmu[c] = host[c].dy_xmu;
  }
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

void ReleaseScratch() { detail::ScratchRegistry::Get().Clear(); }

Result LocalMoments(void* stream, DType dtype, const void* x, const Geometry& g,
                    double* mean, double* m2) {
  using namespace detail;  // NOLINT: the launcher's own helpers
  constexpr char kFn[] = "LocalMoments (CUDA)";
  Result r = CheckGeometry(kFn, g);
  if (r.ok()) r = DispatchDType(kFn, dtype, [](auto) { return Result{}; });
  if (r.ok()) r = RequireTensor(kFn, x, g, "x");
  if (r.ok()) r = Require(kFn, mean, "mean");
  if (r.ok()) r = Require(kFn, m2, "m2");
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
