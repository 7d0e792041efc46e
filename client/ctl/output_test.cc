// How syncnormctl writes ranks in its tables.
#include "client/ctl/output.h"

#include <initializer_list>

#include "gtest/gtest.h"

namespace syncnorm::ctl {
namespace {

google::protobuf::RepeatedField<int32_t> Ranks(std::initializer_list<int> r) {
  return google::protobuf::RepeatedField<int32_t>(r.begin(), r.end());
}

TEST(FormatRanksTest, RunsOfThreeOrMoreBecomeRanges) {
  EXPECT_EQ(FormatRanks(Ranks({0, 1, 2, 3, 5, 7, 8})), "0-3,5,7,8");
  EXPECT_EQ(FormatRanks(Ranks({4})), "4");
  EXPECT_EQ(FormatRanks(Ranks({1, 2})), "1,2");
  EXPECT_EQ(FormatRanks(Ranks({9, 10, 11, 0})), "0,9-11");  // sorted
  EXPECT_EQ(FormatRanks(Ranks({})), "-");
}

}  // namespace
}  // namespace syncnorm::ctl
