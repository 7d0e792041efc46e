// The one scoring formula of statistics health: a relay's center (the
// round's merge with one rank taken out) against the float64 reference's
// statistics of the other ranks' values, and the scores against values
// worked out by hand from the documented formulas.
#include "server/domain/rank_score.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm {
namespace {

namespace ref = ::syncnorm::reference;

TEST(RankScoreTest, ScoredChannelsAreAllOrAnEvenSubset) {
  const std::vector<int> small = ScoredChannels(10);
  ASSERT_EQ(small.size(), 10u);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(small[c], c);
  const std::vector<int> large = ScoredChannels(1000);
  ASSERT_EQ(large.size(), static_cast<size_t>(kMaxScoredChannels));
  EXPECT_EQ(large.front(), 0);
  for (size_t k = 1; k < large.size(); ++k) {
    EXPECT_GT(large[k], large[k - 1]);
    EXPECT_LT(large[k], 1000);
  }
  EXPECT_TRUE(ScoredChannels(0).empty());
}

Moments ToMoments(const ref::Stats& s) {
  Moments m;
  m.count = s.count;
  for (size_t c = 0; c < s.mean.size(); ++c) {
    m.mean.push_back(static_cast<double>(s.mean[c]));
    m.m2.push_back(static_cast<double>(s.m2[c]));
  }
  return m;
}

// A relay knows the round's answer and its own rank's moments; the center
// it derives must be the other ranks' own statistics.
TEST(RankScoreTest, TheCenterWithoutARankIsTheOtherRanksStatistics) {
  constexpr int kRanks = 6;
  constexpr int kChannels = 300;  // more than are scored
  std::mt19937 rng(7);
  std::normal_distribution<double> value(40.0, 3.0);
  std::uniform_int_distribution<int> rows(1, 9);
  std::vector<ref::Layout> layouts;
  std::vector<std::vector<double>> xs(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    layouts.push_back(ref::Layout{{rows(rng), kChannels}});
    // Rank 2 is far off, as a broken rank is.
    const double shift = r == 2 ? 25.0 : 0.0;
    for (int64_t i = 0; i < layouts[r].size(); ++i) {
      xs[r].push_back(value(rng) + shift);
    }
  }
  std::vector<const std::vector<double>*> all;
  for (auto& x : xs) all.push_back(&x);
  const ref::Stats g = ref::Moments(kChannels, layouts, all);
  GlobalMoments global;
  global.count = g.count;
  for (int c = 0; c < kChannels; ++c) {
    global.mean.push_back(static_cast<double>(g.mean[c]));
    global.var.push_back(static_cast<double>(g.Var()[c]));
  }
  const std::vector<int> channels = ScoredChannels(kChannels);
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(r);
    std::vector<ref::Layout> rest_layouts;
    std::vector<const std::vector<double>*> rest;
    for (int o = 0; o < kRanks; ++o) {
      if (o == r) continue;
      rest_layouts.push_back(layouts[o]);
      rest.push_back(&xs[o]);
    }
    const ref::Stats want = ref::Moments(kChannels, rest_layouts, rest);
    const HealthCenter c = CenterWithout(
        global, ToMoments(ref::Moments(layouts[r], xs[r])), channels);
    EXPECT_EQ(c.count, want.count);
    EXPECT_EQ(c.dof, want.count - 1);
    ASSERT_EQ(c.mean.size(), channels.size());
    for (size_t k = 0; k < channels.size(); ++k) {
      const ref::Real var = want.m2[channels[k]] / (want.count - 1);
      EXPECT_NEAR(c.mean[k], static_cast<double>(want.mean[channels[k]]),
                  1e-10);
      EXPECT_NEAR(c.var[k], static_cast<double>(var), 1e-9 * var);
    }
  }
}

TEST(RankScoreTest, ARankHoldingEveryValueHasNoCenter) {
  Moments m{5, {1.0}, {2.0}};
  const HealthCenter c = CenterWithout(GlobalMoments{5, {1.0}, {0.4}}, m, {0});
  EXPECT_EQ(c.count, 0);
  const RankScores s = ScoreRank(m, /*in_center=*/false, c, {0});
  EXPECT_TRUE(std::isnan(s.mean_shift));
  EXPECT_TRUE(std::isnan(s.variance_ratio));
}

// One channel, a center of 100 values with variance 4, a rank of 4 values
// with mean 3 away and variance 8: z^2 = 9 / (4 (1/4 +- 1/100)), the ratio
// 8 / 4 over 3 degrees of freedom, through Wilson-Hilferty (worked out
// apart from the code).
TEST(RankScoreTest, ScoresFollowTheDocumentedFormulas) {
  const HealthCenter center{100, 99, {0.0}, {4.0}};
  const Moments m{4, {3.0}, {24.0}};
  const RankScores out = ScoreRank(m, /*in_center=*/false, center, {0});
  EXPECT_NEAR(out.mean_shift, 2.7052963121744567, 1e-12);
  EXPECT_NEAR(out.variance_ratio, 1.2271764454522984, 1e-12);
  const RankScores in = ScoreRank(m, /*in_center=*/true, center, {0});
  EXPECT_NEAR(in.mean_shift, 2.823061355549719, 1e-12);
  EXPECT_NEAR(ScoreExcess(out), 2.7052963121744567, 1e-12);
  // A batch of one has no variance to compare.
  const RankScores one = ScoreRank(Moments{1, {3.0}, {0.0}},
                                   /*in_center=*/false, center, {0});
  EXPECT_FALSE(std::isnan(one.mean_shift));
  EXPECT_TRUE(std::isnan(one.variance_ratio));
}

TEST(RankScoreTest, AStuckChannelIsTheLowestOrTheOneTracked) {
  const Moments m{4, {1, 1, 1, 1}, {2.0, 0.0, 3.0, 0.0}};
  const std::vector<double> varies = {1, 1, 1, 1};
  EXPECT_EQ(StuckChannel(m, varies, -1), 1);
  EXPECT_EQ(StuckChannel(m, varies, 3), 3);
  EXPECT_EQ(StuckChannel(m, varies, 0), 1);  // 0 is not stuck
  // Where the whole group's channel is constant, it is not the rank's.
  EXPECT_EQ(StuckChannel(m, {1, 0, 1, 1}, -1), 3);
  EXPECT_EQ(StuckChannel(Moments{1, {1, 1, 1, 1}, {0, 0, 0, 0}}, varies, -1),
            -1);
}

}  // namespace
}  // namespace syncnorm
