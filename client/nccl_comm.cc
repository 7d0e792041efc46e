#include "client/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>

namespace syncnorm {
namespace nccl {

using Clock = std::chrono::steady_clock;

namespace {

// Makes a device current for its scope and gives the caller's back after.
class DeviceScope {
 public:
  DeviceScope() {
    if (cudaGetDevice(&caller_) != cudaSuccess) {
      cudaGetLastError();
      caller_ = -1;
    }
  }
  ~DeviceScope() {
    if (caller_ >= 0) cudaSetDevice(caller_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  int caller() const { return caller_; }

 private:
  int caller_ = -1;
};

}  // namespace

struct Comm::State {
  int size = 0;
  int rank = 0;
  int device = 0;
  int64_t timeout_ms = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* device_buffer = nullptr;
  void* host_buffer = nullptr;  // pinned
  size_t capacity = 0;          // bytes of each buffer
  bool aborted = false;
  std::string first_error;

  ~State() {
    DeviceScope scope;
    cudaSetDevice(device);
    if (comm != nullptr) {
      if (aborted) {
        ncclCommAbort(comm);
      } else {
        Finalize();
      }
    }
    if (device_buffer != nullptr) cudaFree(device_buffer);
    if (host_buffer != nullptr) cudaFreeHost(host_buffer);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // A clean teardown, bounded by the timeout (abort if a peer is gone).
  // REQUIRES: the communicator's device is current.
  void Finalize() {
    ncclResult_t r = ncclCommFinalize(comm);
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
  }

  std::string Describe(const char* what, ncclResult_t r) const {
    std::string s = std::string("NCCL ") + what + " on local rank " +
                    std::to_string(rank) + " of " + std::to_string(size) +
                    " (CUDA device " + std::to_string(device) +
                    "): " + ncclGetErrorString(r);
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    if (last != nullptr && last[0] != '\0') s += std::string(": ") + last;
    return s;
  }

  // Aborts the communicator and remembers why.
  CommResult Abort(CommResult::Kind kind, std::string message) {
    if (!aborted) {
      aborted = true;
      first_error = message;
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
    return CommResult{kind, std::move(message)};
  }

  // Waits until NCCL's async state leaves ncclInProgress and (stream_too)
  // the stream has drained, or an error, or the deadline (timeout_ms +
  // extra_ms after the call began).
  CommResult Wait(const char* what, Clock::time_point deadline,
                  int64_t extra_ms, bool stream_too = true) {
    for (int spin = 0;; ++spin) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
      if (q != ncclSuccess)
        return Abort(CommResult::kFailed, Describe(what, q));
      if (async != ncclSuccess && async != ncclInProgress) {
        return Abort(CommResult::kFailed, Describe(what, async));
      }
      if (async == ncclSuccess && !stream_too) return CommResult{};
      if (async == ncclSuccess) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return CommResult{};
        if (e != cudaErrorNotReady) {
          return Abort(CommResult::kFailed,
                       std::string(what) + ": CUDA error on the NCCL stream: " +
                           cudaGetErrorString(e));
        }
      }
      if (Clock::now() >= deadline) {
        return Abort(
            CommResult::kTimeout,
            std::string("NCCL ") + what + " on local rank " +
                std::to_string(rank) + " of " + std::to_string(size) +
                " did not complete within " +
                std::to_string(timeout_ms + extra_ms) +
                " ms: a local rank died, stalled, or called a different "
                "collective; the communicator is aborted");
      }
      if (spin > 100)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  CommResult Reserve(size_t bytes) {
    if (bytes <= capacity) return CommResult{};
    if (device_buffer != nullptr) cudaFree(device_buffer);
    if (host_buffer != nullptr) cudaFreeHost(host_buffer);
    device_buffer = host_buffer = nullptr;
    capacity = 0;
    cudaError_t e = cudaMalloc(&device_buffer, bytes);
    if (e == cudaSuccess) e = cudaMallocHost(&host_buffer, bytes);
    if (e != cudaSuccess) {
      return CommResult{CommResult::kFailed,
                        std::string("allocating NCCL staging buffers: ") +
                            cudaGetErrorString(e)};
    }
    capacity = bytes;
    return CommResult{};
  }

  // Copies `in_bytes` from `in` to the device buffer, runs `collective`
  // (device buffer in, device buffer + out_offset out), and copies
  // `out_bytes` back to `out`, within timeout_ms + extra_ms.
  CommResult Run(const char* what, const void* in, size_t in_bytes,
                 size_t out_offset, void* out, size_t out_bytes,
                 int64_t extra_ms,
                 const std::function<ncclResult_t(char*)>& collective) {
    if (aborted) {
      return CommResult{CommResult::kAborted,
                        std::string("NCCL ") + what +
                            ": the communicator was aborted after an earlier "
                            "failure: " +
                            first_error};
    }
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(timeout_ms + extra_ms);
    DeviceScope scope;
    cudaError_t e = cudaSetDevice(device);
    CommResult r =
        e == cudaSuccess
            ? Reserve(std::max(in_bytes, out_offset + out_bytes))
            : CommResult{CommResult::kFailed, std::string("cudaSetDevice: ") +
                                                  cudaGetErrorString(e)};
    if (!r.ok()) return Abort(r.kind, r.message);
    char* dev = static_cast<char*>(device_buffer);
    std::memcpy(host_buffer, in, in_bytes);
    e = cudaMemcpyAsync(dev, host_buffer, in_bytes, cudaMemcpyHostToDevice,
                        stream);
    if (e != cudaSuccess) {
      return Abort(CommResult::kFailed,
                   std::string(what) + ": " + cudaGetErrorString(e));
    }
    const ncclResult_t n = collective(dev);
    if (n != ncclSuccess && n != ncclInProgress) {
      return Abort(CommResult::kFailed, Describe(what, n));
    }
    // Non-blocking: ncclInProgress means the collective is not on the stream
    // yet; the copy back must wait until it is.
    if (n == ncclInProgress) {
      r = Wait(what, deadline, extra_ms, /*stream_too=*/false);
      if (!r.ok()) return r;
    }
    e = cudaMemcpyAsync(host_buffer, dev + out_offset, out_bytes,
                        cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) {
      return Abort(CommResult::kFailed,
                   std::string(what) + ": " + cudaGetErrorString(e));
    }
    r = Wait(what, deadline, extra_ms);
    if (!r.ok()) return r;
    std::memcpy(out, host_buffer, out_bytes);
    return CommResult{};
  }
};

CommResult NewUniqueId(std::string* id) {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess) {
    return CommResult{CommResult::kFailed,
                      std::string("ncclGetUniqueId: ") + ncclGetErrorString(r)};
  }
  static_assert(sizeof(uid.internal) == kUniqueIdBytes, "ncclUniqueId size");
  id->assign(uid.internal, kUniqueIdBytes);
  return CommResult{};
}

Comm::Comm(std::unique_ptr<State> state) : state_(std::move(state)) {}
Comm::~Comm() = default;

int Comm::size() const { return state_->size; }
int Comm::device() const { return state_->device; }
int Comm::rank() const { return state_->rank; }
bool Comm::aborted() const { return state_->aborted; }

CommResult Comm::Create(const std::string& id, int size, int rank, int device,
                        int64_t timeout_ms, std::unique_ptr<Comm>* out) {
  if (id.size() != kUniqueIdBytes || size < 1 || rank < 0 || rank >= size ||
      device < -1 || timeout_ms <= 0) {
    return CommResult{
        CommResult::kInvalid,
        "NCCL communicator: need a " + std::to_string(kUniqueIdBytes) +
            "-byte unique id, 0 <= rank < size, a device >= 0 (or -1: the "
            "current one) and a positive timeout; got id of " +
            std::to_string(id.size()) + " bytes, rank " + std::to_string(rank) +
            ", size " + std::to_string(size) + ", device " +
            std::to_string(device)};
  }
  DeviceScope scope;
  if (device < 0) device = scope.caller();
  auto state = std::make_unique<State>();
  state->size = size;
  state->rank = rank;
  state->device = device;
  state->timeout_ms = timeout_ms;
  cudaError_t e = device < 0 ? cudaErrorNoDevice : cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CommResult{CommResult::kUnavailable,
                      "NCCL communicator: CUDA device " +
                          std::to_string(device) +
                          " is not usable: " + cudaGetErrorString(e)};
  }
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing peer cannot hang us
  ncclResult_t r =
      ncclCommInitRankConfig(&state->comm, size, uid, rank, &config);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (r == ncclInProgress && state->comm != nullptr) {
    if (Clock::now() >= deadline) {
      return state->Abort(
          CommResult::kTimeout,
          "NCCL communicator init on local rank " + std::to_string(rank) +
              " did not complete within " + std::to_string(timeout_ms) +
              " ms: not every one of the " + std::to_string(size) +
              " local ranks joined with the same unique id");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ncclCommGetAsyncError(state->comm, &r);
  }
  if (r != ncclSuccess) {
    std::string message = state->Describe("communicator init", r);
    if (r == ncclInvalidUsage) {
      message +=
          ". NCCL needs exactly one rank per GPU: if two local ranks use the "
          "same CUDA device (NCCL reports \"Duplicate GPU detected\"), give "
          "each local rank its own device";
    }
    return state->Abort(CommResult::kInvalid, message);
  }
  out->reset(new Comm(std::move(state)));
  return CommResult{};
}

CommResult Comm::AllGather(const double* send, double* recv, size_t count) {
  State& s = *state_;
  const size_t bytes = count * sizeof(double);
  return s.Run("all-gather", send, bytes, bytes, recv, bytes * s.size, 0,
               [&](char* dev) {
                 return ncclAllGather(dev, dev + bytes, count, ncclDouble,
                                      s.comm, s.stream);
               });
}

CommResult Comm::AllReduceSum(const double* send, double* recv, size_t count) {
  State& s = *state_;
  const size_t bytes = count * sizeof(double);
  return s.Run("all-reduce", send, bytes, 0, recv, bytes, 0, [&](char* dev) {
    return ncclAllReduce(dev, dev, count, ncclDouble, ncclSum, s.comm,
                         s.stream);
  });
}

CommResult Comm::Broadcast(void* buffer, size_t bytes, int root,
                           int64_t extra_ms) {
  State& s = *state_;
  if (root < 0 || root >= s.size) {
    return CommResult{
        CommResult::kInvalid,
        "NCCL broadcast: root " + std::to_string(root) + " is not a rank"};
  }
  return s.Run("broadcast", buffer, bytes, 0, buffer, bytes,
               std::max<int64_t>(0, extra_ms), [&](char* dev) {
                 return ncclBroadcast(dev, dev, bytes, ncclUint8, root, s.comm,
                                      s.stream);
               });
}

}  // namespace nccl
}  // namespace syncnorm
