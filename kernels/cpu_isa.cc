#include "kernels/cpu_isa.h"

namespace syncnorm {
namespace cpu {

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return true;
#ifdef __SSE2__
    case Isa::kSse2:
      return true;
    case Isa::kAvx2: {
      static const bool have = __builtin_cpu_supports("avx2");
      return have;
    }
#endif
    default:
      return false;
  }
}

Isa BestIsa() {
  static const Isa best = IsaSupported(Isa::kAvx2)   ? Isa::kAvx2
                          : IsaSupported(Isa::kSse2) ? Isa::kSse2
                                                     : Isa::kGeneric;
  return best;
}

}  // namespace cpu
}  // namespace syncnorm
