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

}  // namespace syncnorm
