// deploy/monitoring against the real thing: the aggregator binary under
// load from 4 ranks, scraped every second by Debian's Prometheus, which
// evaluates syncnorm-alerts.yaml (each `for:` set to 0s in the copy it
// loads) every second (see tests/testing/monitored_aggregator.h). Through
// Prometheus's HTTP API:
//   - each alert fires when its condition is made to happen: a round whose
//     second rank never comes (SyncnormDeadlineFailures), rounds of 16,384
//     channels in a round log of 1 MiB (SyncnormRoundLogSpilling), a
//     target nothing listens on (SyncnormShardDown), and, with recording
//     rules standing in for kube-state-metrics, a StatefulSet of 3 replicas
//     (SyncnormShardAbsent: 2 targets) and a 4 MiB memory limit
//     (SyncnormMemoryNearLimit); the normal job fires no statistics-health
//     alert;
//   - every alerting rule evaluates without error, and every metric it
//     reads has series (so, with the above, every rule's expression
//     returns data);
//   - every expression of the dashboard, and the selector of each of its
//     variables, returns samples.
// The statistics-health metrics are monitoring_stats_health_test's:
// here an expression that reads them (SyncnormRankFlagged,
// SyncnormNonFiniteContributions, the dashboard's "Statistics health" row)
// need only evaluate without error. Skipped, saying why, where prometheus
// is not installed (scripts/deps.sh installs it).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
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

// kube-state-metrics, as recording rules: shard 0's container has a memory
// limit of 4 MiB (the aggregator's resident memory is well above 85% of
// it), and the StatefulSet asks for 3 shards where Prometheus has 2
// targets.
constexpr char kKubeStateMetrics[] = R"(groups:
  - name: kube-state-metrics-stand-in
    rules:
      - record: kube_statefulset_replicas
        expr: vector(3)
        labels:
          job: kube-state-metrics
          namespace: syncnorm
          statefulset: syncnorm-aggregator
      - record: kube_pod_container_resource_limits
        expr: vector(4194304)
        labels:
          job: kube-state-metrics
          namespace: syncnorm
          pod: syncnorm-aggregator-0
          container: aggregator
          resource: memory
          unit: byte
)";

class MonitoringTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!PrometheusServer::Installed()) return;
    setup_ = new absl::Status(Start());
  }

  static void TearDownTestSuite() {
    if (load_ != nullptr && load_->joinable()) load_->join();
    if (monitored_ != nullptr) (void)monitored_->Stop();
  }

  void SetUp() override {
    if (!PrometheusServer::Installed()) {
      GTEST_SKIP() << PrometheusServer::kBinary
                   << " is missing: run scripts/deps.sh";
    }
    ASSERT_TRUE(setup_->ok()) << *setup_;
  }

  static absl::Status Start();
  static absl::Status MissARank();
  static absl::Status SpillTheRoundLog();

  static PrometheusServer& prometheus() { return monitored_->prometheus(); }

  // Shared by the tests: whatever they wait for should be there long before.
  static absl::Time deadline_;
  static absl::Status* setup_;
  static std::unique_ptr<MonitoredAggregator> monitored_;
  static std::unique_ptr<std::thread> load_;
  static absl::Status* load_status_;
};

absl::Time MonitoringTest::deadline_;
absl::Status* MonitoringTest::setup_ = nullptr;
std::unique_ptr<MonitoredAggregator> MonitoringTest::monitored_;
std::unique_ptr<std::thread> MonitoringTest::load_;
absl::Status* MonitoringTest::load_status_ = new absl::Status;

absl::Status MonitoringTest::Start() {
  MonitoredAggregator::Options options;
  // 1 MiB: rounds of 16,384 channels (512 KiB each) cannot stay in it.
  options.aggregator_flags = {"--round_log_mib=1"};
  options.more_targets = {
      {absl::StrCat("127.0.0.1:", FreeLoopbackPort()),
       {{"namespace", "syncnorm"}, {"pod", "syncnorm-aggregator-1"}}}};
  options.more_rules = kKubeStateMetrics;
  absl::StatusOr<std::unique_ptr<MonitoredAggregator>> monitored =
      MonitoredAggregator::Start(MakeScratchDir("monitoring"), options);
  if (!monitored.ok()) return monitored.status();
  monitored_ = *std::move(monitored);

  // A job of 4 ranks, 2 layers of 64 channels, forward and backward, for
  // about 6 s: the rates the dashboard shows are not all zero.
  RankLoadOptions load;
  load.address = monitored_->aggregator().address();
  load.job_id = "load";
  load.world_size = 4;
  load.layers = 2;
  load.steps = 150;
  load.pace = absl::Milliseconds(40);
  load_ = std::make_unique<std::thread>(
      [load] { *load_status_ = RunRankLoad(load); });

  // Prometheus must hold a sample of each counter before its event, or
  // increase() and rate() see no change.
  const absl::Time soon = absl::Now() + absl::Seconds(20);
  for (const char* before :
       {"syncnorm_deadline_failures_total{phase=\"FORWARD\"} == 0",
        "syncnorm_round_log_spilled_bytes_total == 0"}) {
    if (auto s = prometheus().AwaitSample(before, soon); !s.ok()) {
      return s.status();
    }
  }
  if (absl::Status s = MissARank(); !s.ok()) return s;
  if (absl::Status s = SpillTheRoundLog(); !s.ok()) return s;
  deadline_ = absl::Now() + absl::Seconds(30);
  return absl::OkStatus();
}

// A FORWARD round of a job of 2 ranks that only rank 0 joins: it fails at
// the job's 300 ms round timeout.
absl::Status MonitoringTest::MissARank() {
  ClientOptions options;
  options.address = monitored_->aggregator().address();
  Client client(options);
  StackConfig config;
  config.world_size = 2;
  config.channels = {8};
  if (auto job = client.CreateJob(JobRequest(config, "missing", 300));
      !job.ok()) {
    return job.status();
  }
  auto stub = v1::Aggregator::NewStub(
      grpc::CreateChannel(options.address, grpc::InsecureChannelCredentials()));
  v1::Contribution c;
  c.set_job_id("missing");
  c.set_layer(0);
  c.set_step(1);
  c.set_phase(v1::FORWARD);
  c.set_rank(0);
  c.mutable_moments()->set_count(4);
  for (int i = 0; i < 8; ++i) {
    c.mutable_moments()->add_mean(i);
    c.mutable_moments()->add_m2(1);
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::RoundResult result;
  const grpc::Status s = stub->ReduceOnce(&context, c, &result);
  if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::InternalError(absl::StrCat("the round without rank 1 ended ",
                                            s.error_code(), ": ",
                                            s.error_message()));
  }
  return absl::OkStatus();
}

// Rounds of one rank and 16,384 channels (512 KiB a record) through the
// 1 MiB round log: their records must go on to RocksDB before they expire.
absl::Status MonitoringTest::SpillTheRoundLog() {
  RankLoadOptions spill;
  spill.address = monitored_->aggregator().address();
  spill.job_id = "spill";
  spill.world_size = 1;
  spill.channels = 16384;
  spill.steps = 24;
  spill.backward = false;
  if (absl::Status s = RunRankLoad(spill); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::optional<double> spilled;
  while (absl::Now() < deadline) {
    spilled = Sample(ScrapeMetrics(monitored_->metrics_port()),
                     "syncnorm_round_log_spilled_bytes_total");
    if (spilled.value_or(0) > 0) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::InternalError(
      absl::StrCat("the round log spilled nothing: ", spilled.value_or(-1)));
}

// The value of `label` in an instant query's first sample.
std::string LabelOf(const nlohmann::json& result, const std::string& label) {
  return result.at(0)["metric"].value(label, "");
}

TEST_F(MonitoringTest, EachAlertFiresWhenItsConditionHappens) {
  struct Expected {
    const char* alert;
    std::vector<std::pair<std::string, std::string>> labels;
  };
  const Expected expected[] = {
      {"SyncnormDeadlineFailures",
       {{"severity", "warning"},
        {"pod", "syncnorm-aggregator-0"},
        {"phase", "FORWARD"}}},
      {"SyncnormRoundLogSpilling",
       {{"severity", "warning"}, {"pod", "syncnorm-aggregator-0"}}},
      {"SyncnormMemoryNearLimit",
       {{"severity", "warning"}, {"pod", "syncnorm-aggregator-0"}}},
      {"SyncnormShardDown",
       {{"severity", "critical"}, {"pod", "syncnorm-aggregator-1"}}},
      {"SyncnormShardAbsent",
       {{"severity", "critical"}, {"namespace", "syncnorm"}}},
  };
  for (const Expected& e : expected) {
    absl::StatusOr<nlohmann::json> firing =
        monitored_->AwaitFiring(e.alert, deadline_);
    EXPECT_TRUE(firing.ok()) << firing.status();
    if (!firing.ok()) continue;
    EXPECT_EQ(firing->size(), 1u) << e.alert << ": " << firing->dump();
    for (const auto& [label, value] : e.labels) {
      EXPECT_EQ(LabelOf(*firing, label), value) << e.alert << " " << label;
    }
  }
  // The alerts are evaluated every second: by now a false one would fire.
  for (const char* quiet :
       {"SyncnormRankFlagged", "SyncnormNonFiniteContributions"}) {
    absl::StatusOr<nlohmann::json> alerts =
        prometheus().Query(absl::StrCat("ALERTS{alertname=\"", quiet, "\"}"));
    ASSERT_TRUE(alerts.ok()) << alerts.status();
    EXPECT_TRUE(alerts->empty())
        << quiet << " on normal data: " << alerts->dump();
  }
}

TEST_F(MonitoringTest, EveryRuleEvaluatesOverSeriesThatExist) {
  absl::StatusOr<std::vector<LoadedAlert>> alerts =
      monitored_->EvaluatedAlerts(deadline_);
  ASSERT_TRUE(alerts.ok()) << alerts.status();
  std::vector<std::string> left_to_stats_health;
  for (const LoadedAlert& alert : *alerts) {
    absl::StatusOr<nlohmann::json> result = prometheus().Query(alert.query);
    EXPECT_TRUE(result.ok()) << alert.name << ": " << result.status();
    const std::set<std::string> names = MetricNames(alert.query);
    EXPECT_FALSE(names.empty()) << alert.name;
    if (ReadsStatsHealth(names)) {
      left_to_stats_health.push_back(alert.name);
      continue;
    }
    for (const std::string& name : names) {
      absl::StatusOr<nlohmann::json> series = prometheus().AwaitSample(
          absl::StrCat("count(", name, ")"), deadline_);
      EXPECT_TRUE(series.ok()) << alert.name << " reads " << name
                               << ", which has no series: " << series.status();
    }
  }
  EXPECT_EQ(left_to_stats_health,
            (std::vector<std::string>{"SyncnormRankFlagged",
                                      "SyncnormNonFiniteContributions"}));
}

TEST_F(MonitoringTest, EveryDashboardExpressionReturnsData) {
  absl::StatusOr<std::vector<DashboardQuery>> queries =
      DashboardQueries(ReadFile(MonitoringFile("syncnorm-dashboard.json")));
  ASSERT_TRUE(queries.ok()) << queries.status();
  ASSERT_GT(queries->size(), 40u);
  int stats_health = 0;
  for (const DashboardQuery& q : *queries) {
    if (ReadsStatsHealth(MetricNames(q.expr))) {
      ++stats_health;
      absl::StatusOr<nlohmann::json> result = prometheus().Query(q.expr);
      EXPECT_TRUE(result.ok()) << q.where << ": " << result.status();
      continue;
    }
    absl::StatusOr<nlohmann::json> result =
        prometheus().AwaitSample(q.expr, deadline_);
    EXPECT_TRUE(result.ok()) << q.where << ": " << result.status();
  }
  EXPECT_EQ(stats_health, 3);
}

TEST_F(MonitoringTest, TheLoadRanWithoutErrors) {
  load_->join();
  EXPECT_TRUE(load_status_->ok()) << *load_status_;
  absl::StatusOr<int> code = monitored_->Stop();
  monitored_.reset();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace syncnorm::testing
