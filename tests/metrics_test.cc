// The aggregator's Prometheus endpoint, scraped by a real Prometheus server
// (Debian's /usr/bin/prometheus) on loopback: after a few rounds and a
// checkpoint, Prometheus's HTTP API answers the gRPC metrics
// (go-grpc-prometheus names and labels) and syncnorm's own with the values
// the run implies. Skipped, saying why, where prometheus is not installed
// (scripts/deps.sh installs it).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "syncnorm_version.h"
#include "tests/testing/cluster.h"
#include "tests/testing/prometheus_server.h"
#include "tests/testing/scrape.h"

namespace syncnorm::testing {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// The value of an instant query's single sample, as Prometheus prints it
// ("9"), once the query has one; "" if none came within the deadline.
std::string Query(int port, const std::string& promql, absl::Time deadline) {
  const std::string path = absl::StrCat(
      "/api/v1/query?query=", absl::StrReplaceAll(promql, {{"{", "%7B"},
                                                           {"}", "%7D"},
                                                           {"\"", "%22"},
                                                           {"=", "%3D"},
                                                           {",", "%2C"},
                                                           {" ", "%20"},
                                                           {"(", "%28"},
                                                           {")", "%29"}}));
  std::string body;
  while (absl::Now() < deadline) {
    body = HttpGet(port, path);
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":
    // {...},"value":[1700000000.1,"9"]}]}}
    const size_t value = body.find("\"value\":[");
    if (value != std::string::npos) {
      const size_t open = body.find('"', body.find(',', value));
      const size_t close = body.find('"', open + 1);
      return body.substr(open + 1, close - open - 1);
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  ADD_FAILURE() << "no sample for " << promql << "; last answer: " << body;
  return "";
}

TEST(MetricsTest, PrometheusScrapesTheAggregator) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " is missing: run scripts/deps.sh";
  }
  const std::string dir = MakeScratchDir("metrics");
  auto aggregator = AggregatorProcess::Start(
      dir, {"--metrics_listen=127.0.0.1:0", "--round_timeout_ms=20000"});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  const int metrics_port = MetricsPortFromLog(dir + "/aggregator.log");
  ASSERT_GT(metrics_port, 0) << ReadFile(dir + "/aggregator.log");

  // A few rounds (2 workers, 3 layers, 4 steps) and a checkpoint.
  StackConfig config;
  config.world_size = 2;
  config.global_batch = 8;
  config.channels = {4, 4, 4};
  config.spatial = {2};
  config.steps = 4;
  ClientOptions options;
  options.address = (*aggregator)->address();
  Client client(options);
  ASSERT_TRUE(client.CreateJob(JobRequest(config, "metrics", 20000)).ok());
  WorkersOptions w;
  w.address = (*aggregator)->address();
  w.job_id = "metrics";
  w.dir = dir;
  w.timeout = absl::Seconds(60);
  auto outputs = RunWorkers(config, w);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_TRUE(client.Checkpoint("metrics", config.steps - 1).ok());
  // A membership change: rank 1 leaves from the next step.
  {
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(
        (*aggregator)->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::UpdateMembershipRequest leave;
    leave.set_job_id("metrics");
    leave.add_leave(1);
    v1::JobInfo info;
    const grpc::Status s = stub->UpdateMembership(&context, leave, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // The exposition itself, before Prometheus reads it.
  const std::string text = HttpGet(metrics_port, "/metrics");
  EXPECT_NE(text.find("grpc_server_started_total{"), std::string::npos) << text;
  EXPECT_NE(text.find("syncnorm_membership_changes_total 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("syncnorm_membership_ranks_total{change=\"left\"} 1"),
            std::string::npos)
      << text;

  const int web_port = FreeLoopbackPort();
  ASSERT_GT(web_port, 0);
  const std::string config_path = dir + "/prometheus.yml";
  std::ofstream(config_path) << absl::StrCat(
      "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      "scrape_configs:\n  - job_name: syncnorm-aggregator\n"
      "    static_configs:\n      - targets: ['127.0.0.1:",
      metrics_port, "']\n");
  auto prometheus = Subprocess::Spawn(
      {kPrometheus, absl::StrCat("--config.file=", config_path),
       absl::StrCat("--storage.tsdb.path=", dir, "/tsdb"),
       absl::StrCat("--web.listen-address=127.0.0.1:", web_port),
       "--log.level=warn"},
      dir + "/prometheus.log");
  ASSERT_TRUE(prometheus.ok()) << prometheus.status();

  const absl::Time deadline = absl::Now() + absl::Seconds(45);
  EXPECT_EQ(Query(web_port,
                  "grpc_server_handled_total{grpc_type=\"unary\","
                  "grpc_service=\"syncnorm.v1.Aggregator\","
                  "grpc_method=\"CreateJob\",grpc_code=\"OK\"}",
                  deadline),
            "1")
      << ReadFile(dir + "/prometheus.log");
  EXPECT_EQ(Query(web_port,
                  "grpc_server_started_total{grpc_type=\"bidi_stream\","
                  "grpc_method=\"Reduce\"}",
                  deadline),
            "2");
  // The workers end their streams cleanly: OK, not Canceled.
  EXPECT_EQ(Query(web_port,
                  "sum(grpc_server_handled_total{"
                  "grpc_method=\"Reduce\"})",
                  deadline),
            "2");
  EXPECT_EQ(Query(web_port,
                  "grpc_server_handled_total{grpc_method=\"Reduce\","
                  "grpc_code=\"OK\"}",
                  deadline),
            "2");
  // Every contribution and every answer, forward and backward, of every
  // rank, step and layer: one message each way (the stream's end is no
  // message, as go-grpc-prometheus counts).
  const std::string contributions =
      absl::StrCat(config.world_size * config.steps * config.layers() * 2);
  EXPECT_EQ(Query(web_port,
                  "sum(grpc_server_msg_received_total{grpc_method=\"Reduce\"})",
                  deadline),
            contributions);
  EXPECT_EQ(
      Query(web_port, "sum(grpc_server_msg_sent_total{grpc_method=\"Reduce\"})",
            deadline),
      contributions);
  EXPECT_EQ(Query(web_port,
                  "sum(grpc_server_handling_seconds_count{grpc_method="
                  "\"Checkpoint\"})",
                  deadline),
            "1");
  EXPECT_EQ(Query(web_port, "syncnorm_jobs", deadline), "1");
  EXPECT_EQ(
      Query(web_port, "syncnorm_jobs / on() syncnorm_limit{flag=\"max_jobs\"}",
            deadline),
      "0.0001");
  EXPECT_EQ(Query(web_port, "syncnorm_open_streams", deadline), "0");
  EXPECT_EQ(Query(web_port,
                  absl::StrCat("syncnorm_build_info{version=\"",
                               kSyncnormVersion, "\"}"),
                  deadline),
            "1");
  // One version per forward round: steps x layers (one group).
  EXPECT_EQ(Query(web_port, "syncnorm_state_versions_total", deadline),
            absl::StrCat(config.steps * config.layers()));
  EXPECT_EQ(Query(web_port,
                  "syncnorm_round_latency_seconds_count{phase=\"BACKWARD\","
                  "outcome=\"ok\"}",
                  deadline),
            absl::StrCat(config.steps * config.layers()));
  EXPECT_EQ(Query(web_port,
                  "syncnorm_checkpoint_duration_seconds_count{outcome=\"ok\"}",
                  deadline),
            "1");
  // Every round's record went to the round log; a few KB of them fit in
  // its default 64 MiB, so none went on to RocksDB for room.
  EXPECT_EQ(
      Query(web_port, "syncnorm_round_log_bytes_total > bool 0", deadline),
      "1");
  EXPECT_EQ(Query(web_port, "syncnorm_round_log_spilled_bytes_total", deadline),
            "0");

  (*prometheus)->Signal(SIGTERM);
  EXPECT_TRUE((*prometheus)->Wait(absl::Seconds(20)).ok());
  auto code = (*aggregator)->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// A client that is done with its job ends its Reduce stream cleanly (a
// half-close, then the server's OK), so the stream counts OK, not
// Canceled: an error-ratio alert stays quiet in normal operation. Needs no
// Prometheus: the exposition is read directly.
TEST(MetricsTest, AClientsCleanEndOfAStreamCountsOK) {
  const std::string dir = MakeScratchDir("metrics-clean-end");
  auto aggregator =
      AggregatorProcess::Start(dir, {"--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  const int metrics_port = MetricsPortFromLog(dir + "/aggregator.log");
  ASSERT_GT(metrics_port, 0) << ReadFile(dir + "/aggregator.log");
  StackConfig config;
  config.world_size = 1;
  config.channels = {3};
  ClientOptions options;
  options.address = (*aggregator)->address();
  Client client(options);
  ASSERT_TRUE(client.CreateJob(JobRequest(config, "clean", 20000)).ok());
  {
    std::unique_ptr<NodeGroup> group = client.NewNodeGroup("clean", 0);
    Moments local = Moments::Zero(3);
    local.count = 2;
    local.m2 = {1, 2, 3};
    for (int64_t step = 1; step <= 3; ++step) {
      ASSERT_TRUE(group->SyncForward(0, step, local).ok());
    }
    const std::string text = HttpGet(metrics_port, "/metrics");
    EXPECT_NE(text.find("\nsyncnorm_open_streams 1\n"), std::string::npos)
        << text;
  }
  std::string text = HttpGet(metrics_port, "/metrics");
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       HandledCalls(text, "Reduce") < 1 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(20));
    text = HttpGet(metrics_port, "/metrics");
  }
  EXPECT_EQ(HandledCalls(text, "Reduce", "OK"), 1) << text;
  EXPECT_EQ(HandledCalls(text, "Reduce"), 1) << text;
  EXPECT_NE(text.find("\nsyncnorm_open_streams 0\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\nsyncnorm_jobs 1\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace syncnorm::testing
