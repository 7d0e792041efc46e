// The one text form of a set of ranks in status messages and log lines,
// shared by the server (which writes it) and the client (which recognizes
// it in a message): short whatever the set's size, so that a job of many
// ranks cannot make a status outgrow gRPC's metadata limit (8 KiB by
// default) or a log line outgrow a log pipeline's.
#ifndef SYNCNORM_WIRE_RANK_LIST_H_
#define SYNCNORM_WIRE_RANK_LIST_H_

#include <cstddef>
#include <string>

#include "absl/types/span.h"

namespace syncnorm {

// The most pieces (a rank, or a run of three or more consecutive ranks)
// that RankList names.
inline constexpr size_t kRankListPieces = 16;

// The longest RankList: kRankListPieces runs of the widest int32 ranks and
// the count of the rest.
inline constexpr size_t kMaxRankListBytes = 512;

// `ranks` (ascending, distinct) as "[0, 2, 5-1023]": runs of three or more
// consecutive ranks as "first-last", the first kRankListPieces pieces
// only, then "and N more" for the N ranks not named:
// "[0, 2, 4, ..., 30, and 993 more]". At most kMaxRankListBytes bytes.
std::string RankList(absl::Span<const int> ranks);

}  // namespace syncnorm

#endif  // SYNCNORM_WIRE_RANK_LIST_H_
