// A node's way to a job spread over several aggregator shards.
#ifndef SYNCNORM_CLIENT_SHARDED_NODE_GROUP_H_
#define SYNCNORM_CLIENT_SHARDED_NODE_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/client_options.h"
#include "client/contributor.h"
#include "client/node_group.h"
#include "grpcpp/channel.h"

namespace syncnorm {

// One contributor rank of a sharded job: each layer's rounds go to the shard
// that holds the layer (ShardOf over the channels, in ordinal order), each
// shard over a Contributor (a Reduce stream) of its own, opened on first
// use. A shard that is down fails only the rounds of its layers, the way a
// single aggregator's Contributor does (resends until the round timeout).
//
// Thread-safe.
class ShardedNodeGroup : public NodeGroup {
 public:
  // `channels[i]` reaches shard i. REQUIRES: channels not empty.
  ShardedNodeGroup(std::vector<std::shared_ptr<grpc::Channel>> channels,
                   std::string job_id, int rank, const ClientOptions& options);

  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override;
  absl::StatusOr<ForwardReply> SyncForwardWithUpdate(
      int layer, int64_t step, const Moments& local,
      const RoundUpdate& update) override;
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& local) override;

 private:
  // The contributor of the shard that holds `layer`.
  Contributor& For(int layer) ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::vector<std::shared_ptr<grpc::Channel>> channels_;
  const std::string job_id_;
  const int rank_;
  const ClientOptions options_;

  absl::Mutex mu_;
  // One per shard, null until first used; never replaced once made.
  std::vector<std::unique_ptr<Contributor>> contributors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_SHARDED_NODE_GROUP_H_
