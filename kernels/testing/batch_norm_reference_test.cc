// The reference against values worked out by hand.
#include "kernels/testing/batch_norm_reference.h"

#include <vector>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "kernels/batch_norm_types.h"
#include "kernels/formulas.h"
#include "kernels/testing/expect_close.h"

namespace syncnorm::reference {
namespace {

TEST(LayoutTest, IndexMathOfBothLayouts) {
  const Layout first{{2, 3, 4, 5}, false};
  EXPECT_EQ(first.c(), 3);
  EXPECT_EQ(first.spatial(), 20);
  EXPECT_EQ(first.At(1, 2, 7), (1 * 3 + 2) * 20 + 7);
  const Layout last{{2, 4, 5, 3}, true};
  EXPECT_EQ(last.c(), 3);
  EXPECT_EQ(last.At(1, 2, 7), (1 * 20 + 7) * 3 + 2);
  const Layout two_d{{6, 3}, true};  // (N, C) either way
  EXPECT_EQ(two_d.c(), 3);
  EXPECT_EQ(two_d.At(4, 1, 0), 13);
  EXPECT_EQ(last.geometry().outer, 40);
  EXPECT_EQ(last.geometry().inner, 1);
  EXPECT_EQ(first.geometry().outer, 2);
  EXPECT_EQ(first.geometry().inner, 20);
  EXPECT_EQ(first.Name(), "2x3x4x5_first");
}

// x of shape (2, 2, 1): channel 0 holds 1 and 3, channel 1 holds 2 and 6.
const Layout kL{{2, 2, 1}, false};
const std::vector<float> kX = {1, 2, 3, 6};

TEST(ReferenceTest, MomentsOverOneTensorAndOverShards) {
  const Stats s = Moments(kL, kX);
  EXPECT_EQ(s.count, 2);
  EXPECT_EQ(s.mean, (Reals{2, 4}));
  EXPECT_EQ(s.m2, (Reals{2, 8}));
  EXPECT_EQ(s.Var(), (Reals{1, 4}));
  // The same batch as two shards of one item each, and an empty shard.
  const Layout one{{1, 2, 1}, false}, none{{0, 2, 1}, false};
  const std::vector<float> a = {1, 2}, b = {3, 6}, empty;
  const Stats shards = Moments<float>(2, {one, none, one}, {&a, &empty, &b});
  EXPECT_EQ(shards.count, 2);
  EXPECT_EQ(shards.mean, s.mean);
  EXPECT_EQ(shards.m2, s.m2);
  EXPECT_EQ(Moments<float>(2, {none}, {&empty}).Var(), (Reals{0, 0}));
}

TEST(ReferenceTest, ForwardBackwardSumsAndGradInput) {
  const Stats s = Moments(kL, kX);
  const Normalization n = Normalize(s.mean, s.Var(), 0.0, {2, 1}, {0.5, -1});
  EXPECT_EQ(n.invstd, (Reals{1, 0.5}));
  // (x - mean) * invstd * weight + bias, + z, ReLU.
  const std::vector<float> z = {0, 0, 1, 1};
  EXPECT_EQ(Forward(kL, kX, n, &z, false), (Reals{-1.5, -2, 3.5, 1}));
  EXPECT_EQ(Forward(kL, kX, n, &z, true), (Reals{0, 0, 3.5, 1}));

  const std::vector<float> dy = {1, 2, 3, 4};
  const Reals y = {-1, 1, 1, 1};  // masks the first element
  const GradSumsRef g = BackwardSums(kL, dy, kX, &y, n.mean);
  EXPECT_EQ(g.sum_dy, (Reals{3, 6}));
  EXPECT_EQ(g.sum_dy_xmu, (Reals{3, 4}));  // 3 * 1; 2 * -2 + 4 * 2
  EXPECT_EQ(g.abs_dy_xmu, (Reals{3, 12}));
  const std::vector<float>* no_mask = nullptr;
  EXPECT_EQ(BackwardSums(kL, dy, kX, no_mask, n.mean).sum_dy, (Reals{4, 6}));

  // weight * invstd * (dy' - mean_dy - xmu * invstd^2 * mean_dy_xmu).
  const Reals gi = GradInput(kL, dy, kX, &y, n, {1.5, 3}, {1.5, 2});
  EXPECT_EQ(gi, (Reals{2 * (0 - 1.5 + 1.5), 0.5 * (2 - 3 + 2 * 0.25 * 2),
                       2 * (3 - 1.5 - 1.5), 0.5 * (4 - 3 - 2 * 0.25 * 2)}));
  EXPECT_EQ(MaskedDy(dy, &y, 0), 0);
  EXPECT_EQ(MaskedDy(dy, &y, 1), 2);
}

TEST(ReferenceTest, RunningStatisticsByEachRule) {
  const Stats s = Moments(kL, kX);  // mean {2, 4}, var {1, 4}, n = 2
  Running torch{0, {0, 0}, {1, 1}};
  UpdateRunning(MomentumMode::kTorch, 0.5, false, s, torch);
  EXPECT_EQ(torch.num_batches_tracked, 1);
  EXPECT_EQ(torch.mean, (Reals{1, 2}));
  EXPECT_EQ(torch.var, (Reals{1.5, 4.5}));  // unbiased {2, 8}
  Running decay{0, {0, 0}, {1, 1}};
  UpdateRunning(MomentumMode::kDecay, 0.75, true, s, decay);
  EXPECT_EQ(decay.mean, (Reals{0.5, 1}));
  EXPECT_EQ(decay.var, (Reals{1, 1.75}));
  Running cumulative{1, {0, 0}, {1, 1}};
  UpdateRunning(MomentumMode::kCumulative, 0, true, s, cumulative);
  EXPECT_EQ(cumulative.num_batches_tracked, 2);
  EXPECT_EQ(cumulative.mean, (Reals{1, 2}));
  EXPECT_EQ(cumulative.var, (Reals{1, 2.5}));
  const Running before = cumulative;
  UpdateRunning(MomentumMode::kCumulative, 0, true, Stats{0, {0, 0}, {0, 0}},
                cumulative);
  EXPECT_EQ(cumulative.num_batches_tracked, before.num_batches_tracked);
  EXPECT_EQ(cumulative.mean, before.mean);
}

TEST(ExpectCloseTest, RelativeToTheLargestReferenceValueAndNaNFails) {
  ExpectClose(std::vector<float>{1.0f, 100.001f}, Reals{1, 100}, 1e-5, "ok");
  EXPECT_NONFATAL_FAILURE(
      ExpectClose(std::vector<float>{1.0f, 100.01f}, Reals{1, 100}, 1e-5, "x"),
      "x[1] = ");
  EXPECT_NONFATAL_FAILURE(
      ExpectClose(std::vector<double>{NAN}, Reals{0}, 1, "unwritten"),
      "unwritten[0]");
}

}  // namespace
}  // namespace syncnorm::reference
