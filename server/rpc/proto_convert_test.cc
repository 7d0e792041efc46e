#include "server/rpc/proto_convert.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

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
  // A relay sends blocks only to a server that says it takes them.
  EXPECT_TRUE(info.accepts_relay_blocks());
  EXPECT_EQ(info.layers(0).SerializeAsString(), l->SerializeAsString());
}

// The ranks of flattened (first, last) pairs, expanded here.
std::vector<int> Expand(const google::protobuf::RepeatedField<int32_t>& runs) {
  std::vector<int> out;
  for (int i = 0; i + 1 < runs.size(); i += 2) {
    for (int r = runs[i]; r <= runs[i + 1]; ++r) out.push_back(r);
  }
  return out;
}

std::vector<int> AllBut0(int world) {
  std::vector<int> out;
  for (int r = 1; r < world; ++r) out.push_back(r);
  return out;
}

// Issue 32: a job of 65,536 ranks whose every rank but 0 left and joined
// back 61 times answered GetJob with 17 MB of rank lists. Its sets go as
// runs now: the whole answer is a few kB, and each set reads back.
TEST(ProtoConvertTest, AWideMembershipGoesAsRuns) {
  constexpr int kWorld = 65536;
  Membership m(kWorld, {});
  const std::vector<int> others = AllBut0(kWorld);
  std::vector<int> every = others;
  every.insert(every.begin(), 0);
  for (int i = 0; i < 61; ++i) {
    MembershipRequest change;
    change.step = i + 1;  // one step each: changes of one step amend
    (i % 2 == 0 ? change.leave : change.join) = others;
    absl::StatusOr<Membership> next = m.Apply(change, kWorld, 0, -1, "wide");
    ASSERT_TRUE(next.ok()) << next.status();
    m = *std::move(next);
  }
  v1::Membership out;
  MembershipToProto(m.history(), out);
  EXPECT_LE(out.ByteSizeLong(), 4096u);
  EXPECT_EQ(out.version(), 61);
  EXPECT_TRUE(out.members().empty());
  EXPECT_EQ(Expand(out.member_runs()), std::vector<int>{0});
  ASSERT_EQ(out.history_size(), 62);
  for (int v = 0; v < 62; ++v) {
    const v1::MembershipChange& c = out.history(v);
    EXPECT_EQ(c.version(), v);
    EXPECT_TRUE(c.members().empty() && c.joined().empty() && c.left().empty() &&
                c.removed().empty());
    const bool all = v % 2 == 0;  // version 0 and every join
    EXPECT_EQ(Expand(c.member_runs()), all ? every : std::vector<int>{0})
        << "version " << v;
    EXPECT_EQ(Expand(c.joined_runs()),
              all && v > 0 ? others : std::vector<int>())
        << "version " << v;
    EXPECT_EQ(Expand(c.left_runs()), all ? std::vector<int>() : others)
        << "version " << v;
    EXPECT_TRUE(c.removed_runs().empty());
  }
}

// A narrow history goes as runs and as the rank lists that readers before
// runs read.
TEST(ProtoConvertTest, ANarrowMembershipGoesAsRunsAndLists) {
  Membership m(8, {});
  MembershipRequest change;
  change.leave = {1, 2, 3, 6};
  change.remove = {7};
  absl::StatusOr<Membership> next = m.Apply(change, 8, 4, 3, "narrow");
  ASSERT_TRUE(next.ok()) << next.status();
  v1::Membership out;
  MembershipToProto(next->history(), out);
  EXPECT_EQ(std::vector<int>(out.members().begin(), out.members().end()),
            (std::vector<int>{0, 4, 5}));
  EXPECT_EQ(Expand(out.member_runs()), (std::vector<int>{0, 4, 5}));
  EXPECT_EQ(out.member_runs_size(), 4);  // [0, 0], [4, 5]
  const v1::MembershipChange& c = out.history(1);
  EXPECT_EQ(c.step(), 4);
  EXPECT_EQ(std::vector<int>(c.left().begin(), c.left().end()),
            (std::vector<int>{1, 2, 3, 6}));
  EXPECT_EQ(Expand(c.left_runs()), (std::vector<int>{1, 2, 3, 6}));
  EXPECT_EQ(Expand(c.removed_runs()), std::vector<int>{7});
  EXPECT_EQ(std::vector<int>(c.removed().begin(), c.removed().end()),
            std::vector<int>{7});
}

TEST(ProtoConvertTest, ContributionAndResult) {
  v1::Contribution c;
  c.set_job_id("j");
  c.set_layer(1);
  c.set_step(9);
  c.set_phase(v1::BACKWARD);
  c.set_rank(3);
  c.set_backward_index(2);
  c.mutable_grad_sums()->add_sum_dy(1.5);
  c.mutable_grad_sums()->add_sum_dy_xmu(-2);
  Contribution d = ContributionFromProto(std::move(c));
  EXPECT_EQ(d.phase, Phase::kBackward);
  EXPECT_EQ(d.backward, 2);
  ASSERT_TRUE(std::holds_alternative<GradSums>(d.payload));
  EXPECT_EQ(std::get<GradSums>(d.payload).sum_dy_xmu[0], -2);

  RoundOutcome ok;
  ok.grad_sums = std::get<GradSums>(d.payload);
  ok.version = 4;
  v1::RoundResult result;
  RoundResultToProto(d, ok, result);
  EXPECT_EQ(result.step(), 9);
  EXPECT_EQ(result.backward_index(), 2);  // the client matches results by it
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
  EXPECT_EQ(error.backward_index(), 2);

  v1::Contribution empty;
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      ContributionFromProto(std::move(empty)).payload));
}

v1::RelayBlock BlockOfRuns(std::vector<int> runs, int fingerprints) {
  v1::RelayBlock b;
  b.set_first_position(8);
  b.set_positions(8);
  b.set_fingerprint_kind(static_cast<int>(kFingerprintKind));
  for (int r : runs) b.add_rank_runs(r);
  for (int i = 0; i < fingerprints; ++i) b.add_fingerprints(100 + i);
  return b;
}

TEST(ProtoConvertTest, ARelayBlocksRunsAreListedWithTheirFingerprints) {
  absl::StatusOr<RelayBlock> b =
      RelayBlockFromProto(BlockOfRuns({8, 10, 12, 12, 14, 15}, 6));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_position, 8);
  EXPECT_EQ(b->positions, 8);
  EXPECT_EQ(b->ranks, (std::vector<int>{8, 9, 10, 12, 14, 15}));
  EXPECT_EQ(b->fingerprints,
            (std::vector<uint64_t>{100, 101, 102, 103, 104, 105}));
}

TEST(ProtoConvertTest, ABadRelayBlockSaysWhatIsWrongAndListsNothing) {
  struct Case {
    v1::RelayBlock block;
    std::string why;
  };
  std::vector<Case> cases = {
      {BlockOfRuns({}, 0), "0 rank_runs values are no pairs"},
      {BlockOfRuns({8, 9, 10}, 3), "3 rank_runs values are no pairs"},
      {BlockOfRuns({9, 8}, 2), "run 0 (9, 8) is not an ascending run"},
      {BlockOfRuns({8, 9, 9, 10}, 3), "run 1 (9, 10) is not an ascending run"},
      {BlockOfRuns({-1, 2}, 4), "run 0 (-1, 2)"},
      {BlockOfRuns({8, 10}, 2), "more ranks than its 2 fingerprints"},
      {BlockOfRuns({8, 10}, 4), "fewer ranks than its 4 fingerprints"},
      // Two billion ranks vouched for by two fingerprints: counted, never
      // listed.
      {BlockOfRuns({0, 2000000000}, 2), "more ranks than its 2 fingerprints"},
  };
  v1::RelayBlock old_kind = BlockOfRuns({8, 9}, 2);
  old_kind.set_fingerprint_kind(static_cast<int>(FingerprintKind::kWordLanes));
  cases.push_back({old_kind, "upgrade the relay and the servers together"});
  for (const Case& c : cases) {
    const absl::Status s = RelayBlockFromProto(c.block).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_NE(s.message().find(c.why), std::string::npos) << s;
  }
}

TEST(ProtoConvertTest, ARelayBlocksHealthKeepsWhatWasScored) {
  v1::RelayBlock proto = BlockOfRuns({8, 9}, 2);
  v1::RankHealth* h = proto.add_health();
  h->set_rank(9);
  h->set_step(4);
  h->set_count(32);
  h->set_mean_shift(-0.25);
  h->set_stuck_channel(0);
  h = proto.add_health();
  h->set_rank(8);
  h->set_step(4);
  h->set_count(1);
  h->set_variance_ratio(7.5);
  absl::StatusOr<RelayBlock> b = RelayBlockFromProto(proto);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->health.size(), 2u);
  EXPECT_EQ(b->health[0].rank, 9);
  EXPECT_EQ(b->health[0].step, 4);
  EXPECT_EQ(b->health[0].count, 32);
  EXPECT_EQ(b->health[0].mean_shift, -0.25);
  EXPECT_TRUE(std::isnan(b->health[0].variance_ratio));
  EXPECT_EQ(b->health[0].stuck_channel, 0);
  EXPECT_EQ(b->health[1].rank, 8);
  EXPECT_TRUE(std::isnan(b->health[1].mean_shift));
  EXPECT_EQ(b->health[1].variance_ratio, 7.5);
  EXPECT_EQ(b->health[1].stuck_channel, -1);
}

TEST(ProtoConvertTest, ANonFiniteHealthScoreIsRefusedNamingIt) {
  const auto with = [](auto set) {
    v1::RelayBlock proto = BlockOfRuns({8, 9}, 2);
    v1::RankHealth* h = proto.add_health();
    h->set_rank(8);
    h->set_step(3);
    h->set_count(4);
    proto.add_health()->CopyFrom(*h);
    set(*proto.mutable_health(1));
    return proto;
  };
  const std::vector<std::pair<v1::RelayBlock, std::string>> cases = {
      {with([](v1::RankHealth& h) {
         h.set_mean_shift(std::numeric_limits<double>::quiet_NaN());
       }),
       "health[1] (rank 8, step 3): mean_shift is nan"},
      {with([](v1::RankHealth& h) {
         h.set_variance_ratio(-std::numeric_limits<double>::infinity());
       }),
       "health[1] (rank 8, step 3): variance_ratio is -inf"},
      {with([](v1::RankHealth& h) { h.set_stuck_channel(-1); }),
       "health[1] (rank 8, step 3): stuck_channel is -1"},
  };
  for (const auto& [proto, why] : cases) {
    const absl::Status s = RelayBlockFromProto(proto).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  }
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
