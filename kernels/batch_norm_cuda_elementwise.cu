// The CUDA elementwise kernels: Forward and BackwardElementwise.
//
// Per element the arithmetic is float32 from per-channel coefficients that
// the host prepares in double (mean as a float pair, see Centered); each
// output is rounded once to its type. y may alias x and grad_input or grad_z
// may alias dy: every thread reads an element before it writes it, and no
// other thread touches it, so no pointer is __restrict__.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/cuda_common.cuh"

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

// The channel of flat element i (< 2^31) of a slice of whole outer rows.
struct ChannelOf {
  bool last;
  FastDivmod channels;  // divides by C
  FastDivmod inner;     // divides by inner (channels-first)

  __device__ __forceinline__ uint32_t operator()(uint32_t i) const {
    const uint32_t row = last ? i : inner.Div(i);
    return row - channels.Div(row) * channels.divisor;
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const T* x, const T* z, T* y, const ForwardCoef* coef,
                  ChannelOf channel_of, int64_t elements, bool relu) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < elements; i += stride) {
    const ForwardCoef co = coef[channel_of(static_cast<uint32_t>(i))];
    float v = Centered(Load(x + i), co.mean_hi, co.mean_lo) * co.scale +
              co.shift;
    if (z != nullptr) v += Load(z + i);
    if (relu) v = Relu(v);
    Store(y + i, v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(const T* dy, const T* x, const T* y, T* grad_input,
                   T* grad_z, const BackwardCoef* coef, ChannelOf channel_of,
                   int64_t elements) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < elements; i += stride) {
    const BackwardCoef co = coef[channel_of(static_cast<uint32_t>(i))];
    float d = Load(dy + i);
    if (y != nullptr) d = Load(y + i) > 0.0f ? d : 0.0f;
    const float xmu = Centered(Load(x + i), co.mean_hi, co.mean_lo);
    const float gi = co.a * ((d - co.mean_dy) - xmu * co.k);
    // Both loads of element i happened above, so aliasing dy is safe.
    if (grad_z != nullptr) Store(grad_z + i, d);
    Store(grad_input + i, gi);
  }
}

// `offset` elements past p, or nullptr for an absent optional tensor.
template <typename T>
T* Advance(T* p, int64_t offset) {
  return p == nullptr ? nullptr : p + offset;
}

// Copies per-channel coefficients to stream-ordered device memory. The
// host vector may go away once this returns (pageable copies are staged).
template <typename Coef>
Result Upload(const char* kFn, cudaStream_t stream,
              const std::vector<Coef>& host, StreamBuffer& buffer) {
  SYNCNORM_CUDA_TRY(buffer.Allocate(host.size() * sizeof(Coef)));
  SYNCNORM_CUDA_TRY(cudaMemcpyAsync(buffer.as<Coef>(), host.data(),
                                    host.size() * sizeof(Coef),
                                    cudaMemcpyHostToDevice, stream));
  return Result{};
}

// Calls launch(first_element, elements_in_slice, grid) per slice of whole
// outer rows.
template <typename Launch>
Result ForEachSlice(const char* kFn, const Geometry& g, Launch&& launch) {
  int sms = 0;
  SYNCNORM_CUDA_TRY(MultiprocessorCount(&sms));
  const Slices slices = MakeSlices(g);
  const int64_t row = g.channels * g.inner;
  for (int64_t s = 0; s < slices.count; ++s) {
    const int64_t rows =
        std::min(slices.rows_per_slice, g.outer - s * slices.rows_per_slice);
    const int64_t elements = rows * row;
    const int64_t grid = std::max<int64_t>(
        1, std::min<int64_t>(CeilDiv(elements, kThreads),
                             static_cast<int64_t>(sms) * kBlocksPerSm));
    launch(s * slices.rows_per_slice * row, elements,
           static_cast<unsigned>(grid));
    SYNCNORM_CUDA_CHECK_LAUNCH();
  }
  return Result{};
}

ChannelOf MakeChannelOf(const Geometry& g) {
  ChannelOf f;
  f.last = g.inner == 1;
  f.channels = FastDivmod(static_cast<uint32_t>(g.channels));
  f.inner = FastDivmod(static_cast<uint32_t>(g.inner));
  return f;
}

template <typename T>
Result RunForward(cudaStream_t stream, const Geometry& g,
                  const ForwardArgs& args) {
  constexpr char kFn[] = "Forward (CUDA)";
  std::vector<ForwardCoef> coef(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    const double w =
        args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]);
    SplitDouble(args.mean[c], &coef[c].mean_hi, &coef[c].mean_lo);
    coef[c].scale = static_cast<float>(args.invstd[c] * w);
    coef[c].shift =
        args.bias == nullptr ? 0.0f : static_cast<float>(args.bias[c]);
  }
  StreamBuffer buffer(stream);
  Result r = Upload(kFn, stream, coef, buffer);
  if (!r.ok()) return r;
  const auto* x = static_cast<const T*>(args.x);
  const auto* z = static_cast<const T*>(args.z);
  auto* y = static_cast<T*>(args.y);
  const ChannelOf channel_of = MakeChannelOf(g);
  return ForEachSlice(kFn, g, [&](int64_t first, int64_t n, unsigned grid) {
    ForwardKernel<T><<<grid, kThreads, 0, stream>>>(
        x + first, Advance(z, first), y + first, buffer.as<ForwardCoef>(),
        channel_of, n, args.relu);
  });
}

template <typename T>
Result RunBackward(cudaStream_t stream, const Geometry& g,
                   const BackwardElementwiseArgs& args) {
  constexpr char kFn[] = "BackwardElementwise (CUDA)";
  std::vector<BackwardCoef> coef(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    const double invstd = args.invstd[c];
    const double w =
        args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]);
    SplitDouble(args.mean[c], &coef[c].mean_hi, &coef[c].mean_lo);
    coef[c].a = static_cast<float>(w * invstd);
    coef[c].mean_dy = static_cast<float>(args.mean_dy[c]);
    coef[c].k = static_cast<float>(invstd * invstd * args.mean_dy_xmu[c]);
  }
  StreamBuffer buffer(stream);
  Result r = Upload(kFn, stream, coef, buffer);
  if (!r.ok()) return r;
  const auto* dy = static_cast<const T*>(args.dy);
  const auto* x = static_cast<const T*>(args.x);
  const auto* y = static_cast<const T*>(args.y);
  auto* grad_input = static_cast<T*>(args.grad_input);
  auto* grad_z = static_cast<T*>(args.grad_z);
  const ChannelOf channel_of = MakeChannelOf(g);
  return ForEachSlice(kFn, g, [&](int64_t first, int64_t n, unsigned grid) {
    BackwardKernel<T><<<grid, kThreads, 0, stream>>>(
        dy + first, x + first, Advance(y, first), grad_input + first,
        Advance(grad_z, first), buffer.as<BackwardCoef>(), channel_of, n);
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
