// The aggregator over a state store: what survives a restart (a second
// Aggregator on the same store), what a failed write does, checkpoints,
// retention, restore and import. The store is in memory here, with a
// fault-injecting engine; tests/ runs the same against RocksDB and kill -9.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/store/faulty_engine.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

JobSpec Spec(const std::string& id, int world, int layers, int group_size = 0) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.group_size = group_size;
  s.round_timeout = absl::Seconds(5);
  for (int l = 0; l < layers; ++l) {
    LayerConfig c;
    c.name = "bn" + std::to_string(l);
    c.channels = 2;
    s.layers.push_back(c);
  }
  return s;
}

Contribution Fwd(const std::string& job, int layer, int64_t step, int rank,
                 double x) {
  Contribution c;
  c.job_id = job;
  c.layer = layer;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  Moments m = Moments::Zero(2);
  m.count = 3;
  m.mean = {x, -x};
  m.m2 = {1.0 + x * x, 2.0};
  c.payload = m;
  return c;
}

Contribution Bwd(const std::string& job, int layer, int64_t step, int rank) {
  Contribution c = Fwd(job, layer, step, rank, 0);
  c.phase = Phase::kBackward;
  c.payload = GradSums{{1.0 * rank, 2.0}, {0.5, -0.5 * rank}};
  return c;
}

class DurabilityTest : public ::testing::Test {
 protected:
  DurabilityTest()
      : faulty_(new FaultyEngine(&memory_)),
        store_(std::unique_ptr<KvEngine>(faulty_)) {
    Restart();
  }

  // A fresh aggregator on the same store: what a restarted server sees.
  void Restart(AggregatorOptions options = AggregatorOptions()) {
    agg_.reset();
    agg_ = std::make_unique<Aggregator>(options, &clock_, &store_);
    ASSERT_TRUE(agg_->Load().ok());
  }

  RoundOutcome Send(Contribution c) {
    // Outlives this call: a rank that does not complete its round is
    // answered later, by the contribution that does.
    auto got = std::make_shared<RoundOutcome>();
    got->status = absl::InternalError("no answer yet");
    agg_->Contribute(std::move(c), [got](const RoundOutcome& o) { *got = o; });
    return *got;
  }

  // Forward rounds of every layer at `step` from both ranks of a 2-rank job.
  void Step(const std::string& job, int layers, int64_t step) {
    for (int l = 0; l < layers; ++l) {
      Send(Fwd(job, l, step, 0, 0.5 * step + l));
      RoundOutcome o = Send(Fwd(job, l, step, 1, 1.5 * step - l));
      ASSERT_TRUE(o.status.ok()) << o.status;
    }
  }

  RunningStats Stats(const std::string& job, int layer) {
    auto s = agg_->GetRunningStats(job, {layer}, 0);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->layers[0].stats : RunningStats();
  }

  absl::StatusOr<CheckpointMeta> Checkpoint(const std::string& job,
                                            int64_t step,
                                            const std::string& tag = "") {
    auto got = std::make_shared<absl::StatusOr<CheckpointMeta>>(
        absl::UnknownError("still waiting"));
    agg_->Checkpoint(
        job, step, tag, clock_.Now() + absl::Seconds(5),
        [got](const absl::StatusOr<CheckpointMeta>& r) { *got = r; });
    return *got;
  }

  FakeClock clock_;
  MemoryEngine memory_;
  FaultyEngine* faulty_;  // owned by store_
  KvStateStore store_;
  std::unique_ptr<Aggregator> agg_;
};

bool SameBits(const RunningStats& a, const RunningStats& b) {
  return a.num_batches_tracked == b.num_batches_tracked && a.mean == b.mean &&
         a.var == b.var;
}

TEST_F(DurabilityTest, JobsStatsAndRetryAnswersSurviveARestart) {
  ASSERT_TRUE(agg_->CreateJob(Spec("j", 2, 2)).ok());
  Step("j", 2, 0);
  Send(Bwd("j", 0, 0, 0));
  const RoundOutcome bwd = Send(Bwd("j", 0, 0, 1));
  ASSERT_TRUE(bwd.status.ok());
  const RunningStats before = Stats("j", 1);
  const RoundOutcome fwd = Send(Fwd("j", 1, 0, 0, 1.0));  // a retry
  Restart();
  ASSERT_TRUE(agg_->GetJob("j").ok());
  EXPECT_EQ(agg_->GetJob("j")->committed_step, 0);
  EXPECT_TRUE(SameBits(Stats("j", 1), before));
  // Retries after the restart get the identical answers, applied once.
  RoundOutcome again = Send(Fwd("j", 1, 0, 0, 1.0));
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.moments.mean, fwd.moments.mean);
  EXPECT_EQ(again.version, 1);
  RoundOutcome bwd_again = Send(Bwd("j", 0, 0, 1));
  ASSERT_TRUE(bwd_again.status.ok()) << bwd_again.status;
  EXPECT_EQ(bwd_again.grad_sums.sum_dy, bwd.grad_sums.sum_dy);
  EXPECT_TRUE(SameBits(Stats("j", 1), before));
  // A different payload is still a conflict, an old step still stale.
  EXPECT_EQ(Send(Fwd("j", 1, 0, 0, 9.0)).status.code(),
            absl::StatusCode::kAborted);
  Step("j", 2, 1);
  Step("j", 2, 2);
  Restart();
  EXPECT_EQ(Stats("j", 0).num_batches_tracked, 3);
  // Step 0 is still in the (8-round) window: its retry is answered.
  EXPECT_TRUE(Send(Fwd("j", 0, 0, 1, 1.5 * 0 - 0)).status.ok());
}

TEST_F(DurabilityTest, TheStoreKeepsOnlyTheRetryWindow) {
  AggregatorOptions o;
  o.recent_rounds = 2;
  Restart(o);
  ASSERT_TRUE(agg_->CreateJob(Spec("w", 2, 1)).ok());
  for (int s = 0; s < 6; ++s) Step("w", 1, s);
  int rounds = 0;
  ASSERT_TRUE(memory_
                  .Scan("r/w/",
                        [&](absl::string_view, absl::string_view) {
                          ++rounds;
                          return absl::OkStatus();
                        })
                  .ok());
  EXPECT_EQ(rounds, 2);
  Restart(o);
  EXPECT_EQ(Send(Fwd("w", 0, 3, 0, 1.5)).status.code(),
            absl::StatusCode::kFailedPrecondition);  // too old: stale
  EXPECT_TRUE(Send(Fwd("w", 0, 5, 0, 2.5)).status.ok());
}

TEST_F(DurabilityTest, AFailedWriteFailsTheRoundAndAppliesNothing) {
  ASSERT_TRUE(agg_->CreateJob(Spec("f", 2, 1)).ok());
  Step("f", 1, 0);
  const RunningStats before = Stats("f", 0);
  faulty_->fail_writes(true);
  std::vector<RoundOutcome> got;
  agg_->Contribute(Fwd("f", 0, 1, 0, 4.0),
                   [&](const RoundOutcome& o) { got.push_back(o); });
  agg_->Contribute(Fwd("f", 0, 1, 1, 5.0),
                   [&](const RoundOutcome& o) { got.push_back(o); });
  ASSERT_EQ(got.size(), 2u);
  for (const RoundOutcome& o : got) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(o.status.message(), "not applied"))
        << o.status;
    EXPECT_TRUE(absl::StrContains(o.status.message(), "no space")) << o.status;
  }
  EXPECT_TRUE(SameBits(Stats("f", 0), before));
  EXPECT_EQ(agg_->GetJob("f")->committed_step, 0);
  // Other calls that write fail clearly too, and change nothing.
  EXPECT_EQ(agg_->CreateJob(Spec("g", 1, 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(agg_->GetJob("g").ok());
  EXPECT_EQ(agg_->DeleteJob("f").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Checkpoint("f", 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Once the disk has room again, the same contributions apply, once.
  faulty_->fail_writes(false);
  Send(Fwd("f", 0, 1, 0, 4.0));
  RoundOutcome ok = Send(Fwd("f", 0, 1, 1, 5.0));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  EXPECT_EQ(ok.version, 2);
  Restart();
  EXPECT_EQ(Stats("f", 0).num_batches_tracked, 2);
}

TEST_F(DurabilityTest, CheckpointWaitsForItsStepAndCutsThatStep) {
  ASSERT_TRUE(agg_->CreateJob(Spec("c", 2, 2)).ok());
  Step("c", 2, 0);
  std::optional<absl::StatusOr<CheckpointMeta>> waited;
  agg_->Checkpoint(
      "c", 1, "", clock_.Now() + absl::Seconds(5),
      [&](const absl::StatusOr<CheckpointMeta>& r) { waited = r; });
  EXPECT_FALSE(waited.has_value());
  // Layer 0 runs ahead to step 2 before layer 1 commits step 1.
  Send(Fwd("c", 0, 1, 0, 1.0));
  Send(Fwd("c", 0, 1, 1, 2.0));
  const RunningStats layer0_at_1 = Stats("c", 0);
  Send(Fwd("c", 0, 2, 0, 3.0));
  Send(Fwd("c", 0, 2, 1, 4.0));
  EXPECT_FALSE(waited.has_value());
  Send(Fwd("c", 1, 1, 0, 5.0));
  Send(Fwd("c", 1, 1, 1, 6.0));
  ASSERT_TRUE(waited.has_value());
  ASSERT_TRUE(waited->ok()) << waited->status();
  EXPECT_EQ((*waited)->step, 1);
  auto at1 = agg_->GetRunningStats("c", {0}, 0, 1);
  ASSERT_TRUE(at1.ok()) << at1.status();
  EXPECT_TRUE(SameBits(at1->layers[0].stats, layer0_at_1));
  EXPECT_EQ(at1->committed_step, 1);
  // A step that never comes: DEADLINE_EXCEEDED naming the lagging layer.
  std::optional<absl::StatusOr<CheckpointMeta>> late;
  agg_->Checkpoint("c", 9, "", clock_.Now() + absl::Seconds(1),
                   [&](const absl::StatusOr<CheckpointMeta>& r) { late = r; });
  clock_.Advance(absl::Seconds(2));
  agg_->ExpireRounds(clock_.Now());
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(late->status().message(), "layer 1 ('bn1')"))
      << late->status();
  EXPECT_EQ(agg_->GetRunningStats("c", {}, 0, 7).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DurabilityTest, RestoreRollsBackAndAcceptsTheNextStepsAgain) {
  ASSERT_TRUE(agg_->CreateJob(Spec("r", 2, 2)).ok());
  Step("r", 2, 0);
  Step("r", 2, 1);
  const RunningStats at1 = Stats("r", 1);
  ASSERT_TRUE(Checkpoint("r", 1, "keep").ok());
  Step("r", 2, 2);
  Step("r", 2, 3);
  const RunningStats at3 = Stats("r", 1);
  Restart();  // checkpoints survive too
  ASSERT_EQ(agg_->ListCheckpoints("r")->size(), 1u);
  auto restored = agg_->RestoreCheckpoint("r", 1);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->committed_step, 1);
  EXPECT_TRUE(SameBits(Stats("r", 1), at1));
  EXPECT_EQ(Send(Fwd("r", 0, 1, 0, 0.5)).status.code(),
            absl::StatusCode::kFailedPrecondition);
  // Replaying steps 2 and 3 gives bit for bit the same statistics.
  Step("r", 2, 2);
  Step("r", 2, 3);
  EXPECT_TRUE(SameBits(Stats("r", 1), at3));
  Restart();
  EXPECT_TRUE(SameBits(Stats("r", 1), at3));
  EXPECT_EQ(agg_->RestoreCheckpoint("r", 2).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DurabilityTest, RetentionDropsTheOldestUntaggedCheckpoints) {
  AggregatorOptions o;
  o.keep_checkpoints = 2;
  Restart(o);
  ASSERT_TRUE(agg_->CreateJob(Spec("k", 2, 1)).ok());
  for (int s = 0; s < 5; ++s) {
    Step("k", 1, s);
    ASSERT_TRUE(Checkpoint("k", s, s == 1 ? "best" : "").ok());
  }
  std::vector<int64_t> steps;
  absl::StatusOr<std::vector<CheckpointMeta>> list = agg_->ListCheckpoints("k");
  ASSERT_TRUE(list.ok());
  for (const CheckpointMeta& c : *list) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(Checkpoint("k", 4, "other").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Checkpoint("k", 4).ok());  // idempotent
  Restart(o);
  EXPECT_EQ(agg_->ListCheckpoints("k")->size(), 3u);
  EXPECT_EQ(agg_->GetRunningStats("k", {}, 0, 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DurabilityTest, DeleteRemovesEveryRecordOfTheJob) {
  ASSERT_TRUE(agg_->CreateJob(Spec("d", 2, 1)).ok());
  ASSERT_TRUE(agg_->CreateJob(Spec("d2", 2, 1)).ok());
  Step("d", 1, 0);
  ASSERT_TRUE(Checkpoint("d", 0).ok());
  ASSERT_TRUE(agg_->DeleteJob("d").ok());
  int left = 0;
  for (const char* prefix : {"j/d/", "j/d", "l/d/", "r/d/", "c/d/"}) {
    ASSERT_TRUE(memory_
                    .Scan(prefix,
                          [&](absl::string_view key, absl::string_view) {
                            if (!absl::StartsWith(key, "j/d2")) ++left;
                            return absl::OkStatus();
                          })
                    .ok());
  }
  EXPECT_EQ(left, 0);
  Restart();
  EXPECT_EQ(agg_->GetJob("d").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(agg_->GetJob("d2").ok());
  // Recreated, it starts from scratch.
  ASSERT_TRUE(agg_->CreateJob(Spec("d", 2, 1)).ok());
  EXPECT_EQ(Stats("d", 0).num_batches_tracked, 0);
}

TEST_F(DurabilityTest, ImportReplacesStatisticsAtOnceAndChecksThem) {
  ASSERT_TRUE(agg_->CreateJob(Spec("i", 4, 2, 2)).ok());
  LayerStatsSnapshot a{1, "bn1", 1, RunningStats{7, {1, 2}, {3, 4}}};
  LayerStatsSnapshot bad = a;
  bad.stats.var = {1, -1};
  EXPECT_EQ(agg_->SetRunningStats("i", {a, bad}).status().code(),
            absl::StatusCode::kInvalidArgument);
  LayerStatsSnapshot wrong_name = a;
  wrong_name.name = "bn0";
  EXPECT_EQ(agg_->SetRunningStats("i", {wrong_name}).status().code(),
            absl::StatusCode::kInvalidArgument);
  LayerStatsSnapshot group_out = a;
  group_out.group = 2;
  EXPECT_EQ(agg_->SetRunningStats("i", {group_out}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(agg_->SetRunningStats("i", {a, a}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(agg_->SetRunningStats("i", {a}).ok());
  Restart();
  auto s = agg_->GetRunningStats("i", {1}, 1);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(SameBits(s->layers[0].stats, a.stats));
  EXPECT_EQ(agg_->GetRunningStats("i", {1}, 0)->layers[0].stats.mean,
            (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace syncnorm
