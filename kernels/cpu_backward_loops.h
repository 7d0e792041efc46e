// The elementwise loop of the CPU BackwardElementwise kernel, over runs of
// rows:
//   grad_input = a * (d - mean_dy - (x - mean) * k),  grad_z = d,
// with d = dy (zero where the fused ReLU's output y is not > 0), computed in
// double from exact loads of the element type and rounded once to it. float
// has SSE2 and AVX2 versions (cpu_isa.h: bitwise the same as the generic
// loop); Half and BFloat16 use the generic loop.
#ifndef SYNCNORM_KERNELS_CPU_BACKWARD_LOOPS_H_
#define SYNCNORM_KERNELS_CPU_BACKWARD_LOOPS_H_

#include <cstdint>

#include "kernels/cpu_isa.h"

namespace syncnorm {
namespace cpu {

struct BackwardLoopOptions {
  // Coefficients per element of a row (channels-last rows), instead of one
  // per row (channels-first rows). Default: per row.
  bool last = false;
  // Mask dy by y > 0 (the fused ReLU's gradient). Default: no mask.
  bool mask = false;
  // Also write grad_z = d. Default: no grad_z.
  bool grad_z = false;
};

// Per-channel coefficients, indexed like ForwardRowsFn's (k = j or r):
// a = weight * invstd, k = invstd^2 * mean_dy_xmu.
struct BackwardCoefficients {
  const double* mean;
  const double* a;
  const double* mean_dy;
  const double* k;
};

// Element (r, j), r < rows, j < len, is at offset r * len + j of every
// tensor. y is read only with mask, grad_z written only with grad_z.
// grad_input and grad_z may equal dy.
template <typename T>
using BackwardRowsFn = void (*)(const T* dy, const T* x, const T* y,
                                T* grad_input, T* grad_z, int64_t rows,
                                int64_t len, const BackwardCoefficients& co);

// The loop for `options` on `isa`. REQUIRES: IsaSupported(isa).
template <typename T>
BackwardRowsFn<T> PickBackwardRows(Isa isa, const BackwardLoopOptions& options);

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_BACKWARD_LOOPS_H_
