// The plain types of the batch-norm kernels: element type, device, tensor
// geometry and the argument structs of batch_norm.h.
//
// Free of Abseil and CUDA so that the raw CUDA launchers
// (batch_norm_cuda.h) and the standalone device check can use them too.
// Callers include kernels/batch_norm.h, which includes this.
#ifndef SYNCNORM_KERNELS_BATCH_NORM_TYPES_H_
#define SYNCNORM_KERNELS_BATCH_NORM_TYPES_H_

#include <cstdint>

namespace syncnorm {

class ThreadPool;

// Element type of x, y, z, dy and the gradients.
enum class DType { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Where the tensors live.
enum class Device { kCpu = 0, kCuda = 1 };

// The [outer, channels, inner] view of a tensor.
struct Geometry {
  int64_t outer = 0;
  int64_t channels = 0;
  int64_t inner = 1;

  int64_t elements() const { return outer * channels * inner; }
  // Values per channel: the local count n.
  int64_t per_channel() const { return outer * inner; }
};

// Execution resources for a kernel call.
struct KernelContext {
  // Where the tensors live. kCuda needs a build with CUDA.
  Device device = Device::kCpu;
  // CPU threads to split the work over; nullptr runs on the caller's thread.
  // Results do not depend on the number of threads.
  ThreadPool* pool = nullptr;
  // cudaStream_t for kCuda; nullptr is the default stream.
  void* stream = nullptr;
};

// y = relu?((x - mean) * invstd * weight + bias (+ z)).
struct ForwardArgs {
  const void* x = nullptr;
  void* y = nullptr;               // may equal x (in place)
  const void* z = nullptr;         // residual added before ReLU; optional
  const float* weight = nullptr;   // gamma; nullptr: 1 (no scale)
  const float* bias = nullptr;     // beta; nullptr: 0 (no center)
  const double* mean = nullptr;    // [C], required
  const double* invstd = nullptr;  // [C], required: 1/sqrt(var + eps)
  bool relu = false;
};
// Local backward sums. With a ReLU mask (y given), dy counts only where
// y > 0, as the fused ReLU's gradient.
struct BackwardReduceArgs {
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;         // output of the fused-ReLU forward; optional
  const double* mean = nullptr;    // [C]
  const double* invstd = nullptr;  // [C]
};
// grad_input = weight * invstd *
//     (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu)
// where mean_dy and mean_dy_xmu are the global sums divided by the global
// count; grad_z = dy (both after the ReLU mask).
struct BackwardElementwiseArgs {
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;              // ReLU mask source; optional
  const double* mean = nullptr;         // [C]
  const double* invstd = nullptr;       // [C]
  const float* weight = nullptr;        // nullptr: 1
  const double* mean_dy = nullptr;      // [C]
  const double* mean_dy_xmu = nullptr;  // [C]
  void* grad_input = nullptr;           // required
  void* grad_z = nullptr;               // optional
};
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_TYPES_H_
