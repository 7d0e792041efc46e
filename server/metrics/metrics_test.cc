#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "syncnorm_version.h"
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
  observer->OnMembershipChange(MembershipReport{"j", 1, 10, 5, 2, 0, 1});
  observer->OnMembershipChange(MembershipReport{"j", 2, 12, 4, 0, 1, 0});

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
           "syncnorm_membership_changes_total 2",
           "syncnorm_membership_ranks_total{change=\"joined\"} 2",
           "syncnorm_membership_ranks_total{change=\"left\"} 1",
           "syncnorm_membership_ranks_total{change=\"removed\"} 1",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

// Connections that say nothing, as many as the endpoint had threads, and
// more: a scrape among them is still answered at once.
TEST(MetricsTest, IdleConnectionsDoNotBlockAScrape) {
  auto metrics = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((*metrics)->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
              0);
    idle.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    const std::string text = ScrapeMetrics((*metrics)->port());
    EXPECT_NE(text.find("syncnorm_build_info{"), std::string::npos) << text;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "scrape " << i;
  }
  for (int fd : idle) ::close(fd);
}

// The load gauges read their source at each scrape; the limits and the
// build are there from the start.
TEST(MetricsTest, ServesTheLoadAgainstTheLimitsAndTheBuild) {
  Limits limits;
  limits.max_jobs = 7;
  limits.max_streams = 0;  // no limit
  auto metrics = Metrics::Start("127.0.0.1:0", limits);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  std::string text = ScrapeMetrics((*metrics)->port());
  for (const std::string& want : {
           std::string("syncnorm_limit{flag=\"max_jobs\"} 7\n"),
           std::string("syncnorm_limit{flag=\"max_streams\"} 0\n"),
           absl::StrCat("syncnorm_build_info{version=\"", kSyncnormVersion,
                        "\"} 1\n"),
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << text;
  }
  EXPECT_EQ(text.find("\nsyncnorm_jobs "), std::string::npos) << text;

  ServerLoad load;
  load.jobs = 3;
  load.rounds_in_flight = 5;
  load.open_streams = 11;
  load.waiting_calls = 2;
  (*metrics)->SetLoadSource([&load] { return load; });
  text = ScrapeMetrics((*metrics)->port());
  for (const char* want :
       {"syncnorm_jobs 3\n", "syncnorm_rounds_in_flight 5\n",
        "syncnorm_open_streams 11\n", "syncnorm_waiting_calls 2\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << text;
  }
  // In memory: no round log, no round log counters.
  EXPECT_EQ(text.find("syncnorm_round_log_"), std::string::npos) << text;
  load.open_streams = 12;
  load.durable = true;
  load.round_log_bytes = 1 << 20;
  load.round_log_spilled_bytes = 4096;
  text = ScrapeMetrics((*metrics)->port());
  EXPECT_NE(text.find("syncnorm_open_streams 12\n"), std::string::npos);
  for (const char* want :
       {"# TYPE syncnorm_round_log_bytes_total counter\n",
        "syncnorm_round_log_bytes_total 1048576\n",
        "# TYPE syncnorm_round_log_spilled_bytes_total counter\n",
        "syncnorm_round_log_spilled_bytes_total 4096\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << text;
  }
  (*metrics)->SetLoadSource({});
  text = ScrapeMetrics((*metrics)->port());
  EXPECT_EQ(text.find("\nsyncnorm_open_streams "), std::string::npos) << text;
}

TEST(MetricsTest, ABusyPortIsUnavailable) {
  auto first = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Metrics::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--metrics_listen"),
            std::string::npos);
}

}  // namespace
}  // namespace syncnorm
