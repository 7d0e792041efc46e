#include "client/sharded_node_group.h"

#include <utility>

#include "client/shard_router.h"

namespace syncnorm {

ShardedNodeGroup::ShardedNodeGroup(
    std::vector<std::shared_ptr<grpc::Channel>> channels, std::string job_id,
    int rank, const ClientOptions& options)
    : channels_(std::move(channels)),
      job_id_(std::move(job_id)),
      rank_(rank),
      options_(options),
      contributors_(channels_.size()) {}

Contributor& ShardedNodeGroup::For(int layer) {
  const int shard = ShardOf(job_id_, layer, static_cast<int>(channels_.size()));
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Contributor>& c = contributors_[shard];
  if (c == nullptr) {
    c = std::make_unique<Contributor>(channels_[shard], job_id_, rank_,
                                      options_);
  }
  return *c;
}

absl::StatusOr<ForwardReply> ShardedNodeGroup::SyncForward(
    int layer, int64_t step, const Moments& local) {
  return For(layer).ReduceForward(layer, step, local);
}

absl::StatusOr<ForwardReply> ShardedNodeGroup::SyncForwardWithUpdate(
    int layer, int64_t step, const Moments& local, const RoundUpdate& update) {
  return For(layer).ReduceForward(layer, step, local, update);
}

absl::StatusOr<GradSums> ShardedNodeGroup::SyncBackward(int layer, int64_t step,
                                                        int backward,
                                                        const GradSums& local) {
  return For(layer).ReduceBackward(layer, step, backward, local);
}

}  // namespace syncnorm
