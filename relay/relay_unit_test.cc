// The relay's pieces without a network: the job's layout and membership as
// GetJob describes them, the missing ranks of a ReduceOnce error, the
// timer queue, a block round holding its ranks' and child relays' blocks,
// the scores of a block's ranks and when they go up, what gRPC's
// connection failures say of the TLS to a shard, the metrics' families.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "relay/answers.h"
#include "relay/block_health.h"
#include "relay/block_round.h"
#include "relay/job_view.h"
#include "relay/relay_metrics.h"
#include "relay/relay_tls.h"
#include "relay/timer_queue.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(JobViewTest, ConsecutiveGroupsPlaceRanksInBlocks) {
  v1::JobInfo info;
  info.set_world_size(24);
  info.set_group_size(12);
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  std::optional<RankPlace> p = v->Place(21, 8);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->group, 1);
  EXPECT_EQ(p->position, 9);
  EXPECT_EQ(p->block, 1);
  // The last block of a group of 12 holds 4 positions.
  EXPECT_THAT(v->PositionRanks(1, 8, 8), ElementsAre(20, 21, 22, 23));
  EXPECT_FALSE(v->Place(24, 8).has_value());
  EXPECT_FALSE(v->Place(-1, 8).has_value());
}

TEST(JobViewTest, ExplicitGroupsUseTheirListsPositions) {
  v1::JobInfo info;
  info.set_world_size(4);
  for (auto ranks : {std::vector<int>{0, 2}, std::vector<int>{1, 3}}) {
    v1::RankGroup* g = info.add_groups();
    for (int r : ranks) g->add_ranks(r);
  }
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  std::optional<RankPlace> p = v->Place(3, 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->group, 1);
  EXPECT_EQ(p->position, 1);
  EXPECT_THAT(v->PositionRanks(1, 0, 2), ElementsAre(1, 3));
}

TEST(JobViewTest, MembershipChangesApplyFromTheirStep) {
  v1::JobInfo info;
  info.set_world_size(8);
  v1::MembershipChange* first = info.mutable_membership()->add_history();
  first->set_step(0);
  for (int r : {0, 7}) first->add_member_runs(r);
  v1::MembershipChange* second = info.mutable_membership()->add_history();
  second->set_step(5);
  for (int r : {0, 2, 4, 7}) second->add_member_runs(r);  // 3 left
  absl::StatusOr<JobView> v = JobView::FromProto(info);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->IsMember(3, 4));
  EXPECT_FALSE(v->IsMember(3, 5));
  EXPECT_TRUE(v->IsMember(4, 100));
}

TEST(JobViewTest, RefusesBadRuns) {
  v1::JobInfo info;
  info.set_world_size(4);
  v1::MembershipChange* c = info.mutable_membership()->add_history();
  for (int r : {0, 9}) c->add_member_runs(r);
  EXPECT_FALSE(JobView::FromProto(info).ok());
}

TEST(MissingRanksOfTest, ReadsRankListsAndRuns) {
  EXPECT_THAT(MissingRanksOf("deadline waiting for ranks [2, 5-7]"),
              ElementsAre(2, 5, 6, 7));
  EXPECT_THAT(MissingRanksOf("round failed (missing ranks [3])"),
              ElementsAre(3));
  // Only some named: none rather than a wrong list.
  EXPECT_THAT(MissingRanksOf("waiting for ranks [0, 2, and 993 more]"),
              IsEmpty());
  EXPECT_THAT(MissingRanksOf("no ranks here"), IsEmpty());
  EXPECT_THAT(MissingRanksOf("ranks [4, 2]"), IsEmpty());
}

TEST(ErrorAnswerTest, EchoesTheKeyAndNamesTheMissingRanks) {
  v1::Contribution key;
  key.set_job_id("j");
  key.set_layer(3);
  key.set_step(9);
  key.set_phase(v1::BACKWARD);
  key.set_backward_index(1);
  RoundAnswer a = ErrorAnswer(
      key, absl::DeadlineExceededError("deadline waiting for ranks [1, 4]"));
  EXPECT_EQ(a->result.job_id(), "j");
  EXPECT_EQ(a->result.layer(), 3);
  EXPECT_EQ(a->result.step(), 9);
  EXPECT_EQ(a->result.phase(), v1::BACKWARD);
  EXPECT_EQ(a->result.backward_index(), 1);
  EXPECT_EQ(a->result.error().code(),
            static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(a->result.error().missing_ranks(), ElementsAre(1, 4));
  const grpc::Status s = UnaryStatus(a->result);
  // The bytes a stream writes are the message.
  v1::RoundResult parsed;
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(a->bytes.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.SerializeAsString(), a->result.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(), "deadline waiting for ranks [1, 4]");
}

TEST(TimerQueueTest, RunsInTimeOrderAndDropsAfterStop) {
  TimerQueue timers;
  std::vector<int> order;
  absl::Mutex mu;
  absl::Notification done;
  const absl::Time now = absl::Now();
  timers.At(now + absl::Milliseconds(60), [&] {
    absl::MutexLock l(&mu);
    order.push_back(3);
    done.Notify();
  });
  timers.At(now + absl::Milliseconds(30), [&] {
    absl::MutexLock l(&mu);
    order.push_back(2);
  });
  timers.At(now - absl::Seconds(1), [&] {
    absl::MutexLock l(&mu);
    order.push_back(1);
  });
  done.WaitForNotification();
  EXPECT_GE(absl::Now() - now, absl::Milliseconds(60));
  timers.Stop();
  std::atomic<bool> ran{false};
  timers.At(now, [&] { ran = true; });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(ran);
  absl::MutexLock l(&mu);
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
}

// Rank r's FORWARD contribution at step 3: random moments of 5 channels.
v1::Contribution Leaf(int rank, std::mt19937& rng) {
  std::normal_distribution<double> value(0.5, 2.0);
  v1::Contribution c;
  c.set_job_id("j");
  c.set_step(3);
  c.set_phase(v1::FORWARD);
  c.set_rank(rank);
  c.mutable_moments()->set_count(1 + rank % 4);
  for (int ch = 0; ch < 5; ++ch) {
    c.mutable_moments()->add_mean(value(rng));
    c.mutable_moments()->add_m2(std::abs(value(rng)));
  }
  return c;
}

std::vector<int> Iota(int first, int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

// A child relay's merged block of `members` among positions
// [first, first + n) (ranks = positions), from `leaves` by rank.
v1::Contribution ChildBlock(int first, int n, const std::vector<int>& members,
                            const std::vector<v1::Contribution>& leaves) {
  BlockRound child(Iota(first, n), members, first, n);
  for (int r : members) {
    v1::Contribution c = leaves[r];
    AnswerFn done = [](const RoundAnswer&) {};
    EXPECT_EQ(child.Add(c, done), BlockRound::Added::kHeld);
  }
  EXPECT_TRUE(child.complete());
  absl::StatusOr<v1::Contribution> merged = child.Merge();
  EXPECT_TRUE(merged.ok()) << merged.status();
  return merged.ok() ? *merged : v1::Contribution();
}

BlockRound::Added AddTo(BlockRound& round, v1::Contribution c) {
  AnswerFn done = [](const RoundAnswer&) {};
  return round.Add(c, done);
}

// Positions 0-7, rank 6 no member at the step.
const std::vector<int> kMembers = {0, 1, 2, 3, 4, 5, 7};

TEST(BlockRoundTest, ChildBlocksMergeBitForBitAsTheRanksThemselves) {
  std::mt19937 rng(7);
  std::vector<v1::Contribution> leaves;
  for (int r = 0; r < 8; ++r) leaves.push_back(Leaf(r, rng));
  BlockRound flat(Iota(0, 8), kMembers, 0, 8);
  for (int r : kMembers)
    ASSERT_EQ(AddTo(flat, leaves[r]), BlockRound::Added::kHeld);
  absl::StatusOr<v1::Contribution> want = flat.Merge();
  ASSERT_TRUE(want.ok()) << want.status();

  // Ranks 0 and 1 themselves, a block of 2-3, a block of 4-7 without 6,
  // in every order of arrival.
  std::vector<v1::Contribution> parts = {leaves[0], leaves[1],
                                         ChildBlock(2, 2, {2, 3}, leaves),
                                         ChildBlock(4, 4, {4, 5, 7}, leaves)};
  std::vector<int> order = {0, 1, 2, 3};
  do {
    BlockRound nested(Iota(0, 8), kMembers, 0, 8);
    for (int i : order) {
      EXPECT_FALSE(nested.complete());
      ASSERT_EQ(AddTo(nested, parts[i]), BlockRound::Added::kHeld);
    }
    ASSERT_TRUE(nested.complete());
    absl::StatusOr<v1::Contribution> got = nested.Merge();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->SerializeAsString(), want->SerializeAsString())
        << got->DebugString() << "\nwant\n"
        << want->DebugString();
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(BlockRoundTest, RefusesAChildBlockThatDoesNotFitAndHoldsNothingOfIt) {
  std::mt19937 rng(8);
  std::vector<v1::Contribution> leaves;
  for (int r = 0; r < 8; ++r) leaves.push_back(Leaf(r, rng));
  const v1::Contribution good = ChildBlock(4, 4, {4, 5, 7}, leaves);
  const std::vector<
      std::pair<const char*, std::function<void(v1::RelayBlock&)>>>
      bad = {
          {"a run past its members",
           [](v1::RelayBlock& b) { b.set_rank_runs(3, 8); }},
          {"a run of two billion ranks",
           [](v1::RelayBlock& b) {
             b.clear_rank_runs();
             b.add_rank_runs(4);
             b.add_rank_runs(2147483647);
           }},
          {"a run backwards",
           [](v1::RelayBlock& b) {
             b.clear_rank_runs();
             b.add_rank_runs(5);
             b.add_rank_runs(4);
             b.add_rank_runs(7);
             b.add_rank_runs(7);
           }},
          {"a member left out",
           [](v1::RelayBlock& b) {
             b.clear_rank_runs();
             b.add_rank_runs(4);
             b.add_rank_runs(5);
           }},
          {"an odd number of run ends",
           [](v1::RelayBlock& b) { b.add_rank_runs(7); }},
          {"a fingerprint short",
           [](v1::RelayBlock& b) { b.mutable_fingerprints()->RemoveLast(); }},
          {"another fingerprint kind",
           [](v1::RelayBlock& b) { b.set_fingerprint_kind(1); }},
          {"positions not a power of two",
           [](v1::RelayBlock& b) { b.set_positions(3); }},
          {"a block larger than this one",
           [](v1::RelayBlock& b) { b.set_positions(16); }},
          {"no positions", [](v1::RelayBlock& b) { b.set_positions(0); }},
          {"misaligned", [](v1::RelayBlock& b) { b.set_first_position(2); }},
          {"outside this block",
           [](v1::RelayBlock& b) { b.set_first_position(8); }},
          {"negative", [](v1::RelayBlock& b) { b.set_first_position(-4); }},
      };
  for (const auto& [what, mutate] : bad) {
    SCOPED_TRACE(what);
    v1::Contribution c = good;
    mutate(*c.mutable_relay());
    BlockRound round(Iota(0, 8), kMembers, 0, 8);
    EXPECT_EQ(AddTo(round, c), BlockRound::Added::kRefused);
    // Nothing of it is held: the ranks' own contributions complete it.
    for (int r : kMembers) {
      ASSERT_EQ(AddTo(round, leaves[r]), BlockRound::Added::kHeld) << r;
    }
    EXPECT_TRUE(round.complete());
  }
  // Named by a rank that is not its first member.
  v1::Contribution c = good;
  c.set_rank(5);
  BlockRound round(Iota(0, 8), kMembers, 0, 8);
  EXPECT_EQ(AddTo(round, c), BlockRound::Added::kRefused);
}

TEST(BlockRoundTest, ABlockOverlappingWhatIsHeldIsRefusedAResendWaits) {
  std::mt19937 rng(9);
  std::vector<v1::Contribution> leaves;
  for (int r = 0; r < 8; ++r) leaves.push_back(Leaf(r, rng));
  const v1::Contribution block = ChildBlock(2, 2, {2, 3}, leaves);
  {
    // Rank 3 sent itself: a block with rank 3 is refused.
    BlockRound round(Iota(0, 8), kMembers, 0, 8);
    ASSERT_EQ(AddTo(round, leaves[3]), BlockRound::Added::kHeld);
    EXPECT_EQ(AddTo(round, block), BlockRound::Added::kRefused);
  }
  {
    // The block is held: rank 3 itself, or rank 2 itself, is refused; the
    // same block again waits with it; another payload for it is refused.
    BlockRound round(Iota(0, 8), kMembers, 0, 8);
    ASSERT_EQ(AddTo(round, block), BlockRound::Added::kHeld);
    EXPECT_EQ(AddTo(round, leaves[3]), BlockRound::Added::kRefused);
    EXPECT_EQ(AddTo(round, leaves[2]), BlockRound::Added::kRefused);
    EXPECT_EQ(AddTo(round, block), BlockRound::Added::kHeld);
    v1::Contribution other = block;
    other.mutable_moments()->set_mean(0, other.moments().mean(0) + 1);
    EXPECT_EQ(AddTo(round, other), BlockRound::Added::kRefused);
    for (int r : {0, 1, 4, 5, 7}) {
      ASSERT_EQ(AddTo(round, leaves[r]), BlockRound::Added::kHeld);
    }
    EXPECT_TRUE(round.complete());
    EXPECT_EQ(round.TakeHeld().at(2).waiters.size(), 2u);
  }
}

// One channel: rank 0 (4 values, mean 0, M2 24) and rank 1 (4 values,
// mean 3, M2 12) in this block, 8 values (mean 0, M2 28) in another. The
// round's answer: 16 values, mean 0.75, M2 91 (var 91/16). Worked out
// apart from the code: rank 1's mean against the other 12 values (mean
// 0, var 52/11) has z^2 = 9 / (52/11 (1/4 + 1/12)); rank 0's against
// mean 1, var 64/11, z^2 = 1 / (64/11 (1/3)). Each variance against the
// block's pooled one, 36 / 6: 4/6 and 8/6 over 3 degrees of freedom.
std::map<int, HeldContribution> TwoRanks(int64_t step) {
  std::map<int, HeldContribution> held;
  for (int r : {0, 1}) {
    v1::Contribution& c = held[r].contribution;
    c.set_rank(r);
    c.set_step(step);
    c.set_phase(v1::FORWARD);
    c.mutable_moments()->set_count(4);
    c.mutable_moments()->add_mean(r == 0 ? 0.0 : 3.0);
    c.mutable_moments()->add_m2(r == 0 ? 24.0 : 12.0);
  }
  return held;
}

v1::RoundResult Answer(int64_t step) {
  v1::RoundResult a;
  a.set_step(step);
  a.set_phase(v1::FORWARD);
  a.mutable_moments()->set_count(16);
  a.mutable_moments()->add_mean(0.75);
  a.mutable_moments()->add_var(91.0 / 16);
  return a;
}

v1::Contribution Next(v1::Phase phase, int64_t step,
                      std::vector<int> runs = {0, 1}) {
  v1::Contribution c;
  c.set_phase(phase);
  c.set_step(step);
  for (int r : runs) c.mutable_relay()->add_rank_runs(r);
  return c;
}

const BlockHealth::BlockId kBlock("job", 0, 3, 0, 0);

TEST(BlockHealthTest, ScoresEachRankAgainstTheRestOfItsGroup) {
  BlockHealth health;
  health.Score(kBlock, TwoRanks(5), Answer(5));
  v1::Contribution c = Next(v1::FORWARD, 6);
  health.Attach(kBlock, c);
  ASSERT_EQ(c.relay().health_size(), 2);
  const v1::RankHealth& r0 = c.relay().health(0);
  const v1::RankHealth& r1 = c.relay().health(1);
  EXPECT_EQ(r0.rank(), 0);
  EXPECT_EQ(r1.rank(), 1);
  EXPECT_EQ(r1.step(), 5);
  EXPECT_EQ(r1.count(), 4);
  EXPECT_NEAR(r1.mean_shift(), 2.1419878138859154, 1e-12);
  EXPECT_NEAR(r1.variance_ratio(), -0.19232950539786947, 1e-12);
  EXPECT_NEAR(r0.mean_shift(), 0.05113613395291277, 1e-12);
  EXPECT_NEAR(r0.variance_ratio(), 0.6419493765929746, 1e-12);
  EXPECT_FALSE(r1.has_stuck_channel());
  EXPECT_EQ(health.ranks_scored(), 2);
  EXPECT_EQ(health.entries_sent(), 2);
  // Sent once.
  v1::Contribution again = Next(v1::FORWARD, 7);
  health.Attach(kBlock, again);
  EXPECT_EQ(again.relay().health_size(), 0);
}

TEST(BlockHealthTest, ScoresGoUpWithALaterContributionOfTheirBlockOnly) {
  BlockHealth health;
  health.Score(kBlock, TwoRanks(5), Answer(5));
  // Another block, or the scored FORWARD itself (a retry of it), carry
  // nothing; the step's BACKWARD does, of the ranks still in the block.
  v1::Contribution other = Next(v1::FORWARD, 6);
  health.Attach(BlockHealth::BlockId("job", 0, 3, 0, 1), other);
  EXPECT_EQ(other.relay().health_size(), 0);
  v1::Contribution same = Next(v1::FORWARD, 5);
  health.Attach(kBlock, same);
  EXPECT_EQ(same.relay().health_size(), 0);
  v1::Contribution backward = Next(v1::BACKWARD, 5, {1, 1});
  health.Attach(kBlock, backward);
  ASSERT_EQ(backward.relay().health_size(), 1);
  EXPECT_EQ(backward.relay().health(0).rank(), 1);
  // An answer without moments (a failed round) scores nothing.
  v1::RoundResult failed;
  failed.set_phase(v1::FORWARD);
  failed.mutable_error()->set_code(4);
  health.Score(kBlock, TwoRanks(6), failed);
  EXPECT_EQ(health.ranks_scored(), 2);
}

TEST(BlockHealthTest, KeepsTheLatestRoundsOfABlockWhileNoneGoesUp) {
  BlockHealth health;
  // Scored out of order (two steps' answers at once): sent in step order.
  for (int64_t step : {0, 1, 3, 2, 4, 6, 5}) {
    health.Score(kBlock, TwoRanks(step), Answer(step));
  }
  v1::Contribution c = Next(v1::FORWARD, 7);
  health.Attach(kBlock, c);
  ASSERT_EQ(c.relay().health_size(), 2 * BlockHealth::kMaxRounds);
  for (int i = 0; i < c.relay().health_size(); ++i) {
    EXPECT_EQ(c.relay().health(i).step(), 7 - BlockHealth::kMaxRounds + i / 2);
  }
}

TEST(BlockHealthTest, ForgetsTheBlocksScoredLeastRecentlyPastItsBound) {
  BlockHealth health;
  // Two entries a block: one block more than the bound holds.
  const int blocks = static_cast<int>(BlockHealth::kMaxEntries / 2) + 1;
  for (int b = 0; b < blocks; ++b) {
    health.Score(BlockHealth::BlockId("job", 0, 3, 0, b), TwoRanks(5),
                 Answer(5));
  }
  v1::Contribution first = Next(v1::FORWARD, 6);
  health.Attach(BlockHealth::BlockId("job", 0, 3, 0, 0), first);
  EXPECT_EQ(first.relay().health_size(), 0);
  v1::Contribution second = Next(v1::FORWARD, 6);
  health.Attach(BlockHealth::BlockId("job", 0, 3, 0, 1), second);
  EXPECT_EQ(second.relay().health_size(), 2);
}

// The messages gRPC 1.51 gives a call whose connection failed, as
// relay_tls_test saw them.
grpc::Status Unavailable(const std::string& last_error) {
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      "failed to connect to all addresses; last error: " + last_error);
}

TEST(ConnectFailureTest, ToldApartByWhatGrpcSays) {
  // The relay's handshake failed: the wrong CA, a plaintext shard.
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNKNOWN: ipv4:127.0.0.1:42125: Ssl handshake failed: "
                "SSL_ERROR_SSL: error:0A000086:SSL "
                "routines::certificate verify failed")),
            ConnectFailure::kHandshake);
  EXPECT_EQ(ClassifyConnectFailure(
                Unavailable("UNKNOWN: ipv4:127.0.0.1:34895: Ssl handshake "
                            "failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                            "routines::wrong version number")),
            ConnectFailure::kHandshake);
  // The shard closed it: a TLS shard dialed in plaintext, or a proxy.
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNAVAILABLE: ipv4:127.0.0.1:42125: Socket closed")),
            ConnectFailure::kClosed);
  // A shard that is down, and a handshake cut by a broken connection.
  EXPECT_EQ(ClassifyConnectFailure(
                Unavailable("UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to "
                            "remote host: Connection refused")),
            ConnectFailure::kOther);
  EXPECT_EQ(ClassifyConnectFailure(Unavailable(
                "UNKNOWN: ipv4:10.0.0.7:50051: Ssl handshake failed: "
                "SSL_ERROR_SYSCALL")),
            ConnectFailure::kOther);
  // A call that broke on a connection that was up, and other codes.
  EXPECT_EQ(ClassifyConnectFailure(
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed")),
            ConnectFailure::kOther);
  EXPECT_EQ(ClassifyConnectFailure(
                grpc::Status(grpc::StatusCode::NOT_FOUND, "job 'x' not found")),
            ConnectFailure::kOther);
}

TEST(ConnectFailureTest, AProbeSeesTlsByTheShardsCertificate) {
  EXPECT_TRUE(ProbeSawTls(Unavailable(
      "UNKNOWN: ipv4:127.0.0.1:42125: Ssl handshake failed: SSL_ERROR_SSL: "
      "error:0A000086:SSL routines::certificate verify failed")));
  EXPECT_TRUE(ProbeSawTls(
      grpc::Status(grpc::StatusCode::NOT_FOUND, "job '' not found")));
  EXPECT_FALSE(ProbeSawTls(Unavailable(
      "UNKNOWN: ipv4:127.0.0.1:34895: Ssl handshake failed: SSL_ERROR_SSL: "
      "error:0A00010B:SSL routines::wrong version number")));
  EXPECT_FALSE(ProbeSawTls(
      Unavailable("UNAVAILABLE: ipv4:127.0.0.1:42125: Socket closed")));
  EXPECT_FALSE(ProbeSawTls(
      grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")));
}

TEST(ConnectFailureTest, TheRanksAreToldTheShardAndTheFlags) {
  const grpc::Status s = UpstreamTlsMismatch(
      2, "shard-2:50051", /*relay_tls=*/false, ConnectFailure::kClosed,
      Unavailable("UNAVAILABLE: ipv4:10.0.0.9:50051: Socket closed"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const char* part :
       {"shard 2 (shard-2:50051)", "--upstream_tls ", "--upstream_tls_root_ca",
        "--upstream_tls_client_cert", "Socket closed"}) {
    EXPECT_TRUE(absl::StrContains(s.error_message(), part))
        << part << ": " << s.error_message();
  }
}

TEST(RelayFamiliesTest, NameEveryReasonAndCode) {
  RelayLoad load;
  load.relay.passed_through_by[static_cast<int>(PassReason::kIncomplete)] = 3;
  load.service.answers[0] = 7;
  load.service.refusals[static_cast<int>(absl::StatusCode::kUnauthenticated)] =
      2;
  load.upstream.failures[UpstreamCounters::kGetJob][static_cast<int>(
      absl::StatusCode::kFailedPrecondition)] = 1;
  std::vector<std::string> samples;
  for (const prometheus::MetricFamily& f : RelayFamilies(load)) {
    EXPECT_TRUE(absl::StartsWith(f.name, "syncnorm_relay_")) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string labels;
      for (const auto& l : m.label) {
        labels += l.name + "=" + l.value + ",";
      }
      samples.push_back(f.name + "{" + labels + "}");
    }
  }
  auto has = [&](const std::string& sample) {
    return std::find(samples.begin(), samples.end(), sample) != samples.end();
  };
  EXPECT_TRUE(has("syncnorm_relay_passed_through_total{reason=incomplete,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_passed_through_total{reason=refused_by_shard,}"));
  EXPECT_TRUE(has("syncnorm_relay_answers_total{code=OK,}"));
  EXPECT_TRUE(has("syncnorm_relay_refusals_total{code=UNAUTHENTICATED,}"));
  EXPECT_TRUE(has("syncnorm_relay_refusals_total{code=RESOURCE_EXHAUSTED,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_upstream_failures_total{method=GetJob,code="
          "FAILED_PRECONDITION,}"));
  EXPECT_TRUE(
      has("syncnorm_relay_connections_closed_total{reason=rapid_reset,}"));
}

}  // namespace
}  // namespace syncnorm
