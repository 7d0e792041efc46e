// The round and layer records written by hand (EncodeRound, EncodeLayer)
// against protobuf's own serialization of the same messages, and read back
// by DecodeRound and DecodeLayer.
#include "server/store/state_codec.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/store/state.pb.h"

namespace syncnorm {
namespace {

namespace pb = ::syncnorm::storage;

// What EncodeRound wrote before it wrote the bytes itself: every field
// through the generated message.
std::string ThroughProtobuf(const StoredRound& round) {
  pb::RoundRecord p;
  p.set_format(kStateFormat);
  p.set_phase(static_cast<int>(round.phase));
  p.set_step(round.step);
  p.set_version(round.outcome.version);
  p.set_count(round.outcome.moments.count);
  for (double v : round.outcome.moments.mean) p.add_mean(v);
  for (double v : round.outcome.moments.var) p.add_var(v);
  for (double v : round.outcome.grad_sums.sum_dy) p.add_sum_dy(v);
  for (double v : round.outcome.grad_sums.sum_dy_xmu) p.add_sum_dy_xmu(v);
  for (const std::optional<uint64_t>& f : round.fingerprints) {
    pb::Fingerprint* out = p.add_fingerprints();
    out->set_present(f.has_value());
    out->set_value(f.value_or(0));
  }
  p.set_fingerprint_kind(static_cast<uint32_t>(round.fingerprint_kind));
  if (round.stats_after.has_value()) {
    pb::Stats* s = p.mutable_stats_after();
    s->set_num_batches_tracked(round.stats_after->num_batches_tracked);
    for (double v : round.stats_after->mean) s->add_mean(v);
    for (double v : round.stats_after->var) s->add_var(v);
  }
  for (int rank : round.outcome.missing_ranks) p.add_missing_ranks(rank);
  p.set_backward_index(round.backward);
  return p.SerializeAsString();
}

// What EncodeLayer wrote before it wrote the bytes itself.
std::string LayerThroughProtobuf(const LayerState& state, bool stats_in_round) {
  pb::LayerRecord p;
  p.set_format(kStateFormat);
  pb::LayerState* out = p.mutable_state();
  if (!stats_in_round) {
    pb::Stats* s = out->mutable_stats();
    s->set_num_batches_tracked(state.stats.num_batches_tracked);
    for (double v : state.stats.mean) s->add_mean(v);
    for (double v : state.stats.var) s->add_var(v);
  }
  out->set_last_applied(state.last_applied);
  out->set_latest_forward(state.latest_completed[0]);
  out->set_latest_backward(state.latest_completed[1]);
  if (stats_in_round) p.set_stats_in_round(true);
  return p.SerializeAsString();
}

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  bool Coin() { return rng_() & 1; }
  int64_t Int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  // Zero now and then, and values whose varints take 1 to 10 bytes.
  int64_t Field() {
    switch (Int(0, 3)) {
      case 0:
        return 0;
      case 1:
        return Int(1, 127);
      case 2:
        return Int(128, std::numeric_limits<int64_t>::max());
      default:
        return Int(std::numeric_limits<int64_t>::min(), -1);
    }
  }
  std::vector<double> Doubles(int n) {
    std::vector<double> v(n);
    for (double& x : v) x = std::normal_distribution<double>(0, 1e3)(rng_);
    if (n > 0 && Coin()) v[0] = -0.0;  // its sign bit is on the wire too
    return v;
  }

 private:
  std::mt19937_64 rng_;
};

StoredRound RandomRound(Draw& d) {
  StoredRound r;
  r.phase = d.Coin() ? Phase::kForward : Phase::kBackward;
  r.step = d.Field();
  if (r.phase == Phase::kBackward && d.Coin()) {
    r.backward = static_cast<int>(d.Int(0, std::numeric_limits<int>::max()));
  }
  r.outcome.version = d.Field();
  r.outcome.moments.count = d.Field();
  const int channels = static_cast<int>(d.Int(0, 3) == 0 ? 0 : d.Int(1, 300));
  if (r.phase == Phase::kForward) {
    r.outcome.moments.mean = d.Doubles(channels);
    r.outcome.moments.var = d.Doubles(channels);
  } else {
    r.outcome.grad_sums.sum_dy = d.Doubles(channels);
    r.outcome.grad_sums.sum_dy_xmu = d.Doubles(channels);
  }
  const int ranks = static_cast<int>(d.Int(0, 9));
  for (int i = 0; i < ranks; ++i) {
    if (d.Coin()) {
      r.fingerprints.push_back(d.Coin() ? 0 : static_cast<uint64_t>(d.Field()));
    } else {
      r.fingerprints.push_back(std::nullopt);
    }
  }
  r.fingerprint_kind = static_cast<FingerprintKind>(
      d.Int(0, static_cast<int>(kFingerprintKind)));
  if (d.Coin()) {
    RunningStats s;
    s.num_batches_tracked = d.Field();
    s.mean = d.Doubles(d.Coin() ? channels : 0);
    s.var = d.Doubles(d.Coin() ? channels : 0);
    r.stats_after = std::move(s);
  }
  const int missing = static_cast<int>(d.Int(0, 4));
  for (int i = 0; i < missing; ++i) {
    // Ranks are never negative; the writer sign-extends them as protobuf.
    r.outcome.missing_ranks.push_back(static_cast<int>(d.Int(
        std::numeric_limits<int>::min(), std::numeric_limits<int>::max())));
  }
  return r;
}

TEST(StateCodecTest, EncodeRoundWritesProtobufsBytes) {
  Draw d(20261202);
  for (int i = 0; i < 2000; ++i) {
    const StoredRound r = RandomRound(d);
    ASSERT_EQ(EncodeRound(r), ThroughProtobuf(r)) << "round " << i;
  }
}

TEST(StateCodecTest, EncodeLayerWritesProtobufsBytes) {
  Draw d(20261203);
  for (int i = 0; i < 2000; ++i) {
    LayerState state;
    const int channels = static_cast<int>(d.Int(0, 3) == 0 ? 0 : d.Int(1, 300));
    state.stats.num_batches_tracked = d.Field();
    state.stats.mean = d.Doubles(channels);
    state.stats.var = d.Doubles(channels);
    state.last_applied = d.Int(0, 3) == 0 ? -1 : d.Field();
    state.latest_completed = {d.Int(0, 3) == 0 ? -1 : d.Field(), d.Field()};
    const bool stats_in_round = d.Coin();
    ASSERT_EQ(EncodeLayer(state, stats_in_round),
              LayerThroughProtobuf(state, stats_in_round))
        << "layer " << i;
  }
}

TEST(StateCodecTest, ALayerReadsBackAsWritten) {
  LayerConfig layer;
  layer.channels = 2;
  LayerState state;
  state.stats = RunningStats{5, {0.25, -3.5}, {2.0, 1e-300}};
  state.last_applied = 4;
  state.latest_completed = {4, 3};
  absl::StatusOr<LayerState> back =
      DecodeLayer(EncodeLayer(state, /*stats_in_round=*/false), layer);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->stats.num_batches_tracked, 5);
  EXPECT_EQ(back->stats.mean, state.stats.mean);
  EXPECT_EQ(back->stats.var, state.stats.var);
  EXPECT_EQ(back->last_applied, 4);
  EXPECT_EQ(back->latest_completed, state.latest_completed);
  bool in_round = false;
  back = DecodeLayer(EncodeLayer(state, /*stats_in_round=*/true), layer,
                     &in_round);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(in_round);
  EXPECT_TRUE(back->stats.mean.empty());
}

TEST(StateCodecTest, EncodeRoundOfADefaultRound) {
  // Fields at their defaults are left out, as protobuf leaves them out.
  StoredRound r;
  r.fingerprint_kind = FingerprintKind::kFnv1a;
  EXPECT_EQ(EncodeRound(r), ThroughProtobuf(r));
}

// Job "j": `world_size` ranks, one layer of `channels`.
JobSpec OneLayerJob(int world_size, int channels) {
  JobSpec spec;
  spec.job_id = "j";
  spec.world_size = world_size;
  spec.layers.push_back(LayerConfig{});
  spec.layers.back().channels = channels;
  return spec;
}

TEST(StateCodecTest, AForwardRoundReadsBackAsWritten) {
  const JobSpec spec = OneLayerJob(2, 3);
  StoredRound r;
  r.phase = Phase::kForward;
  r.step = 41;
  r.outcome.version = 42;
  r.outcome.moments.count = 96;
  r.outcome.moments.mean = {0.5, -1.25, 3e10};
  r.outcome.moments.var = {1.0, 0.0, 2.5e-7};
  r.fingerprints = {uint64_t{7}, std::nullopt};
  r.stats_after = RunningStats{42, {0.1, 0.2, 0.3}, {1.1, 1.2, 1.3}};
  absl::StatusOr<StoredRound> back = DecodeRound(EncodeRound(r), spec, 0, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 41);
  EXPECT_EQ(back->outcome.version, 42);
  EXPECT_EQ(back->outcome.moments.count, 96);
  EXPECT_EQ(back->outcome.moments.mean, r.outcome.moments.mean);
  EXPECT_EQ(back->outcome.moments.var, r.outcome.moments.var);
  EXPECT_EQ(back->fingerprints, r.fingerprints);
  ASSERT_TRUE(back->stats_after.has_value());
  EXPECT_EQ(back->stats_after->mean, r.stats_after->mean);
  EXPECT_EQ(back->stats_after->var, r.stats_after->var);
  EXPECT_EQ(back->fingerprint_kind, kFingerprintKind);
}

// A round whose fingerprints a newer build computed is refused by name, not
// compared with fingerprints of another kind (a retry would be taken for a
// conflict, or worse).
TEST(StateCodecTest, ARoundOfAnUnknownFingerprintKindIsRefused) {
  const JobSpec spec = OneLayerJob(1, 1);
  StoredRound r;
  r.phase = Phase::kBackward;
  r.step = 3;
  r.outcome.grad_sums.sum_dy = {1.0};
  r.outcome.grad_sums.sum_dy_xmu = {2.0};
  r.fingerprints = {uint64_t{7}};
  r.fingerprint_kind = kFingerprintKind;
  ASSERT_TRUE(DecodeRound(EncodeRound(r), spec, 0, 0).ok());
  r.fingerprint_kind =
      static_cast<FingerprintKind>(static_cast<int>(kFingerprintKind) + 1);
  absl::StatusOr<StoredRound> back = DecodeRound(EncodeRound(r), spec, 0, 0);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find(absl::StrCat(
                "fingerprint kind ", static_cast<int>(kFingerprintKind) + 1)),
            std::string::npos)
      << back.status();
}

JobSpec MembershipSpec(int world) {
  JobSpec spec;
  spec.job_id = "m";
  spec.world_size = world;
  return spec;
}

// A random ascending subset of 0..world-1 (runs and single ranks).
std::vector<int> RandomRanks(std::mt19937_64& rng, int world) {
  std::vector<int> ranks;
  const int density = static_cast<int>(rng() % 4);
  for (int r = 0; r < world; ++r) {
    if (static_cast<int>(rng() % 4) < density) ranks.push_back(r);
  }
  return ranks;
}

TEST(StateCodecTest, AMembershipReadsBackAsWritten) {
  std::mt19937_64 rng(32);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<MembershipChange> history;
    for (int v = 0; v < 5; ++v) {
      MembershipChange c{v,
                         3 * v,
                         RankSet::Of(RandomRanks(rng, 300)),
                         RankSet::Of(RandomRanks(rng, 300)),
                         RankSet::Of(RandomRanks(rng, 300)),
                         RankSet::Of(RandomRanks(rng, 300)),
                         v % 2 == 1};
      if (c.members.empty()) c.members = {7};
      history.push_back(std::move(c));
    }
    const std::string bytes = EncodeMembership(history);
    absl::StatusOr<std::vector<MembershipChange>> back =
        DecodeMembership(bytes, MembershipSpec(300));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, history) << "trial " << trial;
  }
}

TEST(StateCodecTest, AMembershipOfRankListsStillReads) {
  // Format 2, as builds before runs wrote it.
  pb::MembershipRecord p;
  p.set_format(kMembershipFormat);
  pb::MembershipChange* first = p.add_changes();
  for (int r : {0, 1, 2, 3}) first->add_members(r);
  pb::MembershipChange* second = p.add_changes();
  second->set_version(1);
  second->set_step(4);
  for (int r : {0, 2}) second->add_members(r);
  for (int r : {1, 3}) second->add_left(r);
  absl::StatusOr<std::vector<MembershipChange>> back =
      DecodeMembership(p.SerializeAsString(), MembershipSpec(4));
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<MembershipChange> expected = {
      MembershipChange{0, 0, {0, 1, 2, 3}, {}, {}, {}, false},
      MembershipChange{1, 4, {0, 2}, {}, {1, 3}, {}, false}};
  EXPECT_EQ(*back, expected);
}

TEST(StateCodecTest, BadMembershipRunsAreDataLoss) {
  const std::vector<std::vector<int>> bad = {
      {0},           // half a run
      {3, 1},        // last before first
      {0, 2, 2, 3},  // overlapping runs
      {5, 6, 0, 1},  // descending runs
      {0, 1 << 30},  // beyond the world: never expanded
      {-1, 2},
  };
  for (const std::vector<int>& runs : bad) {
    pb::MembershipRecord p;
    p.set_format(kMembershipRunsFormat);
    pb::MembershipChange* c = p.add_changes();
    for (int r : runs) c->add_member_runs(r);
    EXPECT_EQ(DecodeMembership(p.SerializeAsString(), MembershipSpec(8))
                  .status()
                  .code(),
              absl::StatusCode::kDataLoss)
        << runs[0];
  }
  pb::MembershipRecord both;
  both.set_format(kMembershipRunsFormat);
  both.add_changes()->add_members(1);
  both.mutable_changes(0)->add_member_runs(2);
  both.mutable_changes(0)->add_member_runs(3);
  EXPECT_EQ(DecodeMembership(both.SerializeAsString(), MembershipSpec(8))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace syncnorm
