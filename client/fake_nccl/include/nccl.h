// The part of NCCL's API that client/nccl_comm.cc uses, as a fake for
// tests on the CUDA emulator (kernels/emulator): communicators of one rank
// whose collectives are device-to-device copies queued on the emulated
// stream. A communicator of more ranks never finishes joining, as when the
// other ranks never come. fake_nccl.h makes the next collective fail or
// hang. Test-only.
#ifndef SYNCNORM_CLIENT_FAKE_NCCL_INCLUDE_NCCL_H_
#define SYNCNORM_CLIENT_FAKE_NCCL_INCLUDE_NCCL_H_

#include <cuda_runtime.h>

#include <cstddef>

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDataType_t { ncclUint8 = 1, ncclDouble = 8 };
enum ncclRedOp_t { ncclSum = 0 };

namespace syncnorm::fake_nccl {
struct Communicator;
}  // namespace syncnorm::fake_nccl
typedef syncnorm::fake_nccl::Communicator* ncclComm_t;

struct ncclConfig_t {
  int blocking;
};
#define NCCL_CONFIG_INITIALIZER \
  { 1 }

const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                    ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                           ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream);

#endif  // SYNCNORM_CLIENT_FAKE_NCCL_INCLUDE_NCCL_H_
