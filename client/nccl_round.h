// The collective steps of one NCCL node round (the protocol NcclNodeGroup
// speaks over nccl_comm.h), free of Abseil so that the standalone device
// check (tests/gpu/device_check.sh) runs it between real NCCL ranks.
//
// Every local rank of the node takes part in every step, in this order:
//  1. Gather: each rank all-gathers a fixed-size header (phase, layer,
//     step, backward index, count, channels, the job's world_size, the
//     leader's upstream budget, and the rank's own error if it failed
//     locally). From the same headers every rank reaches the same verdict:
//     the error of the lowest rank that failed (kPeer, with its code), or
//     kInvalid when the ranks are not in the same round or disagree on the
//     channel count or world_size; then they all stop. Only when the headers
//     agree do the ranks all-gather their payloads (2 x channels doubles each),
//     whose size is now the same everywhere.
//  2. Share (after a good Gather): the leader (local rank 0) broadcasts its
//     outcome, a fixed-size header with its error, counts and view size,
//     the payload and (forward) a mask of world_size bits; the other ranks
//     wait for it as long as the communicator's timeout plus the leader's
//     upstream budget, the time its round with the aggregator may take.
//     Only a stale-synchronous answer (a view, at most world_size entries)
//     adds a second broadcast of the view, whose size the first carried; a
//     synchronous round has one broadcast, as it always had.
// No collective of a size that depends on the header is issued before the
// headers agree, so a mismatch is an error on every rank, never a hang.
//
// Not thread-safe: one thread drives a NodeRound at a time.
#ifndef SYNCNORM_CLIENT_NCCL_ROUND_H_
#define SYNCNORM_CLIENT_NCCL_ROUND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/nccl_comm.h"

namespace syncnorm {
namespace nccl {

enum class Phase : int64_t { kForward = 1, kBackward = 2 };

// What one local rank brings to a round.
struct RoundEntry {
  Phase phase = Phase::kForward;
  int64_t layer = 0;
  int64_t step = 0;
  // Backward: which backward through the step's forward, from 0; the ranks
  // of a round must agree on it as on the step. 0 for a forward.
  int64_t backward_index = 0;
  int64_t count = 0;  // forward: this rank's values per channel
  int64_t channels = 0;
  int64_t world_size = 0;
  // Leader: how long its round with the aggregator may take, in ms.
  int64_t upstream_ms = 0;
  // Non-zero: this rank failed locally with this status code (an
  // absl::StatusCode value) and `error`; its payload is not sent.
  int error_code = 0;
  std::string error;
};

// Every rank's part of a round, in local-rank order.
struct Gathered {
  std::vector<int64_t> counts;  // forward counts
  std::vector<double> values;   // rank r: [r * 2C, (r + 1) * 2C)
};

// One contribution a stale-synchronous answer merged (RoundResult.view).
struct ViewEntry {
  int64_t rank = 0;
  int64_t step = 0;
  friend bool operator==(const ViewEntry& a, const ViewEntry& b) {
    return a.rank == b.rank && a.step == b.step;
  }
};

// The leader's answer to the other local ranks.
struct Outcome {
  int code = 0;  // an absl::StatusCode value; 0: success
  std::string message;
  int64_t count = 0;            // forward: the global count
  int64_t version = 0;          // forward: the layer's version
  std::vector<double> payload;  // 2 x channels
  std::vector<uint8_t> mask;    // forward: (world_size + 7) / 8 bytes
  // Forward in a stale-synchronous job: the answer's view, at most
  // world_size entries. Empty: a synchronous answer (or an error).
  std::vector<ViewEntry> view;
};

class NodeRound {
 public:
  // `comm` outlives the NodeRound.
  explicit NodeRound(Comm* comm) : comm_(comm) {}

  // Step 1. `values` (2 x channels doubles) is read only when the entry
  // carries no error. On success *out gets every rank's counts and values.
  // kPeer: a rank failed locally (the lowest; code and message are its,
  // and a failed rank gets its own error back); kInvalid: the ranks'
  // headers disagree; else the communicator's failure.
  CommResult Gather(const RoundEntry& entry, const double* values,
                    Gathered* out);

  // Step 2, after a successful Gather. Leader: broadcasts *outcome (its
  // payload and mask must have the sizes of the round, its view at most
  // world_size entries; else kInvalid and nothing is sent). Others:
  // *outcome gets the leader's, with payload and mask sized for the round
  // and the leader's view; kFailed when the leader's header names more
  // view entries than world_size (a leader of another protocol).
  CommResult Share(bool leader, Outcome* outcome);

 private:
  // The second broadcast of Share, when *view (the leader's; sized from
  // the first broadcast on the others) is not empty.
  CommResult ShareView(std::vector<ViewEntry>* view);

  Comm* const comm_;
  // From the headers of the last good Gather.
  int64_t channels_ = 0;
  int64_t world_size_ = 0;
  int64_t upstream_ms_ = 0;
};

}  // namespace nccl
}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_NCCL_ROUND_H_
