// The rendezvous of syncnorm: jobs, their rounds and running statistics.
// Knows nothing of gRPC.
#ifndef SYNCNORM_SERVER_DOMAIN_AGGREGATOR_H_
#define SYNCNORM_SERVER_DOMAIN_AGGREGATOR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/domain/clock.h"
#include "server/domain/contribution.h"
#include "server/domain/job.h"
#include "server/domain/job_spec.h"
#include "server/domain/limits.h"
#include "server/domain/periodic_thread.h"
#include "server/domain/round_observer.h"
#include "server/store/state_store.h"

namespace syncnorm {

// The defaults of AggregatorOptions beyond JobOptions', written here only:
// ServerOptions and the server's flags name them.
inline constexpr absl::Duration kDefaultRoundTimeout = absl::Seconds(30);
inline constexpr absl::Duration kDefaultReaperPeriod = absl::Milliseconds(20);

struct AggregatorOptions {
  // Round timeout of jobs that set none. Must be positive. Default 30 s.
  absl::Duration default_round_timeout = kDefaultRoundTimeout;
  // How often the reaper thread expires overdue rounds. Default 20 ms.
  absl::Duration reaper_period = kDefaultReaperPeriod;
  // Finished rounds kept per (job, group, layer, phase) so that retries get
  // the same answer. Must be positive. Default 8.
  int recent_rounds = kDefaultRecentRounds;
  // Untagged checkpoints kept per job (the newest); tagged ones are always
  // kept. 0 keeps all. Default 5.
  int keep_checkpoints = kDefaultKeepCheckpoints;
  // The longest a Checkpoint call waits for its step when the call itself
  // has no (or a later) deadline. Default 10 min.
  absl::Duration max_checkpoint_wait = absl::Minutes(10);
  // Jobs, their sizes and the rounds in flight (see limits.h); exceeding
  // one is RESOURCE_EXHAUSTED naming it. Stored jobs load whatever their
  // number and size.
  Limits limits;
  // Told about every round that ends (latency, stragglers, quorum rounds,
  // deadlines); must outlive the aggregator. Null: a LoggingRoundObserver
  // (log lines for straggling, quorum, failed and expired rounds).
  RoundObserver* observer = nullptr;
  // A contributor that arrives more than this after its round's first one
  // is a straggler (RoundReport::stragglers). Default 1 s.
  absl::Duration straggler_threshold = kDefaultStragglerThreshold;
};

// What Aggregator::RestoreJobs did with one job.
struct JobRestore {
  std::string job_id;
  // true: loaded from the image; false: kept as the server holds it.
  bool restored = false;
  // The job's committed step afterwards (-1 before any).
  int64_t committed_step = -1;
  // Why it was kept, or what was replaced.
  std::string note;
};

// Merges the contributions of every round of every job, keeps running
// statistics, and fails rounds that miss their deadline.
//
// Thread-safe. The job table is read-locked on the hot path; each (job,
// layer) has its own mutex (LayerRendezvous). The contributor that completes a
// round merges it (in rank order) on its own thread and stores its result
// (StateStore) before anyone gets it.
class Aggregator {
 public:
  // `clock` and `store` must outlive the aggregator. The reaper is not
  // started; call Load() before serving.
  Aggregator(AggregatorOptions options, const Clock* clock, StateStore* store);
  // Stops the reaper; rounds still waiting fail UNAVAILABLE.
  ~Aggregator();

  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // Starts a thread that calls ExpireRounds(clock->Now()) every
  // reaper_period. No-op when already running.
  void StartReaper() ABSL_LOCKS_EXCLUDED(reaper_mu_);
  // Stops and joins the reaper thread; no-op when not running.
  void StopReaper() ABSL_LOCKS_EXCLUDED(reaper_mu_);

  // Loads every job, its statistics, retry window and checkpoints from the
  // store. The store's error (DATA_LOSS naming the record, ...) otherwise.
  // REQUIRES: called once, before any other call.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Creates a job from `spec` (resolved with ResolveJobSpec) and stores it.
  // The same id with an equal resolved spec returns the existing job; a
  // different spec is ALREADY_EXISTS; an invalid one INVALID_ARGUMENT; the
  // store's error if it cannot be stored.
  absl::StatusOr<JobSnapshot> CreateJob(JobSpec spec)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // The job's resolved spec and committed step; NOT_FOUND if unknown.
  absl::StatusOr<JobSnapshot> GetJob(absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Every job, by id.
  std::vector<JobSnapshot> ListJobs() const ABSL_LOCKS_EXCLUDED(jobs_mu_);
  // How many jobs there are (what --max_jobs bounds).
  int64_t job_count() const ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Deletes the job and all of its stored state (statistics, checkpoints);
  // its waiting rounds fail ABORTED ("job deleted"). NOT_FOUND if unknown;
  // the store's error (nothing deleted) if the removal fails.
  absl::Status DeleteJob(absl::string_view job_id)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // The running statistics of `layers` (empty: all) of `group`: the latest,
  // or the checkpoint's at `checkpoint_step` when set. NOT_FOUND for an
  // unknown job or checkpoint, INVALID_ARGUMENT for a bad layer/group.
  absl::StatusOr<RunningStatsSnapshot> GetRunningStats(
      absl::string_view job_id, absl::Span<const int> layers, int group,
      std::optional<int64_t> checkpoint_step = std::nullopt) const
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // The statistics health of a job: its flags in force and recent, and its
  // ranks' refused contributions, each list at most `limit` long; nullopt
  // inside when the job turned it off. NOT_FOUND for an unknown job.
  absl::StatusOr<std::optional<StatsHealthSnapshot>> GetStatsHealth(
      absl::string_view job_id, int limit) const ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Replaces the running statistics of some (layer, group)s of a job, at
  // once (an import). See Job::SetStats.
  absl::StatusOr<std::vector<LayerStatsSnapshot>> SetRunningStats(
      absl::string_view job_id, std::vector<LayerStatsSnapshot> layers)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Waits until `step` is committed (bounded by `deadline` and
  // max_checkpoint_wait), then stores a checkpoint; see Job::Checkpoint.
  // `done` is called exactly once, never under a lock.
  void Checkpoint(absl::string_view job_id, int64_t step, std::string tag,
                  absl::Time deadline, CheckpointCallback done)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // A job's checkpoints by step; NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<CheckpointMeta>> ListCheckpoints(
      absl::string_view job_id) const ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Rolls a job back to its checkpoint at `step`; see Job::Restore.
  absl::StatusOr<JobSnapshot> RestoreCheckpoint(absl::string_view job_id,
                                                int64_t step)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Changes a job's members; see Job::UpdateMembership.
  absl::StatusOr<JobSnapshot> UpdateMembership(absl::string_view job_id,
                                               const MembershipRequest& request)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Loads jobs from a backup's images (`source` names the backup in notes
  // and logs): a job the server does not hold is stored, one write each,
  // and served from then on; one it holds is kept, unless `replace`, which
  // swaps it for the image (its waiting rounds and checkpoints fail
  // ABORTED). RESOURCE_EXHAUSTED, with nothing loaded, when the new jobs
  // exceed max_jobs or a job limit. A failed write stops at that job with
  // the store's error; the jobs before it stay loaded (a repeated call
  // keeps them).
  absl::StatusOr<std::vector<JobRestore>> RestoreJobs(
      std::vector<JobImage> images, bool replace, absl::string_view source)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Adds `c` to its round. `done` is called exactly once, never under a
  // lock: inline for a bad contribution (NOT_FOUND, INVALID_ARGUMENT), a
  // conflicting payload (ABORTED), a superseded step (FAILED_PRECONDITION)
  // or a retry of a finished round (its cached outcome); otherwise on the
  // thread that completes the round (possibly this one), expires it
  // (DEADLINE_EXCEEDED) or deletes the job (ABORTED).
  void Contribute(Contribution c, RoundCallback done)
      ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Completes the quorum rounds whose grace period has passed, fails every
  // round whose deadline is at or before `now`, then tells the observer the
  // time (RoundObserver::OnTick).
  void ExpireRounds(absl::Time now) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Shutdown: from now on a contribution that would start a round fails
  // UNAVAILABLE ("shutting down"); rounds already in flight go on.
  void StartDraining() { admission_.StartDraining(); }
  // Waits until no round is in flight or `deadline`; true when none is.
  bool AwaitRoundsDone(absl::Time deadline) const {
    return admission_.AwaitIdle(deadline);
  }
  // Rounds waiting for contributions now.
  int64_t rounds_in_flight() const { return admission_.size(); }

 private:
  std::shared_ptr<Job> FindJob(absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(jobs_mu_);
  static absl::Status NotFound(absl::string_view job_id);

  JobOptions JobOptionsOf() const;
  // RestoreJobs under jobs_mu_; the jobs it replaced go to `replaced`, to
  // be aborted once the lock is released, also when it fails.
  absl::Status RestoreJobsLocked(std::vector<JobImage>& images, bool replace,
                                 absl::string_view source,
                                 std::vector<JobRestore>& out,
                                 std::vector<std::shared_ptr<Job>>& replaced)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(jobs_mu_);

  // Constant after construction.
  const AggregatorOptions options_;
  const Clock* const clock_;
  // Used when options_.observer is null.
  LoggingRoundObserver default_observer_;
  RoundObserver* const observer_;
  StateStore* const store_;

  mutable absl::Mutex jobs_mu_;
  // Jobs are shared with in-flight calls so that DeleteJob never pulls a
  // job from under a caller.
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_
      ABSL_GUARDED_BY(jobs_mu_);

  absl::Mutex reaper_mu_;
  std::unique_ptr<PeriodicThread> reaper_ ABSL_GUARDED_BY(reaper_mu_);

  // The rounds in flight (max_pending_rounds, draining).
  RoundAdmission admission_{options_.limits.max_pending_rounds};
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_AGGREGATOR_H_
