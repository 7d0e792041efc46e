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

// A random cover of positions [lo, lo + size) by aligned blocks and single
// positions, as relays at several levels would send them: each entry is
// (first, positions), positions 1 meaning a leaf.
void RandomCover(int lo, int size, int n, std::mt19937& rng,
                 std::vector<std::pair<int, int>>& out) {
  if (lo >= n) return;  // nothing of the group here
  const int pick = static_cast<int>(rng() % 3);
  if (size == 1 || pick == 0) {
    out.emplace_back(lo, size);
    return;
  }
  RandomCover(lo, size / 2, n, rng, out);
  RandomCover(lo + size / 2, size / 2, n, rng, out);
}

// Adds `cover`'s entries in a random order: a block's payload is its
// positions folded as docs/semantics.md writes (DocumentedFold), not by the
// tree.
void AddCover(MergeTree& tree, const std::vector<std::pair<int, int>>& cover,
              const std::vector<Moments>& m, const std::vector<bool>& present,
              std::mt19937& rng) {
  std::vector<std::pair<int, int>> order = cover;
  std::shuffle(order.begin(), order.end(), rng);
  for (const auto& [first, positions] : order) {
    const std::optional<Moments> fold =
        DocumentedFold(m, present, first, positions);
    if (!fold.has_value()) continue;  // nobody of it sent
    if (positions == 1) {
      tree.Add(first, *fold);
      continue;
    }
    int merged = 0;
    int first_present = -1;
    for (int i = first; i < first + positions && i < static_cast<int>(m.size());
         ++i) {
      if (!present[i]) continue;
      if (first_present < 0) first_present = i;
      ++merged;
    }
    tree.AddBlock(first, positions, merged, first_present, *fold);
  }
}

TEST(MergeTreeTest, BlocksTakenAtTheirSubtreesGiveTheDirectBits) {
  for (int w : {1, 2, 3, 5, 8, 12, 13, 16, 31, 33, 100}) {
    const std::vector<int> ranks = Ranks(w);
    const std::vector<Moments> m = RandomMoments(w, 1000 + w);
    int p = 1;
    while (p < w) p *= 2;
    std::mt19937 rng(w);
    for (int trial = 0; trial < 30; ++trial) {
      // Every other trial, some ranks never send (a quorum round).
      std::vector<bool> present(w, true);
      if (trial % 2 == 1) {
        for (int i = 0; i < w; ++i) present[i] = rng() % 5 != 0;
      }
      std::vector<std::pair<int, int>> cover;
      RandomCover(0, p, w, rng, cover);
      MergeTree tree(ranks);
      AddCover(tree, cover, m, present, rng);
      const Moments got = *tree.MergedMoments(kChannels);
      ASSERT_TRUE(SameBits(got, Documented(m, present)))
          << "W=" << w << " trial " << trial;
      ExpectNearPooled(got, m, present);
    }
  }
}

TEST(MergeTreeTest, ABlockReplacesTheLeavesAndMergesItCovers) {
  // Positions 0-3 sent directly (0-1 merged already), then a relay's block
  // of 0-7 arrives with the same payloads: the block alone stands for them.
  const int w = 16;
  const std::vector<int> ranks = Ranks(w);
  const std::vector<Moments> m = RandomMoments(w, 23);
  const std::vector<bool> all(w, true);
  MergeTree tree(ranks);
  for (int i : {0, 1, 3, 12}) tree.Add(i, m[i]);
  tree.AddBlock(0, 8, 8, 0, *DocumentedFold(m, all, 0, 8));
  for (int i : {0, 1, 3}) EXPECT_EQ(tree.Leaf(i), nullptr) << i;
  EXPECT_NE(tree.Leaf(12), nullptr);
  for (int i = 8; i < w; ++i) {
    if (i != 12) tree.Add(i, m[i]);
  }
  EXPECT_TRUE(SameBits(*tree.MergedMoments(kChannels), Documented(m, all)));
}

TEST(MergeTreeTest, AResetKeepsBlocksAndARemovedBlockReopens) {
  const int w = 12;  // P = 16: the block 8-15 holds positions 8-11 only
  const std::vector<int> ranks = Ranks(w);
  const std::vector<Moments> m = RandomMoments(w, 31);
  std::vector<bool> present(w, true);
  MergeTree tree(ranks);
  tree.AddBlock(8, 8, 4, 8, *DocumentedFold(m, present, 8, 8));
  tree.AddBlock(0, 4, 4, 0, *DocumentedFold(m, present, 0, 4));
  tree.Add(5, m[5]);
  // Position 6 leaves: the blocks stay, 4 and 7 still may send.
  tree.Reset([](int i) { return i != 6; });
  present[6] = false;
  // The block of 0-3 goes (its members changed, say): its positions reopen
  // empty, and send one by one.
  tree.RemoveBlock(0, 4);
  tree.Reset([](int i) { return i != 6; });
  for (int i : {3, 1, 4, 0, 7, 2}) tree.Add(i, m[i]);
  const Moments got = *tree.MergedMoments(kChannels);
  EXPECT_TRUE(SameBits(got, Documented(m, present)));
  ExpectNearPooled(got, m, present);
}

TEST(MergeTreeTest, AHealthReadOfTheLeavesSkipsABlocksRanks) {
  const int w = 8;
  const std::vector<int> ranks = Ranks(w, 40);
  const std::vector<Moments> m = RandomMoments(w, 3);
  const std::vector<bool> all(w, true);
  MergeTree tree(ranks);
  tree.AddBlock(4, 4, 4, 44, *DocumentedFold(m, all, 4, 4));
  for (int i = 0; i < 4; ++i) tree.Add(i, m[i]);
  ASSERT_TRUE(tree.MergedMoments(kChannels).ok());
  std::vector<int> taken_ranks;
  std::vector<Moments> taken;
  tree.TakeMoments(taken_ranks, taken);
  EXPECT_EQ(taken_ranks, (std::vector<int>{40, 41, 42, 43}));
  ASSERT_EQ(taken.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(SameBits(taken[i], m[i]));
}

TEST(MergeTreeTest, AnOverflowInsideABlocksSiblingNamesTheBlocksFirstRank) {
  const int64_t big = std::numeric_limits<int64_t>::max() - 1;
  Moments huge = Moments::Zero(kChannels);
  huge.count = big;
  Moments two = Moments::Zero(kChannels);
  two.count = 2;
  const std::vector<int> ranks = Ranks(8, 10);
  MergeTree tree(ranks);
  tree.Add(0, huge);
  for (int i = 1; i < 4; ++i) tree.Add(i, Moments::Zero(kChannels));
  tree.AddBlock(4, 4, 3, 15, two);  // ranks 15-17 merged, 14 not a member
  const absl::StatusOr<Moments> got = tree.MergedMoments(kChannels);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("rank 15's count does not fit"),
            absl::string_view::npos)
      << got.status();
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
