#include "client/thread_node.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kLongTimeout = absl::Seconds(20);

// The aggregator seen from the node: echoes the merged moments it receives
// as they are (m2 in the var field, so members see the merged bits), returns
// summed gradient sums unchanged, and records which thread sent and each
// backward round's (step, backward index) with its sums. Fails with
// the configured status when one is set; names the configured missing ranks
// (a quorum round).
class EchoUpstream : public NodeGroup {
 public:
  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& merged) override {
    absl::MutexLock lock(&mu_);
    ++forward_calls_;
    senders_.insert(std::this_thread::get_id());
    if (!forward_error_.ok()) return forward_error_;
    ForwardReply reply;
    reply.global.count = merged.count;
    reply.global.mean = merged.mean;
    reply.global.var = merged.m2;
    reply.version = ++version_;
    reply.missing_ranks = missing_ranks_;
    return reply;
  }
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& summed) override {
    absl::MutexLock lock(&mu_);
    ++backward_calls_;
    backward_rounds_[{step, backward}].push_back(summed);
    senders_.insert(std::this_thread::get_id());
    if (!backward_error_.ok()) return backward_error_;
    return summed;
  }

  void FailWith(absl::Status forward, absl::Status backward) {
    absl::MutexLock lock(&mu_);
    forward_error_ = std::move(forward);
    backward_error_ = std::move(backward);
  }
  void NameMissing(std::vector<int> ranks) {
    absl::MutexLock lock(&mu_);
    missing_ranks_ = std::move(ranks);
  }
  int forward_calls() {
    absl::MutexLock lock(&mu_);
    return forward_calls_;
  }
  int backward_calls() {
    absl::MutexLock lock(&mu_);
    return backward_calls_;
  }
  size_t distinct_senders() {
    absl::MutexLock lock(&mu_);
    return senders_.size();
  }
  // The sums sent upstream for each backward round (step, backward index).
  std::map<std::pair<int64_t, int>, std::vector<GradSums>> backward_rounds() {
    absl::MutexLock lock(&mu_);
    return backward_rounds_;
  }

 private:
  absl::Mutex mu_;
  absl::Status forward_error_ ABSL_GUARDED_BY(mu_);
  absl::Status backward_error_ ABSL_GUARDED_BY(mu_);
  int forward_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int backward_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> missing_ranks_ ABSL_GUARDED_BY(mu_);
  std::set<std::thread::id> senders_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int64_t, int>, std::vector<GradSums>> backward_rounds_
      ABSL_GUARDED_BY(mu_);
};

// Random local moments of `channels` channels: some ranks have an empty
// batch; means far apart in scale so that the fold order shows in the bits.
Moments RandomMoments(int channels, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> count(0, 40);
  std::uniform_real_distribution<double> unit(-1, 1);
  Moments m = Moments::Zero(channels);
  m.count = count(rng);
  if (m.count < 4) m.count = 0;  // about one part in ten is empty
  if (m.count == 0) return m;
  for (int c = 0; c < channels; ++c) {
    m.mean[c] = unit(rng) * std::pow(10.0, 3 * unit(rng));
    m.m2[c] = (1.5 + unit(rng)) * m.count * std::pow(10.0, 2 * unit(rng));
  }
  return m;
}

GradSums RandomGradSums(int channels, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(-1, 1);
  GradSums g;
  for (int c = 0; c < channels; ++c) {
    g.sum_dy.push_back(unit(rng) * std::pow(10.0, 4 * unit(rng)));
    g.sum_dy_xmu.push_back(unit(rng) * std::pow(10.0, 4 * unit(rng)));
  }
  return g;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Makes the threads of one round enter in the order of a permutation: the
// thread at position p waits until p threads have gone before it.
class ArrivalOrder {
 public:
  void WaitTurn(int position) {
    absl::MutexLock lock(&mu_);
    auto mine = [this, position]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return turn_ == position;
    };
    mu_.Await(absl::Condition(&mine));
    ++turn_;
  }

 private:
  absl::Mutex mu_;
  int turn_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(ThreadNodeTest, EveryArrivalOrderGivesTheRankOrderFoldBitForBit) {
  constexpr int kMembers = 4;
  constexpr int kRounds = 150;
  constexpr int kChannels = 5;
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(kMembers, std::move(upstream), kLongTimeout);

  // Inputs and the expected fold, all made up front.
  std::mt19937_64 rng(20240611);
  std::vector<std::vector<Moments>> parts(kRounds);
  std::vector<std::vector<GradSums>> grads(kRounds);
  std::vector<std::vector<int>> order(kRounds);  // position of each rank
  std::vector<Moments> want_moments(kRounds);
  std::vector<GradSums> want_grads(kRounds);
  for (int i = 0; i < kRounds; ++i) {
    for (int r = 0; r < kMembers; ++r) {
      parts[i].push_back(RandomMoments(kChannels, rng));
      grads[i].push_back(RandomGradSums(kChannels, rng));
    }
    want_moments[i] = parts[i][0];
    want_grads[i] = grads[i][0];
    for (int r = 1; r < kMembers; ++r) {
      MergeMoments(want_moments[i], parts[i][r]);
      AddGradSums(want_grads[i], grads[i][r]);
    }
    order[i].resize(kMembers);
    std::iota(order[i].begin(), order[i].end(), 0);
    std::shuffle(order[i].begin(), order[i].end(), rng);
  }

  std::vector<std::vector<ForwardReply>> got_forward(
      kMembers, std::vector<ForwardReply>(kRounds));
  std::vector<std::vector<GradSums>> got_backward(
      kMembers, std::vector<GradSums>(kRounds));
  std::vector<absl::Status> errors(kMembers);
  ArrivalOrder forward_order[kRounds], backward_order[kRounds];
  std::vector<std::thread> threads;
  for (int r = 0; r < kMembers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<NodeGroup> member = node.Member(r);
      for (int i = 0; i < kRounds; ++i) {
        forward_order[i].WaitTurn(order[i][r]);
        absl::StatusOr<ForwardReply> f =
            member->SyncForward(/*layer=*/i % 3, /*step=*/i, parts[i][r]);
        if (!f.ok()) {
          errors[r] = f.status();
          return;
        }
        got_forward[r][i] = *std::move(f);
        // The reverse order for the backward round of the same step.
        backward_order[i].WaitTurn(kMembers - 1 - order[i][r]);
        absl::StatusOr<GradSums> b =
            member->SyncBackward(i % 3, i, /*backward=*/0, grads[i][r]);
        if (!b.ok()) {
          errors[r] = b.status();
          return;
        }
        got_backward[r][i] = *std::move(b);
      }
    });
  }
  for (std::thread& t : threads) t.join();

  for (int r = 0; r < kMembers; ++r) ASSERT_TRUE(errors[r].ok()) << errors[r];
  EXPECT_EQ(fake->forward_calls(), kRounds);
  EXPECT_EQ(fake->backward_calls(), kRounds);
  // The orders really varied: more than one thread sent upstream.
  EXPECT_GT(fake->distinct_senders(), 1u);
  for (int i = 0; i < kRounds; ++i) {
    for (int r = 0; r < kMembers; ++r) {
      SCOPED_TRACE(testing::Message() << "round " << i << " member " << r);
      const ForwardReply& f = got_forward[r][i];
      EXPECT_EQ(f.global.count, want_moments[i].count);
      EXPECT_TRUE(SameBits(f.global.mean, want_moments[i].mean));
      EXPECT_TRUE(SameBits(f.global.var, want_moments[i].m2));
      EXPECT_EQ(f.version, got_forward[0][i].version);
      EXPECT_TRUE(SameBits(got_backward[r][i].sum_dy, want_grads[i].sum_dy));
      EXPECT_TRUE(
          SameBits(got_backward[r][i].sum_dy_xmu, want_grads[i].sum_dy_xmu));
    }
  }
}

// The fold is the merge of all parts: check one round against a long-double
// computation from the parts' definitions (independent of the Chan formula).
TEST(ThreadNodeTest, FoldedMomentsAreThoseOfTheWholeNode) {
  constexpr int kMembers = 3;
  auto upstream = std::make_unique<EchoUpstream>();
  ThreadNode node(kMembers, std::move(upstream), kLongTimeout);
  std::mt19937_64 rng(77);
  std::normal_distribution<double> normal(0, 1);
  const int64_t sizes[kMembers] = {6, 0, 9};
  std::vector<std::vector<double>> data(kMembers);
  std::vector<Moments> parts(kMembers);
  for (int r = 0; r < kMembers; ++r) {
    long double sum = 0, m2 = 0;
    for (int64_t i = 0; i < sizes[r]; ++i) {
      data[r].push_back(3 + 2 * normal(rng));
      sum += data[r].back();
    }
    parts[r] = Moments::Zero(1);
    parts[r].count = sizes[r];
    if (sizes[r] > 0) {
      const long double mean = sum / sizes[r];
      for (double v : data[r]) m2 += (v - mean) * (v - mean);
      parts[r].mean[0] = static_cast<double>(mean);
      parts[r].m2[0] = static_cast<double>(m2);
    }
  }
  long double sum = 0, m2 = 0;
  int64_t n = 0;
  for (const auto& d : data) {
    for (double v : d) sum += v, ++n;
  }
  const long double mean = sum / n;
  for (const auto& d : data) {
    for (double v : d) m2 += (v - mean) * (v - mean);
  }

  std::vector<absl::StatusOr<ForwardReply>> got(kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kMembers; ++r) {
    threads.emplace_back(
        [&, r] { got[r] = node.Member(r)->SyncForward(0, 0, parts[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kMembers; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ(got[r]->global.count, n);
    EXPECT_NEAR(got[r]->global.mean[0], static_cast<double>(mean),
                1e-12 * std::fabs(static_cast<double>(mean)));
    EXPECT_NEAR(got[r]->global.var[0], static_cast<double>(m2),
                1e-12 * static_cast<double>(m2));
  }
}

TEST(ThreadNodeTest, EveryMemberGetsTheRoundsMissingRanks) {
  constexpr int kMembers = 3;
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(kMembers, std::move(upstream), kLongTimeout);
  std::mt19937_64 rng(31);
  const Moments part = RandomMoments(2, rng);
  auto run_round = [&](int64_t step) {
    std::vector<absl::StatusOr<ForwardReply>> got(kMembers);
    std::vector<std::thread> threads;
    for (int r = 0; r < kMembers; ++r) {
      threads.emplace_back(
          [&, r] { got[r] = node.Member(r)->SyncForward(0, step, part); });
    }
    for (std::thread& t : threads) t.join();
    return got;
  };
  fake->NameMissing({1, 6});  // a quorum round without job ranks 1 and 6
  for (const auto& got : run_round(0)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->missing_ranks, ::testing::ElementsAre(1, 6));
  }
  fake->NameMissing({});
  for (const auto& got : run_round(1)) {
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(got->missing_ranks, ::testing::IsEmpty());
  }
}

TEST(ThreadNodeTest, MissingPeerGivesDeadlineExceededNamingIt) {
  constexpr absl::Duration kTimeout = absl::Milliseconds(150);
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(3, std::move(upstream), kTimeout);
  std::mt19937_64 rng(5);
  const Moments part = RandomMoments(2, rng);

  std::vector<absl::StatusOr<ForwardReply>> got(3);
  std::vector<absl::Duration> waited(3);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {  // local rank 1 never arrives
    threads.emplace_back([&, r] {
      const absl::Time start = absl::Now();
      got[r] = node.Member(r)->SyncForward(4, 9, part);
      waited[r] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r : {0, 2}) {
    EXPECT_EQ(got[r].status().code(), absl::StatusCode::kDeadlineExceeded)
        << got[r].status();
    EXPECT_THAT(got[r].status().message(), HasSubstr("local ranks [1]"));
    EXPECT_THAT(got[r].status().message(), HasSubstr("layer 4 step 9"));
    EXPECT_LT(waited[r], kTimeout + absl::Seconds(3));
  }
  // The first to arrive waited the whole timeout (the other may have come
  // later and left with it).
  EXPECT_GE(std::max(waited[0], waited[2]), kTimeout - absl::Milliseconds(1));
  EXPECT_EQ(fake->forward_calls(), 0);

  // The latecomer gets the round's outcome at once instead of waiting.
  const absl::Time start = absl::Now();
  got[1] = node.Member(1)->SyncForward(4, 9, part);
  EXPECT_LT(absl::Now() - start, kTimeout);
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(fake->forward_calls(), 0);
}

// Waiting for the upstream is not waiting for peers: a slow aggregator answer
// (bounded by the upstream's own deadline) reaches every member even when it
// takes longer than the node's timeout.
TEST(ThreadNodeTest, SlowUpstreamIsNotAMissingPeer) {
  class SlowUpstream : public EchoUpstream {
   public:
    absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                          const GradSums& summed) override {
      absl::SleepFor(absl::Milliseconds(300));
      return EchoUpstream::SyncBackward(layer, step, backward, summed);
    }
  };
  ThreadNode node(3, std::make_unique<SlowUpstream>(), absl::Milliseconds(60));
  std::mt19937_64 rng(8);
  std::vector<GradSums> parts;
  for (int r = 0; r < 3; ++r) parts.push_back(RandomGradSums(3, rng));
  GradSums want = parts[0];
  AddGradSums(want, parts[1]);
  AddGradSums(want, parts[2]);

  std::vector<absl::StatusOr<GradSums>> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back(
        [&, r] { got[r] = node.Member(r)->SyncBackward(0, 0, 0, parts[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << "member " << r << ": " << got[r].status();
    EXPECT_TRUE(SameBits(got[r]->sum_dy, want.sum_dy));
    EXPECT_TRUE(SameBits(got[r]->sum_dy_xmu, want.sum_dy_xmu));
  }
}

// Backwards 0 and 1 through one forward are separate rounds: each member's
// part of backward b is summed with the other members' parts of backward
// b only, even when a member is in both rounds at once (its two calls on
// two threads) and the rounds complete in either order.
TEST(ThreadNodeTest, BackwardsThroughOneForwardAreSeparateRounds) {
  constexpr int kMembers = 2;
  constexpr int kBackwards = 2;
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(kMembers, std::move(upstream), kLongTimeout);
  // parts[b][r]: member r's sums of backward b, distinct powers of two so
  // that any other pairing gives another sum.
  GradSums parts[kBackwards][kMembers];
  GradSums want[kBackwards];
  for (int b = 0; b < kBackwards; ++b) {
    for (int r = 0; r < kMembers; ++r) {
      const double v = std::ldexp(1.0, 2 * b + r);  // 1, 2 | 4, 8
      parts[b][r].sum_dy = {v, 3 * v};
      parts[b][r].sum_dy_xmu = {-v, 0.5 * v};
    }
  }
  want[0].sum_dy = {1 + 2, 3 * (1 + 2)};
  want[0].sum_dy_xmu = {-(1 + 2), 0.5 * (1 + 2)};
  want[1].sum_dy = {4 + 8, 3 * (4 + 8)};
  want[1].sum_dy_xmu = {-(4 + 8), 0.5 * (4 + 8)};

  absl::StatusOr<GradSums> got[kBackwards][kMembers];
  // Member 0 enters backward 1 and member 1 backward 0 first, so that a
  // node that did not tell the two rounds apart would pair them.
  std::vector<std::thread> threads;
  auto run = [&](int r, int b) {
    threads.emplace_back([&, r, b] {
      got[b][r] =
          node.Member(r)->SyncBackward(/*layer=*/2, /*step=*/5, b, parts[b][r]);
    });
  };
  run(0, 1);
  run(1, 0);
  absl::SleepFor(absl::Milliseconds(50));
  run(0, 0);
  run(1, 1);
  for (std::thread& t : threads) t.join();

  for (int b = 0; b < kBackwards; ++b) {
    for (int r = 0; r < kMembers; ++r) {
      SCOPED_TRACE(testing::Message() << "backward " << b << " member " << r);
      ASSERT_TRUE(got[b][r].ok()) << got[b][r].status();
      EXPECT_EQ(got[b][r]->sum_dy, want[b].sum_dy);
      EXPECT_EQ(got[b][r]->sum_dy_xmu, want[b].sum_dy_xmu);
    }
  }
  // One round upstream per index, carrying the index and its own sums.
  const auto rounds = fake->backward_rounds();
  ASSERT_EQ(rounds.size(), 2u);
  for (int b = 0; b < kBackwards; ++b) {
    SCOPED_TRACE(testing::Message() << "backward " << b);
    auto it = rounds.find({5, b});
    ASSERT_NE(it, rounds.end());
    ASSERT_EQ(it->second.size(), 1u);
    EXPECT_EQ(it->second[0].sum_dy, want[b].sum_dy);
    EXPECT_EQ(it->second[0].sum_dy_xmu, want[b].sum_dy_xmu);
  }
}

TEST(ThreadNodeTest, UpstreamErrorReachesEveryMember) {
  constexpr int kMembers = 4;
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(kMembers, std::move(upstream), kLongTimeout);
  fake->FailWith(absl::UnavailableError("aggregator is down"),
                 absl::AbortedError("round was aborted"));
  std::mt19937_64 rng(9);
  std::vector<Moments> parts;
  std::vector<GradSums> grads;
  for (int r = 0; r < kMembers; ++r) {
    parts.push_back(RandomMoments(3, rng));
    grads.push_back(RandomGradSums(3, rng));
  }

  std::vector<absl::Status> forward(kMembers), backward(kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kMembers; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<NodeGroup> member = node.Member(r);
      forward[r] = member->SyncForward(1, 2, parts[r]).status();
      backward[r] = member->SyncBackward(1, 2, 0, grads[r]).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kMembers; ++r) {
    EXPECT_EQ(forward[r], absl::UnavailableError("aggregator is down"));
    EXPECT_EQ(backward[r], absl::AbortedError("round was aborted"));
  }
  EXPECT_EQ(fake->forward_calls(), 1);
  EXPECT_EQ(fake->backward_calls(), 1);
}

TEST(ThreadNodeTest, LocalRankOutOfRangeIsInvalidArgument) {
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(2, std::move(upstream), kLongTimeout);
  std::mt19937_64 rng(10);
  const Moments part = RandomMoments(2, rng);
  const GradSums grad = RandomGradSums(2, rng);
  for (int r : {-1, 2, 7}) {
    std::unique_ptr<NodeGroup> member = node.Member(r);
    absl::Status f = member->SyncForward(0, 0, part).status();
    absl::Status b = member->SyncBackward(0, 0, 0, grad).status();
    EXPECT_EQ(f.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_EQ(b.code(), absl::StatusCode::kInvalidArgument) << b;
    EXPECT_THAT(f.message(), HasSubstr(absl::StrCat("local rank ", r)));
  }
  EXPECT_EQ(fake->forward_calls(), 0);
  EXPECT_EQ(fake->backward_calls(), 0);
}

TEST(ThreadNodeTest, JoiningTheSameRoundTwiceIsFailedPrecondition) {
  auto upstream = std::make_unique<EchoUpstream>();
  EchoUpstream* fake = upstream.get();
  ThreadNode node(2, std::move(upstream), kLongTimeout);
  std::mt19937_64 rng(12);
  const Moments part0 = RandomMoments(3, rng);
  const Moments part1 = RandomMoments(3, rng);

  // Two calls of local rank 0 for the same round: whichever comes second is
  // refused at once; the other completes when rank 1 arrives.
  absl::Mutex mu;
  std::vector<absl::Status> results;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      absl::Status s = node.Member(0)->SyncForward(0, 3, part0).status();
      absl::MutexLock lock(&mu);
      results.push_back(s);
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto one = [&results]() { return !results.empty(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&one), absl::Seconds(10)));
    EXPECT_EQ(results[0].code(), absl::StatusCode::kFailedPrecondition)
        << results[0];
    EXPECT_THAT(results[0].message(), HasSubstr("twice"));
  }
  EXPECT_EQ(fake->forward_calls(), 0);
  absl::StatusOr<ForwardReply> r1 = node.Member(1)->SyncForward(0, 3, part1);
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_EQ(fake->forward_calls(), 1);
}

}  // namespace
}  // namespace syncnorm
