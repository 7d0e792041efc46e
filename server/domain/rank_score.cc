#include "server/domain/rank_score.h"

#include <algorithm>
#include <cmath>

namespace syncnorm {
namespace {

// A chi-square variable over its degrees of freedom, x = chi2_k / k, as a
// standard normal deviate (Wilson and Hilferty, 1931): close from k = 2
// on, so one threshold means about the same false-alarm rate for a layer
// of 2 channels and one of 2048, and for batches of 2 and of 64.
double WilsonHilferty(double x, double k) {
  const double v = 2.0 / (9.0 * k);
  return (std::cbrt(x) - (1.0 - v)) / std::sqrt(v);
}

}  // namespace

std::vector<int> ScoredChannels(int channels) {
  const int n = std::max(0, std::min(channels, kMaxScoredChannels));
  std::vector<int> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = static_cast<int>(static_cast<int64_t>(i) * channels / n);
  }
  return out;
}

HealthCenter CenterWithout(const GlobalMoments& global, const Moments& rank,
                           const std::vector<int>& channels) {
  HealthCenter c;
  const int64_t rest = global.count - rank.count;
  if (rest <= 0) return c;
  c.count = rest;
  c.dof = rest - 1;
  c.mean.resize(channels.size());
  c.var.resize(channels.size());
  const double total = static_cast<double>(global.count);
  const double n = static_cast<double>(rank.count);
  const double m = static_cast<double>(rest);
  for (size_t k = 0; k < channels.size(); ++k) {
    const int ch = channels[k];
    const double mean = global.mean[ch];
    // The rest's mean, as the global one moved away from the rank's (no
    // difference of two large sums).
    const double rest_mean = mean + n * (mean - rank.mean[ch]) / m;
    const double delta = rank.mean[ch] - rest_mean;
    // Chan: M2 = M2_rank + M2_rest + delta^2 n m / N, solved for M2_rest;
    // rounding may leave a hair below zero.
    const double m2 = std::max(0.0, global.var[ch] * total - rank.m2[ch] -
                                        delta * delta * n * m / total);
    c.mean[k] = rest_mean;
    c.var[k] = c.dof > 0 ? m2 / static_cast<double>(c.dof) : 0;
  }
  return c;
}

RankScores ScoreRank(const Moments& m, bool in_center,
                     const HealthCenter& center,
                     const std::vector<int>& channels) {
  RankScores out;
  if (m.count < 1) return out;
  const double n = static_cast<double>(m.count);
  const double total = static_cast<double>(center.count);
  // The variance of the rank's mean minus the center's, in units of the
  // channel's variance.
  const double se = in_center
                        ? 1.0 / n - 1.0 / total
                        : 1.0 / n + (center.count > 0 ? 1.0 / total : 0.0);
  double s = 0, r = 0;
  int used = 0;
  for (size_t k = 0; k < channels.size() && k < center.var.size(); ++k) {
    const double var = center.var[k];
    if (!(var > 0) || !std::isfinite(var)) continue;
    const double d = m.mean[channels[k]] - center.mean[k];
    s += d * d / (var * se);
    if (m.count >= 2) r += m.m2[channels[k]] / (n - 1.0) / var;
    ++used;
  }
  if (used == 0) return out;
  // The center must hold values other than the rank's.
  if (se > 0 && (in_center ? center.count > m.count : center.count > 0)) {
    out.mean_shift = WilsonHilferty(s / used, used);
  }
  // The center's variance must rest on other ranks too.
  if (m.count >= 2 && center.dof > (in_center ? m.count - 1 : 0)) {
    out.variance_ratio = WilsonHilferty(r / used, (n - 1.0) * used);
  }
  return out;
}

double ScoreExcess(const RankScores& s) {
  double e = 0;
  if (s.mean_shift > 0) e = std::max(e, s.mean_shift);
  if (!std::isnan(s.variance_ratio))
    e = std::max(e, std::abs(s.variance_ratio));
  return e;
}

namespace {

// The center of the ranks in `clean`: their pooled mean and within-rank
// variance.
HealthCenter PooledCenter(const std::vector<Moments>& moments,
                          const std::vector<bool>& clean,
                          const std::vector<int>& channels) {
  HealthCenter c;
  c.mean.assign(channels.size(), 0.0);
  c.var.assign(channels.size(), 0.0);
  for (size_t i = 0; i < moments.size(); ++i) {
    const Moments& m = moments[i];
    if (!clean[i] || m.count < 1) continue;
    c.count += m.count;
    c.dof += m.count - 1;
    const double n = static_cast<double>(m.count);
    for (size_t k = 0; k < channels.size(); ++k) {
      c.mean[k] += n * m.mean[channels[k]];
      c.var[k] += m.m2[channels[k]];
    }
  }
  for (size_t k = 0; k < channels.size(); ++k) {
    c.mean[k] = c.count > 0 ? c.mean[k] / static_cast<double>(c.count) : 0;
    c.var[k] = c.dof > 0 ? c.var[k] / static_cast<double>(c.dof) : 0;
  }
  return c;
}

}  // namespace

std::vector<RankScores> ScoreAmongThemselves(
    const std::vector<Moments>& moments, int channels) {
  const size_t w = moments.size();
  std::vector<RankScores> scores(w);
  if (w < 2 || channels <= 0) return scores;
  const std::vector<int> scored = ScoredChannels(channels);
  std::vector<bool> clean(w);
  int ranks_with_data = 0;
  for (size_t i = 0; i < w; ++i) {
    clean[i] = moments[i].count >= 1;
    ranks_with_data += clean[i] ? 1 : 0;
  }
  if (ranks_with_data < 2) return scores;
  int in_center = ranks_with_data;
  for (int outliers = 0;; ++outliers) {
    const HealthCenter center = PooledCenter(moments, clean, scored);
    for (size_t i = 0; i < w; ++i) {
      scores[i] = ScoreRank(moments[i], clean[i], center, scored);
    }
    // The worst rank of the center leaves it while a majority of the
    // ranks with data stays.
    if (outliers == kMaxHealthOutliers ||
        2 * (in_center - 1) <= ranks_with_data) {
      break;
    }
    int worst = -1;
    double worst_excess = kHealthThreshold;
    for (size_t i = 0; i < w; ++i) {
      if (!clean[i]) continue;
      const double e = ScoreExcess(scores[i]);
      if (e > worst_excess) {
        worst = static_cast<int>(i);
        worst_excess = e;
      }
    }
    if (worst < 0) break;
    clean[worst] = false;
    --in_center;
  }
  return scores;
}

int StuckChannel(const Moments& m, const std::vector<double>& global_var,
                 int tracked) {
  if (m.count < 2) return -1;
  const int channels =
      static_cast<int>(std::min(global_var.size(), m.m2.size()));
  if (tracked >= 0 && tracked < channels && m.m2[tracked] == 0 &&
      global_var[tracked] > 0) {
    return tracked;
  }
  for (int c = 0; c < channels; ++c) {
    if (m.m2[c] == 0 && global_var[c] > 0) return c;
  }
  return -1;
}

}  // namespace syncnorm
