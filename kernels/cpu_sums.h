// Summation helpers of the CPU reductions.
#ifndef SYNCNORM_KERNELS_CPU_SUMS_H_
#define SYNCNORM_KERNELS_CPU_SUMS_H_

#include <cstdint>

namespace syncnorm {
namespace cpu {

// Independent accumulators of LaneSum: enough for the compiler to fill
// SIMD registers without reassociating floating point itself.
inline constexpr int kLanes = 8;

// The sum of term(i) for i in [0, len), in double. The order of additions is
// fixed (lane l takes i = l mod kLanes, the lanes then add up in order), so
// the result depends only on the values.
template <typename Term>
double LaneSum(int64_t len, Term term) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
  }
  double sum = 0;
  for (; i < len; ++i) sum += term(i);
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  return sum;
}

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_SUMS_H_
