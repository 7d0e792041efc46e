// The NCCL node group: the GPUs of one node (one rank per GPU, in one or
// several processes) merge their moments over NCCL before the node leader's
// one contribution goes to the aggregator.
#ifndef SYNCNORM_CLIENT_NCCL_NODE_GROUP_H_
#define SYNCNORM_CLIENT_NCCL_NODE_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/nccl_round.h"
#include "client/node_group.h"

namespace syncnorm {

namespace nccl {
class Comm;
}  // namespace nccl

// Hands the NCCL unique id from local rank 0 to the other local ranks.
// Implementations: a shared file (FileUniqueIdExchange); one through the
// aggregator can be added behind the same interface.
class UniqueIdExchange {
 public:
  virtual ~UniqueIdExchange() = default;
  // Local rank 0: makes `id` available to the others.
  virtual absl::Status Publish(const std::string& id) = 0;
  // Other local ranks: the published id, waiting at most `timeout`;
  // DEADLINE_EXCEEDED when it did not appear.
  virtual absl::StatusOr<std::string> Fetch(absl::Duration timeout) = 0;
};

// The id in a file every local rank can read (one node: local disk or
// /dev/shm). Publish writes `session` and the id to a temporary file and
// renames it into place (atomic); Fetch polls until a file with the same
// session appears, so a stale file from an earlier run is never used. Give
// every launch its own session (say, the job id plus a launch timestamp).
class FileUniqueIdExchange : public UniqueIdExchange {
 public:
  FileUniqueIdExchange(std::string path, std::string session);
  absl::Status Publish(const std::string& id) override;
  absl::StatusOr<std::string> Fetch(absl::Duration timeout) override;

 private:
  const std::string path_;
  const std::string session_;
};

struct NcclNodeGroupOptions {
  // This worker's rank within the node, 0 <= local_rank < local_size.
  // Local rank 0 is the node leader that talks to the aggregator.
  int local_rank = 0;
  // Workers (GPUs) of the node. Default 1.
  int local_size = 1;
  // The job's world size (CreateJobRequest.world_size: contributor ranks,
  // one per node). It sizes the mask of missing ranks that the leader
  // broadcasts with each forward result (ForwardReply::missing_ranks) and
  // bounds a stale answer's view (ForwardReply::view) to as many entries.
  // Every local rank must pass the same value (a mismatch fails every
  // round with INVALID_ARGUMENT). Required: >= 1.
  int world_size = 0;
  // The CUDA device of this rank; -1 (default): the device current on the
  // calling thread at Create (with one visible GPU per process, that one).
  // NCCL needs one rank per GPU within a process. Create and the rounds
  // leave the caller's current device as they found it.
  int cuda_device = -1;
  // Bound on communicator creation and on every collective. Past it the
  // communicator is aborted and calls fail with DEADLINE_EXCEEDED; nothing
  // hangs. Default 120 s.
  absl::Duration timeout = absl::Seconds(120);
  // The longest the leader's round with the aggregator may take: its
  // client's ClientOptions::round_timeout (default 60 s). Read on local
  // rank 0 only, which sends it to the others with each round, so that
  // they wait for its answer timeout + upstream_timeout. >= 0.
  absl::Duration upstream_timeout = absl::Seconds(60);
};

// One local rank's view of an NCCL node. Every round is the protocol of
// nccl_round.h: the local ranks all-gather a fixed-size header (layer,
// step, backward index, count, channel count, world_size, and a rank's
// error if it failed locally), so that every rank fails the round alike,
// at once, when one failed (FailForward/FailBackward: with that rank's
// error) or when they disagree (INVALID_ARGUMENT); then their statistics, which
// every rank folds in local-rank order (moments by Chan's rule, gradient sums
// by addition, as ThreadNode does: identical bits on every rank); the leader
// sends the result upstream and broadcasts the answer (or its error),
// missing ranks and a stale-synchronous answer's view included: every
// local rank gets the same ForwardReply (moments bits, version, missing
// ranks, view), so their layers treat a stale answer alike.
// Every local rank must make the same calls in the same order. After any
// NCCL failure or timeout the communicator is aborted and every later call
// fails with FAILED_PRECONDITION.
//
// Thread-safe (calls are serialized).
class NcclNodeGroup : public NodeGroup {
 public:
  // Creates the communicator: local rank 0 makes the id and publishes it,
  // the others fetch it. `upstream` is the leader's way to the aggregator
  // (required on local rank 0, ignored elsewhere).
  static absl::StatusOr<std::unique_ptr<NcclNodeGroup>> Create(
      const NcclNodeGroupOptions& options, UniqueIdExchange& exchange,
      std::unique_ptr<NodeGroup> upstream);
  ~NcclNodeGroup() override;

  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override;
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& local) override;
  absl::Status FailForward(int layer, int64_t step,
                           const absl::Status& error) override;
  absl::Status FailBackward(int layer, int64_t step, int backward,
                            const absl::Status& error) override;

 private:
  NcclNodeGroup(const NcclNodeGroupOptions& options,
                std::unique_ptr<NodeGroup> upstream,
                std::unique_ptr<nccl::Comm> comm);

  bool leader() const { return options_.local_rank == 0; }
  // This rank's header of a round (`backward`: a backward round's index).
  nccl::RoundEntry Entry(nccl::Phase phase, int layer, int64_t step,
                         int backward, int channels) const;
  // Leader: sends the node's merged moments upstream and fills *out (sized
  // for the round) with the answer: counts, moments, missing ranks and a
  // stale answer's view. On failure returns the error for every local rank
  // and leaves out->view empty.
  absl::Status LeaderForward(int layer, int64_t step, const Moments& merged,
                             nccl::Outcome* out);
  // The leader's outcome broadcast (round_.Share), as this rank's status.
  absl::Status Share(const absl::Status& leader_status, nccl::Outcome* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const NcclNodeGroupOptions options_;
  const std::unique_ptr<NodeGroup> upstream_;

  absl::Mutex mu_;
  const std::unique_ptr<nccl::Comm> comm_ ABSL_PT_GUARDED_BY(mu_);
  nccl::NodeRound round_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_NCCL_NODE_GROUP_H_
