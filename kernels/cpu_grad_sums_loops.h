// The summation loops of the CPU BackwardReduce kernel: sums of d and of
// d * (x - mean) in double, with d = dy (zero where the fused ReLU's output
// y is not > 0, when y is given). Each fixes its order of additions, and
// the SSE2 and AVX2 float versions (cpu_isa.h) keep it, so every Isa gives
// bitwise the same sums. Half and BFloat16 use the generic loops.
#ifndef SYNCNORM_KERNELS_CPU_GRAD_SUMS_LOOPS_H_
#define SYNCNORM_KERNELS_CPU_GRAD_SUMS_LOOPS_H_

#include <cstdint>

#include "kernels/cpu_isa.h"

namespace syncnorm {
namespace cpu {

// sum_dy and sum_dy_xmu of elements i < len of dy, x (and y, unless null),
// each added in LaneSum's order (cpu_sums.h). REQUIRES: IsaSupported(isa).
template <typename T>
void GradLaneSums(Isa isa, const T* dy, const T* x, const T* y, int64_t len,
                  double mean, double& sum_dy, double& sum_dy_xmu);

// For every channel j < width: adds d and d * (x - mean[j]) of the element
// at r * stride + j to sum_dy[j] and sum_dy_xmu[j], for rows r = 0, 1, ...,
// rows - 1 in that order. The next `rows` rows are prefetched.
// REQUIRES: IsaSupported(isa), width <= stride.
template <typename T>
void AddRowGradSums(Isa isa, const T* dy, const T* x, const T* y,
                    int64_t stride, int64_t rows, int64_t width,
                    const double* mean, double* sum_dy, double* sum_dy_xmu);

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_GRAD_SUMS_LOOPS_H_
