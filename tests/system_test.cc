// System test: the real aggregator binary on a loopback port, real worker
// processes with uneven shards (one empty on some steps), checked against a
// float64 reference of plain batch norm over the concatenated batch.
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "tests/testing/aggregator_suite.h"
#include "tests/testing/cluster.h"
#include "tests/testing/compare.h"
#include "tests/testing/health.h"
#include "tests/testing/reference.h"

namespace syncnorm::testing {
namespace {

class SystemTest : public AggregatorSuite<SystemTest> {
 public:
  static constexpr char kScratchName[] = "system";
  static std::vector<std::string> AggregatorFlags() {
    return {"--round_timeout_ms=20000"};
  }

 protected:
  static ClientOptions Options() {
    ClientOptions o;
    o.address = aggregator().address();
    o.rpc_timeout = absl::Seconds(10);
    o.round_timeout = absl::Seconds(30);
    return o;
  }

  // Runs the config end to end and returns the worst relative error.
  static double RunAndCompare(const StackConfig& config,
                              const std::string& job_id, int local_size = 1) {
    Client client(Options());
    auto job = client.CreateJob(JobRequest(config, job_id, 20000, local_size));
    EXPECT_TRUE(job.ok()) << job.status();
    WorkersOptions w;
    w.address = aggregator().address();
    w.job_id = job_id;
    w.dir = MakeScratchDir(job_id);
    w.local_size = local_size;
    w.timeout = absl::Minutes(2);
    auto outputs = RunWorkers(config, w);
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) return INFINITY;
    const Comparison c = Compare(config, RunReference(config), *outputs);
    EXPECT_EQ(c.ranks_seen, config.world_size);
    return c.worst;
  }

  static StackConfig Small() {
    StackConfig c;
    c.world_size = 4;
    c.global_batch = 20;
    c.channels = {8, 8, 12};
    c.spatial = {4, 3};
    c.steps = 5;
    return c;
  }
};

constexpr double kMaxError = 1e-6;

TEST_F(SystemTest, TorchMomentumUnbiasedChannelsFirst) {
  StackConfig c = Small();
  EXPECT_LE(RunAndCompare(c, "torch-nchw"), kMaxError);
}

TEST_F(SystemTest, DecayMomentumBiasedChannelsLast) {
  StackConfig c = Small();
  c.mode = MomentumMode::kDecay;
  c.momentum = 0.9;
  c.biased_running_var = true;
  c.channels_last = true;
  EXPECT_LE(RunAndCompare(c, "decay-nhwc"), kMaxError);
}

TEST_F(SystemTest, CumulativeMomentumOn2DInput) {
  StackConfig c = Small();
  c.mode = MomentumMode::kCumulative;
  c.spatial = {};
  c.global_batch = 40;
  EXPECT_LE(RunAndCompare(c, "cumulative-2d"), kMaxError);
}

TEST_F(SystemTest, ThreeAndFiveDimensionalInput) {
  StackConfig c = Small();
  c.spatial = {5};
  c.fuse_relu = false;
  EXPECT_LE(RunAndCompare(c, "input-3d"), kMaxError);
  c.spatial = {2, 3, 2};
  c.channels_last = true;
  EXPECT_LE(RunAndCompare(c, "input-5d"), kMaxError);
}

TEST_F(SystemTest, GroupsNormalizeOverTheirOwnRanks) {
  StackConfig c = Small();
  c.group_size = 2;
  EXPECT_LE(RunAndCompare(c, "groups"), kMaxError);
}

TEST_F(SystemTest, ThreadsOfOneNodeMergeBeforeSending) {
  StackConfig c = Small();
  EXPECT_LE(RunAndCompare(c, "thread-node", /*local_size=*/2), kMaxError);
}

// --- Raw protocol cases, through the generated stub. ---

class ProtocolTest : public SystemTest {
 protected:
  void SetUp() override {
    channel_ = grpc::CreateChannel(aggregator().address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Aggregator::NewStub(channel_);
  }

  grpc::Status CreateJob(const std::string& id, int world, int channels,
                         int64_t timeout_ms, bool biased = false) {
    v1::CreateJobRequest r;
    r.set_job_id(id);
    r.set_world_size(world);
    r.set_round_timeout_ms(timeout_ms);
    v1::LayerSpec* l = r.add_layers();
    l->set_name("bn");
    l->set_num_features(channels);
    l->set_biased_running_var(biased);
    v1::JobInfo info;
    grpc::ClientContext ctx;
    return stub_->CreateJob(&ctx, r, &info);
  }

  static v1::Contribution Forward(const std::string& job, int64_t step,
                                  int rank, std::vector<double> mean,
                                  std::vector<double> m2, int64_t count) {
    v1::Contribution c;
    c.set_job_id(job);
    c.set_layer(0);
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.set_rank(rank);
    c.mutable_moments()->set_count(count);
    for (double v : mean) c.mutable_moments()->add_mean(v);
    for (double v : m2) c.mutable_moments()->add_m2(v);
    return c;
  }

  grpc::Status ReduceOnce(const v1::Contribution& c, v1::RoundResult* out,
                          int deadline_s = 10) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(deadline_s));
    return stub_->ReduceOnce(&ctx, c, out);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

TEST_F(ProtocolTest, MissingRankFailsEveryWaiterAtTheDeadline) {
  ASSERT_TRUE(CreateJob("deadline", 3, 2, 500).ok());
  const absl::Time start = absl::Now();
  grpc::Status s0, s1;
  std::thread t([&] {
    v1::RoundResult r;
    s1 = ReduceOnce(Forward("deadline", 0, 1, {1, 2}, {1, 1}, 2), &r);
  });
  v1::RoundResult r;
  s0 = ReduceOnce(Forward("deadline", 0, 0, {1, 2}, {1, 1}, 2), &r);
  t.join();
  const absl::Duration took = absl::Now() - start;
  for (const grpc::Status& s : {s0, s1}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_NE(s.error_message().find("2"), std::string::npos)
        << "names the missing rank: " << s.error_message();
  }
  EXPECT_LT(took, absl::Milliseconds(500) + absl::Seconds(1));
  // The same failure arrives in-band on a Reduce stream.
  grpc::ClientContext ctx;
  auto stream = stub_->Reduce(&ctx);
  ASSERT_TRUE(stream->Write(Forward("deadline", 1, 0, {1, 2}, {1, 1}, 2)));
  v1::RoundResult in_band;
  ASSERT_TRUE(stream->Read(&in_band));
  ASSERT_TRUE(in_band.has_error());
  EXPECT_EQ(in_band.error().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_GE(in_band.error().missing_ranks_size(), 1);
  stream->WritesDone();
  stream->Finish();
  // Running statistics untouched.
  v1::GetRunningStatsRequest req;
  req.set_job_id("deadline");
  v1::RunningStats stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub_->GetRunningStats(&sctx, req, &stats).ok());
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 0);
  EXPECT_EQ(stats.layers(0).running_var(0), 1.0);
}

TEST_F(ProtocolTest, RetriesGetTheSameResultAndConflictsAreRejected) {
  ASSERT_TRUE(CreateJob("retry", 2, 1, 5000).ok());
  v1::RoundResult r0, r1;
  grpc::Status s1;
  std::thread t(
      [&] { s1 = ReduceOnce(Forward("retry", 0, 1, {3.0}, {2.0}, 4), &r1); });
  ASSERT_TRUE(ReduceOnce(Forward("retry", 0, 0, {1.0}, {4.0}, 2), &r0).ok());
  t.join();
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  // Independent arithmetic: n = 6, mean = (1*2 + 3*4)/6, M2 = 4 + 2 +
  // (3-1)^2 * 2 * 4 / 6.
  const double mean = 14.0 / 6.0, m2 = 6.0 + 4.0 * 8.0 / 6.0;
  EXPECT_EQ(r0.moments().count(), 6);
  EXPECT_NEAR(r0.moments().mean(0), mean, 1e-15);
  EXPECT_NEAR(r0.moments().var(0), m2 / 6.0, 1e-15);
  v1::RoundResult again;
  ASSERT_TRUE(ReduceOnce(Forward("retry", 0, 0, {1.0}, {4.0}, 2), &again).ok());
  EXPECT_EQ(again.SerializeAsString(), r0.SerializeAsString());
  EXPECT_EQ(again.version(), 1);
  v1::RoundResult conflict;
  grpc::Status s =
      ReduceOnce(Forward("retry", 0, 0, {1.5}, {4.0}, 2), &conflict);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_NE(s.error_message().find("different"), std::string::npos)
      << s.error_message();
  // Nothing was double counted.
  v1::GetRunningStatsRequest req;
  req.set_job_id("retry");
  v1::RunningStats stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetRunningStats(&ctx, req, &stats).ok());
  EXPECT_EQ(stats.layers(0).num_batches_tracked(), 1);
  EXPECT_NEAR(stats.layers(0).running_mean(0), 0.1 * mean, 1e-15);
}

struct BadCase {
  const char* what;
  grpc::StatusCode code;
  v1::Contribution contribution;
};

TEST_F(ProtocolTest, BadRequestsGetPreciseStatusesAndTheServerServesOn) {
  ASSERT_TRUE(CreateJob("bad", 2, 2, 5000).ok());
  ASSERT_TRUE(CreateJob("single", 1, 2, 5000).ok());
  // Job specs.
  struct JobCase {
    const char* what;
    grpc::StatusCode code;
    std::string id;
    int world, channels, group;
    double momentum;
    int layers;
  };
  const JobCase job_cases[] = {
      {"empty job id", grpc::INVALID_ARGUMENT, "", 2, 2, 0, 0.1, 1},
      {"bad job id characters", grpc::INVALID_ARGUMENT, "a b/c", 2, 2, 0, 0.1,
       1},
      {"world_size 0", grpc::INVALID_ARGUMENT, "j1", 0, 2, 0, 0.1, 1},
      {"world_size negative", grpc::INVALID_ARGUMENT, "j2", -3, 2, 0, 0.1, 1},
      {"num_features 0", grpc::INVALID_ARGUMENT, "j3", 2, 0, 0, 0.1, 1},
      {"num_features negative", grpc::INVALID_ARGUMENT, "j4", 2, -1, 0, 0.1, 1},
      {"group_size not dividing", grpc::INVALID_ARGUMENT, "j5", 4, 2, 3, 0.1,
       1},
      {"group_size negative", grpc::INVALID_ARGUMENT, "j6", 4, 2, -2, 0.1, 1},
      {"momentum above 1", grpc::INVALID_ARGUMENT, "j7", 2, 2, 0, 1.5, 1},
      {"momentum NaN", grpc::INVALID_ARGUMENT, "j8", 2, 2, 0, NAN, 1},
      {"no layers", grpc::INVALID_ARGUMENT, "j9", 2, 2, 0, 0.1, 0},
      {"same id, other spec", grpc::ALREADY_EXISTS, "bad", 3, 2, 0, 0.1, 1},
  };
  for (const JobCase& c : job_cases) {
    v1::CreateJobRequest r;
    r.set_job_id(c.id);
    r.set_world_size(c.world);
    r.set_group_size(c.group);
    for (int i = 0; i < c.layers; ++i) {
      v1::LayerSpec* l = r.add_layers();
      l->set_num_features(c.channels);
      l->set_momentum(c.momentum);
    }
    v1::JobInfo info;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->CreateJob(&ctx, r, &info);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << c.what;
  }
  // Contributions.
  auto good = [] { return Forward("bad", 0, 0, {1, 2}, {1, 1}, 2); };
  std::vector<BadCase> cases;
  auto add = [&cases, &good](const char* what, grpc::StatusCode code,
                             auto mutate) {
    v1::Contribution c = good();
    mutate(c);
    cases.push_back({what, code, c});
  };
  add("unknown job", grpc::NOT_FOUND, [](auto& c) { c.set_job_id("nope"); });
  add("layer out of range", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.set_layer(1); });
  add("negative layer", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.set_layer(-1); });
  add("rank = world", grpc::INVALID_ARGUMENT, [](auto& c) { c.set_rank(2); });
  add("negative rank", grpc::INVALID_ARGUMENT, [](auto& c) { c.set_rank(-1); });
  add("negative step", grpc::INVALID_ARGUMENT, [](auto& c) { c.set_step(-4); });
  add("phase unspecified", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.set_phase(v1::PHASE_UNSPECIFIED); });
  add("no payload", grpc::INVALID_ARGUMENT, [](auto& c) { c.clear_moments(); });
  add("grad sums in a forward", grpc::INVALID_ARGUMENT, [](auto& c) {
    c.mutable_grad_sums()->add_sum_dy(1);
    c.mutable_grad_sums()->add_sum_dy(1);
    c.mutable_grad_sums()->add_sum_dy_xmu(1);
    c.mutable_grad_sums()->add_sum_dy_xmu(1);
  });
  add("too few channels", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.mutable_moments()->mutable_mean()->RemoveLast(); });
  add("too many channels", grpc::INVALID_ARGUMENT, [](auto& c) {
    c.mutable_moments()->add_mean(0);
    c.mutable_moments()->add_m2(0);
  });
  add("negative count", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.mutable_moments()->set_count(-2); });
  add("NaN mean", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.mutable_moments()->set_mean(0, NAN); });
  add("Inf m2", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.mutable_moments()->set_m2(1, INFINITY); });
  add("negative m2", grpc::INVALID_ARGUMENT,
      [](auto& c) { c.mutable_moments()->set_m2(0, -1); });
  add("backward with NaN", grpc::INVALID_ARGUMENT, [](auto& c) {
    c.set_phase(v1::BACKWARD);
    c.mutable_grad_sums()->add_sum_dy(NAN);
    c.mutable_grad_sums()->add_sum_dy(1);
    c.mutable_grad_sums()->add_sum_dy_xmu(1);
    c.mutable_grad_sums()->add_sum_dy_xmu(1);
  });
  add("global count 1 with unbiased var", grpc::FAILED_PRECONDITION,
      [](auto& c) {
        c.set_job_id("single");
        c.mutable_moments()->set_count(1);
        c.mutable_moments()->set_m2(0, 0);
        c.mutable_moments()->set_m2(1, 0);
      });
  for (const BadCase& c : cases) {
    v1::RoundResult r;
    grpc::Status s = ReduceOnce(c.contribution, &r);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_FALSE(s.error_message().empty()) << c.what;
  }
  // A step long superseded.
  for (int64_t step = 0; step < 64; ++step) {
    v1::RoundResult r;
    ASSERT_TRUE(
        ReduceOnce(Forward("single", step + 1, 0, {1, 2}, {1, 1}, 2), &r).ok());
  }
  v1::RoundResult r;
  grpc::Status stale =
      ReduceOnce(Forward("single", 1, 0, {5, 5}, {1, 1}, 2), &r);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << stale.error_message();
  // Unknown job in the other calls.
  v1::GetJobRequest get;
  get.set_job_id("missing-job");
  v1::JobInfo info;
  grpc::ClientContext gctx;
  EXPECT_EQ(stub_->GetJob(&gctx, get, &info).error_code(), grpc::NOT_FOUND);
  // The server still serves.
  auto health = CheckHealth(channel_);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, 1) << "SERVING";
  ASSERT_TRUE(CreateJob("after-bad", 1, 2, 5000).ok());
  v1::RoundResult ok;
  EXPECT_TRUE(
      ReduceOnce(Forward("after-bad", 0, 0, {1, 2}, {1, 1}, 2), &ok).ok());
}

}  // namespace
}  // namespace syncnorm::testing
