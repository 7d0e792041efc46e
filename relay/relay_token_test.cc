// The relay's own token against an aggregator that checks tokens: with the
// `relay` scope its blocks are taken; with a job's token only, the shard
// refuses each block and the relay sends its ranks through one by one, so
// the round still completes. The shard's own metrics count what it got.
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "relay/relay_server.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/scrape.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

using testing::Subprocess;

constexpr int kWorld = 8;
constexpr char kAdmin[] = "admin-token-0123456789abcdef";
constexpr char kJobOnly[] = "job-token-0123456789abcdef";
constexpr char kRelay[] = "relay-token-0123456789abcdef";

class RelayTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::MakeScratchDir("relay_token");
    const std::string tokens = absl::StrCat(dir, "/tokens");
    {
      std::ofstream out(tokens);
      out << kAdmin << " admin\n"
          << kJobOnly << " job:j\n"
          << kRelay << " relay,job:j\n";
    }
    const std::string port_file = absl::StrCat(dir, "/port");
    const std::string log = absl::StrCat(dir, "/aggregator.log");
    absl::StatusOr<std::unique_ptr<Subprocess>> aggregator = Subprocess::Spawn(
        {testing::Runfile("server/syncnorm-aggregator"), "--listen=127.0.0.1:0",
         "--port_file=" + port_file, "--tokens_file=" + tokens,
         "--metrics_listen=127.0.0.1:0"},
        log);
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    int port = 0;
    const absl::Time until = absl::Now() + absl::Seconds(20);
    while (
        absl::Now() < until &&
        !absl::SimpleAtoi(
            absl::StripAsciiWhitespace(testing::ReadFile(port_file)), &port)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_GT(port, 0) << "the aggregator did not start";
    metrics_port_ = testing::MetricsPortFromLog(log);
    ASSERT_GT(metrics_port_, 0) << testing::ReadFile(log);
    address_ = absl::StrCat("127.0.0.1:", port);
    shard_ = v1::Aggregator::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    v1::CreateJobRequest request;
    request.set_job_id("j");
    request.set_world_size(kWorld);
    request.set_round_timeout_ms(10000);
    request.add_layers()->set_num_features(2);
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdmin));
    v1::JobInfo info;
    const grpc::Status s = shard_->CreateJob(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(info.accepts_relay_blocks());
  }

  // One FORWARD round of every rank through a relay that presents
  // `token`; every rank's count, and the relay's counters.
  RelayCounters Round(const std::string& token, int64_t step) {
    RelayOptions options;
    options.listen = "127.0.0.1:0";
    options.upstream = address_;
    options.upstream_token = token;
    options.close_read_floods = false;  // in-process
    absl::StatusOr<std::unique_ptr<RelayServer>> relay =
        RelayServer::Start(options);
    EXPECT_TRUE(relay.ok()) << relay.status();
    if (!relay.ok()) return {};
    auto stub = v1::Aggregator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*relay)->port()),
                            grpc::InsecureChannelCredentials()));
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        v1::Contribution c;
        c.set_job_id("j");
        c.set_step(step);
        c.set_phase(v1::FORWARD);
        c.set_rank(r);
        c.mutable_moments()->set_count(r + 1);
        for (int ch = 0; ch < 2; ++ch) {
          c.mutable_moments()->add_mean(r * 0.5 + ch);
          c.mutable_moments()->add_m2(r + ch + 1.0);
        }
        grpc::ClientContext context;
        context.set_deadline(
            absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
        v1::RoundResult result;
        const grpc::Status s = stub->ReduceOnce(&context, c, &result);
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.error_message();
        // 1 + 2 + ... + 8 rows: every rank counted once.
        EXPECT_EQ(result.moments().count(), kWorld * (kWorld + 1) / 2);
      });
    }
    for (auto& t : threads) t.join();
    return (*relay)->counters();
  }

  // ReduceOnce calls the shard answered with `code`.
  double ShardCalls(const std::string& code) const {
    return testing::HandledCalls(testing::ScrapeMetrics(metrics_port_),
                                 "ReduceOnce", code);
  }

  std::unique_ptr<Subprocess> aggregator_;
  int metrics_port_ = 0;
  std::string address_;
  std::unique_ptr<v1::Aggregator::Stub> shard_;
};

TEST_F(RelayTokenTest, ARelayTokenSendsBlocksAJobTokenSendsRanks) {
  const RelayCounters relayed = Round(kRelay, 0);
  EXPECT_EQ(relayed.blocks_forwarded, 1);
  EXPECT_EQ(relayed.passed_through, 0);
  // The shard itself got one contribution for the 8 ranks.
  EXPECT_EQ(ShardCalls("OK"), 1);
  // The shard refuses the block (PERMISSION_DENIED): its 8 ranks go
  // through on their own.
  const RelayCounters job_only = Round(kJobOnly, 1);
  EXPECT_EQ(job_only.blocks_forwarded, 1);
  EXPECT_EQ(job_only.passed_through, kWorld);
  EXPECT_EQ(ShardCalls("PermissionDenied"), 1);
  EXPECT_EQ(ShardCalls("OK"), 1 + kWorld);
}

}  // namespace
}  // namespace syncnorm
