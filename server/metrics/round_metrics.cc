#include "server/metrics/round_metrics.h"

#include <string>

#include "prometheus/family.h"

namespace syncnorm {
namespace {

// From half a millisecond (an in-memory round on loopback) to a minute (a
// round waiting for its deadline).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& ContributorBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096};
  return *buckets;
}

// Steps, 0 to the largest staleness bound (64).
const prometheus::Histogram::BucketBoundaries& StalenessBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
  return *buckets;
}

constexpr const char* kOutcomeNames[] = {"ok", "quorum", "failed", "deadline"};

}  // namespace

RoundMetrics::RoundMetrics(prometheus::Registry& registry) {
  auto& latency = prometheus::BuildHistogram()
                      .Name("syncnorm_round_latency_seconds")
                      .Help(
                          "Time from a round's first contribution to its "
                          "end, by phase and outcome.")
                      .Register(registry);
  auto& contributors = prometheus::BuildHistogram()
                           .Name("syncnorm_round_contributors")
                           .Help("Contributions counted per completed round.")
                           .Register(registry);
  auto& stragglers = prometheus::BuildCounter()
                         .Name("syncnorm_stragglers_total")
                         .Help(
                             "Contributions that arrived later than the "
                             "straggler threshold after their round's "
                             "first one.")
                         .Register(registry);
  auto& deadlines = prometheus::BuildCounter()
                        .Name("syncnorm_deadline_failures_total")
                        .Help(
                            "Rounds failed with DEADLINE_EXCEEDED because "
                            "ranks were missing at their deadline.")
                        .Register(registry);
  auto& quorum = prometheus::BuildCounter()
                     .Name("syncnorm_quorum_rounds_total")
                     .Help(
                         "Rounds completed by the job's quorum policy "
                         "without every rank.")
                     .Register(registry);
  auto& staleness = prometheus::BuildHistogram()
                        .Name("syncnorm_stale_answer_staleness_steps")
                        .Help(
                            "Stale-synchronous answers by the staleness "
                            "they used: their step minus the oldest step "
                            "of their view.")
                        .Register(registry);
  auto& clock_waits = prometheus::BuildCounter()
                          .Name("syncnorm_stale_clock_waits_total")
                          .Help(
                              "Stale-synchronous contributions not answered "
                              "on arrival: a member was more than the "
                              "staleness bound behind.")
                          .Register(registry);
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    const std::string name = phase == Phase::kForward ? "FORWARD" : "BACKWARD";
    PerPhase& p = Of(phase);
    for (int o = 0; o < kNumOutcomes; ++o) {
      p.latency[o] = &latency.Add(
          {{"phase", name}, {"outcome", kOutcomeNames[o]}}, LatencyBuckets());
    }
    p.contributors = &contributors.Add({{"phase", name}}, ContributorBuckets());
    p.stragglers = &stragglers.Add({{"phase", name}});
    p.deadline_failures = &deadlines.Add({{"phase", name}});
    p.quorum_rounds = &quorum.Add({{"phase", name}});
    p.staleness = &staleness.Add({{"phase", name}}, StalenessBuckets());
    p.clock_waits = &clock_waits.Add({{"phase", name}});
  }
  versions_ = &prometheus::BuildCounter()
                   .Name("syncnorm_state_versions_total")
                   .Help(
                       "Running-statistics versions applied: forward rounds "
                       "that completed and updated a layer's statistics.")
                   .Register(registry)
                   .Add({});
  auto& checkpoints = prometheus::BuildHistogram()
                          .Name("syncnorm_checkpoint_duration_seconds")
                          .Help(
                              "Time to cut a checkpoint (the layers' "
                              "statistics as of its step) and store it.")
                          .Register(registry);
  checkpoint_ok_ = &checkpoints.Add({{"outcome", "ok"}}, LatencyBuckets());
  checkpoint_failed_ =
      &checkpoints.Add({{"outcome", "failed"}}, LatencyBuckets());
  membership_changes_ = &prometheus::BuildCounter()
                             .Name("syncnorm_membership_changes_total")
                             .Help(
                                 "Membership versions made by "
                                 "UpdateMembership (elastic jobs).")
                             .Register(registry)
                             .Add({});
  auto& ranks = prometheus::BuildCounter()
                    .Name("syncnorm_membership_ranks_total")
                    .Help(
                        "Ranks that joined, left or were removed by "
                        "membership changes.")
                    .Register(registry);
  joined_ = &ranks.Add({{"change", "joined"}});
  left_ = &ranks.Add({{"change", "left"}});
  removed_ = &ranks.Add({{"change", "removed"}});
  auto& flags = prometheus::BuildGauge()
                    .Name("syncnorm_stats_health_flags")
                    .Help(
                        "Statistics-health flags in force: ranks whose "
                        "moments disagree with their group's (mean_shift, "
                        "variance_ratio), stuck channels of a rank, dead "
                        "channels of a layer.")
                    .Register(registry);
  auto& raised = prometheus::BuildCounter()
                     .Name("syncnorm_stats_health_flags_raised_total")
                     .Help("Statistics-health flags raised.")
                     .Register(registry);
  for (int k = 0; k < kNumHealthKinds; ++k) {
    const char* kind = HealthKindName(static_cast<HealthKind>(k + 1));
    health_flags_[k] = &flags.Add({{"kind", kind}});
    health_raised_[k] = &raised.Add({{"kind", kind}});
  }
  nonfinite_ = &prometheus::BuildCounter()
                    .Name("syncnorm_nonfinite_contributions_total")
                    .Help(
                        "Contributions refused for a non-finite value (NaN "
                        "or infinity), all jobs.")
                    .Register(registry)
                    .Add({});
}

void RoundMetrics::OnStatsHealth(const StatsHealthReport& report) {
  const int k = static_cast<int>(report.flag.kind) - 1;
  if (k < 0 || k >= kNumHealthKinds) return;
  if (report.raised) {
    health_flags_[k]->Increment();
    health_raised_[k]->Increment();
  } else {
    health_flags_[k]->Decrement();
  }
}

void RoundMetrics::OnNonFinite(const std::string& job_id, int rank) {
  nonfinite_->Increment();
}

void RoundMetrics::OnMembershipChange(const MembershipReport& report) {
  membership_changes_->Increment();
  joined_->Increment(report.joined);
  left_->Increment(report.left);
  removed_->Increment(report.removed);
}

void RoundMetrics::Record(const RoundReport& report, Outcome outcome) {
  PerPhase& p = Of(report.phase);
  p.latency[outcome]->Observe(absl::ToDoubleSeconds(report.latency));
  if (outcome == kDeadline) {
    p.deadline_failures->Increment();
    return;
  }
  p.contributors->Observe(static_cast<double>(report.contributors.size()));
  if (!report.stragglers.empty()) {
    p.stragglers->Increment(static_cast<double>(report.stragglers.size()));
  }
  if (outcome == kQuorum) p.quorum_rounds->Increment();
  if (outcome != kFailed && report.phase == Phase::kForward) {
    versions_->Increment();
  }
}

void RoundMetrics::OnRoundCompleted(const RoundReport& report) {
  Record(report, !report.status.ok() ? kFailed : report.quorum ? kQuorum : kOk);
}

void RoundMetrics::OnDeadline(const RoundReport& report) {
  Record(report, kDeadline);
}

void RoundMetrics::OnCheckpoint(const CheckpointReport& report) {
  (report.status.ok() ? checkpoint_ok_ : checkpoint_failed_)
      ->Observe(absl::ToDoubleSeconds(report.duration));
}

void RoundMetrics::OnStaleAnswer(const StaleAnswerReport& report) {
  PerPhase& p = Of(report.phase);
  p.staleness->Observe(static_cast<double>(report.staleness));
  if (report.waited) p.clock_waits->Increment();
}

}  // namespace syncnorm
