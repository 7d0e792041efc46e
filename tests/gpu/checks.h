// The standalone device check's pieces (built by tests/gpu/device_check.sh
// with nvcc alone: no Bazel, no Abseil, no gRPC). Each Run* function prints
// one "PASS name: detail" or "FAIL name: detail" line per check and
// returns the number of failures.
#ifndef SYNCNORM_TESTS_GPU_CHECKS_H_
#define SYNCNORM_TESTS_GPU_CHECKS_H_

#include <cstdint>
#include <string>

namespace syncnorm::device_check {

// Prints the check's line; returns 1 when it failed, else 0.
int Report(bool ok, const std::string& name, const std::string& detail);

// CPU only (no CUDA call): the checker flags wrong kernel results of every
// kind and passes right ones, so a pass on the GPU means something.
int RunSelfTest();

// The CUDA kernels against float64 references on the GPU (every dtype,
// layout, option and odd shape), a batch item of more than 2^31 elements,
// the launchers' contract, determinism, and that probing for devices
// creates no CUDA context. REQUIRES: a GPU; called first in its process.
int RunKernelChecks(uint64_t seed);

// NCCL with one rank per GPU as threads of this process: content of every
// collective element by element, and the specific errors of a missing rank
// (kTimeout) and of two ranks on one GPU in one process (kInvalid).
int RunNcclThreadChecks(int gpus);

// One rank of the two-process NCCL check (both on GPU 0, told apart by
// NCCL_HOSTID): the collectives' and the node round's content, the node
// round's verdicts (mismatch, a peer's error, the leader's budget), then
// (rank 0) a dead peer: the next call fails in time (kTimeout, or kFailed
// when NCCL sees the peer gone), later calls with kAborted, and teardown
// returns. Rank 1 exits abruptly after
// the live checks when `die` is set.
int RunNcclRank(int rank, const std::string& id_file, bool die);

// Fills the [1, 2, inner] float16 tensor x on the current device (see
// huge_item.cu); a cudaError_t value.
int FillHugeItem(void* x, int64_t inner);

}  // namespace syncnorm::device_check

#endif  // SYNCNORM_TESTS_GPU_CHECKS_H_
