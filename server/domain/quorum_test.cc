// The quorum policy and the round observer: rounds that complete with the
// ranks present after a grace period, what late ranks get, what survives a
// restart, and the reports of stragglers and deadlines.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/domain/outcome_recorder.h"
#include "server/domain/round_observer.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"
#include "server/store/state_codec.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Records every report.
class RecordingObserver final : public RoundObserver {
 public:
  void OnRoundCompleted(const RoundReport& r) override {
    absl::MutexLock lock(&mu_);
    completed_.push_back(r);
  }
  void OnDeadline(const RoundReport& r) override {
    absl::MutexLock lock(&mu_);
    deadlines_.push_back(r);
  }
  std::vector<RoundReport> completed() const {
    absl::MutexLock lock(&mu_);
    return completed_;
  }
  std::vector<RoundReport> deadlines() const {
    absl::MutexLock lock(&mu_);
    return deadlines_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<RoundReport> completed_ ABSL_GUARDED_BY(mu_);
  std::vector<RoundReport> deadlines_ ABSL_GUARDED_BY(mu_);
};

JobSpec QuorumSpec(const std::string& id, int world, int group, int min_ranks,
                   absl::Duration grace) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.group_size = group;
  s.round_timeout = absl::Seconds(5);
  LayerConfig l;
  l.name = "bn";
  l.channels = 1;
  s.layers = {l};
  s.quorum.min_ranks = min_ranks;
  s.quorum.grace = grace;
  return s;
}

Contribution Forward(const std::string& job, int64_t step, int rank, double x) {
  Contribution c;
  c.job_id = job;
  c.layer = 0;
  c.step = step;
  c.phase = Phase::kForward;
  c.rank = rank;
  Moments m = Moments::Zero(1);
  m.count = 2;
  m.mean[0] = x;
  m.m2[0] = 0.5;
  c.payload = m;
  return c;
}

class QuorumTest : public ::testing::Test {
 protected:
  QuorumTest()
      : store_(std::make_unique<MemoryEngine>()),
        agg_(Options(), &clock_, &store_) {}

  AggregatorOptions Options() {
    AggregatorOptions o;
    o.observer = &observer_;
    o.straggler_threshold = absl::Milliseconds(300);
    return o;
  }

  FakeClock clock_;
  RecordingObserver observer_;
  KvStateStore store_;
  Aggregator agg_;
};

TEST_F(QuorumTest, CompletesWithThePresentRanksAfterTheGracePeriod) {
  ASSERT_TRUE(agg_.CreateJob(QuorumSpec("q", 4, 0, 3, absl::Seconds(1))).ok());
  OutcomeRecorder out(4);
  agg_.Contribute(Forward("q", 0, 2, 3.0), out.Slot(2));
  agg_.Contribute(Forward("q", 0, 0, 1.0), out.Slot(0));
  clock_.Advance(absl::Milliseconds(400));
  agg_.Contribute(Forward("q", 0, 1, 2.0), out.Slot(1));
  // Three ranks present, but the grace period runs on.
  clock_.Advance(absl::Milliseconds(599));
  agg_.ExpireRounds(clock_.Now());
  EXPECT_EQ(out.calls(0), 0);
  clock_.Advance(absl::Milliseconds(1));
  agg_.ExpireRounds(clock_.Now());
  for (int r : {0, 1, 2}) {
    ASSERT_EQ(out.calls(r), 1) << r;
    const RoundOutcome o = out.get(r);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_THAT(o.missing_ranks, ElementsAre(3));
    EXPECT_EQ(o.moments.count, 6);
    // Ranks 0, 1, 2 merged in rank order: mean 2, M2 = 1.5 + 2 * (1 + 0 + 1).
    EXPECT_DOUBLE_EQ(o.moments.mean[0], 2.0);
    EXPECT_DOUBLE_EQ(o.moments.var[0], 5.5 / 6);
    EXPECT_EQ(o.version, 1);
  }
  // The late rank gets the same result, told that it was not counted.
  OutcomeRecorder late(1);
  agg_.Contribute(Forward("q", 0, 3, 9.0), late.Slot(0));
  ASSERT_EQ(late.calls(0), 1);
  EXPECT_TRUE(late.get(0).status.ok());
  EXPECT_THAT(late.get(0).missing_ranks, ElementsAre(3));
  EXPECT_EQ(late.get(0).moments.mean, out.get(0).moments.mean);
  // Applied exactly once, from the present ranks.
  auto stats = agg_.GetRunningStats("q", {0}, 0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->layers[0].stats.num_batches_tracked, 1);
  EXPECT_DOUBLE_EQ(stats->layers[0].stats.mean[0], 0.1 * 2.0);
  // Reported as a quorum round, rank 1 a straggler.
  ASSERT_EQ(observer_.completed().size(), 1u);
  const RoundReport r = observer_.completed()[0];
  EXPECT_TRUE(r.quorum);
  EXPECT_THAT(r.contributors, ElementsAre(0, 1, 2));
  EXPECT_THAT(r.missing_ranks, ElementsAre(3));
  EXPECT_THAT(r.stragglers, ElementsAre(1));
  EXPECT_EQ(r.latency, absl::Seconds(1));
  EXPECT_EQ(r.last_arrival, absl::Milliseconds(400));
  EXPECT_THAT(LoggingRoundObserver::Line("quorum", r),
              HasSubstr("event=quorum job=q group=0 layer=0 step=0 "
                        "phase=FORWARD latency_ms=1000"));
}

TEST_F(QuorumTest, AllRanksBeforeTheGracePeriodIsAnOrdinaryRound) {
  ASSERT_TRUE(
      agg_.CreateJob(QuorumSpec("all", 3, 0, 2, absl::Seconds(1))).ok());
  OutcomeRecorder out(3);
  for (int r = 0; r < 3; ++r)
    agg_.Contribute(Forward("all", 0, r, r), out.Slot(r));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_TRUE(out.get(0).status.ok());
  EXPECT_THAT(out.get(0).missing_ranks, IsEmpty());
  EXPECT_FALSE(observer_.completed()[0].quorum);
  EXPECT_THAT(observer_.completed()[0].stragglers, IsEmpty());
}

TEST_F(QuorumTest, TooFewRanksWaitForTheDeadline) {
  ASSERT_TRUE(
      agg_.CreateJob(QuorumSpec("few", 4, 2, 2, absl::Seconds(1))).ok());
  OutcomeRecorder out(2);
  // Group 1 (ranks 2, 3) has one rank: no quorum, the deadline fails it.
  agg_.Contribute(Forward("few", 0, 2, 1.0), out.Slot(0));
  // Group 0 reaches its quorum of 2 only with both ranks: complete at once.
  agg_.Contribute(Forward("few", 0, 0, 1.0), out.Slot(1));
  clock_.Advance(absl::Seconds(2));
  agg_.ExpireRounds(clock_.Now());
  EXPECT_EQ(out.calls(0), 0);
  EXPECT_EQ(out.calls(1), 0);
  clock_.Advance(absl::Seconds(3));
  agg_.ExpireRounds(clock_.Now());
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(out.get(0).missing_ranks, ElementsAre(3));
  ASSERT_EQ(observer_.deadlines().size(), 2u);
  EXPECT_THAT(observer_.deadlines()[0].missing_ranks, ElementsAre(1));
  EXPECT_THAT(observer_.deadlines()[1].missing_ranks, ElementsAre(3));
  EXPECT_THAT(LoggingRoundObserver::Line("deadline", observer_.deadlines()[1]),
              HasSubstr("missing=[3] status=DEADLINE_EXCEEDED"));
}

TEST_F(QuorumTest, ZeroGraceCompletesOnTheArrivalThatMakesTheQuorum) {
  ASSERT_TRUE(
      agg_.CreateJob(QuorumSpec("zero", 3, 0, 2, absl::ZeroDuration())).ok());
  OutcomeRecorder out(2);
  agg_.Contribute(Forward("zero", 5, 1, 1.0), out.Slot(0));
  EXPECT_EQ(out.calls(0), 0);
  agg_.Contribute(Forward("zero", 5, 2, 3.0), out.Slot(1));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_TRUE(out.get(0).status.ok());
  EXPECT_THAT(out.get(0).missing_ranks, ElementsAre(0));
}

TEST_F(QuorumTest, ARelaysRoundAgeMovesTheGraceAndTheDeadlineBack) {
  // Quorum 2 of 3, 1 s of grace, a 5 s timeout. A relay's contribution
  // says its round began 700 ms before it sent: the grace ends 300 ms
  // after it arrived, not 1 s.
  ASSERT_TRUE(
      agg_.CreateJob(QuorumSpec("aged", 3, 0, 2, absl::Seconds(1))).ok());
  OutcomeRecorder out(2);
  Contribution relayed = Forward("aged", 0, 0, 1.0);
  relayed.round_age = absl::Milliseconds(700);
  agg_.Contribute(std::move(relayed), out.Slot(0));
  agg_.Contribute(Forward("aged", 0, 1, 2.0), out.Slot(1));
  clock_.Advance(absl::Milliseconds(299));
  agg_.ExpireRounds(clock_.Now());
  EXPECT_EQ(out.calls(0), 0);
  clock_.Advance(absl::Milliseconds(1));
  agg_.ExpireRounds(clock_.Now());
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_TRUE(out.get(0).status.ok()) << out.get(0).status;
  EXPECT_THAT(out.get(0).missing_ranks, ElementsAre(2));
  // The round's latency counts from where it began.
  ASSERT_EQ(observer_.completed().size(), 1u);
  EXPECT_EQ(observer_.completed()[0].latency, absl::Milliseconds(1000));

  // Without a quorum: an age of 4.5 s leaves 500 ms of the 5 s timeout;
  // an age past the timeout counts as the timeout.
  OutcomeRecorder late(2);
  Contribution old = Forward("aged", 1, 0, 1.0);
  old.round_age = absl::Milliseconds(4500);
  agg_.Contribute(std::move(old), late.Slot(0));
  clock_.Advance(absl::Milliseconds(499));
  agg_.ExpireRounds(clock_.Now());
  EXPECT_EQ(late.calls(0), 0);
  clock_.Advance(absl::Milliseconds(1));
  agg_.ExpireRounds(clock_.Now());
  ASSERT_EQ(late.calls(0), 1);
  EXPECT_EQ(late.get(0).status.code(), absl::StatusCode::kDeadlineExceeded);
  Contribution older = Forward("aged", 2, 0, 1.0);
  older.round_age = absl::Hours(1);
  agg_.Contribute(std::move(older), late.Slot(1));
  EXPECT_EQ(late.calls(1), 0);  // the timeout back: its deadline is now
  agg_.ExpireRounds(clock_.Now());
  ASSERT_EQ(late.calls(1), 1);
  EXPECT_EQ(late.get(1).status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(QuorumTest, ANegativeRoundAgeIsRefused) {
  ASSERT_TRUE(
      agg_.CreateJob(QuorumSpec("neg", 2, 0, 0, absl::ZeroDuration())).ok());
  OutcomeRecorder out(1);
  Contribution c = Forward("neg", 0, 0, 1.0);
  c.round_age = absl::Milliseconds(-5);
  agg_.Contribute(std::move(c), out.Slot(0));
  ASSERT_EQ(out.calls(0), 1);
  EXPECT_EQ(out.get(0).status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.get(0).status.message(), HasSubstr("round_age_ms -5"));
}

TEST_F(QuorumTest, QuorumAndItsResultSurviveARestart) {
  const JobSpec spec = QuorumSpec("durable", 3, 0, 2, absl::Milliseconds(200));
  ASSERT_TRUE(agg_.CreateJob(spec).ok());
  OutcomeRecorder out(2);
  agg_.Contribute(Forward("durable", 0, 0, 1.0), out.Slot(0));
  agg_.Contribute(Forward("durable", 0, 1, 2.0), out.Slot(1));
  clock_.Advance(absl::Milliseconds(200));
  agg_.ExpireRounds(clock_.Now());
  ASSERT_EQ(out.calls(0), 1);
  // A second aggregator on the same store, as after a restart.
  Aggregator again(Options(), &clock_, &store_);
  ASSERT_TRUE(again.Load().ok());
  auto job = again.GetJob("durable");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->spec.quorum.min_ranks, 2);
  EXPECT_EQ(job->spec.quorum.grace, absl::Milliseconds(200));
  OutcomeRecorder late(2);
  again.Contribute(Forward("durable", 0, 2, 7.0), late.Slot(0));
  again.Contribute(Forward("durable", 0, 0, 1.0), late.Slot(1));
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(late.calls(i), 1);
    EXPECT_TRUE(late.get(i).status.ok());
    EXPECT_THAT(late.get(i).missing_ranks, ElementsAre(2));
    EXPECT_EQ(late.get(i).moments.mean, out.get(0).moments.mean);
    EXPECT_EQ(late.get(i).version, 1);
  }
  // The job record round-trips through the codec with its quorum.
  auto decoded = DecodeJob(EncodeJob(job->spec));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == job->spec);
}

TEST(StragglerTest, AroundCompletedLateIsReportedWithItsLastRanks) {
  FakeClock clock;
  RecordingObserver observer;
  AggregatorOptions o;
  o.observer = &observer;
  o.straggler_threshold = absl::Milliseconds(100);
  KvStateStore store(std::make_unique<MemoryEngine>());
  Aggregator agg(o, &clock, &store);
  ASSERT_TRUE(
      agg.CreateJob(QuorumSpec("s", 3, 0, 0, absl::ZeroDuration())).ok());
  OutcomeRecorder out(3);
  agg.Contribute(Forward("s", 1, 0, 1.0), out.Slot(0));
  clock.Advance(absl::Milliseconds(150));
  agg.Contribute(Forward("s", 1, 2, 1.0), out.Slot(2));
  clock.Advance(absl::Milliseconds(250));
  agg.Contribute(Forward("s", 1, 1, 1.0), out.Slot(1));
  ASSERT_EQ(observer.completed().size(), 1u);
  const RoundReport r = observer.completed()[0];
  EXPECT_FALSE(r.quorum);
  EXPECT_THAT(r.stragglers, ElementsAre(1, 2));
  EXPECT_EQ(r.latency, absl::Milliseconds(400));
  EXPECT_THAT(LoggingRoundObserver::Line("straggler", r),
              HasSubstr("stragglers=[1,2] missing=[]"));
}

}  // namespace
}  // namespace syncnorm
