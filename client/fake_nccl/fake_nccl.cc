#include "client/fake_nccl/fake_nccl.h"

#include <nccl.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace syncnorm::fake_nccl {

struct Communicator {
  int size = 1;
  int device = 0;
  bool hung = false;
  const char* last_error = "";
};

namespace {

struct State {
  std::mutex mu;
  Next next = Next::kRun;
  std::vector<int> init_devices;
  int live = 0;
};

State& S() {
  static State* s = new State;
  return *s;
}

// What the next collective does (and back to kRun).
Next TakeNext() {
  std::lock_guard<std::mutex> lock(S().mu);
  const Next n = S().next;
  S().next = Next::kRun;
  return n;
}

// One collective: checks the device and queues the copy (one rank: every
// collective's result is its own input).
ncclResult_t Collective(const void* send, void* recv, size_t bytes,
                        ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return ncclInvalidArgument;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != comm->device) {
    comm->last_error = "the current device is not the communicator's";
    return ncclInvalidUsage;
  }
  switch (TakeNext()) {
    case Next::kFail:
      comm->last_error = "a failure the test asked for";
      return ncclSystemError;
    case Next::kHang:
      comm->hung = true;
      return ncclInProgress;
    case Next::kRun:
      break;
  }
  if (send == recv || bytes == 0) return ncclSuccess;
  return cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream) ==
                 cudaSuccess
             ? ncclSuccess
             : ncclUnhandledCudaError;
}

}  // namespace

void SetNext(Next next) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().next = next;
}

std::vector<int> InitDevices() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().init_devices;
}

int Live() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().live;
}

void Reset() {
  std::lock_guard<std::mutex> lock(S().mu);
  S().next = Next::kRun;
  S().init_devices.clear();
}

}  // namespace syncnorm::fake_nccl

using syncnorm::fake_nccl::Collective;
using syncnorm::fake_nccl::Communicator;
using syncnorm::fake_nccl::S;

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclSystemError:
      return "unhandled system error";
    default:
      return "an NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm != nullptr ? comm->last_error : "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int next = 0;
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &++next, sizeof(next));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId,
                                    int rank, ncclConfig_t* config) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* c = new Communicator;
  c->size = nranks;
  if (cudaGetDevice(&c->device) != cudaSuccess) {
    delete c;
    return ncclUnhandledCudaError;
  }
  // More ranks never finish joining: nobody else comes.
  c->hung = nranks > 1;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    S().init_devices.push_back(c->device);
    ++S().live;
  }
  *comm = c;
  return c->hung || (config != nullptr && config->blocking == 0)
             ? ncclInProgress
             : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  if (comm == nullptr) return ncclInvalidArgument;
  *result = comm->hung ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(S().mu);
    --S().live;
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return Collective(send, recv, count * static_cast<size_t>(type), comm,
                    stream);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                           ncclDataType_t type, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
  return Collective(send, recv, count * static_cast<size_t>(type), comm,
                    stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                           ncclDataType_t type, int, ncclComm_t comm,
                           cudaStream_t stream) {
  return Collective(send, recv, count * static_cast<size_t>(type), comm,
                    stream);
}
