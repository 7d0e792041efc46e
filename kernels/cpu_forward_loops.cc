#include "kernels/cpu_forward_loops.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "kernels/cpu_isa.h"
#include "kernels/half.h"

namespace syncnorm {
namespace cpu {
namespace {

// One output value, in double. Every loop below goes through exactly these
// operations in this order (sub, mul, add, add z, ReLU), so all of them
// round alike; the library is built with -ffp-contract=off so no compiler
// fuses them into an FMA.
template <bool kResidual, bool kRelu>
inline double ForwardValue(double x, double mean, double scale, double shift,
                           double z) {
  double v = (x - mean) * scale + shift;
  if (kResidual) v += z;
  if (kRelu) v = v < 0.0 ? 0.0 : v;
  return v;
}

template <typename T, bool kLast, bool kResidual, bool kRelu>
void ForwardRowsGeneric(const T* x, const T* z, T* y, int64_t rows, int64_t len,
                        const double* mean, const double* scale,
                        const double* shift) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = r * len + j;
      const int64_t k = kLast ? j : r;
      const double zv = kResidual ? ToDouble(z[i]) : 0.0;
      y[i] = FromDouble<T>(ForwardValue<kResidual, kRelu>(
          ToDouble(x[i]), mean[k], scale[k], shift[k], zv));
    }
  }
}

#ifdef __SSE2__
// Elements of y to write one by one before y + head is `align`-byte aligned
// (all of them if y is not even float-aligned), at most len.
inline int64_t AlignedHead(const float* y, int64_t len, uintptr_t align) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(y);
  if (a % sizeof(float) != 0) return len;
  return std::min<int64_t>(len, (align - a % align) % align / sizeof(float));
}

// Elements [begin, end) of row r with the generic loop (heads and tails).
template <bool kLast, bool kResidual, bool kRelu>
inline void ForwardSpan(const float* x, const float* z, float* y, int64_t r,
                        int64_t begin, int64_t end, const double* mean,
                        const double* scale, const double* shift) {
  const int64_t k = kLast ? begin : r;
  ForwardRowsGeneric<float, kLast, kResidual, kRelu>(
      x + begin, kResidual ? z + begin : nullptr, y + begin, 1, end - begin,
      mean + k, scale + k, shift + k);
}

// Four values as two pairs of doubles, and back.
inline void Widen(__m128 v, __m128d& lo, __m128d& hi) {
  lo = _mm_cvtps_pd(v);
  hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
}

template <bool kLast, bool kResidual, bool kRelu, bool kStream>
void ForwardRowsSse2(const float* x, const float* z, float* y, int64_t rows,
                     int64_t len, const double* mean, const double* scale,
                     const double* shift) {
  const __m128d zero = _mm_setzero_pd();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    const float* zr = kResidual ? z + r * len : nullptr;
    float* yr = y + r * len;
    const int64_t head = kStream ? AlignedHead(yr, len, 16) : 0;
    ForwardSpan<kLast, kResidual, kRelu>(xr, zr, yr, r, 0, head, mean, scale,
                                         shift);
    // Channels-first: one channel per row. Channels-last: loaded below.
    __m128d m0 = _mm_set1_pd(kLast ? 0.0 : mean[r]), m1 = m0;
    __m128d s0 = _mm_set1_pd(kLast ? 0.0 : scale[r]), s1 = s0;
    __m128d b0 = _mm_set1_pd(kLast ? 0.0 : shift[r]), b1 = b0;
    int64_t j = head;
    for (; j + 4 <= len; j += 4) {
      if (kLast) {
        m0 = _mm_loadu_pd(mean + j), m1 = _mm_loadu_pd(mean + j + 2);
        s0 = _mm_loadu_pd(scale + j), s1 = _mm_loadu_pd(scale + j + 2);
        b0 = _mm_loadu_pd(shift + j), b1 = _mm_loadu_pd(shift + j + 2);
      }
      __m128d lo, hi;
      Widen(_mm_loadu_ps(xr + j), lo, hi);
      lo = _mm_add_pd(_mm_mul_pd(_mm_sub_pd(lo, m0), s0), b0);
      hi = _mm_add_pd(_mm_mul_pd(_mm_sub_pd(hi, m1), s1), b1);
      if (kResidual) {
        __m128d zlo, zhi;
        Widen(_mm_loadu_ps(zr + j), zlo, zhi);
        lo = _mm_add_pd(lo, zlo);
        hi = _mm_add_pd(hi, zhi);
      }
      if (kRelu) {  // max(0, v) is 0 for v < 0 and v otherwise, NaN included
        lo = _mm_max_pd(zero, lo);
        hi = _mm_max_pd(zero, hi);
      }
      const __m128 out = _mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi));
      if (kStream) {
        _mm_stream_ps(yr + j, out);
      } else {
        _mm_storeu_ps(yr + j, out);
      }
    }
    ForwardSpan<kLast, kResidual, kRelu>(xr, zr, yr, r, j, len, mean, scale,
                                         shift);
  }
}

// The AVX2 version (no FMA, see ForwardValue), chosen at run time.
template <bool kLast, bool kResidual, bool kRelu, bool kStream>
__attribute__((target("avx2"))) void ForwardRowsAvx2(
    const float* x, const float* z, float* y, int64_t rows, int64_t len,
    const double* mean, const double* scale, const double* shift) {
  const __m256d zero = _mm256_setzero_pd();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    const float* zr = kResidual ? z + r * len : nullptr;
    float* yr = y + r * len;
    const int64_t head = kStream ? AlignedHead(yr, len, 32) : 0;
    ForwardSpan<kLast, kResidual, kRelu>(xr, zr, yr, r, 0, head, mean, scale,
                                         shift);
    // Channels-first: one channel per row. Channels-last: loaded below.
    __m256d m0 = _mm256_set1_pd(kLast ? 0.0 : mean[r]), m1 = m0;
    __m256d s0 = _mm256_set1_pd(kLast ? 0.0 : scale[r]), s1 = s0;
    __m256d b0 = _mm256_set1_pd(kLast ? 0.0 : shift[r]), b1 = b0;
    int64_t j = head;
    for (; j + 8 <= len; j += 8) {
      if (kLast) {
        m0 = _mm256_loadu_pd(mean + j), m1 = _mm256_loadu_pd(mean + j + 4);
        s0 = _mm256_loadu_pd(scale + j), s1 = _mm256_loadu_pd(scale + j + 4);
        b0 = _mm256_loadu_pd(shift + j), b1 = _mm256_loadu_pd(shift + j + 4);
      }
      __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(xr + j));
      __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(xr + j + 4));
      lo = _mm256_add_pd(_mm256_mul_pd(_mm256_sub_pd(lo, m0), s0), b0);
      hi = _mm256_add_pd(_mm256_mul_pd(_mm256_sub_pd(hi, m1), s1), b1);
      if (kResidual) {
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm_loadu_ps(zr + j)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm_loadu_ps(zr + j + 4)));
      }
      if (kRelu) {
        lo = _mm256_max_pd(zero, lo);
        hi = _mm256_max_pd(zero, hi);
      }
      const __m256 out =
          _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
      if (kStream) {
        _mm256_stream_ps(yr + j, out);
      } else {
        _mm256_storeu_ps(yr + j, out);
      }
    }
    ForwardSpan<kLast, kResidual, kRelu>(xr, zr, yr, r, j, len, mean, scale,
                                         shift);
  }
}
#endif  // __SSE2__

template <typename T, bool kLast, bool kResidual, bool kRelu, bool kStream>
ForwardRowsFn<T> LoopFor(Isa isa) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return &ForwardRowsAvx2<kLast, kResidual, kRelu, kStream>;
      case Isa::kSse2:
        return &ForwardRowsSse2<kLast, kResidual, kRelu, kStream>;
      default:
        break;
    }
  }
#endif
  return &ForwardRowsGeneric<T, kLast, kResidual, kRelu>;
}

// Turns the run-time flags[0..4) into template arguments, one at a time.
template <typename T, bool... kFlags>
ForwardRowsFn<T> Pick(Isa isa, const bool* flags) {
  if constexpr (sizeof...(kFlags) == 4) {
    return LoopFor<T, kFlags...>(isa);
  } else {
    return flags[sizeof...(kFlags)] ? Pick<T, kFlags..., true>(isa, flags)
                                    : Pick<T, kFlags..., false>(isa, flags);
  }
}

}  // namespace

template <typename T>
ForwardRowsFn<T> PickForwardRows(Isa isa, const ForwardLoopOptions& options) {
  const bool flags[4] = {options.last, options.residual, options.relu,
                         options.stream};
  return Pick<T>(isa, flags);
}

template ForwardRowsFn<float> PickForwardRows<float>(Isa,
                                                     const ForwardLoopOptions&);
template ForwardRowsFn<Half> PickForwardRows<Half>(Isa,
                                                   const ForwardLoopOptions&);
template ForwardRowsFn<BFloat16> PickForwardRows<BFloat16>(
    Isa, const ForwardLoopOptions&);

void StoreFence() {
#ifdef __SSE2__
  _mm_sfence();
#endif
}

int64_t StreamingStoreBytes() {
  static const int64_t bytes = [] {
    long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return llc > 0 ? static_cast<int64_t>(llc) : int64_t{32} << 20;
  }();
  return bytes;
}

}  // namespace cpu
}  // namespace syncnorm
