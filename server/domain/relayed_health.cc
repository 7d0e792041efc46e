#include "server/domain/relayed_health.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace syncnorm {
namespace {

absl::Status EntryError(const Contribution& c, size_t i, const RankHealth& e,
                        absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("relay block of rank ", c.rank, ": health entry ", i,
                   " (rank ", e.rank, ", step ", e.step, ") ", what));
}

}  // namespace

absl::Status CheckRelayedHealth(const Contribution& c, int channels) {
  const RelayBlock& b = *c.block;
  const std::vector<RankHealth>& health = b.health;
  if (health.empty()) return absl::OkStatus();
  const size_t most = b.ranks.size() * kMaxRelayedHealthPerRank;
  if (health.size() > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "relay block of rank ", c.rank, " carries ", health.size(),
        " health entries for its ", b.ranks.size(), " ranks; at most ",
        kMaxRelayedHealthPerRank,
        " per rank (a relay keeps that many scored rounds of a block)"));
  }
  // A FORWARD is answered before its ranks are scored; a BACKWARD follows
  // its step's forward.
  const int64_t last = c.phase == Phase::kForward ? c.step - 1 : c.step;
  std::vector<std::pair<int, int64_t>> keys;
  keys.reserve(health.size());
  for (size_t i = 0; i < health.size(); ++i) {
    const RankHealth& e = health[i];
    if (!std::binary_search(b.ranks.begin(), b.ranks.end(), e.rank)) {
      return EntryError(c, i, e,
                        "names a rank the block does not merge; a relay "
                        "sends the scores of the block's own ranks");
    }
    if (e.step < 0 || e.step > last) {
      return EntryError(
          c, i, e,
          absl::StrCat("is of a step that is not before this contribution's (",
                       c.step, ", ", PhaseName(c.phase),
                       "); a round is scored after its answer"));
    }
    if (e.count < 1) {
      return EntryError(c, i, e,
                        absl::StrCat("has a count of ", e.count,
                                     "; a rank is scored for a batch >= 1"));
    }
    if (e.stuck_channel >= channels) {
      return EntryError(c, i, e,
                        absl::StrCat("names stuck channel ", e.stuck_channel,
                                     " of a layer of ", channels, " channels"));
    }
    keys.emplace_back(e.rank, e.step);
  }
  std::sort(keys.begin(), keys.end());
  const auto twice = std::adjacent_find(keys.begin(), keys.end());
  if (twice != keys.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("relay block of rank ", c.rank, " carries rank ",
                     twice->first, "'s health of step ", twice->second,
                     " twice; each rank's round is scored once"));
  }
  return absl::OkStatus();
}

}  // namespace syncnorm
