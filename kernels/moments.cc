#include "kernels/moments.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace syncnorm {
namespace {

// Whether every value is finite (and, with kNonNegative, >= 0; -0 is).
// Every contribution and every result is checked value by value on the
// round's path: this says whether all are fine with no branch per value,
// two values per instruction, and the loops that name the first bad value
// run only when there is one. x * 0 is 0 for every finite x and NaN for an
// infinity or a NaN, and a NaN compares false.
template <bool kNonNegative>
bool AllFine(absl::Span<const double> v) {
  const double* p = v.data();
  size_t i = 0;
  bool ok = true;
#if defined(__SSE2__)
  const __m128d zero = _mm_setzero_pd();
  __m128d ok0 = _mm_cmpeq_pd(zero, zero);  // all ones
  __m128d ok1 = ok0;
  for (; i + 4 <= v.size(); i += 4) {
    const __m128d a = _mm_loadu_pd(p + i);
    const __m128d b = _mm_loadu_pd(p + i + 2);
    ok0 = _mm_and_pd(ok0, _mm_cmpeq_pd(_mm_mul_pd(a, zero), zero));
    ok1 = _mm_and_pd(ok1, _mm_cmpeq_pd(_mm_mul_pd(b, zero), zero));
    if (kNonNegative) {
      ok0 = _mm_and_pd(ok0, _mm_cmpge_pd(a, zero));
      ok1 = _mm_and_pd(ok1, _mm_cmpge_pd(b, zero));
    }
  }
  ok = _mm_movemask_pd(_mm_and_pd(ok0, ok1)) == 3;
#endif
  for (; i < v.size(); ++i) {
    ok &= p[i] * 0.0 == 0.0 && (!kNonNegative || p[i] >= 0.0);
  }
  return ok;
}

bool AllFinite(absl::Span<const double> v) { return AllFine<false>(v); }
bool AllFiniteNonNegative(absl::Span<const double> v) {
  return AllFine<true>(v);
}

absl::Status CheckFinite(absl::Span<const double> v, const char* field) {
  if (AllFinite(v)) return absl::OkStatus();
  for (size_t c = 0; c < v.size(); ++c) {
    if (!std::isfinite(v[c])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", c, "] is ", v[c],
                       "; every value must be finite (check the layer's input "
                       "for NaN/Inf)"));
    }
  }
  return absl::OkStatus();
}

// The first non-finite value of `v` as "field[c] is x", or "".
std::string FirstNonFinite(absl::Span<const double> v, const char* field) {
  if (AllFinite(v)) return "";
  for (size_t c = 0; c < v.size(); ++c) {
    if (!std::isfinite(v[c])) return absl::StrCat(field, "[", c, "] is ", v[c]);
  }
  return "";
}

constexpr char kInputHint[] =
    "the ranks' values are too large or too far apart: check the layer's "
    "input";

absl::Status NotFinite(const std::string& value, const char* what,
                       const char* hint) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " overflows float64: ", value,
                   "; every statistic must be finite (", hint, ")"));
}

absl::Status CheckSize(size_t got, int channels, const char* field) {
  if (got != static_cast<size_t>(channels)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", got, " values but the layer has ",
                     channels, " channels (num_features)"));
  }
  return absl::OkStatus();
}

}  // namespace

Moments Moments::Zero(int channels) {
  Moments m;
  m.mean.assign(channels, 0.0);
  m.m2.assign(channels, 0.0);
  return m;
}

RunningStats RunningStats::Initial(int channels) {
  RunningStats s;
  s.mean.assign(channels, 0.0);
  s.var.assign(channels, 1.0);
  return s;
}

void MergeMoments(Moments& acc, const Moments& b) {
  if (b.count == 0) return;
  const size_t channels = acc.mean.size();
  if (acc.count == 0) {  // ChanMerge keeps the other side as it is
    std::copy_n(b.mean.begin(), channels, acc.mean.begin());
    std::copy_n(b.m2.begin(), channels, acc.m2.begin());
    acc.count = b.count;
    return;
  }
  // ChanMerge for every channel, with what depends only on the two counts
  // (the same for all channels, a division among them) computed once. Each
  // channel's arithmetic is ChanMerge's, operation for operation and in
  // its order, two channels per instruction: the result is the same bit
  // for bit (moments_test compares it with ChanMerge per channel).
  const double na = static_cast<double>(acc.count);
  const double nb = static_cast<double>(b.count);
  const double wb = nb / (na + nb);
  double* mean = acc.mean.data();
  double* m2 = acc.m2.data();
  const double* mean_b = b.mean.data();
  const double* m2_b = b.m2.data();
  size_t c = 0;
#if defined(__SSE2__)
  const __m128d na2 = _mm_set1_pd(na);
  const __m128d wb2 = _mm_set1_pd(wb);
  for (; c + 2 <= channels; c += 2) {
    const __m128d mean_a = _mm_loadu_pd(mean + c);
    const __m128d d = _mm_sub_pd(_mm_loadu_pd(mean_b + c), mean_a);
    _mm_storeu_pd(mean + c, _mm_add_pd(mean_a, _mm_mul_pd(d, wb2)));
    const __m128d m2_sum =
        _mm_add_pd(_mm_loadu_pd(m2 + c), _mm_loadu_pd(m2_b + c));
    const __m128d shift = _mm_mul_pd(_mm_mul_pd(_mm_mul_pd(d, d), na2), wb2);
    _mm_storeu_pd(m2 + c, _mm_add_pd(m2_sum, shift));
  }
#endif
  for (; c < channels; ++c) {
    double n = na;
    ChanMerge(n, mean[c], m2[c], nb, mean_b[c], m2_b[c]);
  }
  acc.count += b.count;
}

void AddGradSums(GradSums& acc, const GradSums& b) {
  for (size_t c = 0; c < acc.sum_dy.size(); ++c) {
    acc.sum_dy[c] += b.sum_dy[c];
    acc.sum_dy_xmu[c] += b.sum_dy_xmu[c];
  }
}

GlobalMoments Finalize(const Moments& merged) {
  GlobalMoments g;
  g.count = merged.count;
  g.mean = merged.mean;
  g.var.resize(merged.m2.size());
  const double n = static_cast<double>(merged.count);
  for (size_t c = 0; c < merged.m2.size(); ++c) {
    g.var[c] = BiasedVar(n, merged.m2[c]);
  }
  return g;
}

GlobalMoments Finalize(Moments&& merged) {
  GlobalMoments g;
  g.count = merged.count;
  g.mean = std::move(merged.mean);
  g.var = std::move(merged.m2);
  const double n = static_cast<double>(g.count);
  for (double& v : g.var) v = BiasedVar(n, v);
  return g;
}

absl::Status ValidateMoments(const Moments& m, int channels) {
  if (m.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("moments.count is ", m.count,
                     "; it must be >= 0 (0 for an empty "
                     "local batch)"));
  }
  absl::Status s = CheckSize(m.mean.size(), channels, "moments.mean");
  if (s.ok()) s = CheckSize(m.m2.size(), channels, "moments.m2");
  if (!s.ok()) return s;
  // What nearly every contribution is; the checks below name what is not.
  if (m.count > 0 && AllFinite(m.mean) && AllFiniteNonNegative(m.m2)) {
    return absl::OkStatus();
  }
  s = CheckFinite(m.mean, "moments.mean");
  if (s.ok()) s = CheckFinite(m.m2, "moments.m2");
  if (!s.ok()) return s;
  for (int c = 0; c < channels; ++c) {
    if (m.m2[c] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("moments.m2[", c, "] is ", m.m2[c],
                       "; a sum of squared deviations cannot be negative"));
    }
    if (m.count == 0 && (m.mean[c] != 0 || m.m2[c] != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "moments.count is 0 but channel ", c,
          " is not zero; send an empty local batch as count 0 with zeros"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGradSums(const GradSums& g, int channels) {
  absl::Status s = CheckSize(g.sum_dy.size(), channels, "grad_sums.sum_dy");
  if (s.ok()) {
    s = CheckSize(g.sum_dy_xmu.size(), channels, "grad_sums.sum_dy_xmu");
  }
  if (s.ok()) s = CheckFinite(g.sum_dy, "grad_sums.sum_dy");
  if (s.ok()) s = CheckFinite(g.sum_dy_xmu, "grad_sums.sum_dy_xmu");
  return s;
}

absl::Status CheckMergeable(const Moments& acc, const Moments& b) {
  if (b.count <= std::numeric_limits<int64_t>::max() - acc.count) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("counts ", acc.count, " + ", b.count,
                   " sum past 2^63-1, the largest count; a count is the "
                   "number of values per channel in a batch"));
}

absl::Status CheckFiniteResult(const GlobalMoments& g) {
  std::string bad = FirstNonFinite(g.mean, "mean");
  if (bad.empty()) bad = FirstNonFinite(g.var, "var");
  return bad.empty() ? absl::OkStatus()
                     : NotFinite(bad, "merging the ranks' moments", kInputHint);
}

absl::Status CheckFiniteResult(const GradSums& g) {
  std::string bad = FirstNonFinite(g.sum_dy, "sum_dy");
  if (bad.empty()) bad = FirstNonFinite(g.sum_dy_xmu, "sum_dy_xmu");
  return bad.empty()
             ? absl::OkStatus()
             : NotFinite(bad, "summing the ranks' gradient sums", kInputHint);
}

absl::Status CheckFiniteResult(const RunningStats& s) {
  std::string bad = FirstNonFinite(s.mean, "running_mean");
  if (bad.empty()) bad = FirstNonFinite(s.var, "running_var");
  return bad.empty()
             ? absl::OkStatus()
             : NotFinite(bad, "updating the running statistics",
                         "the running statistics and this batch are too far "
                         "apart: check the layer's input, or import smaller "
                         "statistics with SetRunningStats");
}

absl::Status CheckUpdatable(const RunningRule& rule, int64_t global_count,
                            const RunningStats& stats) {
  if (absl::Status s = CheckUpdatable(rule, global_count); !s.ok()) return s;
  if (rule.track && global_count > 0 &&
      stats.num_batches_tracked >= kMaxNumBatchesTracked) {
    return absl::FailedPreconditionError(absl::StrCat(
        "num_batches_tracked is ", stats.num_batches_tracked,
        ", the largest it may be (2^53-1), so no round can count another "
        "batch; import statistics with a smaller num_batches_tracked "
        "(SetRunningStats)"));
  }
  return absl::OkStatus();
}

absl::Status CheckUpdatable(const RunningRule& rule, int64_t global_count) {
  if (rule.track && !rule.biased_var && global_count == 1) {
    return absl::FailedPreconditionError(
        "Expected more than 1 value per channel when training: the global "
        "batch of this round has 1 value per channel and the layer's running "
        "var is unbiased (n/(n-1)); use a larger batch or biased_running_var");
  }
  return absl::OkStatus();
}

void ApplyRound(const RunningRule& rule, const Moments& merged,
                RunningStats& stats) {
  ApplyRound(rule, Finalize(merged), stats);
}

void ApplyRound(const RunningRule& rule, const GlobalMoments& global,
                RunningStats& stats) {
  if (!rule.track || global.count == 0) return;
  stats.num_batches_tracked += 1;
  const double n = static_cast<double>(global.count);
  for (size_t c = 0; c < stats.mean.size(); ++c) {
    const double var = RunningVarSample(n, global.var[c], rule.biased_var);
    stats.mean[c] = UpdateRunning(rule.mode, rule.momentum, stats.mean[c],
                                  global.mean[c], stats.num_batches_tracked);
    stats.var[c] = UpdateRunning(rule.mode, rule.momentum, stats.var[c], var,
                                 stats.num_batches_tracked);
  }
}

}  // namespace syncnorm
