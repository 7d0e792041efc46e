// Statistics health through the aggregator: rounds of W = 8 ranks and 256
// channels, batch sizes drawn from 2 to 64 with some ranks empty. Healthy,
// identically distributed shards raise no flag; a rank whose inputs are
// scaled by 1.5, shifted by half a standard deviation, or have a channel
// stuck at a constant is flagged within 10 steps and named, and the
// others are not; a dead channel is flagged for its layer. The moments of
// a normal batch are drawn from their exact distributions (the mean
// normal with variance sigma^2 / n, M2 as sigma^2 chi-square with n - 1
// degrees of freedom), which is what computing them from n draws gives.
#include "server/domain/stats_health.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/log.h"
#include "server/domain/round_observer.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 8;
constexpr int kChannels = 256;

// What is wrong with a rank's inputs.
enum class Fault { kNone, kScaled, kShifted, kStuck, kDead };

// The shards' distribution: channel c is normal(mu[c], sigma[c]^2).
struct Population {
  std::vector<double> mu, sigma;
};

Population MakePopulation(std::mt19937_64& rng, int channels) {
  Population p;
  std::normal_distribution<double> mean(0.0, 2.0);
  std::uniform_real_distribution<double> scale(0.2, 3.0);
  for (int c = 0; c < channels; ++c) {
    p.mu.push_back(mean(rng));
    p.sigma.push_back(scale(rng));
  }
  return p;
}

constexpr int kStuckChannel = 17;

// The moments of a batch of n values per channel of `p` as `fault` makes
// them.
Moments Draw(std::mt19937_64& rng, int64_t n, const Population& p,
             Fault fault) {
  const int channels = static_cast<int>(p.mu.size());
  Moments m = Moments::Zero(channels);
  m.count = n;
  if (n == 0) return m;
  std::normal_distribution<double> z(0.0, 1.0);
  for (int c = 0; c < channels; ++c) {
    const double s = p.sigma[c];
    double mean = p.mu[c] + s * z(rng) / std::sqrt(static_cast<double>(n));
    double m2 = 0;
    if (n > 1) {
      std::gamma_distribution<double> chi2(0.5 * static_cast<double>(n - 1),
                                           2.0);
      m2 = s * s * chi2(rng);
    }
    switch (fault) {
      case Fault::kScaled:  // x -> 1.5 x
        mean *= 1.5;
        m2 *= 2.25;
        break;
      case Fault::kShifted:  // x -> x + sigma / 2
        mean += 0.5 * s;
        break;
      case Fault::kStuck:
      case Fault::kDead:
        if (c == kStuckChannel) {
          mean = fault == Fault::kDead ? 0.0 : 0.3;
          m2 = 0;
        }
        break;
      case Fault::kNone:
        break;
    }
    m.mean[c] = mean;
    m.m2[c] = m2;
  }
  return m;
}

// Batch sizes from 2 to 64, one rank in ten empty.
int64_t DrawCount(std::mt19937_64& rng) {
  if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) return 0;
  return std::uniform_int_distribution<int>(2, 64)(rng);
}

// Keeps every flag raised and cleared.
class HealthRecorder final : public RoundObserver {
 public:
  void OnRoundCompleted(const RoundReport&) override {}
  void OnDeadline(const RoundReport&) override {}
  void OnStatsHealth(const StatsHealthReport& r) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(r);
  }
  std::vector<StatsHealthReport> reports() {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  absl::Mutex mu_;
  std::vector<StatsHealthReport> reports_;
};

class StatsHealthTest : public ::testing::Test {
 protected:
  StatsHealthTest() : store_(std::make_unique<MemoryEngine>()) {
    AggregatorOptions options;
    options.observer = &recorder_;
    agg_ = std::make_unique<Aggregator>(options, &clock_, &store_);
    EXPECT_TRUE(agg_->Load().ok());
  }

  void Create(const std::string& job, int layers = 1, bool health = true) {
    JobSpec s;
    s.job_id = job;
    s.world_size = kWorld;
    s.round_timeout = absl::Seconds(5);
    s.stats_health = health;
    for (int l = 0; l < layers; ++l) {
      LayerConfig layer;
      layer.name = "bn" + std::to_string(l);
      layer.channels = kChannels;
      s.layers.push_back(layer);
    }
    ASSERT_TRUE(agg_->CreateJob(s).ok());
  }

  // One forward round of `layer` at `step`: every rank's batch, `faulty`
  // drawn with `fault`. Returns the round's status.
  absl::Status Round(const std::string& job, int layer, int64_t step,
                     const Population& p, int faulty, Fault fault) {
    absl::Status last = absl::UnknownError("no answer");
    int64_t total = 0;
    std::vector<Moments> batches;
    for (int r = 0; r < kWorld; ++r) {
      // A dead channel is every rank's; a round needs 2 values at least.
      const Fault f = fault == Fault::kDead
                          ? Fault::kDead
                          : (r == faulty ? fault : Fault::kNone);
      int64_t n = DrawCount(rng_);
      if (r == kWorld - 1 && total + n < 2) n = 2;
      total += n;
      batches.push_back(Draw(rng_, n, p, f));
    }
    for (int r = 0; r < kWorld; ++r) {
      Contribution c;
      c.job_id = job;
      c.layer = layer;
      c.step = step;
      c.phase = Phase::kForward;
      c.rank = r;
      c.payload = std::move(batches[r]);
      agg_->Contribute(std::move(c),
                       [&last](const RoundOutcome& o) { last = o.status; });
    }
    return last;
  }

  StatsHealthSnapshot Health(const std::string& job) {
    auto h = agg_->GetStatsHealth(job, 256);
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(h.ok() && h->has_value());
    return h.ok() && h->has_value() ? **h : StatsHealthSnapshot();
  }

  // Runs `rounds` healthy rounds and expects no flag.
  void ExpectNoFalseAlarm(int rounds, uint64_t seed) {
    rng_.seed(seed);
    const Population p = MakePopulation(rng_, kChannels);
    Create("healthy");
    for (int step = 0; step < rounds; ++step) {
      ASSERT_TRUE(Round("healthy", 0, step, p, -1, Fault::kNone).ok());
    }
    const StatsHealthSnapshot h = Health("healthy");
    EXPECT_EQ(h.rounds_scored, rounds);
    EXPECT_EQ(h.flags_in_force, 0);
    for (const StatsHealthReport& r : recorder_.reports()) {
      ADD_FAILURE() << "false alarm: rank " << r.flag.rank << " "
                    << HealthKindName(r.flag.kind) << " at step "
                    << r.flag.first_step << " score " << r.flag.score;
    }
  }

  // Runs healthy rounds, then rounds with rank `faulty` drawn with
  // `fault`; expects `kind` raised for it within 10 steps of the fault and
  // no flag of another rank. Returns the flag.
  HealthFlag ExpectFlagged(Fault fault, HealthKind kind, int faulty,
                           uint64_t seed) {
    rng_.seed(seed);
    const Population p = MakePopulation(rng_, kChannels);
    Create("faulty", 2);
    constexpr int kFaultStep = 20;
    for (int step = 0; step < kFaultStep + 10; ++step) {
      const bool bad = step >= kFaultStep;
      for (int layer = 0; layer < 2; ++layer) {
        // Layer 1 stays healthy throughout.
        EXPECT_TRUE(Round("faulty", layer, step, p, faulty,
                          bad && layer == 0 ? fault : Fault::kNone)
                        .ok());
      }
    }
    HealthFlag found;
    bool seen = false;
    for (const StatsHealthReport& r : recorder_.reports()) {
      EXPECT_TRUE(r.raised);
      EXPECT_EQ(r.flag.layer, 0) << HealthKindName(r.flag.kind);
      EXPECT_EQ(r.flag.layer_name, "bn0");
      EXPECT_GE(r.flag.first_step, kFaultStep) << HealthKindName(r.flag.kind);
      if (kind == HealthKind::kDeadChannel) {
        EXPECT_EQ(r.flag.rank, -1);
      } else {
        EXPECT_EQ(r.flag.rank, faulty)
            << "a healthy rank was flagged: " << HealthKindName(r.flag.kind);
      }
      if (r.flag.kind == kind) {
        found = r.flag;
        seen = true;
      }
    }
    EXPECT_TRUE(seen) << "not flagged: " << HealthKindName(kind);
    EXPECT_LT(found.last_step, kFaultStep + 10);
    // The snapshot names it too.
    bool listed = false;
    for (const HealthFlag& f : Health("faulty").flags) {
      listed = listed || (f.kind == kind && f.rank == found.rank &&
                          f.layer == 0 && f.active);
    }
    EXPECT_TRUE(listed);
    return found;
  }

  std::mt19937_64 rng_;
  FakeClock clock_;
  KvStateStore store_;
  HealthRecorder recorder_;
  std::unique_ptr<Aggregator> agg_;
};

TEST_F(StatsHealthTest, HealthyShardsRaiseNoFlag) {
  // SYNCNORM_HEALTH_ROUNDS: the slow suite's 10,000 (stats_health_soak).
  const char* rounds = std::getenv("SYNCNORM_HEALTH_ROUNDS");
  ExpectNoFalseAlarm(rounds != nullptr ? std::atoi(rounds) : 1000, 34);
}

// The per-round scores of healthy ranks against the standard normal tail
// they are calibrated to (docs/semantics.md quotes these figures): over
// 16,000 rank-rounds, beyond 3 about 0.13% of the time, never beyond 5.
TEST_F(StatsHealthTest, HealthyScoresFollowTheNormalTail) {
  rng_.seed(8);
  const Population p = MakePopulation(rng_, kChannels);
  int64_t scored[2] = {0, 0}, beyond3[2] = {0, 0}, beyond5[2] = {0, 0};
  for (int round = 0; round < 2000; ++round) {
    HealthSample s;
    Moments merged = Moments::Zero(kChannels);
    for (int r = 0; r < kWorld; ++r) {
      s.ranks.push_back(r);
      s.moments.push_back(Draw(rng_, DrawCount(rng_), p, Fault::kNone));
      MergeMoments(merged, s.moments.back());
    }
    s.global = Finalize(merged);
    for (const auto& [shift, ratio] : StatsHealth::Scores(s)) {
      const double v[2] = {shift, std::abs(ratio)};
      for (int k = 0; k < 2; ++k) {
        if (std::isnan(v[k])) continue;
        ++scored[k];
        beyond3[k] += v[k] > 3 ? 1 : 0;
        beyond5[k] += v[k] > 5 ? 1 : 0;
      }
    }
  }
  for (int k = 0; k < 2; ++k) {
    std::printf("%s: %lld rank-rounds scored, %lld beyond 3, %lld beyond 5\n",
                k == 0 ? "mean shift" : "variance ratio",
                static_cast<long long>(scored[k]),
                static_cast<long long>(beyond3[k]),
                static_cast<long long>(beyond5[k]));
    ASSERT_GT(scored[k], 12000) << k;
    // One-sided 0.135% (mean shift), two-sided 0.27% (variance ratio).
    const double rate = static_cast<double>(beyond3[k]) / scored[k];
    EXPECT_LT(rate, k == 0 ? 0.004 : 0.008) << k;
    EXPECT_EQ(beyond5[k], 0) << k;
  }
}

// Skewed and zero-heavy channels (an exponential, a ReLU of a normal), the
// moments computed from the values themselves: 2,000 rounds, no flag.
TEST_F(StatsHealthTest, SkewedAndReluChannelsRaiseNoFlag) {
  rng_.seed(9);
  constexpr int kSkewedChannels = 32;
  Create("skewed");
  std::exponential_distribution<double> exponential(0.7);
  std::normal_distribution<double> normal(0.3, 1.0);
  for (int step = 0; step < 2000; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      int64_t n = DrawCount(rng_);
      if (r == kWorld - 1 && n < 2) n = 2;
      Moments m = Moments::Zero(kChannels);
      m.count = n;
      for (int c = 0; c < kSkewedChannels; ++c) {
        double mean = 0, m2 = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double x =
              c % 2 == 0 ? exponential(rng_) : std::max(0.0, normal(rng_));
          const double d = x - mean;
          mean += d / static_cast<double>(i + 1);
          m2 += d * (x - mean);
        }
        m.mean[c] = mean;
        m.m2[c] = m2;
      }
      // The other channels: normal, from their exact distributions.
      for (int c = kSkewedChannels; c < kChannels; ++c) {
        m.mean[c] = n > 0 ? normal(rng_) / std::sqrt(n) : 0;
        if (n > 1) {
          std::gamma_distribution<double> chi2(0.5 * (n - 1), 2.0);
          m.m2[c] = chi2(rng_);
        }
      }
      Contribution c;
      c.job_id = "skewed";
      c.step = step;
      c.phase = Phase::kForward;
      c.rank = r;
      c.payload = std::move(m);
      agg_->Contribute(std::move(c), [](const RoundOutcome& o) {
        EXPECT_TRUE(o.status.ok()) << o.status;
      });
    }
  }
  EXPECT_EQ(Health("skewed").flags_in_force, 0);
  for (const StatsHealthReport& r : recorder_.reports()) {
    ADD_FAILURE() << "false alarm: rank " << r.flag.rank << " "
                  << HealthKindName(r.flag.kind) << " channel "
                  << r.flag.channel << " score " << r.flag.score;
  }
}

TEST_F(StatsHealthTest, AScaledRankIsFlagged) {
  const HealthFlag f =
      ExpectFlagged(Fault::kScaled, HealthKind::kVarianceRatio, 3, 1);
  EXPECT_GT(f.score, StatsHealth::kThreshold);
}

TEST_F(StatsHealthTest, AShiftedRankIsFlagged) {
  const HealthFlag f =
      ExpectFlagged(Fault::kShifted, HealthKind::kMeanShift, 5, 2);
  EXPECT_GT(f.score, StatsHealth::kThreshold);
  EXPECT_EQ(f.channel, -1);
}

TEST_F(StatsHealthTest, AStuckChannelIsFlaggedByChannel) {
  const HealthFlag f =
      ExpectFlagged(Fault::kStuck, HealthKind::kStuckChannel, 0, 3);
  EXPECT_EQ(f.channel, kStuckChannel);
  EXPECT_GE(f.score, StatsHealth::kStuckEvidence);
}

TEST_F(StatsHealthTest, ADeadChannelIsFlaggedForTheLayer) {
  const HealthFlag f =
      ExpectFlagged(Fault::kDead, HealthKind::kDeadChannel, -1, 4);
  EXPECT_EQ(f.channel, kStuckChannel);
  EXPECT_EQ(f.score, 1);  // one dead channel
  EXPECT_EQ(f.last_step - f.first_step + 1, StatsHealth::kDeadRun);
}

TEST_F(StatsHealthTest, AFlagClearsWhenTheRankRecoversAndStaysListed) {
  rng_.seed(5);
  const Population p = MakePopulation(rng_, kChannels);
  Create("recovers");
  int64_t step = 0;
  for (; step < 10; ++step) {
    ASSERT_TRUE(Round("recovers", 0, step, p, 6, Fault::kShifted).ok());
  }
  ASSERT_EQ(Health("recovers").flags_in_force, 1);
  for (; step < 20; ++step) {
    ASSERT_TRUE(Round("recovers", 0, step, p, 6, Fault::kNone).ok());
  }
  const StatsHealthSnapshot h = Health("recovers");
  EXPECT_EQ(h.flags_in_force, 0);
  ASSERT_EQ(h.flags.size(), 1u);
  EXPECT_FALSE(h.flags[0].active);
  EXPECT_EQ(h.flags[0].rank, 6);
  EXPECT_EQ(h.flags[0].kind, HealthKind::kMeanShift);
  EXPECT_EQ(h.flags[0].layer_name, "bn0");
  EXPECT_GT(h.flags[0].cleared_step, 10);
  const std::vector<StatsHealthReport> reports = recorder_.reports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_TRUE(reports[0].raised);
  EXPECT_FALSE(reports[1].raised);
}

TEST_F(StatsHealthTest, NonFiniteContributionsAreCountedPerRank) {
  Create("nan");
  for (int i = 0; i < 3; ++i) {
    Contribution c;
    c.job_id = "nan";
    c.step = i;
    c.phase = Phase::kForward;
    c.rank = 2 + (i == 2 ? 3 : 0);
    Moments m = Moments::Zero(kChannels);
    m.count = 4;
    m.mean[7] = std::nan("");
    c.payload = m;
    absl::Status got;
    agg_->Contribute(std::move(c),
                     [&got](const RoundOutcome& o) { got = o.status; });
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
  }
  const StatsHealthSnapshot h = Health("nan");
  EXPECT_EQ(h.nonfinite_total, 3);
  ASSERT_EQ(h.refused.size(), 2u);
  EXPECT_EQ(h.refused[0], std::make_pair(2, int64_t{2}));
  EXPECT_EQ(h.refused[1], std::make_pair(5, int64_t{1}));
}

TEST_F(StatsHealthTest, AJobMayTurnItOff) {
  rng_.seed(6);
  const Population p = MakePopulation(rng_, kChannels);
  Create("domains", 1, /*health=*/false);
  for (int step = 0; step < 10; ++step) {
    ASSERT_TRUE(Round("domains", 0, step, p, 1, Fault::kShifted).ok());
  }
  auto h = agg_->GetStatsHealth("domains", 256);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->has_value());
  EXPECT_TRUE(recorder_.reports().empty());
  EXPECT_EQ(agg_->GetStatsHealth("none", 256).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StatsHealthTest, TheSnapshotIsBoundedForAnyWorld) {
  // Every rank of a wide job shifted at once except a majority: the list
  // stays at its limit and counts the rest.
  StatsHealth health("wide", {"bn"}, nullptr);
  std::mt19937_64 rng(7);
  const Population p = MakePopulation(rng, 8);
  constexpr int kWide = 1000;
  for (int64_t step = 0; step < 4; ++step) {
    HealthSample s;
    s.step = step;
    for (int r = 0; r < kWide; ++r) {
      s.ranks.push_back(r);
      // Ranks 0..299 have a channel stuck; the others are healthy.
      Moments m = Draw(rng, 40, p, Fault::kNone);
      if (r < 300) m.m2[3] = 0;
      s.moments.push_back(std::move(m));
    }
    Moments merged = Moments::Zero(8);
    for (const Moments& m : s.moments) MergeMoments(merged, m);
    s.global = Finalize(merged);
    health.Observe(s);
  }
  const StatsHealthSnapshot snap = health.Snapshot(16);
  EXPECT_EQ(snap.flags_in_force, 300);
  EXPECT_EQ(snap.flags.size(), 16u);
  for (const HealthFlag& f : snap.flags) {
    EXPECT_EQ(f.kind, HealthKind::kStuckChannel);
    EXPECT_EQ(f.channel, 3);
  }
}

// Keeps the lines written.
class Lines final : public LogSink {
 public:
  void Write(absl::string_view line) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(line);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_;
};

TEST(StatsHealthLogTest, OneLinePerFlagRaisedAndCleared) {
  Lines sink;
  LoggingRoundObserver::Options options;
  options.sink = &sink;
  LoggingRoundObserver logger(options);
  StatsHealthReport r;
  r.job_id = "j";
  r.flag.layer_name = "layer1.0.bn1";
  r.flag.kind = HealthKind::kStuckChannel;
  r.flag.layer = 4;
  r.flag.rank = 3;
  r.flag.channel = 17;
  r.flag.first_step = 120;
  r.flag.last_step = 122;
  r.flag.score = 40;
  logger.OnStatsHealth(r);
  r.raised = false;
  r.flag.active = false;
  r.flag.cleared_step = 130;
  logger.OnStatsHealth(r);
  const std::vector<std::string> lines = sink.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("level=warn event=stats_health_flag"));
  EXPECT_THAT(lines[0],
              HasSubstr("job=j group=0 layer=4 layer_name=layer1.0.bn1 rank=3 "
                        "kind=stuck_channel channel=17 first_step=120 "
                        "step=122 score=40"));
  EXPECT_THAT(lines[1], HasSubstr("level=info event=stats_health_cleared"));
  EXPECT_THAT(lines[1], HasSubstr("first_step=120 step=130"));
}

}  // namespace
}  // namespace syncnorm
