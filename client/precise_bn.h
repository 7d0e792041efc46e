// Precise BN (Wu & Johnson, "Rethinking 'Batch' in BatchNorm", 2021): a
// trained job's running statistics replaced by the exact population
// statistics of each layer's input over every sample of every rank of its
// group, merged by the aggregator and committed as one new version per
// layer.
#ifndef SYNCNORM_CLIENT_PRECISE_BN_H_
#define SYNCNORM_CLIENT_PRECISE_BN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "client/node_group.h"
#include "kernels/moments.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// One precise BN of a job, as one rank. Every rank of the job (every
// member of an elastic job) starts one with the same `serial`, merges the
// same layers in the same order, then calls Commit; a rank whose precise
// BN failed calls Abort.
//
// The job is not touched until Commit. The merges are rounds of a scratch
// job of the rank's group (ScratchJobId): the job's rank space, the
// group's members as its only members, the job's round timeout, one layer
// without running statistics per layer of the job and one more for
// Commit's barrier. Merging layer l is step 0 of the scratch job's layer
// l, so a rank that is missing fails it on every other rank with
// DEADLINE_EXCEEDED naming it, after the job's round timeout.
//
// Used by one thread.
class PreciseBn {
 public:
  // Starts precise BN number `serial` (any number every rank passes
  // alike, e.g. how many the trainer has started before) of `job_id` as
  // `rank`: reads the job and its running statistics of the rank's group,
  // and creates the scratch job (idempotent: the group's ranks create the
  // same one). FAILED_PRECONDITION when the scratch job exists from an
  // earlier precise BN of that serial that did not end (its rounds ran:
  // delete it); the calls' statuses otherwise (NOT_FOUND for an unknown
  // job, INVALID_ARGUMENT for a rank outside it).
  static absl::StatusOr<std::unique_ptr<PreciseBn>> Start(
      Client& client, const std::string& job_id, int rank, int64_t serial);

  // The scratch job of precise BN `serial` of `job_id` for group `group`:
  // "<job_id>.precise-bn.<serial>.g<group>", with the job id shortened and a
  // hash of it added when that would pass the 128 characters a job id may
  // have. The same on every rank and machine.
  static std::string ScratchJobId(const std::string& job_id, int64_t serial,
                                  int group);

  PreciseBn(const PreciseBn&) = delete;
  PreciseBn& operator=(const PreciseBn&) = delete;

  // Merges `pooled_local` (this rank's moments of the layer's input over
  // all its batches, count 0 when it has none) with every member of the
  // group and returns the layer's population statistics: the mean, the
  // unbiased variance M2 / (N - 1), and num_batches_tracked the job's + 1;
  // Commit writes them. A layer that no member saw (N = 0) keeps the job's
  // statistics: they are returned as they are and Commit leaves the layer
  // alone. Errors, each naming the layer and saying that the job is
  // unchanged: INVALID_ARGUMENT for a layer out of range or moments that
  // do not fit it; FAILED_PRECONDITION for a layer merged already or N = 1;
  // the round's status otherwise (DEADLINE_EXCEEDED naming the missing
  // ranks; ABORTED when another rank's precise BN failed and deleted the
  // scratch job).
  absl::StatusOr<RunningStats> Merge(int layer, const Moments& pooled_local);

  // The population count N of a merged layer; 0 before its Merge.
  int64_t population_count(int layer) const;

  // Writes the statistics of the layers merged with N >= 2 to the job and
  // ends the precise BN. The group's committer (its lowest member) replaces
  // them in one SetRunningStats, one new version per layer; then every member
  // takes part in one more scratch round, the barrier, which returns on
  // every rank after the job holds them (or tells them that the committer
  // failed); then the scratch job is deleted. OK on every rank when the job
  // holds the statistics. Otherwise: the committer's SetRunningStats status
  // (ABORTED on the other ranks, naming the committer), or the barrier's
  // (a member missing: the message says whether the job holds the new
  // statistics, as far as this rank knows). Every rank deletes the scratch
  // job after a failure. REQUIRES: not called before.
  absl::Status Commit();

  // Ends a failed precise BN: deletes the scratch job (OK when it is gone
  // already). Rounds that other ranks still wait in fail with ABORTED.
  absl::Status Abort();

  const std::string& job_id() const { return job_id_; }
  const std::string& scratch_job_id() const { return scratch_id_; }
  // The rank's group in the job (the `group` of its running statistics).
  int group() const { return group_; }
  // The rank that writes the group's statistics in Commit.
  int committer() const { return committer_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // The channels of `layer`. REQUIRES: 0 <= layer < num_layers().
  int channels(int layer) const { return layers_[layer].channels; }

 private:
  // What the precise BN knows of one layer of the job.
  struct Layer {
    std::string name;
    int channels = 0;
    // The job's statistics of the group when it started.
    v1::LayerStats start;
    // Set by Merge.
    std::optional<RunningStats> merged;
    int64_t count = 0;
  };

  PreciseBn(Client& client, std::string job_id, int rank, int group,
            int committer, std::string scratch_id, std::vector<Layer> layers,
            std::unique_ptr<NodeGroup> scratch);

  // The layers' names, channels and statistics from the job and its
  // statistics of the group at Start.
  static std::vector<Layer> StartLayers(const v1::JobInfo& job,
                                        const v1::RunningStats& stats);
  // `s` (not OK) with its code and payloads, and its message between
  // "precise BN of job 'J' ...: " and `outcome`.
  absl::Status Failed(const std::string& where, const absl::Status& s,
                      const std::string& outcome) const;
  // The committer's SetRunningStats of the merged layers.
  absl::Status WriteStats();
  // The barrier round: `failed` tells the other ranks that the committer
  // failed. Returns whether it did (on every rank) or the round's status.
  absl::StatusOr<bool> Barrier(bool failed);

  Client& client_;
  const std::string job_id_;
  const int rank_;
  const int group_;
  const int committer_;
  const std::string scratch_id_;
  std::vector<Layer> layers_;
  const std::unique_ptr<NodeGroup> scratch_;
  bool committed_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_PRECISE_BN_H_
