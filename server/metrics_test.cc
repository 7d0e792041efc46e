#include "server/metrics.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/scrape.h"

namespace syncnorm {
namespace {

using ::syncnorm::testing::ScrapeMetrics;

RoundReport Report(Phase phase) {
  RoundReport r;
  r.job_id = "j";
  r.phase = phase;
  r.latency = absl::Milliseconds(3);
  r.contributors = {0, 1, 2};
  return r;
}

TEST(MetricsTest, ServesRoundAndCheckpointMetrics) {
  auto metrics = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  ASSERT_GT((*metrics)->port(), 0);
  RoundObserver* observer = (*metrics)->round_observer();

  observer->OnRoundCompleted(Report(Phase::kForward));
  RoundReport late = Report(Phase::kForward);
  late.stragglers = {2};
  observer->OnRoundCompleted(late);
  observer->OnRoundCompleted(Report(Phase::kBackward));
  RoundReport expired = Report(Phase::kBackward);
  expired.status = absl::DeadlineExceededError("rank 3 missing");
  expired.missing_ranks = {3};
  observer->OnDeadline(expired);
  observer->OnCheckpoint(
      CheckpointReport{"j", 7, absl::Milliseconds(4), 6, absl::OkStatus()});

  const std::string text = ScrapeMetrics((*metrics)->port());
  for (const char* want : {
           "syncnorm_round_latency_seconds_count{outcome=\"ok\",phase="
           "\"FORWARD\"} 2",
           "syncnorm_round_latency_seconds_count{outcome=\"deadline\","
           "phase=\"BACKWARD\"} 1",
           "syncnorm_round_contributors_sum{phase=\"FORWARD\"} 6",
           "syncnorm_stragglers_total{phase=\"FORWARD\"} 1",
           "syncnorm_deadline_failures_total{phase=\"BACKWARD\"} 1",
           "syncnorm_state_versions_total 2",
           "syncnorm_checkpoint_duration_seconds_count{outcome=\"ok\"} 1",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST(MetricsTest, ABusyPortIsUnavailable) {
  auto first = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second =
      Metrics::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--metrics_listen"),
            std::string::npos);
}

}  // namespace
}  // namespace syncnorm
