#include "server/domain/merge_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"

namespace syncnorm {
namespace {

constexpr int kChannels = 5;

std::vector<int> Ranks(int n, int first = 0) {
  std::vector<int> r(n);
  std::iota(r.begin(), r.end(), first);
  return r;
}

// Uneven, wide-ranged moments, some of them empty (count 0).
std::vector<Moments> RandomMoments(int n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mean(-50.0, 50.0);
  std::uniform_real_distribution<double> spread(0.0, 30.0);
  std::vector<Moments> out(n);
  for (int i = 0; i < n; ++i) {
    Moments& m = out[i];
    m.count = rng() % 7 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 5000);
    for (int c = 0; c < kChannels; ++c) {
      m.mean.push_back(m.count == 0 ? 0.0 : mean(rng));
      m.m2.push_back(m.count == 0 ? 0.0 : spread(rng) * m.count);
    }
  }
  return out;
}

bool SameBits(const Moments& a, const Moments& b) {
  return a.count == b.count && a.mean.size() == b.mean.size() &&
         std::memcmp(a.mean.data(), b.mean.data(),
                     a.mean.size() * sizeof(double)) == 0 &&
         std::memcmp(a.m2.data(), b.m2.data(), a.m2.size() * sizeof(double)) ==
             0;
}

// The order docs/semantics.md writes down, as written there: the result of
// an aligned block [lo, lo + size) of positions is its left half's with its
// right half's folded in; a half with nothing present is skipped.
std::optional<Moments> DocumentedFold(const std::vector<Moments>& m,
                                      const std::vector<bool>& present, int lo,
                                      int size) {
  if (size == 1) {
    if (lo >= static_cast<int>(m.size()) || !present[lo]) return std::nullopt;
    return m[lo];
  }
  std::optional<Moments> left = DocumentedFold(m, present, lo, size / 2);
  std::optional<Moments> right =
      DocumentedFold(m, present, lo + size / 2, size / 2);
  if (!left.has_value()) return right;
  if (right.has_value()) MergeMoments(*left, *right);
  return left;
}

Moments Documented(const std::vector<Moments>& m,
                   const std::vector<bool>& present) {
  int p = 1;
  while (p < static_cast<int>(m.size())) p *= 2;
  std::optional<Moments> r = DocumentedFold(m, present, 0, p);
  return r.has_value() ? *r : Moments::Zero(kChannels);
}

// An independent reference in long double: the pooled count, mean and sum
// of squared deviations of the ranks present.
void ExpectNearPooled(const Moments& got, const std::vector<Moments>& m,
                      const std::vector<bool>& present) {
  int64_t n = 0;
  for (size_t i = 0; i < m.size(); ++i) n += present[i] ? m[i].count : 0;
  ASSERT_EQ(got.count, n);
  for (int c = 0; c < kChannels; ++c) {
    long double sum = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      if (present[i])
        sum += static_cast<long double>(m[i].mean[c]) * m[i].count;
    }
    const long double mean = n == 0 ? 0 : sum / n;
    long double m2 = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      if (!present[i]) continue;
      const long double d = m[i].mean[c] - mean;
      m2 += m[i].m2[c] + d * d * m[i].count;
    }
    EXPECT_NEAR(got.mean[c], static_cast<double>(mean),
                1e-12 * (1 + std::fabs(static_cast<double>(mean))));
    EXPECT_NEAR(got.m2[c], static_cast<double>(m2),
                1e-11 * (1 + static_cast<double>(m2)));
  }
}

Moments MergeInOrder(const std::vector<int>& ranks,
                     const std::vector<Moments>& m,
                     const std::vector<int>& order) {
  MergeTree tree(ranks);
  for (int i : order) tree.Add(i, m[i]);
  return *tree.MergedMoments(kChannels);
}

TEST(MergeTreeTest, EveryArrivalOrderGivesTheSameBits) {
  for (int w : {1, 2, 3, 5, 8, 13, 64, 100, 1000}) {
    const std::vector<int> ranks = Ranks(w);
    const std::vector<Moments> m = RandomMoments(w, 7 + w);
    const std::vector<bool> all(w, true);
    const Moments documented = Documented(m, all);
    ExpectNearPooled(documented, m, all);
    std::vector<int> order = Ranks(w);
    std::mt19937 rng(w);
    for (int trial = 0; trial < 20; ++trial) {
      if (trial == 1) std::reverse(order.begin(), order.end());
      if (trial > 1) std::shuffle(order.begin(), order.end(), rng);
      const Moments got = MergeInOrder(ranks, m, order);
      ASSERT_TRUE(SameBits(got, documented))
          << "W=" << w << " trial " << trial
          << ": the arrival order changed the result";
    }
  }
}

TEST(MergeTreeTest, AnAlignedBlockMergedApartGivesTheSameBits) {
  // What a relay would do: merge each aligned block of 8 positions on its
  // own, then the blocks' results as positions of a tree of W/8.
  const int w = 64, block = 8;
  const std::vector<int> ranks = Ranks(w);
  const std::vector<Moments> m = RandomMoments(w, 99);
  const Moments direct = MergeInOrder(ranks, m, Ranks(w));
  std::vector<Moments> blocks;
  const std::vector<int> block_ranks = Ranks(block);
  for (int b = 0; b < w / block; ++b) {
    MergeTree tree(block_ranks);
    for (int i = 0; i < block; ++i) tree.Add(i, m[b * block + i]);
    blocks.push_back(*tree.MergedMoments(kChannels));
  }
  const std::vector<int> upper = Ranks(w / block);
  EXPECT_TRUE(SameBits(MergeInOrder(upper, blocks, Ranks(w / block)), direct));
}

TEST(MergeTreeTest, AQuorumRoundMergesWhatIsPresentAtTheEnd) {
  const int w = 37;
  const std::vector<int> ranks = Ranks(w, 100);
  const std::vector<Moments> m = RandomMoments(w, 5);
  std::vector<bool> present(w, true);
  for (int i : {0, 6, 7, 20, 36}) present[i] = false;
  const Moments documented = Documented(m, present);
  ExpectNearPooled(documented, m, present);
  std::vector<int> order;
  for (int i = 0; i < w; ++i) {
    if (present[i]) order.push_back(i);
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    MergeTree tree(ranks);
    for (int i : order) tree.Add(i, m[i]);
    EXPECT_TRUE(SameBits(*tree.MergedMoments(kChannels), documented));
  }
}

TEST(MergeTreeTest, AResetDropsAMergedPayloadAndMergesAgain) {
  const int w = 16;
  const std::vector<int> ranks = Ranks(w);
  const std::vector<Moments> m = RandomMoments(w, 11);
  MergeTree tree(ranks);
  for (int i = 0; i < w; ++i) {
    if (i != 9) tree.Add(i, m[i]);  // position 3's subtree merges whole
  }
  // Position 3 leaves (an outside rank) after its block was merged; 9 may
  // still send, and does.
  tree.Reset([](int i) { return i != 3; });
  EXPECT_EQ(tree.Leaf(3), nullptr);
  tree.Add(9, m[9]);
  std::vector<bool> present(w, true);
  present[3] = false;
  const Moments got = *tree.MergedMoments(kChannels);
  EXPECT_TRUE(SameBits(got, Documented(m, present)));
  ExpectNearPooled(got, m, present);
}

TEST(MergeTreeTest, NothingPresentIsZero) {
  MergeTree tree(Ranks(3));
  const Moments got = *tree.MergedMoments(kChannels);
  EXPECT_TRUE(SameBits(got, Moments::Zero(kChannels)));
}

TEST(MergeTreeTest, ACountOverflowNamesTheRankAndTheFirstInTreeOrderWins) {
  const int64_t big = std::numeric_limits<int64_t>::max() - 1;
  auto counted = [](int64_t count) {
    Moments m = Moments::Zero(kChannels);
    m.count = count;
    return m;
  };
  // Positions 0-3 overflow at rank 11 (position 1); 4-7 at rank 15
  // (position 5). Either order of arrival names rank 11.
  const std::vector<int> ranks = Ranks(8, 10);
  for (bool right_first : {false, true}) {
    MergeTree tree(ranks);
    std::vector<int> order = {4, 5, 6, 7, 0, 1, 2, 3};
    if (!right_first)
      std::rotate(order.begin(), order.begin() + 4, order.end());
    for (int i : order)
      tree.Add(i, counted(i % 4 == 0 ? big : i % 4 == 1 ? 2 : 1));
    const absl::StatusOr<Moments> got = tree.MergedMoments(kChannels);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("rank 11's count does not fit"),
              absl::string_view::npos)
        << got.status();
  }
}

TEST(MergeTreeTest, GradientSumsAddUpInAnyOrder) {
  const int w = 29;
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> value(-1e3, 1e3);
  std::vector<GradSums> g(w);
  for (GradSums& s : g) {
    for (int c = 0; c < kChannels; ++c) {
      s.sum_dy.push_back(value(rng));
      s.sum_dy_xmu.push_back(value(rng));
    }
  }
  std::vector<int> order = Ranks(w);
  std::optional<GradSums> first;
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    MergeTree tree(Ranks(w));
    for (int i : order) tree.Add(i, g[i]);
    const GradSums got = tree.SummedGradSums(kChannels);
    for (int c = 0; c < kChannels; ++c) {
      long double dy = 0;
      for (const GradSums& s : g) dy += s.sum_dy[c];
      EXPECT_NEAR(got.sum_dy[c], static_cast<double>(dy), 1e-9);
    }
    if (!first.has_value()) first = got;
    EXPECT_EQ(std::memcmp(got.sum_dy.data(), first->sum_dy.data(),
                          kChannels * sizeof(double)),
              0);
    EXPECT_EQ(std::memcmp(got.sum_dy_xmu.data(), first->sum_dy_xmu.data(),
                          kChannels * sizeof(double)),
              0);
  }
}

}  // namespace
}  // namespace syncnorm
