#include "kernels/cpu_grad_sums_loops.h"

#include <cstdint>
#include <type_traits>

#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "kernels/cpu_isa.h"
#include "kernels/cpu_sums.h"
#include "kernels/half.h"

namespace syncnorm {
namespace cpu {
namespace {

// Floats ahead of the current position that GradLaneSums prefetches: a
// channels-first block is a short run far from the previous one, too short
// for the hardware prefetcher to ramp up.
inline constexpr int64_t kPrefetchAhead = 512;

// dy where the fused ReLU let the value through (y > 0; false for NaN).
template <bool kMask, typename T>
inline double MaskedDy(const T* dy, const T* y, int64_t i) {
  if (kMask) return ToDouble(y[i]) > 0.0 ? ToDouble(dy[i]) : 0.0;
  return ToDouble(dy[i]);
}

template <bool kMask, typename T>
void GradLaneSumsGeneric(const T* dy, const T* x, const T* y, int64_t len,
                         double mean, double& sum_dy, double& sum_dy_xmu) {
  sum_dy = LaneSum(len, [=](int64_t i) { return MaskedDy<kMask>(dy, y, i); });
  sum_dy_xmu = LaneSum(len, [=](int64_t i) {
    return MaskedDy<kMask>(dy, y, i) * (ToDouble(x[i]) - mean);
  });
}

template <bool kMask, typename T>
void AddRowsGeneric(const T* dy, const T* x, const T* y, int64_t stride,
                    int64_t rows, int64_t width, const double* mean,
                    double* __restrict sum_dy, double* __restrict sum_dy_xmu) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * stride;
    for (int64_t j = 0; j < width; ++j) {
      const double d = MaskedDy<kMask>(dy + o, kMask ? y + o : y, j);
      sum_dy[j] += d;
      sum_dy_xmu[j] += d * (ToDouble(x[o + j]) - mean[j]);
    }
  }
}

#ifdef __SSE2__
// y + i under kMask; y (maybe null) is not moved otherwise.
template <bool kMask>
inline const float* MaskAt(const float* y, int64_t i) {
  return kMask ? y + i : y;
}

// The tail and the lanes of the SIMD GradLaneSums, in LaneSum's order.
template <bool kMask>
void FinishLaneSums(const float* dy, const float* x, const float* y, int64_t i,
                    int64_t len, double mean, const double* la,
                    const double* lb, double& sum_dy, double& sum_dy_xmu) {
  sum_dy = 0;
  sum_dy_xmu = 0;
  for (; i < len; ++i) {
    const double d = MaskedDy<kMask>(dy, y, i);
    sum_dy += d;
    sum_dy_xmu += d * (static_cast<double>(x[i]) - mean);
  }
  for (int l = 0; l < kLanes; ++l) {
    sum_dy += la[l];
    sum_dy_xmu += lb[l];
  }
}

inline void WidenSse2(const float* p, __m128d& lo, __m128d& hi) {
  const __m128 v = _mm_loadu_ps(p);
  lo = _mm_cvtps_pd(v);
  hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
}

// d of four values at p, as two pairs: dy masked by y > 0 under kMask.
template <bool kMask>
inline void MaskedSse2(const float* dy, const float* y, __m128d& d0,
                       __m128d& d1) {
  WidenSse2(dy, d0, d1);
  if (kMask) {
    __m128d y0, y1;
    WidenSse2(y, y0, y1);
    d0 = _mm_and_pd(_mm_cmpgt_pd(y0, _mm_setzero_pd()), d0);
    d1 = _mm_and_pd(_mm_cmpgt_pd(y1, _mm_setzero_pd()), d1);
  }
}

// Lanes 0-7 in four registers per sum, as ShiftedSumsSse2 does.
template <bool kMask>
void GradLaneSumsSse2(const float* dy, const float* x, const float* y,
                      int64_t len, double mean, double& sum_dy,
                      double& sum_dy_xmu) {
  static_assert(kLanes == 8, "four registers of two lanes");
  const __m128d m = _mm_set1_pd(mean);
  __m128d a0 = _mm_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  __m128d b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    if (i % 16 == 0) {
      __builtin_prefetch(dy + i + kPrefetchAhead);
      __builtin_prefetch(x + i + kPrefetchAhead);
      if (kMask) __builtin_prefetch(y + i + kPrefetchAhead);
    }
    __m128d d0, d1, d2, d3, x0, x1, x2, x3;
    MaskedSse2<kMask>(dy + i, MaskAt<kMask>(y, i), d0, d1);
    MaskedSse2<kMask>(dy + i + 4, MaskAt<kMask>(y, i + 4), d2, d3);
    WidenSse2(x + i, x0, x1);
    WidenSse2(x + i + 4, x2, x3);
    a0 = _mm_add_pd(a0, d0);
    a1 = _mm_add_pd(a1, d1);
    a2 = _mm_add_pd(a2, d2);
    a3 = _mm_add_pd(a3, d3);
    b0 = _mm_add_pd(b0, _mm_mul_pd(d0, _mm_sub_pd(x0, m)));
    b1 = _mm_add_pd(b1, _mm_mul_pd(d1, _mm_sub_pd(x1, m)));
    b2 = _mm_add_pd(b2, _mm_mul_pd(d2, _mm_sub_pd(x2, m)));
    b3 = _mm_add_pd(b3, _mm_mul_pd(d3, _mm_sub_pd(x3, m)));
  }
  double la[kLanes], lb[kLanes];
  _mm_storeu_pd(la, a0);
  _mm_storeu_pd(la + 2, a1);
  _mm_storeu_pd(la + 4, a2);
  _mm_storeu_pd(la + 6, a3);
  _mm_storeu_pd(lb, b0);
  _mm_storeu_pd(lb + 2, b1);
  _mm_storeu_pd(lb + 4, b2);
  _mm_storeu_pd(lb + 6, b3);
  FinishLaneSums<kMask>(dy, x, y, i, len, mean, la, lb, sum_dy, sum_dy_xmu);
}

// Eight channels at a time down the rows, with their sums in registers;
// the rest one by one. The next `rows` rows are prefetched, one line per
// 16 floats of each tensor: the column-wise walk is no stream the hardware
// prefetcher follows.
template <bool kMask>
void AddRowsSse2(const float* dy, const float* x, const float* y,
                 int64_t stride, int64_t rows, int64_t j, int64_t width,
                 const double* mean, double* __restrict sum_dy,
                 double* __restrict sum_dy_xmu) {
  for (; j + 8 <= width; j += 8) {
    const __m128d m0 = _mm_loadu_pd(mean + j), m1 = _mm_loadu_pd(mean + j + 2),
                  m2 = _mm_loadu_pd(mean + j + 4),
                  m3 = _mm_loadu_pd(mean + j + 6);
    __m128d a0 = _mm_loadu_pd(sum_dy + j), a1 = _mm_loadu_pd(sum_dy + j + 2),
            a2 = _mm_loadu_pd(sum_dy + j + 4),
            a3 = _mm_loadu_pd(sum_dy + j + 6);
    __m128d b0 = _mm_loadu_pd(sum_dy_xmu + j),
            b1 = _mm_loadu_pd(sum_dy_xmu + j + 2),
            b2 = _mm_loadu_pd(sum_dy_xmu + j + 4),
            b3 = _mm_loadu_pd(sum_dy_xmu + j + 6);
    const int64_t ahead = j % 16 == 0 ? rows * stride : -1;
    for (int64_t r = 0, o = j; r < rows; ++r, o += stride) {
      if (ahead >= 0) {
        __builtin_prefetch(dy + o + ahead);
        __builtin_prefetch(x + o + ahead);
        if (kMask) __builtin_prefetch(y + o + ahead);
      }
      __m128d d0, d1, d2, d3, x0, x1, x2, x3;
      MaskedSse2<kMask>(dy + o, MaskAt<kMask>(y, o), d0, d1);
      MaskedSse2<kMask>(dy + o + 4, MaskAt<kMask>(y, o + 4), d2, d3);
      WidenSse2(x + o, x0, x1);
      WidenSse2(x + o + 4, x2, x3);
      a0 = _mm_add_pd(a0, d0);
      a1 = _mm_add_pd(a1, d1);
      a2 = _mm_add_pd(a2, d2);
      a3 = _mm_add_pd(a3, d3);
      b0 = _mm_add_pd(b0, _mm_mul_pd(d0, _mm_sub_pd(x0, m0)));
      b1 = _mm_add_pd(b1, _mm_mul_pd(d1, _mm_sub_pd(x1, m1)));
      b2 = _mm_add_pd(b2, _mm_mul_pd(d2, _mm_sub_pd(x2, m2)));
      b3 = _mm_add_pd(b3, _mm_mul_pd(d3, _mm_sub_pd(x3, m3)));
    }
    _mm_storeu_pd(sum_dy + j, a0);
    _mm_storeu_pd(sum_dy + j + 2, a1);
    _mm_storeu_pd(sum_dy + j + 4, a2);
    _mm_storeu_pd(sum_dy + j + 6, a3);
    _mm_storeu_pd(sum_dy_xmu + j, b0);
    _mm_storeu_pd(sum_dy_xmu + j + 2, b1);
    _mm_storeu_pd(sum_dy_xmu + j + 4, b2);
    _mm_storeu_pd(sum_dy_xmu + j + 6, b3);
  }
  if (j < width) {
    AddRowsGeneric<kMask>(dy + j, x + j, kMask ? y + j : y, stride, rows,
                          width - j, mean + j, sum_dy + j, sum_dy_xmu + j);
  }
}

// AVX2 versions (no FMA: products are rounded as in the SSE2 and generic
// code, so every path gives the same bits), chosen at run time.
template <bool kMask>
__attribute__((target("avx2"))) inline __m256d MaskedAvx2(const float* dy,
                                                          const float* y) {
  const __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(dy));
  if (!kMask) return d;
  const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(y));
  return _mm256_and_pd(_mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_GT_OQ), d);
}

template <bool kMask>
__attribute__((target("avx2"))) void GradLaneSumsAvx2(
    const float* dy, const float* x, const float* y, int64_t len, double mean,
    double& sum_dy, double& sum_dy_xmu) {
  const __m256d m = _mm256_set1_pd(mean);
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    if (i % 16 == 0) {
      __builtin_prefetch(dy + i + kPrefetchAhead);
      __builtin_prefetch(x + i + kPrefetchAhead);
      if (kMask) __builtin_prefetch(y + i + kPrefetchAhead);
    }
    const __m256d d0 = MaskedAvx2<kMask>(dy + i, MaskAt<kMask>(y, i));
    const __m256d d1 = MaskedAvx2<kMask>(dy + i + 4, MaskAt<kMask>(y, i + 4));
    const __m256d x0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), m);
    const __m256d x1 =
        _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)), m);
    a0 = _mm256_add_pd(a0, d0);
    a1 = _mm256_add_pd(a1, d1);
    b0 = _mm256_add_pd(b0, _mm256_mul_pd(d0, x0));
    b1 = _mm256_add_pd(b1, _mm256_mul_pd(d1, x1));
  }
  double la[kLanes], lb[kLanes];
  _mm256_storeu_pd(la, a0);
  _mm256_storeu_pd(la + 4, a1);
  _mm256_storeu_pd(lb, b0);
  _mm256_storeu_pd(lb + 4, b1);
  FinishLaneSums<kMask>(dy, x, y, i, len, mean, la, lb, sum_dy, sum_dy_xmu);
}

// Sixteen channels at a time (eight independent addition chains), then
// AddRowsSse2 for the rest.
template <bool kMask>
__attribute__((target("avx2"))) void AddRowsAvx2(
    const float* dy, const float* x, const float* y, int64_t stride,
    int64_t rows, int64_t width, const double* mean, double* __restrict sum_dy,
    double* __restrict sum_dy_xmu) {
  int64_t j = 0;
  for (; j + 16 <= width; j += 16) {
    const __m256d m0 = _mm256_loadu_pd(mean + j),
                  m1 = _mm256_loadu_pd(mean + j + 4),
                  m2 = _mm256_loadu_pd(mean + j + 8),
                  m3 = _mm256_loadu_pd(mean + j + 12);
    __m256d a0 = _mm256_loadu_pd(sum_dy + j),
            a1 = _mm256_loadu_pd(sum_dy + j + 4),
            a2 = _mm256_loadu_pd(sum_dy + j + 8),
            a3 = _mm256_loadu_pd(sum_dy + j + 12);
    __m256d b0 = _mm256_loadu_pd(sum_dy_xmu + j),
            b1 = _mm256_loadu_pd(sum_dy_xmu + j + 4),
            b2 = _mm256_loadu_pd(sum_dy_xmu + j + 8),
            b3 = _mm256_loadu_pd(sum_dy_xmu + j + 12);
    const int64_t ahead = rows * stride;
    for (int64_t r = 0, o = j; r < rows; ++r, o += stride) {
      __builtin_prefetch(dy + o + ahead);
      __builtin_prefetch(x + o + ahead);
      if (kMask) __builtin_prefetch(y + o + ahead);
      const __m256d d0 = MaskedAvx2<kMask>(dy + o, MaskAt<kMask>(y, o));
      const __m256d d1 = MaskedAvx2<kMask>(dy + o + 4, MaskAt<kMask>(y, o + 4));
      const __m256d d2 = MaskedAvx2<kMask>(dy + o + 8, MaskAt<kMask>(y, o + 8));
      const __m256d d3 =
          MaskedAvx2<kMask>(dy + o + 12, MaskAt<kMask>(y, o + 12));
      a0 = _mm256_add_pd(a0, d0);
      a1 = _mm256_add_pd(a1, d1);
      a2 = _mm256_add_pd(a2, d2);
      a3 = _mm256_add_pd(a3, d3);
      b0 = _mm256_add_pd(
          b0, _mm256_mul_pd(
                  d0, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + o)), m0)));
      b1 = _mm256_add_pd(
          b1,
          _mm256_mul_pd(
              d1, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + o + 4)), m1)));
      b2 = _mm256_add_pd(
          b2,
          _mm256_mul_pd(
              d2, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + o + 8)), m2)));
      b3 = _mm256_add_pd(
          b3, _mm256_mul_pd(
                  d3, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + o + 12)),
                                    m3)));
    }
    _mm256_storeu_pd(sum_dy + j, a0);
    _mm256_storeu_pd(sum_dy + j + 4, a1);
    _mm256_storeu_pd(sum_dy + j + 8, a2);
    _mm256_storeu_pd(sum_dy + j + 12, a3);
    _mm256_storeu_pd(sum_dy_xmu + j, b0);
    _mm256_storeu_pd(sum_dy_xmu + j + 4, b1);
    _mm256_storeu_pd(sum_dy_xmu + j + 8, b2);
    _mm256_storeu_pd(sum_dy_xmu + j + 12, b3);
  }
  AddRowsSse2<kMask>(dy, x, y, stride, rows, j, width, mean, sum_dy,
                     sum_dy_xmu);
}
#endif  // __SSE2__

template <bool kMask, typename T>
void GradLaneSumsFor(Isa isa, const T* dy, const T* x, const T* y, int64_t len,
                     double mean, double& sum_dy, double& sum_dy_xmu) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return GradLaneSumsAvx2<kMask>(dy, x, y, len, mean, sum_dy, sum_dy_xmu);
      case Isa::kSse2:
        return GradLaneSumsSse2<kMask>(dy, x, y, len, mean, sum_dy, sum_dy_xmu);
      default:
        break;
    }
  }
#endif
  GradLaneSumsGeneric<kMask>(dy, x, y, len, mean, sum_dy, sum_dy_xmu);
}

template <bool kMask, typename T>
void AddRowsFor(Isa isa, const T* dy, const T* x, const T* y, int64_t stride,
                int64_t rows, int64_t width, const double* mean, double* sum_dy,
                double* sum_dy_xmu) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return AddRowsAvx2<kMask>(dy, x, y, stride, rows, width, mean, sum_dy,
                                  sum_dy_xmu);
      case Isa::kSse2:
        return AddRowsSse2<kMask>(dy, x, y, stride, rows, 0, width, mean,
                                  sum_dy, sum_dy_xmu);
      default:
        break;
    }
  }
#endif
  AddRowsGeneric<kMask>(dy, x, y, stride, rows, width, mean, sum_dy,
                        sum_dy_xmu);
}

}  // namespace

template <typename T>
void GradLaneSums(Isa isa, const T* dy, const T* x, const T* y, int64_t len,
                  double mean, double& sum_dy, double& sum_dy_xmu) {
  if (y != nullptr) {
    GradLaneSumsFor<true>(isa, dy, x, y, len, mean, sum_dy, sum_dy_xmu);
  } else {
    GradLaneSumsFor<false>(isa, dy, x, y, len, mean, sum_dy, sum_dy_xmu);
  }
}

template <typename T>
void AddRowGradSums(Isa isa, const T* dy, const T* x, const T* y,
                    int64_t stride, int64_t rows, int64_t width,
                    const double* mean, double* sum_dy, double* sum_dy_xmu) {
  if (y != nullptr) {
    AddRowsFor<true>(isa, dy, x, y, stride, rows, width, mean, sum_dy,
                     sum_dy_xmu);
  } else {
    AddRowsFor<false>(isa, dy, x, y, stride, rows, width, mean, sum_dy,
                      sum_dy_xmu);
  }
}

#define SYNCNORM_INSTANTIATE(T)                                               \
  template void GradLaneSums<T>(Isa, const T*, const T*, const T*, int64_t,   \
                                double, double&, double&);                    \
  template void AddRowGradSums<T>(Isa, const T*, const T*, const T*, int64_t, \
                                  int64_t, int64_t, const double*, double*,   \
                                  double*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
