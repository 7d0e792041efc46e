// How the workers of one node agree on a layer's global statistics.
#ifndef SYNCNORM_CLIENT_NODE_GROUP_H_
#define SYNCNORM_CLIENT_NODE_GROUP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/forward_reply.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"

namespace syncnorm {

// One worker's view of its node. Every worker of the node calls the same
// sequence of Sync* calls; each call returns the global result of the job's
// group, identical on every worker. Implementations: the single worker of a
// node (SoloNodeGroup), several workers as threads of one process
// (ThreadNode), and NCCL across the GPUs of a node (with CUDA).
class NodeGroup {
 public:
  virtual ~NodeGroup() = default;

  // Merges the node's local moments and returns the global statistics.
  virtual absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                                   const Moments& local) = 0;

  // The same round with its update (the layer's momentum of this round,
  // statistics imported before it; see RoundUpdate): every worker of the
  // node passes the same update, or the round fails on every worker. This
  // default takes empty updates only (SyncForward) and refuses others with
  // FAILED_PRECONDITION; the node groups that carry them override it.
  virtual absl::StatusOr<ForwardReply> SyncForwardWithUpdate(
      int layer, int64_t step, const Moments& local, const RoundUpdate& update);

  // Sums the node's gradient sums and returns the global sums. `backward`:
  // which backward through the step's forward this is, from 0 (autograd
  // may run several through one forward with retain_graph=True); each is
  // its own round, which sums the same index of every worker. A negative
  // index fails the round (INVALID_ARGUMENT from the aggregator's client).
  virtual absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step,
                                                int backward,
                                                const GradSums& local) = 0;

  // Takes part in the forward round of (layer, step) (the backward round
  // of (layer, step, backward)) without statistics, because this worker
  // failed before it had them (`error`, not OK): the node's other workers
  // then fail the round at once with that error instead of waiting for
  // this one. Returns `error`. The default tells nobody (a node of one
  // worker has nobody to tell).
  virtual absl::Status FailForward(int layer, int64_t step,
                                   const absl::Status& error) {
    return error;
  }
  virtual absl::Status FailBackward(int layer, int64_t step, int backward,
                                    const absl::Status& error) {
    return error;
  }
};

inline absl::StatusOr<ForwardReply> NodeGroup::SyncForwardWithUpdate(
    int layer, int64_t step, const Moments& local, const RoundUpdate& update) {
  if (update.empty()) return SyncForward(layer, step, local);
  return absl::FailedPreconditionError(
      "this node group does not carry a round's momentum or imported running "
      "statistics (the layer's momentum or statistics changed after the job "
      "was created); sync through Client::NewNodeGroup or a ThreadNode, or "
      "leave them as the job has them");
}

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_NODE_GROUP_H_
