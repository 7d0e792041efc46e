// Stale-synchronous rounds (staleness tau > 0): answers as soon as every
// member is within tau steps, each the merge of the view it names; the
// running statistics bit for bit those of a synchronous run; retries and
// restarts give the same answers. References are float64 merges of the
// samples of the (rank, step)s named, and a synchronous job fed the same
// contributions.
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/domain/membership.h"
#include "server/domain/outcome_recorder.h"
#include "server/store/faulty_engine.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kChannels = 2;

std::vector<double> Samples(int rank, int64_t step, int channel) {
  std::vector<double> x;
  for (int i = 0; i < 3; ++i) {
    x.push_back(std::sin(0.5 + rank * 2.1 + step * 1.3 + channel * 0.7 + i) *
                    (1 + rank) +
                0.2 * step);
  }
  return x;
}

Moments LocalMoments(int rank, int64_t step) {
  Moments m = Moments::Zero(kChannels);
  m.count = 3;
  for (int c = 0; c < kChannels; ++c) {
    const std::vector<double> x = Samples(rank, step, c);
    double sum = 0;
    for (double v : x) sum += v;
    m.mean[c] = sum / x.size();
    for (double v : x) m.m2[c] += (v - m.mean[c]) * (v - m.mean[c]);
  }
  return m;
}

GradSums LocalGrads(int rank, int64_t step) {
  GradSums g;
  for (int c = 0; c < kChannels; ++c) {
    g.sum_dy.push_back(0.25 * (rank + 1) + step + c);
    g.sum_dy_xmu.push_back(-0.5 * rank + 0.125 * step * c);
  }
  return g;
}

Contribution Make(const std::string& job, int64_t step, int rank, Phase phase) {
  Contribution c;
  c.job_id = job;
  c.layer = 0;
  c.step = step;
  c.phase = phase;
  c.rank = rank;
  if (phase == Phase::kForward) {
    c.payload = LocalMoments(rank, step);
  } else {
    c.payload = LocalGrads(rank, step);
  }
  return c;
}

// A forward answer must be the float64 merge of the samples of its view.
void ExpectMergeOfView(const RoundOutcome& o) {
  ASSERT_TRUE(o.status.ok()) << o.status;
  ASSERT_FALSE(o.view.empty());
  ASSERT_EQ(o.moments.count, 3 * static_cast<int64_t>(o.view.size()));
  for (int c = 0; c < kChannels; ++c) {
    std::vector<double> all;
    for (const ViewEntry& v : o.view) {
      const std::vector<double> x = Samples(v.rank, v.step, c);
      all.insert(all.end(), x.begin(), x.end());
    }
    double sum = 0;
    for (double v : all) sum += v;
    const double mean = sum / all.size();
    double ss = 0;
    for (double v : all) ss += (v - mean) * (v - mean);
    EXPECT_NEAR(o.moments.mean[c], mean, 1e-12);
    EXPECT_NEAR(o.moments.var[c], ss / all.size(), 1e-12);
  }
}

// A backward answer must be the sum of the grads of its forward's view.
void ExpectSumOfView(const RoundOutcome& o, const RoundOutcome& forward) {
  ASSERT_TRUE(o.status.ok()) << o.status;
  ASSERT_EQ(o.view.size(), forward.view.size());
  ASSERT_EQ(o.grad_sums.sum_dy.size(), static_cast<size_t>(kChannels));
  ASSERT_EQ(o.grad_sums.sum_dy_xmu.size(), static_cast<size_t>(kChannels));
  for (int c = 0; c < kChannels; ++c) {
    double dy = 0, dyx = 0;
    for (size_t i = 0; i < forward.view.size(); ++i) {
      EXPECT_TRUE(o.view[i] == forward.view[i]);
      const GradSums g = LocalGrads(forward.view[i].rank, forward.view[i].step);
      dy += g.sum_dy[c];
      dyx += g.sum_dy_xmu[c];
    }
    EXPECT_NEAR(o.grad_sums.sum_dy[c], dy, 1e-12);
    EXPECT_NEAR(o.grad_sums.sum_dy_xmu[c], dyx, 1e-12);
  }
}

JobSpec Spec(const std::string& id, int world, int staleness) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.round_timeout = absl::Seconds(30);
  LayerConfig l;
  l.name = "bn";
  l.channels = kChannels;
  s.layers = {l};
  s.staleness = staleness;
  return s;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

class StaleTest : public ::testing::Test {
 protected:
  StaleTest()
      : store_(std::make_unique<MemoryEngine>()),
        agg_(std::make_unique<Aggregator>(AggregatorOptions(), &clock_,
                                          &store_)) {}

  // Sends and returns the outcome if answered at once.
  std::optional<RoundOutcome> Send(const Contribution& c) {
    auto got = std::make_shared<std::optional<RoundOutcome>>();
    agg_->Contribute(c, [got](const RoundOutcome& o) { *got = o; });
    return *got;
  }

  // Sends the FORWARD of `step` of each of `ranks`, in order, and returns
  // their outcomes once all are answered (a step waits for every member's
  // first one); empty if any is not.
  std::vector<RoundOutcome> SendAll(int64_t step, std::vector<int> ranks) {
    OutcomeRecorder out(static_cast<int>(ranks.size()));
    for (size_t i = 0; i < ranks.size(); ++i) {
      agg_->Contribute(Make("s", step, ranks[i], Phase::kForward),
                       out.Slot(static_cast<int>(i)));
    }
    std::vector<RoundOutcome> got;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (out.calls(static_cast<int>(i)) != 1) return {};
      got.push_back(out.get(static_cast<int>(i)));
    }
    return got;
  }

  FakeClock clock_;
  KvStateStore store_;
  std::unique_ptr<Aggregator> agg_;
};

TEST_F(StaleTest, AStragglerWithinTheBoundHoldsNoOneBack) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 3, 2)).ok());
  // Step 0 waits for every member's first contribution.
  std::vector<RoundOutcome> zero = SendAll(0, {0, 1, 2});
  ASSERT_EQ(zero.size(), 3u);
  for (const RoundOutcome& o : zero) {
    ExpectMergeOfView(o);
    EXPECT_THAT(o.view,
                ElementsAre(ViewEntry{0, 0}, ViewEntry{1, 0}, ViewEntry{2, 0}));
  }
  OutcomeRecorder zero_back(3);
  for (int r : {0, 1, 2}) {
    agg_->Contribute(Make("s", 0, r, Phase::kBackward), zero_back.Slot(r));
  }
  for (int r : {0, 1, 2}) {
    ASSERT_EQ(zero_back.calls(r), 1);
    ExpectSumOfView(zero_back.get(r), zero[r]);
  }
  // Then ranks 0 and 1 run steps 1 and 2 (forward and backward) while
  // rank 2 stays at step 0: each answer merges what has arrived within the
  // bound.
  for (int64_t step : {1, 2}) {
    for (int r : {0, 1}) {
      std::optional<RoundOutcome> o = Send(Make("s", step, r, Phase::kForward));
      ASSERT_TRUE(o.has_value()) << "step " << step << " rank " << r;
      ExpectMergeOfView(*o);
      // Rank 0 goes first: rank 1's latest is then the step before.
      const int64_t one = r == 0 ? step - 1 : step;
      EXPECT_THAT(o->view, ElementsAre(ViewEntry{0, step}, ViewEntry{1, one},
                                       ViewEntry{2, 0}));
      EXPECT_EQ(o->version, 1);  // only step 0 has every member's merge
    }
    for (int r : {0, 1}) {
      ASSERT_TRUE(Send(Make("s", step, r, Phase::kBackward)).has_value());
    }
  }
  // Step 3 is more than 2 steps ahead of rank 2.
  OutcomeRecorder ahead(2);
  agg_->Contribute(Make("s", 3, 0, Phase::kForward), ahead.Slot(0));
  agg_->Contribute(Make("s", 3, 1, Phase::kForward), ahead.Slot(1));
  EXPECT_EQ(ahead.calls(0), 0);
  // Rank 2's step 1 is answered with every member's step 1, and lets
  // ranks 0 and 1 on: their view of step 3 has rank 2's step 1.
  std::optional<RoundOutcome> slow = Send(Make("s", 1, 2, Phase::kForward));
  ASSERT_TRUE(slow.has_value());
  ExpectMergeOfView(*slow);
  EXPECT_THAT(slow->view,
              ElementsAre(ViewEntry{0, 1}, ViewEntry{1, 1}, ViewEntry{2, 1}));
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(ahead.calls(i), 1);
    ExpectMergeOfView(ahead.get(i));
    EXPECT_THAT(ahead.get(i).view,
                ElementsAre(ViewEntry{0, 3}, ViewEntry{1, 3}, ViewEntry{2, 1}));
  }
  // Steps 0 and 1 had every member's contribution: the running statistics
  // moved twice.
  auto stats = agg_->GetRunningStats("s", {}, 0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->layers[0].stats.num_batches_tracked, 2);
  // A backward sums the grads of its forward's view, once they are in.
  OutcomeRecorder back(2);
  agg_->Contribute(Make("s", 3, 0, Phase::kBackward), back.Slot(0));
  agg_->Contribute(Make("s", 3, 1, Phase::kBackward), back.Slot(1));
  EXPECT_EQ(back.calls(0), 0);  // rank 2's backward of step 1 is missing
  std::optional<RoundOutcome> b = Send(Make("s", 1, 2, Phase::kBackward));
  ASSERT_TRUE(b.has_value());
  ExpectSumOfView(*b, *slow);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(back.calls(i), 1);
    ExpectSumOfView(back.get(i), ahead.get(i));
  }
}

// Ranks that each run in lock step (a forward, its answer, a backward, its
// answer, the next step) at different speeds, in a random order: every
// answer is its view's merge, no rank is answered more than tau steps
// ahead of any other's latest, and the running statistics equal a
// synchronous job's bit for bit. With `restart_at`, the aggregator is
// replaced by one loaded from the store after that many sends, and every
// answer given before is asked for again.
void RunRandomOrder(int world, int staleness, int steps, uint64_t seed,
                    int restart_at = -1) {
  FakeClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  auto agg = std::make_unique<Aggregator>(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(agg->CreateJob(Spec("s", world, staleness)).ok());
  std::mt19937_64 rng(seed);
  struct Rank {
    int64_t step = 0;
    bool backward = false;  // its next send
    bool waiting = false;
  };
  std::vector<Rank> ranks(world);
  std::vector<int64_t> sent(world, -1);  // latest forward step sent
  // (rank, step, phase) -> outcome
  std::map<std::tuple<int, int64_t, int>, RoundOutcome> answers;
  auto pending = std::make_shared<std::vector<std::pair<int, RoundOutcome>>>();
  int sends = 0;
  while (true) {
    std::vector<int> ready;
    for (int r = 0; r < world; ++r) {
      if (!ranks[r].waiting && ranks[r].step < steps) ready.push_back(r);
    }
    if (ready.empty()) break;
    // Rank r is slower the higher it is: it is picked less often.
    std::vector<double> weight;
    for (int r : ready) weight.push_back(1.0 / (1 + r));
    std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
    const int r = ready[pick(rng)];
    Rank& me = ranks[r];
    const Phase phase = me.backward ? Phase::kBackward : Phase::kForward;
    if (phase == Phase::kForward) sent[r] = me.step;
    me.waiting = true;
    const int64_t step = me.step;
    agg->Contribute(
        Make("s", step, r, phase),
        [pending, r](const RoundOutcome& o) { pending->emplace_back(r, o); });
    if (++sends == restart_at) {
      agg = std::make_unique<Aggregator>(AggregatorOptions(), &clock, &store);
      ASSERT_TRUE(agg->Load().ok());
      // The old one told its waiting callers it was going away.
      pending->erase(std::remove_if(pending->begin(), pending->end(),
                                    [](const auto& p) {
                                      return p.second.status.code() ==
                                             absl::StatusCode::kUnavailable;
                                    }),
                     pending->end());
      // Every answer given so far comes back the same, bit for bit.
      for (const auto& [key, o] : answers) {
        const auto& [rank, s, p] = key;
        auto again = std::make_shared<std::optional<RoundOutcome>>();
        agg->Contribute(Make("s", s, rank, static_cast<Phase>(p)),
                        [again](const RoundOutcome& x) { *again = x; });
        ASSERT_TRUE(again->has_value()) << "rank " << rank << " step " << s;
        EXPECT_TRUE((*again)->view == o.view);
        EXPECT_TRUE(SameBits((*again)->moments.mean, o.moments.mean));
        EXPECT_TRUE(SameBits((*again)->grad_sums.sum_dy, o.grad_sums.sum_dy));
      }
      // The contributions waiting when it went down are sent again.
      for (int w = 0; w < world; ++w) {
        if (!ranks[w].waiting) continue;
        const Phase ph = ranks[w].backward ? Phase::kBackward : Phase::kForward;
        const int64_t st = ranks[w].step;
        if (answers.count({w, st, static_cast<int>(ph)}) > 0) continue;
        if (std::any_of(pending->begin(), pending->end(),
                        [&](const auto& p) { return p.first == w; })) {
          continue;  // answered before the restart, not yet handed out
        }
        agg->Contribute(Make("s", st, w, ph),
                        [pending, w](const RoundOutcome& o) {
                          pending->emplace_back(w, o);
                        });
      }
    }
    // Hand out the answers that came.
    std::vector<std::pair<int, RoundOutcome>> got;
    got.swap(*pending);
    for (auto& [who, o] : got) {
      Rank& him = ranks[who];
      ASSERT_TRUE(o.status.ok()) << o.status;
      const int64_t s = him.step;
      if (!him.backward) {
        ExpectMergeOfView(o);
        // The clock condition held: no one was more than tau behind.
        for (int w = 0; w < world; ++w) {
          EXPECT_GE(sent[w], s - staleness) << "rank " << who << " step " << s;
        }
        for (const ViewEntry& v : o.view) {
          EXPECT_LE(v.step, s);
          EXPECT_GE(v.step, s - staleness);
        }
        answers[{who, s, static_cast<int>(Phase::kForward)}] = o;
        him.backward = true;
      } else {
        ExpectSumOfView(o,
                        answers[{who, s, static_cast<int>(Phase::kForward)}]);
        answers[{who, s, static_cast<int>(Phase::kBackward)}] = o;
        him.backward = false;
        ++him.step;
      }
      him.waiting = false;
    }
  }
  for (int r = 0; r < world; ++r) ASSERT_EQ(ranks[r].step, steps) << r;

  // The synchronous reference: the same contributions, step by step.
  FakeClock sync_clock;
  KvStateStore sync_store(std::make_unique<MemoryEngine>());
  Aggregator sync(AggregatorOptions(), &sync_clock, &sync_store);
  ASSERT_TRUE(sync.CreateJob(Spec("s", world, 0)).ok());
  for (int64_t step = 0; step < steps; ++step) {
    for (int r = 0; r < world; ++r) {
      sync.Contribute(Make("s", step, r, Phase::kForward),
                      [](const RoundOutcome&) {});
    }
  }
  auto want = sync.GetRunningStats("s", {}, 0);
  auto got = agg->GetRunningStats("s", {}, 0);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->layers[0].stats.num_batches_tracked, steps);
  EXPECT_TRUE(SameBits(got->layers[0].stats.mean, want->layers[0].stats.mean));
  EXPECT_TRUE(SameBits(got->layers[0].stats.var, want->layers[0].stats.var));
}

TEST(StaleRunTest, RunningStatisticsEqualASynchronousRunBitForBit) {
  for (uint64_t seed : {1, 2, 3}) {
    for (int tau : {1, 2, 4}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " tau " << tau);
      RunRandomOrder(/*world=*/4, tau, /*steps=*/12, seed);
    }
  }
}

TEST(StaleRunTest, ARestartLosesNoAnswerAndNoStep) {
  for (int restart_at : {7, 23, 41}) {
    SCOPED_TRACE(::testing::Message() << "restart after " << restart_at);
    RunRandomOrder(/*world=*/3, /*staleness=*/2, /*steps=*/10, restart_at,
                   restart_at);
  }
}

TEST_F(StaleTest, ARetryGetsTheSameAnswerAndAChangedPayloadIsRefused) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  std::vector<RoundOutcome> both = SendAll(0, {0, 1});
  ASSERT_EQ(both.size(), 2u);
  const std::optional<RoundOutcome> first = both[0];
  std::optional<RoundOutcome> again = Send(Make("s", 0, 0, Phase::kForward));
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->view == first->view);
  EXPECT_TRUE(SameBits(again->moments.mean, first->moments.mean));
  Contribution changed = Make("s", 0, 0, Phase::kForward);
  std::get<Moments>(changed.payload).mean[0] += 1;
  std::optional<RoundOutcome> conflict = Send(changed);
  ASSERT_TRUE(conflict.has_value());
  EXPECT_EQ(conflict->status.code(), absl::StatusCode::kAborted);
}

TEST_F(StaleTest, WhatAStaleJobRefusesIsSaid) {
  EXPECT_EQ(agg_->CreateJob(Spec("big", 2, kMaxStaleness + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  JobSpec both = Spec("both", 2, 1);
  both.quorum.min_ranks = 1;
  both.quorum.grace = absl::Seconds(1);
  EXPECT_EQ(agg_->CreateJob(both).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  Contribution c = Make("s", 0, 0, Phase::kForward);
  c.update.momentum = RoundMomentum{MomentumMode::kTorch, 0.5};
  std::optional<RoundOutcome> o = Send(c);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o->status.message(), HasSubstr("stale-synchronous"));
  // A backward before its forward was answered.
  o = Send(Make("s", 0, 1, Phase::kBackward));
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(StaleTest, RemovingADeadRankReleasesTheClock) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 3, 1)).ok());
  ASSERT_EQ(SendAll(0, {0, 1, 2}).size(), 3u);
  // Rank 2 is gone after step 0: ranks 0 and 1 may run one step ahead.
  for (int r : {0, 1}) {
    ASSERT_TRUE(Send(Make("s", 1, r, Phase::kForward)).has_value());
  }
  OutcomeRecorder held(2);
  agg_->Contribute(Make("s", 2, 0, Phase::kForward), held.Slot(0));
  agg_->Contribute(Make("s", 2, 1, Phase::kForward), held.Slot(1));
  EXPECT_EQ(held.calls(0), 0);
  MembershipRequest remove;
  remove.remove = {2};
  auto removed = agg_->UpdateMembership("s", remove);
  ASSERT_TRUE(removed.ok()) << removed.status();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(held.calls(i), 1);
    ExpectMergeOfView(held.get(i));
    EXPECT_THAT(held.get(i).view,
                ElementsAre(ViewEntry{0, 2}, ViewEntry{1, 2}));
  }
  // Step 1's merge no longer waits for rank 2 either.
  auto stats = agg_->GetRunningStats("s", {}, 0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->layers[0].stats.num_batches_tracked, 3);
}

TEST_F(StaleTest, ARankThatLeftHoldsNoAnswersInTheStoreBack) {
  constexpr int kTau = 1;
  constexpr int kSteps = 60;
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 3, kTau)).ok());
  MembershipRequest leave;
  leave.step = 2;
  leave.leave = {2};
  ASSERT_TRUE(agg_->UpdateMembership("s", leave).ok());
  for (int64_t step = 0; step < kSteps; ++step) {
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      OutcomeRecorder out(3);
      const int ranks = step < 2 ? 3 : 2;
      for (int r = 0; r < ranks; ++r) {
        agg_->Contribute(Make("s", step, r, phase), out.Slot(r));
      }
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(out.calls(r), 1) << "step " << step << " rank " << r;
        ASSERT_TRUE(out.get(r).status.ok()) << out.get(r).status;
      }
    }
  }
  // What the store keeps: the window of the ranks still training (views
  // of tau steps, backward views tau more, the recent rounds), not every
  // answer since the step rank 2 left.
  int records = 0;
  ASSERT_TRUE(store_.engine()
                  .Scan("s/",
                        [&](absl::string_view, absl::string_view) {
                          ++records;
                          return absl::OkStatus();
                        })
                  .ok());
  const int window = 3 * kTau + AggregatorOptions().recent_rounds + 2;
  EXPECT_LE(records, 2 * 2 * window) << "of " << 2 * 2 * kSteps + 4;
  EXPECT_GT(records, 0);
}

TEST_F(StaleTest, ABackwardWhoseForwardFellOutOfTheWindowFailsAlone) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  const auto forwards = [&](int64_t from, int64_t to) {
    for (int64_t step = from; step < to; ++step) {
      std::vector<RoundOutcome> both = SendAll(step, {0, 1});
      ASSERT_EQ(both.size(), 2u) << step;
      for (const RoundOutcome& o : both) ASSERT_TRUE(o.status.ok()) << step;
    }
  };
  // Both ranks send their forwards far ahead of their backwards.
  forwards(0, 30);
  // Rank 0's backward of step 0: its forward is no longer kept.
  std::optional<RoundOutcome> old = Send(Make("s", 0, 0, Phase::kBackward));
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->status.code(), absl::StatusCode::kFailedPrecondition);
  // Rank 0's backward of step 25 waits for rank 1's; meanwhile the
  // forwards go on until step 25's forward falls out of the window.
  OutcomeRecorder waiting(1);
  agg_->Contribute(Make("s", 25, 0, Phase::kBackward), waiting.Slot(0));
  EXPECT_EQ(waiting.calls(0), 0);
  forwards(30, 60);
  ASSERT_EQ(waiting.calls(0), 1);
  EXPECT_EQ(waiting.get(0).status.code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(waiting.get(0).status.message(), HasSubstr("no longer kept"));
  // The job goes on.
  for (int r : {0, 1}) {
    std::optional<RoundOutcome> o = Send(Make("s", 60, r, Phase::kForward));
    ASSERT_TRUE(o.has_value());
    ExpectMergeOfView(*o);
  }
}

TEST(StaleStoreTest, ARetryAfterAFailedWriteIsAnsweredAtOnce) {
  FakeClock clock;
  MemoryEngine memory;
  auto faulty = std::make_unique<FaultyEngine>(&memory);
  FaultyEngine* engine = faulty.get();
  KvStateStore store(std::move(faulty));
  Aggregator agg(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(agg.CreateJob(Spec("s", 2, 1)).ok());
  OutcomeRecorder out(3);
  agg.Contribute(Make("s", 0, 1, Phase::kForward), out.Slot(2));
  engine->fail_writes(true);
  agg.Contribute(Make("s", 0, 0, Phase::kForward), out.Slot(0));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kResourceExhausted);
  // The disk has room again; the retry is answered without waiting for
  // another rank's contribution.
  engine->fail_writes(false);
  agg.Contribute(Make("s", 0, 0, Phase::kForward), out.Slot(1));
  ASSERT_EQ(out.calls(1), 1);
  ExpectMergeOfView(out.get(1));
}

TEST_F(StaleTest, ARestoreStartsTheWindowAfresh) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  for (int64_t step : {0, 1}) ASSERT_EQ(SendAll(step, {0, 1}).size(), 2u);
  bool cut = false;
  agg_->Checkpoint(
      "s", 0, "", clock_.Now() + absl::Seconds(1),
      [&](const absl::StatusOr<CheckpointMeta>& m) { cut = m.ok(); });
  ASSERT_TRUE(cut);
  ASSERT_TRUE(agg_->RestoreCheckpoint("s", 0).ok());
  // Step 1 again, with other batches: answered from them, not the old ones.
  Contribution again = Make("s", 1, 0, Phase::kForward);
  std::get<Moments>(again.payload) = LocalMoments(0, 7);
  std::optional<RoundOutcome> o = Send(again);
  ASSERT_TRUE(o.has_value());
  ASSERT_TRUE(o->status.ok()) << o->status;
  EXPECT_THAT(o->view, ElementsAre(ViewEntry{0, 1}));
  EXPECT_TRUE(SameBits(o->moments.mean, Finalize(LocalMoments(0, 7)).mean));
}

TEST_F(StaleTest, AWaitingContributionMissesItsDeadlineAndARetryWaitsAgain) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  ASSERT_EQ(SendAll(0, {0, 1}).size(), 2u);
  // Step 2 of rank 0 waits for rank 1 to send step 1 at least.
  OutcomeRecorder out(2);
  agg_->Contribute(Make("s", 2, 0, Phase::kForward), out.Slot(0));
  clock_.Advance(absl::Seconds(31));
  agg_->ExpireRounds(clock_.Now());
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(out.get(0).status.message(), HasSubstr("ranks [1]"));
  agg_->Contribute(Make("s", 2, 0, Phase::kForward), out.Slot(1));
  EXPECT_EQ(out.calls(1), 0);
  ASSERT_TRUE(Send(Make("s", 1, 1, Phase::kForward)).has_value());
  ASSERT_EQ(out.calls(1), 1);
  ExpectMergeOfView(out.get(1));
  EXPECT_THAT(out.get(1).view, ElementsAre(ViewEntry{0, 2}, ViewEntry{1, 1}));
}

// Issue 32 item 10: W = 4, tau = 2, only rank 0 sending. Its steps 0 and
// 1 wait for every member's first step instead of being answered with its
// own batch alone, and fail at their deadline naming the silent ranks.
TEST_F(StaleTest, NoAnswerBeforeEveryMemberHasSentAStep) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 4, 2)).ok());
  OutcomeRecorder alone(1);
  agg_->Contribute(Make("s", 0, 0, Phase::kForward), alone.Slot(0));
  EXPECT_EQ(alone.calls(0), 0);
  clock_.Advance(absl::Seconds(31));
  agg_->ExpireRounds(clock_.Now());
  ASSERT_EQ(alone.calls(0), 1);
  EXPECT_EQ(alone.get(0).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.get(0).status.message(), HasSubstr("ranks [1-3]"));

  // Rank 0 sends steps 0 (again) and 1; ranks 1 and 2 their step 0.
  OutcomeRecorder out(5);
  agg_->Contribute(Make("s", 0, 0, Phase::kForward), out.Slot(0));
  agg_->Contribute(Make("s", 1, 0, Phase::kForward), out.Slot(1));
  agg_->Contribute(Make("s", 0, 1, Phase::kForward), out.Slot(2));
  agg_->Contribute(Make("s", 0, 2, Phase::kForward), out.Slot(3));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.calls(i), 0) << i;
  // Rank 3's first step lets every one of them go, each with all four.
  agg_->Contribute(Make("s", 0, 3, Phase::kForward), out.Slot(4));
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(out.calls(i), 1) << i;
    ExpectMergeOfView(out.get(i));
  }
  const ViewEntry first[] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  for (int i : {0, 2, 3, 4}) {
    EXPECT_THAT(out.get(i).view, ::testing::ElementsAreArray(first)) << i;
  }
  EXPECT_THAT(out.get(1).view, ElementsAre(ViewEntry{0, 1}, ViewEntry{1, 0},
                                           ViewEntry{2, 0}, ViewEntry{3, 0}));
}

// A contribution that missed its deadline is withdrawn: it counts in no
// later answer, and its rank is back at the last step it still has.
TEST_F(StaleTest, AContributionThatMissedItsDeadlineCountsInNoAnswer) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  OutcomeRecorder out(7);
  agg_->Contribute(Make("s", 0, 0, Phase::kForward), out.Slot(0));
  agg_->Contribute(Make("s", 0, 1, Phase::kForward), out.Slot(1));
  agg_->Contribute(Make("s", 1, 0, Phase::kForward), out.Slot(2));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(out.calls(i), 1) << i;
  // Rank 0 runs on to steps 2 and 3 while rank 1 is at step 0; both fail.
  agg_->Contribute(Make("s", 2, 0, Phase::kForward), out.Slot(3));
  agg_->Contribute(Make("s", 3, 0, Phase::kForward), out.Slot(4));
  clock_.Advance(absl::Seconds(31));
  agg_->ExpireRounds(clock_.Now());
  for (int i : {3, 4}) {
    ASSERT_EQ(out.calls(i), 1) << i;
    EXPECT_EQ(out.get(i).status.code(), absl::StatusCode::kDeadlineExceeded);
  }
  // Rank 1 jumps to step 3: rank 0 has step 1, more than tau behind, and
  // not the step 3 it gave up on, so rank 1 waits.
  agg_->Contribute(Make("s", 3, 1, Phase::kForward), out.Slot(5));
  EXPECT_EQ(out.calls(5), 0);
  // Rank 0 sends step 3 again: a new contribution, and both are answered.
  agg_->Contribute(Make("s", 3, 0, Phase::kForward), out.Slot(6));
  for (int i : {5, 6}) {
    ASSERT_EQ(out.calls(i), 1) << i;
    ExpectMergeOfView(out.get(i));
    EXPECT_THAT(out.get(i).view, ElementsAre(ViewEntry{0, 3}, ViewEntry{1, 3}));
  }
}

// What glibc's heap holds for the process's objects, in bytes; -1 where
// another allocator (a sanitizer's) serves malloc.
int64_t HeapAllocated() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  const struct mallinfo2 heap = ::mallinfo2();
  if (heap.arena + heap.hblkhd == 0) return -1;
  return static_cast<int64_t>(heap.uordblks + heap.hblkhd);
#else
  return -1;
#endif
}

// Issue 32 item 4, scaled down: W = 2, tau = 64, 512 channels, a 100 ms
// round timeout; both ranks send step 0, then rank 0 streams steps on
// alone, ten in flight at a time. Steps 1 to 64 are answered, every later
// one fails at its deadline, and what failed is freed: the heap the job
// holds is bounded by its window, not by the steps rank 0 has sent.
TEST(StaleMemoryTest, ContributionsThatMissedTheirDeadlineAreFreed) {
  constexpr int kWide = 512;
  constexpr int kTau = 64;
  constexpr int64_t kSteps = 4000;
  constexpr int64_t kWarm = 1000;
  FakeClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(AggregatorOptions(), &clock, &store);
  JobSpec spec = Spec("s", 2, kTau);
  spec.layers[0].channels = kWide;
  spec.round_timeout = absl::Milliseconds(100);
  ASSERT_TRUE(agg.CreateJob(spec).ok());
  const auto wide = [](int rank, int64_t step) {
    Contribution c = Make("s", step, rank, Phase::kForward);
    Moments m = Moments::Zero(kWide);
    m.count = 3;
    for (int i = 0; i < kWide; ++i) {
      m.mean[i] = std::sin(0.1 * i + step + rank);
      m.m2[i] = 1 + 0.01 * i;
    }
    c.payload = std::move(m);
    return c;
  };
  auto counts = std::make_shared<std::map<absl::StatusCode, int64_t>>();
  const auto count = [counts](const RoundOutcome& o) {
    ++(*counts)[o.status.code()];
  };
  agg.Contribute(wide(0, 0), count);
  agg.Contribute(wide(1, 0), count);
  int64_t warm = -1;
  // CPU time of the first and the last kWarm steps, recorded (not
  // checked: the machine is shared) to compare runs.
  std::clock_t cpu = std::clock();
  for (int64_t step = 1; step <= kSteps; ++step) {
    agg.Contribute(wide(0, step), count);
    if (step % 10 == 0) {
      clock.Advance(absl::Milliseconds(100));
      agg.ExpireRounds(clock.Now());
    }
    if (step == kWarm || step == kSteps - kWarm) {
      if (step == kWarm) {
        warm = HeapAllocated();
        ::testing::Test::RecordProperty(
            "first_steps_cpu_ms",
            static_cast<int>((std::clock() - cpu) * 1000 / CLOCKS_PER_SEC));
      }
      cpu = std::clock();
    }
  }
  ::testing::Test::RecordProperty(
      "last_steps_cpu_ms",
      static_cast<int>((std::clock() - cpu) * 1000 / CLOCKS_PER_SEC));
  const int64_t end = HeapAllocated();
  ::testing::Test::RecordProperty("heap_growth_kib",
                                  static_cast<int>((end - warm) / 1024));
  EXPECT_EQ((*counts)[absl::StatusCode::kOk], 2 + kTau);
  EXPECT_EQ((*counts)[absl::StatusCode::kDeadlineExceeded], kSteps - kTau);
  EXPECT_EQ(counts->size(), 2u);
  if (warm < 0) GTEST_SKIP() << "glibc's heap does not serve malloc here";
  // Kept, the 3,000 failed steps after the warm-up would hold their 8 KiB
  // payloads: 24 MiB and more.
  EXPECT_LT(end - warm, int64_t{1} << 20)
      << "the heap grew by " << (end - warm) / 1024 << " KiB over "
      << kSteps - kWarm << " failed steps";
}

// A contribution that an answer merged stays what it was past its own
// deadline: rank 1's BACKWARD of step 0 waits for rank 0's, which never
// comes, but rank 0's BACKWARD of step 1 summed it.
TEST_F(StaleTest, AContributionAnAnswerMergedOutlivesItsDeadline) {
  ASSERT_TRUE(agg_->CreateJob(Spec("s", 2, 1)).ok());
  ASSERT_EQ(SendAll(0, {0, 1}).size(), 2u);
  std::optional<RoundOutcome> forward = Send(Make("s", 1, 0, Phase::kForward));
  ASSERT_TRUE(forward.has_value());
  EXPECT_THAT(forward->view, ElementsAre(ViewEntry{0, 1}, ViewEntry{1, 0}));
  OutcomeRecorder waiting(1);
  agg_->Contribute(Make("s", 0, 1, Phase::kBackward), waiting.Slot(0));
  EXPECT_EQ(waiting.calls(0), 0);
  std::optional<RoundOutcome> back = Send(Make("s", 1, 0, Phase::kBackward));
  ASSERT_TRUE(back.has_value());
  ExpectSumOfView(*back, *forward);
  clock_.Advance(absl::Seconds(31));
  agg_->ExpireRounds(clock_.Now());
  ASSERT_EQ(waiting.calls(0), 1);
  EXPECT_EQ(waiting.get(0).status.code(), absl::StatusCode::kDeadlineExceeded);
  // Sent again with other sums: refused, for rank 0's answer has the first.
  Contribution changed = Make("s", 0, 1, Phase::kBackward);
  std::get<GradSums>(changed.payload).sum_dy[0] += 1;
  std::optional<RoundOutcome> o = Send(changed);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->status.code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace syncnorm
