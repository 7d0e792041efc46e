// The relay's block path against a fake shard that says it takes blocks:
// what goes up (one contribution per complete block, its RelayBlock, its
// merge), what comes back to every rank of the block, and when the ranks go
// through one by one instead. The merge is held to the real aggregator:
// the blocks of a 16-rank round, sent as the two ranks of a 2-rank round,
// give bit for bit the 16-rank round's result (an aligned block is a
// subtree of the shard's merge).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/round_update.h"
#include "relay/relay_server.h"
#include "server/domain/contribution.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "testing/local_aggregator.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int kChannels = 5;

// A shard that takes blocks: GetJob answers `info`; ReduceOnce records what
// came and answers at once, a block ABORTED while `abort_blocks`.
class FakeShard final : public v1::Aggregator::CallbackService {
 public:
  explicit FakeShard(v1::JobInfo info,
                     const std::string& listen = "127.0.0.1:0")
      : info_(std::move(info)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeShard() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobInfo* response) override {
    {
      absl::MutexLock lock(&mu_);
      *response = info_;
      ++get_jobs_;
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* ReduceOnce(grpc::CallbackServerContext* context,
                                       const v1::Contribution* request,
                                       v1::RoundResult* response) override {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      received_.push_back(*request);
      if (request->has_relay() && abort_blocks_) {
        status = grpc::Status(grpc::StatusCode::ABORTED,
                              "membership version 2 moved under the block");
      }
    }
    response->set_job_id(request->job_id());
    response->set_layer(request->layer());
    response->set_step(request->step());
    response->set_phase(request->phase());
    // Tells the ranks which contribution was answered.
    response->set_version(request->has_relay()
                              ? 1000 + request->relay().first_position()
                              : request->rank());
    auto* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  std::vector<v1::Contribution> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  void set_abort_blocks(bool abort) {
    absl::MutexLock lock(&mu_);
    abort_blocks_ = abort;
  }
  int get_jobs() {
    absl::MutexLock lock(&mu_);
    return get_jobs_;
  }
  void set_info(v1::JobInfo info) {
    absl::MutexLock lock(&mu_);
    info_ = std::move(info);
  }

 private:
  absl::Mutex mu_;
  v1::JobInfo info_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::Contribution> received_ ABSL_GUARDED_BY(mu_);
  bool abort_blocks_ ABSL_GUARDED_BY(mu_) = false;
  int get_jobs_ ABSL_GUARDED_BY(mu_) = 0;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

v1::JobInfo Job(int world, int group_size) {
  v1::JobInfo info;
  info.set_job_id("j");
  info.set_world_size(world);
  info.set_group_size(group_size);
  info.set_round_timeout_ms(10000);
  info.set_next_step(0);
  info.set_accepts_relay_blocks(true);
  info.add_layers()->set_num_features(kChannels);
  return info;
}

// Random moments of rank r: a count from 1 to 9, means and M2 of a
// normal batch's order.
v1::Contribution Forward(const std::string& job, int rank, int64_t step,
                         std::mt19937& rng) {
  std::normal_distribution<double> value(0.5, 2.0);
  std::uniform_int_distribution<int> count(1, 9);
  v1::Contribution c;
  c.set_job_id(job);
  c.set_step(step);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(count(rng));
  for (int ch = 0; ch < kChannels; ++ch) {
    c.mutable_moments()->add_mean(value(rng));
    c.mutable_moments()->add_m2(std::fabs(value(rng)) * 3);
  }
  return c;
}

// ReduceOnce of each contribution from its own thread, in a random order.
std::vector<grpc::Status> SendAll(v1::Aggregator::Stub& stub,
                                  const std::vector<v1::Contribution>& cs,
                                  std::vector<v1::RoundResult>& results,
                                  std::mt19937& rng) {
  results.assign(cs.size(), v1::RoundResult());
  std::vector<grpc::Status> statuses(cs.size());
  std::vector<int> order(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) order[i] = static_cast<int>(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < order.size(); ++k) {
    threads.emplace_back([&, i = order[k], k] {
      absl::SleepFor(absl::Milliseconds(k));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
      statuses[i] = stub.ReduceOnce(&context, cs[i], &results[i]);
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

std::unique_ptr<v1::Aggregator::Stub> StubFor(const std::string& address) {
  return v1::Aggregator::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

class RelayBlockTest : public ::testing::Test {
 protected:
  void Start(v1::JobInfo info, RelayOptions options = {}) {
    shard_ = std::make_unique<FakeShard>(std::move(info));
    options.listen = "127.0.0.1:0";
    options.upstream = shard_->address();
    options.close_read_floods = false;  // in-process
    absl::StatusOr<std::unique_ptr<RelayServer>> relay =
        RelayServer::Start(options);
    ASSERT_TRUE(relay.ok()) << relay.status();
    relay_ = *std::move(relay);
    stub_ = StubFor(absl::StrCat("127.0.0.1:", relay_->port()));
  }

  std::vector<v1::Contribution> Blocks() {
    std::vector<v1::Contribution> blocks;
    for (v1::Contribution& c : shard_->received()) {
      if (c.has_relay()) blocks.push_back(std::move(c));
    }
    std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) {
      return a.relay().first_position() < b.relay().first_position();
    });
    return blocks;
  }

  std::unique_ptr<FakeShard> shard_;
  std::unique_ptr<RelayServer> relay_;
  std::unique_ptr<v1::Aggregator::Stub> stub_;
};

uint64_t Fingerprint(const v1::Contribution& c) {
  return ContributionFingerprint(Payload(FromProto(c.moments())),
                                 RoundUpdateFromProto(c));
}

TEST_F(RelayBlockTest, CompleteBlocksGoUpOnceEachAndAreTheDirectSubtrees) {
  constexpr int kWorld = 16;
  Start(Job(kWorld, 0));
  std::mt19937 rng(11);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < kWorld; ++r) cs.push_back(Forward("j", r, 0, rng));
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Two contributions went up, one per block of 8, each answered to its
  // own ranks.
  EXPECT_EQ(shard_->received().size(), 2u);
  const std::vector<v1::Contribution> blocks = Blocks();
  ASSERT_EQ(blocks.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    SCOPED_TRACE(absl::StrCat("block ", b));
    const v1::RelayBlock& block = blocks[b].relay();
    EXPECT_EQ(blocks[b].rank(), 8 * b);
    EXPECT_EQ(block.first_position(), 8 * b);
    EXPECT_EQ(block.positions(), 8);
    EXPECT_THAT(block.rank_runs(), ElementsAre(8 * b, 8 * b + 7));
    EXPECT_EQ(block.fingerprint_kind(), 2);
    std::vector<uint64_t> want;
    for (int r = 8 * b; r < 8 * b + 8; ++r) want.push_back(Fingerprint(cs[r]));
    EXPECT_THAT(block.fingerprints(), ElementsAreArray(want));
    for (int r = 8 * b; r < 8 * b + 8; ++r) {
      EXPECT_EQ(results[r].version(), 1000 + 8 * b) << "rank " << r;
    }
  }

  // The blocks as the two ranks of a direct round give, bit for bit, the
  // direct round of the 16 ranks.
  absl::StatusOr<std::unique_ptr<testing::LocalAggregator>> aggregator =
      testing::LocalAggregator::Start();
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  auto direct = StubFor((*aggregator)->address());
  for (auto [job, world] : {std::pair<std::string, int>("w16", 16),
                            std::pair<std::string, int>("w2", 2)}) {
    v1::CreateJobRequest request;
    request.set_job_id(job);
    request.set_world_size(world);
    request.add_layers()->set_num_features(kChannels);
    grpc::ClientContext context;
    v1::JobInfo info;
    ASSERT_TRUE(direct->CreateJob(&context, request, &info).ok());
  }
  for (auto& c : cs) c.set_job_id("w16");
  std::vector<v1::Contribution> two = blocks;
  for (int b = 0; b < 2; ++b) {
    two[b].set_job_id("w2");
    two[b].set_rank(b);
    two[b].clear_relay();
  }
  std::vector<v1::RoundResult> of16;
  std::vector<v1::RoundResult> of2;
  for (const grpc::Status& s : SendAll(*direct, cs, of16, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (const grpc::Status& s : SendAll(*direct, two, of2, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const v1::GlobalMoments& a = of16[0].moments();
  const v1::GlobalMoments& b = of2[0].moments();
  EXPECT_EQ(a.count(), b.count());
  ASSERT_EQ(a.mean_size(), b.mean_size());
  EXPECT_EQ(std::memcmp(a.mean().data(), b.mean().data(),
                        sizeof(double) * a.mean_size()),
            0);
  EXPECT_EQ(std::memcmp(a.var().data(), b.var().data(),
                        sizeof(double) * a.var_size()),
            0);
}

// A new step is no reason to read the job again: the relay read it once,
// and ten steps of a job whose members do not change go up as blocks
// without another GetJob on their way.
TEST_F(RelayBlockTest, NewStepsGoUpWithoutReadingTheJobAgain) {
  constexpr int kWorld = 8;
  Start(Job(kWorld, 0));
  std::mt19937 rng(5);
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<v1::Contribution> cs;
    for (int r = 0; r < kWorld; ++r) cs.push_back(Forward("j", r, step, rng));
    std::vector<v1::RoundResult> results;
    for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  EXPECT_EQ(Blocks().size(), 10u);
  EXPECT_EQ(shard_->get_jobs(), 1);
}

TEST_F(RelayBlockTest, APartialLastBlockAndARemovedRankMergeTheMembersOnly) {
  // Groups of 12: the second block of each holds positions 8..11. Rank 3
  // left at step 0: block 0 of group 0 has 7 members.
  v1::JobInfo info = Job(24, 12);
  v1::MembershipChange* change = info.mutable_membership()->add_history();
  change->set_step(0);
  for (int r : {0, 2, 4, 23}) change->add_member_runs(r);
  Start(info);
  std::mt19937 rng(12);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 24; ++r) {
    if (r != 3) cs.push_back(Forward("j", r, 0, rng));
  }
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::vector<v1::Contribution> blocks = Blocks();
  EXPECT_EQ(shard_->received().size(), 4u);
  ASSERT_EQ(blocks.size(), 4u);
  std::vector<std::vector<int>> runs;
  std::vector<int> firsts;
  for (const auto& b : blocks) {
    runs.emplace_back(b.relay().rank_runs().begin(),
                      b.relay().rank_runs().end());
    firsts.push_back(b.rank());
    EXPECT_EQ(b.relay().positions(), 8);
  }
  EXPECT_THAT(firsts, ::testing::UnorderedElementsAre(0, 8, 12, 20));
  EXPECT_THAT(runs, ::testing::UnorderedElementsAre(
                        ElementsAre(0, 2, 4, 7), ElementsAre(8, 11),
                        ElementsAre(12, 19), ElementsAre(20, 23)));
  for (const auto& b : blocks) {
    EXPECT_EQ(b.relay().fingerprints_size(), b.rank() == 0 ? 7
                                             : b.rank() == 8 || b.rank() == 20
                                                 ? 4
                                                 : 8);
  }
}

TEST_F(RelayBlockTest, ALateRetryAndAnAbortedBlockGoThroughRankByRank) {
  Start(Job(8, 0));
  std::mt19937 rng(13);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 8; ++r) cs.push_back(Forward("j", r, 0, rng));
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(Blocks().size(), 1u);
  // A retry of rank 5 after the block was answered goes up on its own.
  {
    grpc::ClientContext context;
    v1::RoundResult retry;
    ASSERT_TRUE(stub_->ReduceOnce(&context, cs[5], &retry).ok());
    EXPECT_EQ(retry.version(), 5);
    const std::vector<v1::Contribution> got = shard_->received();
    ASSERT_EQ(got.size(), 2u);
    EXPECT_FALSE(got[1].has_relay());
    EXPECT_EQ(got[1].SerializeAsString(), cs[5].SerializeAsString());
  }
  // The next step's block is ABORTED: each rank goes through unmerged,
  // and each gets its own answer.
  shard_->set_abort_blocks(true);
  cs.clear();
  for (int r = 0; r < 8; ++r) cs.push_back(Forward("j", r, 1, rng));
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int r = 0; r < 8; ++r) EXPECT_EQ(results[r].version(), r);
  EXPECT_EQ(shard_->received().size(), 2u + 1u + 8u);
}

TEST_F(RelayBlockTest, DisagreeingUpdatesGoThroughForTheShardToJudge) {
  Start(Job(8, 0));
  std::mt19937 rng(14);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 8; ++r) {
    cs.push_back(Forward("j", r, 0, rng));
    cs.back().mutable_momentum()->set_momentum_mode(v1::MOMENTUM_TORCH);
    cs.back().mutable_momentum()->set_momentum(r == 6 ? 0.2 : 0.1);
  }
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_THAT(Blocks(), IsEmpty());
  EXPECT_EQ(shard_->received().size(), 8u);
}

TEST_F(RelayBlockTest, AStaleSynchronousJobGoesThroughRankByRank) {
  // Each answer of a stale job is its rank's own view: no block serves it.
  v1::JobInfo info = Job(8, 0);
  info.set_staleness(2);
  Start(info);
  std::mt19937 rng(17);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 8; ++r) cs.push_back(Forward("j", r, 0, rng));
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_THAT(Blocks(), IsEmpty());
  EXPECT_EQ(shard_->received().size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(results[r].version(), r);
}

TEST_F(RelayBlockTest, PastMaxJobsTheIdlestJobGoesAndABusyRelayRefuses) {
  RelayOptions options;
  options.max_jobs = 1;
  Start(Job(2, 0), options);
  std::mt19937 rng(18);
  // Drawn up front: the ranks send from several threads.
  std::map<std::tuple<std::string, int, int64_t>, v1::Contribution> cs;
  for (const char* job : {"a", "b"}) {
    for (int rank : {0, 1}) {
      for (int64_t step : {0, 1}) {
        cs[{job, rank, step}] = Forward(job, rank, step, rng);
      }
    }
  }
  auto reduce = [&](const std::string& job, int rank, int64_t step) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::RoundResult result;
    return stub_->ReduceOnce(&context, cs.at({job, rank, step}), &result);
  };
  // Job a's block waits for rank 1: the relay is full.
  std::thread waiting([&] { EXPECT_TRUE(reduce("a", 0, 0).ok()); });
  absl::SleepFor(absl::Milliseconds(100));
  const grpc::Status refused = reduce("b", 0, 0);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("--max_jobs"));
  EXPECT_TRUE(reduce("a", 1, 0).ok());
  waiting.join();
  // Job a is idle now: job b takes its place.
  std::thread b0([&] { EXPECT_TRUE(reduce("b", 0, 1).ok()); });
  EXPECT_TRUE(reduce("b", 1, 1).ok());
  b0.join();
}

TEST_F(RelayBlockTest, PastItsCapAJobsNewBlockRoundIsRefusedNamingTheCap) {
  v1::JobInfo info = Job(16, 0);
  info.set_round_timeout_ms(400);
  RelayOptions options;
  options.max_pending_blocks_per_job = 1;
  Start(info, options);
  std::mt19937 rng(19);
  const v1::Contribution first = Forward("j", 0, 0, rng);
  const v1::Contribution other_block = Forward("j", 8, 0, rng);
  // Block 0 waits (until it goes through before the timeout).
  std::thread waiting([&] {
    grpc::ClientContext context;
    v1::RoundResult result;
    EXPECT_TRUE(stub_->ReduceOnce(&context, first, &result).ok());
  });
  while (shard_->get_jobs() == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(50));
  grpc::ClientContext context;
  v1::RoundResult result;
  const grpc::Status refused =
      stub_->ReduceOnce(&context, other_block, &result);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              ::testing::HasSubstr("--max_pending_blocks_per_job"));
  waiting.join();
  // Nothing of the refused contribution went up.
  for (const v1::Contribution& c : shard_->received()) EXPECT_EQ(c.rank(), 0);
}

TEST(RelayUpstreamTest, ContributionsWaitForAShardThatComesUpLate) {
  // A port nothing listens on yet.
  int port = 0;
  {
    FakeShard probe(Job(8, 0));
    port = std::stoi(probe.address().substr(probe.address().rfind(':') + 1));
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  RelayOptions options;
  options.listen = "127.0.0.1:0";
  options.upstream = address;
  options.close_read_floods = false;  // in-process
  absl::StatusOr<std::unique_ptr<RelayServer>> relay =
      RelayServer::Start(options);
  ASSERT_TRUE(relay.ok()) << relay.status();
  auto stub = StubFor(absl::StrCat("127.0.0.1:", (*relay)->port()));
  std::mt19937 rng(20);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 8; ++r) cs.push_back(Forward("j", r, 0, rng));
  std::unique_ptr<FakeShard> shard;
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    shard = std::make_unique<FakeShard>(Job(8, 0), address);
  });
  std::vector<v1::RoundResult> results;
  const std::vector<grpc::Status> statuses = SendAll(*stub, cs, results, rng);
  late.join();
  for (int r = 0; r < 8; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].error_message();
    // The job could not be read: each rank went through on its own, resent
    // until the shard took it.
    EXPECT_EQ(results[r].version(), r);
  }
  EXPECT_EQ(shard->received().size(), 8u);
  (*relay)->Shutdown();
}

TEST_F(RelayBlockTest, AnIncompleteBlockGoesThroughBeforeTheRoundTimeout) {
  v1::JobInfo info = Job(8, 0);
  info.set_round_timeout_ms(300);
  RelayOptions options;
  options.pass_through_margin = absl::Milliseconds(50);
  Start(info, options);
  std::mt19937 rng(15);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 7; ++r) cs.push_back(Forward("j", r, 0, rng));
  const absl::Time start = absl::Now();
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(240));
  EXPECT_LT(took, absl::Milliseconds(2000));
  EXPECT_THAT(Blocks(), IsEmpty());
  EXPECT_EQ(shard_->received().size(), 7u);
}

TEST_F(RelayBlockTest, ARemoveReadAtTheRefreshReleasesTheWaitingBlock) {
  Start(Job(8, 0));
  std::mt19937 rng(16);
  std::vector<v1::Contribution> cs;
  for (int r = 0; r < 7; ++r) cs.push_back(Forward("j", r, 0, rng));
  // Rank 7 is removed while the block waits for it (after the relay read
  // the job for the block): the relay's next read of the job sees it.
  std::thread remove([&] {
    while (shard_->get_jobs() == 0) absl::SleepFor(absl::Milliseconds(1));
    v1::JobInfo info = Job(8, 0);
    v1::MembershipChange* change = info.mutable_membership()->add_history();
    change->set_step(0);
    change->add_member_runs(0);
    change->add_member_runs(6);
    shard_->set_info(info);
  });
  const absl::Time start = absl::Now();
  std::vector<v1::RoundResult> results;
  for (const grpc::Status& s : SendAll(*stub_, cs, results, rng)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  remove.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Its members changed under it: it went through rank by rank.
  EXPECT_THAT(Blocks(), IsEmpty());
  EXPECT_EQ(shard_->received().size(), 7u);
}

}  // namespace
}  // namespace syncnorm
