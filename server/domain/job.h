// One job of the aggregator: its resolved spec, one LayerRendezvous per layer,
// and its checkpoints.
#ifndef SYNCNORM_SERVER_DOMAIN_JOB_H_
#define SYNCNORM_SERVER_DOMAIN_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "server/domain/clock.h"
#include "server/domain/contribution.h"
#include "server/domain/group_layout.h"
#include "server/domain/job_spec.h"
#include "server/domain/layer_rendezvous.h"
#include "server/domain/membership.h"
#include "server/domain/round_observer.h"
#include "server/store/state_store.h"

namespace syncnorm {

// A job as reported to callers.
struct JobSnapshot {
  JobSpec spec;  // resolved
  // Highest step applied by every layer of every group; -1 before any.
  int64_t committed_step = -1;
  // The membership changes kept, oldest first (Membership::history).
  std::vector<MembershipChange> membership;
  // The first step a membership change may name (Job::NextStep).
  int64_t next_step = 0;
};

// The running statistics of one layer of one group.
struct LayerStatsSnapshot {
  int layer = 0;
  std::string name;
  int group = 0;
  RunningStats stats;
  // Runs no rounds (LayerState::frozen).
  bool frozen = false;
};

// The running statistics of some layers of one group of a job.
struct RunningStatsSnapshot {
  std::string job_id;
  // The committed step (latest state) or the checkpoint's step.
  int64_t committed_step = -1;
  std::vector<LayerStatsSnapshot> layers;
};

// Receives the outcome of a Checkpoint call; called exactly once, never
// under a lock of the job.
using CheckpointCallback =
    std::function<void(const absl::StatusOr<CheckpointMeta>&)>;

// The defaults of JobOptions, written here only: AggregatorOptions,
// ServerOptions and the server's flags name them.
inline constexpr int kDefaultRecentRounds = 8;
inline constexpr int kDefaultKeepCheckpoints = 5;
inline constexpr absl::Duration kDefaultStragglerThreshold = absl::Seconds(1);

// How a Job is set up, beyond its spec.
struct JobOptions {
  // Finished rounds kept per (group, layer, phase). Positive. Default 8.
  int recent_rounds = kDefaultRecentRounds;
  // Untagged checkpoints kept (the newest); 0 keeps all. Default 5.
  int keep_checkpoints = kDefaultKeepCheckpoints;
  // Told about every round that ends; null: nobody. Must outlive the job.
  RoundObserver* observer = nullptr;
  // See AggregatorOptions::straggler_threshold. Default 1 s.
  absl::Duration straggler_threshold = kDefaultStragglerThreshold;
};

// Thread-safe; each layer locks on its own (see LayerRendezvous).
//
// Lock order: admin_mu_ (checkpoints), then state_mu_ (held shared by
// every contribution, exclusively by restore, import and delete, so those
// see no round half-stored), then a layer's mutex (LayerRendezvous).
class Job {
 public:
  // `store` and `clock` must outlive the job.
  // REQUIRES: `spec` resolved (ResolveJobSpec).
  Job(JobSpec spec, JobOptions options, StateStore* store, const Clock* clock);

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobSpec& spec() const { return spec_; }
  // The group of `rank`. REQUIRES: 0 <= rank < spec().world_size.
  int GroupOf(int rank) const { return layout_.GroupOf(rank); }

  // Whether `other` (resolved) is this job's spec, for an idempotent
  // CreateJob: every field equal, except the initial running statistics of
  // a layer that has moved from them in some group (see
  // LayerRendezvous::Pristine) or that another shard owns.
  bool SameSpec(const JobSpec& other) const;

  // The statistics health of the job's rounds; null when the spec turned
  // it off.
  const StatsHealth* health() const { return health_.get(); }

  // Installs what the store held for this job. REQUIRES: before any other
  // call; `stored.spec` equals spec().
  void Load(const StoredJob& stored);

  // OK when `c` fits this job; else INVALID_ARGUMENT saying what to fix
  // (layer, step, rank, phase, payload kind, shape, values, round update),
  // or
  // FAILED_PRECONDITION for a layer another shard owns (spec().shard).
  absl::Status Validate(const Contribution& c) const;

  // See LayerRendezvous::Contribute; c.job_id is not read (spec()'s is).
  // REQUIRES: Validate(c).ok().
  void Contribute(Contribution c, RoundCallback done, absl::Time now)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // Fails the overdue rounds of every layer (LayerRendezvous::Expire) and the
  // checkpoints still waiting at their deadline.
  void Expire(absl::Time now) ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // Fails every waiting round, checkpoint and later contribution with
  // `status`. In memory only.
  void Abort(const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // Removes the job's state from the store, or with `successor` replaces
  // it by that image of the same job id (a restore from a backup), in one
  // write; this object then stores nothing more, and its later restores,
  // imports and checkpoints are NOT_FOUND. The caller then Abort()s it.
  // The store's error, with nothing changed, if the write fails.
  absl::Status Delete(const JobImage* successor = nullptr)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // Minimum over groups and owned layers (spec().shard) of the last
  // applied step, skipping a group with no members at the step after it
  // (an elastic job's group whose ranks all left: its statistics stay as
  // they were); -1 if any such (group, layer) has applied none;
  // INT64_MAX (vacuously) when this shard owns none of the layers.
  int64_t CommittedStep() const;
  // CommittedStep() as callers see it: -1 instead of INT64_MAX.
  int64_t ReportedCommittedStep() const;

  JobSnapshot Snapshot() const;

  // One past the highest forward step any owned (group, layer) has
  // completed: the first step a membership change may name.
  int64_t NextStep() const;

  // Changes the job's members from a step on (see Membership::Apply),
  // stores the change, and makes the waiting rounds wait for the new
  // members (LayerRendezvous::Rebalance). Returns the job as changed (or
  // as it is, for a change in force already). NOT_FOUND once deleted; the
  // store's error, with nothing changed, if the write fails.
  absl::StatusOr<JobSnapshot> UpdateMembership(const MembershipRequest& request)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // The current membership.
  std::shared_ptr<const Membership> Members() const
      ABSL_LOCKS_EXCLUDED(members_mu_);

  // The running statistics of `layers` (empty: all this shard owns) of
  // `group`; INVALID_ARGUMENT for a layer or group out of range,
  // FAILED_PRECONDITION for a layer another shard owns.
  absl::StatusOr<RunningStatsSnapshot> Stats(absl::Span<const int> layers,
                                             int group) const;

  // The same from the checkpoint at `step`; NOT_FOUND if there is none.
  absl::StatusOr<RunningStatsSnapshot> CheckpointStats(
      int64_t step, absl::Span<const int> layers, int group) const
      ABSL_LOCKS_EXCLUDED(admin_mu_);

  // Once `step` is committed (at once if it is), stores an immutable
  // snapshot of every (group, layer) as of that step and answers `done`
  // with it, applying retention. A checkpoint that exists at `step` with
  // the same tag (or an empty one) is answered as is; another tag is
  // ALREADY_EXISTS. DEADLINE_EXCEEDED naming the lagging layers at
  // `deadline`; the store's error if the write fails.
  void Checkpoint(int64_t step, std::string tag, absl::Time deadline,
                  CheckpointCallback done)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // The job's checkpoints, by step.
  std::vector<CheckpointMeta> ListCheckpoints() const
      ABSL_LOCKS_EXCLUDED(admin_mu_);

  // Rolls every (group, layer) back to the checkpoint at `step`: its
  // statistics, and `step` as the last applied step of both phases, so
  // steps after it are accepted again. Waiting rounds fail ABORTED.
  // NOT_FOUND without such a checkpoint; the store's error (nothing
  // changed) if the write fails.
  absl::StatusOr<JobSnapshot> Restore(int64_t step)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);

  // Replaces the running statistics of the given (layer, group)s at once
  // (an import); steps stay. INVALID_ARGUMENT naming the first bad entry.
  absl::StatusOr<std::vector<LayerStatsSnapshot>> SetStats(
      std::vector<LayerStatsSnapshot> layers) ABSL_LOCKS_EXCLUDED(state_mu_);

 private:
  struct PendingCheckpoint {
    int64_t step;
    std::string tag;
    absl::Time deadline;
    CheckpointCallback done;
  };
  using Answers = std::vector<
      std::pair<CheckpointCallback, absl::StatusOr<CheckpointMeta>>>;

  absl::Status ValidatePayload(const Contribution& c) const;
  absl::StatusOr<std::vector<int>> Wanted(absl::Span<const int> layers,
                                          int group) const;
  absl::Status ValidateImport(const LayerStatsSnapshot& s) const;
  // Cuts the checkpoints whose step is committed.
  void ServeReadyLocked(Answers& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(admin_mu_);
  void ServeReady() ABSL_LOCKS_EXCLUDED(admin_mu_);
  absl::StatusOr<CheckpointMeta> CutLocked(int64_t step, const std::string& tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admin_mu_);
  std::vector<int64_t> RetentionVictimsLocked(const CheckpointMeta& added) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(admin_mu_);
  // Tells the observer and the log about a cut checkpoint.
  void ReportCheckpoint(const CheckpointData& data, absl::Duration duration,
                        const absl::Status& status) const;
  std::string Lagging(int64_t step) const;
  // Restore without failing the dropped rounds: their callbacks go to
  // `dropped`, to be called once no lock is held.
  absl::Status RestoreLocked(int64_t step, std::vector<RoundCallback>& dropped)
      ABSL_LOCKS_EXCLUDED(admin_mu_, state_mu_);
  static void Answer(Answers& answers);
  // The current membership for a caller that holds state_mu_, under which
  // alone it is replaced: no lock or reference count on a contribution's
  // path.
  const Membership& MembersHeld() const
      ABSL_SHARED_LOCKS_REQUIRED(state_mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return *members_;
  }

  // Constant after construction; rendezvous_[i] serves spec_.layers[i].
  const JobSpec spec_;
  const GroupLayout layout_;  // of spec_
  const JobOptions options_;
  StateStore* const store_;
  const Clock* const clock_;
  // Null when spec_.stats_health is off. Before rendezvous_, which points
  // at it.
  std::unique_ptr<StatsHealth> health_;
  std::vector<std::unique_ptr<LayerRendezvous>> rendezvous_;

  mutable absl::Mutex admin_mu_ ABSL_ACQUIRED_BEFORE(state_mu_);
  std::map<int64_t, CheckpointMeta> checkpoints_ ABSL_GUARDED_BY(admin_mu_);
  std::vector<PendingCheckpoint> pending_ ABSL_GUARDED_BY(admin_mu_);
  // pending_ is not empty; read without the lock on the hot path.
  std::atomic<bool> has_pending_{false};

  mutable absl::Mutex state_mu_ ABSL_ACQUIRED_BEFORE(members_mu_);
  bool deleted_ ABSL_GUARDED_BY(state_mu_) = false;

  // Replaced only under state_mu_ held exclusively, so a contribution
  // (state_mu_ shared) sees one membership throughout; members_mu_ lets
  // readers without state_mu_ (snapshots) take it too.
  mutable absl::Mutex members_mu_;
  std::shared_ptr<const Membership> members_ ABSL_GUARDED_BY(members_mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_JOB_H_
