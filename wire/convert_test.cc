#include "wire/convert.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"

namespace syncnorm {
namespace {

TEST(ConvertTest, MomentsRoundTrip) {
  const Moments m{12, {1.5, -2.25}, {0.5, 7}};
  v1::Moments p;
  ToProto(m, p);
  EXPECT_EQ(p.count(), 12);
  EXPECT_EQ(p.m2(1), 7);
  const Moments back = FromProto(p);
  EXPECT_EQ(back.count, m.count);
  EXPECT_EQ(back.mean, m.mean);
  EXPECT_EQ(back.m2, m.m2);
}

TEST(ConvertTest, GlobalMomentsAndGradSumsRoundTrip) {
  const GlobalMoments g{9, {0.25, -1}, {2, 3.5}};
  v1::GlobalMoments gp;
  ToProto(g, gp);
  const GlobalMoments g_back = FromProto(gp);
  EXPECT_EQ(g_back.count, 9);
  EXPECT_EQ(g_back.mean, g.mean);
  EXPECT_EQ(g_back.var, g.var);

  const GradSums s{{1, -0.0}, {3, 4}};
  v1::GradSums sp;
  ToProto(s, sp);
  const GradSums s_back = FromProto(sp);
  EXPECT_EQ(s_back.sum_dy, s.sum_dy);
  EXPECT_TRUE(std::signbit(s_back.sum_dy[1])) << "-0.0 is carried as is";
  EXPECT_EQ(s_back.sum_dy_xmu, s.sum_dy_xmu);
}

// A reused message holds the new values only.
TEST(ConvertTest, WritingIntoAUsedMessageReplacesItsValues) {
  v1::Moments p;
  ToProto(Moments{5, {1, 2, 3}, {4, 5, 6}}, p);
  ToProto(Moments{0, {0}, {0}}, p);
  EXPECT_EQ(p.count(), 0);
  EXPECT_EQ(p.mean_size(), 1);
  EXPECT_EQ(p.m2_size(), 1);
}

TEST(ConvertTest, RuleInALayerSpecLeavesTheOtherFields) {
  v1::LayerSpec spec;
  spec.set_name("bn");
  spec.set_num_features(3);
  RunningRule rule;
  rule.mode = MomentumMode::kCumulative;
  rule.momentum = 0.25;
  rule.biased_var = true;
  rule.track = false;
  ToProto(rule, spec);
  EXPECT_EQ(spec.name(), "bn");
  EXPECT_EQ(spec.num_features(), 3);
  EXPECT_EQ(spec.momentum_mode(), v1::MOMENTUM_CUMULATIVE);
  EXPECT_TRUE(spec.no_running_stats());
  const RunningRule back = RuleFromProto(spec);
  EXPECT_EQ(back.mode, MomentumMode::kCumulative);
  EXPECT_EQ(back.momentum, 0.25);
  EXPECT_TRUE(back.biased_var);
  EXPECT_FALSE(back.track);
}

TEST(ConvertTest, RuleIsReadAsSent) {
  const RunningRule rule = RuleFromProto(v1::LayerSpec());
  EXPECT_EQ(static_cast<int>(rule.mode), 0) << "no default is resolved";
  EXPECT_EQ(rule.momentum, 0);
  EXPECT_FALSE(rule.biased_var);
  EXPECT_TRUE(rule.track);
}

TEST(ConvertTest, RunningStatsInLayerStatsAndImportedStats) {
  const RunningStats s{4, {0.5, -3}, {2, 0.25}};
  v1::LayerStats l;
  l.set_layer(2);
  l.set_name("bn2");
  l.set_group(1);
  ToProto(s, l);
  EXPECT_EQ(l.layer(), 2);
  EXPECT_EQ(l.name(), "bn2");
  EXPECT_EQ(l.group(), 1);
  const RunningStats from_layer = FromProto(l);
  EXPECT_EQ(from_layer.num_batches_tracked, 4);
  EXPECT_EQ(from_layer.mean, s.mean);
  EXPECT_EQ(from_layer.var, s.var);

  v1::ImportedStats i;
  ToProto(s, i);
  const RunningStats from_import = FromProto(i);
  EXPECT_EQ(from_import.num_batches_tracked, 4);
  EXPECT_EQ(from_import.mean, s.mean);
  EXPECT_EQ(from_import.var, s.var);
}

TEST(ConvertTest, RoundUpdateSetsAndClearsItsFields) {
  RoundUpdate u;
  u.momentum = RoundMomentum{MomentumMode::kDecay, 0.75};
  u.imported = RunningStats{7, {1}, {2}};
  v1::Contribution c;
  ToProto(u, c);
  ASSERT_TRUE(c.has_momentum());
  EXPECT_EQ(c.momentum().momentum_mode(), v1::MOMENTUM_DECAY);
  ASSERT_TRUE(c.has_imported_stats());
  EXPECT_EQ(c.imported_stats().num_batches_tracked(), 7);
  const RoundUpdate back = RoundUpdateFromProto(c);
  EXPECT_TRUE(SameUpdate(back, u));

  ToProto(RoundUpdate{}, c);
  EXPECT_FALSE(c.has_momentum());
  EXPECT_FALSE(c.has_imported_stats());
  EXPECT_TRUE(RoundUpdateFromProto(c).empty());
}

}  // namespace
}  // namespace syncnorm
