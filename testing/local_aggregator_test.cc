// LocalAggregator's contract, seen from a plain gRPC client of the wire
// contract (generated stubs, no syncnorm client code): serving when Start
// returns, a round merged as a float64 reference merges it, state in memory
// unless a data dir is given, stopped when destroyed, clear errors.
#include "testing/local_aggregator.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/health.h"

namespace syncnorm::testing {
namespace {

using ::syncnorm::v1::Aggregator;

std::string ScratchDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

std::unique_ptr<LocalAggregator> StartOrDie(LocalAggregatorOptions options) {
  absl::StatusOr<std::unique_ptr<LocalAggregator>> started =
      LocalAggregator::Start(std::move(options));
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? *std::move(started) : nullptr;
}

std::shared_ptr<grpc::Channel> ChannelTo(const LocalAggregator& aggregator) {
  return grpc::CreateChannel(aggregator.address(),
                             grpc::InsecureChannelCredentials());
}

grpc::Status Call(
    const std::shared_ptr<grpc::Channel>& channel,
    const std::function<grpc::Status(Aggregator::Stub&, grpc::ClientContext*)>&
        call) {
  auto stub = Aggregator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  return call(*stub, &context);
}

grpc::Status CreateJob(const std::shared_ptr<grpc::Channel>& channel,
                       const std::string& job_id, int world_size,
                       int channels) {
  v1::CreateJobRequest request;
  request.set_job_id(job_id);
  request.set_world_size(world_size);
  v1::LayerSpec* layer = request.add_layers();
  layer->set_name("bn");
  layer->set_num_features(channels);
  v1::JobInfo info;
  return Call(channel, [&](Aggregator::Stub& stub, grpc::ClientContext* c) {
    return stub.CreateJob(c, request, &info);
  });
}

grpc::Status GetJob(const std::shared_ptr<grpc::Channel>& channel,
                    const std::string& job_id, v1::JobInfo* info) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Call(channel, [&](Aggregator::Stub& stub, grpc::ClientContext* c) {
    return stub.GetJob(c, request, info);
  });
}

// Per-channel count, mean and M2 of rows x[n][c], two-pass in float64.
v1::Moments TwoPassMoments(const std::vector<std::vector<double>>& x,
                           int channels) {
  v1::Moments moments;
  moments.set_count(static_cast<int64_t>(x.size()));
  for (int c = 0; c < channels; ++c) {
    double sum = 0;
    for (const auto& row : x) sum += row[c];
    const double mean = x.empty() ? 0 : sum / x.size();
    double m2 = 0;
    for (const auto& row : x) m2 += (row[c] - mean) * (row[c] - mean);
    moments.add_mean(mean);
    moments.add_m2(m2);
  }
  return moments;
}

TEST(LocalAggregatorTest, ServesOnLoopbackWhenStartReturns) {
  std::unique_ptr<LocalAggregator> aggregator = StartOrDie({});
  ASSERT_NE(aggregator, nullptr);
  const std::string address = aggregator->address();
  absl::string_view port = address;
  int number = 0;
  EXPECT_TRUE(absl::ConsumePrefix(&port, "127.0.0.1:") &&
              absl::SimpleAtoi(port, &number) && number > 0 && number < 65536)
      << address;
  // No waiting: health is SERVING on the first call.
  absl::StatusOr<int> health = CheckHealth(ChannelTo(*aggregator));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1);
}

TEST(LocalAggregatorTest, MergesARoundAsAFloat64ReferenceOnTheWholeBatch) {
  std::unique_ptr<LocalAggregator> aggregator = StartOrDie({});
  ASSERT_NE(aggregator, nullptr);
  std::shared_ptr<grpc::Channel> channel = ChannelTo(*aggregator);
  constexpr int kChannels = 3;
  ASSERT_TRUE(CreateJob(channel, "round", 2, kChannels).ok());

  // Uneven shards of one batch, offset so the mean is far from zero.
  std::mt19937_64 random(7);
  std::normal_distribution<double> normal(5.0, 2.0);
  std::vector<std::vector<std::vector<double>>> shards(2);
  for (int rank = 0; rank < 2; ++rank) {
    shards[rank].resize(rank == 0 ? 5 : 11, std::vector<double>(kChannels));
    for (auto& row : shards[rank]) {
      for (double& v : row) v = normal(random);
    }
  }
  std::vector<v1::RoundResult> results(2);
  std::vector<grpc::Status> statuses(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      v1::Contribution contribution;
      contribution.set_job_id("round");
      contribution.set_layer(0);
      contribution.set_step(1);
      contribution.set_phase(v1::FORWARD);
      contribution.set_rank(rank);
      *contribution.mutable_moments() = TwoPassMoments(shards[rank], kChannels);
      statuses[rank] =
          Call(channel, [&](Aggregator::Stub& stub, grpc::ClientContext* c) {
            return stub.ReduceOnce(c, contribution, &results[rank]);
          });
    });
  }
  for (std::thread& t : ranks) t.join();

  std::vector<std::vector<double>> batch = shards[0];
  batch.insert(batch.end(), shards[1].begin(), shards[1].end());
  const v1::Moments whole = TwoPassMoments(batch, kChannels);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank].error_message();
    ASSERT_TRUE(results[rank].has_moments());
    const v1::GlobalMoments& global = results[rank].moments();
    EXPECT_EQ(global.count(), 16);
    ASSERT_EQ(global.mean_size(), kChannels);
    ASSERT_EQ(global.var_size(), kChannels);
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_NEAR(global.mean(c), whole.mean(c),
                  1e-12 * std::abs(whole.mean(c)));
      const double var = whole.m2(c) / 16;  // biased, as normalization uses
      EXPECT_NEAR(global.var(c), var, 1e-12 * var);
    }
  }
}

TEST(LocalAggregatorTest, KeepsStateInMemoryWithoutADataDir) {
  {
    std::unique_ptr<LocalAggregator> first = StartOrDie({});
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(CreateJob(ChannelTo(*first), "gone", 2, 4).ok());
  }
  std::unique_ptr<LocalAggregator> second = StartOrDie({});
  ASSERT_NE(second, nullptr);
  v1::JobInfo info;
  EXPECT_EQ(GetJob(ChannelTo(*second), "gone", &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(LocalAggregatorTest, KeepsStateInItsDataDirAcrossInstances) {
  LocalAggregatorOptions options;
  options.data_dir = ScratchDir("kept/state");  // parents created too
  {
    std::unique_ptr<LocalAggregator> first = StartOrDie(options);
    ASSERT_NE(first, nullptr);
    ASSERT_TRUE(CreateJob(ChannelTo(*first), "kept", 3, 8).ok());
    // The folder is taken while the first one runs.
    absl::StatusOr<std::unique_ptr<LocalAggregator>> rival =
        LocalAggregator::Start(options);
    EXPECT_FALSE(rival.ok());
  }
  std::unique_ptr<LocalAggregator> second = StartOrDie(options);
  ASSERT_NE(second, nullptr);
  v1::JobInfo info;
  grpc::Status got = GetJob(ChannelTo(*second), "kept", &info);
  ASSERT_TRUE(got.ok()) << got.error_message();
  EXPECT_EQ(info.world_size(), 3);
  ASSERT_EQ(info.layers_size(), 1);
  EXPECT_EQ(info.layers(0).num_features(), 8);
}

TEST(LocalAggregatorTest, TwoAtOnceAreSeparateServers) {
  std::unique_ptr<LocalAggregator> a = StartOrDie({});
  std::unique_ptr<LocalAggregator> b = StartOrDie({});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->address(), b->address());
  ASSERT_TRUE(CreateJob(ChannelTo(*a), "only-on-a", 2, 2).ok());
  v1::JobInfo info;
  EXPECT_EQ(GetJob(ChannelTo(*b), "only-on-a", &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(LocalAggregatorTest, StopsServingWhenDestroyed) {
  std::unique_ptr<LocalAggregator> aggregator = StartOrDie({});
  ASSERT_NE(aggregator, nullptr);
  const std::string address = aggregator->address();
  aggregator.reset();
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  EXPECT_FALSE(channel->WaitForConnected(std::chrono::system_clock::now() +
                                         std::chrono::seconds(1)));
}

TEST(LocalAggregatorTest, RefusesBadOptionsClearly) {
  LocalAggregatorOptions zero_timeout;
  zero_timeout.round_timeout = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<LocalAggregator>> refused =
      LocalAggregator::Start(zero_timeout);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("round_timeout"), std::string::npos)
      << refused.status();

  LocalAggregatorOptions file_as_dir;
  file_as_dir.data_dir = ScratchDir("a-file");
  std::ofstream(file_as_dir.data_dir) << "not a folder\n";
  refused = LocalAggregator::Start(file_as_dir);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(file_as_dir.data_dir),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace syncnorm::testing
