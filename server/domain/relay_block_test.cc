// A relay's blocks (Contribution::block, docs/relay.md) at the aggregator:
// a relayed round gives the direct round's bits, whatever mix of blocks and
// direct ranks arrives in whatever order; retries through any path are told
// from conflicts by fingerprint; a bad block is refused without harming its
// round; a membership change under a block evicts it whole. Results are
// also checked against a float64 two-pass reference over the ranks' samples.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/aggregator.h"
#include "server/domain/fake_clock.h"
#include "server/domain/job_spec.h"
#include "server/domain/merge_tree.h"
#include "server/domain/outcome_recorder.h"
#include "server/store/kv_state_store.h"
#include "server/store/memory_engine.h"

namespace syncnorm {
namespace {

using ::testing::HasSubstr;

constexpr int kChannels = 3;

std::vector<std::vector<double>> Samples(int rank, int64_t step) {
  std::vector<std::vector<double>> x(kChannels);
  for (int c = 0; c < kChannels; ++c) {
    // Uneven batches: 1 to 4 samples.
    for (int i = 0; i < 1 + (rank + step) % 4; ++i) {
      x[c].push_back(std::sin(0.3 + rank * 5.1 + step * 2.3 + c + i * 0.9) *
                         (2 + rank % 5) +
                     0.5 * c);
    }
  }
  return x;
}

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

GradSums LocalGrads(int rank, int64_t step) {
  GradSums g;
  for (int c = 0; c < kChannels; ++c) {
    g.sum_dy.push_back(std::cos(rank * 1.7 + step + c) * 1e3);
    g.sum_dy_xmu.push_back(std::sin(rank * 0.3 + step * 1.1 + c) / 7);
  }
  return g;
}

Contribution Direct(const std::string& job, int64_t step, Phase phase,
                    int rank) {
  Contribution c;
  c.job_id = job;
  c.step = step;
  c.phase = phase;
  c.rank = rank;
  if (phase == Phase::kForward) {
    c.payload = LocalMoments(rank, step);
  } else {
    c.payload = LocalGrads(rank, step);
  }
  return c;
}

// What a relay sends for the block [first, first + positions) of a group of
// `group` consecutive ranks from 0, every rank of it a member: the block's
// contributions merged in the tree's order (a MergeTree over the block's
// ranks, as the relay merges), with each rank's fingerprint.
Contribution Block(const std::string& job, int64_t step, Phase phase, int first,
                   int positions, int group) {
  RelayBlock b;
  b.first_position = first;
  b.positions = positions;
  for (int r = first; r < std::min(first + positions, group); ++r) {
    b.ranks.push_back(r);
  }
  MergeTree tree(b.ranks);
  for (size_t i = 0; i < b.ranks.size(); ++i) {
    Contribution d = Direct(job, step, phase, b.ranks[i]);
    b.fingerprints.push_back(ContributionFingerprint(d.payload, d.update));
    tree.Add(static_cast<int>(i), std::move(d.payload));
  }
  Contribution c = Direct(job, step, phase, b.ranks.front());
  if (phase == Phase::kForward) {
    c.payload = *tree.MergedMoments(kChannels);
  } else {
    c.payload = tree.SummedGradSums(kChannels);
  }
  c.block = std::move(b);
  return c;
}

void ExpectMergeOf(const RoundOutcome& o, const std::vector<int>& ranks,
                   int64_t step) {
  ASSERT_TRUE(o.status.ok()) << o.status;
  for (int c = 0; c < kChannels; ++c) {
    std::vector<double> all;
    for (int r : ranks) {
      const auto x = Samples(r, step);
      all.insert(all.end(), x[c].begin(), x[c].end());
    }
    ASSERT_EQ(o.moments.count, static_cast<int64_t>(all.size()));
    double sum = 0;
    for (double v : all) sum += v;
    const double mean = sum / all.size();
    double ss = 0;
    for (double v : all) ss += (v - mean) * (v - mean);
    EXPECT_NEAR(o.moments.mean[c], mean, 1e-12) << "channel " << c;
    EXPECT_NEAR(o.moments.var[c], ss / all.size(), 1e-12) << "channel " << c;
  }
}

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](double x, double y) {
           return std::memcmp(&x, &y, sizeof(double)) == 0;
         });
}

JobSpec Spec(const std::string& id, int world) {
  JobSpec s;
  s.job_id = id;
  s.world_size = world;
  s.round_timeout = absl::Seconds(30);
  LayerConfig l;
  l.name = "bn";
  l.channels = kChannels;
  s.layers = {l};
  return s;
}

class RelayBlockTest : public ::testing::Test {
 protected:
  RelayBlockTest()
      : store_(std::make_unique<MemoryEngine>()),
        agg_(AggregatorOptions(), &clock_, &store_) {}

  // Sends `sends` in order, each to its own recorder slot; returns them.
  std::unique_ptr<OutcomeRecorder> Send(std::vector<Contribution> sends) {
    auto out =
        std::make_unique<OutcomeRecorder>(static_cast<int>(sends.size()));
    for (size_t i = 0; i < sends.size(); ++i) {
      agg_.Contribute(std::move(sends[i]), out->Slot(static_cast<int>(i)));
    }
    return out;
  }

  FakeClock clock_;
  KvStateStore store_;
  Aggregator agg_;
};

TEST_F(RelayBlockTest, RelayedRoundsGiveTheDirectBitsInAnyMixAndOrder) {
  // 20 ranks: P = 32, blocks of 8 at 0, 8 and 16 (the last holds 16-19).
  const int w = 20;
  std::vector<int> everyone(w);
  for (int r = 0; r < w; ++r) everyone[r] = r;
  std::mt19937 rng(5);
  for (int64_t step = 0; step < 12; ++step) {
    const std::string direct = "direct" + std::to_string(step);
    const std::string relayed = "relayed" + std::to_string(step);
    ASSERT_TRUE(agg_.CreateJob(Spec(direct, w)).ok());
    ASSERT_TRUE(agg_.CreateJob(Spec(relayed, w)).ok());
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      std::vector<Contribution> d;
      for (int r : everyone) d.push_back(Direct(direct, 0, phase, r));
      std::shuffle(d.begin(), d.end(), rng);
      auto direct_out = Send(std::move(d));
      // Each block of 8 goes whole, as blocks of 4 or 2, or rank by rank;
      // some blocks' ranks also arrive directly (a client that gave up on
      // its relay), before or after the block.
      std::vector<Contribution> r;
      for (int first = 0; first < w; first += 8) {
        const int size = std::vector<int>{8, 4, 2, 1}[rng() % 4];
        for (int sub = first; sub < first + 8 && sub < w; sub += size) {
          if (size == 1) {
            r.push_back(Direct(relayed, 0, phase, sub));
          } else {
            r.push_back(Block(relayed, 0, phase, sub, size, w));
          }
          if (rng() % 4 == 0) r.push_back(Direct(relayed, 0, phase, sub));
        }
      }
      std::shuffle(r.begin(), r.end(), rng);
      const size_t sent = r.size();
      auto relayed_out = Send(std::move(r));
      const RoundOutcome want = direct_out->get(0);
      ASSERT_TRUE(want.status.ok()) << want.status;
      if (phase == Phase::kForward) ExpectMergeOf(want, everyone, 0);
      for (size_t i = 0; i < sent; ++i) {
        ASSERT_EQ(relayed_out->calls(static_cast<int>(i)), 1) << i;
        const RoundOutcome got = relayed_out->get(static_cast<int>(i));
        ASSERT_TRUE(got.status.ok()) << got.status;
        EXPECT_EQ(got.moments.count, want.moments.count);
        EXPECT_TRUE(SameBits(got.moments.mean, want.moments.mean)) << step;
        EXPECT_TRUE(SameBits(got.moments.var, want.moments.var)) << step;
        EXPECT_TRUE(SameBits(got.grad_sums.sum_dy, want.grad_sums.sum_dy));
        EXPECT_TRUE(
            SameBits(got.grad_sums.sum_dy_xmu, want.grad_sums.sum_dy_xmu));
      }
    }
  }
}

TEST_F(RelayBlockTest, RetriesThroughAnyPathAreToldFromConflicts) {
  ASSERT_TRUE(agg_.CreateJob(Spec("j", 8)).ok());
  auto round = Send({Block("j", 0, Phase::kForward, 0, 4, 8),
                     Block("j", 0, Phase::kForward, 4, 4, 8)});
  ASSERT_EQ(round->calls(0), 1);
  const RoundOutcome result = round->get(0);
  ExpectMergeOf(result, {0, 1, 2, 3, 4, 5, 6, 7}, 0);
  // After the round: a merged rank's own retry, the block's retry, and a
  // smaller block inside it all get the round's result.
  Contribution other = Direct("j", 0, Phase::kForward, 6);
  std::get<Moments>(other.payload).mean[1] += 1;
  Contribution bad_block = Block("j", 0, Phase::kForward, 0, 4, 8);
  bad_block.block->fingerprints[2] ^= 1;
  auto retries = Send({Direct("j", 0, Phase::kForward, 2),
                       Block("j", 0, Phase::kForward, 4, 4, 8),
                       Block("j", 0, Phase::kForward, 2, 2, 8), other,
                       std::move(bad_block)});
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(retries->calls(i), 1);
    EXPECT_TRUE(retries->get(i).status.ok()) << i << retries->get(i).status;
    EXPECT_TRUE(SameBits(retries->get(i).moments.mean, result.moments.mean));
  }
  EXPECT_EQ(retries->get(3).status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(retries->get(3).status.message(), HasSubstr("rank 6"));
  EXPECT_EQ(retries->get(4).status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(retries->get(4).status.message(), HasSubstr("rank 2"));

  // While a round is open: a conflicting direct resend of a merged rank is
  // refused, and the round goes on.
  Contribution late = Direct("j", 1, Phase::kForward, 1);
  std::get<Moments>(late.payload).count += 1;
  auto open = Send(
      {Block("j", 1, Phase::kForward, 0, 4, 8), std::move(late),
       Direct("j", 1, Phase::kForward, 4), Direct("j", 1, Phase::kForward, 5),
       Direct("j", 1, Phase::kForward, 6), Direct("j", 1, Phase::kForward, 7)});
  EXPECT_EQ(open->get(1).status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(open->get(1).status.message(), HasSubstr("rank 1"));
  for (int i : {0, 2, 5})
    ExpectMergeOf(open->get(i), {0, 1, 2, 3, 4, 5, 6, 7}, 1);
}

TEST_F(RelayBlockTest, ABadBlockIsRefusedSayingWhyAndItsRoundGoesOn) {
  JobSpec spec = Spec("g", 8);
  spec.group_size = 4;  // groups 0-3 and 4-7
  ASSERT_TRUE(agg_.CreateJob(spec).ok());
  std::vector<Contribution> bad;
  bad.push_back(Block("g", 0, Phase::kForward, 0, 4, 4));
  bad.back().block->positions = 3;  // no power of two
  bad.push_back(Block("g", 0, Phase::kForward, 0, 2, 4));
  bad.back().block->first_position = 1;  // not aligned
  bad.push_back(Block("g", 0, Phase::kForward, 0, 2, 4));
  bad.back().block->ranks = {0, 4};  // rank 4 is in the other group
  bad.push_back(Block("g", 0, Phase::kForward, 0, 2, 4));
  bad.back().block->fingerprints.pop_back();
  bad.push_back(Block("g", 0, Phase::kForward, 0, 2, 4));
  bad.back().block->ranks = {0, 0};
  bad.push_back(Block("g", 0, Phase::kForward, 0, 4, 4));
  bad.back().block->ranks = {0, 1, 3};  // rank 2 left out
  bad.back().block->fingerprints.pop_back();
  auto out = Send(std::move(bad));
  const std::vector<std::string> why = {"not an aligned block",
                                        "not an aligned block",
                                        "not at one of those positions",
                                        "one fingerprint per rank",
                                        "must ascend",
                                        "members at the step are [0-3]"};
  for (size_t i = 0; i < why.size(); ++i) {
    ASSERT_EQ(out->calls(static_cast<int>(i)), 1);
    EXPECT_EQ(out->get(static_cast<int>(i)).status.code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out->get(static_cast<int>(i)).status.message(),
                HasSubstr(why[i]));
  }
  // Nothing of them was kept: the group's ranks complete the round alone.
  auto round = Send({Direct("g", 0, Phase::kForward, 0),
                     Block("g", 0, Phase::kForward, 1, 1, 4),
                     Block("g", 0, Phase::kForward, 2, 2, 4)});
  for (int i = 0; i < 3; ++i) ExpectMergeOf(round->get(i), {0, 1, 2, 3}, 0);

  // A stale-synchronous job's answers differ per rank: no block serves it.
  JobSpec stale = Spec("s", 4);
  stale.staleness = 1;
  ASSERT_TRUE(agg_.CreateJob(stale).ok());
  auto refused = Send({Block("s", 0, Phase::kForward, 0, 4, 4)});
  EXPECT_EQ(refused->get(0).status.code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused->get(0).status.message(),
              HasSubstr("passes its contributions through"));
}

TEST_F(RelayBlockTest, AMembershipChangeUnderABlockEvictsItWhole) {
  ASSERT_TRUE(agg_.CreateJob(Spec("m", 8)).ok());
  auto first = Send({Block("m", 0, Phase::kForward, 0, 4, 8),
                     Direct("m", 0, Phase::kForward, 4)});
  EXPECT_EQ(first->calls(0), 0);
  // Rank 2 dies and is removed from step 0 on: the block cannot drop it
  // from its merge, so it goes whole, and says so.
  MembershipRequest remove;
  remove.step = 0;
  remove.remove = {2};
  ASSERT_TRUE(agg_.UpdateMembership("m", remove).ok());
  ASSERT_EQ(first->calls(0), 1);
  EXPECT_EQ(first->get(0).status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(first->get(0).status.message(),
              HasSubstr("send its ranks' contributions one by one"));
  EXPECT_EQ(first->calls(1), 0);
  // The relay sends the block's members through; rank 2's would be
  // refused. The round is the merge of the seven.
  auto rest = Send({Direct("m", 0, Phase::kForward, 0),
                    Direct("m", 0, Phase::kForward, 1),
                    Direct("m", 0, Phase::kForward, 3),
                    Block("m", 0, Phase::kForward, 6, 2, 8),
                    Direct("m", 0, Phase::kForward, 5)});
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(rest->calls(i), 1) << i;
    ExpectMergeOf(rest->get(i), {0, 1, 3, 4, 5, 6, 7}, 0);
  }
  ExpectMergeOf(first->get(1), {0, 1, 3, 4, 5, 6, 7}, 0);
}

}  // namespace
}  // namespace syncnorm

namespace syncnorm {
namespace {

RankHealth Scored(int rank, int64_t step, double shift, int stuck = -1,
                  int64_t count = 4) {
  RankHealth h;
  h.rank = rank;
  h.step = step;
  h.count = count;
  h.mean_shift = shift;
  h.stuck_channel = stuck;
  return h;
}

// A relay's scores of its ranks ride on the block's next contribution:
// the shard tracks them as its own, a relayed rank is flagged by its rank
// after 3 rounds beyond the threshold and cleared after 3 within, and a
// block's retry counts its scores once.
TEST_F(RelayBlockTest, ARelayedRanksScoresRaiseAndClearItsFlag) {
  ASSERT_TRUE(agg_.CreateJob(Spec("h", 8)).ok());
  const auto flags = [&] { return (*agg_.GetStatsHealth("h", 16))->flags; };
  for (int64_t step = 0; step < 8; ++step) {
    SCOPED_TRACE(step);
    Contribution block = Block("h", step, Phase::kForward, 0, 4, 8);
    if (step > 0) {
      // Rank 2 shifted in steps 0-3, and rank 1's channel 2 stuck (16
      // values stuck a round: flagged after 2 rounds, cleared at once).
      block.block->health = {
          Scored(2, step - 1, step - 1 < 4 ? 9.0 : 0.5),
          Scored(1, step - 1, 0.1, step - 1 < 4 ? 2 : -1, 17),
          Scored(0, step - 1, -0.3)};
    }
    Contribution retry = block;
    auto out =
        Send({std::move(block), Block("h", step, Phase::kForward, 4, 4, 8),
              std::move(retry)});
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(out->get(i).status.ok()) << i << out->get(i).status;
    }
    const std::vector<HealthFlag> f = flags();
    if (step == 3) {
      // Rank 1's channel 2 after steps 0 and 1; rank 2 after steps 0-2.
      ASSERT_EQ(f.size(), 2u);
      EXPECT_EQ(f[0].rank, 1);
      EXPECT_EQ(f[0].kind, HealthKind::kStuckChannel);
      EXPECT_EQ(f[0].channel, 2);
      EXPECT_EQ(f[1].rank, 2);
      EXPECT_EQ(f[1].kind, HealthKind::kMeanShift);
      EXPECT_EQ(f[1].first_step, 0);
      EXPECT_EQ(f[1].last_step, 2);
      EXPECT_EQ(f[1].score, 9.0);
      EXPECT_TRUE(f[1].active);
    }
  }
  // Rank 2 was within the threshold in steps 4, 5 and 6: cleared at 6.
  const std::vector<HealthFlag> f = flags();
  const auto rank2 = std::find_if(f.begin(), f.end(), [](const HealthFlag& x) {
    return x.rank == 2 && x.kind == HealthKind::kMeanShift;
  });
  ASSERT_NE(rank2, f.end());
  EXPECT_FALSE(rank2->active);
  EXPECT_EQ(rank2->cleared_step, 6);
  EXPECT_EQ((*agg_.GetStatsHealth("h", 16))->flags_in_force, 0);
}

TEST_F(RelayBlockTest, BadHealthEntriesAreRefusedNamingThem) {
  ASSERT_TRUE(agg_.CreateJob(Spec("b", 8)).ok());
  auto zero = Send({Block("b", 0, Phase::kForward, 0, 4, 8),
                    Block("b", 0, Phase::kForward, 4, 4, 8)});
  ASSERT_TRUE(zero->get(0).status.ok());
  struct Case {
    std::vector<RankHealth> health;
    std::string why;
  };
  std::vector<Case> cases = {
      {{Scored(5, 0, 9)}, "entry 0 (rank 5, step 0) names a rank the block"},
      {{Scored(1, 0, 9), Scored(2, 1, 9)},
       "entry 1 (rank 2, step 1) is of a step that is not before this "
       "contribution's (1, FORWARD)"},
      {{Scored(1, -1, 9)}, "(rank 1, step -1) is of a step"},
      {{Scored(1, 0, 9, -1, 0)}, "has a count of 0"},
      {{Scored(1, 0, 9, 3)}, "names stuck channel 3 of a layer of 3 channels"},
      {{Scored(1, 0, 9), Scored(1, 0, 8)}, "rank 1's health of step 0 twice"},
      {std::vector<RankHealth>(17, Scored(0, 0, 9)),
       "carries 17 health entries for its 4 ranks; at most 4 per rank"},
  };
  for (const Case& c : cases) {
    Contribution block = Block("b", 1, Phase::kForward, 0, 4, 8);
    block.block->health = c.health;
    auto out = Send({std::move(block)});
    ASSERT_EQ(out->calls(0), 1) << c.why;
    EXPECT_EQ(out->get(0).status.code(), absl::StatusCode::kInvalidArgument)
        << c.why;
    EXPECT_THAT(out->get(0).status.message(), HasSubstr(c.why));
  }
  // A BACKWARD carries its own step's scores; the round went on.
  Contribution block = Block("b", 1, Phase::kForward, 0, 4, 8);
  auto one = Send({std::move(block), Block("b", 1, Phase::kForward, 4, 4, 8)});
  ASSERT_TRUE(one->get(0).status.ok()) << one->get(0).status;
  Contribution backward = Block("b", 1, Phase::kBackward, 0, 4, 8);
  backward.block->health = {Scored(3, 1, 9), Scored(3, 0, 9)};
  auto back =
      Send({std::move(backward), Block("b", 1, Phase::kBackward, 4, 4, 8)});
  EXPECT_TRUE(back->get(0).status.ok()) << back->get(0).status;
  EXPECT_EQ((*agg_.GetStatsHealth("b", 16))->flags_in_force, 0);
}

}  // namespace
}  // namespace syncnorm
