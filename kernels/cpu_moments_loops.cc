#include "kernels/cpu_moments_loops.h"

#include <algorithm>
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

// Values of one chunk of the column-wise row walk: 16 KiB of float, so the
// lines a column pulls in are still in L1 for the columns next to it.
inline constexpr int64_t kChunkValues = 4096;
// Floats ahead of the current position that ShiftedSums prefetches.
inline constexpr int64_t kPrefetchAhead = 512;

template <typename T>
void ShiftedSumsGeneric(const T* v, int64_t len, double shift, double& s1,
                        double& s2) {
  double a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double d = ToDouble(v[i + l]) - shift;
      a[l] += d;
      b[l] += d * d;
    }
  }
  s1 = 0;
  s2 = 0;
  for (; i < len; ++i) {
    const double d = ToDouble(v[i]) - shift;
    s1 += d;
    s2 += d * d;
  }
  for (int l = 0; l < kLanes; ++l) {
    s1 += a[l];
    s2 += b[l];
  }
}

template <typename T>
void AddRowsGeneric(const T* x, int64_t stride, int64_t rows, int64_t width,
                    const double* __restrict shift, double* __restrict s1,
                    double* __restrict s2) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    for (int64_t j = 0; j < width; ++j) {
      const double d = ToDouble(row[j]) - shift[j];
      s1[j] += d;
      s2[j] += d * d;
    }
  }
}

#ifdef __SSE2__
// The tail and the lanes of the SIMD ShiftedSums, in the generic order.
void FinishShiftedSums(const float* v, int64_t i, int64_t len, double shift,
                       const double* la, const double* lb, double& s1,
                       double& s2) {
  s1 = 0;
  s2 = 0;
  for (; i < len; ++i) {
    const double d = static_cast<double>(v[i]) - shift;
    s1 += d;
    s2 += d * d;
  }
  for (int l = 0; l < kLanes; ++l) {
    s1 += la[l];
    s2 += lb[l];
  }
}

// The sixteen partial sums live in eight SSE2 registers (named, not arrays:
// GCC keeps arrays of accumulators in memory).
void ShiftedSumsSse2(const float* v, int64_t len, double shift, double& s1,
                     double& s2) {
  static_assert(kLanes == 8, "four registers of two lanes");
  const __m128d sh = _mm_set1_pd(shift);
  __m128d a0 = _mm_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  __m128d b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    // A channels-first block is a short run (a few pages) far from the
    // previous one, too short for the hardware prefetcher to ramp up: fetch
    // ahead here (prefetching never faults, even past the tensor).
    if (i % 16 == 0) __builtin_prefetch(v + i + kPrefetchAhead);
    const __m128 lo = _mm_loadu_ps(v + i);
    const __m128 hi = _mm_loadu_ps(v + i + 4);
    const __m128d d0 = _mm_sub_pd(_mm_cvtps_pd(lo), sh);
    const __m128d d1 = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(lo, lo)), sh);
    const __m128d d2 = _mm_sub_pd(_mm_cvtps_pd(hi), sh);
    const __m128d d3 = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(hi, hi)), sh);
    a0 = _mm_add_pd(a0, d0);
    a1 = _mm_add_pd(a1, d1);
    a2 = _mm_add_pd(a2, d2);
    a3 = _mm_add_pd(a3, d3);
    b0 = _mm_add_pd(b0, _mm_mul_pd(d0, d0));
    b1 = _mm_add_pd(b1, _mm_mul_pd(d1, d1));
    b2 = _mm_add_pd(b2, _mm_mul_pd(d2, d2));
    b3 = _mm_add_pd(b3, _mm_mul_pd(d3, d3));
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
  FinishShiftedSums(v, i, len, shift, la, lb, s1, s2);
}

// AVX2 versions (no FMA: products are rounded as in the SSE2 and generic
// code, so every path gives the same bits), chosen at run time.
__attribute__((target("avx2"))) void ShiftedSumsAvx2(const float* v,
                                                     int64_t len, double shift,
                                                     double& s1, double& s2) {
  const __m256d sh = _mm256_set1_pd(shift);
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    if (i % 16 == 0) __builtin_prefetch(v + i + kPrefetchAhead);
    const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + i)), sh);
    const __m256d d1 =
        _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + i + 4)), sh);
    a0 = _mm256_add_pd(a0, d0);
    a1 = _mm256_add_pd(a1, d1);
    b0 = _mm256_add_pd(b0, _mm256_mul_pd(d0, d0));
    b1 = _mm256_add_pd(b1, _mm256_mul_pd(d1, d1));
  }
  double la[kLanes], lb[kLanes];
  _mm256_storeu_pd(la, a0);
  _mm256_storeu_pd(la + 4, a1);
  _mm256_storeu_pd(lb, b0);
  _mm256_storeu_pd(lb + 4, b1);
  FinishShiftedSums(v, i, len, shift, la, lb, s1, s2);
}

// One chunk of rows (`rows` rows, `stride` apart) for channels [j, width):
// eight channels at a time with their sixteen sums in registers, walking
// down the rows; the rest one by one. Each channel still adds its rows in
// order. The next chunk's rows (the same columns, `rows * stride` ahead)
// are prefetched while this one is summed, one line per 16 floats: the
// column-wise walk is no stream the hardware prefetcher follows.
void ChunkSse2(const float* x, int64_t stride, int64_t rows, int64_t j,
               int64_t width, const double* __restrict shift,
               double* __restrict s1, double* __restrict s2) {
  for (; j + 8 <= width; j += 8) {
    const __m128d h0 = _mm_loadu_pd(shift + j),
                  h1 = _mm_loadu_pd(shift + j + 2),
                  h2 = _mm_loadu_pd(shift + j + 4),
                  h3 = _mm_loadu_pd(shift + j + 6);
    __m128d a0 = _mm_loadu_pd(s1 + j), a1 = _mm_loadu_pd(s1 + j + 2),
            a2 = _mm_loadu_pd(s1 + j + 4), a3 = _mm_loadu_pd(s1 + j + 6);
    __m128d b0 = _mm_loadu_pd(s2 + j), b1 = _mm_loadu_pd(s2 + j + 2),
            b2 = _mm_loadu_pd(s2 + j + 4), b3 = _mm_loadu_pd(s2 + j + 6);
    const float* p = x + j;
    const int64_t ahead = j % 16 == 0 ? rows * stride : -1;
    for (int64_t r = 0; r < rows; ++r, p += stride) {
      if (ahead >= 0) __builtin_prefetch(p + ahead);
      const __m128 lo = _mm_loadu_ps(p);
      const __m128 hi = _mm_loadu_ps(p + 4);
      const __m128d d0 = _mm_sub_pd(_mm_cvtps_pd(lo), h0);
      const __m128d d1 = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(lo, lo)), h1);
      const __m128d d2 = _mm_sub_pd(_mm_cvtps_pd(hi), h2);
      const __m128d d3 = _mm_sub_pd(_mm_cvtps_pd(_mm_movehl_ps(hi, hi)), h3);
      a0 = _mm_add_pd(a0, d0);
      a1 = _mm_add_pd(a1, d1);
      a2 = _mm_add_pd(a2, d2);
      a3 = _mm_add_pd(a3, d3);
      b0 = _mm_add_pd(b0, _mm_mul_pd(d0, d0));
      b1 = _mm_add_pd(b1, _mm_mul_pd(d1, d1));
      b2 = _mm_add_pd(b2, _mm_mul_pd(d2, d2));
      b3 = _mm_add_pd(b3, _mm_mul_pd(d3, d3));
    }
    _mm_storeu_pd(s1 + j, a0);
    _mm_storeu_pd(s1 + j + 2, a1);
    _mm_storeu_pd(s1 + j + 4, a2);
    _mm_storeu_pd(s1 + j + 6, a3);
    _mm_storeu_pd(s2 + j, b0);
    _mm_storeu_pd(s2 + j + 2, b1);
    _mm_storeu_pd(s2 + j + 4, b2);
    _mm_storeu_pd(s2 + j + 6, b3);
  }
  if (j < width) {
    AddRowsGeneric(x + j, stride, rows, width - j, shift + j, s1 + j, s2 + j);
  }
}

// Sixteen channels at a time (eight independent addition chains), then
// ChunkSse2 for the rest.
__attribute__((target("avx2"))) void ChunkAvx2(const float* x, int64_t stride,
                                               int64_t rows, int64_t j,
                                               int64_t width,
                                               const double* __restrict shift,
                                               double* __restrict s1,
                                               double* __restrict s2) {
  for (; j + 16 <= width; j += 16) {
    const __m256d h0 = _mm256_loadu_pd(shift + j),
                  h1 = _mm256_loadu_pd(shift + j + 4),
                  h2 = _mm256_loadu_pd(shift + j + 8),
                  h3 = _mm256_loadu_pd(shift + j + 12);
    __m256d a0 = _mm256_loadu_pd(s1 + j), a1 = _mm256_loadu_pd(s1 + j + 4),
            a2 = _mm256_loadu_pd(s1 + j + 8), a3 = _mm256_loadu_pd(s1 + j + 12);
    __m256d b0 = _mm256_loadu_pd(s2 + j), b1 = _mm256_loadu_pd(s2 + j + 4),
            b2 = _mm256_loadu_pd(s2 + j + 8), b3 = _mm256_loadu_pd(s2 + j + 12);
    const float* p = x + j;
    const int64_t ahead = rows * stride;
    for (int64_t r = 0; r < rows; ++r, p += stride) {
      __builtin_prefetch(p + ahead);
      const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(p)), h0);
      const __m256d d1 =
          _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + 4)), h1);
      const __m256d d2 =
          _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + 8)), h2);
      const __m256d d3 =
          _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + 12)), h3);
      a0 = _mm256_add_pd(a0, d0);
      a1 = _mm256_add_pd(a1, d1);
      a2 = _mm256_add_pd(a2, d2);
      a3 = _mm256_add_pd(a3, d3);
      b0 = _mm256_add_pd(b0, _mm256_mul_pd(d0, d0));
      b1 = _mm256_add_pd(b1, _mm256_mul_pd(d1, d1));
      b2 = _mm256_add_pd(b2, _mm256_mul_pd(d2, d2));
      b3 = _mm256_add_pd(b3, _mm256_mul_pd(d3, d3));
    }
    _mm256_storeu_pd(s1 + j, a0);
    _mm256_storeu_pd(s1 + j + 4, a1);
    _mm256_storeu_pd(s1 + j + 8, a2);
    _mm256_storeu_pd(s1 + j + 12, a3);
    _mm256_storeu_pd(s2 + j, b0);
    _mm256_storeu_pd(s2 + j + 4, b1);
    _mm256_storeu_pd(s2 + j + 8, b2);
    _mm256_storeu_pd(s2 + j + 12, b3);
  }
  ChunkSse2(x, stride, rows, j, width, shift, s1, s2);
}

using ChunkFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t,
                         const double*, double*, double*);

// All rows, a chunk of about kChunkValues values at a time.
void AddRowsChunked(ChunkFn chunk, const float* x, int64_t stride, int64_t rows,
                    int64_t width, const double* shift, double* s1,
                    double* s2) {
  const int64_t per_chunk = std::max<int64_t>(1, kChunkValues / width);
  for (int64_t r = 0; r < rows; r += per_chunk) {
    chunk(x + r * stride, stride, std::min(per_chunk, rows - r), 0, width,
          shift, s1, s2);
  }
}
#endif  // __SSE2__

}  // namespace

template <typename T>
void ShiftedSums(Isa isa, const T* v, int64_t len, double shift, double& s1,
                 double& s2) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return ShiftedSumsAvx2(v, len, shift, s1, s2);
      case Isa::kSse2:
        return ShiftedSumsSse2(v, len, shift, s1, s2);
      default:
        break;
    }
  }
#endif
  ShiftedSumsGeneric(v, len, shift, s1, s2);
}

template <typename T>
void AddRowShiftedSums(Isa isa, const T* x, int64_t stride, int64_t rows,
                       int64_t width, const double* shift, double* s1,
                       double* s2) {
#ifdef __SSE2__
  if constexpr (std::is_same_v<T, float>) {
    switch (isa) {
      case Isa::kAvx2:
        return AddRowsChunked(&ChunkAvx2, x, stride, rows, width, shift, s1,
                              s2);
      case Isa::kSse2:
        return AddRowsChunked(&ChunkSse2, x, stride, rows, width, shift, s1,
                              s2);
      default:
        break;
    }
  }
#endif
  AddRowsGeneric(x, stride, rows, width, shift, s1, s2);
}

#define SYNCNORM_INSTANTIATE(T)                                                \
  template void ShiftedSums<T>(Isa, const T*, int64_t, double, double&,        \
                               double&);                                       \
  template void AddRowShiftedSums<T>(Isa, const T*, int64_t, int64_t, int64_t, \
                                     const double*, double*, double*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
