#include "server/rpc/proto_convert.h"

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_status.h"

namespace syncnorm {
namespace {

TEST(ProtoConvertTest, JobSpecRoundTrip) {
  v1::CreateJobRequest r;
  r.set_job_id("j");
  r.set_world_size(4);
  r.set_group_size(2);
  r.set_round_timeout_ms(1500);
  v1::LayerSpec* l = r.add_layers();
  l->set_name("bn");
  l->set_num_features(2);
  l->set_momentum_mode(v1::MOMENTUM_CUMULATIVE);
  l->set_biased_running_var(true);
  l->set_no_running_stats(true);
  l->add_initial_running_mean(1);
  l->add_initial_running_mean(2);
  JobSpec spec = JobSpecFromProto(r);
  EXPECT_EQ(spec.round_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(spec.layers[0].rule.mode, MomentumMode::kCumulative);
  EXPECT_FALSE(spec.layers[0].rule.track);
  EXPECT_TRUE(spec.layers[0].rule.biased_var);
  v1::JobInfo info;
  JobSnapshot job;
  job.spec = spec;
  job.committed_step = 7;
  JobInfoToProto(job, info);
  EXPECT_EQ(info.committed_step(), 7);
  EXPECT_EQ(info.round_timeout_ms(), 1500);
  EXPECT_EQ(info.layers(0).SerializeAsString(), l->SerializeAsString());
}

TEST(ProtoConvertTest, ContributionAndResult) {
  v1::Contribution c;
  c.set_job_id("j");
  c.set_layer(1);
  c.set_step(9);
  c.set_phase(v1::BACKWARD);
  c.set_rank(3);
  c.mutable_grad_sums()->add_sum_dy(1.5);
  c.mutable_grad_sums()->add_sum_dy_xmu(-2);
  Contribution d = ContributionFromProto(std::move(c));
  EXPECT_EQ(d.phase, Phase::kBackward);
  ASSERT_TRUE(std::holds_alternative<GradSums>(d.payload));
  EXPECT_EQ(std::get<GradSums>(d.payload).sum_dy_xmu[0], -2);

  RoundOutcome ok;
  ok.grad_sums = std::get<GradSums>(d.payload);
  ok.version = 4;
  v1::RoundResult result;
  RoundResultToProto(d, ok, result);
  EXPECT_EQ(result.step(), 9);
  EXPECT_EQ(result.version(), 4);
  EXPECT_EQ(result.grad_sums().sum_dy(0), 1.5);

  RoundOutcome failed;
  failed.status = absl::DeadlineExceededError("late");
  failed.missing_ranks = {2, 3};
  v1::RoundResult error;
  RoundResultToProto(d, failed, error);
  EXPECT_EQ(error.error().code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(error.error().missing_ranks_size(), 2);
  EXPECT_EQ(error.layer(), 1);

  v1::Contribution empty;
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      ContributionFromProto(std::move(empty)).payload));
}

TEST(GrpcStatusTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  grpc::Status s = ToGrpcStatus(absl::FailedPreconditionError("stale"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "stale");
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace syncnorm
