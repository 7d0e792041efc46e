#include "server/domain/job_spec.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

const absl::Duration kDefault = absl::Seconds(30);

JobSpec ValidSpec() {
  JobSpec spec;
  spec.job_id = "resnet50.run-1_a";
  spec.world_size = 4;
  LayerConfig layer;
  layer.name = "bn1";
  layer.channels = 3;
  layer.rule.mode = kMomentumModeUnspecified;
  layer.rule.momentum = 0;
  spec.layers.push_back(layer);
  return spec;
}

TEST(JobSpecTest, ResolvesDefaults) {
  absl::StatusOr<JobSpec> r = ResolveJobSpec(ValidSpec(), kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_size, 4);
  EXPECT_EQ(r->num_groups(), 1);
  EXPECT_EQ(r->round_timeout, kDefault);
  const LayerConfig& l = r->layers[0];
  EXPECT_EQ(l.rule.mode, MomentumMode::kTorch);
  EXPECT_EQ(l.rule.momentum, 0.1);
  EXPECT_EQ(l.initial_running_mean, std::vector<double>(3, 0.0));
  EXPECT_EQ(l.initial_running_var, std::vector<double>(3, 1.0));
}

TEST(JobSpecTest, DecayDefaultMomentumAndExplicitValuesKept) {
  JobSpec spec = ValidSpec();
  spec.group_size = 2;
  spec.round_timeout = absl::Milliseconds(250);
  spec.layers[0].rule.mode = MomentumMode::kDecay;
  spec.layers[0].initial_running_mean = {1, 2, 3};
  spec.layers[0].initial_running_var = {0, 2, 3};
  absl::StatusOr<JobSpec> r = ResolveJobSpec(spec, kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_size, 2);
  EXPECT_EQ(r->num_groups(), 2);
  EXPECT_EQ(r->round_timeout, absl::Milliseconds(250));
  EXPECT_EQ(r->layers[0].rule.momentum, 0.9);
  EXPECT_EQ(r->layers[0].initial_running_mean, (std::vector<double>{1, 2, 3}));
}

TEST(JobSpecTest, ResolvingIsIdempotentAndEqualityFollowsResolution) {
  JobSpec a = *ResolveJobSpec(ValidSpec(), kDefault);
  JobSpec explicit_spec = ValidSpec();
  explicit_spec.layers[0].rule.mode = MomentumMode::kTorch;
  explicit_spec.layers[0].rule.momentum = 0.1;
  explicit_spec.group_size = 4;
  JobSpec b = *ResolveJobSpec(explicit_spec, kDefault);
  EXPECT_EQ(a, b);
  EXPECT_EQ(*ResolveJobSpec(a, kDefault), a);
  JobSpec c = ValidSpec();
  c.layers[0].rule.biased_var = true;
  EXPECT_NE(a, *ResolveJobSpec(c, kDefault));
  JobSpec d = ValidSpec();
  d.world_size = 8;
  EXPECT_NE(a, *ResolveJobSpec(d, kDefault));
}

struct BadCase {
  std::string what;
  void (*mutate)(JobSpec&);
  std::string message;
};

TEST(JobSpecTest, RejectsBadSpecsWithActionableMessages) {
  const BadCase cases[] = {
      {"empty id", [](JobSpec& s) { s.job_id = ""; }, "1 to 128 characters"},
      {"long id", [](JobSpec& s) { s.job_id = std::string(129, 'a'); },
       "has 129 characters"},
      {"bad char", [](JobSpec& s) { s.job_id = "a/b"; },
       "forbidden character at position 1"},
      {"world 0", [](JobSpec& s) { s.world_size = 0; }, "world_size is 0"},
      {"world -3", [](JobSpec& s) { s.world_size = -3; }, "world_size is -3"},
      {"group -1", [](JobSpec& s) { s.group_size = -1; }, "group_size is -1"},
      {"group 3", [](JobSpec& s) { s.group_size = 3; },
       "positive divisor of world_size 4"},
      {"timeout", [](JobSpec& s) { s.round_timeout = absl::Seconds(-1); },
       "round_timeout_ms is -1000"},
      {"timeout past 24 h",
       [](JobSpec& s) { s.round_timeout = absl::Milliseconds(86400001); },
       "round_timeout_ms is 86400001; it must be within [0, 86400000]"},
      {"num_shards negative", [](JobSpec& s) { s.shard.num_shards = -1; },
       "shard.num_shards is -1; it must be positive"},
      {"no layers", [](JobSpec& s) { s.layers.clear(); }, "no layers"},
      {"channels", [](JobSpec& s) { s.layers[0].channels = 0; },
       "layers[0] ('bn1'): num_features is 0"},
      {"momentum", [](JobSpec& s) { s.layers[0].rule.momentum = 1.5; },
       "momentum is 1.5; it must be within [0, 1]"},
      {"momentum nan",
       [](JobSpec& s) {
         s.layers[0].rule.momentum = std::numeric_limits<double>::quiet_NaN();
       },
       "momentum is nan"},
      {"mode", [](JobSpec& s) { s.layers[0].rule.mode = MomentumMode(7); },
       "momentum_mode 7 is unknown"},
      {"mean size", [](JobSpec& s) { s.layers[0].initial_running_mean = {1}; },
       "initial_running_mean has 1 values; give none (default) or exactly "
       "num_features = 3"},
      {"var negative",
       [](JobSpec& s) {
         s.layers[0].initial_running_var = {1, -1, 1};
       },
       "initial_running_var[1] is -1; it must be finite and >= 0"},
      {"mean inf",
       [](JobSpec& s) {
         s.layers[0].initial_running_mean = {
             0, 0, std::numeric_limits<double>::infinity()};
       },
       "initial_running_mean[2] is inf"},
      {"world too large", [](JobSpec& s) { s.world_size = 1 << 30; },
       "world_size is 1073741824; it must be the (positive) number of "
       "contributing ranks, at most 1048576"},
      {"channels too many",
       [](JobSpec& s) { s.layers[0].channels = 2147483647; },
       "num_features is 2147483647; it must be positive, at most 16777216"},
      {"quorum min negative", [](JobSpec& s) { s.quorum.min_ranks = -1; },
       "quorum.min_ranks is -1; it must be within [0, 4]"},
      {"quorum min above group",
       [](JobSpec& s) {
         s.group_size = 2;
         s.quorum.min_ranks = 3;
       },
       "quorum.min_ranks is 3; it must be within [0, 2] (0: off; counted per "
       "group of 2 ranks)"},
      {"groups and group_size",
       [](JobSpec& s) {
         s.group_size = 2;
         s.groups = {{0, 1}, {2, 3}};
       },
       "give group_size (consecutive blocks) or groups (rank lists), not "
       "both"},
      {"empty group",
       [](JobSpec& s) {
         s.groups = {{0, 1, 2, 3}, {}};
       },
       "groups[1] has no ranks"},
      {"rank outside the world",
       [](JobSpec& s) {
         s.groups = {{0, 2}, {1, 4}};
       },
       "groups[1] has rank 4, outside the world's ranks 0..3"},
      {"rank in two groups",
       [](JobSpec& s) {
         s.groups = {{0, 2}, {2, 1}};
       },
       "rank 2 is in groups[0] and groups[1]; every rank must be in exactly "
       "one group"},
      {"rank in no group",
       [](JobSpec& s) {
         s.groups = {{0, 2}, {1}};
       },
       "rank 3 is in no group"},
      {"quorum above the smallest group",
       [](JobSpec& s) {
         s.groups = {{0, 2, 3}, {1}};
         s.quorum.min_ranks = 2;
         s.quorum.grace = absl::Milliseconds(5);
       },
       "quorum.min_ranks is 2; it must be within [0, 1] (0: off; counted per "
       "group of at least 1 ranks)"},
      {"quorum grace negative",
       [](JobSpec& s) {
         s.quorum.min_ranks = 2;
         s.quorum.grace = absl::Milliseconds(-5);
       },
       "quorum.grace_ms is -5; it must be >= 0"},
      {"quorum grace without min",
       [](JobSpec& s) { s.quorum.grace = absl::Milliseconds(100); },
       "quorum.min_ranks is 0 (off)"},
      {"quorum grace not below the timeout",
       [](JobSpec& s) {
         s.quorum.min_ranks = 2;
         s.quorum.grace = kDefault;
       },
       "it must be below the round timeout (30000 ms)"},
  };
  for (const BadCase& c : cases) {
    JobSpec spec = ValidSpec();
    c.mutate(spec);
    absl::StatusOr<JobSpec> r = ResolveJobSpec(spec, kDefault);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message))
        << c.what;
  }
}

// Groups as rank lists (torch process groups): sorted, ordered by lowest
// rank, and the same as group_size when they are consecutive blocks.
TEST(JobSpecTest, ExplicitGroupsResolveToOneForm) {
  JobSpec spec = ValidSpec();
  spec.groups = {{3, 1}, {2, 0}};
  absl::StatusOr<JobSpec> r = ResolveJobSpec(spec, kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_size, 0);
  EXPECT_EQ(r->groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(r->num_groups(), 2);
  EXPECT_EQ(GroupRanks(*r, 1), (std::vector<int>{1, 3}));
  absl::StatusOr<JobSpec> again = ResolveJobSpec(*r, kDefault);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == *r);
  // Uneven groups are fine.
  spec.groups = {{0, 1, 3}, {2}};
  r = ResolveJobSpec(spec, kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(SmallestGroupSize(*r), 1);
  EXPECT_EQ(GroupRanks(*r, 1), (std::vector<int>{2}));
  // Consecutive blocks, in any order, are group_size.
  spec.groups = {{3, 2}, {1, 0}};
  r = ResolveJobSpec(spec, kDefault);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->group_size, 2);
  EXPECT_TRUE(r->groups.empty());
  JobSpec blocks = ValidSpec();
  blocks.group_size = 2;
  EXPECT_TRUE(*r == *ResolveJobSpec(blocks, kDefault));
  EXPECT_EQ(GroupRanks(*r, 1), (std::vector<int>{2, 3}));
  // One group of every rank is group_size = world_size.
  spec.groups = {{0, 1, 2, 3}};
  r = ResolveJobSpec(spec, kDefault);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r == *ResolveJobSpec(ValidSpec(), kDefault));
}

TEST(JobSpecTest, BoundsOfTimeoutsAndSteps) {
  JobSpec spec = ValidSpec();
  spec.round_timeout = kMaxRoundTimeout;
  EXPECT_TRUE(ResolveJobSpec(spec, kDefault).ok());
  EXPECT_TRUE(CheckStep(0, "step").ok());
  EXPECT_TRUE(CheckStep(kMaxStep, "step").ok());
  EXPECT_EQ(kMaxStep, 9007199254740991);
  for (int64_t bad :
       {int64_t{-1}, kMaxStep + 1, std::numeric_limits<int64_t>::max()}) {
    const absl::Status s = CheckStep(bad, "checkpoint_step");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("checkpoint_step is ", bad)));
  }
}

// New layer names and tags: up to kMaxNameBytes (1024) bytes, counted in
// bytes whatever they hold; one byte more is refused, naming the limit.
TEST(JobSpecTest, NewNamesAndTagsAreBounded) {
  JobSpec spec = ValidSpec();
  spec.layers.push_back(spec.layers[0]);
  spec.layers[1].name = std::string(1024, 'n');
  EXPECT_TRUE(CheckNewNames(spec).ok());
  spec.layers[1].name += "n";
  const absl::Status s = CheckNewNames(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layers[1] has a name of 1025 bytes"));
  EXPECT_THAT(s.message(), HasSubstr("at most 1024 bytes"));
  // Resolution does not check it: a stored job keeps loading.
  EXPECT_TRUE(ResolveJobSpec(spec, kDefault).ok());

  EXPECT_TRUE(CheckTag("").ok());
  EXPECT_TRUE(CheckTag(std::string(1024, 't')).ok());
  const absl::Status t = CheckTag(std::string(1025, 't'));
  EXPECT_EQ(t.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.message(), HasSubstr("1025 bytes"));
  EXPECT_THAT(t.message(), HasSubstr("at most 1024 bytes"));
}

}  // namespace
}  // namespace syncnorm
