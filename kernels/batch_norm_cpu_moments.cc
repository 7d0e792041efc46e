// LocalMoments on the CPU.
//
// One streaming pass: each block of at most kBlock values is read once, and
// per lane it accumulates the sum and the sum of squares of (x - shift) in
// double, where `shift` is the task's running mean so far (the block's first
// value for the task's first block). Shifted by a value within a few
// standard deviations of the mean, M2 = S2 - S1^2 / n loses no more than a
// digit or two even when |mean| >> std; without the shift it would lose them
// all. Both the shift and the fixed lane order depend only on the data and
// the geometry-based split, so results are bitwise independent of the thread
// count. Blocks, then tasks, are folded by the Chan merge in a fixed order.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_partition.h"
#include "kernels/cpu_sums.h"
#include "kernels/formulas.h"

namespace syncnorm {
namespace cpu {
namespace {

// Per-task results, entry [c * parts + p].
struct PartialMoments {
  explicit PartialMoments(int64_t size) : n(size), mean(size), m2(size) {}
  std::vector<double> n, mean, m2;
};

// Floats ahead of the current position that ShiftedSums prefetches.
inline constexpr int64_t kPrefetchAhead = 512;

// Prefetches the first kPrefetchAhead floats of the block a task reads next.
template <typename T>
void PrefetchBlockStart(const T* v) {
  for (int64_t i = 0; i < kPrefetchAhead; i += 64 / sizeof(T)) {
    __builtin_prefetch(v + i);
  }
}

// Sum and sum of squares of (v[i] - shift), i in [0, len), in double. The
// order of additions is fixed as in LaneSum (cpu_sums.h).
template <typename T>
void ShiftedSums(const T* v, int64_t len, double shift, double& s1,
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

#ifdef __SSE2__
// Defined below, with its SSE2 and AVX2 versions.
template <>
void ShiftedSums<float>(const float* v, int64_t len, double shift, double& s1,
                        double& s2);

// The float version: the same lanes and order as the template (lane
// l sums the values at i = l mod kLanes), with the sixteen partial sums held
// in eight SSE2 registers; the generic loop keeps them in memory. Bitwise
// the same result.
void ShiftedSumsSse2(const float* v, int64_t len, double shift, double& s1,
                     double& s2) {
  static_assert(kLanes == 8, "four registers of two lanes");
  const __m128d sh = _mm_set1_pd(shift);
  // Named, not arrays: GCC keeps arrays of accumulators in memory.
  __m128d a0 = _mm_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  __m128d b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    // A block is a short run (a few pages) far from the previous one, too
    // short for the hardware prefetcher to ramp up: fetch ahead ourselves
    // (past the block's end this reaches the next channel, which a later
    // task reads; prefetching never faults).
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
  s1 = 0;
  s2 = 0;
  for (; i < len; ++i) {
    const double d = static_cast<double>(v[i]) - shift;
    s1 += d;
    s2 += d * d;
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
  for (int l = 0; l < kLanes; ++l) {
    s1 += la[l];
    s2 += lb[l];
  }
}
#endif  // __SSE2__

// Mean and M2 of `n` values whose shifted sums are s1, s2.
inline void FromShifted(double n, double shift, double s1, double s2,
                        double& mean, double& m2) {
  const double d = s1 / n;
  mean = shift + d;
  m2 = std::max(0.0, s2 - s1 * d);
}

// Task (channel c, part p) of a channels-first tensor.
template <typename T>
void FirstLayoutTask(const T* x, const Geometry& g, const ReducePlan& plan,
                     int64_t c, int64_t p, PartialMoments& out) {
  const Range blocks = PartRange(plan.units, plan.parts, p);
  double n = 0, mean = 0, m2 = 0;
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t o = b / plan.segments;
    const int64_t begin = (b % plan.segments) * kBlock;
    const int64_t len = std::min(kBlock, g.inner - begin);
    const T* v = x + (o * g.channels + c) * g.inner + begin;
    if (b + 1 < blocks.end) {
      const int64_t next = b + 1;
      PrefetchBlockStart(x +
                         (next / plan.segments * g.channels + c) * g.inner +
                         next % plan.segments * kBlock);
    }
    const double shift = n > 0 ? mean : ToDouble(v[0]);
    double s1, s2, block_mean, block_m2;
    ShiftedSums(v, len, shift, s1, s2);
    const double nb = static_cast<double>(len);
    FromShifted(nb, shift, s1, s2, block_mean, block_m2);
    ChanMerge(n, mean, m2, nb, block_mean, block_m2);
  }
  const int64_t k = c * plan.parts + p;
  out.n[k] = n;
  out.mean[k] = mean;
  out.m2[k] = m2;
}

// Shifted sums over `rows` rows (`stride` apart) of `width` channels: per
// channel j, s1[j] and s2[j] add (x - shift[j]) and its square row by row.
template <typename T>
void RowShiftedSumsGeneric(const T* x, int64_t stride, int64_t rows,
                           int64_t width, const double* __restrict shift,
                           double* __restrict s1, double* __restrict s2) {
  std::fill(s1, s1 + width, 0.0);
  std::fill(s2, s2 + width, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    for (int64_t j = 0; j < width; ++j) {
      const double d = ToDouble(row[j]) - shift[j];
      s1[j] += d;
      s2[j] += d * d;
    }
  }
}

template <typename T>
void RowShiftedSums(const T* x, int64_t stride, int64_t rows, int64_t width,
                    const double* __restrict shift, double* __restrict s1,
                    double* __restrict s2) {
  RowShiftedSumsGeneric(x, stride, rows, width, shift, s1, s2);
}

#ifdef __SSE2__
// Defined below, with its SSE2 and AVX2 versions.
template <>
void RowShiftedSums<float>(const float* x, int64_t stride, int64_t rows,
                           int64_t width, const double* __restrict shift,
                           double* __restrict s1, double* __restrict s2);

// The float version: eight channels at a time with their sixteen
// sums in registers, rows inner (the block is in L1 after the first eight
// channels pull its lines in). Each channel still adds its rows in order:
// bitwise the same result.
void RowShiftedSumsSse2(const float* x, int64_t stride, int64_t rows,
                        int64_t width, const double* __restrict shift,
                        double* __restrict s1, double* __restrict s2) {
  int64_t j = 0;
  for (; j + 8 <= width; j += 8) {
    const __m128d h0 = _mm_loadu_pd(shift + j), h1 = _mm_loadu_pd(shift + j + 2),
                  h2 = _mm_loadu_pd(shift + j + 4),
                  h3 = _mm_loadu_pd(shift + j + 6);
    __m128d a0 = _mm_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    __m128d b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const float* p = x + j;
    // The rows right after these (the task's next block, usually) are
    // fetched while this block is summed: the column-wise walk below is no
    // stream the hardware prefetcher follows. One line per 16 floats.
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
    RowShiftedSumsGeneric(x + j, stride, rows, width - j, shift + j, s1 + j,
                          s2 + j);
  }
}

// AVX2 versions (no FMA: the products are rounded as in the SSE2 and
// generic code, so every path gives the same bits), chosen at run time.
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
  s1 = 0;
  s2 = 0;
  for (; i < len; ++i) {
    const double d = static_cast<double>(v[i]) - shift;
    s1 += d;
    s2 += d * d;
  }
  double la[kLanes], lb[kLanes];
  _mm256_storeu_pd(la, a0);
  _mm256_storeu_pd(la + 4, a1);
  _mm256_storeu_pd(lb, b0);
  _mm256_storeu_pd(lb + 4, b1);
  for (int l = 0; l < kLanes; ++l) {
    s1 += la[l];
    s2 += lb[l];
  }
}

// Sixteen channels at a time: eight independent addition chains.
__attribute__((target("avx2"))) void RowShiftedSumsAvx2(
    const float* x, int64_t stride, int64_t rows, int64_t width,
    const double* __restrict shift, double* __restrict s1,
    double* __restrict s2) {
  int64_t j = 0;
  for (; j + 16 <= width; j += 16) {
    const __m256d h0 = _mm256_loadu_pd(shift + j),
                  h1 = _mm256_loadu_pd(shift + j + 4),
                  h2 = _mm256_loadu_pd(shift + j + 8),
                  h3 = _mm256_loadu_pd(shift + j + 12);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    __m256d b0 = a0, b1 = a0, b2 = a0, b3 = a0;
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
  if (j < width) {
    RowShiftedSumsSse2(x + j, stride, rows, width - j, shift + j, s1 + j,
                       s2 + j);
  }
}

// Whether this CPU runs the AVX2 versions; asked once.
bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

template <>
void ShiftedSums<float>(const float* v, int64_t len, double shift, double& s1,
                        double& s2) {
  if (HaveAvx2()) {
    ShiftedSumsAvx2(v, len, shift, s1, s2);
  } else {
    ShiftedSumsSse2(v, len, shift, s1, s2);
  }
}

template <>
void RowShiftedSums<float>(const float* x, int64_t stride, int64_t rows,
                           int64_t width, const double* __restrict shift,
                           double* __restrict s1, double* __restrict s2) {
  if (HaveAvx2()) {
    RowShiftedSumsAvx2(x, stride, rows, width, shift, s1, s2);
  } else {
    RowShiftedSumsSse2(x, stride, rows, width, shift, s1, s2);
  }
}
#endif  // __SSE2__

// Mean and M2 of `rows` rows (`stride` apart) of `width` channels each, in
// one pass, shifted per channel by shift[j].
template <typename T>
void RowBlockMoments(const T* x, int64_t stride, int64_t rows,
                     int64_t width, const double* __restrict shift,
                     double* __restrict mean, double* __restrict m2) {
  RowShiftedSums(x, stride, rows, width, shift, mean, m2);
  const double n = static_cast<double>(rows);
  for (int64_t j = 0; j < width; ++j) {
    FromShifted(n, shift[j], mean[j], m2[j], mean[j], m2[j]);
  }
}

// Task (channel tile t, part p) of a channels-last tensor.
template <typename T>
void LastLayoutTask(const T* x, const Geometry& g, const ReducePlan& plan,
                    int64_t t, int64_t p, PartialMoments& out) {
  const int64_t c0 = t * kChannelTile;
  const int64_t width = std::min(kChannelTile, g.channels - c0);
  const int64_t rows_per_block = std::max<int64_t>(1, kBlock / width);
  const Range rows = PartRange(plan.units, plan.parts, p);
  std::array<double, kChannelTile> mean{}, m2{}, block_mean, block_m2, shift;
  double n = 0;
  for (int64_t r = rows.begin; r < rows.end; r += rows_per_block) {
    const int64_t count = std::min(rows_per_block, rows.end - r);
    const T* block = x + r * g.channels + c0;
    for (int64_t j = 0; j < width; ++j) {
      shift[j] = n > 0 ? mean[j] : ToDouble(block[j]);
    }
    RowBlockMoments(block, g.channels, count, width, shift.data(),
                    block_mean.data(), block_m2.data());
    const double nb = static_cast<double>(count);
    for (int64_t j = 0; j < width; ++j) {
      double na = n;
      ChanMerge(na, mean[j], m2[j], nb, block_mean[j], block_m2[j]);
    }
    n += nb;
  }
  for (int64_t j = 0; j < width; ++j) {
    const int64_t k = (c0 + j) * plan.parts + p;
    out.n[k] = n;
    out.mean[k] = mean[j];
    out.m2[k] = m2[j];
  }
}

}  // namespace

template <typename T>
void LocalMoments(ThreadPool* pool, const T* x, const Geometry& g,
                  Moments* out) {
  const int channels = static_cast<int>(g.channels);
  *out = Moments::Zero(channels);
  if (g.per_channel() == 0) return;
  const ReducePlan plan = MakeReducePlan(g);
  PartialMoments partial(g.channels * plan.parts);
  RunTasks(pool, plan.tasks(), [&](int64_t task) {
    const int64_t group = task / plan.parts;
    const int64_t p = task % plan.parts;
    if (g.inner == 1) {
      LastLayoutTask(x, g, plan, group, p, partial);
    } else {
      FirstLayoutTask(x, g, plan, group, p, partial);
    }
  });
  for (int c = 0; c < channels; ++c) {
    double n = 0;
    for (int64_t p = 0; p < plan.parts; ++p) {
      const int64_t k = c * plan.parts + p;
      ChanMerge(n, out->mean[c], out->m2[c], partial.n[k], partial.mean[k],
                partial.m2[k]);
    }
  }
  out->count = g.per_channel();
}

#define SYNCNORM_INSTANTIATE(T) \
  template void LocalMoments<T>(ThreadPool*, const T*, const Geometry&, \
                                Moments*);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
