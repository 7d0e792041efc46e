// __nv_bfloat16 of the CPU emulator (kernels/emulator): bfloat16 storage
// (the high half of a float) and the conversions the project's kernels use,
// rounding to nearest even as CUDA's do.
#ifndef SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_BF16_H_
#define SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_BF16_H_

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  __nv_bfloat16 h;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    h.bits = static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return h;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even
  h.bits = static_cast<uint16_t>(bits >> 16);
  return h;
}

#endif  // SYNCNORM_KERNELS_EMULATOR_INCLUDE_CUDA_BF16_H_
