// Batch-norm compute kernels: the public host API of //kernels.
//
// A tensor is viewed as [outer, channels, inner] in row-major order, which
// covers both layouts: channels-first (N, C, *spatial) is outer = N,
// inner = prod(spatial); channels-last (N, *spatial, C) and 2-D (N, C) are
// outer = N * prod(spatial), inner = 1. Statistics are float64; elementwise
// arithmetic is done in float64 and rounded once to the output type.
//
// Every function validates its arguments and returns a status; none aborts.
// Per-channel arrays (mean, invstd, weight, ...) live on the host. A tensor
// pointer may be null when the tensor has no elements (an empty batch).
#ifndef SYNCNORM_KERNELS_BATCH_NORM_H_
#define SYNCNORM_KERNELS_BATCH_NORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/moments.h"

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

// The geometry of a 2-D to 5-D tensor whose first dimension is the batch.
// channels_last: the channel is the last dimension (ignored for 2-D, which
// is (N, C) either way). INVALID_ARGUMENT for another rank, a negative
// dimension or zero channels.
absl::StatusOr<Geometry> MakeGeometry(absl::Span<const int64_t> shape,
                                      bool channels_last);

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

// Local per-channel moments of x (count = g.per_channel()), one pass, stable
// when |mean| is far larger than the standard deviation.
absl::Status LocalMoments(const KernelContext& ctx, DType dtype, const void* x,
                          const Geometry& g, Moments* out);

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
absl::Status Forward(const KernelContext& ctx, DType dtype, const Geometry& g,
                     const ForwardArgs& args);

// Local backward sums. With a ReLU mask (y given), dy counts only where
// y > 0, as the fused ReLU's gradient.
struct BackwardReduceArgs {
  const void* dy = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;         // output of the fused-ReLU forward; optional
  const double* mean = nullptr;    // [C]
  const double* invstd = nullptr;  // [C]
};
// sums gets sum(dy) and sum(dy * (x - mean)) per channel. grad_weight
// (= sum_dy_xmu * invstd) and grad_bias (= sum_dy), if not nullptr, get [C]
// values each.
absl::Status BackwardReduce(const KernelContext& ctx, DType dtype,
                            const Geometry& g, const BackwardReduceArgs& args,
                            GradSums* sums, double* grad_weight,
                            double* grad_bias);

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
absl::Status BackwardElementwise(const KernelContext& ctx, DType dtype,
                                 const Geometry& g,
                                 const BackwardElementwiseArgs& args);

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_H_
