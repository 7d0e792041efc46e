// The raw CUDA launchers behind batch_norm.h's Device::kCuda path.
//
// Private to //kernels (and the standalone device check): free of Abseil and
// of CUDA types, so it builds with nvcc alone. Each launcher validates its
// arguments itself (it may be called directly), checks every CUDA call and
// launch, and returns a Result instead of aborting. batch_norm.cc turns a
// Result into an absl::Status.
//
// Contract (see batch_norm.h for the public one): tensors are device memory
// of the current device, per-channel inputs and statistics outputs are host
// arrays, `stream` is a cudaStream_t (nullptr: the legacy default stream).
// LocalMoments and BackwardReduce synchronize the stream before returning;
// Forward and BackwardElementwise return once queued, without waiting for
// the stream, after their per-channel inputs were copied (through pinned
// memory) to stream-ordered device memory. Scratch memory comes from a
// memory pool of syncnorm's own, or cached cudaMalloc blocks on devices
// without pools (see cuda_memory.cuh).
#ifndef SYNCNORM_KERNELS_BATCH_NORM_CUDA_H_
#define SYNCNORM_KERNELS_BATCH_NORM_CUDA_H_

#include <cstdint>
#include <string>

#include "kernels/batch_norm_types.h"

namespace syncnorm {
namespace cuda {

// What went wrong, in Abseil's terms; batch_norm.cc maps it 1:1.
enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad geometry, null or host pointer, unknown dtype
  kFailedPrecondition,  // no usable CUDA device (no driver, no GPU)
  kUnimplemented,       // this build has no CUDA
  kInternal,            // a CUDA call or launch failed
};

struct Result {
  Code code = Code::kOk;
  std::string message;

  bool ok() const { return code == Code::kOk; }
};

// The number of visible CUDA devices; 0 with *why saying the reason when
// there is none (no driver, "driver version is insufficient", no GPU), or
// when this build has no CUDA. why may be null.
int VisibleDevices(std::string* why);

// Frees the scratch memory the launchers keep between calls (and forgets
// which devices have memory pools). Call it before cudaDeviceReset, which
// would invalidate it. REQUIRES: no launcher call in flight; the devices
// are idle.
void ReleaseScratch();

// Local moments of x: mean[C] and m2[C] (host arrays) over g.per_channel()
// values per channel. Synchronizes `stream`.
Result LocalMoments(void* stream, DType dtype, const void* x, const Geometry& g,
                    double* mean, double* m2);

// y = relu?((x - mean) * invstd * weight + bias (+ z)); see ForwardArgs.
Result Forward(void* stream, DType dtype, const Geometry& g,
               const ForwardArgs& args);

// sum_dy[C] and sum_dy_xmu[C] (host arrays); see BackwardReduceArgs.
// Synchronizes `stream`.
Result BackwardReduce(void* stream, DType dtype, const Geometry& g,
                      const BackwardReduceArgs& args, double* sum_dy,
                      double* sum_dy_xmu);

// grad_input (and grad_z); see BackwardElementwiseArgs.
Result BackwardElementwise(void* stream, DType dtype, const Geometry& g,
                           const BackwardElementwiseArgs& args);

}  // namespace cuda
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_BATCH_NORM_CUDA_H_
