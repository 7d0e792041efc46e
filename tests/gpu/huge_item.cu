// A device-side fill for the device check's batch item of more than 2^31
// elements (kernel_checks.cc): of a [1, 2, inner] float16 tensor, channel 0
// alternates 2 and 4 (mean 3, every deviation 1) and channel 1 is 0.5.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tests/gpu/checks.h"

namespace syncnorm::device_check {
namespace {

__global__ void FillKernel(__half* x, int64_t inner) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < 2 * inner; i += stride) {
    const int64_t j = i < inner ? i : i - inner;
    x[i] = __float2half(i < inner ? ((j & 1) ? 4.0f : 2.0f) : 0.5f);
  }
}

}  // namespace

int FillHugeItem(void* x, int64_t inner) {
  FillKernel<<<4096, 256>>>(static_cast<__half*>(x), inner);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace syncnorm::device_check
