#include "client/shard_router.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

using ::testing::ElementsAre;

TEST(ParseShardListTest, OneAddressListsAndRanges) {
  EXPECT_EQ(*ParseShardList("127.0.0.1:50051"),
            std::vector<std::string>{"127.0.0.1:50051"});
  EXPECT_EQ(*ParseShardList("a:1, b:2,c:3"),
            (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  EXPECT_EQ(*ParseShardList("dns:///agg-{0..2}.agg.ns.svc:50051"),
            (std::vector<std::string>{"dns:///agg-0.agg.ns.svc:50051",
                                      "dns:///agg-1.agg.ns.svc:50051",
                                      "dns:///agg-2.agg.ns.svc:50051"}));
  EXPECT_EQ(*ParseShardList("x:1,h{3..4}:9"),
            (std::vector<std::string>{"x:1", "h3:9", "h4:9"}));
}

TEST(ParseShardListTest, RejectsWhatIsNoList) {
  for (const char* bad :
       {"", "a:1,,b:2", "a:1,", "h{2..1}:1", "h{0..}:1", "h{a..b}:1", "h}:1",
        "h{0..1}{0..1}:1", "h{0..99999}:1"}) {
    absl::StatusOr<std::vector<std::string>> got = ParseShardList(bad);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// The hash is a contract between every client of a job: these values must
// never change (they were computed by an independent implementation of the
// formulas in shard_router.h).
TEST(RendezvousTest, PinnedValues) {
  EXPECT_EQ(ShardKey("", 0), 0x4d25767f9dce13f5ULL);
  EXPECT_EQ(ShardKey("resnet50-run7", 3), 0x944fd2be31f2e1a1ULL);
  EXPECT_EQ(RendezvousScore(ShardKey("resnet50-run7", 3), 2),
            0xf069237cf90f48d3ULL);
  std::vector<int> placed;
  for (int l = 0; l < 12; ++l) placed.push_back(ShardOf("resnet50-run7", l, 3));
  EXPECT_THAT(placed, ElementsAre(0, 0, 2, 0, 1, 0, 1, 2, 0, 2, 1, 0));
  placed.clear();
  for (int l = 0; l < 12; ++l) placed.push_back(ShardOf("run", l, 3));
  EXPECT_THAT(placed, ElementsAre(1, 0, 1, 0, 0, 2, 0, 0, 2, 1, 2, 2));
}

TEST(RendezvousTest, OneShardHoldsEverything) {
  for (int l = 0; l < 100; ++l) EXPECT_EQ(ShardOf("job", l, 1), 0);
  EXPECT_EQ(OwnedLayers("job", 5, 0, 1), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(RendezvousTest, SpreadsEvenlyAndOwnedLayersPartition) {
  const int kLayers = 3000;
  std::vector<int> per_shard(3);
  for (int l = 0; l < kLayers; ++l) ++per_shard[ShardOf("job-a", l, 3)];
  for (int n : per_shard) {
    EXPECT_GT(n, kLayers / 3 - 150);
    EXPECT_LT(n, kLayers / 3 + 150);
  }
  std::set<int> all;
  for (int s = 0; s < 3; ++s) {
    for (int l : OwnedLayers("job-a", 60, s, 3)) {
      EXPECT_TRUE(all.insert(l).second) << "layer " << l << " twice";
      EXPECT_EQ(ShardOf("job-a", l, 3), s);
    }
  }
  EXPECT_EQ(all.size(), 60u);
}

// Rendezvous hashing moves only the layers the new shard wins.
TEST(RendezvousTest, AddingAShardMovesOnlyItsShare) {
  const int kLayers = 4000;
  int moved = 0;
  for (int l = 0; l < kLayers; ++l) {
    const int before = ShardOf("job-b", l, 4);
    const int after = ShardOf("job-b", l, 5);
    if (after != before) {
      EXPECT_EQ(after, 4) << "layer " << l << " moved between old shards";
      ++moved;
    }
  }
  EXPECT_GT(moved, kLayers / 5 - 200);
  EXPECT_LT(moved, kLayers / 5 + 200);
}

}  // namespace
}  // namespace syncnorm
