#include "server/domain/round.h"

#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"

namespace syncnorm {
namespace {

Payload MomentsOf(int64_t count, double mean, double m2) {
  Moments m;
  m.count = count;
  m.mean = {mean};
  m.m2 = {m2};
  return m;
}

TEST(RoundTest, TracksRanksRetriesAndConflicts) {
  Round round(/*first_rank=*/4, /*group_size=*/3, absl::UnixEpoch());
  int calls = 0;
  RoundCallback cb = [&](const RoundOutcome&) { ++calls; };
  RoundCallback a = cb, b = cb, c = cb;
  RoundCallback evicted;
  EXPECT_EQ(round.Add(5, MomentsOf(2, 1.0, 0.5), {}, std::move(a),
                      absl::UnixEpoch(), &evicted),
            Round::AddResult::kAdded);
  EXPECT_EQ(round.Add(5, MomentsOf(2, 1.0, 0.5), {}, std::move(b),
                      absl::UnixEpoch(), &evicted),
            Round::AddResult::kDuplicate);
  EXPECT_EQ(round.Add(5, MomentsOf(2, 1.0, 0.25), {}, std::move(c),
                      absl::UnixEpoch(), &evicted),
            Round::AddResult::kConflict);
  EXPECT_TRUE(c != nullptr) << "a refused callback stays with the caller";
  EXPECT_FALSE(round.complete());
  EXPECT_EQ(round.MissingRanks(), (std::vector<int>{4, 6}));
  std::vector<std::optional<uint64_t>> fp = round.Fingerprints();
  EXPECT_FALSE(fp[0].has_value());
  EXPECT_EQ(fp[1], PayloadFingerprint(MomentsOf(2, 1.0, 0.5)));
  EXPECT_EQ(round.TakeWaiters().size(), 2u);
}

TEST(RoundTest, RetriesBeyondTheCapEvictTheOldestWaiterOfTheirRank) {
  Round round(0, 2, absl::UnixEpoch());
  std::vector<int> answered;
  auto waiter = [&](int id) {
    return [&answered, id](const RoundOutcome&) { answered.push_back(id); };
  };
  RoundCallback evicted;
  ASSERT_EQ(round.Add(1, MomentsOf(2, 1.0, 0.5), {}, waiter(0),
                      absl::UnixEpoch(), &evicted),
            Round::AddResult::kAdded);
  EXPECT_TRUE(evicted == nullptr);
  for (int i = 1; i < Round::kMaxWaitersPerRank; ++i) {
    ASSERT_EQ(round.Add(1, MomentsOf(2, 1.0, 0.5), {}, waiter(i),
                        absl::UnixEpoch(), &evicted),
              Round::AddResult::kDuplicate);
    EXPECT_TRUE(evicted == nullptr) << i;
  }
  // One more: waiter 0, the oldest of rank 1, comes back to the caller.
  ASSERT_EQ(
      round.Add(1, MomentsOf(2, 1.0, 0.5), {},
                waiter(Round::kMaxWaitersPerRank), absl::UnixEpoch(), &evicted),
      Round::AddResult::kDuplicate);
  ASSERT_TRUE(evicted != nullptr);
  evicted(RoundOutcome{});
  EXPECT_EQ(answered, std::vector<int>{0});
  // Rank 0 has its own allowance.
  ASSERT_EQ(round.Add(0, MomentsOf(1, 0.0, 0.0), {}, waiter(100),
                      absl::UnixEpoch(), &evicted),
            Round::AddResult::kAdded);
  EXPECT_TRUE(evicted == nullptr);
  std::vector<RoundCallback> waiters = round.TakeWaiters();
  EXPECT_EQ(waiters.size(), static_cast<size_t>(Round::kMaxWaitersPerRank) + 1);
  for (RoundCallback& w : waiters) w(RoundOutcome{});
  EXPECT_EQ(answered.size(),
            static_cast<size_t>(Round::kMaxWaitersPerRank) + 2);
}

TEST(RoundTest, MergesInRankOrder) {
  Round round(0, 3, absl::UnixEpoch());
  RoundCallback evicted;
  round.Add(
      2, MomentsOf(3, 5.0, 1.0), {}, [](const RoundOutcome&) {},
      absl::UnixEpoch(), &evicted);
  round.Add(
      0, MomentsOf(0, 0.0, 0.0), {}, [](const RoundOutcome&) {},
      absl::UnixEpoch(), &evicted);
  round.Add(
      1, MomentsOf(1, 2.0, 0.0), {}, [](const RoundOutcome&) {},
      absl::UnixEpoch(), &evicted);
  ASSERT_TRUE(round.complete());
  Moments expected = Moments::Zero(1);
  MergeMoments(expected, std::get<Moments>(MomentsOf(0, 0.0, 0.0)));
  MergeMoments(expected, std::get<Moments>(MomentsOf(1, 2.0, 0.0)));
  MergeMoments(expected, std::get<Moments>(MomentsOf(3, 5.0, 1.0)));
  Moments got = *round.MergedMoments(1);
  EXPECT_EQ(got.count, 4);
  EXPECT_EQ(got.mean, expected.mean);
  EXPECT_EQ(got.m2, expected.m2);
}

TEST(RoundTest, PartialMergeSkipsAbsentRanksAndTimesArrivals) {
  const absl::Time t0 = absl::UnixEpoch();
  Round round(0, 4, t0 + absl::Seconds(10));
  RoundCallback evicted;
  EXPECT_EQ(round.first_arrival(), absl::InfiniteFuture());
  round.Add(
      3, MomentsOf(3, 5.0, 1.0), {}, [](const RoundOutcome&) {},
      t0 + absl::Seconds(2), &evicted);
  round.Add(
      1, MomentsOf(1, 2.0, 0.0), {}, [](const RoundOutcome&) {}, t0, &evicted);
  round.Add(
      0, MomentsOf(2, 1.0, 0.5), {}, [](const RoundOutcome&) {},
      t0 + absl::Milliseconds(100), &evicted);
  EXPECT_EQ(round.received(), 3);
  EXPECT_EQ(round.first_arrival(), t0);
  EXPECT_EQ(round.PresentRanks(), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(round.MissingRanks(), (std::vector<int>{2}));
  EXPECT_EQ(round.Stragglers(absl::Milliseconds(50)), (std::vector<int>{3, 0}));
  EXPECT_EQ(round.Stragglers(absl::Seconds(1)), (std::vector<int>{3}));
  EXPECT_EQ(round.LastArrival(), absl::Seconds(2));
  Moments expected = Moments::Zero(1);
  MergeMoments(expected, std::get<Moments>(MomentsOf(2, 1.0, 0.5)));
  MergeMoments(expected, std::get<Moments>(MomentsOf(1, 2.0, 0.0)));
  MergeMoments(expected, std::get<Moments>(MomentsOf(3, 5.0, 1.0)));
  Moments got = *round.MergedMoments(1);
  EXPECT_EQ(got.count, 6);
  EXPECT_EQ(got.mean, expected.mean);
  EXPECT_EQ(got.m2, expected.m2);
}

TEST(RoundTest, PayloadIdentityIsBitwise) {
  EXPECT_TRUE(SamePayload(MomentsOf(1, 0.0, 0.0), MomentsOf(1, 0.0, 0.0)));
  EXPECT_FALSE(SamePayload(MomentsOf(1, 0.0, 0.0), MomentsOf(1, -0.0, 0.0)));
  EXPECT_FALSE(SamePayload(MomentsOf(1, 0.0, 0.0), MomentsOf(2, 0.0, 0.0)));
  EXPECT_NE(PayloadFingerprint(MomentsOf(1, 0.0, 0.0)),
            PayloadFingerprint(MomentsOf(1, -0.0, 0.0)));
  GradSums g;
  g.sum_dy = {1.0};
  g.sum_dy_xmu = {2.0};
  EXPECT_FALSE(SamePayload(Payload(g), MomentsOf(1, 1.0, 2.0)));
  EXPECT_NE(PayloadFingerprint(Payload(g)), PayloadFingerprint(Payload()));
}

// A relay's block of `ranks` (consecutive positions from `first`), with
// the fingerprints of `payloads` sent with no update.
RelayBlock BlockOf(int first, int positions, std::vector<int> ranks,
                   const std::vector<Payload>& payloads) {
  RelayBlock b;
  b.first_position = first;
  b.positions = positions;
  b.ranks = std::move(ranks);
  for (const Payload& p : payloads) {
    b.fingerprints.push_back(ContributionFingerprint(p, {}));
  }
  return b;
}

// The merge of `payloads` in the documented order of a block of 2 or 4.
Payload Folded(std::vector<Payload> payloads) {
  std::vector<Moments> m;
  for (Payload& p : payloads) m.push_back(std::get<Moments>(std::move(p)));
  while (m.size() > 1) {
    std::vector<Moments> up;
    for (size_t i = 0; i < m.size(); i += 2) {
      MergeMoments(m[i], m[i + 1]);
      up.push_back(m[i]);
    }
    m = std::move(up);
  }
  return m[0];
}

TEST(RoundTest, ABlockStandsForItsRanksAndIsKnownByItsFingerprints) {
  Round round(/*first_rank=*/10, /*group_size=*/8, absl::UnixEpoch());
  std::vector<Payload> p;
  for (int i = 0; i < 8; ++i) p.push_back(MomentsOf(i + 1, 0.5 * i, 1.0 + i));
  int calls = 0;
  RoundCallback cb = [&](const RoundOutcome&) { ++calls; };
  RoundCallback evicted;
  int conflict = 0;
  // Rank 11 sent directly first: the block takes its place.
  ASSERT_EQ(
      round.Add(11, p[1], {}, RoundCallback(cb), absl::UnixEpoch(), &evicted),
      Round::AddResult::kAdded);
  const RelayBlock block =
      BlockOf(0, 4, {10, 11, 12, 13}, {p[0], p[1], p[2], p[3]});
  absl::StatusOr<Round::AddResult> added = round.AddBlock(
      block, Folded({p[0], p[1], p[2], p[3]}), {}, RoundCallback(cb),
      absl::UnixEpoch() + absl::Seconds(1), &evicted, &conflict);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, Round::AddResult::kAdded);
  EXPECT_EQ(round.received(), 4);
  EXPECT_EQ(round.MissingRanks(), (std::vector<int>{14, 15, 16, 17}));
  // Each merged rank's retry is told by its fingerprint.
  EXPECT_EQ(
      round.Add(12, p[2], {}, RoundCallback(cb), absl::UnixEpoch(), &evicted),
      Round::AddResult::kDuplicate);
  EXPECT_EQ(
      round.Add(13, p[0], {}, RoundCallback(cb), absl::UnixEpoch(), &evicted),
      Round::AddResult::kConflict);
  // The same block again is a retry; one that vouches for another payload
  // of rank 12 is refused, naming it.
  added =
      round.AddBlock(block, Folded({p[0], p[1], p[2], p[3]}), {},
                     RoundCallback(cb), absl::UnixEpoch(), &evicted, &conflict);
  EXPECT_EQ(*added, Round::AddResult::kDuplicate);
  RelayBlock other = block;
  other.fingerprints[2] = ContributionFingerprint(p[7], {});
  added =
      round.AddBlock(other, Folded({p[0], p[1], p[7], p[3]}), {},
                     RoundCallback(cb), absl::UnixEpoch(), &evicted, &conflict);
  EXPECT_EQ(*added, Round::AddResult::kConflict);
  EXPECT_EQ(conflict, 12);
  for (int i = 4; i < 8; ++i) {
    ASSERT_EQ(round.Add(10 + i, p[i], {}, RoundCallback(cb), absl::UnixEpoch(),
                        &evicted),
              Round::AddResult::kAdded);
  }
  EXPECT_TRUE(round.complete());
  EXPECT_EQ(round.Fingerprints()[2], ContributionFingerprint(p[2], {}));
  // The direct merge of all eight, in the same order.
  const Moments direct = std::get<Moments>(Folded(p));
  const Moments got = *round.MergedMoments(1);
  EXPECT_EQ(got.count, direct.count);
  EXPECT_EQ(got.mean, direct.mean);
  EXPECT_EQ(got.m2, direct.m2);
  // Rank 11's own callback, the block's two, rank 12's retry, ranks 14-17.
  EXPECT_EQ(round.waiters(), 8u);
}

TEST(RoundTest, ABlockMustMergeExactlyItsPositionsMembers) {
  Round round(/*first_rank=*/0, /*group_size=*/6, absl::UnixEpoch());
  std::vector<Payload> p;
  for (int i = 0; i < 6; ++i) p.push_back(MomentsOf(1, i, 0));
  RoundCallback evicted;
  int conflict = 0;
  const auto add = [&](const RelayBlock& b) {
    return round.AddBlock(
        b, p[0], {}, [](const RoundOutcome&) {}, absl::UnixEpoch(), &evicted,
        &conflict);
  };
  // Rank 3 is missing from the block of positions 0-3.
  absl::StatusOr<Round::AddResult> added =
      add(BlockOf(0, 4, {0, 1, 2}, {p[0], p[1], p[2]}));
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(added.status().message().find("members at the step are [0-3]"),
            absl::string_view::npos)
      << added.status();
  // Positions 8-15 are past the group's six.
  added = add(BlockOf(8, 8, {7}, {p[0]}));
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kInvalidArgument);
  // Nothing was taken.
  EXPECT_EQ(round.received(), 0);
  EXPECT_EQ(round.waiters(), 0u);
  // Positions 4-7 hold ranks 4 and 5 only: a block of both is whole.
  added = add(BlockOf(4, 4, {4, 5}, {p[4], p[5]}));
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(round.MissingRanks(), (std::vector<int>{0, 1, 2, 3}));
}

TEST(RoundTest, AMembershipChangeUnderABlockEvictsItWhole) {
  Round round(/*first_rank=*/0, /*group_size=*/8, absl::UnixEpoch());
  std::vector<Payload> p;
  for (int i = 0; i < 8; ++i) p.push_back(MomentsOf(1, i, 0));
  RoundCallback evicted;
  int conflict = 0;
  std::vector<int> answered;
  const auto tagged = [&](int id) {
    return [&answered, id](const RoundOutcome&) { answered.push_back(id); };
  };
  ASSERT_TRUE(
      round
          .AddBlock(BlockOf(0, 4, {0, 1, 2, 3}, {p[0], p[1], p[2], p[3]}),
                    Folded({p[0], p[1], p[2], p[3]}), {}, tagged(100),
                    absl::UnixEpoch(), &evicted, &conflict)
          .ok());
  ASSERT_TRUE(round
                  .AddBlock(BlockOf(4, 2, {4, 5}, {p[4], p[5]}),
                            Folded({p[4], p[5]}), {}, tagged(200),
                            absl::UnixEpoch(), &evicted, &conflict)
                  .ok());
  ASSERT_EQ(round.Add(1, p[1], {}, tagged(1), absl::UnixEpoch(), &evicted),
            Round::AddResult::kDuplicate);
  EXPECT_EQ(round.received(), 6);
  // Rank 2 is no member at the round's step any more: the block of 0-3
  // cannot lose it from its merge, so it goes; the block of 4-5 stays.
  std::vector<RoundCallback> dropped, evicted_blocks;
  round.SetRoles(
      [](int rank) {
        return rank == 2 ? Round::Role::kOutside : Round::Role::kMember;
      },
      dropped, evicted_blocks);
  EXPECT_TRUE(dropped.empty());
  ASSERT_EQ(evicted_blocks.size(), 1u);
  evicted_blocks[0](RoundOutcome());
  EXPECT_EQ(answered, (std::vector<int>{100}));
  EXPECT_EQ(round.received(), 2);
  EXPECT_EQ(round.MissingRanks(), (std::vector<int>{0, 1, 3, 6, 7}));
  EXPECT_EQ(round.members(), 7);
  // The relay sends the ranks through; the round completes with the direct
  // result of the seven members.
  for (int i : {0, 1, 3, 6, 7}) {
    round.Add(i, p[i], {}, tagged(i), absl::UnixEpoch(), &evicted);
  }
  EXPECT_TRUE(round.complete());
  Moments expected = std::get<Moments>(Folded({p[0], p[1]}));
  MergeMoments(expected, std::get<Moments>(p[3]));
  MergeMoments(expected, std::get<Moments>(Folded({p[4], p[5], p[6], p[7]})));
  const Moments got = *round.MergedMoments(1);
  EXPECT_EQ(got.count, 7);
  EXPECT_EQ(got.mean, expected.mean);
  EXPECT_EQ(got.m2, expected.m2);
}

}  // namespace
}  // namespace syncnorm
