// Statistics health through a relay's scores, measured as
// //server/domain:stats_health_test measures the shard's own, without a
// network: W = 32 ranks in blocks of 8, C = 256 channels, batch sizes drawn
// from 2 to 64 with one rank in ten empty, each rank's moments drawn from
// their exact sampling distributions for normal values (mean ~ N(mu,
// sigma^2/n), M2 ~ sigma^2 chi^2_{n-1}). Each block's ranks are scored
// by BlockHealth from the round's merge, sent as the relay sends them
// (Attach), and tracked by the shard's StatsHealth.
#include "relay/block_health.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/stats_health.h"
#include "wire/convert.h"

namespace syncnorm {
namespace {

constexpr int kWorld = 32;
constexpr int kBlock = 8;
constexpr int kChannels = 256;
constexpr int kStuck = 17;

enum class Fault { kNone, kScale, kShift, kStuck };

struct Scored {
  int64_t beyond3[2] = {0, 0};
  int64_t beyond5[2] = {0, 0};
  int64_t scored[2] = {0, 0};
};

class RelayedHealth {
 public:
  explicit RelayedHealth(uint64_t seed)
      : rng_(seed), health_("job", {"bn"}, nullptr) {}

  // One forward round through the relays: every block scored, its scores
  // sent with a later contribution and tracked by the shard.
  void Round(int64_t step, const std::map<int, Fault>& faults) {
    std::vector<Moments> moments;
    Moments merged = Moments::Zero(kChannels);
    for (int r = 0; r < kWorld; ++r) {
      const auto f = faults.find(r);
      moments.push_back(Draw(f == faults.end() ? Fault::kNone : f->second));
      MergeMoments(merged, moments.back());
    }
    v1::RoundResult answer;
    answer.set_step(step);
    answer.set_phase(v1::FORWARD);
    ToProto(Finalize(merged), *answer.mutable_moments());
    for (int b = 0; b < kWorld / kBlock; ++b) {
      std::map<int, HeldContribution> held;
      for (int r = b * kBlock; r < (b + 1) * kBlock; ++r) {
        ToProto(moments[r], *held[r].contribution.mutable_moments());
      }
      const BlockHealth::BlockId id("job", 0, 0, 0, b);
      relay_.Score(id, held, answer);
      v1::Contribution next;
      next.set_phase(v1::FORWARD);
      next.set_step(step + 1);
      next.mutable_relay()->add_rank_runs(b * kBlock);
      next.mutable_relay()->add_rank_runs((b + 1) * kBlock - 1);
      relay_.Attach(id, next);
      Track(next.relay());
    }
  }

  const Scored& scored() const { return scored_; }
  StatsHealthSnapshot Snapshot() const { return health_.Snapshot(64); }

 private:
  Moments Draw(Fault fault) {
    std::uniform_int_distribution<int> batch(2, 64);
    const int64_t n = rng_() % 10 == 0 ? 0 : batch(rng_);
    Moments m = Moments::Zero(kChannels);
    m.count = n;
    if (n == 0) return m;
    const double sigma = fault == Fault::kScale ? 1.5 * 2.0 : 2.0;
    const double mu = fault == Fault::kShift ? 3.0 + 0.5 * 2.0 : 3.0;
    std::normal_distribution<double> z(0.0, 1.0);
    std::chi_squared_distribution<double> chi2(static_cast<double>(n - 1));
    for (int c = 0; c < kChannels; ++c) {
      m.mean[c] = mu + sigma * z(rng_) / std::sqrt(static_cast<double>(n));
      m.m2[c] = sigma * sigma * chi2(rng_);
      if (fault == Fault::kStuck && c == kStuck) {
        m.mean[c] = 0.25;
        m.m2[c] = 0;
      }
    }
    return m;
  }

  void Track(const v1::RelayBlock& block) {
    std::vector<RankHealth> entries;
    for (const v1::RankHealth& h : block.health()) {
      RankHealth e;
      e.rank = h.rank();
      e.step = h.step();
      e.count = h.count();
      if (h.has_mean_shift()) e.mean_shift = h.mean_shift();
      if (h.has_variance_ratio()) e.variance_ratio = h.variance_ratio();
      if (h.has_stuck_channel()) e.stuck_channel = h.stuck_channel();
      const double v[2] = {e.mean_shift, std::abs(e.variance_ratio)};
      for (int k = 0; k < 2; ++k) {
        if (std::isnan(v[k])) continue;
        ++scored_.scored[k];
        scored_.beyond3[k] += v[k] > 3 ? 1 : 0;
        scored_.beyond5[k] += v[k] > 5 ? 1 : 0;
      }
      entries.push_back(e);
    }
    health_.ObserveRelayed(0, 0, entries);
  }

  std::mt19937_64 rng_;
  BlockHealth relay_;
  StatsHealth health_;
  Scored scored_;
};

// Healthy ranks behind relays: their scores follow the standard normal
// tail, and no flag is raised.
TEST(BlockHealthMeasureTest, HealthyRanksBehindRelaysRaiseNoFlag) {
  RelayedHealth h(35);
  constexpr int kRounds = 1000;
  for (int64_t step = 0; step < kRounds; ++step) h.Round(step, {});
  const Scored& s = h.scored();
  for (int k = 0; k < 2; ++k) {
    std::printf("%s: %lld rank-rounds scored, %lld beyond 3, %lld beyond 5\n",
                k == 0 ? "mean shift" : "variance ratio",
                static_cast<long long>(s.scored[k]),
                static_cast<long long>(s.beyond3[k]),
                static_cast<long long>(s.beyond5[k]));
    // About 0.9 of the 32,000 rank-rounds have a batch.
    EXPECT_GT(s.scored[k], 27000);
    // One-sided 0.135% (mean shift), two-sided 0.27% (variance ratio).
    EXPECT_LT(s.beyond3[k], s.scored[k] * 6 / 1000);
  }
  const StatsHealthSnapshot snap = h.Snapshot();
  EXPECT_EQ(snap.flags_in_force, 0);
  for (const HealthFlag& f : snap.flags) {
    ADD_FAILURE() << "rank " << f.rank << " flagged, kind "
                  << HealthKindName(f.kind) << ", score " << f.score;
  }
}

// A rank scaled by 1.5, one shifted by half a standard deviation and one
// with a channel stuck, in three blocks: each flagged by its rank within
// 10 rounds, and no other rank.
TEST(BlockHealthMeasureTest, BrokenRanksBehindRelaysAreFlaggedByRank) {
  RelayedHealth h(36);
  const std::map<int, Fault> faults = {
      {3, Fault::kScale}, {12, Fault::kShift}, {26, Fault::kStuck}};
  for (int64_t step = 0; step < 10; ++step) h.Round(step, faults);
  std::map<int, std::set<HealthKind>> kinds;
  for (const HealthFlag& f : h.Snapshot().flags) {
    EXPECT_TRUE(f.active);
    kinds[f.rank].insert(f.kind);
    if (f.kind == HealthKind::kStuckChannel) {
      EXPECT_EQ(f.channel, kStuck);
    }
  }
  ASSERT_EQ(kinds.size(), 3u);
  EXPECT_TRUE(kinds[3].count(HealthKind::kVarianceRatio));
  EXPECT_TRUE(kinds[12].count(HealthKind::kMeanShift));
  EXPECT_TRUE(kinds[26].count(HealthKind::kStuckChannel));
}

}  // namespace
}  // namespace syncnorm
