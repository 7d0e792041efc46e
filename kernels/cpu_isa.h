// The instruction sets the CPU kernels' float loops are written for.
//
// Every set computes the same operations in the same order with the same
// roundings (no FMA, no reassociation), so each gives bitwise the same
// results; only the speed differs. The kernels run the widest supported set;
// tests run each one and compare.
#ifndef SYNCNORM_KERNELS_CPU_ISA_H_
#define SYNCNORM_KERNELS_CPU_ISA_H_

namespace syncnorm {
namespace cpu {

enum class Isa {
  kGeneric = 0,  // plain C++ loops, any target
  kSse2 = 1,     // 128-bit x86 vectors (every x86-64 CPU)
  kAvx2 = 2,     // 256-bit x86 vectors, chosen at run time
};

// Whether this build and this CPU run `isa`. Thread-safe.
bool IsaSupported(Isa isa);

// The widest set IsaSupported() accepts; asked once. Thread-safe.
Isa BestIsa();

}  // namespace cpu
}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_CPU_ISA_H_
