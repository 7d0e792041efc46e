#include "tests/testing/compare.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace syncnorm::testing {

Comparison Compare(const StackConfig& config, const ReferenceResult& ref,
                   const std::vector<RankOutput>& outputs) {
  Comparison c;
  auto note = [&c](double err, const std::string& what) {
    if (!(err <= c.worst)) {  // also takes NaN and infinity
      c.worst = std::isnan(err) ? INFINITY : err;
      c.worst_what = what;
    }
  };
  std::vector<bool> seen(config.world_size, false);
  for (const RankOutput& o : outputs) {
    if (o.rank < 0 || o.rank >= config.world_size ||
        o.y.size() != static_cast<size_t>(config.layers())) {
      note(INFINITY, absl::StrCat("malformed output of rank ", o.rank));
      continue;
    }
    seen[o.rank] = true;
    const int group = config.group_of(o.rank);
    for (int l = 0; l < config.layers(); ++l) {
      note(RelativeError(o.y[l], ref.y[l][o.rank]),
           absl::StrCat("output of layer ", l, " on rank ", o.rank));
      note(RelativeError(o.dx[l], ref.dx[l][o.rank]),
           absl::StrCat("grad_input of layer ", l, " on rank ", o.rank));
      const ReferenceStats& r = ref.running[group][l];
      if (o.running[l].num_batches_tracked != r.num_batches_tracked) {
        note(INFINITY, absl::StrCat("num_batches_tracked of layer ", l));
      }
      note(RelativeError(o.running[l].mean, r.mean),
           absl::StrCat("running_mean of layer ", l, " (group ", group, ")"));
      note(RelativeError(o.running[l].var, r.var),
           absl::StrCat("running_var of layer ", l, " (group ", group, ")"));
    }
  }
  for (int r = 0; r < config.world_size; ++r) {
    if (seen[r]) {
      ++c.ranks_seen;
    } else {
      note(INFINITY, absl::StrCat("no output from rank ", r));
    }
  }
  return c;
}

}  // namespace syncnorm::testing
