// Graceful shutdown of the real binary: on SIGTERM health turns
// NOT_SERVING, new rounds are refused (UNAVAILABLE), the round in flight
// completes when its missing rank arrives within the grace, the process
// exits 0 without waiting out the grace, and a restart on the same data_dir
// has the completed round applied.
#include <signal.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/cluster.h"
#include "tests/testing/health.h"
#include "tests/testing/subprocess.h"

namespace syncnorm {
namespace {

using ::syncnorm::testing::AggregatorProcess;
using ::syncnorm::testing::CheckHealth;
using ::syncnorm::testing::MakeScratchDir;

v1::Contribution Forward(int64_t step, int rank) {
  v1::Contribution c;
  c.set_job_id("drain");
  c.set_layer(0);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(2);
  c.mutable_moments()->add_mean(rank == 0 ? 1.0 : 3.0);
  c.mutable_moments()->add_m2(0.0);
  return c;
}

using Stream = grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>;

TEST(ShutdownTest, FinishesTheRoundsInFlightRefusesNewOnesAndExitsZero) {
  const std::string dir = MakeScratchDir("shutdown");
  auto server = AggregatorProcess::Start(dir, {"--shutdown_grace_ms=20000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Aggregator::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::CreateJobRequest job;
    job.set_job_id("drain");
    job.set_world_size(2);
    job.set_round_timeout_ms(30000);
    v1::LayerSpec* layer = job.add_layers();
    layer->set_num_features(1);
    layer->set_momentum(1.0);  // running mean = the batch's
    v1::JobInfo info;
    ASSERT_TRUE(stub->CreateJob(&context, job, &info).ok());
  }

  // Both ranks' streams are open; rank 0 waits in the round of step 1.
  grpc::ClientContext context0, context1;
  std::unique_ptr<Stream> rank0 = stub->Reduce(&context0);
  std::unique_ptr<Stream> rank1 = stub->Reduce(&context1);
  ASSERT_TRUE(rank0->Write(Forward(1, 0)));
  absl::SleepFor(absl::Milliseconds(300));

  const absl::Time sigterm = absl::Now();
  (*server)->process().Signal(SIGTERM);

  // NOT_SERVING, asked on a new connection.
  int health = -1;
  for (int i = 0; i < 100 && health != 2; ++i) {
    auto fresh = grpc::CreateChannel((*server)->address(),
                                     grpc::InsecureChannelCredentials());
    health = CheckHealth(fresh).value_or(-1);
    if (health != 2) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(health, 2);

  // A brand-new round is refused in-band; the stream stays usable.
  ASSERT_TRUE(rank1->Write(Forward(2, 1)));
  v1::RoundResult refused;
  ASSERT_TRUE(rank1->Read(&refused));
  EXPECT_EQ(refused.step(), 2);
  ASSERT_TRUE(refused.has_error());
  EXPECT_EQ(refused.error().code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(refused.error().message(), "shutting down"))
      << refused.error().message();

  // The missing rank completes the round in flight, for both.
  ASSERT_TRUE(rank1->Write(Forward(1, 1)));
  for (Stream* s : {rank0.get(), rank1.get()}) {
    v1::RoundResult result;
    ASSERT_TRUE(s->Read(&result));
    EXPECT_EQ(result.step(), 1);
    ASSERT_TRUE(result.has_moments()) << result.error().message();
    EXPECT_DOUBLE_EQ(result.moments().mean(0), 2.0);
    // Then the server ends the stream so the client can go elsewhere.
    EXPECT_FALSE(s->Read(&result));
  }
  EXPECT_EQ(rank0->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  rank1->Finish();

  // Exit 0, well before the 20 s grace: nothing was left in flight.
  absl::StatusOr<int> code = (*server)->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_LT(absl::Now() - sigterm, absl::Seconds(10));

  // The round was applied and stored.
  auto again = AggregatorProcess::Start(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  auto stub2 = v1::Aggregator::NewStub(grpc::CreateChannel(
      (*again)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetRunningStatsRequest request;
  request.set_job_id("drain");
  v1::RunningStats stats;
  ASSERT_TRUE(stub2->GetRunningStats(&context, request, &stats).ok());
  ASSERT_EQ(stats.layers_size(), 1);
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 1);
  EXPECT_DOUBLE_EQ(stats.layers(0).running_mean(0), 2.0);
  EXPECT_EQ((*again)->Stop().value_or(-1), 0);
}

}  // namespace
}  // namespace syncnorm
