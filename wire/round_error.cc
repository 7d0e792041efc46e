#include "wire/round_error.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "wire/rank_list.h"

namespace syncnorm {

absl::Status WithMissingRanks(const absl::Status& status,
                              absl::Span<const int> missing_ranks) {
  if (status.ok() || missing_ranks.empty()) return status;
  const std::string ranks = RankList(missing_ranks);
  // The aggregator's deadline error says "waiting for ranks [1, 2]" itself.
  if (absl::StrContains(status.message(), ranks)) return status;
  absl::Status named(
      status.code(),
      absl::StrCat(status.message(), " (missing ranks ", ranks, ")"));
  status.ForEachPayload(
      [&named](absl::string_view url, const absl::Cord& payload) {
        named.SetPayload(url, payload);
      });
  return named;
}

void RoundErrorToProto(const absl::Status& status,
                       absl::Span<const int> missing_ranks,
                       v1::RoundError::Reason reason, v1::RoundError& out) {
  out.set_code(static_cast<int>(status.code()));
  out.set_message(std::string(status.message()));
  out.mutable_missing_ranks()->Assign(missing_ranks.begin(),
                                      missing_ranks.end());
  out.set_reason(reason);
}

absl::Status RoundErrorStatus(const v1::RoundError& error) {
  // absl and gRPC share the canonical code numbers.
  const int code = error.code() == 0
                       ? static_cast<int>(absl::StatusCode::kUnknown)
                       : error.code();
  absl::Status status = WithMissingRanks(
      absl::Status(static_cast<absl::StatusCode>(code), error.message()),
      error.missing_ranks());
  if (error.reason() != v1::RoundError::REASON_UNSPECIFIED) {
    status.SetPayload(kRoundErrorReasonUrl,
                      absl::Cord(v1::RoundError::Reason_Name(error.reason())));
  }
  return status;
}

}  // namespace syncnorm
