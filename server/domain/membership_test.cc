#include "server/domain/membership.h"

#include <vector>

#include "gtest/gtest.h"

namespace syncnorm {
namespace {

MembershipRequest Request(int64_t step, std::vector<int> join,
                          std::vector<int> leave = {},
                          std::vector<int> remove = {}) {
  MembershipRequest r;
  r.step = step;
  r.join = std::move(join);
  r.leave = std::move(leave);
  r.remove = std::move(remove);
  return r;
}

TEST(MembershipTest, EveryRankIsAMemberOfAJobThatNeverChanged) {
  const Membership m(4, {});
  EXPECT_TRUE(m.everyone());
  EXPECT_EQ(m.version(), 0);
  EXPECT_EQ(m.latest().members.ranks(), (std::vector<int>{0, 1, 2, 3}));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(m.IsMember(r, 1000));
  EXPECT_FALSE(m.IsMember(4, 0));
}

TEST(MembershipTest, ChangesApplyFromTheirStepOn) {
  const Membership m0(8, std::vector<int>{0, 1, 2, 3});
  EXPECT_FALSE(m0.everyone());
  absl::StatusOr<Membership> m1 =
      m0.Apply(Request(0, {}, {3}), 8, /*next_step=*/5, /*committed=*/4, "j");
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ(m1->version(), 1);
  EXPECT_EQ(m1->latest().step, 5);  // 0: the next step
  EXPECT_EQ(m1->latest().left.ranks(), (std::vector<int>{3}));
  EXPECT_TRUE(m1->IsMember(3, 4));
  EXPECT_FALSE(m1->IsMember(3, 5));
  EXPECT_FALSE(m1->Excused(3, 4));  // it left: rounds before 5 wait for it

  absl::StatusOr<Membership> m2 = m1->Apply(Request(9, {4, 5}), 8, 6, 5, "j");
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(m2->latest().members.ranks(), (std::vector<int>{0, 1, 2, 4, 5}));
  EXPECT_FALSE(m2->IsMember(4, 8));
  EXPECT_TRUE(m2->IsMember(4, 9));
  EXPECT_EQ(m2->At(7).version, 1);
  EXPECT_EQ(m2->At(9).version, 2);
  EXPECT_EQ(m2->At(0).version, 0);
}

TEST(MembershipTest, ARemovedRankIsExcusedFromTheRoundsBeforeItsRemoval) {
  const Membership m0(4, {});
  absl::StatusOr<Membership> m1 =
      m0.Apply(Request(0, {}, {}, {2}), 4, 7, 5, "j");
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_FALSE(m1->everyone());
  EXPECT_TRUE(m1->IsMember(2, 6));  // it was a member at step 6 ...
  EXPECT_TRUE(m1->Excused(2, 6));   // ... whose rounds no longer wait for it
  EXPECT_FALSE(m1->IsMember(2, 7));
  EXPECT_FALSE(m1->Excused(1, 6));
}

TEST(MembershipTest, RemovingARankThatLeftButOwesRoundsExcusesIt) {
  const Membership m0(4, {});
  // Rank 3 leaves from step 10, then dies before finishing step 9.
  absl::StatusOr<Membership> m1 = m0.Apply(Request(10, {}, {3}), 4, 9, 8, "j");
  ASSERT_TRUE(m1.ok()) << m1.status();
  absl::StatusOr<Membership> m2 =
      m1->Apply(Request(0, {}, {}, {3}), 4, 10, 8, "j");
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(m2->version(), 2);
  EXPECT_EQ(m2->latest().removed.ranks(), (std::vector<int>{3}));
  EXPECT_TRUE(m2->Excused(3, 9));
  // Once it has been removed, removing it again changes nothing.
  absl::StatusOr<Membership> m3 =
      m2->Apply(Request(0, {}, {}, {3}), 4, 10, 8, "j");
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(m3->version(), 2);
}

TEST(MembershipTest, ARetryOfAChangeInForceChangesNothing) {
  const Membership m0(8, std::vector<int>{0, 1});
  absl::StatusOr<Membership> m1 = m0.Apply(Request(0, {2}), 8, 3, 2, "j");
  ASSERT_TRUE(m1.ok());
  // Later, with training gone on, the same request again.
  absl::StatusOr<Membership> again = m1->Apply(Request(0, {2}), 8, 30, 29, "j");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->version(), 1);
  EXPECT_EQ(again->latest().step, 3);
}

TEST(MembershipTest, BadRequestsAreRefusedNamingTheFix) {
  const Membership m(4, {});
  const auto code = [&](const MembershipRequest& r, int64_t next = 5) {
    return m.Apply(r, 4, next, next - 1, "j").status().code();
  };
  EXPECT_EQ(code(Request(0, {4})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request(0, {-1})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request(0, {}, {1}, {1})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request(0, {})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request(-3, {}, {1})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Request(0, {}, {0, 1, 2, 3})),
            absl::StatusCode::kInvalidArgument);  // no member left
  const absl::Status early =
      m.Apply(Request(3, {}, {1}), 4, 5, 4, "j").status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("name step 5 or later"),
            absl::string_view::npos)
      << early;
  absl::StatusOr<Membership> later =
      m.Apply(Request(20, {}, {1}), 4, 5, 4, "j");
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->Apply(Request(10, {}, {2}), 4, 5, 4, "j").status().code(),
            absl::StatusCode::kFailedPrecondition);  // before the latest
}

TEST(MembershipTest, TheHistoryFoldsOnlyWhatEveryLayerHasPassed) {
  Membership m(2, {});
  // Changes ahead of the committed step are all kept, up to the bound.
  for (int i = 0; i < Membership::kMaxHistory - 1; ++i) {
    absl::StatusOr<Membership> next =
        m.Apply(Request(10 + i, {}, {i % 2 == 0 ? 1 : 0}, {}), 2, 10, 9, "j");
    if (!next.ok()) {
      // Leaving rank 0 when 1 left too would empty the job: rejoin instead.
      next =
          m.Apply(Request(10 + i, {1 - (i % 2 == 0 ? 1 : 0)}), 2, 10, 9, "j");
    }
    ASSERT_TRUE(next.ok()) << i << ": " << next.status();
    m = *std::move(next);
  }
  ASSERT_EQ(m.history().size(), static_cast<size_t>(Membership::kMaxHistory));
  const MembershipRequest one_more = Request(
      200, m.IsMember(0, 200) ? std::vector<int>{1} : std::vector<int>{0});
  EXPECT_EQ(m.Apply(one_more, 2, 10, 9, "j").status().code(),
            absl::StatusCode::kResourceExhausted);
  // Once training has passed them, the oldest fold away.
  absl::StatusOr<Membership> folded = m.Apply(one_more, 2, 150, 149, "j");
  ASSERT_TRUE(folded.ok()) << folded.status();
  EXPECT_EQ(folded->history().size(),
            static_cast<size_t>(Membership::kMaxHistory));
  EXPECT_EQ(folded->history().front().version, 1);
}

// A Join at the end of an epoch: hundreds of ranks run out at one step and
// each leaves on its own. Each is a version, and none needs a kept change
// of its own (session 16 found the 64th refused RESOURCE_EXHAUSTED).
TEST(MembershipTest, ChangesForOneStepAmendTheLatest) {
  constexpr int kWorld = 1024;
  Membership m(kWorld, {});
  absl::StatusOr<Membership> at_five =
      m.Apply(Request(5, {}, {1}), kWorld, 5, 4, "j");
  ASSERT_TRUE(at_five.ok());
  m = *std::move(at_five);
  for (int r = 100; r < 400; ++r) {
    absl::StatusOr<Membership> next =
        m.Apply(Request(9, {}, {r}), kWorld, 6, 5, "j");
    ASSERT_TRUE(next.ok()) << "rank " << r << ": " << next.status();
    m = *std::move(next);
  }
  // Version 0, the change at step 5, and one change at step 9.
  ASSERT_EQ(m.history().size(), 3u);
  const MembershipChange& last = m.history().back();
  EXPECT_EQ(last.version, 301);  // one version per change all the same
  EXPECT_EQ(last.step, 9);
  EXPECT_EQ(last.left, RankSet::Range(100, 399));
  EXPECT_TRUE(last.joined.empty());
  EXPECT_EQ(m.history()[1].left, RankSet::Of(std::vector<int>{1}));
  for (int r : {0, 1, 99, 100, 250, 399, 400, 1023}) {
    EXPECT_EQ(m.IsMember(r, 8), r != 1) << r;
    EXPECT_EQ(m.IsMember(r, 9), r != 1 && (r < 100 || r >= 400)) << r;
  }
  // A rank that left and comes back at the same step: no change for it.
  absl::StatusOr<Membership> back =
      m.Apply(Request(9, {250}), kWorld, 6, 5, "j");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->IsMember(250, 9));
  EXPECT_FALSE(back->history().back().left.contains(250));
  EXPECT_FALSE(back->history().back().joined.contains(250));
  // Joining rank 1 at step 9 joins it there: it left at step 5.
  absl::StatusOr<Membership> one =
      back->Apply(Request(9, {1}), kWorld, 6, 5, "j");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->history().back().joined.contains(1));
  EXPECT_FALSE(one->IsMember(1, 8));
  EXPECT_TRUE(one->IsMember(1, 9));
  // Removals union, and leave the members.
  absl::StatusOr<Membership> removed =
      one->Apply(Request(9, {}, {}, {500}), kWorld, 6, 5, "j");
  ASSERT_TRUE(removed.ok());
  absl::StatusOr<Membership> removed2 =
      removed->Apply(Request(9, {}, {}, {501}), kWorld, 6, 5, "j");
  ASSERT_TRUE(removed2.ok());
  EXPECT_EQ(removed2->history().back().removed, RankSet::Range(500, 501));
  EXPECT_FALSE(removed2->history().back().left.contains(500));
  EXPECT_EQ(removed2->history().size(), 3u);
  // A change for a later step is a change of its own.
  absl::StatusOr<Membership> later =
      removed2->Apply(Request(10, {}, {7}), kWorld, 6, 5, "j");
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->history().size(), 4u);
}

TEST(MembershipTest, ARestorePutsTheCheckpointsMembersBackAsANewVersion) {
  const Membership m0(8, std::vector<int>{0, 1, 2, 3});
  absl::StatusOr<Membership> m1 = m0.Apply(Request(6, {4}), 8, 6, 5, "j");
  ASSERT_TRUE(m1.ok());
  absl::StatusOr<Membership> m2 = m1->Apply(Request(12, {}, {0}), 8, 9, 8, "j");
  ASSERT_TRUE(m2.ok());
  // Back to the checkpoint of step 4, whose members were 0..3.
  const Membership r = m2->Restored(4, {0, 1, 2, 3}, 4);
  EXPECT_EQ(r.version(), 3);
  EXPECT_TRUE(r.latest().restored);
  EXPECT_EQ(r.latest().step, 5);
  EXPECT_EQ(r.latest().members.ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_FALSE(r.IsMember(4, 6));  // the join from step 6 is undone
  EXPECT_TRUE(r.IsMember(0, 12));  // and so is the leave from step 12
  // Restoring to the members in force, with nothing ahead, changes nothing.
  EXPECT_EQ(m0.Restored(4, {0, 1, 2, 3}, 4).version(), 0);
}

// Issue 32: each change copied every kept change's rank lists (16 MB at
// 65,536 ranks and 63 changes). A change now names what it changed as
// runs, and the kept changes are shared with the membership before it.
TEST(MembershipTest, AChangeCostsWhatItNamesNotTheHistory) {
  constexpr int kWorld = 65536;
  std::vector<int> others;
  for (int r = 1; r < kWorld; ++r) others.push_back(r);
  Membership m(kWorld, {});
  for (int i = 0; i < 62; ++i) {
    MembershipRequest change;
    change.step = i + 1;  // one step each: changes of one step amend
    (i % 2 == 0 ? change.leave : change.join) = others;
    absl::StatusOr<Membership> next = m.Apply(change, kWorld, 0, -1, "wide");
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_EQ(next->history().size(), m.history().size() + 1);
    for (size_t v = 0; v < m.history().size(); ++v) {
      const MembershipChange& before = m.history()[v];
      const MembershipChange& after = next->history()[v];
      ASSERT_EQ(after, before);
      // Shared, not copied.
      ASSERT_EQ(after.members.runs().data(), before.members.runs().data());
      ASSERT_EQ(after.left.runs().data(), before.left.runs().data());
      ASSERT_EQ(after.joined.runs().data(), before.joined.runs().data());
    }
    const MembershipChange& latest = next->latest();
    EXPECT_EQ(latest.members.runs().size(), 1u);
    EXPECT_EQ(latest.members.size(), i % 2 == 0 ? 1 : kWorld);
    EXPECT_EQ((i % 2 == 0 ? latest.left : latest.joined).size(), kWorld - 1);
    EXPECT_EQ(next->IsMember(kWorld - 1, i + 1), i % 2 == 1);
    m = *std::move(next);
  }
}

}  // namespace
}  // namespace syncnorm
