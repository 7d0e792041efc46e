// Statistics health's score of one rank against the rest of its group: the
// one formula that the shard (StatsHealth, over a round's contributions)
// and a relay (over its block's ranks and the round's answer) both use.
// Pure functions; docs/semantics.md ("Statistics health") gives the rules.
#ifndef SYNCNORM_SERVER_DOMAIN_RANK_SCORE_H_
#define SYNCNORM_SERVER_DOMAIN_RANK_SCORE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/moments.h"

namespace syncnorm {

// Channels scored for the mean and variance (an evenly spaced subset of
// larger layers), which bounds a round's scoring to O(W * 256).
inline constexpr int kMaxScoredChannels = 256;

// A score beyond this, in standard normal units, counts as beyond (mean
// shift one-sided, the variance ratio both ways).
inline constexpr double kHealthThreshold = 5.0;
// Ranks set aside as outliers before the others are scored against the
// rest, per round (ScoreAmongThemselves).
inline constexpr int kMaxHealthOutliers = 4;

// The channels scored of a layer of `channels`: all of a small layer, an
// evenly spaced subset of a large one, ascending.
std::vector<int> ScoredChannels(int channels);

// What a rank is scored against, on the scored channels: the center's
// values and mean, and an estimate of the channel's variance resting on
// `dof` degrees of freedom.
struct HealthCenter {
  int64_t count = 0;
  int64_t dof = 0;
  std::vector<double> mean;
  std::vector<double> var;
};

// The center of a round's group without one rank, from the round's global
// moments (var biased, as Finalize gives them) and that rank's own: the
// Chan merge run backwards. Its variance is the rest's unbiased one, M2 /
// (N - 1), which includes the spread between the rest's ranks (a relay
// sees only the merge). An empty center (count 0) when the rank holds
// every value. REQUIRES: rank.mean, rank.m2, global.mean and global.var
// have the layer's channels; channels within them.
HealthCenter CenterWithout(const GlobalMoments& global, const Moments& rank,
                           const std::vector<int>& channels);

// One rank's scores in one round, in standard normal units (Wilson and
// Hilferty's transform of a chi-square over its degrees of freedom); NaN
// where not scored.
struct RankScores {
  double mean_shift = std::numeric_limits<double>::quiet_NaN();
  double variance_ratio = std::numeric_limits<double>::quiet_NaN();
};

// The rank of moments `m` against `center` on `channels` (both from the
// same layer). `in_center`: whether the rank's batch is part of the
// center (the shard's pooled center) or not (a relay's CenterWithout).
// The mean shift is scored when the rank has a batch and the center other
// values; the variance ratio when the batch has 2 values or more and the
// center's variance rests on other ranks too.
RankScores ScoreRank(const Moments& m, bool in_center,
                     const HealthCenter& center,
                     const std::vector<int>& channels);

// Each of `moments` (ranks' moments of a layer of `channels`, in any
// order) against the others: their pooled mean, and their pooled
// within-rank variance (sum of M2 over sum of n - 1), which a rank's
// shift does not inflate. The rank that scores worst beyond
// kHealthThreshold is set aside and the others are scored again without
// it, at most kMaxHealthOutliers times and never a majority of the ranks
// with a batch, so that one outlier does not make the others look off.
// All NaN for fewer than 2 ranks with a batch. REQUIRES: each of
// `moments` has `channels` channels.
std::vector<RankScores> ScoreAmongThemselves(
    const std::vector<Moments>& moments, int channels);

// How far beyond the threshold a score is (mean shift one-sided, the
// variance ratio both ways); NaN counts as 0.
double ScoreExcess(const RankScores& s);

// The rank's lowest channel of one value (M2 = 0) where the group's values
// vary (global_var > 0), or -1; `tracked` (-1: none) is returned instead
// while it is still such a channel. -1 for a batch of fewer than 2.
int StuckChannel(const Moments& m, const std::vector<double>& global_var,
                 int tracked);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_RANK_SCORE_H_
