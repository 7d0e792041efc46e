// The summation loops of the CPU LocalMoments kernel: sums and sums of
// squares of shifted values, in double. Each fixes its order of additions,
// and the SSE2 and AVX2 float versions (cpu_isa.h) keep that order, so every
// Isa gives bitwise the same sums. Half and BFloat16 use the generic loops.
#ifndef SYNCNORM_KERNELS_CPU_MOMENTS_LOOPS_H_
#define SYNCNORM_KERNELS_CPU_MOMENTS_LOOPS_H_

#include <cstdint>

#include "kernels/cpu_isa.h"

namespace syncnorm {
namespace cpu {

// s1 = sum of (v[i] - shift) and s2 = sum of its squares, i < len. Lane l
// adds the values with i = l mod kLanes (cpu_sums.h) in order; then s1 (s2)
// adds the tail past the last whole group of kLanes, then the lanes in
// order. REQUIRES: IsaSupported(isa).
template <typename T>
void ShiftedSums(Isa isa, const T* v, int64_t len, double shift, double& s1,
                 double& s2);

// For every channel j < width: adds (x[r * stride + j] - shift[j]) to s1[j]
// and its square to s2[j], for rows r = 0, 1, ..., rows - 1 in that order.
// The row walk goes down columns of channels a cache-sized chunk of rows at
// a time, with the next chunk prefetched. REQUIRES: IsaSupported(isa),
// width <= stride.
template <typename T>
void AddRowShiftedSums(Isa isa, const T* x, int64_t stride, int64_t rows,
                       int64_t width, const double* shift, double* s1,
                       double* s2);

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_MOMENTS_LOOPS_H_
