#include "server/domain/aggregator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/formulas.h"
#include "kernels/moments.h"
#include "server/domain/clock.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/domain/outcome_recorder.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Raw local batches of every rank: data[rank][i * channels + c].
struct Batches {
  int channels = 0;
  std::vector<std::vector<double>> data;
  int64_t count(int rank) const { return data[rank].size() / channels; }
};

Batches RandomBatches(const std::vector<int64_t>& counts, int channels,
                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Batches b;
  b.channels = channels;
  for (int64_t n : counts) {
    std::vector<double> x(n * channels);
    for (int64_t i = 0; i < n; ++i) {
      for (int c = 0; c < channels; ++c) {
        x[i * channels + c] = 3.0 * c - 1.5 + (0.5 + c) * normal(rng);
      }
    }
    b.data.push_back(std::move(x));
  }
  return b;
}

// A rank's local moments (Welford, as a worker would send them).
Moments LocalMoments(const Batches& b, int rank) {
  Moments m = Moments::Zero(b.channels);
  for (int c = 0; c < b.channels; ++c) {
    double n = 0;
    for (int64_t i = 0; i < b.count(rank); ++i) {
      WelfordAdd(n, m.mean[c], m.m2[c], b.data[rank][i * b.channels + c]);
    }
  }
  m.count = b.count(rank);
  return m;
}

// Long-double reference of the global batch of `ranks`: mean and M2.
struct Reference {
  int64_t count = 0;
  std::vector<long double> mean, m2;
};

Reference ReferenceOf(const Batches& b, const std::vector<int>& ranks) {
  Reference r;
  r.mean.assign(b.channels, 0);
  r.m2.assign(b.channels, 0);
  for (int rank : ranks) r.count += b.count(rank);
  for (int c = 0; c < b.channels; ++c) {
    long double sum = 0;
    for (int rank : ranks) {
      for (int64_t i = 0; i < b.count(rank); ++i) {
        sum += b.data[rank][i * b.channels + c];
      }
    }
    r.mean[c] = r.count > 0 ? sum / r.count : 0;
    long double m2 = 0;
    for (int rank : ranks) {
      for (int64_t i = 0; i < b.count(rank); ++i) {
        const long double d = b.data[rank][i * b.channels + c] - r.mean[c];
        m2 += d * d;
      }
    }
    r.m2[c] = m2;
  }
  return r;
}

void ExpectNear(double got, long double want, const char* what, int c) {
  const long double tol = 1e-12L * std::max<long double>(1, std::fabs(want));
  EXPECT_LE(std::fabs(static_cast<long double>(got) - want), tol)
      << what << "[" << c << "] got " << got << " want " << (double)want;
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

LayerConfig Layer(int channels, MomentumMode mode = MomentumMode::kTorch,
                  double momentum = 0) {
  LayerConfig l;
  l.name = "bn";
  l.channels = channels;
  l.rule.mode = mode;
  l.rule.momentum = momentum;
  return l;
}

JobSpec Spec(const std::string& id, int world, std::vector<LayerConfig> layers,
             int group_size = 0) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.group_size = group_size;
  s.round_timeout = absl::Seconds(5);
  s.layers = std::move(layers);
  return s;
}

Contribution Forward(const std::string& job, int layer, int64_t step, int rank,
                     Moments m) {
  Contribution c;
  c.job_id = job;
  c.layer = layer;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  c.payload = std::move(m);
  return c;
}

Contribution Backward(const std::string& job, int layer, int64_t step, int rank,
                      GradSums g) {
  Contribution c = Forward(job, layer, step, rank, Moments());
  c.phase = Phase::kBackward;
  c.payload = std::move(g);
  return c;
}

Moments OneValue(double x) {
  Moments m = Moments::Zero(1);
  m.count = 1;
  m.mean[0] = x;
  return m;
}

class AggregatorTest : public ::testing::Test {
 protected:
  AggregatorTest() : agg_(AggregatorOptions(), &clock_, &store_) {}

  void Create(const JobSpec& spec) {
    absl::StatusOr<JobSnapshot> s = agg_.CreateJob(spec);
    ASSERT_TRUE(s.ok()) << s.status();
  }

  // Contributes and returns the outcome delivered inline (or after the
  // round completes on this thread). REQUIRES: the call completes a round
  // or fails.
  RoundOutcome Sync(Contribution c) {
    OutcomeRecorder out(1);
    agg_.Contribute(std::move(c), out.Slot(0));
    EXPECT_EQ(out.calls(0), 1);
    return out.get(0);
  }

  // Contributes without waiting for the outcome.
  void Send(Contribution c) {
    agg_.Contribute(std::move(c), [](const RoundOutcome&) {});
  }

  FakeClock clock_;
  KvStateStore store_{std::make_unique<MemoryEngine>()};
  Aggregator agg_;
};

// Delivers one contribution per rank from its own thread, in a shuffled
// order with random delays; returns every rank's outcome.
std::vector<RoundOutcome> ContributeConcurrently(
    Aggregator& agg, std::vector<Contribution> contributions, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::shuffle(contributions.begin(), contributions.end(), rng);
  const int n = contributions.size();
  OutcomeRecorder out(n);
  std::vector<std::thread> threads;
  absl::Notification go;
  for (int i = 0; i < n; ++i) {
    const int delay_us = static_cast<int>(rng() % 300);
    threads.emplace_back([&, i, delay_us] {
      go.WaitForNotification();
      absl::SleepFor(absl::Microseconds(delay_us));
      const int rank = contributions[i].rank;
      agg.Contribute(contributions[i], out.Slot(rank));
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  std::vector<RoundOutcome> results;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out.calls(r), 1) << "rank " << r;
    results.push_back(out.get(r));
  }
  return results;
}

TEST_F(AggregatorTest, ResultIsBitwiseIdenticalForEveryArrivalOrder) {
  const int world = 8, channels = 5;
  const Batches b =
      RandomBatches({7, 0, 1, 13, 2, 0, 31, 4}, channels, /*seed=*/42);
  const Reference ref = ReferenceOf(b, {0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<RoundOutcome> first;
  for (int trial = 0; trial < 12; ++trial) {
    const std::string id = "order-" + std::to_string(trial);
    Create(Spec(id, world, {Layer(channels)}));
    std::vector<Contribution> cs;
    for (int r = 0; r < world; ++r) {
      cs.push_back(Forward(id, 0, 0, r, LocalMoments(b, r)));
    }
    std::vector<RoundOutcome> got = ContributeConcurrently(agg_, cs, trial);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(got[r].status.ok()) << got[r].status;
      EXPECT_EQ(got[r].version, 1);
      if (first.empty()) continue;
      EXPECT_EQ(got[r].moments.count, first[0].moments.count);
      EXPECT_TRUE(SameBits(got[r].moments.mean, first[0].moments.mean));
      EXPECT_TRUE(SameBits(got[r].moments.var, first[0].moments.var));
    }
    if (first.empty()) first = got;
  }
  EXPECT_EQ(first[0].moments.count, ref.count);
  for (int c = 0; c < channels; ++c) {
    ExpectNear(first[0].moments.mean[c], ref.mean[c], "mean", c);
    ExpectNear(first[0].moments.var[c], ref.m2[c] / ref.count, "var", c);
  }
}

// The running-statistics rules, written out again in long double.
long double Update(MomentumMode mode, long double m, long double running,
                   long double batch, int64_t tracked) {
  switch (mode) {
    case MomentumMode::kDecay:
      return m * running + (1 - m) * batch;
    case MomentumMode::kCumulative:
      return running + (batch - running) / tracked;
    default:
      return (1 - m) * running + m * batch;
  }
}

TEST_F(AggregatorTest, RunningStatsFollowTheRuleOfEachMode) {
  const int world = 3, channels = 4, steps = 6;
  const MomentumMode modes[] = {MomentumMode::kTorch, MomentumMode::kDecay,
                                MomentumMode::kCumulative};
  const double momenta[] = {0.1, 0.9, 0.0};
  std::vector<LayerConfig> layers;
  for (int i = 0; i < 3; ++i) layers.push_back(Layer(channels, modes[i]));
  layers[1].rule.biased_var = true;
  layers[2].initial_running_mean = {1, 2, 3, 4};
  layers[2].initial_running_var = {0.5, 0.5, 2, 2};
  Create(Spec("rules", world, layers));
  for (int l = 0; l < 3; ++l) {
    std::vector<long double> rm(layers[l].initial_running_mean.begin(),
                                layers[l].initial_running_mean.end());
    std::vector<long double> rv(layers[l].initial_running_var.begin(),
                                layers[l].initial_running_var.end());
    if (rm.empty()) rm.assign(channels, 0), rv.assign(channels, 1);
    for (int step = 0; step < steps; ++step) {
      const Batches b =
          RandomBatches({5 + step, 3, 2 * step}, channels, 100 * l + step);
      std::vector<Contribution> cs;
      for (int r = 0; r < world; ++r) {
        cs.push_back(Forward("rules", l, step, r, LocalMoments(b, r)));
      }
      std::vector<RoundOutcome> got =
          ContributeConcurrently(agg_, cs, step + l);
      ASSERT_TRUE(got[0].status.ok()) << got[0].status;
      EXPECT_EQ(got[0].version, step + 1);
      const Reference ref = ReferenceOf(b, {0, 1, 2});
      for (int c = 0; c < channels; ++c) {
        const long double var =
            ref.m2[c] / (layers[l].rule.biased_var ? ref.count : ref.count - 1);
        rm[c] = Update(modes[l], momenta[l], rm[c], ref.mean[c], step + 1);
        rv[c] = Update(modes[l], momenta[l], rv[c], var, step + 1);
      }
    }
    absl::StatusOr<RunningStatsSnapshot> s =
        agg_.GetRunningStats("rules", {l}, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->layers.size(), 1u);
    EXPECT_EQ(s->layers[0].stats.num_batches_tracked, steps);
    for (int c = 0; c < channels; ++c) {
      ExpectNear(s->layers[0].stats.mean[c], rm[c], "running_mean", c);
      ExpectNear(s->layers[0].stats.var[c], rv[c], "running_var", c);
    }
  }
  EXPECT_EQ(agg_.GetJob("rules")->committed_step, steps - 1);
}

TEST_F(AggregatorTest, GroupsMergeAndTrackOnTheirOwn) {
  Create(Spec("groups", 4, {Layer(1), Layer(1)}, /*group_size=*/2));
  std::vector<Contribution> cs;
  for (int r = 0; r < 4; ++r) {
    Moments m = Moments::Zero(1);
    m.count = 2;
    m.mean[0] = r;
    m.m2[0] = 0.5;
    cs.push_back(Forward("groups", 0, 0, r, m));
  }
  std::vector<RoundOutcome> got = ContributeConcurrently(agg_, cs, 7);
  EXPECT_EQ(got[0].moments.mean[0], 0.5);
  EXPECT_EQ(got[1].moments.mean[0], 0.5);
  EXPECT_EQ(got[2].moments.mean[0], 2.5);
  EXPECT_EQ(got[3].moments.mean[0], 2.5);
  EXPECT_EQ(got[3].moments.count, 4);
  // m2 = 0.5 + 0.5 + 1 * 2 * 2 / 4 = 2; var = 2 / 4.
  EXPECT_EQ(got[3].moments.var[0], 0.5);
  auto g1 = agg_.GetRunningStats("groups", {0}, 1);
  ASSERT_TRUE(g1.ok());
  EXPECT_DOUBLE_EQ(g1->layers[0].stats.mean[0], 0.25);
  EXPECT_EQ(g1->layers[0].group, 1);
  // Layer 1 has applied nothing yet: the job has committed nothing.
  EXPECT_EQ(agg_.GetJob("groups")->committed_step, -1);
  for (Contribution c : cs) {
    c.layer = 1;
    if (c.rank < 2) Send(c);
  }
  EXPECT_EQ(agg_.GetJob("groups")->committed_step, -1) << "group 1 missing";
  for (Contribution c : cs) {
    c.layer = 1;
    if (c.rank >= 2) Send(c);
  }
  EXPECT_EQ(agg_.GetJob("groups")->committed_step, 0);
  EXPECT_EQ(agg_.GetRunningStats("groups", {}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(AggregatorTest, DeadlineFailsTheRoundNamingMissingRanks) {
  JobSpec spec = Spec("late", 4, {Layer(2), Layer(2), Layer(2), Layer(2)});
  Create(spec);
  OutcomeRecorder out(2);
  Moments m = Moments::Zero(2);
  m.count = 3;
  agg_.Contribute(Forward("late", 3, 7, 0, m), out.Slot(0));
  clock_.Advance(absl::Seconds(1));
  agg_.Contribute(Forward("late", 3, 7, 1, m), out.Slot(1));
  clock_.Advance(absl::Milliseconds(3999));
  agg_.ExpireRounds(clock_.Now());
  EXPECT_EQ(out.calls(0), 0);
  clock_.Advance(absl::Milliseconds(1));
  agg_.ExpireRounds(clock_.Now());
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(out.calls(i), 1);
    RoundOutcome o = out.get(i);
    EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(o.status.message(),
              "round (job late, layer 3, step 7, FORWARD) missed its 5000 ms "
              "deadline waiting for ranks [2, 3]");
    EXPECT_THAT(o.missing_ranks, ElementsAre(2, 3));
  }
  auto stats = agg_.GetRunningStats("late", {3}, 0);
  EXPECT_EQ(stats->layers[0].stats.num_batches_tracked, 0);
  EXPECT_EQ(stats->layers[0].stats.var, (std::vector<double>{1, 1}));
  // A latecomer gets the round's failure, not a new round that would hang.
  RoundOutcome late = Sync(Forward("late", 3, 7, 2, m));
  EXPECT_EQ(late.status.code(), absl::StatusCode::kDeadlineExceeded);
  // The next step works.
  for (int r = 0; r < 3; ++r) Send(Forward("late", 3, 8, r, m));
  RoundOutcome next = Sync(Forward("late", 3, 8, 3, m));
  EXPECT_TRUE(next.status.ok()) << next.status;
}

TEST_F(AggregatorTest, RetryBeforeCompletionSharesTheResult) {
  Create(Spec("retry", 2, {Layer(1)}));
  OutcomeRecorder out(4);
  agg_.Contribute(Forward("retry", 0, 0, 0, OneValue(1.0)), out.Slot(0));
  agg_.Contribute(Forward("retry", 0, 0, 0, OneValue(1.0)), out.Slot(1));
  agg_.Contribute(Forward("retry", 0, 0, 0, OneValue(9.0)), out.Slot(2));
  ASSERT_EQ(out.calls(2), 1);
  EXPECT_EQ(out.get(2).status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(out.get(2).status.message(),
            "a different payload was already received for (job retry, layer "
            "0, step 0, FORWARD, rank 0); a retry must resend the identical "
            "contribution");
  EXPECT_EQ(out.calls(0), 0);
  agg_.Contribute(Forward("retry", 0, 0, 1, OneValue(3.0)), out.Slot(3));
  for (int i : {0, 1, 3}) {
    ASSERT_EQ(out.calls(i), 1);
    EXPECT_TRUE(out.get(i).status.ok());
    EXPECT_EQ(out.get(i).moments.mean[0], 2.0) << "the conflict was not used";
    EXPECT_EQ(out.get(i).moments.count, 2);
  }
}

TEST_F(AggregatorTest, RetryAfterCompletionReturnsTheCachedOutcome) {
  Create(Spec("cached", 2, {Layer(1)}));
  Send(Forward("cached", 0, 0, 0, OneValue(1.0)));
  RoundOutcome done = Sync(Forward("cached", 0, 0, 1, OneValue(2.0)));
  ASSERT_TRUE(done.status.ok());
  RoundOutcome again = Sync(Forward("cached", 0, 0, 1, OneValue(2.0)));
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.version, done.version);
  EXPECT_TRUE(SameBits(again.moments.mean, done.moments.mean));
  EXPECT_TRUE(SameBits(again.moments.var, done.moments.var));
  RoundOutcome other = Sync(Forward("cached", 0, 0, 0, OneValue(5.0)));
  EXPECT_EQ(other.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(other.status.message()),
              HasSubstr("different payload"));
  auto s = agg_.GetRunningStats("cached", {}, 0);
  EXPECT_EQ(s->layers[0].stats.num_batches_tracked, 1) << "never re-applied";
}

TEST_F(AggregatorTest, StaleStepsAreSupersededOutsideTheWindow) {
  Create(Spec("stale", 1, {Layer(1)}));
  Moments m = Moments::Zero(1);
  m.count = 2;
  m.m2[0] = 1;
  for (int step = 0; step < 20; step += 2) {
    ASSERT_TRUE(Sync(Forward("stale", 0, step, 0, m)).status.ok());
  }
  RoundOutcome old = Sync(Forward("stale", 0, 0, 0, m));
  EXPECT_EQ(old.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.status.message(),
            "step 0 of layer 0 (FORWARD) is superseded: the layer has already "
            "applied step 18; steps must increase");
  RoundOutcome skipped = Sync(Forward("stale", 0, 17, 0, m));
  EXPECT_EQ(skipped.status.code(), absl::StatusCode::kFailedPrecondition);
  RoundOutcome recent = Sync(Forward("stale", 0, 12, 0, m));
  EXPECT_TRUE(recent.status.ok());
  EXPECT_EQ(recent.version, 7);
  EXPECT_EQ(agg_.GetJob("stale")->committed_step, 18);
}

TEST_F(AggregatorTest, EarlierPendingRoundFailsWhenALaterStepCompletes) {
  Create(Spec("order", 2, {Layer(1)}));
  OutcomeRecorder out(1);
  agg_.Contribute(Forward("order", 0, 3, 0, OneValue(1)), out.Slot(0));
  Send(Forward("order", 0, 4, 0, OneValue(1)));
  Send(Forward("order", 0, 4, 1, OneValue(2)));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(out.get(0).status.message()),
              HasSubstr("step 3 of layer 0 (FORWARD) is superseded"));
}

TEST_F(AggregatorTest, GlobalCountOneFailsOnlyWithUnbiasedRunningVar) {
  std::vector<LayerConfig> layers = {Layer(1), Layer(1)};
  layers[1].rule.biased_var = true;
  Create(Spec("one", 2, layers));
  OutcomeRecorder out(2);
  agg_.Contribute(Forward("one", 0, 0, 0, OneValue(1)), out.Slot(0));
  agg_.Contribute(Forward("one", 0, 0, 1, Moments::Zero(1)), out.Slot(1));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out.get(i).status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(out.get(i).status.message()),
                HasSubstr("Expected more than 1 value per channel"));
  }
  EXPECT_EQ(agg_.GetRunningStats("one", {0}, 0)->layers[0].stats.mean[0], 0);
  Send(Forward("one", 1, 0, 0, OneValue(1)));
  RoundOutcome ok = Sync(Forward("one", 1, 0, 1, Moments::Zero(1)));
  EXPECT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.version, 1);
}

TEST_F(AggregatorTest, EmptyGlobalBatchLeavesStatsAlone) {
  Create(Spec("empty", 2, {Layer(2)}));
  Send(Forward("empty", 0, 0, 0, Moments::Zero(2)));
  RoundOutcome o = Sync(Forward("empty", 0, 0, 1, Moments::Zero(2)));
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.moments.count, 0);
  EXPECT_EQ(o.moments.var, (std::vector<double>{0, 0}));
  EXPECT_EQ(o.version, 0);
  auto s = agg_.GetRunningStats("empty", {}, 0);
  EXPECT_EQ(s->layers[0].stats.num_batches_tracked, 0);
}

TEST_F(AggregatorTest, BackwardSumsInRankOrderAndCarriesForwardVersion) {
  Create(Spec("bwd", 3, {Layer(2)}));
  Moments m = Moments::Zero(2);
  m.count = 4;
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 3; ++r) Send(Forward("bwd", 0, step, r, m));
  }
  std::vector<Contribution> cs;
  for (int r = 0; r < 3; ++r) {
    GradSums g;
    g.sum_dy = {0.1 * (r + 1), -1.0 * r};
    g.sum_dy_xmu = {1e16 * (r == 0) - 1e16 * (r == 1) + 1.0, 3.0};
    cs.push_back(Backward("bwd", 0, 0, r, g));
  }
  std::vector<RoundOutcome> got = ContributeConcurrently(agg_, cs, 3);
  for (const RoundOutcome& o : got) {
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.version, 1) << "the version of step 0's forward round";
    EXPECT_EQ(o.grad_sums.sum_dy[0], (0.1 + 0.2) + 0.30000000000000004);
    EXPECT_EQ(o.grad_sums.sum_dy[1], -3.0);
    // Rank order: (1e16 + 1) + (-1e16 + 1) + 1, exactly as folded.
    EXPECT_EQ(o.grad_sums.sum_dy_xmu[0],
              ((0.0 + (1e16 + 1.0)) + (-1e16 + 1.0)) + 1.0);
    EXPECT_EQ(o.grad_sums.sum_dy_xmu[1], 9.0);
  }
}

TEST_F(AggregatorTest, RejectsBadContributions) {
  Create(Spec("bad", 2, {Layer(2), Layer(2), Layer(2)}));
  Moments good = Moments::Zero(2);
  good.count = 2;
  struct Case {
    Contribution c;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](absl::StatusCode code, std::string msg, auto mutate) {
    Contribution c = Forward("bad", 0, 0, 0, good);
    mutate(c);
    cases.push_back({c, code, msg});
  };
  const double inf = std::numeric_limits<double>::infinity();
  using S = absl::StatusCode;
  add(S::kNotFound, "job 'nope' not found; create it with CreateJob first",
      [](Contribution& c) { c.job_id = "nope"; });
  add(S::kInvalidArgument, "layer 3 is out of range: job 'bad' has 3 layers",
      [](Contribution& c) { c.layer = 3; });
  add(S::kInvalidArgument, "layer -1 is out of range",
      [](Contribution& c) { c.layer = -1; });
  add(S::kInvalidArgument, "step is -1", [](Contribution& c) { c.step = -1; });
  add(S::kInvalidArgument, "rank 2 is out of range: job 'bad' has world_size 2",
      [](Contribution& c) { c.rank = 2; });
  add(S::kInvalidArgument, "rank -1 is out of range",
      [](Contribution& c) { c.rank = -1; });
  add(S::kInvalidArgument, "phase 0 is not valid",
      [](Contribution& c) { c.phase = Phase::kUnspecified; });
  add(S::kInvalidArgument, "phase 9 is not valid",
      [](Contribution& c) { c.phase = Phase(9); });
  add(S::kInvalidArgument, "a FORWARD contribution must carry moments",
      [](Contribution& c) { c.payload = std::monostate(); });
  add(S::kInvalidArgument, "a BACKWARD contribution must carry grad_sums",
      [](Contribution& c) { c.phase = Phase::kBackward; });
  add(S::kInvalidArgument, "moments.mean has 3 values but the layer has 2",
      [](Contribution& c) { std::get<Moments>(c.payload).mean.push_back(0); });
  add(S::kInvalidArgument, "moments.count is -2",
      [](Contribution& c) { std::get<Moments>(c.payload).count = -2; });
  add(S::kInvalidArgument, "moments.m2[1] is -1",
      [](Contribution& c) { std::get<Moments>(c.payload).m2[1] = -1; });
  add(S::kInvalidArgument, "moments.mean[0] is nan", [](Contribution& c) {
    std::get<Moments>(c.payload).mean[0] = std::nan("");
  });
  add(S::kInvalidArgument, "grad_sums.sum_dy_xmu[1] is inf",
      [inf](Contribution& c) {
        GradSums g;
        g.sum_dy = {0, 0};
        g.sum_dy_xmu = {0, inf};
        c.phase = Phase::kBackward;
        c.payload = g;
      });
  for (const Case& k : cases) {
    RoundOutcome o = Sync(k.c);
    EXPECT_EQ(o.status.code(), k.code) << k.message << ": " << o.status;
    EXPECT_THAT(std::string(o.status.message()), HasSubstr(k.message));
  }
  // Nothing was counted: a round needs both ranks still.
  auto s = agg_.GetRunningStats("bad", {}, 0);
  for (const auto& l : s->layers) EXPECT_EQ(l.stats.num_batches_tracked, 0);
}

// A round whose result could not be used (a merge that overflows float64,
// counts past INT64_MAX, a version at its bound) fails for every rank and
// changes nothing; the next step is served.
TEST_F(AggregatorTest, RoundsThatWouldOverflowFailAndKeepTheStats) {
  Create(Spec("big", 2, {Layer(1)}));
  auto moments = [](int64_t count, double mean, double m2) {
    Moments m = Moments::Zero(1);
    m.count = count;
    m.mean[0] = mean;
    m.m2[0] = m2;
    return m;
  };
  auto round = [&](int64_t step, Moments a, Moments b) {
    OutcomeRecorder out(2);
    agg_.Contribute(Forward("big", 0, step, 0, std::move(a)), out.Slot(0));
    agg_.Contribute(Forward("big", 0, step, 1, std::move(b)), out.Slot(1));
    EXPECT_EQ(out.calls(0), 1);
    EXPECT_EQ(out.calls(1), 1);
    EXPECT_EQ(out.get(0).status, out.get(1).status);
    return out.get(0).status;
  };
  const RunningStats before =
      agg_.GetRunningStats("big", {0}, 0)->layers[0].stats;
  absl::Status s =
      round(0, moments(2, 1e308, 1e308), moments(2, -1e308, 1e308));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("merging the ranks' moments overflows float64"));
  const int64_t half = int64_t{1} << 62;
  s = round(1, moments(half, 0, 0), moments(half, 0, 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1's count does not fit"));
  RunningStats at_bound = before;
  at_bound.num_batches_tracked = kMaxNumBatchesTracked;
  ASSERT_TRUE(agg_.SetRunningStats("big", {{0, "bn", 0, at_bound}}).ok());
  s = round(2, moments(2, 1, 1), moments(2, 3, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  RunningStats now = agg_.GetRunningStats("big", {0}, 0)->layers[0].stats;
  EXPECT_EQ(now.num_batches_tracked, kMaxNumBatchesTracked);
  EXPECT_TRUE(SameBits(now.mean, before.mean));
  EXPECT_TRUE(SameBits(now.var, before.var));
  EXPECT_EQ(agg_.GetJob("big")->committed_step, -1);

  ASSERT_TRUE(agg_.SetRunningStats("big", {{0, "bn", 0, before}}).ok());
  s = round(3, moments(2, 1, 1), moments(2, 3, 1));
  ASSERT_TRUE(s.ok()) << s;
  now = agg_.GetRunningStats("big", {0}, 0)->layers[0].stats;
  EXPECT_EQ(now.num_batches_tracked, 1);
  // mean 2, M2 = 1 + 1 + 2 * 2 * 1 = 6 over 4 values: unbiased var 2.
  EXPECT_DOUBLE_EQ(now.mean[0], 0.1 * 2);
  EXPECT_DOUBLE_EQ(now.var[0], 0.9 + 0.1 * 2);
  EXPECT_EQ(agg_.GetJob("big")->committed_step, 3);
}

TEST_F(AggregatorTest, CreateJobIsIdempotentPerSpec) {
  JobSpec spec = Spec("same", 2, {Layer(3)});
  Create(spec);
  JobSpec resolved_equivalent = spec;
  resolved_equivalent.layers[0].rule.momentum = 0.1;
  absl::StatusOr<JobSnapshot> again = agg_.CreateJob(resolved_equivalent);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.layers[0].rule.momentum, 0.1);
  EXPECT_EQ(again->committed_step, -1);
  spec.world_size = 4;
  absl::StatusOr<JobSnapshot> diff = agg_.CreateJob(spec);
  EXPECT_EQ(diff.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(diff.status().message()),
              HasSubstr("already exists with a different spec"));
  spec.world_size = 0;
  EXPECT_EQ(agg_.CreateJob(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg_.GetJob("other").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AggregatorTest, DeleteJobAbortsWaitingRounds) {
  Create(Spec("gone", 2, {Layer(1)}));
  OutcomeRecorder out(1);
  agg_.Contribute(Forward("gone", 0, 0, 0, OneValue(1)), out.Slot(0));
  ASSERT_TRUE(agg_.DeleteJob("gone").ok());
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(out.get(0).status.message()),
              HasSubstr("job deleted"));
  EXPECT_EQ(agg_.DeleteJob("gone").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Sync(Forward("gone", 0, 0, 1, OneValue(1))).status.code(),
            absl::StatusCode::kNotFound);
  Create(Spec("gone", 2, {Layer(1)}));
  EXPECT_EQ(agg_.GetJob("gone")->committed_step, -1);
}

TEST_F(AggregatorTest, CallbacksRunOutsideLocks) {
  Create(Spec("reentrant", 2, {Layer(1)}));
  absl::Notification nested;
  agg_.Contribute(
      Forward("reentrant", 0, 0, 0, OneValue(1)), [&](const RoundOutcome&) {
        // Would deadlock if called under the layer's lock.
        EXPECT_TRUE(agg_.GetRunningStats("reentrant", {}, 0).ok());
        agg_.Contribute(Forward("reentrant", 0, 1, 0, OneValue(1)),
                        [&](const RoundOutcome&) { nested.Notify(); });
      });
  agg_.Contribute(Forward("reentrant", 0, 0, 1, OneValue(2)),
                  [](const RoundOutcome&) {});
  agg_.Contribute(Forward("reentrant", 0, 1, 1, OneValue(2)),
                  [](const RoundOutcome&) {});
  EXPECT_TRUE(nested.HasBeenNotified());
}

TEST(AggregatorReaperTest, ReaperExpiresRoundsOnTheRealClock) {
  RealClock clock;
  AggregatorOptions options;
  options.reaper_period = absl::Milliseconds(10);
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(options, &clock, &store);
  agg.StartReaper();
  JobSpec spec = Spec("reaped", 2, {Layer(1)});
  spec.round_timeout = absl::Milliseconds(50);
  ASSERT_TRUE(agg.CreateJob(spec).ok());
  absl::Notification done;
  absl::Status status;
  agg.Contribute(Forward("reaped", 0, 0, 1, OneValue(1)),
                 [&](const RoundOutcome& o) {
                   status = o.status;
                   done.Notify();
                 });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("ranks [0]"));
  agg.StopReaper();
  agg.StopReaper();
}

TEST(AggregatorShutdownTest, DestructionAnswersWaitingRounds) {
  FakeClock clock;
  int calls = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  KvStateStore store(std::make_unique<MemoryEngine>());
  {
    Aggregator agg(AggregatorOptions(), &clock, &store);
    ASSERT_TRUE(agg.CreateJob(Spec("bye", 2, {Layer(1)})).ok());
    agg.Contribute(Forward("bye", 0, 0, 0, OneValue(1)),
                   [&](const RoundOutcome& o) {
                     ++calls;
                     code = o.status.code();
                   });
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(code, absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace syncnorm
