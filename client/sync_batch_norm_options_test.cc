#include "client/sync_batch_norm_options.h"

#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/layer_rule.h"
#include "client/layer_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/formulas.h"
#include "kernels/moments.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<double> RandomValues(int n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// The rule the aggregator reads from a wire spec: momentum 0 means the mode's
// default (0.1 torch, 0.9 decay), as documented in aggregator.proto.
RunningRule WireRule(const v1::LayerSpec& spec) {
  RunningRule rule;
  rule.mode = spec.momentum_mode() == v1::MOMENTUM_MODE_UNSPECIFIED
                  ? MomentumMode::kTorch
                  : static_cast<MomentumMode>(spec.momentum_mode());
  rule.momentum = spec.momentum() == 0
                      ? (rule.mode == MomentumMode::kDecay ? 0.9 : 0.1)
                      : spec.momentum();
  rule.biased_var = spec.biased_running_var();
  rule.track = !spec.no_running_stats();
  return rule;
}

TEST(ToLayerSpecTest, DefaultsAreTorchsWithResolvedMomentum) {
  SyncBatchNormOptions options;
  options.num_features = 7;
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "layer1.bn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "layer1.bn");
  EXPECT_EQ(spec->num_features(), 7);
  EXPECT_EQ(spec->momentum_mode(), v1::MOMENTUM_TORCH);
  EXPECT_EQ(spec->momentum(), 0.1);
  EXPECT_FALSE(spec->biased_running_var());
  EXPECT_FALSE(spec->no_running_stats());
  EXPECT_EQ(spec->initial_running_mean_size(), 0);
  EXPECT_EQ(spec->initial_running_var_size(), 0);
}

TEST(ToLayerSpecTest, DecayDefaultsToPointNine) {
  SyncBatchNormOptions options;
  options.num_features = 3;
  options.momentum_mode = MomentumMode::kDecay;
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "bn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->momentum_mode(), v1::MOMENTUM_DECAY);
  EXPECT_EQ(spec->momentum(), 0.9);
}

TEST(ToLayerSpecTest, MapsEveryOption) {
  struct Case {
    MomentumMode mode;
    double momentum;
    v1::MomentumMode wire_mode;
  };
  const Case cases[] = {
      {MomentumMode::kTorch, 0.37, v1::MOMENTUM_TORCH},
      {MomentumMode::kDecay, 0.61, v1::MOMENTUM_DECAY},
      {MomentumMode::kCumulative, 0.25, v1::MOMENTUM_CUMULATIVE},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) {
    for (bool biased : {false, true}) {
      for (bool track : {false, true}) {
        SyncBatchNormOptions options;
        options.num_features = 5;
        options.momentum_mode = c.mode;
        options.momentum = c.momentum;
        options.biased_running_var = biased;
        options.track_running_stats = track;
        options.initial_running_mean = RandomValues(5, ++seed, -3, 3);
        options.initial_running_var = RandomValues(5, ++seed, 0.5, 4);
        absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "x");
        ASSERT_TRUE(spec.ok()) << spec.status();
        SCOPED_TRACE(testing::Message()
                     << "mode " << static_cast<int>(c.mode) << " biased "
                     << biased << " track " << track);
        EXPECT_EQ(spec->num_features(), 5);
        EXPECT_EQ(spec->momentum_mode(), c.wire_mode);
        EXPECT_EQ(spec->momentum(), c.momentum);
        EXPECT_EQ(spec->biased_running_var(), biased);
        EXPECT_EQ(spec->no_running_stats(), !track);
        EXPECT_THAT(spec->initial_running_mean(),
                    ElementsAreArray(options.initial_running_mean));
        EXPECT_THAT(spec->initial_running_var(),
                    ElementsAreArray(options.initial_running_var));
      }
    }
  }
}

TEST(ToLayerSpecTest, ChannelsComeFromOptionsElseTheArgument) {
  SyncBatchNormOptions options;
  options.num_features = 0;
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "inferred", 12);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_features(), 12);

  options.num_features = 4;
  spec = ToLayerSpec(options, "given", 12);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_features(), 4);
}

TEST(ToLayerSpecTest, UnknownChannelCountIsInvalidArgument) {
  SyncBatchNormOptions options;
  options.num_features = 0;
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "stem.bn");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("stem.bn"));
  EXPECT_EQ(ToLayerSpec(options, "stem.bn", -3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Applies a few rounds of random global statistics under `rule`.
RunningStats ApplyRandomRounds(const RunningRule& rule, RunningStats stats,
                               uint64_t seed) {
  const int channels = static_cast<int>(stats.mean.size());
  for (int round = 0; round < 4; ++round) {
    GlobalMoments g;
    g.count = 10 + round;
    g.mean = RandomValues(channels, seed + 2 * round, -5, 5);
    g.var = RandomValues(channels, seed + 2 * round + 1, 0.1, 9);
    ApplyRound(rule, g, stats);
  }
  return stats;
}

TEST(ToLayerSpecTest, TorchMomentumZeroBecomesDecayOneAndFreezesStats) {
  SyncBatchNormOptions options;
  options.num_features = 6;
  options.momentum_mode = MomentumMode::kTorch;
  options.momentum = 0;
  options.initial_running_mean = RandomValues(6, 21, -2, 2);
  options.initial_running_var = RandomValues(6, 22, 0.5, 3);
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "bn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->momentum_mode(), v1::MOMENTUM_DECAY);
  EXPECT_EQ(spec->momentum(), 1.0);

  RunningStats initial;
  initial.mean = options.initial_running_mean;
  initial.var = options.initial_running_var;
  // Both the aggregator's reading of the spec and the layer's local mirror
  // keep the statistics exactly where they started.
  for (const RunningRule& rule : {WireRule(*spec), RuleOf(options)}) {
    const RunningStats after = ApplyRandomRounds(rule, initial, 23);
    EXPECT_EQ(after.mean, initial.mean);
    EXPECT_EQ(after.var, initial.var);
    EXPECT_EQ(after.num_batches_tracked, 4);
  }
}

TEST(ToLayerSpecTest, DecayMomentumZeroBecomesTorchOneAndTakesTheBatch) {
  SyncBatchNormOptions options;
  options.num_features = 3;
  options.momentum_mode = MomentumMode::kDecay;
  options.momentum = 0;
  options.biased_running_var = true;
  absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "bn");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->momentum_mode(), v1::MOMENTUM_TORCH);
  EXPECT_EQ(spec->momentum(), 1.0);

  GlobalMoments g;
  g.count = 9;
  g.mean = RandomValues(3, 31, -5, 5);
  g.var = RandomValues(3, 32, 0.1, 9);
  for (const RunningRule& rule : {WireRule(*spec), RuleOf(options)}) {
    RunningStats stats = RunningStats::Initial(3);
    ApplyRound(rule, g, stats);
    EXPECT_EQ(stats.mean, g.mean);
    EXPECT_EQ(stats.var, g.var);
  }
}

TEST(ToLayerSpecTest, WireRuleMatchesTheLayersMirror) {
  const MomentumMode modes[] = {MomentumMode::kTorch, MomentumMode::kDecay,
                                MomentumMode::kCumulative};
  for (MomentumMode mode : modes) {
    for (double momentum : {-1.0, 0.0, 0.3, 1.0}) {
      SyncBatchNormOptions options;
      options.num_features = 4;
      options.momentum_mode = mode;
      options.momentum = momentum;
      absl::StatusOr<v1::LayerSpec> spec = ToLayerSpec(options, "bn");
      ASSERT_TRUE(spec.ok()) << spec.status();
      SCOPED_TRACE(testing::Message() << "mode " << static_cast<int>(mode)
                                      << " momentum " << momentum);
      RunningStats initial;
      initial.mean = RandomValues(4, 41, -2, 2);
      initial.var = RandomValues(4, 42, 0.5, 3);
      const RunningStats server =
          ApplyRandomRounds(WireRule(*spec), initial, 43);
      const RunningStats client =
          ApplyRandomRounds(RuleOf(options), initial, 43);
      EXPECT_EQ(client.mean, server.mean);
      EXPECT_EQ(client.var, server.var);
    }
  }
}

}  // namespace
}  // namespace syncnorm
