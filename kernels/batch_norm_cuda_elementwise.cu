// The CUDA elementwise kernels: Forward and BackwardElementwise.
//
// Per element the arithmetic is float32 from per-channel coefficients that
// the host prepares in double (mean as a float pair, see Centered); each
// output is rounded once to its type. Each thread handles groups of 16
// bytes (one vector load or store per tensor when every tensor is 16-byte
// aligned), grid-stride over a slice of at most kSliceElements elements,
// whose channels run (c0 + i / inner) mod C: a slice is whole batch items,
// whole planes of one item, or a piece of one plane, so a batch item of
// any size is covered. The coefficients go up through pinned memory and
// stream-ordered device memory, so the call never waits for the stream.
// y may alias x and grad_input or grad_z may alias dy: every thread reads
// its elements before it writes them, and no other thread touches them, so
// no pointer is __restrict__.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_memory.cuh"

namespace syncnorm {
namespace cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;
// Blocks per multiprocessor of a grid-stride elementwise launch.
constexpr int kBlocksPerSm = 8;

// y = (x - mean) * scale + shift, per channel.
struct ForwardCoef {
  float mean_hi, mean_lo, scale, shift;
};

// grad_input = a * (dy - mean_dy - (x - mean) * k), per channel.
struct BackwardCoef {
  float mean_hi, mean_lo, a, mean_dy, k;
};

// A slice: `elements` elements from flat element `first`, whose element i
// has channel (c0 + i / inner) mod C.
struct Slice {
  int64_t first;
  int64_t elements;
  int64_t c0;
  int64_t inner;
};

// Walks the channels of consecutive elements of a slice.
struct ChannelWalk {
  uint32_t channel;  // of the current element
  uint32_t pos;      // its index within its plane (< inner)
};

// The channel of element i (< 2^31) of a slice, and how to step it.
struct ChannelOf {
  FastDivmod channels;  // divides by C
  FastDivmod inner;     // divides by the slice's inner
  uint32_t c0;

  __device__ __forceinline__ ChannelWalk operator()(uint32_t i) const {
    const uint32_t plane = inner.Div(i);
    const uint32_t c = c0 + plane;  // < 2^31: see MakeSlices
    return ChannelWalk{c - channels.Div(c) * channels.divisor,
                       i - plane * inner.divisor};
  }
  __device__ __forceinline__ void Next(ChannelWalk& w) const {
    if (++w.pos == inner.divisor) {
      w.pos = 0;
      if (++w.channel == channels.divisor) w.channel = 0;
    }
  }
};

// Calls body(first, count) for the groups of V elements of the slice's
// `elements` (first = g * V) this thread owns, striding over the grid,
// then for the last elements % V elements one by one (count = 1).
template <int V, typename Body>
__device__ __forceinline__ void ForEachGroup(int64_t elements, Body&& body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t me = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = elements / V;
  for (int64_t g = me; g < groups; g += stride) body(g * V, V);
  const int64_t tail = groups * V + me;
  if (tail < elements) body(tail, 1);
}

template <typename T, int V>
struct Tile {
  T v[V];
};

// Loads `count` (V or 1) elements of p + i into t (vector when V and
// kVectorLoads).
template <typename T, int V, bool kVectorLoads>
__device__ __forceinline__ void LoadTile(const T* p, int64_t i, int count,
                                         Tile<T, V>& t) {
  if (kVectorLoads && count == V) {
    const Pack<T, V> pack = LoadPack<T, V>(p + i);
#pragma unroll
    for (int u = 0; u < V; ++u) t.v[u] = pack.v[u];
  } else {
    for (int u = 0; u < count; ++u) t.v[u] = p[i + u];
  }
}

template <typename T, int V, bool kVectorLoads>
__device__ __forceinline__ void StoreTile(T* p, int64_t i, int count,
                                          const float (&f)[V]) {
  if (kVectorLoads && count == V) {
    Pack<T, V> pack;
#pragma unroll
    for (int u = 0; u < V; ++u) Store(&pack.v[u], f[u]);
    StorePack<T, V>(p + i, pack);
  } else {
    for (int u = 0; u < count; ++u) Store(p + i + u, f[u]);
  }
}

template <typename T, int V, bool kVectorLoads>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* x, const T* z, T* y, const ForwardCoef* coef,
                  ChannelOf channel_of, int64_t elements, bool relu) {
  ForEachGroup<V>(elements, [&](int64_t i, int count) {
    Tile<T, V> xv{}, zv{};
    LoadTile<T, V, kVectorLoads>(x, i, count, xv);
    if (z != nullptr) LoadTile<T, V, kVectorLoads>(z, i, count, zv);
    ChannelWalk w = channel_of(static_cast<uint32_t>(i));
    float out[V] = {};
#pragma unroll
    for (int u = 0; u < V; ++u) {
      if (u >= count) break;
      const ForwardCoef co = coef[w.channel];
      float v = Centered(ToFloat(xv.v[u]), co.mean_hi, co.mean_lo) * co.scale +
                co.shift;
      if (z != nullptr) v += ToFloat(zv.v[u]);
      out[u] = relu ? Relu(v) : v;
      channel_of.Next(w);
    }
    StoreTile<T, V, kVectorLoads>(y, i, count, out);
  });
}

template <typename T, int V, bool kVectorLoads>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const T* dy, const T* x, const T* y, T* grad_input,
                   T* grad_z, const BackwardCoef* coef, ChannelOf channel_of,
                   int64_t elements) {
  ForEachGroup<V>(elements, [&](int64_t i, int count) {
    Tile<T, V> dv{}, xv{}, yv{};
    LoadTile<T, V, kVectorLoads>(dy, i, count, dv);
    LoadTile<T, V, kVectorLoads>(x, i, count, xv);
    if (y != nullptr) LoadTile<T, V, kVectorLoads>(y, i, count, yv);
    ChannelWalk w = channel_of(static_cast<uint32_t>(i));
    float gi[V] = {}, gz[V] = {};
#pragma unroll
    for (int u = 0; u < V; ++u) {
      if (u >= count) break;
      const BackwardCoef co = coef[w.channel];
      float d = ToFloat(dv.v[u]);
      if (y != nullptr) d = ToFloat(yv.v[u]) > 0.0f ? d : 0.0f;
      const float xmu = Centered(ToFloat(xv.v[u]), co.mean_hi, co.mean_lo);
      gi[u] = co.a * ((d - co.mean_dy) - xmu * co.k);
      gz[u] = d;
      channel_of.Next(w);
    }
    // Every load of these elements happened above, so aliasing dy is safe.
    if (grad_z != nullptr) StoreTile<T, V, kVectorLoads>(grad_z, i, count, gz);
    StoreTile<T, V, kVectorLoads>(grad_input, i, count, gi);
  });
}

// `offset` elements past p, or nullptr for an absent optional tensor.
template <typename T>
T* Advance(T* p, int64_t offset) {
  return p == nullptr ? nullptr : p + offset;
}

// The slices of g, each at most kSliceElements elements, in order: whole
// batch items when one fits, else whole planes of one item, else pieces of
// one plane (whose elements all have one channel).
std::vector<Slice> MakeSlices(const Geometry& g) {
  std::vector<Slice> slices;
  const int64_t row = g.channels * g.inner;
  if (row <= kSliceElements) {
    const int64_t rows_per = kSliceElements / row;
    for (int64_t o = 0; o < g.outer; o += rows_per) {
      const int64_t rows = std::min(rows_per, g.outer - o);
      slices.push_back(Slice{o * row, rows * row, 0, g.inner});
    }
  } else if (g.inner <= kSliceElements) {
    const int64_t planes_per = kSliceElements / g.inner;
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t c = 0; c < g.channels; c += planes_per) {
        const int64_t planes = std::min(planes_per, g.channels - c);
        slices.push_back(
            Slice{o * row + c * g.inner, planes * g.inner, c, g.inner});
      }
    }
  } else {
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t c = 0; c < g.channels; ++c) {
        for (int64_t j = 0; j < g.inner; j += kSliceElements) {
          const int64_t n = std::min(kSliceElements, g.inner - j);
          slices.push_back(
              Slice{o * row + c * g.inner + j, n, c, kSliceElements});
        }
      }
    }
  }
  return slices;
}

// Calls launch(slice, channel_of, grid) per slice, the grid sized for
// groups of `vector` elements per thread.
template <typename Launch>
Result ForEachSlice(const char* kFn, const Geometry& g, int vector,
                    Launch&& launch) {
  int sms = 0;
  SYNCNORM_CUDA_TRY(MultiprocessorCount(&sms));
  for (const Slice& s : MakeSlices(g)) {
    ChannelOf channel_of;
    channel_of.channels = FastDivmod(static_cast<uint32_t>(g.channels));
    channel_of.inner = FastDivmod(static_cast<uint32_t>(s.inner));
    channel_of.c0 = static_cast<uint32_t>(s.c0);
    const int64_t grid = std::max<int64_t>(
        1, std::min<int64_t>(CeilDiv(s.elements, kThreads * vector),
                             static_cast<int64_t>(sms) * kBlocksPerSm));
    SYNCNORM_RETURN_IF_ERROR(
        launch(s, channel_of, static_cast<unsigned>(grid)));
    SYNCNORM_CUDA_CHECK_LAUNCH();
  }
  return Result{};
}

// Whether every non-null pointer is 16-byte aligned.
bool AllAligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (!Aligned(p, 16)) return false;
  }
  return true;
}

template <typename T>
Result RunForward(cudaStream_t stream, const Geometry& g,
                  const ForwardArgs& args) {
  constexpr char kFn[] = "Forward (CUDA)";
  const size_t bytes = g.channels * sizeof(ForwardCoef);
  Workspace ws(stream);
  SYNCNORM_RETURN_IF_ERROR(ws.Reserve(kFn, bytes, bytes));
  auto* coef = reinterpret_cast<ForwardCoef*>(ws.host());
  for (int64_t c = 0; c < g.channels; ++c) {
    const double w =
        args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]);
    SplitDouble(args.mean[c], &coef[c].mean_hi, &coef[c].mean_lo);
    coef[c].scale = static_cast<float>(args.invstd[c] * w);
    coef[c].shift =
        args.bias == nullptr ? 0.0f : static_cast<float>(args.bias[c]);
  }
  auto* dev_coef = reinterpret_cast<ForwardCoef*>(ws.device());
  SYNCNORM_CUDA_TRY(
      cudaMemcpyAsync(dev_coef, coef, bytes, cudaMemcpyHostToDevice, stream));
  const auto* x = static_cast<const T*>(args.x);
  const auto* z = static_cast<const T*>(args.z);
  auto* y = static_cast<T*>(args.y);
  constexpr int kV = kVector<T>;
  return ForEachSlice(
      kFn, g, kV, [&](const Slice& s, const ChannelOf& ch, unsigned grid) {
        const T* xs = x + s.first;
        const T* zs = Advance(z, s.first);
        T* ys = y + s.first;
        if (AllAligned({xs, zs, ys})) {
          SYNCNORM_LAUNCH(grid, kThreads, 0, stream, ForwardKernel<T, kV, true>)
          (xs, zs, ys, dev_coef, ch, s.elements, args.relu);
        } else {
          SYNCNORM_LAUNCH(grid, kThreads, 0, stream,
                          ForwardKernel<T, kV, false>)
          (xs, zs, ys, dev_coef, ch, s.elements, args.relu);
        }
        return Result{};
      });
}

template <typename T>
Result RunBackward(cudaStream_t stream, const Geometry& g,
                   const BackwardElementwiseArgs& args) {
  constexpr char kFn[] = "BackwardElementwise (CUDA)";
  const size_t bytes = g.channels * sizeof(BackwardCoef);
  Workspace ws(stream);
  SYNCNORM_RETURN_IF_ERROR(ws.Reserve(kFn, bytes, bytes));
  auto* coef = reinterpret_cast<BackwardCoef*>(ws.host());
  for (int64_t c = 0; c < g.channels; ++c) {
    const double invstd = args.invstd[c];
    const double w =
        args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]);
    SplitDouble(args.mean[c], &coef[c].mean_hi, &coef[c].mean_lo);
    coef[c].a = static_cast<float>(w * invstd);
    coef[c].mean_dy = static_cast<float>(args.mean_dy[c]);
    coef[c].k = static_cast<float>(invstd * invstd * args.mean_dy_xmu[c]);
  }
  auto* dev_coef = reinterpret_cast<BackwardCoef*>(ws.device());
  SYNCNORM_CUDA_TRY(
      cudaMemcpyAsync(dev_coef, coef, bytes, cudaMemcpyHostToDevice, stream));
  const auto* dy = static_cast<const T*>(args.dy);
  const auto* x = static_cast<const T*>(args.x);
  const auto* y = static_cast<const T*>(args.y);
  auto* grad_input = static_cast<T*>(args.grad_input);
  auto* grad_z = static_cast<T*>(args.grad_z);
  constexpr int kV = kVector<T>;
  return ForEachSlice(kFn, g, kV,
                      [&](const Slice& s, const ChannelOf& ch, unsigned grid) {
                        const T* dys = dy + s.first;
                        const T* xs = x + s.first;
                        const T* ys = Advance(y, s.first);
                        T* gis = grad_input + s.first;
                        T* gzs = Advance(grad_z, s.first);
                        if (AllAligned({dys, xs, ys, gis, gzs})) {
                          SYNCNORM_LAUNCH(grid, kThreads, 0, stream,
                                          BackwardKernel<T, kV, true>)
                          (dys, xs, ys, gis, gzs, dev_coef, ch, s.elements);
                        } else {
                          SYNCNORM_LAUNCH(grid, kThreads, 0, stream,
                                          BackwardKernel<T, kV, false>)
                          (dys, xs, ys, gis, gzs, dev_coef, ch, s.elements);
                        }
                        return Result{};
                      });
}

}  // namespace
}  // namespace detail

Result Forward(void* stream, DType dtype, const Geometry& g,
               const ForwardArgs& args) {
  using namespace detail;  // NOLINT: the launcher's own helpers
  constexpr char kFn[] = "Forward (CUDA)";
  Result r = CheckGeometry(kFn, g);
  if (r.ok()) r = DispatchDType(kFn, dtype, [](auto) { return Result{}; });
  if (r.ok()) r = RequireTensor(kFn, args.x, g, "args.x");
  if (r.ok()) r = RequireTensor(kFn, args.y, g, "args.y");
  if (r.ok()) r = Require(kFn, args.mean, "args.mean");
  if (r.ok()) r = Require(kFn, args.invstd, "args.invstd");
  if (!r.ok() || g.elements() == 0) return r;
  r = CheckDevice(kFn);
  if (r.ok()) r = CheckDevicePointer(kFn, args.x, "args.x");
  if (r.ok()) r = CheckDevicePointer(kFn, args.y, "args.y");
  if (r.ok()) r = CheckDevicePointer(kFn, args.z, "args.z");
  if (!r.ok()) return r;
  return DispatchDType(kFn, dtype, [&](auto tag) {
    return RunForward<decltype(tag)>(static_cast<cudaStream_t>(stream), g,
                                     args);
  });
}

Result BackwardElementwise(void* stream, DType dtype, const Geometry& g,
                           const BackwardElementwiseArgs& args) {
  using namespace detail;  // NOLINT: the launcher's own helpers
  constexpr char kFn[] = "BackwardElementwise (CUDA)";
  Result r = CheckGeometry(kFn, g);
  if (r.ok()) r = DispatchDType(kFn, dtype, [](auto) { return Result{}; });
  if (r.ok()) r = RequireTensor(kFn, args.dy, g, "args.dy");
  if (r.ok()) r = RequireTensor(kFn, args.x, g, "args.x");
  if (r.ok()) r = RequireTensor(kFn, args.grad_input, g, "args.grad_input");
  if (r.ok()) r = Require(kFn, args.mean, "args.mean");
  if (r.ok()) r = Require(kFn, args.invstd, "args.invstd");
  if (r.ok()) r = Require(kFn, args.mean_dy, "args.mean_dy");
  if (r.ok()) r = Require(kFn, args.mean_dy_xmu, "args.mean_dy_xmu");
  if (!r.ok() || g.elements() == 0) return r;
  r = CheckDevice(kFn);
  if (r.ok()) r = CheckDevicePointer(kFn, args.dy, "args.dy");
  if (r.ok()) r = CheckDevicePointer(kFn, args.x, "args.x");
  if (r.ok()) r = CheckDevicePointer(kFn, args.y, "args.y");
  if (r.ok()) r = CheckDevicePointer(kFn, args.grad_input, "args.grad_input");
  if (r.ok()) r = CheckDevicePointer(kFn, args.grad_z, "args.grad_z");
  if (!r.ok()) return r;
  return DispatchDType(kFn, dtype, [&](auto tag) {
    return RunBackward<decltype(tag)>(static_cast<cudaStream_t>(stream), g,
                                      args);
  });
}

}  // namespace cuda
}  // namespace syncnorm
