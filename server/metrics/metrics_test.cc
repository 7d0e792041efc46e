#include "server/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "syncnorm_version.h"
#include "tests/testing/scrape.h"

namespace syncnorm {
namespace {

using ::syncnorm::testing::Sample;
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
  // Two stuck channels flagged, one cleared; one rank's NaN refused.
  StatsHealthReport flag;
  flag.flag.kind = HealthKind::kStuckChannel;
  observer->OnStatsHealth(flag);
  observer->OnStatsHealth(flag);
  flag.raised = false;
  observer->OnStatsHealth(flag);
  observer->OnNonFinite("j", 3);

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
           "syncnorm_stats_health_flags{kind=\"stuck_channel\"} 1",
           "syncnorm_stats_health_flags{kind=\"mean_shift\"} 0",
           "syncnorm_stats_health_flags_raised_total{kind=\"stuck_channel\"} 2",
           "syncnorm_nonfinite_contributions_total 1",
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

// What /proc and the process's own actions say, against the gauges: RSS
// from /proc/self/status (the gauges read statm), files the test opens,
// memory it allocates and frees, CPU it spends, and the time it started.
TEST(MetricsTest, ServesTheProcessMemoryCpuAndFiles) {
  const double started_before =
      absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  auto metrics = Metrics::Start("127.0.0.1:0");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  auto scrape = [&](const std::string& series) {
    std::optional<double> v = Sample(ScrapeMetrics((*metrics)->port()), series);
    EXPECT_TRUE(v.has_value()) << series;
    return v.value_or(-1);
  };
  constexpr double kMiB = 1 << 20;

  // The kernel's own account of resident memory, in another file.
  int64_t status_rss_kb = -1;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) {
        status_rss_kb = std::stoll(line.substr(6));
      }
    }
  }
  ASSERT_GT(status_rss_kb, 0);
  EXPECT_NEAR(scrape("process_resident_memory_bytes") / kMiB,
              status_rss_kb / 1024.0, 16);
  EXPECT_GE(scrape("process_virtual_memory_bytes"),
            scrape("process_resident_memory_bytes"));

  const double fds = scrape("process_open_fds");
  std::vector<int> opened;
  for (int i = 0; i < 10; ++i) opened.push_back(::dup(0));
  EXPECT_EQ(scrape("process_open_fds"), fds + 10);
  for (int fd : opened) ::close(fd);
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  EXPECT_EQ(scrape("process_max_fds"), static_cast<double>(files.rlim_cur));

  // 64 MiB allocated and touched: counted as allocated while held. Under a
  // sanitizer, whose allocator serves malloc, there is no glibc heap to
  // report.
  const std::string allocated = "syncnorm_heap_bytes{state=\"allocated\"}";
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_FALSE(
      Sample(ScrapeMetrics((*metrics)->port()), allocated).has_value());
#else
  const double heap = scrape(allocated);
  EXPECT_GE(scrape("syncnorm_heap_bytes{state=\"free\"}"), 0);
  {
    std::vector<char> block(64 << 20, 1);
    EXPECT_GE(scrape(allocated) - heap, 64 * kMiB);
    EXPECT_LE(scrape(allocated) - heap, 72 * kMiB);
  }
  EXPECT_LT(scrape(allocated) - heap, 8 * kMiB);
#endif

  // CPU this thread spends shows in the counter. Spent by the thread's own
  // clock, not the wall's: on a shared machine 300 ms of wall time may
  // give this thread far less of a core.
  const double cpu = scrape("process_cpu_seconds_total");
  const auto thread_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  const absl::Duration spent = thread_cpu();
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  volatile uint64_t sink = 0;
  while (thread_cpu() - spent < absl::Milliseconds(150) &&
         absl::Now() < give_up) {
    sink = sink + 1;
  }
  EXPECT_GE(scrape("process_cpu_seconds_total") - cpu, 0.1);

  // Started before this test began (the test binary's own start), and not
  // in the future.
  const double start = scrape("process_start_time_seconds");
  EXPECT_LE(start, started_before + 1);
  EXPECT_GT(start, started_before - 600);
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
