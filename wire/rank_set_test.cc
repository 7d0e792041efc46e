#include "wire/rank_set.h"

#include <algorithm>
#include <iterator>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "wire/rank_list.h"

namespace syncnorm {
namespace {

// A random ascending set of ranks in [0, world): runs and single ranks.
std::vector<int> RandomRanks(std::mt19937& rng, int world) {
  std::vector<int> out;
  std::bernoulli_distribution stay(std::uniform_real_distribution<>(0, 1)(rng));
  bool in = std::bernoulli_distribution(0.5)(rng);
  for (int r = 0; r < world; ++r) {
    if (!stay(rng)) in = !in;
    if (in) out.push_back(r);
  }
  return out;
}

TEST(RankSetTest, HoldsRanksAsMaximalRuns) {
  const RankSet set = RankSet::Of({0, 2, 3, 4, 9});
  ASSERT_EQ(set.runs().size(), 3u);
  EXPECT_EQ(set.runs()[1], (RankSet::Run{2, 4}));
  EXPECT_EQ(set.size(), 5);
  EXPECT_EQ(set.ranks(), (std::vector<int>{0, 2, 3, 4, 9}));
  EXPECT_EQ(RankSet::Range(1, 65535).runs().size(), 1u);
  EXPECT_EQ(RankSet::Range(1, 65535).size(), 65535);
  EXPECT_TRUE(RankSet::Range(3, 2).empty());
  EXPECT_EQ(RankSet::FromRuns({{0, 1}, {2, 5}, {7, 7}}),
            RankSet::Of({0, 1, 2, 3, 4, 5, 7}));
  EXPECT_EQ(RankSet::FromRuns({{0, 1}, {2, 5}}).runs().size(), 1u);
  EXPECT_TRUE(RankSet().empty());
  EXPECT_EQ(RankSet().begin(), RankSet().end());
}

TEST(RankSetTest, AgreesWithAStdSetOnRandomSets) {
  std::mt19937 rng(20261206);
  for (int lap = 0; lap < 300; ++lap) {
    const int world = 1 + lap % 97;
    const std::vector<int> a = RandomRanks(rng, world);
    const std::vector<int> b = RandomRanks(rng, world);
    const RankSet x = RankSet::Of(a);
    const RankSet y = RankSet::Of(b);
    EXPECT_EQ(x.ranks(), a);
    EXPECT_EQ(std::vector<int>(x.begin(), x.end()), a);
    EXPECT_EQ(x.size(), static_cast<int64_t>(a.size()));
    const std::set<int> as(a.begin(), a.end());
    for (int r = -1; r <= world; ++r) {
      EXPECT_EQ(x.contains(r), as.count(r) == 1) << "rank " << r;
    }
    std::vector<int> both, only_a;
    std::set_union(a.begin(), a.end(), b.begin(), b.end(),
                   std::back_inserter(both));
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(),
                        std::back_inserter(only_a));
    EXPECT_EQ(RankSet::Union(x, y).ranks(), both);
    EXPECT_EQ(RankSet::Union(x, y), RankSet::Of(both));
    EXPECT_EQ(RankSet::Difference(x, y).ranks(), only_a);
    EXPECT_EQ(RankSet::Difference(x, y), RankSet::Of(only_a));
    EXPECT_EQ(x == y, a == b);
    EXPECT_EQ(RankList(x), RankList(absl::MakeConstSpan(a)));
  }
}

TEST(RankSetTest, FlatRunsRoundTripAndBadOnesAreRefused) {
  const RankSet set = RankSet::Of({0, 1, 2, 7, 9, 10});
  std::vector<int32_t> flat;
  struct Out {
    std::vector<int32_t>* v;
    void Add(int32_t x) { v->push_back(x); }
  } out{&flat};
  AddFlatRuns(set, &out);
  EXPECT_EQ(flat, (std::vector<int32_t>{0, 2, 7, 7, 9, 10}));
  absl::StatusOr<RankSet> back = RankSet::FromFlatRuns(flat, 11);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, set);
  // Adjacent runs are merged; a set of 2^31 - 1 ranks is two numbers.
  back = RankSet::FromFlatRuns({0, 3, 4, 5}, 6);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->runs().size(), 1u);
  back = RankSet::FromFlatRuns({0, 2147483646}, 2147483647);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->size(), 2147483647);
  for (const std::vector<int32_t>& bad : std::vector<std::vector<int32_t>>{
           {0}, {3, 2}, {-1, 2}, {0, 11}, {0, 4, 4, 6}, {5, 6, 0, 1}}) {
    absl::StatusOr<RankSet> refused = RankSet::FromFlatRuns(bad, 11);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.size();
  }
}

TEST(RankSetTest, CopiesShareTheRuns) {
  std::vector<int> every_other;
  for (int r = 0; r < 65536; r += 2) every_other.push_back(r);
  const RankSet set = RankSet::Of(every_other);
  const RankSet copy = set;
  EXPECT_EQ(copy.runs().data(), set.runs().data());
  EXPECT_EQ(copy, set);
}

}  // namespace
}  // namespace syncnorm
