// One job of the aggregator: its resolved spec and one LayerShard per layer.
#ifndef SYNCNORM_SERVER_JOB_H_
#define SYNCNORM_SERVER_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "server/contribution.h"
#include "server/job_spec.h"
#include "server/layer_shard.h"

namespace syncnorm {

// A job as reported to callers.
struct JobSnapshot {
  JobSpec spec;  // resolved
  // Highest step applied by every layer of every group; -1 before any.
  int64_t committed_step = -1;
};

// The running statistics of one layer of one group.
struct LayerStatsSnapshot {
  int layer = 0;
  std::string name;
  int group = 0;
  RunningStats stats;
};

// The running statistics of some layers of one group of a job.
struct RunningStatsSnapshot {
  std::string job_id;
  int64_t committed_step = -1;
  std::vector<LayerStatsSnapshot> layers;
};

// Thread-safe; each layer locks on its own (see LayerShard).
class Job {
 public:
  // REQUIRES: `spec` resolved (ResolveJobSpec), recent_capacity > 0.
  Job(JobSpec spec, int recent_capacity);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobSpec& spec() const { return spec_; }

  // OK when `c` fits this job; else INVALID_ARGUMENT saying what to fix
  // (layer, step, rank, phase, payload kind, shape, values).
  absl::Status Validate(const Contribution& c) const;

  // See LayerShard::Contribute. REQUIRES: Validate(c).ok().
  void Contribute(Contribution c, RoundCallback done, absl::Time now);

  // Fails the overdue rounds of every layer (LayerShard::Expire).
  void Expire(absl::Time now);

  // Fails every waiting round and later contribution with `status`.
  void Abort(const absl::Status& status);

  // Minimum over groups and layers of the last applied step; -1 if any
  // (group, layer) has applied none.
  int64_t CommittedStep() const;

  JobSnapshot Snapshot() const;

  // The running statistics of `layers` (empty: all) of `group`;
  // INVALID_ARGUMENT for a layer or group out of range.
  absl::StatusOr<RunningStatsSnapshot> Stats(absl::Span<const int> layers,
                                             int group) const;

 private:
  absl::Status ValidatePayload(const Contribution& c) const;

  // Constant after construction; shards_[i] serves spec_.layers[i].
  const JobSpec spec_;
  std::vector<std::unique_ptr<LayerShard>> shards_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_JOB_H_
