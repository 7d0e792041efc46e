// The CUDA launchers of a build without the CUDA toolkit: every call is
// UNIMPLEMENTED, so Device::kCuda fails clearly instead of at link time.
#include <string>

#include "kernels/batch_norm_cuda.h"

namespace syncnorm {
namespace cuda {
namespace {

Result NoCuda(const char* fn) {
  return Result{Code::kUnimplemented,
                std::string(fn) +
                    ": Device::kCuda is not available: syncnorm was built "
                    "without CUDA (no toolkit at /usr/local/cuda at build "
                    "time); use Device::kCpu or rebuild with CUDA"};
}

}  // namespace

int VisibleDevices(std::string* why) {
  if (why != nullptr) *why = "syncnorm was built without CUDA";
  return 0;
}

void ReleaseScratch() {}

Result LocalMoments(void*, DType, const void*, const Geometry&, double*,
                    double*) {
  return NoCuda("LocalMoments");
}

Result Forward(void*, DType, const Geometry&, const ForwardArgs&) {
  return NoCuda("Forward");
}

Result BackwardReduce(void*, DType, const Geometry&, const BackwardReduceArgs&,
                      double*, double*) {
  return NoCuda("BackwardReduce");
}

Result BackwardElementwise(void*, DType, const Geometry&,
                           const BackwardElementwiseArgs&) {
  return NoCuda("BackwardElementwise");
}

}  // namespace cuda
}  // namespace syncnorm
