#include "kernels/round_update.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

GlobalMoments Batch() {
  GlobalMoments g;
  g.count = 4;
  g.mean = {2.5, -1.25};
  g.var = {0.75, 3.0};  // biased
  return g;
}

RunningStats Stats(int64_t n, std::vector<double> mean,
                   std::vector<double> var) {
  RunningStats s;
  s.num_batches_tracked = n;
  s.mean = std::move(mean);
  s.var = std::move(var);
  return s;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, 8) == 0; }

TEST(RoundUpdateTest, EmptyUpdateIsTheLayersRule) {
  RunningRule rule;  // torch, 0.1
  RunningStats a = Stats(3, {1, 2}, {3, 4});
  RunningStats b = a;
  ApplyRound(rule, RoundUpdate{}, Batch(), a);
  ApplyRound(rule, Batch(), b);
  EXPECT_EQ(a.num_batches_tracked, 4);
  for (int c = 0; c < 2; ++c) {
    EXPECT_TRUE(SameBits(a.mean[c], b.mean[c]));
    EXPECT_TRUE(SameBits(a.var[c], b.var[c]));
  }
}

TEST(RoundUpdateTest, MomentumOfTheRoundReplacesTheLayers) {
  RunningRule rule;  // torch, 0.1
  RoundUpdate update;
  update.momentum = RoundMomentum{MomentumMode::kTorch, 1.0};
  RunningStats s = Stats(0, {7, 7}, {7, 7});
  ApplyRound(rule, update, Batch(), s);
  // Momentum 1: the running statistics become the batch's, var unbiased.
  EXPECT_DOUBLE_EQ(s.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(s.mean[1], -1.25);
  EXPECT_DOUBLE_EQ(s.var[0], 0.75 * 4 / 3);
  EXPECT_DOUBLE_EQ(s.var[1], 3.0 * 4 / 3);
  EXPECT_EQ(s.num_batches_tracked, 1);
}

TEST(RoundUpdateTest, ImportThenCumulativeAverageAsTorchUpdateBn) {
  // torch.optim.swa_utils.update_bn: buffers reset to zeros / ones and
  // num_batches_tracked 0, momentum None: after one batch, the batch's.
  RunningRule rule;
  RoundUpdate update;
  update.imported = Stats(0, {0, 0}, {1, 1});
  update.momentum = RoundMomentum{MomentumMode::kCumulative, 0.0};
  RunningStats s = Stats(9, {5, 5}, {5, 5});
  ApplyRound(rule, update, Batch(), s);
  EXPECT_EQ(s.num_batches_tracked, 1);
  EXPECT_DOUBLE_EQ(s.mean[0], 2.5);
  EXPECT_NEAR(s.var[1], 4.0, 1e-15);
  // A second batch averages the two.
  GlobalMoments second = Batch();
  second.mean = {0.5, 0.75};
  update.imported.reset();
  ApplyRound(rule, update, second, s);
  EXPECT_EQ(s.num_batches_tracked, 2);
  EXPECT_DOUBLE_EQ(s.mean[0], 1.5);
  EXPECT_DOUBLE_EQ(s.mean[1], -0.25);
}

TEST(RoundUpdateTest, AnImportAloneStaysWhenTheBatchIsEmpty) {
  RoundUpdate update;
  update.imported = Stats(6, {1, 2}, {3, 4});
  RunningStats s = Stats(1, {0, 0}, {1, 1});
  GlobalMoments empty = Batch();
  empty.count = 0;
  ApplyRound(RunningRule{}, update, empty, s);
  EXPECT_EQ(s.num_batches_tracked, 6);
  EXPECT_EQ(s.mean, (std::vector<double>{1, 2}));
}

TEST(RoundUpdateTest, SameMomentumMeansTheSameBits) {
  const RoundMomentum torch0{MomentumMode::kTorch, 0.0};
  const RoundMomentum decay1{MomentumMode::kDecay, 1.0};
  const RoundMomentum decay0{MomentumMode::kDecay, 0.0};
  const RoundMomentum torch1{MomentumMode::kTorch, 1.0};
  EXPECT_TRUE(SameMomentum(torch0, decay1));
  EXPECT_TRUE(SameMomentum(decay0, torch1));
  EXPECT_TRUE(SameMomentum({MomentumMode::kCumulative, 0.1},
                           {MomentumMode::kCumulative, 0.9}));
  EXPECT_FALSE(SameMomentum(torch0, torch1));
  EXPECT_FALSE(
      SameMomentum({MomentumMode::kTorch, 0.1}, {MomentumMode::kDecay, 0.9}));
  // Those called the same do the same, bit for bit.
  for (const auto& [a, b] :
       {std::make_pair(torch0, decay1), std::make_pair(decay0, torch1)}) {
    RunningStats x = Stats(2, {0.3, -7}, {1.7, 0.2});
    RunningStats y = x;
    RoundUpdate ua, ub;
    ua.momentum = a;
    ub.momentum = b;
    ApplyRound(RunningRule{}, ua, Batch(), x);
    ApplyRound(RunningRule{}, ub, Batch(), y);
    for (int c = 0; c < 2; ++c) {
      EXPECT_TRUE(SameBits(x.mean[c], y.mean[c]));
      EXPECT_TRUE(SameBits(x.var[c], y.var[c]));
    }
  }
}

TEST(RoundUpdateTest, SameUpdateComparesImportsBitForBit) {
  RoundUpdate a, b;
  EXPECT_TRUE(SameUpdate(a, b));
  a.imported = Stats(0, {0.0}, {1.0});
  EXPECT_FALSE(SameUpdate(a, b));
  b.imported = Stats(0, {-0.0}, {1.0});
  EXPECT_FALSE(SameUpdate(a, b));
  b.imported->mean[0] = 0.0;
  EXPECT_TRUE(SameUpdate(a, b));
  b.imported->num_batches_tracked = 1;
  EXPECT_FALSE(SameUpdate(a, b));
}

TEST(RoundUpdateTest, ValidationSaysWhatToFix) {
  RunningRule rule;
  RoundUpdate u;
  u.momentum = RoundMomentum{MomentumMode::kTorch, 1.5};
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).message(),
            "momentum.momentum is 1.5; it must be within [0, 1]");
  u.momentum = RoundMomentum{static_cast<MomentumMode>(7), 0.5};
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).code(),
            absl::StatusCode::kInvalidArgument);
  u.momentum.reset();
  u.imported = Stats(0, {1, 2, 3}, {1, 1});
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).message(),
            "imported_stats.running_mean has 3 values but the layer has 2 "
            "channels");
  u.imported = Stats(0, {1, 2}, {1, -1});
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).message(),
            "imported_stats.running_var[1] is -1; it must be finite and >= 0");
  u.imported = Stats(-1, {1, 2}, {1, 1});
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).code(),
            absl::StatusCode::kInvalidArgument);
  u.imported = Stats(0, {1, 2}, {1, 1});
  EXPECT_TRUE(ValidateRoundUpdate(u, rule, 2).ok());
  rule.track = false;
  EXPECT_EQ(ValidateRoundUpdate(u, rule, 2).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateRoundUpdate(RoundUpdate{}, rule, 2).ok());
}

}  // namespace
}  // namespace syncnorm
