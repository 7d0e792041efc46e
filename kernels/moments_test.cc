#include "kernels/moments.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm {
namespace {

// The float64 reference's two-pass moments of values per channel, as an
// (N, C) tensor. REQUIRES: every channel has N values.
Moments Reference(const std::vector<std::vector<double>>& per_channel) {
  const int64_t channels = static_cast<int64_t>(per_channel.size());
  const int64_t n = static_cast<int64_t>(per_channel[0].size());
  const reference::Layout l{{n, channels}, false};
  std::vector<double> x(l.size());
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < n; ++i) x[l.At(i, c, 0)] = per_channel[c][i];
  }
  const reference::Stats s = reference::Moments(l, x);
  Moments m = Moments::Zero(static_cast<int>(channels));
  m.count = s.count;
  for (int64_t c = 0; c < channels; ++c) {
    m.mean[c] = static_cast<double>(s.mean[c]);
    m.m2[c] = static_cast<double>(s.m2[c]);
  }
  return m;
}

Moments Welford(const std::vector<std::vector<double>>& per_channel) {
  Moments m = Moments::Zero(static_cast<int>(per_channel.size()));
  for (size_t c = 0; c < per_channel.size(); ++c) {
    double n = 0;
    for (double x : per_channel[c]) WelfordAdd(n, m.mean[c], m.m2[c], x);
    m.count = static_cast<int64_t>(n);
  }
  return m;
}

TEST(MomentsTest, ChanMergeOfUnevenPartsMatchesTwoPassReference) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> dist(1e4, 3.0);  // |mean| >> std
  const int channels = 5;
  const std::vector<int> sizes = {17, 0, 1, 250, 3};
  std::vector<std::vector<double>> all(channels);
  Moments acc = Moments::Zero(channels);
  for (int size : sizes) {
    std::vector<std::vector<double>> part(channels);
    for (int c = 0; c < channels; ++c) {
      for (int i = 0; i < size; ++i) part[c].push_back(dist(rng) * (c + 1));
      all[c].insert(all[c].end(), part[c].begin(), part[c].end());
    }
    Moments local = Welford(part);
    ASSERT_TRUE(ValidateMoments(local, channels).ok());
    MergeMoments(acc, local);
  }
  const Moments ref = Reference(all);
  EXPECT_EQ(acc.count, ref.count);
  for (int c = 0; c < channels; ++c) {
    EXPECT_NEAR(acc.mean[c], ref.mean[c], 1e-12 * std::abs(ref.mean[c]));
    EXPECT_NEAR(acc.m2[c], ref.m2[c], 1e-9 * ref.m2[c]);
  }
  GlobalMoments g = Finalize(acc);
  for (int c = 0; c < channels; ++c) {
    EXPECT_NEAR(g.var[c], ref.m2[c] / ref.count, 1e-9 * g.var[c]);
  }
}

// MergeMoments is the pinned formula, ChanMerge, applied to each channel on
// its own, bit for bit: for any channel count (odd ones leave a channel to
// the scalar tail), empty sides, and values over the whole exponent range.
TEST(MomentsTest, MergeMomentsIsChanMergeOfEveryChannelBitForBit) {
  std::mt19937_64 rng(11);
  auto value = [&rng]() {
    const double mantissa =
        std::uniform_real_distribution<double>(-1.0, 1.0)(rng);
    return std::ldexp(mantissa, static_cast<int>(rng() % 120) - 60);
  };
  const int64_t counts[] = {0, 1, 3, 1000, int64_t{1} << 40};
  for (int channels = 0; channels <= 9; ++channels) {
    for (int64_t count_a : counts) {
      for (int64_t count_b : counts) {
        Moments a = Moments::Zero(channels), b = Moments::Zero(channels);
        a.count = count_a;
        b.count = count_b;
        for (int c = 0; c < channels; ++c) {
          a.mean[c] = value();
          b.mean[c] = value();
          a.m2[c] = std::fabs(value());
          b.m2[c] = std::fabs(value());
        }
        Moments expected = a;
        for (int c = 0; c < channels; ++c) {
          double n = static_cast<double>(count_a);
          ChanMerge(n, expected.mean[c], expected.m2[c],
                    static_cast<double>(count_b), b.mean[c], b.m2[c]);
        }
        MergeMoments(a, b);
        const std::string where = absl::StrCat(channels, " channels, counts ",
                                               count_a, " and ", count_b);
        EXPECT_EQ(a.count, count_a + count_b) << where;
        for (int c = 0; c < channels; ++c) {
          EXPECT_EQ(std::memcmp(&a.mean[c], &expected.mean[c], 8), 0)
              << where << ": mean[" << c << "] " << a.mean[c] << " vs "
              << expected.mean[c];
          EXPECT_EQ(std::memcmp(&a.m2[c], &expected.m2[c], 8), 0)
              << where << ": m2[" << c << "] " << a.m2[c] << " vs "
              << expected.m2[c];
        }
      }
    }
  }
}

TEST(MomentsTest, FinalizeOfTemporaryMatchesFinalizeOfCopy) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> dist(-3.0, 2.0);
  std::vector<std::vector<double>> per_channel(4);
  for (auto& values : per_channel) {
    for (int i = 0; i < 9; ++i) values.push_back(dist(rng));
  }
  const Moments m = Welford(per_channel);
  const GlobalMoments copied = Finalize(m);
  const GlobalMoments moved = Finalize(Moments(m));
  EXPECT_EQ(moved.count, copied.count);
  EXPECT_EQ(moved.mean, copied.mean);  // bit for bit
  EXPECT_EQ(moved.var, copied.var);
  const GlobalMoments empty = Finalize(Moments::Zero(2));
  EXPECT_EQ(empty.var, std::vector<double>(2, 0.0));
}

TEST(MomentsTest, EmptyContributionIsNeutral) {
  Moments a = Moments::Zero(2);
  a.count = 3;
  a.mean = {1.5, -2.0};
  a.m2 = {4.0, 0.5};
  Moments before = a;
  MergeMoments(a, Moments::Zero(2));
  EXPECT_EQ(a.count, before.count);
  EXPECT_EQ(a.mean, before.mean);
  EXPECT_EQ(a.m2, before.m2);
  Moments empty = Moments::Zero(2);
  MergeMoments(empty, before);
  EXPECT_EQ(empty.mean, before.mean);
  EXPECT_EQ(empty.m2, before.m2);
}

TEST(MomentsTest, ValidateRejectsEachMalformedField) {
  Moments good = Moments::Zero(2);
  good.count = 2;
  good.mean = {0.0, 1.0};
  good.m2 = {1.0, 2.0};
  EXPECT_TRUE(ValidateMoments(good, 2).ok());
  EXPECT_EQ(ValidateMoments(good, 3).code(),
            absl::StatusCode::kInvalidArgument);
  Moments bad = good;
  bad.count = -1;
  EXPECT_EQ(ValidateMoments(bad, 2).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.m2[1] = -0.5;
  EXPECT_EQ(ValidateMoments(bad, 2).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.mean[0] = std::nan("");
  EXPECT_EQ(ValidateMoments(bad, 2).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.m2[0] = INFINITY;
  EXPECT_EQ(ValidateMoments(bad, 2).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.count = 0;
  EXPECT_EQ(ValidateMoments(bad, 2).code(), absl::StatusCode::kInvalidArgument);
  GradSums gs{{1.0, 2.0}, {3.0, NAN}};
  EXPECT_EQ(ValidateGradSums(gs, 2).code(), absl::StatusCode::kInvalidArgument);
  gs.sum_dy_xmu[1] = 0;
  EXPECT_TRUE(ValidateGradSums(gs, 2).ok());
  EXPECT_FALSE(ValidateGradSums(gs, 1).ok());
}

// Running statistics after each rule, against the formulas written out.
// The first channel a plain loop finds bad (std::isfinite, and m2 < 0 when
// `m2`), or -1.
int FirstBad(const std::vector<double>& v, bool m2) {
  for (size_t c = 0; c < v.size(); ++c) {
    if (!std::isfinite(v[c]) || (m2 && v[c] < 0)) return static_cast<int>(c);
  }
  return -1;
}

TEST(MomentsTest, EveryBadValueIsFoundWhereverItIs) {
  // Every position of layers whose sizes end on each step of the checks'
  // four-value loop, every kind of bad value, in each checked vector.
  const double kBad[] = {NAN, -NAN, INFINITY, -INFINITY, -1e-300, -1.0};
  const double kFine[] = {0.0, -0.0, 5e-324, 1.7976931348623157e308, 1e-300};
  for (int channels = 1; channels <= 11; ++channels) {
    for (int c = 0; c < channels; ++c) {
      for (double bad : kBad) {
        for (int field = 0; field < 2; ++field) {
          Moments m;
          m.count = 3;
          m.mean.assign(channels, 0.25);
          m.m2.assign(channels, 2.0);
          (field == 0 ? m.mean : m.m2)[c] = bad;
          const bool any_bad =
              FirstBad(m.mean, false) >= 0 || FirstBad(m.m2, true) >= 0;
          const absl::Status s = ValidateMoments(m, channels);
          EXPECT_EQ(s.ok(), !any_bad)
              << channels << " channels, " << bad << " at " << c << " of "
              << (field == 0 ? "mean" : "m2") << ": " << s;
          if (!s.ok()) {
            EXPECT_NE(s.message().find(absl::StrCat("[", c, "]")),
                      std::string::npos)
                << s;
          }
          GradSums g{m.mean, m.m2};
          EXPECT_EQ(ValidateGradSums(g, channels).ok(),
                    FirstBad(g.sum_dy, false) < 0 &&
                        FirstBad(g.sum_dy_xmu, false) < 0);
          GlobalMoments global{3, m.mean, m.m2};
          EXPECT_EQ(CheckFiniteResult(global).ok(),
                    FirstBad(global.mean, false) < 0 &&
                        FirstBad(global.var, false) < 0);
          EXPECT_EQ(CheckFiniteResult(RunningStats{1, m.mean, m.m2}).ok(),
                    FirstBad(m.mean, false) < 0 && FirstBad(m.m2, false) < 0);
        }
      }
      for (double fine : kFine) {
        Moments m;
        m.count = 3;
        m.mean.assign(channels, -fine);
        m.m2.assign(channels, 1.0);
        m.m2[c] = fine;
        EXPECT_TRUE(ValidateMoments(m, channels).ok())
            << fine << " at " << c << " of " << channels;
      }
    }
  }
}

TEST(MomentsTest, RunningUpdateFollowsEachConvention) {
  Moments merged = Moments::Zero(1);
  merged.count = 4;
  merged.mean = {2.0};
  merged.m2 = {12.0};  // biased var 3, unbiased var 4
  struct Case {
    RunningRule rule;
    double mean, var;
  };
  const Case cases[] = {
      {{MomentumMode::kTorch, 0.1, false, true}, 0.2, 0.9 * 1 + 0.1 * 4},
      {{MomentumMode::kTorch, 0.1, true, true}, 0.2, 0.9 * 1 + 0.1 * 3},
      {{MomentumMode::kDecay, 0.9, false, true}, 0.2, 0.9 * 1 + 0.1 * 4},
      {{MomentumMode::kDecay, 0.75, true, true}, 0.5, 0.75 + 0.25 * 3},
      {{MomentumMode::kCumulative, 0, false, true}, 2.0, 4.0},
  };
  for (const Case& c : cases) {
    RunningStats s = RunningStats::Initial(1);
    ASSERT_TRUE(CheckUpdatable(c.rule, merged.count).ok());
    ApplyRound(c.rule, merged, s);
    EXPECT_EQ(s.num_batches_tracked, 1);
    EXPECT_DOUBLE_EQ(s.mean[0], c.mean);
    EXPECT_DOUBLE_EQ(s.var[0], c.var);
  }
  // Cumulative is the plain average of the batch values.
  RunningRule cumulative{MomentumMode::kCumulative, 0, false, true};
  RunningStats s = RunningStats::Initial(1);
  ApplyRound(cumulative, merged, s);
  merged.mean = {5.0};
  ApplyRound(cumulative, merged, s);
  EXPECT_DOUBLE_EQ(s.mean[0], 3.5);
  EXPECT_EQ(s.num_batches_tracked, 2);
}

TEST(MomentsTest, GlobalCountOneWithUnbiasedVarIsRejected) {
  RunningRule unbiased{MomentumMode::kTorch, 0.1, false, true};
  EXPECT_EQ(CheckUpdatable(unbiased, 1).code(),
            absl::StatusCode::kFailedPrecondition);
  RunningRule biased{MomentumMode::kTorch, 0.1, true, true};
  EXPECT_TRUE(CheckUpdatable(biased, 1).ok());
  RunningRule untracked{MomentumMode::kTorch, 0.1, false, false};
  EXPECT_TRUE(CheckUpdatable(untracked, 1).ok());
}

TEST(MomentsTest, EmptyGlobalBatchLeavesStatsUntouched) {
  RunningRule rule;
  RunningStats s = RunningStats::Initial(2);
  ApplyRound(rule, Moments::Zero(2), s);
  EXPECT_EQ(s.num_batches_tracked, 0);
  EXPECT_EQ(s.mean, std::vector<double>({0.0, 0.0}));
  EXPECT_EQ(s.var, std::vector<double>({1.0, 1.0}));
}

// Counts fold only while their sum fits int64 (it used to wrap negative).
TEST(MomentsTest, CountsThatSumPastInt64MaxAreNotMergeable) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Moments a = Moments::Zero(1), b = Moments::Zero(1);
  a.count = kMax - 1;
  b.count = 1;
  EXPECT_TRUE(CheckMergeable(a, b).ok());
  a.count = kMax;
  EXPECT_EQ(CheckMergeable(a, b).code(), absl::StatusCode::kInvalidArgument);
  a.count = b.count = int64_t{1} << 62;
  const absl::Status s = CheckMergeable(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4611686018427387904 + 4611686018427387904 sum "
                             "past 2^63-1"),
            absl::string_view::npos)
      << s;
}

// Finite moments whose Chan merge overflows are caught in the result.
TEST(MomentsTest, ResultsThatOverflowAreNotFinite) {
  Moments a = Moments::Zero(2), b = Moments::Zero(2);
  a.count = b.count = 2;
  a.mean = {1e308, 1};
  b.mean = {-1e308, 1};
  a.m2 = b.m2 = {1e308, 1};
  ASSERT_TRUE(ValidateMoments(a, 2).ok());
  ASSERT_TRUE(ValidateMoments(b, 2).ok());
  MergeMoments(a, b);
  absl::Status s = CheckFiniteResult(Finalize(a));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mean[0] is -inf"), absl::string_view::npos) << s;
  GradSums g{{1, 1e308}, {0, 0}};
  AddGradSums(g, g);
  s = CheckFiniteResult(g);
  EXPECT_NE(s.message().find("sum_dy[1] is inf"), absl::string_view::npos) << s;
  RunningStats r = RunningStats::Initial(1);
  r.mean = {-1e308};
  r.num_batches_tracked = 1;
  RunningRule cumulative{MomentumMode::kCumulative, 0.1, false, true};
  GlobalMoments far{2, {1e308}, {0}};
  ASSERT_TRUE(CheckFiniteResult(far).ok());
  ApplyRound(cumulative, far, r);
  s = CheckFiniteResult(r);
  EXPECT_NE(s.message().find("running_mean[0] is inf"), absl::string_view::npos)
      << s;
}

TEST(MomentsTest, NoRoundCountsABatchPastTheVersionBound) {
  RunningRule rule;
  RunningStats s = RunningStats::Initial(1);
  s.num_batches_tracked = kMaxNumBatchesTracked - 1;
  EXPECT_TRUE(CheckUpdatable(rule, 4, s).ok());
  s.num_batches_tracked = kMaxNumBatchesTracked;
  EXPECT_EQ(CheckUpdatable(rule, 4, s).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckUpdatable(rule, 0, s).ok()) << "an empty batch counts none";
  RunningRule untracked{MomentumMode::kTorch, 0.1, false, false};
  EXPECT_TRUE(CheckUpdatable(untracked, 4, s).ok());
}

}  // namespace
}  // namespace syncnorm
