// Host conversions between float/double and the 16-bit float formats.
//
// IEEE binary16 (fp16) and bfloat16 values are carried as their bit patterns
// (Half, BFloat16), so this header needs no CUDA types and serves the CPU
// kernels, tests and callers that fill half-precision host tensors. Encoding
// rounds once, to nearest with ties to even, straight from the double (no
// double rounding through float); NaN stays NaN and overflow gives infinity,
// as __float2half_rn and __float2bfloat16_rn do on the GPU.
#ifndef SYNCNORM_KERNELS_HALF_H_
#define SYNCNORM_KERNELS_HALF_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace syncnorm {

// An fp16 value as its bits; layout-compatible with CUDA's __half.
struct Half {
  uint16_t bits = 0;
};

// A bfloat16 value as its bits; layout-compatible with __nv_bfloat16.
struct BFloat16 {
  uint16_t bits = 0;
};

namespace half_internal {

// Rounds v to a binary format with kExp exponent bits and kMan fraction bits
// (IEEE layout, sign in bit kExp + kMan) and returns its bits.
template <int kExp, int kMan>
inline uint16_t EncodeBits(double v) {
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  constexpr uint32_t kInf = ((1u << kExp) - 1u) << kMan;
  const uint32_t sign = std::signbit(v) ? (1u << (kExp + kMan)) : 0u;
  if (std::isnan(v)) return static_cast<uint16_t>(kInf | (1u << (kMan - 1)));
  const double a = std::fabs(v);
  if (std::isinf(a)) return static_cast<uint16_t>(sign | kInf);
  int e2 = 0;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int e = e2 - 1;      // a = s * 2^e, s in [1, 2)
  if (a == 0.0 || e < 1 - kBias) {
    // Subnormal (or zero): units of 2^(1 - kBias - kMan). A result of
    // 2^kMan units is the smallest normal, whose bits are the same number.
    const double q = std::nearbyint(std::ldexp(a, kBias - 1 + kMan));
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(q));
  }
  double q =
      std::nearbyint(std::ldexp(a, kMan - e));  // in [2^kMan, 2^(kMan+1)]
  if (q == std::ldexp(1.0, kMan + 1)) {
    q = std::ldexp(1.0, kMan);
    ++e;
  }
  if (e + kBias >= (1 << kExp) - 1) return static_cast<uint16_t>(sign | kInf);
  const uint32_t frac = static_cast<uint32_t>(q) - (1u << kMan);
  return static_cast<uint16_t>(
      sign | (static_cast<uint32_t>(e + kBias) << kMan) | frac);
}

}  // namespace half_internal

inline double HalfToDouble(Half h) {
  const uint32_t sign = h.bits >> 15;
  const uint32_t exp = (h.bits >> 10) & 0x1f;
  const uint32_t frac = h.bits & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(frac), -24);
  } else if (exp == 31) {
    v = frac == 0 ? HUGE_VAL : std::nan("");
  } else {
    v = std::ldexp(static_cast<double>(frac | 0x400u),
                   static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

inline double BFloat16ToDouble(BFloat16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return static_cast<double>(f);
}

inline Half DoubleToHalf(double v) {
  return Half{half_internal::EncodeBits<5, 10>(v)};
}

inline BFloat16 DoubleToBFloat16(double v) {
  return BFloat16{half_internal::EncodeBits<8, 7>(v)};
}

// Element load and store in double for the CPU kernels, one overload per
// element type.
inline double ToDouble(float v) { return static_cast<double>(v); }
inline double ToDouble(Half v) { return HalfToDouble(v); }
inline double ToDouble(BFloat16 v) { return BFloat16ToDouble(v); }

template <typename T>
T FromDouble(double v);
template <>
inline float FromDouble<float>(double v) {
  return static_cast<float>(v);
}
template <>
inline Half FromDouble<Half>(double v) {
  return DoubleToHalf(v);
}
template <>
inline BFloat16 FromDouble<BFloat16>(double v) {
  return DoubleToBFloat16(v);
}

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_HALF_H_
