// syncnorm's own Prometheus metrics: rounds and checkpoints.
#ifndef SYNCNORM_SERVER_METRICS_ROUND_METRICS_H_
#define SYNCNORM_SERVER_METRICS_ROUND_METRICS_H_

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/domain/round_observer.h"
#include "server/domain/stats_health.h"

namespace syncnorm {

// A RoundObserver that counts into `registry` (over all jobs: a label per
// job would grow without bound):
//   syncnorm_round_latency_seconds{phase,outcome}  histogram; outcome is
//       ok, quorum, failed (the merge failed) or deadline
//   syncnorm_round_contributors{phase}   histogram of ranks counted per round
//   syncnorm_stragglers_total{phase}     contributions later than the
//                                        straggler threshold
//   syncnorm_deadline_failures_total{phase}  rounds failed at their deadline
//   syncnorm_quorum_rounds_total{phase}  rounds completed by a quorum
//   syncnorm_state_versions_total        running-statistics versions
//                                        applied (forward rounds that ended OK)
//   syncnorm_checkpoint_duration_seconds{outcome}  histogram of checkpoint
//                                        cuts (snapshot and store write)
//   syncnorm_membership_changes_total    membership versions made
//   syncnorm_membership_ranks_total{change}  ranks that joined, left or
//                                        were removed
//   syncnorm_stale_answer_staleness_steps{phase}  histogram of the
//                                        staleness a stale-synchronous
//                                        answer used (its step minus the
//                                        oldest step of its view)
//   syncnorm_stale_clock_waits_total{phase}  stale-synchronous
//                                        contributions not answered on
//                                        arrival (the clock condition)
//   syncnorm_stats_health_flags{kind}    gauge: statistics-health flags in
//                                        force (kind: mean_shift,
//                                        variance_ratio, stuck_channel,
//                                        dead_channel)
//   syncnorm_stats_health_flags_raised_total{kind}  flags raised
//   syncnorm_nonfinite_contributions_total  contributions refused for a
//                                        non-finite value
// phase is FORWARD or BACKWARD. Thread-safe; `registry` must outlive it.
class RoundMetrics final : public RoundObserver {
 public:
  explicit RoundMetrics(prometheus::Registry& registry);

  void OnRoundCompleted(const RoundReport& report) override;
  void OnDeadline(const RoundReport& report) override;
  void OnCheckpoint(const CheckpointReport& report) override;
  void OnMembershipChange(const MembershipReport& report) override;
  void OnStaleAnswer(const StaleAnswerReport& report) override;
  void OnStatsHealth(const StatsHealthReport& report) override;
  void OnNonFinite(const std::string& job_id, int rank) override;

 private:
  enum Outcome { kOk, kQuorum, kFailed, kDeadline, kNumOutcomes };
  // The series of one phase, made once (Family::Add takes a lock).
  struct PerPhase {
    prometheus::Histogram* latency[kNumOutcomes];
    prometheus::Histogram* contributors;
    prometheus::Counter* stragglers;
    prometheus::Counter* deadline_failures;
    prometheus::Counter* quorum_rounds;
    prometheus::Histogram* staleness;
    prometheus::Counter* clock_waits;
  };

  PerPhase& Of(Phase phase) {
    return phase == Phase::kBackward ? backward_ : forward_;
  }
  void Record(const RoundReport& report, Outcome outcome);

  // Constant after construction; the series are owned by the registry.
  PerPhase forward_;
  PerPhase backward_;
  prometheus::Counter* versions_;
  prometheus::Histogram* checkpoint_ok_;
  prometheus::Histogram* checkpoint_failed_;
  prometheus::Counter* membership_changes_;
  prometheus::Counter* joined_;
  prometheus::Counter* left_;
  prometheus::Counter* removed_;
  // By HealthKind - 1.
  prometheus::Gauge* health_flags_[kNumHealthKinds];
  prometheus::Counter* health_raised_[kNumHealthKinds];
  prometheus::Counter* nonfinite_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_METRICS_ROUND_METRICS_H_
