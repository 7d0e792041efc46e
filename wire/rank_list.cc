#include "wire/rank_list.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace syncnorm {

std::string RankList(absl::Span<const int> ranks) {
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < ranks.size() && pieces.size() < kRankListPieces) {
    // [i, end) is a run of consecutive ranks.
    size_t end = i + 1;
    while (end < ranks.size() &&
           static_cast<int64_t>(ranks[end]) == ranks[end - 1] + int64_t{1}) {
      ++end;
    }
    if (end - i >= 3) {
      pieces.push_back(absl::StrCat(ranks[i], "-", ranks[end - 1]));
      i = end;
    } else {
      pieces.push_back(absl::StrCat(ranks[i]));
      ++i;
    }
  }
  if (i < ranks.size()) {
    pieces.push_back(absl::StrCat("and ", ranks.size() - i, " more"));
  }
  return absl::StrCat("[", absl::StrJoin(pieces, ", "), "]");
}

}  // namespace syncnorm
