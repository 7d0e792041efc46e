// A failed round as the wire carries it (syncnorm.v1.RoundError) and as an
// absl::Status: the one mapping the server writes and the client reads, and
// the one way a status names the ranks a round missed.
#ifndef SYNCNORM_WIRE_ROUND_ERROR_H_
#define SYNCNORM_WIRE_ROUND_ERROR_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// The status payload (absl::Status::GetPayload) of a failed round's
// RoundError.reason, e.g. "SINGLE_VALUE_PER_CHANNEL", when it has one.
inline constexpr char kRoundErrorReasonUrl[] = "syncnorm.v1.RoundError.reason";

// `status` with a message that names `missing_ranks`: as it is when there
// are none, when it is OK, or when its message already lists them as
// RankList does ("[1, 2]"); otherwise with " (missing ranks [1, 2])"
// appended. The list is bounded (rank_list.h) whatever the number of
// ranks: the complete list is RoundError.missing_ranks. The code and the
// payloads are kept.
absl::Status WithMissingRanks(const absl::Status& status,
                              absl::Span<const int> missing_ranks);

// The RoundError of a failed round: the status's code and message as they
// are, every rank missing at its deadline and the cause a client may act
// on. REQUIRES: !status.ok().
void RoundErrorToProto(const absl::Status& status,
                       absl::Span<const int> missing_ranks,
                       v1::RoundError::Reason reason, v1::RoundError& out);

// The status of a RoundError: its code (UNKNOWN for 0, which is no error),
// its message naming its missing ranks (WithMissingRanks), and its reason,
// unless REASON_UNSPECIFIED, as the payload kRoundErrorReasonUrl holding
// the reason's name.
absl::Status RoundErrorStatus(const v1::RoundError& error);

}  // namespace syncnorm

#endif  // SYNCNORM_WIRE_ROUND_ERROR_H_
