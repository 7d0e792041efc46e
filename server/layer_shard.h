// The rendezvous of one layer of one job: its pending rounds, running
// statistics and recent outcomes, for every group, behind one mutex.
#ifndef SYNCNORM_SERVER_LAYER_SHARD_H_
#define SYNCNORM_SERVER_LAYER_SHARD_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/moments.h"
#include "server/contribution.h"
#include "server/job_spec.h"
#include "server/recent_rounds.h"
#include "server/round.h"

namespace syncnorm {

// One (job, layer) stripe of the aggregator. Thread-safe. Callbacks are
// always run after mu_ is released, on the calling thread.
class LayerShard {
 public:
  // `spec` (resolved) must outlive the shard. `recent_capacity` finished
  // rounds are kept per (group, phase) for retries.
  // REQUIRES: 0 <= layer < spec.layers.size(), recent_capacity > 0.
  LayerShard(const JobSpec& spec, int layer, int recent_capacity);

  LayerShard(const LayerShard&) = delete;
  LayerShard& operator=(const LayerShard&) = delete;

  // Adds `c` to its round, answering `done` exactly once: when the round
  // completes or fails, at once for a retry of a finished round, or at once
  // with ABORTED (conflicting payload), FAILED_PRECONDITION (superseded
  // step) or the status given to Abort.
  // REQUIRES: c is validated against the spec and c.layer is this layer.
  void Contribute(Contribution c, RoundCallback done, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every round whose deadline is at or before `now` with
  // DEADLINE_EXCEEDED naming the missing ranks. Running stats untouched.
  void Expire(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every pending round with `status` and answers every later
  // contribution with it. REQUIRES: !status.ok().
  void Abort(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // The running statistics of `group`. REQUIRES: group in range.
  RunningStats Stats(int group) const ABSL_LOCKS_EXCLUDED(mu_);

  // The step of the last forward round `group` applied; -1 before any.
  int64_t LastAppliedStep(int group) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // (group, step, phase)
  using RoundKey = std::tuple<int, int64_t, Phase>;

  struct PhaseState {
    explicit PhaseState(int capacity) : recent(capacity) {}
    int64_t latest_completed = -1;  // highest step that completed OK
    RecentRounds recent;
  };

  struct GroupState {
    GroupState(const LayerConfig& layer, int capacity);
    RunningStats stats;
    int64_t last_applied = -1;
    std::array<PhaseState, 2> phases;  // FORWARD, BACKWARD
  };

  struct Delivery {
    RoundCallback done;
    std::shared_ptr<const RoundOutcome> outcome;
  };
  using Deliveries = std::vector<Delivery>;

  static void Deliver(Deliveries& deliveries);
  static Delivery Failure(RoundCallback done, absl::Status status);
  static int PhaseIndex(Phase phase) {
    return phase == Phase::kForward ? 0 : 1;
  }

  std::string RoundLabel(const RoundKey& key) const;
  PhaseState& StateOf(const RoundKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ContributeLocked(Contribution c, RoundCallback done, absl::Time now,
                        Deliveries& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddToRound(const RoundKey& key, Round& round, Contribution c,
                  RoundCallback done, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerRetry(const RecentRounds::Entry& entry, const Contribution& c,
                   RoundCallback done, Deliveries& out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Complete(const RoundKey& key, Round& round, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyForward(const RoundKey& key, Round& round, RoundOutcome& outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailSuperseded(const RoundKey& completed, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the outcome of a finished round, hands it to its waiters and
  // forgets the round.
  void Finish(const RoundKey& key, RoundOutcome outcome, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Superseded(const RoundKey& key, int64_t latest) const;
  absl::Status Conflict(const Contribution& c) const;

  // Constant after construction.
  const JobSpec& spec_;
  const int layer_;
  const LayerConfig& config_;

  mutable absl::Mutex mu_;
  std::map<RoundKey, std::unique_ptr<Round>> rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<GroupState> groups_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_LAYER_SHARD_H_
