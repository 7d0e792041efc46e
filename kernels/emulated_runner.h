// The CUDA kernels' raw launchers on the CPU emulator (kernels/emulator):
// the same runner as on a GPU (cuda_runner.h), and the emulated build's
// launch bound. Test-only; used by //kernels:cuda_emulated_test and the
// planted-bug binaries it runs.
#ifndef SYNCNORM_KERNELS_EMULATED_RUNNER_H_
#define SYNCNORM_KERNELS_EMULATED_RUNNER_H_

#include <cstdint>

#include "kernels/cuda_runner.h"
#include "kernels/emulator/emulator.h"

namespace syncnorm::check {

// The runner on the emulator is the one a GPU gets.
using EmulatedRunner = CudaRunner;

// The element bound of one elementwise launch in the emulated build
// (SYNCNORM_CUDA_SLICE_ELEMENTS), lowered so that the batch items of
// check::OddLayouts take the paths of items over 2^31 elements.
constexpr int64_t kEmulatedSliceElements = 32768;

}  // namespace syncnorm::check

#endif  // SYNCNORM_KERNELS_EMULATED_RUNNER_H_
