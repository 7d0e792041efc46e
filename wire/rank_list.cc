#include "wire/rank_list.h"

#include "wire/rank_set.h"

namespace syncnorm {

// One formatter, RankSet's. Of keeps the runs of consecutive ranks of any
// span in its order, which is all that RankList reads.
std::string RankList(absl::Span<const int> ranks) {
  return RankList(RankSet::Of(ranks));
}

}  // namespace syncnorm
