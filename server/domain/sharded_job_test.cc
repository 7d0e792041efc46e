// A job of which this aggregator holds some layers (JobSpec::shard): what
// it owns, refuses, commits, checkpoints, restores and stores.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/state_codec.h"

namespace syncnorm {
namespace {

// 4 layers, 2 ranks; this is shard 1 of 3 holding layers 1 and 3.
JobSpec ShardSpec(std::vector<int> owned = {1, 3}) {
  JobSpec s;
  s.job_id = "j";
  s.world_size = 2;
  s.round_timeout = absl::Seconds(5);
  for (int l = 0; l < 4; ++l) {
    LayerConfig layer;
    layer.name = "bn" + std::to_string(l);
    layer.channels = 1;
    s.layers.push_back(layer);
  }
  s.shard.shard = 1;
  s.shard.num_shards = 3;
  s.shard.owned_layers = std::move(owned);
  return s;
}

Contribution Forward(int layer, int64_t step, int rank, double x) {
  Contribution c;
  c.job_id = "j";
  c.layer = layer;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  Moments m = Moments::Zero(1);
  m.count = 2;
  m.mean[0] = x;
  m.m2[0] = 1.0;
  c.payload = m;
  return c;
}

absl::Status Round(Aggregator& agg, int layer, int64_t step) {
  absl::Status status = absl::UnknownError("no answer");
  for (int rank = 0; rank < 2; ++rank) {
    agg.Contribute(Forward(layer, step, rank, 1.0 + rank),
                   [&status](const RoundOutcome& o) { status = o.status; });
  }
  return status;
}

TEST(ShardAssignmentTest, Validation) {
  EXPECT_TRUE(CheckShardAssignment(ShardAssignment{}, 4).ok());
  EXPECT_TRUE(CheckShardAssignment(ShardAssignment{2, 3, {}}, 4).ok());
  EXPECT_TRUE(
      CheckShardAssignment(ShardAssignment{0, 1, {0, 1, 2, 3}}, 4).ok());
  for (const ShardAssignment& bad :
       {ShardAssignment{1, 0, {}}, ShardAssignment{0, 0, {1}},
        ShardAssignment{3, 3, {}}, ShardAssignment{-1, 3, {}},
        ShardAssignment{0, 3, {2, 1}}, ShardAssignment{0, 3, {1, 1}},
        ShardAssignment{0, 3, {4}}, ShardAssignment{0, 3, {-1}}}) {
    EXPECT_EQ(CheckShardAssignment(bad, 4).code(),
              absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<JobSpec> resolved =
      ResolveJobSpec(ShardSpec({3, 1}), absl::Seconds(1));
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardedJobTest, CreateIsIdempotentOnlyWithTheSameAssignment) {
  FakeClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(agg.CreateJob(ShardSpec()).ok());
  EXPECT_TRUE(agg.CreateJob(ShardSpec()).ok());
  EXPECT_EQ(agg.CreateJob(ShardSpec({1})).status().code(),
            absl::StatusCode::kAlreadyExists);
  JobSpec unsharded = ShardSpec();
  unsharded.shard = ShardAssignment{};
  EXPECT_EQ(agg.CreateJob(unsharded).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(ShardedJobTest, ServesOnlyItsLayers) {
  FakeClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(agg.CreateJob(ShardSpec()).ok());
  // Another shard's layer: refused, saying whose it is and what to check.
  RoundOutcome refused;
  agg.Contribute(Forward(0, 0, 0, 1.0),
                 [&refused](const RoundOutcome& o) { refused = o; });
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status.message().find(
                "layer 0 of job 'j' is owned by another shard (this is "
                "shard 1 of 3); check the client's shard list"),
            std::string::npos)
      << refused.status;
  EXPECT_EQ(agg.GetRunningStats("j", {2}, 0, std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The committed step is over layers 1 and 3 only.
  EXPECT_EQ(agg.GetJob("j")->committed_step, -1);
  ASSERT_TRUE(Round(agg, 1, 0).ok());
  EXPECT_EQ(agg.GetJob("j")->committed_step, -1);
  ASSERT_TRUE(Round(agg, 3, 0).ok());
  EXPECT_EQ(agg.GetJob("j")->committed_step, 0);

  // "All layers" means the owned ones.
  absl::StatusOr<RunningStatsSnapshot> all =
      agg.GetRunningStats("j", {}, 0, std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->layers.size(), 2u);
  EXPECT_EQ(all->layers[0].layer, 1);
  EXPECT_EQ(all->layers[1].layer, 3);
  EXPECT_EQ(all->committed_step, 0);

  // A checkpoint holds the owned layers; restore brings them back.
  absl::StatusOr<CheckpointMeta> cut = absl::UnknownError("no answer");
  agg.Checkpoint("j", 0, "t", clock.Now() + absl::Seconds(1),
                 [&cut](const absl::StatusOr<CheckpointMeta>& c) { cut = c; });
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_TRUE(Round(agg, 1, 1).ok());
  ASSERT_TRUE(agg.RestoreCheckpoint("j", 0).ok());
  absl::StatusOr<RunningStatsSnapshot> back =
      agg.GetRunningStats("j", {1}, 0, std::nullopt);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->layers[0].stats.num_batches_tracked, 1);
  absl::StatusOr<RunningStatsSnapshot> from_checkpoint =
      agg.GetRunningStats("j", {}, 0, 0);
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status();
  EXPECT_EQ(from_checkpoint->layers.size(), 2u);
}

TEST(ShardedJobTest, AShardWithoutLayersCheckpointsAtOnce) {
  FakeClock clock;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(agg.CreateJob(ShardSpec({})).ok());
  EXPECT_EQ(agg.GetJob("j")->committed_step, -1);
  absl::StatusOr<CheckpointMeta> cut = absl::UnknownError("no answer");
  agg.Checkpoint("j", 5, "", clock.Now() + absl::Seconds(1),
                 [&cut](const absl::StatusOr<CheckpointMeta>& c) { cut = c; });
  EXPECT_TRUE(cut.ok()) << cut.status();
}

// Builds before the bounds stored what they now refuse: a round timeout
// above 24 hours and a negative num_shards. Such a job still loads, with
// the bound as its timeout and unsharded, as it behaved.
TEST(ShardedJobTest, AJobStoredBeforeTheBoundsStillLoads) {
  JobSpec old = *ResolveJobSpec(ShardSpec(), absl::Seconds(5));
  old.shard = ShardAssignment();
  old.shard.num_shards = -1;
  old.round_timeout = absl::Milliseconds(INT64_MAX);
  absl::StatusOr<JobSpec> decoded = DecodeJob(EncodeJob(old));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->round_timeout, kMaxRoundTimeout);
  EXPECT_EQ(decoded->shard.num_shards, 0);
  EXPECT_FALSE(ResolveJobSpec(old, absl::Seconds(5)).ok())
      << "a new CreateJob with them is refused";
}

TEST(ShardedJobTest, TheAssignmentIsStoredWithTheSpec) {
  absl::StatusOr<JobSpec> spec = ResolveJobSpec(ShardSpec(), absl::Seconds(5));
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<JobSpec> decoded = DecodeJob(EncodeJob(*spec));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == *spec);
  EXPECT_EQ(decoded->shard.owned_layers, (std::vector<int>{1, 3}));

  // And survives a restart of the aggregator on the same store.
  KvStateStore store(std::make_unique<MemoryEngine>());
  FakeClock clock;
  {
    Aggregator agg(AggregatorOptions(), &clock, &store);
    ASSERT_TRUE(agg.CreateJob(ShardSpec()).ok());
    ASSERT_TRUE(Round(agg, 3, 0).ok());
    absl::StatusOr<CheckpointMeta> cut = absl::UnknownError("no answer");
    ASSERT_TRUE(Round(agg, 1, 0).ok());
    agg.Checkpoint(
        "j", 0, "", clock.Now() + absl::Seconds(1),
        [&cut](const absl::StatusOr<CheckpointMeta>& c) { cut = c; });
    ASSERT_TRUE(cut.ok()) << cut.status();
  }
  Aggregator again(AggregatorOptions(), &clock, &store);
  ASSERT_TRUE(again.Load().ok());
  absl::StatusOr<JobSnapshot> job = again.GetJob("j");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->spec.shard.owned_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(job->committed_step, 0);
  EXPECT_TRUE(again.RestoreCheckpoint("j", 0).ok());
}

}  // namespace
}  // namespace syncnorm
