#include "wire/round_error.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace syncnorm {
namespace {

TEST(WithMissingRanksTest, AppendsTheRanksInOneFormat) {
  const absl::Status s =
      WithMissingRanks(absl::DeadlineExceededError("the round timed out"),
                       std::vector<int>{1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "the round timed out (missing ranks [1, 2])");
}

TEST(WithMissingRanksTest, KeepsAMessageThatListsThemAlready) {
  // The aggregator's own deadline error.
  const absl::Status deadline = absl::DeadlineExceededError(
      "round (job j, layer 0, step 3, FORWARD) missed its 200 ms deadline "
      "waiting for ranks [0, 2]");
  EXPECT_EQ(WithMissingRanks(deadline, std::vector<int>{0, 2}), deadline);
  // Another list is not these ranks.
  EXPECT_EQ(WithMissingRanks(deadline, std::vector<int>{2}).message(),
            absl::StrCat(deadline.message(), " (missing ranks [2])"));
}

TEST(WithMissingRanksTest, ManyRanksAreNamedInABoundedForm) {
  std::vector<int> ranks;  // 1..1023 and every other rank up to 4096
  for (int r = 1; r < 1024; ++r) ranks.push_back(r);
  for (int r = 1026; r < 4096; r += 2) ranks.push_back(r);
  const absl::Status s =
      WithMissingRanks(absl::DeadlineExceededError("late"), ranks);
  EXPECT_EQ(s.message(),
            "late (missing ranks [1-1023, 1026, 1028, 1030, 1032, 1034, 1036, "
            "1038, 1040, 1042, 1044, 1046, 1048, 1050, 1052, 1054, and 1520 "
            "more])");
}

TEST(WithMissingRanksTest, NoRanksOrOkIsAsItIs) {
  const absl::Status aborted = absl::AbortedError("the job was deleted");
  EXPECT_EQ(WithMissingRanks(aborted, {}), aborted);
  EXPECT_TRUE(WithMissingRanks(absl::OkStatus(), std::vector<int>{3}).ok());
}

TEST(WithMissingRanksTest, KeepsThePayloads) {
  absl::Status s = absl::FailedPreconditionError("no");
  s.SetPayload("x", absl::Cord("y"));
  const absl::Status named = WithMissingRanks(s, std::vector<int>{4});
  ASSERT_TRUE(named.GetPayload("x").has_value());
  EXPECT_EQ(std::string(*named.GetPayload("x")), "y");
}

TEST(RoundErrorTest, WritesCodeMessageRanksAndReason) {
  v1::RoundError e;
  RoundErrorToProto(absl::DeadlineExceededError("late"), std::vector<int>{2, 3},
                    v1::RoundError::SINGLE_VALUE_PER_CHANNEL, e);
  EXPECT_EQ(e.code(), 4);  // DEADLINE_EXCEEDED in gRPC and absl
  EXPECT_EQ(e.message(), "late");
  ASSERT_EQ(e.missing_ranks_size(), 2);
  EXPECT_EQ(e.missing_ranks(1), 3);
  EXPECT_EQ(e.reason(), v1::RoundError::SINGLE_VALUE_PER_CHANNEL);
}

TEST(RoundErrorTest, ReadsBackAsTheStatusNamingTheRanksAndReason) {
  v1::RoundError e;
  RoundErrorToProto(absl::FailedPreconditionError("one value per channel"),
                    std::vector<int>{1},
                    v1::RoundError::SINGLE_VALUE_PER_CHANNEL, e);
  const absl::Status s = RoundErrorStatus(e);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "one value per channel (missing ranks [1])");
  const auto reason = s.GetPayload(kRoundErrorReasonUrl);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(std::string(*reason), "SINGLE_VALUE_PER_CHANNEL");
}

TEST(RoundErrorTest, NoReasonNoPayloadAndCodeZeroIsUnknown) {
  v1::RoundError e;
  e.set_message("something");
  const absl::Status s = RoundErrorStatus(e);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "something");
  EXPECT_FALSE(s.GetPayload(kRoundErrorReasonUrl).has_value());
}

}  // namespace
}  // namespace syncnorm
