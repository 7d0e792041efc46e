// Elastic membership: rounds wait for the members in force at their step;
// joins, graceful leaves and removals of dead ranks; what survives a
// restart and what a checkpoint restore puts back. Every merged result is
// checked against a float64 two-pass reference over the samples of the
// ranks counted.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/domain/membership.h"
#include "server/domain/outcome_recorder.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kChannels = 2;

// The local batch of (rank, step): 3 samples per channel, distinct for
// every rank and step.
std::vector<std::vector<double>> Samples(int rank, int64_t step) {
  std::vector<std::vector<double>> x(kChannels);
  for (int c = 0; c < kChannels; ++c) {
    for (int i = 0; i < 3; ++i) {
      x[c].push_back(std::sin(1.0 + rank * 7.3 + step * 3.1 + c * 0.7 + i) *
                         (1 + rank) +
                     0.25 * step);
    }
  }
  return x;
}

// What a client sends for that batch: count, mean and M2, two-pass.
Moments LocalMoments(int rank, int64_t step) {
  const auto x = Samples(rank, step);
  Moments m = Moments::Zero(kChannels);
  m.count = static_cast<int64_t>(x[0].size());
  for (int c = 0; c < kChannels; ++c) {
    double sum = 0;
    for (double v : x[c]) sum += v;
    m.mean[c] = sum / x[c].size();
    for (double v : x[c]) m.m2[c] += (v - m.mean[c]) * (v - m.mean[c]);
  }
  return m;
}

// The reference: mean and biased var of the concatenated batches of
// `ranks` at `step`, two-pass in float64.
void ExpectMergeOf(const RoundOutcome& o, std::vector<int> ranks,
                   int64_t step) {
  ASSERT_TRUE(o.status.ok()) << o.status;
  ASSERT_EQ(o.moments.count, 3 * static_cast<int64_t>(ranks.size()));
  for (int c = 0; c < kChannels; ++c) {
    std::vector<double> all;
    for (int r : ranks) {
      const std::vector<std::vector<double>> x = Samples(r, step);
      all.insert(all.end(), x[c].begin(), x[c].end());
    }
    double sum = 0;
    for (double v : all) sum += v;
    const double mean = sum / all.size();
    double ss = 0;
    for (double v : all) ss += (v - mean) * (v - mean);
    EXPECT_NEAR(o.moments.mean[c], mean, 1e-12) << "channel " << c;
    EXPECT_NEAR(o.moments.var[c], ss / all.size(), 1e-12) << "channel " << c;
  }
}

Contribution Forward(const std::string& job, int64_t step, int rank) {
  Contribution c;
  c.job_id = job;
  c.layer = 0;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  c.payload = LocalMoments(rank, step);
  return c;
}

Contribution Backward(const std::string& job, int64_t step, int rank) {
  Contribution c = Forward(job, step, rank);
  c.phase = Phase::kBackward;
  GradSums g;
  g.sum_dy.assign(kChannels, 1.0 + rank);
  g.sum_dy_xmu.assign(kChannels, 0.5 * rank);
  c.payload = g;
  return c;
}

JobSpec Spec(const std::string& id, int world, std::vector<int> members,
             int group_size = 0) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.group_size = group_size;
  s.round_timeout = absl::Seconds(30);
  LayerConfig l;
  l.name = "bn";
  l.channels = kChannels;
  s.layers = {l};
  s.members = std::move(members);
  return s;
}

MembershipRequest Change(int64_t step, std::vector<int> join,
                         std::vector<int> leave = {},
                         std::vector<int> remove = {}) {
  MembershipRequest r;
  r.step = step;
  r.join = std::move(join);
  r.leave = std::move(leave);
  r.remove = std::move(remove);
  return r;
}

class ElasticTest : public ::testing::Test {
 protected:
  ElasticTest()
      : store_(std::make_unique<MemoryEngine>()),
        agg_(AggregatorOptions(), &clock_, &store_) {}

  // Every rank of `ranks` sends its forward of `step`; expects the merge.
  void Step(const std::string& job, int64_t step, std::vector<int> ranks) {
    OutcomeRecorder out(static_cast<int>(ranks.size()));
    for (size_t i = 0; i < ranks.size(); ++i) {
      agg_.Contribute(Forward(job, step, ranks[i]), out.Slot(i));
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      ASSERT_EQ(out.calls(i), 1) << "rank " << ranks[i] << ", step " << step;
      ExpectMergeOf(out.get(i), ranks, step);
    }
  }

  FakeClock clock_;
  KvStateStore store_;
  Aggregator agg_;
};

TEST_F(ElasticTest, ARoundWaitsForTheMembersInForceAtItsStep) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 6, {0, 2, 4})).ok());
  Step("e", 0, {0, 2, 4});
  OutcomeRecorder out(1);
  agg_.Contribute(Forward("e", 1, 1), out.Slot(0));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.get(0).status.message(), HasSubstr("rank 1 is not a member"));
  auto job = agg_.GetJob("e");
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->membership.size(), 1u);
  EXPECT_THAT(job->membership[0].members, ElementsAre(0, 2, 4));
  EXPECT_EQ(job->next_step, 1);
  EXPECT_EQ(job->committed_step, 0);
}

TEST_F(ElasticTest, AJoiningRankIsWaitedForFromTheNextStep) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 8, {0, 1})).ok());
  Step("e", 0, {0, 1});
  // Rank 0 is already at step 1 when rank 2 joins.
  OutcomeRecorder out(3);
  agg_.Contribute(Forward("e", 1, 0), out.Slot(0));
  auto joined = agg_.UpdateMembership("e", Change(0, {2}));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->membership.back().step, 1);
  EXPECT_EQ(joined->membership.back().version, 1);
  EXPECT_THAT(joined->membership.back().joined, ElementsAre(2));
  agg_.Contribute(Forward("e", 1, 1), out.Slot(1));
  EXPECT_EQ(out.calls(0), 0);  // it waits for the newcomer too
  agg_.Contribute(Forward("e", 1, 2), out.Slot(2));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(out.calls(i), 1);
    ExpectMergeOf(out.get(i), {0, 1, 2}, 1);
  }
  // A retry of the join changes nothing.
  auto again = agg_.UpdateMembership("e", Change(0, {2}));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->membership.back().version, 1);
  // A change for a step some layer completed is refused, naming the next.
  const absl::Status early =
      agg_.UpdateMembership("e", Change(1, {}, {0})).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("name step 2 or later"));
}

TEST_F(ElasticTest, AGracefulLeaveStopsTheRoundsFromItsStepWaiting) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 3, {})).ok());
  Step("e", 0, {0, 1, 2});
  OutcomeRecorder early(1);
  agg_.Contribute(Forward("e", 1, 0), early.Slot(0));
  // Rank 2 leaves from step 2: step 1 still waits for it.
  ASSERT_TRUE(agg_.UpdateMembership("e", Change(2, {}, {2})).ok());
  EXPECT_EQ(early.calls(0), 0);
  OutcomeRecorder rest(2);
  agg_.Contribute(Forward("e", 1, 1), rest.Slot(0));
  agg_.Contribute(Forward("e", 1, 2), rest.Slot(1));
  ASSERT_EQ(early.calls(0), 1);
  ExpectMergeOf(early.get(0), {0, 1, 2}, 1);
  Step("e", 2, {0, 1});
  OutcomeRecorder gone(1);
  agg_.Contribute(Forward("e", 3, 2), gone.Slot(0));
  EXPECT_EQ(gone.get(0).status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ElasticTest, ALeavingRanksContributionFromItsStepOnIsDropped) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 3, {})).ok());
  OutcomeRecorder out(3);
  agg_.Contribute(Forward("e", 0, 2), out.Slot(2));
  agg_.Contribute(Forward("e", 0, 0), out.Slot(0));
  ASSERT_TRUE(agg_.UpdateMembership("e", Change(0, {}, {2})).ok());
  ASSERT_EQ(out.calls(2), 1);
  EXPECT_EQ(out.get(2).status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out.get(2).status.message(), HasSubstr("was dropped"));
  EXPECT_EQ(out.calls(0), 0);
  agg_.Contribute(Forward("e", 0, 1), out.Slot(1));
  ASSERT_EQ(out.calls(0), 1);
  ExpectMergeOf(out.get(0), {0, 1}, 0);
  EXPECT_THAT(out.get(0).missing_ranks, IsEmpty());
}

TEST_F(ElasticTest, RemovingADeadRankCompletesTheRoundsWaitingForIt) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 3, {})).ok());
  Step("e", 0, {0, 1, 2});
  // Rank 2 dies during step 0's backward; the others go on to step 1.
  OutcomeRecorder back(2);
  agg_.Contribute(Backward("e", 0, 0), back.Slot(0));
  agg_.Contribute(Backward("e", 0, 1), back.Slot(1));
  OutcomeRecorder fwd(2);
  agg_.Contribute(Forward("e", 1, 0), fwd.Slot(0));
  agg_.Contribute(Forward("e", 1, 1), fwd.Slot(1));
  EXPECT_EQ(back.calls(0), 0);
  EXPECT_EQ(fwd.calls(0), 0);
  auto removed = agg_.UpdateMembership("e", Change(0, {}, {}, {2}));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->membership.back().step, 1);
  EXPECT_THAT(removed->membership.back().removed, ElementsAre(2));
  // Step 0's backward completes without it, naming it ...
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(back.calls(i), 1);
    const RoundOutcome o = back.get(i);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_THAT(o.missing_ranks, ElementsAre(2));
    for (int c = 0; c < kChannels; ++c) {
      EXPECT_EQ(o.grad_sums.sum_dy[c], 1.0 + 2.0);  // ranks 0 and 1
      EXPECT_EQ(o.grad_sums.sum_dy_xmu[c], 0.5);
    }
  }
  // ... and step 1, from which it is no member, never waited for it.
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(fwd.calls(i), 1);
    ExpectMergeOf(fwd.get(i), {0, 1}, 1);
    EXPECT_THAT(fwd.get(i).missing_ranks, IsEmpty());
  }
  // Were it alive after all, its backward of step 0 gets that result.
  OutcomeRecorder late(1);
  agg_.Contribute(Backward("e", 0, 2), late.Slot(0));
  ASSERT_EQ(late.calls(0), 1);
  EXPECT_TRUE(late.get(0).status.ok());
  EXPECT_THAT(late.get(0).missing_ranks, ElementsAre(2));
}

TEST_F(ElasticTest, TheMembershipSurvivesARestart) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 4, {0, 1, 2})).ok());
  Step("e", 0, {0, 1, 2});
  ASSERT_TRUE(agg_.UpdateMembership("e", Change(0, {3}, {0})).ok());
  Aggregator again(AggregatorOptions(), &clock_, &store_);
  ASSERT_TRUE(again.Load().ok());
  auto job = again.GetJob("e");
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->membership.size(), 2u);
  EXPECT_THAT(job->membership[0].members, ElementsAre(0, 1, 2));
  EXPECT_THAT(job->membership[1].members, ElementsAre(1, 2, 3));
  EXPECT_EQ(job->membership[1].step, 1);
  EXPECT_THAT(job->spec.members, ElementsAre(0, 1, 2));
  OutcomeRecorder out(4);
  again.Contribute(Forward("e", 1, 0), out.Slot(0));
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kFailedPrecondition);
  for (int r : {1, 2, 3}) again.Contribute(Forward("e", 1, r), out.Slot(r));
  for (int r : {1, 2, 3}) ExpectMergeOf(out.get(r), {1, 2, 3}, 1);
}

TEST_F(ElasticTest, ARestorePutsTheCheckpointsMembersBack) {
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 3, {0, 1})).ok());
  Step("e", 0, {0, 1});
  absl::Notification cut;
  agg_.Checkpoint("e", 0, "", clock_.Now() + absl::Seconds(1),
                  [&](const absl::StatusOr<CheckpointMeta>& m) {
                    ASSERT_TRUE(m.ok()) << m.status();
                    ASSERT_TRUE(m->members.has_value());
                    EXPECT_THAT(*m->members, ElementsAre(0, 1));
                    cut.Notify();
                  });
  ASSERT_TRUE(cut.HasBeenNotified());
  ASSERT_TRUE(agg_.UpdateMembership("e", Change(0, {2})).ok());
  Step("e", 1, {0, 1, 2});
  auto restored = agg_.RestoreCheckpoint("e", 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const MembershipChange& latest = restored->membership.back();
  EXPECT_TRUE(latest.restored);
  EXPECT_EQ(latest.step, 1);
  EXPECT_EQ(latest.version, 2);
  EXPECT_THAT(latest.members, ElementsAre(0, 1));
  OutcomeRecorder out(1);
  agg_.Contribute(Forward("e", 1, 2), out.Slot(0));
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kFailedPrecondition);
  Step("e", 1, {0, 1});
}

TEST_F(ElasticTest, AGroupWhoseRanksAllLeftHoldsNothingBack) {
  // Groups {0, 1} and {2, 3}; the second one's ranks both leave.
  ASSERT_TRUE(agg_.CreateJob(Spec("e", 4, {}, 2)).ok());
  Step("e", 0, {0, 1});
  Step("e", 0, {2, 3});
  auto before = agg_.GetRunningStats("e", {}, 1);
  ASSERT_TRUE(before.ok());
  ASSERT_TRUE(agg_.UpdateMembership("e", Change(0, {}, {2, 3})).ok());
  Step("e", 1, {0, 1});
  Step("e", 2, {0, 1});
  auto job = agg_.GetJob("e");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->committed_step, 2);
  // Its statistics stay as they were.
  auto after = agg_.GetRunningStats("e", {}, 1);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->layers[0].stats.mean, before->layers[0].stats.mean);
  EXPECT_EQ(after->layers[0].stats.num_batches_tracked, 1);
}

// Job W=65536: 61 changes, alternately every rank but 0 leaving and
// joining back (issue 32). Each change logs a line of the same small size,
// stores a membership record that grows by a few bytes per change and not
// by the ranks it names, and leaves the members an independent model
// holds; the history reads back as it was after a restart.
TEST_F(ElasticTest, AWideChangeLogsABoundedLineAndStoresWhatItChanges) {
  constexpr int kWorld = 65536;
  constexpr int kChanges = 61;  // 62 versions: below Membership::kMaxHistory
  auto engine = std::make_unique<MemoryEngine>();
  MemoryEngine& kv = *engine;
  KvStateStore store(std::move(engine));
  Aggregator agg(AggregatorOptions(), &clock_, &store);
  ASSERT_TRUE(agg.CreateJob(Spec("wide", kWorld, {})).ok());
  std::vector<int> others;  // 1..65535
  for (int r = 1; r < kWorld; ++r) others.push_back(r);
  std::vector<bool> model(kWorld, true);
  size_t record_bytes = 0;
  for (int i = 0; i < kChanges; ++i) {
    const bool leave = i % 2 == 0;
    for (int r : others) model[r] = !leave;
    ::testing::internal::CaptureStderr();
    auto job = agg.UpdateMembership(
        "wide", leave ? Change(0, {}, others) : Change(0, others));
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(job.ok()) << job.status();

    std::vector<int> expected;
    for (int r = 0; r < kWorld; ++r) {
      if (model[r]) expected.push_back(r);
    }
    ASSERT_EQ(job->membership.back().members.ranks(), expected)
        << "change " << i;
    ASSERT_EQ(job->membership.back().version, i + 1);

    ASSERT_TRUE(absl::StrContains(log, "event=membership_changed")) << log;
    EXPECT_LE(log.size(), 512u) << log.substr(0, 300);
    EXPECT_THAT(log, HasSubstr(leave ? "left=[1-65535]" : "joined=[1-65535]"));

    absl::StatusOr<std::optional<std::string>> record = kv.Get("e/wide");
    ASSERT_TRUE(record.ok() && record->has_value());
    // What a change adds to the record: its version, step and runs.
    EXPECT_LE((*record)->size(), record_bytes + 32) << "change " << i;
    record_bytes = (*record)->size();
  }
  EXPECT_LE(record_bytes, 2048u);
  RecordProperty("membership_record_bytes", static_cast<int>(record_bytes));

  // Rank 0 alone is the job now.
  OutcomeRecorder out(1);
  agg.Contribute(Forward("wide", 0, 0), out.Slot(0));
  ASSERT_EQ(out.calls(0), 1);
  ExpectMergeOf(out.get(0), {0}, 0);

  Aggregator again(AggregatorOptions(), &clock_, &store);
  ASSERT_TRUE(again.Load().ok());
  auto before = agg.GetJob("wide");
  auto after = again.GetJob("wide");
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_EQ(after->membership, before->membership);
}

// Torch's Join at the end of an epoch on a wide job: 200 of 256 ranks run
// out at one step and each leaves on its own (client/python's leave()).
// Every leave is taken (the 64th was RESOURCE_EXHAUSTED: one kept change
// each), the round of that step waits only for the 56 that stayed, and
// each leave logs the rank it named.
TEST_F(ElasticTest, HundredsOfRanksLeavingAtOneStepEachLeave) {
  constexpr int kWorld = 256;
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(AggregatorOptions(), &clock_, &store);
  ASSERT_TRUE(agg.CreateJob(Spec("epoch", kWorld, {})).ok());
  OutcomeRecorder first(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    agg.Contribute(Forward("epoch", 0, r), first.Slot(r));
  }
  for (int r = 56; r < kWorld; ++r) {
    ::testing::internal::CaptureStderr();
    auto job = agg.UpdateMembership("epoch", Change(1, {}, {r}));
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(job.ok()) << "rank " << r << ": " << job.status();
    EXPECT_THAT(log, HasSubstr(absl::StrCat("left=[", r, "]"))) << log;
    EXPECT_EQ(job->membership.back().version, r - 55);
  }
  auto job = agg.GetJob("epoch");
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->membership.size(), 2u) << "version 0 and the step-1 change";
  std::vector<int> stayed(56);
  for (int r = 0; r < 56; ++r) stayed[r] = r;
  EXPECT_EQ(job->membership.back().members.ranks(), stayed);
  OutcomeRecorder second(56);
  for (int r = 0; r < 56; ++r) {
    agg.Contribute(Forward("epoch", 1, r), second.Slot(r));
  }
  for (int r = 0; r < 56; ++r) {
    ASSERT_EQ(second.calls(r), 1) << "rank " << r;
  }
  ExpectMergeOf(second.get(0), stayed, 1);
}

}  // namespace
}  // namespace syncnorm
