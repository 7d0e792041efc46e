// The relay between ranks and an aggregator in this process: rounds through
// it give bit for bit what the same contributions give sent directly, and
// match the float64 reference; an incomplete block completes by the
// job's quorum; what a relay does not serve is refused, saying why.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
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
using ::testing::HasSubstr;
namespace ref = ::syncnorm::reference;

constexpr int kChannels = 6;

std::unique_ptr<v1::Aggregator::Stub> StubFor(const std::string& address) {
  return v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// What the ranks of one round send, with the float64 reference of its
// result.
struct RoundInput {
  std::vector<v1::Contribution> contributions;  // by rank
  ref::Reals mean, var;                         // FORWARD
  ref::Reals sum_dy, sum_dy_xmu;                // BACKWARD
};

// Each rank's moments of its own random batch (1 to 5 rows of kChannels),
// and the reference statistics of the concatenated batch.
RoundInput ForwardInput(const std::string& job, int world, int64_t step,
                        std::mt19937& rng) {
  RoundInput in;
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
  std::vector<const std::vector<double>*> ptrs;
  for (const auto& x : xs) ptrs.push_back(&x);
  const ref::Stats global = ref::Moments(kChannels, layouts, ptrs);
  in.mean = global.mean;
  in.var = global.Var();
  return in;
}

RoundInput BackwardInput(const std::string& job, int world, int64_t step,
                         std::mt19937& rng) {
  RoundInput in;
  std::normal_distribution<double> value(0.0, 3.0);
  in.sum_dy.assign(kChannels, 0);
  in.sum_dy_xmu.assign(kChannels, 0);
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
      in.sum_dy[ch] += dy;
      in.sum_dy_xmu[ch] += dyx;
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
std::vector<v1::RoundResult> SendAll(v1::Aggregator::Stub& stub,
                                     const std::vector<v1::Contribution>& cs,
                                     bool streams, std::mt19937& rng) {
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
        auto rw = stub.Reduce(&context);
        if (!rw->Write(cs[i]) || !rw->Read(&results[i])) {
          results[i].mutable_error()->set_message("stream broke");
        }
        rw->WritesDone();
        rw->Finish().ok();
      } else {
        const grpc::Status s = stub.ReduceOnce(&context, cs[i], &results[i]);
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
                 int quorum = 0, int64_t grace_ms = 0) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.set_group_size(group_size);
    request.set_round_timeout_ms(10000);
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
      ref::ExpectClose(Values(relayed[r].moments().mean()), in.mean, 1e-12,
                       "mean");
      ref::ExpectClose(Values(relayed[r].moments().var()), in.var, 1e-12,
                       "var");
    } else {
      ASSERT_TRUE(relayed[r].has_grad_sums());
      EXPECT_TRUE(SameBits(relayed[r].grad_sums().sum_dy(),
                           direct[r].grad_sums().sum_dy()));
      EXPECT_TRUE(SameBits(relayed[r].grad_sums().sum_dy_xmu(),
                           direct[r].grad_sums().sum_dy_xmu()));
      ref::ExpectClose(Values(relayed[r].grad_sums().sum_dy()), in.sum_dy,
                       1e-12, "sum_dy");
      ref::ExpectClose(Values(relayed[r].grad_sums().sum_dy_xmu()),
                       in.sum_dy_xmu, 1e-12, "sum_dy_xmu");
    }
  }
}

TEST_F(RelayTest, RoundsThroughTheRelayAreBitForBitTheDirectOnes) {
  StartRelay();
  constexpr int kWorld = 16;
  CreateJob("direct", kWorld);
  CreateJob("relayed", kWorld);
  std::mt19937 rng(35);
  int rounds = 0;
  for (int64_t step = 0; step < 3; ++step) {
    for (bool forward : {true, false}) {
      SCOPED_TRACE(
          absl::StrCat("step ", step, forward ? " FORWARD" : " BACKWARD"));
      const RoundInput in = forward
                                ? ForwardInput("direct", kWorld, step, rng)
                                : BackwardInput("direct", kWorld, step, rng);
      const std::vector<v1::RoundResult> direct =
          SendAll(*shard_, in.contributions, /*streams=*/false, rng);
      const std::vector<v1::RoundResult> relayed =
          SendAll(*relay_stub_, ForJob(in.contributions, "relayed"),
                  /*streams=*/step % 2 == 0, rng);
      ExpectSameAsDirect(in, direct, relayed);
      ++rounds;
    }
  }
  // What went up: a block per 8 ranks when the shard takes blocks, else
  // every contribution on its own.
  const RelayCounters counters = relay_->counters();
  if (accepts_blocks_) {
    EXPECT_EQ(counters.blocks_forwarded, rounds * kWorld / 8);
    EXPECT_EQ(counters.passed_through, 0);
  } else {
    EXPECT_EQ(counters.blocks_forwarded, 0);
    EXPECT_EQ(counters.passed_through, rounds * kWorld);
  }
}

TEST_F(RelayTest, AnIncompleteBlockCompletesByTheQuorumNamingTheMissingRank) {
  RelayOptions options;
  options.pass_through_margin = absl::Milliseconds(50);
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

TEST_F(RelayTest, RefusesAContributionThatCarriesARelayBlock) {
  StartRelay();
  CreateJob("j", 2);
  std::mt19937 rng(1);
  RoundInput in = ForwardInput("j", 2, 0, rng);
  v1::Contribution block = in.contributions[0];
  block.mutable_relay()->set_positions(2);
  block.mutable_relay()->add_rank_runs(0);
  block.mutable_relay()->add_rank_runs(1);
  {
    grpc::ClientContext c;
    v1::RoundResult out;
    const grpc::Status s = relay_stub_->ReduceOnce(&c, block, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("relay block"));
  }
  const std::vector<v1::RoundResult> streamed =
      SendAll(*relay_stub_, {block}, /*streams=*/true, rng);
  ASSERT_TRUE(streamed[0].has_error());
  EXPECT_EQ(streamed[0].error().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(streamed[0].step(), 0);
  EXPECT_EQ(streamed[0].job_id(), "j");
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
  // A stream without a token is answered in-band.
  const std::vector<v1::RoundResult> streamed =
      SendAll(*relay_stub_, in.contributions, /*streams=*/true, rng);
  ASSERT_TRUE(streamed[0].has_error());
  EXPECT_EQ(streamed[0].error().code(),
            static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
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
  ASSERT_TRUE(client.CreateJob(request).ok());
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
    ref::ExpectClose(replies[r]->global.mean, in.mean, 1e-12, "mean");
    ref::ExpectClose(replies[r]->global.var, in.var, 1e-12, "var");
  }
  const RelayCounters counters = relay_->counters();
  EXPECT_EQ(counters.blocks_forwarded + counters.passed_through,
            accepts_blocks_ ? 1 : kWorld);
}

}  // namespace
}  // namespace syncnorm
