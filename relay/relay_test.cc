// The relay between ranks and an aggregator in this process: rounds through
// it give bit for bit what the same contributions give sent directly, and
// match the float64 reference; an incomplete block completes by the
// job's quorum; what a relay does not serve is refused, saying why.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"
#include "relay/relay_server.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "testing/local_aggregator.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace ref = ::syncnorm::reference;

constexpr int kChannels = 6;

std::unique_ptr<v1::Aggregator::Stub> StubFor(const std::string& address) {
  return v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// What the ranks of one round send, with the float64 reference of its
// result for each group.
struct RoundInput {
  int group_size = 0;                           // 0: one group
  std::vector<v1::Contribution> contributions;  // by rank
  std::vector<ref::Reals> mean, var;            // FORWARD, by group
  std::vector<ref::Reals> sum_dy, sum_dy_xmu;   // BACKWARD, by group

  int GroupOf(int rank) const { return group_size > 0 ? rank / group_size : 0; }
};

// Each rank's moments of its own random batch (1 to 5 rows of kChannels),
// and the reference statistics of each group's concatenated batch.
RoundInput ForwardInput(const std::string& job, int world, int64_t step,
                        std::mt19937& rng, int group_size = 0) {
  RoundInput in;
  in.group_size = group_size;
  std::normal_distribution<double> value(1.5, 2.0);
  std::uniform_int_distribution<int> rows(1, 5);
  std::vector<ref::Layout> layouts;
  std::vector<std::vector<double>> xs(world);
  for (int r = 0; r < world; ++r) {
    layouts.push_back(ref::Layout{{rows(rng), kChannels}});
    for (int64_t i = 0; i < layouts[r].size(); ++i) xs[r].push_back(value(rng));
    const ref::Stats s = ref::Moments(layouts[r], xs[r]);
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.set_rank(r);
    c.mutable_moments()->set_count(s.count);
    for (int ch = 0; ch < kChannels; ++ch) {
      c.mutable_moments()->add_mean(static_cast<double>(s.mean[ch]));
      c.mutable_moments()->add_m2(static_cast<double>(s.m2[ch]));
    }
    in.contributions.push_back(std::move(c));
  }
  for (int g = 0; g <= in.GroupOf(world - 1); ++g) {
    std::vector<ref::Layout> group_layouts;
    std::vector<const std::vector<double>*> group_xs;
    for (int r = 0; r < world; ++r) {
      if (in.GroupOf(r) != g) continue;
      group_layouts.push_back(layouts[r]);
      group_xs.push_back(&xs[r]);
    }
    const ref::Stats global = ref::Moments(kChannels, group_layouts, group_xs);
    in.mean.push_back(global.mean);
    in.var.push_back(global.Var());
  }
  return in;
}

RoundInput BackwardInput(const std::string& job, int world, int64_t step,
                         std::mt19937& rng, int group_size = 0) {
  RoundInput in;
  in.group_size = group_size;
  std::normal_distribution<double> value(0.0, 3.0);
  in.sum_dy.assign(in.GroupOf(world - 1) + 1, ref::Reals(kChannels, 0));
  in.sum_dy_xmu = in.sum_dy;
  for (int r = 0; r < world; ++r) {
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::BACKWARD);
    c.set_rank(r);
    for (int ch = 0; ch < kChannels; ++ch) {
      const double dy = value(rng);
      const double dyx = value(rng);
      c.mutable_grad_sums()->add_sum_dy(dy);
      c.mutable_grad_sums()->add_sum_dy_xmu(dyx);
      in.sum_dy[in.GroupOf(r)][ch] += dy;
      in.sum_dy_xmu[in.GroupOf(r)][ch] += dyx;
    }
    in.contributions.push_back(std::move(c));
  }
  return in;
}

std::vector<v1::Contribution> ForJob(std::vector<v1::Contribution> cs,
                                     const std::string& job) {
  for (auto& c : cs) c.set_job_id(job);
  return cs;
}

// Sends each contribution from its own thread, in a random order, on a
// Reduce stream (`streams`) or by ReduceOnce; the answers by position in
// `cs`, a failed ReduceOnce as RoundResult.error.
// As SendAll, each contribution to `stub_of[its position in cs]`.
std::vector<v1::RoundResult> SendRouted(
    const std::vector<v1::Aggregator::Stub*>& stub_of,
    const std::vector<v1::Contribution>& cs, bool streams, std::mt19937& rng) {
  std::vector<v1::RoundResult> results(cs.size());
  std::vector<int> order(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) order[i] = static_cast<int>(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    threads.emplace_back([&, i, k] {
      // Spread the arrivals: the relay sees them in this random order.
      absl::SleepFor(absl::Milliseconds(2 * k));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      if (streams) {
        auto rw = stub_of[i]->Reduce(&context);
        if (!rw->Write(cs[i]) || !rw->Read(&results[i])) {
          results[i].mutable_error()->set_message("stream broke");
        }
        rw->WritesDone();
        rw->Finish().ok();
      } else {
        const grpc::Status s =
            stub_of[i]->ReduceOnce(&context, cs[i], &results[i]);
        if (!s.ok()) {
          results[i].mutable_error()->set_code(s.error_code());
          results[i].mutable_error()->set_message(s.error_message());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

std::vector<v1::RoundResult> SendAll(v1::Aggregator::Stub& stub,
                                     const std::vector<v1::Contribution>& cs,
                                     bool streams, std::mt19937& rng) {
  return SendRouted(std::vector<v1::Aggregator::Stub*>(cs.size(), &stub), cs,
                    streams, rng);
}

bool SameBits(const google::protobuf::RepeatedField<double>& a,
              const google::protobuf::RepeatedField<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * a.size()) == 0;
}

std::vector<double> Values(const google::protobuf::RepeatedField<double>& v) {
  return std::vector<double>(v.begin(), v.end());
}

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::LocalAggregator>> aggregator =
        testing::LocalAggregator::Start();
    ASSERT_TRUE(aggregator.ok()) << aggregator.status();
    aggregator_ = *std::move(aggregator);
    shard_ = StubFor(aggregator_->address());
  }

  void StartRelay(RelayOptions options = {}) {
    options.listen = "127.0.0.1:0";
    options.upstream = aggregator_->address();
    options.close_read_floods = false;  // in-process
    absl::StatusOr<std::unique_ptr<RelayServer>> relay =
        RelayServer::Start(options);
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = *std::move(relay);
    relay_stub_ = StubFor(RelayAddress());
  }

  std::string RelayAddress() const {
    return absl::StrCat("127.0.0.1:", relay_->port());
  }

  void CreateJob(const std::string& job, int world, int group_size = 0,
                 int quorum = 0, int64_t grace_ms = 0,
                 int64_t timeout_ms = 10000) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.set_group_size(group_size);
    request.set_round_timeout_ms(timeout_ms);
    request.add_layers()->set_num_features(kChannels);
    if (quorum > 0) {
      request.mutable_quorum()->set_min_ranks(quorum);
      request.mutable_quorum()->set_grace_ms(grace_ms);
    }
    grpc::ClientContext context;
    v1::JobInfo info;
    const grpc::Status s = shard_->CreateJob(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    accepts_blocks_ = info.accepts_relay_blocks();
  }

  std::unique_ptr<testing::LocalAggregator> aggregator_;
  std::unique_ptr<v1::Aggregator::Stub> shard_;
  std::unique_ptr<RelayServer> relay_;
  std::unique_ptr<v1::Aggregator::Stub> relay_stub_;
  bool accepts_blocks_ = false;
};

// Every answer of `relayed` is bit for bit `direct`'s answer to the same
// rank, and the reference's within float64 rounding.
void ExpectSameAsDirect(const RoundInput& in,
                        const std::vector<v1::RoundResult>& direct,
                        const std::vector<v1::RoundResult>& relayed) {
  ASSERT_EQ(direct.size(), relayed.size());
  for (size_t r = 0; r < direct.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const int g = in.GroupOf(static_cast<int>(r));
    ASSERT_FALSE(direct[r].has_error()) << direct[r].error().message();
    ASSERT_FALSE(relayed[r].has_error()) << relayed[r].error().message();
    EXPECT_EQ(relayed[r].step(), direct[r].step());
    EXPECT_EQ(relayed[r].phase(), direct[r].phase());
    EXPECT_EQ(relayed[r].version(), direct[r].version());
    if (direct[r].has_moments()) {
      ASSERT_TRUE(relayed[r].has_moments());
      EXPECT_EQ(relayed[r].moments().count(), direct[r].moments().count());
      EXPECT_TRUE(
          SameBits(relayed[r].moments().mean(), direct[r].moments().mean()));
      EXPECT_TRUE(
          SameBits(relayed[r].moments().var(), direct[r].moments().var()));
      ref::ExpectClose(Values(relayed[r].moments().mean()), in.mean[g], 1e-12,
                       "mean");
      ref::ExpectClose(Values(relayed[r].moments().var()), in.var[g], 1e-12,
                       "var");
    } else {
      ASSERT_TRUE(relayed[r].has_grad_sums());
      EXPECT_TRUE(SameBits(relayed[r].grad_sums().sum_dy(),
                           direct[r].grad_sums().sum_dy()));
      EXPECT_TRUE(SameBits(relayed[r].grad_sums().sum_dy_xmu(),
                           direct[r].grad_sums().sum_dy_xmu()));
      ref::ExpectClose(Values(relayed[r].grad_sums().sum_dy()), in.sum_dy[g],
                       1e-12, "sum_dy");
      ref::ExpectClose(Values(relayed[r].grad_sums().sum_dy_xmu()),
                       in.sum_dy_xmu[g], 1e-12, "sum_dy_xmu");
    }
  }
}

// Rounds of `world` ranks in groups of `group_size` (0: one group),
// through a relay of blocks of `block` positions and directly, over several
// steps, FORWARD and BACKWARD, in random orders; returns the rounds run.
// `relay_of[rank]`: where each rank sends (a relay, or the shard).
int RunRoundsRouted(v1::Aggregator::Stub& shard,
                    const std::vector<v1::Aggregator::Stub*>& relay_of,
                    int group_size, int steps, std::mt19937& rng) {
  const int world = static_cast<int>(relay_of.size());
  int rounds = 0;
  for (int64_t step = 0; step < steps; ++step) {
    for (bool forward : {true, false}) {
      SCOPED_TRACE(
          absl::StrCat("step ", step, forward ? " FORWARD" : " BACKWARD"));
      const RoundInput in =
          forward ? ForwardInput("direct", world, step, rng, group_size)
                  : BackwardInput("direct", world, step, rng, group_size);
      const std::vector<v1::RoundResult> direct =
          SendAll(shard, in.contributions, /*streams=*/false, rng);
      const std::vector<v1::RoundResult> relayed =
          SendRouted(relay_of, ForJob(in.contributions, "relayed"),
                     /*streams=*/step % 2 == 0, rng);
      ExpectSameAsDirect(in, direct, relayed);
      ++rounds;
    }
  }
  return rounds;
}

int RunRoundsBothWays(v1::Aggregator::Stub& shard, v1::Aggregator::Stub& relay,
                      int group_size, int world, int steps, std::mt19937& rng) {
  return RunRoundsRouted(shard,
                         std::vector<v1::Aggregator::Stub*>(world, &relay),
                         group_size, steps, rng);
}

TEST_F(RelayTest, MergedBlocksAreBitForBitTheDirectRounds) {
  StartRelay();
  constexpr int kWorld = 16;
  CreateJob("direct", kWorld);
  CreateJob("relayed", kWorld);
  ASSERT_TRUE(accepts_blocks_);
  std::mt19937 rng(35);
  const int rounds =
      RunRoundsBothWays(*shard_, *relay_stub_, 0, kWorld, 3, rng);
  // The shard got one contribution per block of 8, not one per rank.
  const RelayCounters counters = relay_->counters();
  EXPECT_EQ(counters.blocks_forwarded, rounds * kWorld / 8);
  EXPECT_EQ(counters.passed_through, 0);
}

TEST_F(RelayTest, UnevenGroupsWithAPartialLastBlockAreBitForBitTheDirect) {
  StartRelay();
  // Two groups of 12: blocks of positions 0..7 and 8..11 in each.
  constexpr int kWorld = 24;
  CreateJob("direct", kWorld, /*group_size=*/12);
  CreateJob("relayed", kWorld, /*group_size=*/12);
  std::mt19937 rng(36);
  const int rounds =
      RunRoundsBothWays(*shard_, *relay_stub_, 12, kWorld, 2, rng);
  EXPECT_EQ(relay_->counters().blocks_forwarded, rounds * 4);
}

TEST_F(RelayTest, PassedThroughRoundsAreBitForBitTheDirectRounds) {
  // Blocks of one position: every contribution goes through unmerged.
  RelayOptions options;
  options.block_positions = 1;
  StartRelay(options);
  constexpr int kWorld = 16;
  CreateJob("direct", kWorld);
  CreateJob("relayed", kWorld);
  std::mt19937 rng(37);
  const int rounds =
      RunRoundsBothWays(*shard_, *relay_stub_, 0, kWorld, 2, rng);
  const RelayCounters counters = relay_->counters();
  EXPECT_EQ(counters.blocks_forwarded, 0);
  EXPECT_EQ(counters.passed_through, rounds * kWorld);
}

TEST_F(RelayTest, AnIncompleteBlockCompletesByTheQuorumNamingTheMissingRank) {
  RelayOptions options;
  options.pass_through_margin = absl::Milliseconds(100);
  StartRelay(options);
  constexpr int kWorld = 16;
  constexpr int kMissing = 5;
  CreateJob("direct", kWorld, 0, /*quorum=*/15, /*grace_ms=*/400);
  CreateJob("relayed", kWorld, 0, /*quorum=*/15, /*grace_ms=*/400);
  std::mt19937 rng(7);
  RoundInput in = ForwardInput("direct", kWorld, 0, rng);
  in.contributions.erase(in.contributions.begin() + kMissing);
  const std::vector<v1::RoundResult> direct =
      SendAll(*shard_, in.contributions, false, rng);
  const std::vector<v1::RoundResult> relayed =
      SendAll(*relay_stub_, ForJob(in.contributions, "relayed"), true, rng);
  ASSERT_EQ(relayed.size(), kWorld - 1);
  for (size_t i = 0; i < relayed.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("contribution ", i));
    ASSERT_FALSE(relayed[i].has_error()) << relayed[i].error().message();
    EXPECT_THAT(relayed[i].missing_ranks(), ElementsAre(kMissing));
    EXPECT_THAT(direct[i].missing_ranks(), ElementsAre(kMissing));
    EXPECT_TRUE(
        SameBits(relayed[i].moments().mean(), direct[i].moments().mean()));
    EXPECT_TRUE(
        SameBits(relayed[i].moments().var(), direct[i].moments().var()));
  }
}

TEST_F(RelayTest, AtTheDeadlineTheShardNamesOnlyTheMissingRank) {
  // A margin that a loaded test machine's hop fits in.
  RelayOptions options;
  options.pass_through_margin = absl::Milliseconds(150);
  StartRelay(options);
  constexpr int kWorld = 16;
  constexpr int kMissing = 9;
  CreateJob("relayed", kWorld, 0, 0, 0, /*timeout_ms=*/1000);
  std::mt19937 rng(40);
  RoundInput in = ForwardInput("relayed", kWorld, 0, rng);
  in.contributions.erase(in.contributions.begin() + kMissing);
  // Block 0 (ranks 0..7) goes up merged; block 1 waits for rank 9 and
  // goes through before the deadline, so the shard names rank 9 alone. The
  // shard's ReduceOnce status comes back in-band on the streams.
  const std::vector<v1::RoundResult> results =
      SendAll(*relay_stub_, in.contributions, /*streams=*/true, rng);
  for (const v1::RoundResult& r : results) {
    ASSERT_TRUE(r.has_error());
    EXPECT_EQ(r.error().code(),
              static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
    EXPECT_THAT(r.error().missing_ranks(), ElementsAre(kMissing));
    EXPECT_THAT(r.error().message(), HasSubstr("[9]"));
    EXPECT_EQ(r.job_id(), "relayed");
    EXPECT_EQ(r.step(), 0);
    EXPECT_EQ(r.phase(), v1::FORWARD);
  }
}

TEST_F(RelayTest, ARetryGetsTheSameResultAndAConflictingResendIsAborted) {
  StartRelay();
  constexpr int kWorld = 8;
  CreateJob("relayed", kWorld);
  std::mt19937 rng(38);
  const RoundInput in = ForwardInput("relayed", kWorld, 0, rng);
  const std::vector<v1::RoundResult> first =
      SendAll(*relay_stub_, in.contributions, /*streams=*/true, rng);
  ASSERT_FALSE(first[3].has_error()) << first[3].error().message();
  ASSERT_EQ(relay_->counters().blocks_forwarded, 1);
  // Rank 3 resends the same contribution, through the relay and directly:
  // the shard matches it to the block's fingerprint.
  for (v1::Aggregator::Stub* stub : {relay_stub_.get(), shard_.get()}) {
    grpc::ClientContext context;
    v1::RoundResult again;
    const grpc::Status s =
        stub->ReduceOnce(&context, in.contributions[3], &again);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(again.version(), first[3].version());
    EXPECT_TRUE(SameBits(again.moments().mean(), first[3].moments().mean()));
    EXPECT_TRUE(SameBits(again.moments().var(), first[3].moments().var()));
  }
  // Another payload for rank 3 of the same round is a conflict.
  v1::Contribution other = in.contributions[3];
  other.mutable_moments()->set_mean(0, other.moments().mean(0) + 1);
  grpc::ClientContext context;
  v1::RoundResult out;
  EXPECT_EQ(relay_stub_->ReduceOnce(&context, other, &out).error_code(),
            grpc::StatusCode::ABORTED);
  const std::vector<v1::RoundResult> streamed =
      SendAll(*relay_stub_, {other}, /*streams=*/true, rng);
  ASSERT_TRUE(streamed[0].has_error());
  EXPECT_EQ(streamed[0].error().code(),
            static_cast<int>(grpc::StatusCode::ABORTED));
}

// Ranks 0..6 of 8 send at step 0; rank 7 is gone, and an operator removes
// it from `from_step`, while the relay's block waits for it.
void RunRemovedRank(v1::Aggregator::Stub& shard, v1::Aggregator::Stub& relay,
                    const std::string& job, int64_t from_step,
                    std::vector<int> missing) {
  constexpr int kWorld = 8;
  std::mt19937 rng(39);
  const RoundInput in = ForwardInput(job, kWorld - 1, 0, rng);
  std::thread remove([&] {
    absl::SleepFor(absl::Milliseconds(300));
    v1::UpdateMembershipRequest request;
    request.set_job_id(job);
    request.set_step(from_step);
    request.add_remove(kWorld - 1);
    grpc::ClientContext context;
    v1::JobInfo info;
    const grpc::Status s = shard.UpdateMembership(&context, request, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
  });
  const absl::Time start = absl::Now();
  const std::vector<v1::RoundResult> results =
      SendAll(relay, in.contributions, /*streams=*/true, rng);
  remove.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // the timeout is 10 s
  for (int r = 0; r < kWorld - 1; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_FALSE(results[r].has_error()) << results[r].error().message();
    EXPECT_THAT(results[r].missing_ranks(), ElementsAreArray(missing));
    ref::ExpectClose(Values(results[r].moments().mean()), in.mean[0], 1e-12,
                     "mean");
    ref::ExpectClose(Values(results[r].moments().var()), in.var[0], 1e-12,
                     "var");
  }
}

TEST_F(RelayTest, ARankRemovedFromTheBlocksStepReleasesTheBlock) {
  StartRelay();
  CreateJob("from-0", 8);
  // Not a member at step 0 any more: no rank is missing.
  RunRemovedRank(*shard_, *relay_stub_, "from-0", 0, {});
}

TEST_F(RelayTest, ARankRemovedFromALaterStepCompletesTheWaitingRound) {
  StartRelay();
  CreateJob("from-1", 8);
  // Still a member at step 0: the round completes without it, naming it.
  RunRemovedRank(*shard_, *relay_stub_, "from-1", 1, {7});
}

TEST_F(RelayTest, EveryOtherMethodIsUnimplementedNamingTheShards) {
  StartRelay();
  auto expect = [](const grpc::Status& s, const std::string& method) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
    EXPECT_THAT(
        s.error_message(),
        HasSubstr(absl::StrCat("send ", method, " to the aggregator shards")));
  };
  {
    grpc::ClientContext c;
    v1::JobInfo out;
    expect(relay_stub_->CreateJob(&c, v1::CreateJobRequest(), &out),
           "CreateJob");
  }
  {
    grpc::ClientContext c;
    v1::JobInfo out;
    expect(relay_stub_->GetJob(&c, v1::GetJobRequest(), &out), "GetJob");
  }
  {
    grpc::ClientContext c;
    v1::ListJobsResponse out;
    expect(relay_stub_->ListJobs(&c, v1::ListJobsRequest(), &out), "ListJobs");
  }
  {
    grpc::ClientContext c;
    v1::JobInfo out;
    expect(
        relay_stub_->UpdateMembership(&c, v1::UpdateMembershipRequest(), &out),
        "UpdateMembership");
  }
  {
    grpc::ClientContext c;
    v1::StatsHealth out;
    expect(relay_stub_->GetStatsHealth(&c, v1::GetStatsHealthRequest(), &out),
           "GetStatsHealth");
  }
  {
    grpc::ClientContext c;
    v1::CheckpointInfo out;
    expect(relay_stub_->Checkpoint(&c, v1::CheckpointRequest(), &out),
           "Checkpoint");
  }
}

TEST_F(RelayTest, ABlockThatDoesNotFitGoesUpForTheShardToRefuse) {
  StartRelay();
  CreateJob("j", 2);
  std::mt19937 rng(1);
  RoundInput in = ForwardInput("j", 2, 0, rng);
  // A "child relay's" block of ranks 0 and 1 without their fingerprints:
  // the relay cannot merge it, and the shard says what is wrong with it.
  v1::Contribution block = in.contributions[0];
  block.mutable_relay()->set_positions(2);
  block.mutable_relay()->add_rank_runs(0);
  block.mutable_relay()->add_rank_runs(1);
  {
    grpc::ClientContext c;
    v1::RoundResult out;
    const grpc::Status s = relay_stub_->ReduceOnce(&c, block, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("fingerprint"));
  }
  const std::vector<v1::RoundResult> streamed =
      SendAll(*relay_stub_, {block}, /*streams=*/true, rng);
  ASSERT_TRUE(streamed[0].has_error());
  EXPECT_EQ(streamed[0].error().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(streamed[0].step(), 0);
  EXPECT_EQ(streamed[0].job_id(), "j");
  EXPECT_EQ(relay_->counters().blocks_forwarded, 0);
  // The round is still open for the ranks' own contributions.
  const std::vector<v1::RoundResult> results =
      SendAll(*relay_stub_, in.contributions, /*streams=*/false, rng);
  for (const v1::RoundResult& r : results) {
    ASSERT_FALSE(r.has_error()) << r.error().message();
    ref::ExpectClose(Values(r.moments().mean()), in.mean[0], 1e-12, "mean");
  }
}

TEST_F(RelayTest, ChecksEachCallersTokenAgainstTheTokensFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/relay_tokens");
  const std::string token = "token-of-job-j-0123456789";
  {
    std::ofstream out(path);
    out << token << " job:j\n";
    out << "token-of-job-other-0123456789 job:other\n";
  }
  RelayOptions options;
  options.tokens_file = path;
  StartRelay(options);
  CreateJob("j", 1);
  std::mt19937 rng(2);
  const RoundInput in = ForwardInput("j", 1, 0, rng);
  auto reduce_once = [&](const std::string& bearer) {
    grpc::ClientContext c;
    if (!bearer.empty()) c.AddMetadata("authorization", "Bearer " + bearer);
    v1::RoundResult out;
    return relay_stub_->ReduceOnce(&c, in.contributions[0], &out);
  };
  EXPECT_EQ(reduce_once("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(reduce_once("not-a-token-of-this-relay").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(reduce_once("token-of-job-other-0123456789").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Nothing refused went up: the round is still open for the right token.
  const grpc::Status ok = reduce_once(token);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  // A stream without a token in force ends UNAUTHENTICATED before it takes
  // a --max_streams slot, as the aggregator's; one whose token lacks the
  // job's scope is answered in-band.
  {
    grpc::ClientContext c;
    auto rw = relay_stub_->Reduce(&c);
    rw->Write(in.contributions[0]);
    v1::RoundResult out;
    EXPECT_FALSE(rw->Read(&out));
    EXPECT_EQ(rw->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext c;
    c.AddMetadata("authorization", "Bearer token-of-job-other-0123456789");
    auto rw = relay_stub_->Reduce(&c);
    ASSERT_TRUE(rw->Write(in.contributions[0]));
    v1::RoundResult out;
    ASSERT_TRUE(rw->Read(&out));
    ASSERT_TRUE(out.has_error());
    EXPECT_EQ(out.error().code(),
              static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
    rw->WritesDone();
    EXPECT_TRUE(rw->Finish().ok());
  }
}

TEST_F(RelayTest, AClientWithARelaySendsItsRoundsThroughIt) {
  StartRelay();
  constexpr int kWorld = 4;
  ClientOptions options;
  options.address = aggregator_->address();
  options.relay = RelayAddress();
  options.round_timeout = absl::Seconds(20);
  Client client(options);
  v1::CreateJobRequest request;
  request.set_job_id("client-job");
  request.set_world_size(kWorld);
  request.add_layers()->set_num_features(kChannels);
  absl::StatusOr<v1::JobInfo> created = client.CreateJob(request);
  ASSERT_TRUE(created.ok()) << created.status();
  accepts_blocks_ = created->accepts_relay_blocks();
  std::mt19937 rng(3);
  const RoundInput in = ForwardInput("client-job", kWorld, 0, rng);
  std::vector<absl::StatusOr<ForwardReply>> replies(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<NodeGroup> group = client.NewNodeGroup("client-job", r);
      Moments local;
      local.count = in.contributions[r].moments().count();
      local.mean = Values(in.contributions[r].moments().mean());
      local.m2 = Values(in.contributions[r].moments().m2());
      replies[r] = group->SyncForward(0, 0, local);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(replies[r].ok()) << replies[r].status();
    ref::ExpectClose(replies[r]->global.mean, in.mean[0], 1e-12, "mean");
    ref::ExpectClose(replies[r]->global.var, in.var[0], 1e-12, "var");
  }
  const RelayCounters counters = relay_->counters();
  EXPECT_EQ(counters.blocks_forwarded + counters.passed_through,
            accepts_blocks_ ? 1 : kWorld);
}

// A relay of `block` positions whose upstream contributions go to
// `parent` (empty: to the shard).
std::unique_ptr<RelayServer> StartTreeRelay(const std::string& shard, int block,
                                            const std::string& parent) {
  RelayOptions options;
  options.listen = "127.0.0.1:0";
  options.upstream = shard;
  options.block_positions = block;
  options.parent_relay = parent;
  options.close_read_floods = false;  // in-process
  absl::StatusOr<std::unique_ptr<RelayServer>> relay =
      RelayServer::Start(options);
  EXPECT_TRUE(relay.ok()) << relay.status();
  return relay.ok() ? *std::move(relay) : nullptr;
}

std::string AddressOf(const RelayServer& relay) {
  return absl::StrCat("127.0.0.1:", relay.port());
}

TEST_F(RelayTest, ATreeOfRelaysIsBitForBitTheDirectRounds) {
  // Groups of 12. The parent merges blocks of 8 positions; under it a
  // child of blocks of 2 takes positions 0-3 and 10-11 of each group, a
  // child of blocks of 4 positions 4-7, and positions 8-9 send to the
  // parent themselves. The last block of each group (8-11) is partial.
  constexpr int kWorld = 24;
  constexpr int kGroup = 12;
  std::unique_ptr<RelayServer> parent =
      StartTreeRelay(aggregator_->address(), 8, "");
  ASSERT_NE(parent, nullptr);
  std::unique_ptr<RelayServer> pairs =
      StartTreeRelay(aggregator_->address(), 2, AddressOf(*parent));
  std::unique_ptr<RelayServer> quads =
      StartTreeRelay(aggregator_->address(), 4, AddressOf(*parent));
  ASSERT_NE(pairs, nullptr);
  ASSERT_NE(quads, nullptr);
  auto parent_stub = StubFor(AddressOf(*parent));
  auto pairs_stub = StubFor(AddressOf(*pairs));
  auto quads_stub = StubFor(AddressOf(*quads));
  std::vector<v1::Aggregator::Stub*> relay_of;
  for (int r = 0; r < kWorld; ++r) {
    const int p = r % kGroup;
    relay_of.push_back(p < 4 || p >= 10 ? pairs_stub.get()
                       : p < 8          ? quads_stub.get()
                                        : parent_stub.get());
  }
  CreateJob("direct", kWorld, kGroup);
  CreateJob("relayed", kWorld, kGroup);
  ASSERT_TRUE(accepts_blocks_);
  std::mt19937 rng(40);
  const int rounds = RunRoundsRouted(*shard_, relay_of, kGroup, 3, rng);
  // Per round and group: the pairs child merges 3 blocks, the quads child
  // 1, the parent 2, each from what came up merged.
  EXPECT_EQ(pairs->counters().blocks_forwarded, rounds * 2 * 3);
  EXPECT_EQ(quads->counters().blocks_forwarded, rounds * 2 * 1);
  EXPECT_EQ(parent->counters().blocks_forwarded, rounds * 2 * 2);
  for (const RelayServer* relay : {parent.get(), pairs.get(), quads.get()}) {
    EXPECT_EQ(relay->counters().passed_through, 0);
  }
}

TEST_F(RelayTest, ThreeLevelsAreBitForBitAndARetryThroughAnyPathMatches) {
  // Blocks of 2 under blocks of 4 under one block of 16: ranks 0-3 send
  // to the lowest relay, 4-7 to the middle one, 8-15 to the top.
  constexpr int kWorld = 16;
  std::unique_ptr<RelayServer> top =
      StartTreeRelay(aggregator_->address(), 16, "");
  ASSERT_NE(top, nullptr);
  std::unique_ptr<RelayServer> middle =
      StartTreeRelay(aggregator_->address(), 4, AddressOf(*top));
  ASSERT_NE(middle, nullptr);
  std::unique_ptr<RelayServer> low =
      StartTreeRelay(aggregator_->address(), 2, AddressOf(*middle));
  ASSERT_NE(low, nullptr);
  auto top_stub = StubFor(AddressOf(*top));
  auto middle_stub = StubFor(AddressOf(*middle));
  auto low_stub = StubFor(AddressOf(*low));
  std::vector<v1::Aggregator::Stub*> relay_of;
  for (int r = 0; r < kWorld; ++r) {
    relay_of.push_back(r < 4   ? low_stub.get()
                       : r < 8 ? middle_stub.get()
                               : top_stub.get());
  }
  CreateJob("direct", kWorld);
  CreateJob("relayed", kWorld);
  std::mt19937 rng(41);
  const int rounds = RunRoundsRouted(*shard_, relay_of, 0, 2, rng);
  EXPECT_EQ(low->counters().blocks_forwarded, rounds * 2);
  EXPECT_EQ(middle->counters().blocks_forwarded, rounds * 2);
  EXPECT_EQ(top->counters().blocks_forwarded, rounds);

  // One more round; then rank 1 (merged two levels down) resends the same
  // contribution through each path: the shard matches the fingerprint
  // that came up inside the top's block.
  const RoundInput in = ForwardInput("relayed", kWorld, 2, rng);
  const std::vector<v1::RoundResult> first =
      SendRouted(relay_of, in.contributions, /*streams=*/true, rng);
  ASSERT_FALSE(first[1].has_error()) << first[1].error().message();
  for (v1::Aggregator::Stub* stub :
       {low_stub.get(), middle_stub.get(), top_stub.get(), shard_.get()}) {
    grpc::ClientContext context;
    v1::RoundResult again;
    const grpc::Status s =
        stub->ReduceOnce(&context, in.contributions[1], &again);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(again.version(), first[1].version());
    EXPECT_TRUE(SameBits(again.moments().mean(), first[1].moments().mean()));
    EXPECT_TRUE(SameBits(again.moments().var(), first[1].moments().var()));
  }
  v1::Contribution other = in.contributions[1];
  other.mutable_moments()->set_mean(0, other.moments().mean(0) + 1);
  grpc::ClientContext context;
  v1::RoundResult out;
  EXPECT_EQ(low_stub->ReduceOnce(&context, other, &out).error_code(),
            grpc::StatusCode::ABORTED);
}

TEST_F(RelayTest, AChildsBlockNeedsTheRelayScopeAtItsParent) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/relay_tree_tokens");
  const std::string job_token = "token-of-job-tree-0123456789";
  const std::string relay_token = "token-of-a-relay-0123456789";
  {
    std::ofstream out(path);
    out << job_token << " job:tree\n";
    out << relay_token << " relay,job:tree\n";
  }
  RelayOptions options;
  options.tokens_file = path;
  options.block_positions = 4;
  StartRelay(options);
  CreateJob("tree", 4);
  std::mt19937 rng(42);
  const RoundInput in = ForwardInput("tree", 4, 0, rng);
  // A block of ranks 0 and 1 (without fingerprints: the shard would
  // refuse it, after the relay's own check of the token).
  v1::Contribution block = in.contributions[0];
  block.mutable_relay()->set_positions(2);
  block.mutable_relay()->add_rank_runs(0);
  block.mutable_relay()->add_rank_runs(1);
  auto send = [&](const std::string& bearer) {
    grpc::ClientContext c;
    c.AddMetadata("authorization", "Bearer " + bearer);
    c.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    v1::RoundResult out;
    return relay_stub_->ReduceOnce(&c, block, &out);
  };
  const grpc::Status refused = send(job_token);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("relay"));
  // The relay's scope passes the token check: the shard judges the block.
  EXPECT_EQ(send(relay_token).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RelayTest, AHeldRoundsGraceRunsFromWhereItBeganBelow) {
  // One group of 4 under a parent relay of blocks of 4 (the whole group),
  // over a child of blocks of 2 that takes ranks 0-2; rank 3 is gone.
  // Quorum 3 with 1 s of grace. Ranks 0 and 2 send at once, rank 1 after
  // 500 ms. The child's block {0, 1} goes up at 500 ms saying the round
  // began 500 ms before; its {2, 3} goes through at the grace less its
  // margin; the parent's block, incomplete, at the grace less its own,
  // saying when the round began. So the shard completes the round about
  // 1 s after the first send, as it would have direct, and not after the
  // relays' holds, one after another (about 2 s).
  constexpr int kWorld = 4;
  RelayOptions top;
  top.listen = "127.0.0.1:0";
  top.upstream = aggregator_->address();
  top.block_positions = 4;
  top.pass_through_margin = absl::Milliseconds(20);
  top.close_read_floods = false;  // in-process
  absl::StatusOr<std::unique_ptr<RelayServer>> parent = RelayServer::Start(top);
  ASSERT_TRUE(parent.ok()) << parent.status();
  RelayOptions below = top;
  below.block_positions = 2;
  below.pass_through_margin = absl::Milliseconds(80);
  below.parent_relay = AddressOf(**parent);
  absl::StatusOr<std::unique_ptr<RelayServer>> child =
      RelayServer::Start(below);
  ASSERT_TRUE(child.ok()) << child.status();
  auto child_stub = StubFor(AddressOf(**child));
  CreateJob("held", kWorld, 0, /*quorum=*/3, /*grace_ms=*/1000);
  std::mt19937 rng(43);
  const RoundInput in = ForwardInput("held", kWorld - 1, 0, rng);
  std::vector<v1::RoundResult> results(kWorld - 1);
  std::vector<absl::Duration> took(kWorld - 1);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {
    threads.emplace_back([&, r] {
      if (r == 1) absl::SleepFor(start + absl::Milliseconds(500) - absl::Now());
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      const grpc::Status s =
          child_stub->ReduceOnce(&context, in.contributions[r], &results[r]);
      EXPECT_TRUE(s.ok()) << s.error_message();
      took[r] = absl::Now() - start;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld - 1; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(results[r].missing_ranks(), ElementsAre(3));
    ref::ExpectClose(Values(results[r].moments().mean()), in.mean[0], 1e-12,
                     "mean");
    ref::ExpectClose(Values(results[r].moments().var()), in.var[0], 1e-12,
                     "var");
    EXPECT_GE(took[r], absl::Milliseconds(900));
    EXPECT_LT(took[r], absl::Milliseconds(1500));
  }
}

TEST_F(RelayTest, OnlyARelayTokenMayMoveARoundsStartBack) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/relay_age_tokens");
  const std::string job_token = "token-of-job-aged-0123456789";
  const std::string relay_token = "token-of-a-relay-0123456789";
  {
    std::ofstream out(path);
    out << job_token << " job:aged\n";
    out << relay_token << " relay,job:aged\n";
  }
  RelayOptions options;
  options.tokens_file = path;
  StartRelay(options);
  CreateJob("aged", 2, 0, 0, 0, /*timeout_ms=*/3000);
  std::mt19937 rng(44);
  const auto send = [&](const std::string& token, const v1::Contribution& c) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + token);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::RoundResult out;
    return relay_stub_->ReduceOnce(&context, c, &out);
  };
  for (const std::string& token : {job_token, relay_token}) {
    SCOPED_TRACE(token);
    const int64_t step = token == job_token ? 0 : 1;
    const RoundInput in = ForwardInput("aged", 2, step, rng);
    v1::Contribution aged = in.contributions[0];
    aged.set_round_age_ms(3600 * 1000);
    const absl::Time start = absl::Now();
    grpc::Status first;
    std::thread rank0([&] { first = send(token, aged); });
    absl::SleepFor(absl::Milliseconds(300));
    const grpc::Status second = send(job_token, in.contributions[1]);
    rank0.join();
    if (token == job_token) {
      // A rank's word is dropped: the round completes with both ranks.
      EXPECT_TRUE(first.ok()) << first.error_message();
      EXPECT_TRUE(second.ok()) << second.error_message();
    } else {
      // The relay scope's word is kept: the round began a timeout ago.
      EXPECT_EQ(first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
          << first.error_message();
      EXPECT_LT(absl::Now() - start, absl::Seconds(2));
    }
  }
  v1::Contribution negative = ForwardInput("aged", 2, 2, rng).contributions[0];
  negative.set_round_age_ms(-1);
  const grpc::Status refused = send(relay_token, negative);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("round_age_ms -1"));
}

// Statistics health through the relay (docs/relay.md, "Statistics
// health"): W = 32 ranks in blocks of 8, C = 32 channels, batches of 16
// values drawn from one normal distribution; a broken rank's inputs are
// shifted by half a standard deviation, scaled by 1.5, or have a channel
// stuck at a constant.
class RelayHealthTest : public RelayTest {
 protected:
  static constexpr int kWorld = 32;
  static constexpr int kWide = 32;  // channels
  static constexpr int kBatch = 16;

  enum class Fault { kNone, kShift, kScale, kStuck, kFarOff };

  void CreateHealthJob(const std::string& job) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(kWorld);
    request.set_round_timeout_ms(20000);
    request.add_layers()->set_num_features(kWide);
    grpc::ClientContext context;
    v1::JobInfo info;
    const grpc::Status s = shard_->CreateJob(&context, request, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(info.accepts_relay_blocks());
  }

  // One rank's moments of its batch, computed from its values.
  static v1::Contribution Forward(const std::string& job, int64_t step,
                                  int rank, Fault fault, std::mt19937& rng) {
    std::normal_distribution<double> value(1.5, 2.0);
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.set_rank(rank);
    v1::Moments& m = *c.mutable_moments();
    m.set_count(kBatch);
    for (int ch = 0; ch < kWide; ++ch) {
      std::vector<double> x(kBatch);
      for (double& v : x) {
        v = value(rng);
        if (fault == Fault::kShift) v += 0.5 * 2.0;
        if (fault == Fault::kFarOff) v += 10 * 2.0;
        if (fault == Fault::kScale) v = 1.5 + (v - 1.5) * 1.5;
        if (fault == Fault::kStuck && ch == 7) v = 0.25;
      }
      double mean = 0, m2 = 0;
      for (double v : x) mean += v / kBatch;
      for (double v : x) m2 += (v - mean) * (v - mean);
      m.add_mean(mean);
      m.add_m2(m2);
    }
    return c;
  }

  static v1::Contribution Backward(const std::string& job, int64_t step,
                                   int rank) {
    v1::Contribution c;
    c.set_job_id(job);
    c.set_step(step);
    c.set_phase(v1::BACKWARD);
    c.set_rank(rank);
    for (int ch = 0; ch < kWide; ++ch) {
      c.mutable_grad_sums()->add_sum_dy(0.01 * (rank + ch));
      c.mutable_grad_sums()->add_sum_dy_xmu(-0.02 * (rank - ch));
    }
    return c;
  }

  // `steps` steps of FORWARD (and BACKWARD) rounds through the relay, the
  // ranks of `faults` broken from step 0.
  void Train(const std::string& job, int steps, bool backward,
             const std::map<int, Fault>& faults, std::mt19937& rng) {
    for (int64_t step = 0; step < steps; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      std::vector<v1::Contribution> forward;
      for (int r = 0; r < kWorld; ++r) {
        const auto f = faults.find(r);
        forward.push_back(Forward(
            job, step, r, f == faults.end() ? Fault::kNone : f->second, rng));
      }
      for (const auto& result :
           SendAll(*relay_stub_, forward, /*streams=*/false, rng)) {
        ASSERT_FALSE(result.has_error()) << result.error().message();
      }
      if (!backward) continue;
      std::vector<v1::Contribution> back;
      for (int r = 0; r < kWorld; ++r) back.push_back(Backward(job, step, r));
      for (const auto& result :
           SendAll(*relay_stub_, back, /*streams=*/true, rng)) {
        ASSERT_FALSE(result.has_error()) << result.error().message();
      }
    }
  }

  v1::StatsHealth Health(const std::string& job) {
    v1::GetStatsHealthRequest request;
    request.set_job_id(job);
    grpc::ClientContext context;
    v1::StatsHealth health;
    const grpc::Status s = shard_->GetStatsHealth(&context, request, &health);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return health;
  }
};

TEST_F(RelayHealthTest, HealthyRanksBehindARelayAreScoredAndRaiseNoFlag) {
  StartRelay();
  CreateHealthJob("healthy");
  std::mt19937 rng(341);
  constexpr int kSteps = 40;
  Train("healthy", kSteps, /*backward=*/false, {}, rng);
  const RelayCounters counters = relay_->counters();
  EXPECT_EQ(counters.blocks_forwarded, kSteps * kWorld / 8);
  EXPECT_EQ(counters.passed_through, 0);
  // Every rank of every round scored; all but the last round's went up
  // (with the next step's FORWARD).
  EXPECT_EQ(counters.ranks_scored, kSteps * kWorld);
  EXPECT_EQ(counters.health_sent, (kSteps - 1) * kWorld);
  const v1::StatsHealth health = Health("healthy");
  EXPECT_EQ(health.rounds_scored(), kSteps);
  EXPECT_EQ(health.flags_in_force(), 0);
  for (const v1::HealthFlag& f : health.flags()) {
    ADD_FAILURE() << "rank " << f.rank() << " flagged, kind " << f.kind()
                  << ", score " << f.score();
  }
}

TEST_F(RelayHealthTest, ABrokenRankBehindARelayIsFlaggedByItsRank) {
  StartRelay();
  CreateHealthJob("broken");
  std::mt19937 rng(342);
  // In three blocks: shifted, scaled, a channel stuck.
  const std::map<int, Fault> faults = {
      {13, Fault::kShift}, {21, Fault::kScale}, {5, Fault::kStuck}};
  Train("broken", 6, /*backward=*/true, faults, rng);
  const v1::StatsHealth health = Health("broken");
  std::map<int, std::set<int>> kinds;  // by rank
  for (const v1::HealthFlag& f : health.flags()) {
    EXPECT_TRUE(f.active()) << "rank " << f.rank();
    EXPECT_EQ(f.layer(), 0);
    EXPECT_EQ(f.group(), 0);
    EXPECT_EQ(f.first_step(), 0) << "rank " << f.rank();
    kinds[f.rank()].insert(f.kind());
    if (f.kind() == v1::HealthFlag::STUCK_CHANNEL) {
      EXPECT_EQ(f.channel(), 7);
    }
  }
  // Each broken rank by its own kind (a scaled batch's mean strays too),
  // and no healthy rank.
  EXPECT_THAT(kinds,
              ::testing::UnorderedElementsAre(
                  ::testing::Key(5), ::testing::Key(13), ::testing::Key(21)));
  EXPECT_THAT(kinds[13], ElementsAre(v1::HealthFlag::MEAN_SHIFT));
  EXPECT_TRUE(kinds[21].count(v1::HealthFlag::VARIANCE_RATIO));
  EXPECT_THAT(kinds[5], ElementsAre(v1::HealthFlag::STUCK_CHANNEL));
  EXPECT_EQ(relay_->counters().passed_through, 0);
}

// Through a tree: the ranks' own relays (blocks of 8) score them, their
// scores ride up inside their blocks through the parent (blocks of 32),
// and the shard flags the broken rank by its rank.
TEST_F(RelayHealthTest, ARankTwoLevelsDownIsFlaggedByItsRank) {
  std::unique_ptr<RelayServer> parent =
      StartTreeRelay(aggregator_->address(), 32, "");
  ASSERT_NE(parent, nullptr);
  RelayOptions child;
  child.parent_relay = AddressOf(*parent);
  child.pass_through_margin = absl::Milliseconds(40);
  StartRelay(child);
  CreateHealthJob("tree");
  std::mt19937 rng(344);
  Train("tree", 6, /*backward=*/true, {{13, Fault::kShift}}, rng);
  const v1::StatsHealth health = Health("tree");
  ASSERT_EQ(health.flags_size(), 1);
  EXPECT_EQ(health.flags(0).rank(), 13);
  EXPECT_EQ(health.flags(0).kind(), v1::HealthFlag::MEAN_SHIFT);
  // The child scored every rank; the parent, holding only blocks, none.
  EXPECT_EQ(relay_->counters().ranks_scored, 6 * kWorld);
  EXPECT_EQ(parent->counters().ranks_scored, 0);
  EXPECT_EQ(parent->counters().blocks_forwarded, 6 * 2);
  EXPECT_EQ(parent->counters().passed_through, 0);
}

// A rank ten standard deviations off (a wrong input normalization) puts
// between-rank spread into the rest of the group's variance: the relay
// judges each rank's variance against its own block's, so the others'
// variances do not look small, and only that rank is flagged.
TEST_F(RelayHealthTest, AFarOffRankFlagsItselfAndNoOther) {
  StartRelay();
  CreateHealthJob("far");
  std::mt19937 rng(343);
  Train("far", 5, /*backward=*/false, {{29, Fault::kFarOff}}, rng);
  const v1::StatsHealth health = Health("far");
  ASSERT_EQ(health.flags_size(), 1);
  EXPECT_EQ(health.flags(0).rank(), 29);
  EXPECT_EQ(health.flags(0).kind(), v1::HealthFlag::MEAN_SHIFT);
  EXPECT_EQ(relay_->counters().passed_through, 0);
}

}  // namespace
}  // namespace syncnorm
