// The elementwise loop of the CPU Forward kernel, over runs of rows:
//   y = relu?((x - mean) * scale + shift (+ z))
// computed in double from exact loads of the element type and rounded once
// to it. float has SSE2 and AVX2 versions (cpu_isa.h: bitwise the same as
// the generic loop); Half and BFloat16 use the generic loop.
#ifndef SYNCNORM_KERNELS_CPU_FORWARD_LOOPS_H_
#define SYNCNORM_KERNELS_CPU_FORWARD_LOOPS_H_

#include <cstdint>

#include "kernels/cpu_isa.h"
#include "kernels/half.h"

namespace syncnorm {
namespace cpu {

struct ForwardLoopOptions {
  // Coefficients per element of a row (channels-last rows), instead of one
  // per row (channels-first rows). Default: per row.
  bool last = false;
  // Add z before the ReLU. Default: no z.
  bool residual = false;
  // Fused ReLU (NaN passes through, as in torch). Default: off.
  bool relu = false;
  // Write y with non-temporal (streaming) stores, which skip the cache: for
  // outputs much larger than the last-level cache that nobody reads soon.
  // The SIMD float loops honour it; the generic loop stores normally.
  // REQUIRES: StoreFence() after the last such call, before y is read by
  // another thread. Default: off.
  bool stream = false;
};

// Element (r, j), r < rows, j < len, is at offset r * len + j of x, z and y;
// its coefficients are mean[k], scale[k] and shift[k] with k = j (last) or
// k = r (not last). z is read only when residual. y may equal x (and z).
template <typename T>
using ForwardRowsFn = void (*)(const T* x, const T* z, T* y, int64_t rows,
                               int64_t len, const double* mean,
                               const double* scale, const double* shift);

// The loop for `options` on `isa`. REQUIRES: IsaSupported(isa).
template <typename T>
ForwardRowsFn<T> PickForwardRows(Isa isa, const ForwardLoopOptions& options);

// Orders this thread's earlier streaming stores before its later stores
// (an sfence on x86; nothing elsewhere).
void StoreFence();

// Output bytes from which Forward uses streaming stores: the size of the
// last-level cache this CPU reports (32 MiB when it reports none), so that
// y alone would not fit and x + y are at least twice the cache. Asked once.
int64_t StreamingStoreBytes();

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_FORWARD_LOOPS_H_
