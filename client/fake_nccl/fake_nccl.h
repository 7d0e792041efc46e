// The knobs of the fake NCCL (include/nccl.h). Test-only; not thread-safe
// against calls of the fake in flight.
#ifndef SYNCNORM_CLIENT_FAKE_NCCL_FAKE_NCCL_H_
#define SYNCNORM_CLIENT_FAKE_NCCL_FAKE_NCCL_H_

#include <vector>

namespace syncnorm::fake_nccl {

// What the next collective of any communicator does: run; fail at once
// (ncclSystemError); or hang (ncclInProgress, never finishing, until the
// communicator is aborted).
enum class Next { kRun, kFail, kHang };
void SetNext(Next next);

// The CUDA device that was current when each communicator was made, in
// the order they were made.
std::vector<int> InitDevices();

// Communicators not yet destroyed or aborted.
int Live();

// Forgets the devices and sets Next::kRun.
void Reset();

}  // namespace syncnorm::fake_nccl

#endif  // SYNCNORM_CLIENT_FAKE_NCCL_FAKE_NCCL_H_
