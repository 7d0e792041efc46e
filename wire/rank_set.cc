#include "wire/rank_set.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "wire/rank_list.h"

namespace syncnorm {

RankSet::RankSet(std::vector<Run> runs) {
  if (runs.empty()) return;
  for (const Run& r : runs) size_ += int64_t{r.last} - r.first + 1;
  runs_ = std::make_shared<const std::vector<Run>>(std::move(runs));
}

RankSet RankSet::Of(absl::Span<const int> ranks) {
  std::vector<Run> runs;
  for (int r : ranks) {
    if (!runs.empty() && int64_t{runs.back().last} + 1 == r) {
      runs.back().last = r;
    } else {
      runs.push_back(Run{r, r});
    }
  }
  return RankSet(std::move(runs));
}

RankSet RankSet::Range(int first, int last) {
  if (last < first) return RankSet();
  return RankSet(std::vector<Run>{Run{first, last}});
}

RankSet RankSet::FromRuns(absl::Span<const Run> runs) {
  std::vector<Run> merged;
  for (const Run& r : runs) {
    if (!merged.empty() && int64_t{merged.back().last} + 1 == r.first) {
      merged.back().last = r.last;
    } else {
      merged.push_back(r);
    }
  }
  return RankSet(std::move(merged));
}

absl::StatusOr<RankSet> RankSet::FromFlatRuns(absl::Span<const int32_t> flat,
                                              int world_size) {
  if (flat.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("half a run: ", flat.size(), " values, not pairs"));
  }
  std::vector<Run> runs;
  runs.reserve(flat.size() / 2);
  int64_t next = 0;  // the lowest rank the next run may start at
  for (size_t i = 0; i < flat.size(); i += 2) {
    if (flat[i] < next || flat[i + 1] < flat[i] || flat[i + 1] >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "runs that are not ascending, disjoint ranks of 0..", world_size - 1,
          " (pair ", i / 2, ": ", flat[i], "-", flat[i + 1], ")"));
    }
    runs.push_back(Run{flat[i], flat[i + 1]});
    next = int64_t{flat[i + 1]} + 1;
  }
  return FromRuns(runs);
}

bool RankSet::contains(int rank) const {
  const absl::Span<const Run> all = runs();
  // The first run that ends at or after `rank`.
  auto it =
      std::lower_bound(all.begin(), all.end(), rank,
                       [](const Run& run, int r) { return run.last < r; });
  return it != all.end() && it->first <= rank;
}

std::vector<int> RankSet::ranks() const {
  std::vector<int> out;
  out.reserve(static_cast<size_t>(size_));
  for (int r : *this) out.push_back(r);
  return out;
}

RankSet RankSet::Union(const RankSet& a, const RankSet& b) {
  if (b.empty()) return a;
  if (a.empty()) return b;
  std::vector<Run> all;
  all.reserve(a.runs().size() + b.runs().size());
  std::merge(a.runs().begin(), a.runs().end(), b.runs().begin(), b.runs().end(),
             std::back_inserter(all),
             [](const Run& x, const Run& y) { return x.first < y.first; });
  std::vector<Run> out;
  for (const Run& r : all) {
    if (!out.empty() && int64_t{out.back().last} + 1 >= r.first) {
      out.back().last = std::max(out.back().last, r.last);
    } else {
      out.push_back(r);
    }
  }
  return RankSet(std::move(out));
}

RankSet RankSet::Difference(const RankSet& a, const RankSet& b) {
  if (a.empty() || b.empty()) return a;
  std::vector<Run> out;
  const absl::Span<const Run> cut = b.runs();
  size_t j = 0;
  for (const Run& run : a.runs()) {
    int64_t first = run.first;  // what is left of `run` starts here
    while (j < cut.size() && cut[j].last < first) ++j;
    for (size_t k = j; k < cut.size() && cut[k].first <= run.last; ++k) {
      if (cut[k].first > first) {
        out.push_back(Run{static_cast<int>(first), cut[k].first - 1});
      }
      first = std::max<int64_t>(first, int64_t{cut[k].last} + 1);
    }
    if (first <= run.last) {
      out.push_back(Run{static_cast<int>(first), run.last});
    }
  }
  return RankSet(std::move(out));
}

bool operator==(const RankSet& a, const RankSet& b) {
  if (a.size_ != b.size_) return false;
  const absl::Span<const RankSet::Run> x = a.runs();
  const absl::Span<const RankSet::Run> y = b.runs();
  return std::equal(x.begin(), x.end(), y.begin(), y.end());
}

std::string RankList(const RankSet& ranks) {
  std::vector<std::string> pieces;
  int64_t named = 0;
  for (const RankSet::Run& run : ranks.runs()) {
    if (pieces.size() >= kRankListPieces) break;
    const int64_t length = int64_t{run.last} - run.first + 1;
    if (length >= 3) {
      pieces.push_back(absl::StrCat(run.first, "-", run.last));
      named += length;
      continue;
    }
    for (int64_t r = run.first;
         r <= run.last && pieces.size() < kRankListPieces; ++r) {
      pieces.push_back(absl::StrCat(r));
      ++named;
    }
  }
  if (named < ranks.size()) {
    pieces.push_back(absl::StrCat("and ", ranks.size() - named, " more"));
  }
  return absl::StrCat("[", absl::StrJoin(pieces, ", "), "]");
}

}  // namespace syncnorm
