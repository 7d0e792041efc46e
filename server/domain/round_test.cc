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

}  // namespace
}  // namespace syncnorm
