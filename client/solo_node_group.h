// The node group of a node with one worker.
#ifndef SYNCNORM_CLIENT_SOLO_NODE_GROUP_H_
#define SYNCNORM_CLIENT_SOLO_NODE_GROUP_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "client/contributor.h"
#include "client/forward_reply.h"
#include "client/node_group.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"

namespace syncnorm {

// A node of one worker: its contributions go straight to the aggregator.
class SoloNodeGroup : public NodeGroup {
 public:
  explicit SoloNodeGroup(std::unique_ptr<Contributor> contributor)
      : contributor_(std::move(contributor)) {}

  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override {
    return contributor_->ReduceForward(layer, step, local);
  }
  absl::StatusOr<ForwardReply> SyncForwardWithUpdate(
      int layer, int64_t step, const Moments& local,
      const RoundUpdate& update) override {
    return contributor_->ReduceForward(layer, step, local, update);
  }
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& local) override {
    return contributor_->ReduceBackward(layer, step, backward, local);
  }

 private:
  const std::unique_ptr<Contributor> contributor_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_SOLO_NODE_GROUP_H_
