// __half of the CPU emulator (kernels/emulator): IEEE binary16 storage and
// the conversions the project's kernels use, rounding as CUDA's do (to
// nearest even). With GCC (the build that runs the emulated tests), the
// compiler's _Float16 does the rounding, independently of the project's own
// host conversions (kernels/half.h). clang 14 has no _Float16 on x86 and its
// __fp16 needs compiler-rt; the clang build (which only compiles, to check
// the locking annotations) uses kernels/half.h.
#ifndef SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_
#define SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};

#if defined(__clang__)
#include "kernels/half.h"

inline float __half2float(__half h) {
  return static_cast<float>(syncnorm::HalfToDouble(syncnorm::Half{h.bits}));
}

inline __half __float2half_rn(float v) {
  return __half{syncnorm::DoubleToHalf(static_cast<double>(v)).bits};
}
#else
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, sizeof(f));
  return static_cast<float>(f);
}

inline __half __float2half_rn(float v) {
  const _Float16 f = static_cast<_Float16>(v);
  __half h;
  std::memcpy(&h.bits, &f, sizeof(f));
  return h;
}
#endif  // defined(__clang__)

#endif  // SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_
