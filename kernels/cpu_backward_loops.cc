#include "kernels/cpu_backward_loops.h"

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

// Every loop below computes exactly these operations in this order (mask,
// sub, sub, mul, sub, mul), so all of them round alike; the library is
// built with -ffp-contract=off so no compiler fuses them into an FMA.
template <typename T, bool kLast, bool kMask, bool kGradZ>
void BackwardRowsGeneric(const T* dy, const T* x, const T* y, T* grad_input,
                         T* grad_z, int64_t rows, int64_t len,
                         const BackwardCoefficients& co) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = r * len + j;
      const int64_t c = kLast ? j : r;
      double d = ToDouble(dy[i]);
      if (kMask) d = ToDouble(y[i]) > 0.0 ? d : 0.0;
      const double xmu = ToDouble(x[i]) - co.mean[c];
      grad_input[i] =
          FromDouble<T>(co.a[c] * (d - co.mean_dy[c] - xmu * co.k[c]));
      if (kGradZ) grad_z[i] = FromDouble<T>(d);
    }
  }
}

// Elements [begin, end) of row r (the row starting at offset o) with the
// generic loop: the tails of the SIMD loops.
template <bool kLast, bool kMask, bool kGradZ>
inline void BackwardSpan(const float* dy, const float* x, const float* y,
                         float* grad_input, float* grad_z, int64_t r, int64_t o,
                         int64_t begin, int64_t end,
                         const BackwardCoefficients& co) {
  const int64_t c = kLast ? begin : r;
  const BackwardCoefficients shifted{co.mean + c, co.a + c, co.mean_dy + c,
                                     co.k + c};
  const int64_t i = o + begin;
  BackwardRowsGeneric<float, kLast, kMask, kGradZ>(
      dy + i, x + i, kMask ? y + i : nullptr, grad_input + i,
      kGradZ ? grad_z + i : nullptr, 1, end - begin, shifted);
}

#ifdef __SSE2__
// Two doubles of one output pair: a * (d - mean_dy - (x - mean) * k).
inline __m128d GradSse2(__m128d d, __m128d x, __m128d mean, __m128d a,
                        __m128d mean_dy, __m128d k) {
  return _mm_mul_pd(a, _mm_sub_pd(_mm_sub_pd(d, mean_dy),
                                  _mm_mul_pd(_mm_sub_pd(x, mean), k)));
}

inline void WidenSse2(__m128 v, __m128d& lo, __m128d& hi) {
  lo = _mm_cvtps_pd(v);
  hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
}

inline __m128 NarrowSse2(__m128d lo, __m128d hi) {
  return _mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi));
}

template <bool kLast, bool kMask, bool kGradZ>
void BackwardRowsSse2(const float* dy, const float* x, const float* y,
                      float* grad_input, float* grad_z, int64_t rows,
                      int64_t len, const BackwardCoefficients& co) {
  const __m128d zero = _mm_setzero_pd();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * len;
    // Channels-first: one channel per row. Channels-last: loaded below.
    __m128d m0 = _mm_set1_pd(kLast ? 0.0 : co.mean[r]), m1 = m0;
    __m128d a0 = _mm_set1_pd(kLast ? 0.0 : co.a[r]), a1 = a0;
    __m128d g0 = _mm_set1_pd(kLast ? 0.0 : co.mean_dy[r]), g1 = g0;
    __m128d k0 = _mm_set1_pd(kLast ? 0.0 : co.k[r]), k1 = k0;
    int64_t j = 0;
    for (; j + 4 <= len; j += 4) {
      if (kLast) {
        m0 = _mm_loadu_pd(co.mean + j), m1 = _mm_loadu_pd(co.mean + j + 2);
        a0 = _mm_loadu_pd(co.a + j), a1 = _mm_loadu_pd(co.a + j + 2);
        g0 = _mm_loadu_pd(co.mean_dy + j),
        g1 = _mm_loadu_pd(co.mean_dy + j + 2);
        k0 = _mm_loadu_pd(co.k + j), k1 = _mm_loadu_pd(co.k + j + 2);
      }
      __m128d d0, d1, x0, x1;
      WidenSse2(_mm_loadu_ps(dy + o + j), d0, d1);
      if (kMask) {  // y > 0 is false for NaN, as in the generic loop
        __m128d y0, y1;
        WidenSse2(_mm_loadu_ps(y + o + j), y0, y1);
        d0 = _mm_and_pd(_mm_cmpgt_pd(y0, zero), d0);
        d1 = _mm_and_pd(_mm_cmpgt_pd(y1, zero), d1);
      }
      WidenSse2(_mm_loadu_ps(x + o + j), x0, x1);
      _mm_storeu_ps(grad_input + o + j,
                    NarrowSse2(GradSse2(d0, x0, m0, a0, g0, k0),
                               GradSse2(d1, x1, m1, a1, g1, k1)));
      if (kGradZ) _mm_storeu_ps(grad_z + o + j, NarrowSse2(d0, d1));
    }
    BackwardSpan<kLast, kMask, kGradZ>(dy, x, y, grad_input, grad_z, r, o, j,
                                       len, co);
  }
}

// The AVX2 version (no FMA, see BackwardRowsGeneric), chosen at run time.
__attribute__((target("avx2"))) inline __m256d GradAvx2(__m256d d, __m256d x,
                                                        __m256d mean, __m256d a,
                                                        __m256d mean_dy,
                                                        __m256d k) {
  return _mm256_mul_pd(a,
                       _mm256_sub_pd(_mm256_sub_pd(d, mean_dy),
                                     _mm256_mul_pd(_mm256_sub_pd(x, mean), k)));
}

__attribute__((target("avx2"))) inline __m256 NarrowAvx2(__m256d lo,
                                                         __m256d hi) {
  return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

template <bool kLast, bool kMask, bool kGradZ>
__attribute__((target("avx2"))) void BackwardRowsAvx2(
    const float* dy, const float* x, const float* y, float* grad_input,
    float* grad_z, int64_t rows, int64_t len, const BackwardCoefficients& co) {
  const __m256d zero = _mm256_setzero_pd();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * len;
    __m256d m0 = _mm256_set1_pd(kLast ? 0.0 : co.mean[r]), m1 = m0;
    __m256d a0 = _mm256_set1_pd(kLast ? 0.0 : co.a[r]), a1 = a0;
    __m256d g0 = _mm256_set1_pd(kLast ? 0.0 : co.mean_dy[r]), g1 = g0;
    __m256d k0 = _mm256_set1_pd(kLast ? 0.0 : co.k[r]), k1 = k0;
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      if (kLast) {
        m0 = _mm256_loadu_pd(co.mean + j);
        m1 = _mm256_loadu_pd(co.mean + j + 4);
        a0 = _mm256_loadu_pd(co.a + j), a1 = _mm256_loadu_pd(co.a + j + 4);
        g0 = _mm256_loadu_pd(co.mean_dy + j);
        g1 = _mm256_loadu_pd(co.mean_dy + j + 4);
        k0 = _mm256_loadu_pd(co.k + j), k1 = _mm256_loadu_pd(co.k + j + 4);
      }
      __m256d d0 = _mm256_cvtps_pd(_mm_loadu_ps(dy + o + j));
      __m256d d1 = _mm256_cvtps_pd(_mm_loadu_ps(dy + o + j + 4));
      if (kMask) {
        const __m256d y0 = _mm256_cvtps_pd(_mm_loadu_ps(y + o + j));
        const __m256d y1 = _mm256_cvtps_pd(_mm_loadu_ps(y + o + j + 4));
        d0 = _mm256_and_pd(_mm256_cmp_pd(y0, zero, _CMP_GT_OQ), d0);
        d1 = _mm256_and_pd(_mm256_cmp_pd(y1, zero, _CMP_GT_OQ), d1);
      }
      const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(x + o + j));
      const __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(x + o + j + 4));
      _mm256_storeu_ps(grad_input + o + j,
                       NarrowAvx2(GradAvx2(d0, x0, m0, a0, g0, k0),
                                  GradAvx2(d1, x1, m1, a1, g1, k1)));
      if (kGradZ) _mm256_storeu_ps(grad_z + o + j, NarrowAvx2(d0, d1));
    }
    BackwardSpan<kLast, kMask, kGradZ>(dy, x, y, grad_input, grad_z, r, o, j,
                                       len, co);
  }
}
#endif  // __SSE2__

template <typename T, bool kLast, bool kMask, bool kGradZ>
BackwardRowsFn<T> LoopFor(Isa isa) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return &BackwardRowsAvx2<kLast, kMask, kGradZ>;
      case Isa::kSse2:
        return &BackwardRowsSse2<kLast, kMask, kGradZ>;
      default:
        break;
    }
  }
#endif
  return &BackwardRowsGeneric<T, kLast, kMask, kGradZ>;
}

// Turns the run-time flags[0..3) into template arguments, one at a time.
template <typename T, bool... kFlags>
BackwardRowsFn<T> Pick(Isa isa, const bool* flags) {
  if constexpr (sizeof...(kFlags) == 3) {
    return LoopFor<T, kFlags...>(isa);
  } else {
    return flags[sizeof...(kFlags)] ? Pick<T, kFlags..., true>(isa, flags)
                                    : Pick<T, kFlags..., false>(isa, flags);
  }
}

}  // namespace

template <typename T>
BackwardRowsFn<T> PickBackwardRows(Isa isa,
                                   const BackwardLoopOptions& options) {
  const bool flags[3] = {options.last, options.mask, options.grad_z};
  return Pick<T>(isa, flags);
}

template BackwardRowsFn<float> PickBackwardRows<float>(
    Isa, const BackwardLoopOptions&);
template BackwardRowsFn<Half> PickBackwardRows<Half>(
    Isa, const BackwardLoopOptions&);
template BackwardRowsFn<BFloat16> PickBackwardRows<BFloat16>(
    Isa, const BackwardLoopOptions&);

}  // namespace cpu
}  // namespace syncnorm
