// __half of the CPU emulator (kernels/emulator): IEEE binary16 storage and
// the conversions the project's kernels use, rounding as CUDA's do (to
// nearest even). The compiler's _Float16 does the rounding, independently
// of the project's own host conversions (kernels/half.h).
#ifndef SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_
#define SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};

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

#endif  // SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_FP16_H_
