// Shared pieces of the CUDA kernels (batch_norm_cuda_*.cu): per-element
// device helpers, integer division by an invariant divisor, error checking,
// argument validation and the one dtype dispatch. Included by .cu files only.
#ifndef SYNCNORM_KERNELS_CUDA_COMMON_CUH_
#define SYNCNORM_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/batch_norm_cuda.h"
#include "kernels/formulas.h"

// kernel<<<grid, block, shared, stream>>>(args...), written
// SYNCNORM_LAUNCH(grid, block, shared, stream, kernel)(args...) so that the
// same source also builds as host C++ for the CPU emulator
// (kernels/emulator), which launches it there. The kernel comes last so
// that a template-id with commas needs no parentheses.
#if defined(__CUDACC__)
#define SYNCNORM_LAUNCH(grid, block, shared, stream, ...) \
  __VA_ARGS__<<<grid, block, shared, stream>>>
#else
#define SYNCNORM_LAUNCH(grid, block, shared, stream, ...) \
  CUDA_EMULATOR_LAUNCH(grid, block, shared, stream, __VA_ARGS__)
#endif

// The most elements one elementwise launch covers: launches index their
// elements with 32 bits. Tests lower it to run the slicing of larger
// tensors on small ones.
#ifndef SYNCNORM_CUDA_SLICE_ELEMENTS
#define SYNCNORM_CUDA_SLICE_ELEMENTS 2147483647
#endif

namespace syncnorm {
namespace cuda {
namespace detail {

constexpr int64_t kSliceElements = SYNCNORM_CUDA_SLICE_ELEMENTS;
static_assert(kSliceElements >= 1 &&
                  kSliceElements <= std::numeric_limits<int32_t>::max(),
              "a slice is indexed with 32 bits");

// ---- per-element device helpers --------------------------------------------

// Loads widen to float; stores round once to nearest even.
__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __half* p) {
  return __half2float(*p);
}
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// V consecutive elements moved by one vector load or store (16 bytes at
// most). REQUIRES: the address is aligned to sizeof(Pack).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <typename T, int V>
__device__ __forceinline__ void StorePack(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// Elements of T per 16-byte vector.
template <typename T>
constexpr int kVector = static_cast<int>(16 / sizeof(T));

// x - mean with mean = hi + lo (two floats holding a double mean): exact
// enough that |mean| >> std loses nothing to the rounding of mean.
__device__ __forceinline__ float Centered(float x, float hi, float lo) {
  return (x - hi) - lo;
}

// The fused ReLU; NaN passes through as in torch.
__device__ __forceinline__ float Relu(float v) { return v < 0.0f ? 0.0f : v; }

// n / d for 0 <= n <= INT32_MAX and 1 <= d <= INT32_MAX, by a multiply and a
// shift (Granlund & Montgomery), as integer division is slow on the GPU.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    for (shift = 0; shift < 32; ++shift) {
      if ((1u << shift) >= d) break;
    }
    const uint64_t one = 1;
    multiplier =
        static_cast<uint32_t>(((one << 32) * ((one << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t Div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
};

// ---- errors -----------------------------------------------------------------

inline Result Fail(Code code, std::string message) {
  return Result{code, std::move(message)};
}

inline Result CudaFailure(const char* fn, const char* call, cudaError_t e) {
  return Fail(Code::kInternal, std::string(fn) + ": " + call +
                                   " failed: " + cudaGetErrorName(e) + " (" +
                                   cudaGetErrorString(e) + ")");
}

// Returns from the enclosing function (a launcher or check named by fn) with
// INTERNAL when a CUDA call or launch fails. SYNCNORM_CUDA_TRY names the
// launcher by its local constant kFn.
#define SYNCNORM_CUDA_TRY_NAMED(fn, call)                                     \
  do {                                                                        \
    const cudaError_t syncnorm_err_ = (call);                                 \
    if (syncnorm_err_ != cudaSuccess) {                                       \
      return ::syncnorm::cuda::detail::CudaFailure(fn, #call, syncnorm_err_); \
    }                                                                         \
  } while (0)
#define SYNCNORM_CUDA_TRY(call) SYNCNORM_CUDA_TRY_NAMED(kFn, call)

// Checks the launch just made (configuration errors show here; faults in
// the kernel show at the next synchronizing call).
#define SYNCNORM_CUDA_CHECK_LAUNCH() SYNCNORM_CUDA_TRY(cudaGetLastError())

// Returns from the enclosing function with r when it is an error.
#define SYNCNORM_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::syncnorm::cuda::Result syncnorm_result_ = (expr);  \
    if (!syncnorm_result_.ok()) return syncnorm_result_; \
  } while (0)

// ---- validation -------------------------------------------------------------

// A valid geometry: sizes >= 0, 1 <= channels <= INT32_MAX, and an element
// count that fits int64. Any size of batch item is fine: elementwise
// launches slice it, reductions index in 64 bits.
inline Result CheckGeometry(const char* fn, const Geometry& g) {
  if (g.outer < 0 || g.inner < 0 || g.channels < 1 ||
      g.channels > std::numeric_limits<int32_t>::max()) {
    return Fail(Code::kInvalidArgument,
                std::string(fn) +
                    ": geometry {outer=" + std::to_string(g.outer) +
                    ", channels=" + std::to_string(g.channels) +
                    ", inner=" + std::to_string(g.inner) +
                    "} is invalid; build it with MakeGeometry");
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (g.inner > 0 &&
      (g.channels > kMax / g.inner ||
       (g.outer > 0 && g.outer > kMax / (g.channels * g.inner)))) {
    return Fail(Code::kInvalidArgument,
                std::string(fn) +
                    ": the tensor's element count overflows "
                    "int64; check its shape");
  }
  return Result{};
}

inline Result Require(const char* fn, const void* p, const char* name) {
  if (p != nullptr) return Result{};
  return Fail(Code::kInvalidArgument,
              std::string(fn) + ": " + name + " is null; it is required");
}

inline Result RequireTensor(const char* fn, const void* p, const Geometry& g,
                            const char* name) {
  if (p != nullptr || g.elements() == 0) return Result{};
  return Fail(Code::kInvalidArgument,
              std::string(fn) + ": " + name + " is null but the tensor has " +
                  std::to_string(g.elements()) + " elements; pass its data");
}

// FAILED_PRECONDITION when no device is visible.
inline Result CheckDevice(const char* fn) {
  std::string why;
  if (VisibleDevices(&why) > 0) return Result{};
  return Fail(Code::kFailedPrecondition,
              std::string(fn) +
                  ": Device::kCuda but no CUDA device is "
                  "usable here (" +
                  why + "); run on a machine with a GPU or use Device::kCpu");
}

// A tensor pointer the current device can use: device memory of the
// current device, or managed memory. INVALID_ARGUMENT for host memory or
// memory of another device. Null (optional or empty) passes.
inline Result CheckDevicePointer(const char* fn, const void* p,
                                 const char* name) {
  if (p == nullptr) return Result{};
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for the next call
    return Fail(Code::kInvalidArgument,
                std::string(fn) + ": cannot tell where " + name + " lives (" +
                    cudaGetErrorString(e) + "); pass device memory");
  }
  if (attr.type == cudaMemoryTypeManaged) return Result{};
  if (attr.type != cudaMemoryTypeDevice) {
    return Fail(Code::kInvalidArgument,
                std::string(fn) + ": " + name +
                    " is host memory but the call says Device::kCuda; pass "
                    "a device pointer or use Device::kCpu");
  }
  int current = 0;
  SYNCNORM_CUDA_TRY_NAMED(fn, cudaGetDevice(&current));
  if (attr.device != current) {
    return Fail(Code::kInvalidArgument,
                std::string(fn) + ": " + name + " lives on CUDA device " +
                    std::to_string(attr.device) +
                    " but the current device is " + std::to_string(current) +
                    "; call cudaSetDevice(" + std::to_string(attr.device) +
                    ") first");
  }
  return Result{};
}

// Runs body(T{}) with T the device element type of dtype: the one place
// that maps DType to a type; an unknown dtype is INVALID_ARGUMENT.
template <typename Body>
Result DispatchDType(const char* fn, DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32:
      return body(float{});
    case DType::kFloat16:
      return body(__half{});
    case DType::kBFloat16:
      return body(__nv_bfloat16{});
    default:
      return Fail(Code::kInvalidArgument,
                  std::string(fn) + ": unknown dtype " +
                      std::to_string(static_cast<int>(dtype)) +
                      "; use kFloat32, kFloat16 or kBFloat16");
  }
}

// ---- launch geometry
// ----------------------------------------------------------

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether p is aligned to `bytes`.
inline bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The multiprocessor count of the current device (sizes elementwise grids).
inline cudaError_t MultiprocessorCount(int* count) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}

// A double as a float pair hi + lo (see Centered).
inline void SplitDouble(double v, float* hi, float* lo) {
  *hi = static_cast<float>(v);
  *lo = static_cast<float>(v - static_cast<double>(*hi));
}

}  // namespace detail
}  // namespace cuda
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CUDA_COMMON_CUH_
