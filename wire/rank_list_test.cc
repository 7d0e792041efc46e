#include "wire/rank_list.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(RankListTest, NamesFewRanksOneByOne) {
  EXPECT_EQ(RankList({}), "[]");
  EXPECT_EQ(RankList(std::vector<int>{3}), "[3]");
  EXPECT_EQ(RankList(std::vector<int>{0, 2}), "[0, 2]");
  EXPECT_EQ(RankList(std::vector<int>{2, 3}), "[2, 3]");
}

TEST(RankListTest, RunsOfThreeOrMoreAsRanges) {
  EXPECT_EQ(RankList(std::vector<int>{1, 2, 3}), "[1-3]");
  EXPECT_EQ(RankList(std::vector<int>{0, 2, 3, 4, 5, 9, 10}),
            "[0, 2-5, 9, 10]");
  std::vector<int> wide;
  for (int r = 1; r < 65536; ++r) wide.push_back(r);
  EXPECT_EQ(RankList(wide), "[1-65535]");
}

TEST(RankListTest, NamesTheFirstPiecesAndCountsTheRest) {
  // Every other rank of 1024: no runs, 512 ranks.
  std::vector<int> even;
  for (int r = 0; r < 1024; r += 2) even.push_back(r);
  EXPECT_EQ(RankList(even),
            "[0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, "
            "and 496 more]");
  // Seventeen runs: the last one is counted, not named.
  std::vector<int> runs;
  for (int k = 0; k < 17; ++k) {
    for (int r = 10 * k; r < 10 * k + 5; ++r) runs.push_back(r);
  }
  const std::string text = RankList(runs);
  EXPECT_EQ(text.substr(0, 15), "[0-4, 10-14, 20");
  EXPECT_TRUE(absl::EndsWith(text, ", 150-154, and 5 more]")) << text;
}

TEST(RankListTest, StaysWithinItsBoundForTheWidestRanks) {
  std::vector<int> ranks;
  for (int k = 0; k < 1000; ++k) {
    const int first = 2147483647 - 4 * (1000 - k);
    ranks.push_back(first);
    ranks.push_back(first + 1);
    ranks.push_back(first + 2);
  }
  EXPECT_LE(RankList(ranks).size(), kMaxRankListBytes);
}

}  // namespace
}  // namespace syncnorm
