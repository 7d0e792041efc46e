// The aggregator under what torch trainers do: process groups as rank
// lists, a momentum changed between steps, buffers reset or loaded
// (imports), a layer called twice per step (backwards in any order),
// several backwards through one forward, and a job re-created from a model
// reloaded mid-training. Over an in-memory state store, restarted where
// durability matters.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

JobSpec Spec(const std::string& id, int world, int channels = 1) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.round_timeout = absl::Seconds(5);
  LayerConfig layer;
  layer.name = "bn";
  layer.channels = channels;
  s.layers.push_back(layer);
  return s;
}

// count values whose mean is `mean` and sum of squared deviations `m2`.
Moments Batch(int64_t count, double mean, double m2) {
  Moments m = Moments::Zero(1);
  m.count = count;
  m.mean[0] = count > 0 ? mean : 0;
  m.m2[0] = count > 0 ? m2 : 0;
  return m;
}

Contribution Forward(const std::string& job, int64_t step, int rank, Moments m,
                     RoundUpdate update = {}) {
  Contribution c;
  c.job_id = job;
  c.layer = 0;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  c.payload = std::move(m);
  c.update = std::move(update);
  return c;
}

Contribution Backward(const std::string& job, int64_t step, int rank,
                      double dy) {
  Contribution c = Forward(job, step, rank, Moments());
  c.phase = Phase::kBackward;
  c.payload = GradSums{{dy}, {2 * dy}};
  return c;
}

RoundUpdate Momentum(MomentumMode mode, double m) {
  RoundUpdate u;
  u.momentum = RoundMomentum{mode, m};
  return u;
}

RoundUpdate Import(int64_t n, double mean, double var) {
  RoundUpdate u;
  u.imported = RunningStats{n, {mean}, {var}};
  return u;
}

class TrainerPatternsTest : public ::testing::Test {
 protected:
  TrainerPatternsTest() : store_(std::make_unique<MemoryEngine>()) {
    Restart();
  }

  void Restart() {
    agg_.reset();
    agg_ = std::make_unique<Aggregator>(AggregatorOptions(), &clock_, &store_);
    ASSERT_TRUE(agg_->Load().ok());
  }

  void Create(const JobSpec& spec) {
    absl::StatusOr<JobSnapshot> s = agg_->CreateJob(spec);
    ASSERT_TRUE(s.ok()) << s.status();
  }

  // The outcome `c` gets; one that waits for other ranks is answered by a
  // later contribution, so the slot outlives the call.
  std::shared_ptr<RoundOutcome> Send(Contribution c) {
    auto got = std::make_shared<RoundOutcome>();
    got->status = absl::UnknownError("no answer yet");
    agg_->Contribute(std::move(c), [got](const RoundOutcome& o) { *got = o; });
    return got;
  }

  RunningStats Stats(const std::string& job, int group) {
    auto s = agg_->GetRunningStats(job, {}, group);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->layers[0].stats : RunningStats();
  }

  FakeClock clock_;
  KvStateStore store_;
  std::unique_ptr<Aggregator> agg_;
};

// torch: g0 = new_group([0, 2]), g1 = new_group([1, 3]), rank r feeding
// the constant r: batch means 1, 2, 1, 2 (not 0.5, 0.5, 2.5, 2.5).
TEST_F(TrainerPatternsTest, ExplicitGroupsMergeTheirOwnRanks) {
  JobSpec spec = Spec("pg", 4);
  spec.groups = {{2, 0}, {3, 1}};
  Create(spec);
  EXPECT_THAT(agg_->GetJob("pg")->spec.groups,
              ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3)));
  std::vector<std::shared_ptr<RoundOutcome>> got;
  for (int r : {3, 0, 1, 2})
    got.push_back(Send(Forward("pg", 0, r, Batch(2, r, 0))));
  const double want[] = {2, 1, 2, 1};  // in the order sent: ranks 3, 0, 1, 2
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(got[i]->status.ok()) << got[i]->status;
    EXPECT_EQ(got[i]->moments.count, 4);
    EXPECT_EQ(got[i]->moments.mean[0], want[i]);
    EXPECT_EQ(got[i]->moments.var[0], 1.0);  // values r-1, r+1 around r
  }
  EXPECT_DOUBLE_EQ(Stats("pg", 0).mean[0], 0.1 * 1);
  EXPECT_DOUBLE_EQ(Stats("pg", 1).mean[0], 0.1 * 2);
  EXPECT_EQ(agg_->GetJob("pg")->committed_step, 0);
  // A group waits for its own ranks only, and names them.
  Send(Forward("pg", 1, 1, Batch(2, 1, 0)));
  std::shared_ptr<RoundOutcome> late =
      Send(Forward("pg", 1, 0, Batch(2, 0, 0)));
  clock_.Advance(absl::Seconds(6));
  agg_->ExpireRounds(clock_.Now());
  EXPECT_EQ(late->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late->missing_ranks, ElementsAre(2));
  EXPECT_THAT(std::string(late->status.message()),
              HasSubstr("waiting for ranks [2]"));
  // After a restart: the groups, and a retry of rank 3 gets the stored
  // answer of its group.
  Restart();
  EXPECT_EQ(agg_->GetJob("pg")->spec.groups.size(), 2u);
  std::shared_ptr<RoundOutcome> retry =
      Send(Forward("pg", 0, 3, Batch(2, 3, 0)));
  ASSERT_TRUE(retry->status.ok()) << retry->status;
  EXPECT_EQ(retry->moments.mean[0], 2);
  std::shared_ptr<RoundOutcome> conflict =
      Send(Forward("pg", 0, 3, Batch(2, 3.5, 0)));
  EXPECT_EQ(conflict->status.code(), absl::StatusCode::kAborted);
}

// apex's test sets momentum = 1.0 after building the model; torch reads it
// at every forward: that round moves the running statistics to the batch's.
TEST_F(TrainerPatternsTest, RoundMomentumAppliesToItsRoundOnly) {
  Create(Spec("momentum", 2));
  const RoundUpdate one = Momentum(MomentumMode::kTorch, 1.0);
  Send(Forward("momentum", 0, 0, Batch(3, 1, 2), one));
  auto o = Send(Forward("momentum", 0, 1, Batch(1, 5, 0), one));
  ASSERT_TRUE(o->status.ok()) << o->status;
  RunningStats s = Stats("momentum", 0);
  EXPECT_DOUBLE_EQ(s.mean[0], 2.0);        // (3 * 1 + 5) / 4
  EXPECT_DOUBLE_EQ(s.var[0], 14.0 / 3.0);  // M2 = 2 + 9 * 3 / 4 * ... / 3
  // The layer's own momentum sent by one rank only is no disagreement.
  Send(Forward("momentum", 1, 0, Batch(2, 0, 2),
               Momentum(MomentumMode::kTorch, 0.1)));
  o = Send(Forward("momentum", 1, 1, Batch(2, 0, 2)));
  ASSERT_TRUE(o->status.ok()) << o->status;
  EXPECT_DOUBLE_EQ(Stats("momentum", 0).mean[0], 0.9 * 2.0);
  // torch's momentum 0: nothing moves but the counter.
  const RoundUpdate zero = Momentum(MomentumMode::kTorch, 0.0);
  Send(Forward("momentum", 2, 0, Batch(2, 7, 2), zero));
  o = Send(Forward("momentum", 2, 1, Batch(2, 9, 2), zero));
  ASSERT_TRUE(o->status.ok()) << o->status;
  EXPECT_DOUBLE_EQ(Stats("momentum", 0).mean[0], 0.9 * 2.0);
  EXPECT_EQ(Stats("momentum", 0).num_batches_tracked, 3);
}

// torch.optim.swa_utils.update_bn: buffers reset (zeros, ones, counter 0),
// momentum None, forwards: the cumulative average of the batches, stored.
TEST_F(TrainerPatternsTest, ImportThenCumulativeAverageSurvivesARestart) {
  Create(Spec("swa", 2));
  for (int64_t step = 0; step < 2; ++step) {
    Send(Forward("swa", step, 0, Batch(2, 10, 2)));
    Send(Forward("swa", step, 1, Batch(2, 10, 2)));
  }
  RoundUpdate reset = Import(0, 0, 1);
  reset.momentum = RoundMomentum{MomentumMode::kCumulative, 0};
  Send(Forward("swa", 2, 0, Batch(2, 1, 2), reset));
  auto o = Send(Forward("swa", 2, 1, Batch(2, 3, 2), reset));
  ASSERT_TRUE(o->status.ok()) << o->status;
  EXPECT_EQ(o->version, 1);
  const RoundUpdate cumulative = Momentum(MomentumMode::kCumulative, 0);
  Send(Forward("swa", 3, 0, Batch(4, 6, 0), cumulative));
  o = Send(Forward("swa", 3, 1, Batch(0, 0, 0), cumulative));
  ASSERT_TRUE(o->status.ok()) << o->status;
  RunningStats s = Stats("swa", 0);
  EXPECT_EQ(s.num_batches_tracked, 2);
  EXPECT_DOUBLE_EQ(s.mean[0], (2.0 + 6.0) / 2);
  // Batch 1: values 0, 2, 2, 4 (M2 8, unbiased 8 / 3); batch 2: var 0.
  EXPECT_DOUBLE_EQ(s.var[0], (8.0 / 3 + 0.0) / 2);
  Restart();
  RunningStats after = Stats("swa", 0);
  EXPECT_EQ(after.num_batches_tracked, s.num_batches_tracked);
  EXPECT_EQ(after.mean, s.mean);
  EXPECT_EQ(after.var, s.var);
}

TEST_F(TrainerPatternsTest, RanksThatChangeTheLayerDifferentlyFailTheRound) {
  Create(Spec("split", 2));
  Send(Forward("split", 0, 0, Batch(2, 1, 2), Import(0, 0, 1)));
  auto o = Send(Forward("split", 0, 1, Batch(2, 1, 2)));
  EXPECT_EQ(o->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(o->reason, RoundErrorReason::kRanksDisagree);
  EXPECT_THAT(std::string(o->status.message()),
              HasSubstr("rank 1 sent a different momentum or imported_stats "
                        "than rank 0"));
  EXPECT_EQ(Stats("split", 0).num_batches_tracked, 0) << "nothing applied";
  // The next step, alike on both ranks, goes through.
  Send(Forward("split", 1, 0, Batch(2, 1, 2), Import(5, 0, 1)));
  o = Send(Forward("split", 1, 1, Batch(2, 1, 2), Import(5, 0, 1)));
  ASSERT_TRUE(o->status.ok()) << o->status;
  EXPECT_EQ(o->version, 6);
}

TEST_F(TrainerPatternsTest, ASingleValuePerChannelSaysSo) {
  Create(Spec("one", 2));
  Send(Forward("one", 0, 0, Batch(1, 3, 0)));
  auto o = Send(Forward("one", 0, 1, Batch(0, 0, 0)));
  EXPECT_EQ(o->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(o->reason, RoundErrorReason::kSingleValuePerChannel);
  EXPECT_THAT(std::string(o->status.message()),
              HasSubstr("Expected more than 1 value per channel"));
}

// y1 = bn(x1); y2 = bn(x2); autograd runs the backward of step 1 first.
TEST_F(TrainerPatternsTest, BackwardRoundsCompleteInAnyOrderAfterTheirForward) {
  Create(Spec("twice", 2));
  for (int64_t step : {0, 1}) {
    Send(Forward("twice", step, 0, Batch(2, step, 2)));
    Send(Forward("twice", step, 1, Batch(2, step, 2)));
  }
  Send(Backward("twice", 1, 0, 1.0));
  auto b1 = Send(Backward("twice", 1, 1, 2.0));
  ASSERT_TRUE(b1->status.ok()) << b1->status;
  EXPECT_EQ(b1->grad_sums.sum_dy[0], 3.0);
  EXPECT_EQ(b1->version, 2);
  Send(Backward("twice", 0, 1, 20.0));
  auto b0 = Send(Backward("twice", 0, 0, 10.0));
  ASSERT_TRUE(b0->status.ok()) << b0->status;
  EXPECT_EQ(b0->grad_sums.sum_dy[0], 30.0);
  EXPECT_EQ(b0->version, 1);
  // A retry of either gets its answer; a backward ahead of its forward is
  // refused.
  EXPECT_EQ(Send(Backward("twice", 1, 0, 1.0))->grad_sums.sum_dy[0], 3.0);
  auto ahead = Send(Backward("twice", 2, 0, 1.0));
  EXPECT_EQ(ahead->status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ahead->status.message()),
              HasSubstr("step 2 of layer 0 (BACKWARD) has no completed "
                        "FORWARD round"));
  // Forward steps still apply in order.
  auto stale = Send(Forward("twice", 1, 0, Batch(2, 0, 2)));
  EXPECT_EQ(stale->status.code(), absl::StatusCode::kAborted);  // conflict
  stale = Send(Forward("twice", 0, 0, Batch(2, 9, 2)));
  EXPECT_EQ(stale->status.code(), absl::StatusCode::kAborted);
}

// retain_graph=True, as PCGrad or GradNorm run it: three backwards through
// step 0's forward are three rounds, each summing the same backward of
// every rank, in any order. Each has its own retry identity, which holds
// across a restart, and backward 0 keeps the meaning it always had.
TEST_F(TrainerPatternsTest, EachBackwardThroughOneForwardIsItsOwnRound) {
  Create(Spec("pcgrad", 3));
  for (int r = 0; r < 3; ++r) Send(Forward("pcgrad", 0, r, Batch(2, r, 1)));
  const auto backward = [](int rank, int index) {
    Contribution c = Backward("pcgrad", 0, rank, (index + 1) * 100.0 + rank);
    c.backward = index;
    return c;
  };
  // Ranks run their backwards at different paces: rank 2 is through all
  // three before rank 0 starts.
  std::vector<std::shared_ptr<RoundOutcome>> got(3);
  for (int b : {0, 1, 2}) Send(backward(2, b));
  for (int b : {2, 1}) Send(backward(1, b));
  got[2] = Send(backward(0, 2));
  got[0] = Send(backward(0, 0));
  EXPECT_EQ(got[0]->status.code(), absl::StatusCode::kUnknown)
      << "backward 0 still waits for rank 1: " << got[0]->status;
  got[1] = Send(backward(0, 1));
  Send(backward(1, 0));
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(got[b]->status.ok()) << b << ": " << got[b]->status;
    // (b+1)*100 per rank plus 0 + 1 + 2.
    EXPECT_EQ(got[b]->grad_sums.sum_dy[0], 3 * (b + 1) * 100.0 + 3) << b;
    EXPECT_EQ(got[b]->grad_sums.sum_dy_xmu[0], 2 * (3 * (b + 1) * 100.0 + 3));
    EXPECT_EQ(got[b]->version, 1);
  }
  Restart();
  // A retry gets its own round's answer; a different payload for a
  // finished backward conflicts and says which backward it was.
  EXPECT_EQ(Send(backward(1, 2))->grad_sums.sum_dy[0], 903.0);
  EXPECT_EQ(Send(backward(0, 0))->grad_sums.sum_dy[0], 303.0);
  Contribution changed = backward(0, 1);
  std::get<GradSums>(changed.payload).sum_dy[0] = 5;
  auto conflict = Send(changed);
  EXPECT_EQ(conflict->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(conflict->status.message()),
              HasSubstr("step 0, BACKWARD 1, rank 0"));
  // A fourth backward is a new round; a deadline names it.
  auto fourth = Send(backward(0, 3));
  clock_.Advance(absl::Seconds(6));
  agg_->ExpireRounds(clock_.Now());
  EXPECT_EQ(fourth->status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(fourth->status.message()),
              HasSubstr("step 0, BACKWARD 3)"));
}

TEST_F(TrainerPatternsTest, ABackwardIndexIsRefusedWhereItMeansNothing) {
  Create(Spec("plain", 1));
  JobSpec stale = Spec("ssp", 1);
  stale.staleness = 1;
  Create(stale);
  Contribution forward = Forward("plain", 0, 0, Batch(2, 0, 1));
  forward.backward = 1;
  Contribution negative = Backward("plain", 0, 0, 1);
  negative.backward = -1;
  Contribution in_stale_job = Backward("ssp", 0, 0, 1);
  in_stale_job.backward = 1;
  const std::vector<std::pair<Contribution, std::string>> cases = {
      {forward, "backward_index 1 is not valid for a FORWARD contribution"},
      {negative, "backward_index -1 is not valid for a BACKWARD"},
      {in_stale_job,
       "is stale-synchronous (staleness 1), which syncs one "
       "backward per forward"},
  };
  for (const auto& [c, message] : cases) {
    auto o = Send(c);
    EXPECT_EQ(o->status.code(), absl::StatusCode::kInvalidArgument)
        << message << ": " << o->status;
    EXPECT_THAT(std::string(o->status.message()), HasSubstr(message));
  }
}

// torch's DDP SyncBatchNorm test saves the model after step 2, reloads it
// and trains on: the reloaded model's statistics are not the job's initial
// ones any more.
TEST_F(TrainerPatternsTest, ReCreatingATrainedJobIgnoresInitialStatistics) {
  JobSpec spec = Spec("reload", 1);
  spec.layers[0].initial_running_mean = {0.5};
  Create(spec);
  JobSpec reloaded = spec;
  reloaded.layers[0].initial_running_mean = {0.25};
  EXPECT_EQ(agg_->CreateJob(reloaded).status().code(),
            absl::StatusCode::kAlreadyExists)
      << "before any round the initial statistics are the job's";
  ASSERT_TRUE(Send(Forward("reload", 0, 0, Batch(4, 2, 3)))->status.ok());
  reloaded.layers[0].initial_running_mean = Stats("reload", 0).mean;
  reloaded.layers[0].initial_running_var = Stats("reload", 0).var;
  absl::StatusOr<JobSnapshot> again = agg_->CreateJob(reloaded);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.layers[0].initial_running_mean,
            std::vector<double>{0.5});
  EXPECT_EQ(again->committed_step, 0);
  reloaded.layers[0].channels = 2;
  reloaded.layers[0].initial_running_mean = {0, 0};
  reloaded.layers[0].initial_running_var = {1, 1};
  EXPECT_EQ(agg_->CreateJob(reloaded).status().code(),
            absl::StatusCode::kAlreadyExists);
  // An import moves a layer too.
  Create(Spec("imported", 1));
  ASSERT_TRUE(
      agg_->SetRunningStats("imported", {{0, "", 0, {3, {1}, {2}}}}).ok());
  JobSpec other = Spec("imported", 1);
  other.layers[0].initial_running_mean = {1};
  EXPECT_TRUE(agg_->CreateJob(other).ok());
}

TEST_F(TrainerPatternsTest, BadUpdatesAreRefusedWithWhatToFix) {
  JobSpec spec = Spec("bad", 2);
  spec.layers.push_back(spec.layers[0]);
  spec.layers[1].rule.track = false;
  Create(spec);
  struct Case {
    Contribution c;
    std::string message;
  };
  Contribution untracked =
      Forward("bad", 0, 0, Batch(2, 0, 1), Import(0, 0, 1));
  untracked.layer = 1;
  Contribution backward = Backward("bad", 0, 0, 1);
  backward.update = Import(0, 0, 1);
  const std::vector<Case> cases = {
      {Forward("bad", 0, 0, Batch(2, 0, 1), Momentum(MomentumMode::kTorch, 2)),
       "layer 0 ('bn'): momentum.momentum is 2; it must be within [0, 1]"},
      {Forward("bad", 0, 0, Batch(2, 0, 1), Import(0, 0, -1)),
       "imported_stats.running_var[0] is -1"},
      {Forward("bad", 0, 0, Batch(2, 0, 1), Import(-3, 0, 1)),
       "imported_stats.num_batches_tracked is -3"},
      {untracked, "keeps no running statistics"},
      {backward,
       "a BACKWARD contribution carries no momentum or "
       "imported_stats"},
  };
  for (const Case& k : cases) {
    auto o = Send(k.c);
    EXPECT_EQ(o->status.code(), absl::StatusCode::kInvalidArgument)
        << k.message << ": " << o->status;
    EXPECT_THAT(std::string(o->status.message()), HasSubstr(k.message));
  }
}

// MegEngine's freeze / MXNet's use_global_stats: layer 0 of two runs no
// rounds; its buffers are pushed with SetRunningStats, saying so. The job's
// committed step follows layer 1 (it stayed at -1 and a checkpoint waited
// for ever), a checkpoint holds the frozen layer's statistics, the mark
// survives a restart, and a forward round of the layer clears it.
TEST_F(TrainerPatternsTest, AFrozenLayerDoesNotHoldTheCommittedStepBack) {
  JobSpec spec = Spec("frozen", 2);
  spec.layers.push_back(spec.layers[0]);
  spec.layers[1].name = "bn2";
  Create(spec);
  LayerStatsSnapshot pretrained;
  pretrained.layer = 0;
  pretrained.stats = RunningStats{3, {0.5}, {2.0}};
  pretrained.frozen = true;
  absl::StatusOr<std::vector<LayerStatsSnapshot>> set =
      agg_->SetRunningStats("frozen", {pretrained});
  ASSERT_TRUE(set.ok()) << set.status();
  for (int64_t step = 0; step < 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      Contribution c = Forward("frozen", step, rank, Batch(2, rank, 2));
      c.layer = 1;
      Send(std::move(c));
    }
  }
  absl::StatusOr<JobSnapshot> job = agg_->GetJob("frozen");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->committed_step, 2);

  absl::Status checkpointed = absl::UnknownError("no answer");
  agg_->Checkpoint("frozen", 2, "", clock_.Now() + absl::Seconds(1),
                   [&](absl::StatusOr<CheckpointMeta> meta) {
                     checkpointed = meta.status();
                   });
  ASSERT_TRUE(checkpointed.ok()) << checkpointed;
  absl::StatusOr<RunningStatsSnapshot> at =
      agg_->GetRunningStats("frozen", {0}, 0, 2);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(at->layers[0].stats.num_batches_tracked, 3);
  EXPECT_EQ(at->layers[0].stats.mean, std::vector<double>{0.5});
  EXPECT_TRUE(at->layers[0].frozen);

  Restart();
  job = agg_->GetJob("frozen");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->committed_step, 2);
  absl::StatusOr<RunningStatsSnapshot> now =
      agg_->GetRunningStats("frozen", {0}, 0);
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(now->layers[0].frozen);

  // Unfrozen: layer 0 runs step 3 with layer 1, and holds the job again.
  for (int layer = 0; layer < 2; ++layer) {
    for (int rank = 0; rank < 2; ++rank) {
      Contribution c = Forward("frozen", 3, rank, Batch(2, rank, 2));
      c.layer = layer;
      auto o = Send(std::move(c));
      if (rank == 1) {
        ASSERT_TRUE(o->status.ok()) << o->status;
      }
    }
  }
  now = agg_->GetRunningStats("frozen", {0}, 0);
  ASSERT_TRUE(now.ok());
  EXPECT_FALSE(now->layers[0].frozen);
  EXPECT_EQ(now->layers[0].stats.num_batches_tracked, 4);
  EXPECT_EQ(now->committed_step, 3);
  Contribution c = Forward("frozen", 4, 0, Batch(2, 0, 2));
  c.layer = 1;
  Send(std::move(c));
  Send(Forward("frozen", 4, 1, Batch(2, 1, 2)));  // layer 0, one rank
  c = Forward("frozen", 4, 1, Batch(2, 1, 2));
  c.layer = 1;
  Send(std::move(c));
  job = agg_->GetJob("frozen");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->committed_step, 3);  // layer 0's step 4 waits for rank 0
}

}  // namespace
}  // namespace syncnorm
