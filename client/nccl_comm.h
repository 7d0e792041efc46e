// A thin, checked wrapper of one NCCL communicator: the transport under
// NcclNodeGroup.
//
// Free of NCCL, CUDA and Abseil types so that the standalone device check
// (tests/gpu/device_check.sh) builds it with nvcc/g++ alone. Host arrays in,
// host arrays out: each collective stages through pinned host memory and a
// device buffer on the communicator's own stream, then waits, polling both
// the stream and NCCL's asynchronous error, until it is done, fails, or its
// deadline passes. A failure or timeout aborts the communicator (so peers
// stuck in the same collective fail too instead of hanging) and every later
// call fails with the first error. Never blocks forever.
//
// Not thread-safe: one thread drives a Comm at a time (NcclNodeGroup holds
// a lock). Every rank must issue the same collectives in the same order.
#ifndef SYNCNORM_CLIENT_NCCL_COMM_H_
#define SYNCNORM_CLIENT_NCCL_COMM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace syncnorm {
namespace nccl {

// Bytes of an ncclUniqueId.
constexpr size_t kUniqueIdBytes = 128;

// The outcome of a call. kind says how to map it to a status code.
struct CommResult {
  enum Kind {
    kOk = 0,
    kInvalid,
    kTimeout,
    kAborted,
    kFailed,
    kUnavailable,
    kPeer,  // another rank's error, passed on (nccl_round.h): see code
  };
  Kind kind = kOk;
  std::string message;
  int code = 0;  // kPeer: the failing rank's absl::StatusCode value

  bool ok() const { return kind == kOk; }
};

// A fresh unique id for a new communicator (made by one rank, handed to the
// others). kUnavailable in a build without NCCL.
CommResult NewUniqueId(std::string* id);

class Comm {
 public:
  // Joins rank `rank` of `size` on CUDA device `device` (-1: the calling
  // thread's current device) to the communicator of `id`, waiting at most
  // timeout_ms for every rank to join. kInvalid for bad arguments (and,
  // with a hint, when NCCL rejects the setup, as it does for two ranks on
  // one GPU in one process); kTimeout when not all ranks joined. Create,
  // every collective and the destructor leave the caller's current device
  // as they found it.
  static CommResult Create(const std::string& id, int size, int rank,
                           int device, int64_t timeout_ms,
                           std::unique_ptr<Comm>* out);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int size() const;
  int rank() const;

  // recv[r * count + i] = send of rank r, element i (count doubles each).
  CommResult AllGather(const double* send, double* recv, size_t count);
  // recv = sum over ranks of send (count doubles); the same on every rank.
  CommResult AllReduceSum(const double* send, double* recv, size_t count);
  // Every rank's buffer gets root's `bytes` bytes. The call may take
  // extra_ms longer than the communicator's timeout (the root may be
  // busy first, as the node leader is with the aggregator).
  CommResult Broadcast(void* buffer, size_t bytes, int root,
                       int64_t extra_ms = 0);

  // The CUDA device the communicator uses.
  int device() const;

  // Whether an earlier failure aborted the communicator.
  bool aborted() const;

  struct State;

 private:
  explicit Comm(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace nccl
}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_NCCL_COMM_H_
