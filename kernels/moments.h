// Per-channel moments, their merge, and running statistics.
//
// The host-side types that the kernels produce, the client sends, and the
// server merges. All arithmetic is in float64 and goes through formulas.h.
#ifndef SYNCNORM_KERNELS_MOMENTS_H_
#define SYNCNORM_KERNELS_MOMENTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/formulas.h"

namespace syncnorm {

// Local or merged moments of C channels: count n, per-channel mean and M2 (sum
// of squared deviations from the mean). count == 0 is the empty batch, with
// mean and m2 all zero.
struct Moments {
  int64_t count = 0;
  std::vector<double> mean;
  std::vector<double> m2;

  // Empty moments of `channels` channels.
  static Moments Zero(int channels);
  int channels() const { return static_cast<int>(mean.size()); }
};

// Global statistics for normalization: count, mean and biased var = M2/n.
struct GlobalMoments {
  int64_t count = 0;
  std::vector<double> mean;
  std::vector<double> var;
};

// Per-channel gradient sums of the backward pass.
struct GradSums {
  std::vector<double> sum_dy;
  std::vector<double> sum_dy_xmu;
  int channels() const { return static_cast<int>(sum_dy.size()); }
};

// Folds b into acc by the Chan et al. rule. Folding contributions in a fixed
// (rank) order makes the result independent of arrival order.
// REQUIRES: acc.channels() == b.channels(), CheckMergeable(acc, b).ok().
void MergeMoments(Moments& acc, const Moments& b);

// Whether MergeMoments may fold b into acc: INVALID_ARGUMENT when their
// counts sum past INT64_MAX. REQUIRES: both counts >= 0.
absl::Status CheckMergeable(const Moments& acc, const Moments& b);

// Whether a round's result is finite: INVALID_ARGUMENT naming the first
// value that is not. Finite inputs can still merge into infinities (means
// of opposite signs near the float64 maximum, or sums that overflow), and
// such a result must not reach normalization or running statistics.
absl::Status CheckFiniteResult(const GlobalMoments& g);
absl::Status CheckFiniteResult(const GradSums& g);

// Adds b into acc, channel by channel. REQUIRES: equal channel counts.
void AddGradSums(GradSums& acc, const GradSums& b);

// The global statistics of merged moments (var biased).
GlobalMoments Finalize(const Moments& merged);
// The same, built in the storage of `merged`, which is left unspecified.
GlobalMoments Finalize(Moments&& merged);

// Checks that moments are well formed for `channels` channels: sizes match,
// count >= 0, values finite, m2 >= 0, and count 0 carries zeros.
// INVALID_ARGUMENT naming the first offending field otherwise.
absl::Status ValidateMoments(const Moments& m, int channels);

// Checks gradient sums: sizes match `channels` and every value is finite.
absl::Status ValidateGradSums(const GradSums& g, int channels);

// A layer's running-statistics rule.
struct RunningRule {
  MomentumMode mode = MomentumMode::kTorch;
  double momentum = 0.1;    // resolved, see DefaultMomentum
  bool biased_var = false;  // running var from M2/n instead of M2/(n-1)
  bool track = true;        // false: no running statistics at all
};

// A layer's running statistics.
struct RunningStats {
  int64_t num_batches_tracked = 0;
  std::vector<double> mean;
  std::vector<double> var;

  // Zeros and ones for `channels` channels (torch's initial buffers).
  static RunningStats Initial(int channels);
};

// The largest num_batches_tracked (a layer's version) running statistics
// may have: 2^53 - 1, which every client holds exactly (in a float64 or a
// JavaScript Number too) and one more round cannot take past INT64_MAX.
inline constexpr int64_t kMaxNumBatchesTracked = (int64_t{1} << 53) - 1;

// Whether a merged round may update `stats` under `rule`:
// FAILED_PRECONDITION for a global count of 1 with unbiased running var (as
// torch: "Expected more than 1 value per channel when training"), or when
// the round would count a batch past kMaxNumBatchesTracked.
absl::Status CheckUpdatable(const RunningRule& rule, int64_t global_count,
                            const RunningStats& stats);
// The first check alone, for callers without the statistics at hand.
absl::Status CheckUpdatable(const RunningRule& rule, int64_t global_count);

// Whether running statistics after a round's update are finite (mean,
// var): INVALID_ARGUMENT naming the first value that is not.
absl::Status CheckFiniteResult(const RunningStats& s);

// Applies one forward round's merged moments to `stats`. A global count of 0
// (or rule.track == false) leaves stats untouched, including the counter.
// REQUIRES: CheckUpdatable(rule, merged.count, stats).ok(), equal channel
// counts.
void ApplyRound(const RunningRule& rule, const Moments& merged,
                RunningStats& stats);

// The same update from the global statistics a round answers with; yields
// bitwise the same stats as the Moments form (which finalizes first).
void ApplyRound(const RunningRule& rule, const GlobalMoments& global,
                RunningStats& stats);

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_MOMENTS_H_
