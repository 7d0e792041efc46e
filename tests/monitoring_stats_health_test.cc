// PENDING: the statistics-health metrics (tests/testing/stats_health_metrics.h:
// syncnorm_stats_health_flags{kind}, syncnorm_stats_health_flags_raised_total
// {kind}, syncnorm_nonfinite_contributions_total) are being added to the
// server; until the aggregator exports them this test fails, and its target
// is tagged "manual" (tests/BUILD) so that `bazel test //...` leaves it out.
// Remove the tag when they land.
//
// What deploy/monitoring reads of statistics health, against the real
// aggregator and Prometheus (see tests/testing/monitored_aggregator.h):
//   - a planted outlier (rank 3 of 4, 64 channels, 32 values per rank and
//     channel from N(0, 1), its values shifted by 3 standard deviations for
//     20 steps) raises a mean_shift flag, and SyncnormRankFlagged fires;
//   - a contribution holding NaN is refused, and
//     SyncnormNonFiniteContributions fires;
//   - the expressions of the dashboard and of the rules that read these
//     metrics return data (tests:monitoring_test checks the others).
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/dashboard_queries.h"
#include "tests/testing/monitored_aggregator.h"
#include "tests/testing/promql.h"
#include "tests/testing/rank_load.h"
#include "tests/testing/scrape.h"
#include "tests/testing/stats_health_metrics.h"
#include "tests/testing/subprocess.h"

namespace syncnorm::testing {
namespace {

// Whether the alert fired at some evaluation of the last 5 minutes (a flag
// may be lifted once its job stops).
absl::Status AwaitFired(PrometheusServer& prometheus, absl::string_view alert,
                        absl::Time deadline) {
  return prometheus
      .AwaitSample(absl::StrCat("max_over_time(ALERTS{alertname=\"", alert,
                                "\", alertstate=\"firing\"}[5m])"),
                   deadline)
      .status();
}

// Rank 0 of a job of one rank sends a FORWARD whose first mean is NaN.
grpc::Status SendNaN(const std::string& address) {
  ClientOptions options;
  options.address = address;
  Client client(options);
  StackConfig config;
  config.world_size = 1;
  config.channels = {4};
  if (auto job = client.CreateJob(JobRequest(config, "nan", 20000));
      !job.ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        std::string(job.status().message()));
  }
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::Contribution c;
  c.set_job_id("nan");
  c.set_step(1);
  c.set_phase(v1::FORWARD);
  c.mutable_moments()->set_count(4);
  for (int i = 0; i < 4; ++i) {
    c.mutable_moments()->add_mean(
        i == 0 ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    c.mutable_moments()->add_m2(1);
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::RoundResult result;
  return stub->ReduceOnce(&context, c, &result);
}

TEST(MonitoringStatsHealthTest, OutlierAndNonFiniteValuesFireTheirAlerts) {
  if (!PrometheusServer::Installed()) {
    GTEST_SKIP() << PrometheusServer::kBinary
                 << " is missing: run scripts/deps.sh";
  }
  auto monitored =
      MonitoredAggregator::Start(MakeScratchDir("monitoring-stats-health"), {});
  ASSERT_TRUE(monitored.ok()) << monitored.status();
  PrometheusServer& prometheus = (*monitored)->prometheus();

  const std::string text = ScrapeMetrics((*monitored)->metrics_port());
  std::vector<std::string> missing;
  for (const std::string& name : StatsHealthMetrics()) {
    if (text.find(absl::StrCat("# TYPE ", name, " ")) == std::string::npos) {
      missing.push_back(name);
    }
  }
  ASSERT_TRUE(missing.empty()) << "PENDING: the aggregator does not export "
                               << absl::StrJoin(missing, ", ") << " yet";

  // A sample of each counter before its event (see monitoring_test.cc).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (const std::string& name : StatsHealthMetrics()) {
    ASSERT_TRUE(
        prometheus.AwaitSample(absl::StrCat("count(", name, ")"), deadline)
            .ok())
        << name;
  }

  RankLoadOptions outlier;
  outlier.address = (*monitored)->aggregator().address();
  outlier.job_id = "outlier";
  outlier.world_size = 4;
  outlier.channels = 64;
  outlier.batch = 32;
  outlier.steps = 20;
  outlier.backward = false;
  outlier.outlier_rank = 3;
  outlier.outlier_shift = 3;
  ASSERT_TRUE(RunRankLoad(outlier).ok());
  EXPECT_GE(Sample(ScrapeMetrics((*monitored)->metrics_port()),
                   "syncnorm_stats_health_flags_raised_total{kind=\"mean_"
                   "shift\"}")
                .value_or(0),
            1);
  EXPECT_TRUE(AwaitFired(prometheus, "SyncnormRankFlagged", deadline).ok())
      << prometheus.Query("syncnorm_stats_health_flags")->dump();

  const grpc::Status nan = SendNaN((*monitored)->aggregator().address());
  EXPECT_EQ(nan.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << nan.error_message();
  EXPECT_TRUE(
      AwaitFired(prometheus, "SyncnormNonFiniteContributions", deadline).ok())
      << prometheus.Query("syncnorm_nonfinite_contributions_total")->dump();

  // The expressions monitoring_test leaves to this test.
  absl::StatusOr<std::vector<DashboardQuery>> queries =
      DashboardQueries(ReadFile(MonitoringFile("syncnorm-dashboard.json")));
  ASSERT_TRUE(queries.ok()) << queries.status();
  for (const DashboardQuery& q : *queries) {
    if (!ReadsStatsHealth(MetricNames(q.expr))) continue;
    auto result = prometheus.AwaitSample(q.expr, deadline);
    EXPECT_TRUE(result.ok()) << q.where << ": " << result.status();
  }
  absl::StatusOr<std::vector<LoadedAlert>> alerts =
      (*monitored)->EvaluatedAlerts(deadline);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  for (const LoadedAlert& alert : *alerts) {
    const std::set<std::string> names = MetricNames(alert.query);
    if (!ReadsStatsHealth(names)) continue;
    for (const std::string& name : names) {
      auto series =
          prometheus.AwaitSample(absl::StrCat("count(", name, ")"), deadline);
      EXPECT_TRUE(series.ok())
          << alert.name << " reads " << name << ": " << series.status();
    }
  }
  absl::StatusOr<int> code = (*monitored)->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace syncnorm::testing
