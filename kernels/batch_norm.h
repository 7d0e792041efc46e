// Batch-norm compute kernels: the public host API of //kernels.
//
// A tensor is viewed as [outer, channels, inner] in row-major order, which
// covers both layouts: channels-first (N, C, *spatial) is outer = N,
// inner = prod(spatial); channels-last (N, *spatial, C) and 2-D (N, C) are
// outer = N * prod(spatial), inner = 1. Element types are float32, float16
// and bfloat16 (half types as bits, see half.h); statistics are float64.
//
// Every function validates its arguments and returns a status; none aborts.
// A tensor pointer may be null when the tensor has no elements (an empty
// batch).
//
// Where things live (KernelContext::device says where the *tensors* are):
//  - Per-channel arrays (mean, invstd, weight, bias, mean_dy, mean_dy_xmu)
//    and every statistics output (Moments, GradSums, grad_weight,
//    grad_bias) are on the host, for both devices: they are C values that go
//    over the network anyway.
//  - Device::kCpu: tensors are host memory; elementwise arithmetic is done
//    in float64 and rounded once to the output type.
//  - Device::kCuda: tensors (x, y, z, dy, grad_input, grad_z) are device
//    memory of the current CUDA device (or managed memory); host pointers
//    are rejected with INVALID_ARGUMENT. Work runs on ctx.stream (a
//    cudaStream_t, nullptr = the legacy default stream). LocalMoments and
//    BackwardReduce wait for their stream, since their results are host
//    values. Forward and BackwardElementwise are asynchronous: they return
//    once the work is queued, and the per-channel host arrays are copied
//    into stream-ordered device memory before they return, so the caller may
//    free or change them at once; they never wait for the stream (the
//    arrays go up through pinned memory). Reductions (LocalMoments,
//    BackwardReduce) accumulate and merge in float64 throughout, in an order
//    fixed by the geometry and dtype: results are deterministic, with
//    float64 accuracy. Elementwise outputs are float32 arithmetic from
//    coefficients prepared in float64 (mean carried as a float pair, so
//    |mean| >> std costs no accuracy), rounded once to the output type.
//    A build without CUDA returns UNIMPLEMENTED; a build with CUDA on a
//    machine without a usable device returns FAILED_PRECONDITION. Any
//    tensor size is accepted.
#ifndef SYNCNORM_KERNELS_BATCH_NORM_H_
#define SYNCNORM_KERNELS_BATCH_NORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/batch_norm_types.h"
#include "kernels/moments.h"

namespace syncnorm {

// The geometry of a 2-D to 5-D tensor whose first dimension is the batch.
// channels_last: the channel is the last dimension (ignored for 2-D, which
// is (N, C) either way). INVALID_ARGUMENT for another rank, a negative
// dimension or zero channels.
absl::StatusOr<Geometry> MakeGeometry(absl::Span<const int64_t> shape,
                                      bool channels_last);

// Whether this build's kernels take `dtype` tensors on `device`: for
// kCpu, whether the dtype is known; for kCuda, also whether the build has
// CUDA and a device is visible. Creates no CUDA context, so that callers
// may ask before they choose a device.
bool KernelsAvailable(Device device, DType dtype);

// Local per-channel moments of x (count = g.per_channel()), one pass, stable
// when |mean| is far larger than the standard deviation.
absl::Status LocalMoments(const KernelContext& ctx, DType dtype, const void* x,
                          const Geometry& g, Moments* out);

absl::Status Forward(const KernelContext& ctx, DType dtype, const Geometry& g,
                     const ForwardArgs& args);

// sums gets sum(dy) and sum(dy * (x - mean)) per channel. grad_weight
// (= sum_dy_xmu * invstd) and grad_bias (= sum_dy), if not nullptr, get [C]
// values each.
absl::Status BackwardReduce(const KernelContext& ctx, DType dtype,
                            const Geometry& g, const BackwardReduceArgs& args,
                            GradSums* sums, double* grad_weight,
                            double* grad_bias);

absl::Status BackwardElementwise(const KernelContext& ctx, DType dtype,
                                 const Geometry& g,
                                 const BackwardElementwiseArgs& args);

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_H_
