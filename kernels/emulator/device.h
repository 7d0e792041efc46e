// The emulator's execution of a kernel: every thread of a block as a fiber,
// barriers and warp rendezvous checked as emulator.h says. Called by the
// runtime with its lock held; one kernel at a time.
#ifndef SYNCNORM_KERNELS_EMULATOR_DEVICE_H_
#define SYNCNORM_KERNELS_EMULATOR_DEVICE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace syncnorm::emu {

struct KernelRun {
  cudaError_t code = cudaSuccess;  // of the fault, if any
  std::string fault;               // what went wrong, where
  int64_t blocks = 0;              // blocks run
  int64_t threads = 0;             // threads run
};

// Runs every block of `launch` in order and stops at the first fault. A
// block may have shared_limit bytes of shared memory (its __shared__
// variables and the launch's dynamic bytes). describe(address) says where
// an illegal address is (for the message).
KernelRun RunKernel(const KernelLaunch& launch, size_t shared_limit,
                    std::string (*describe)(uintptr_t address));

}  // namespace syncnorm::emu

#endif  // SYNCNORM_KERNELS_EMULATOR_DEVICE_H_
