// What one forward round does to a layer's running statistics beyond the
// layer's own rule: a momentum of its own and statistics imported before
// the update. One definition for the client, which sends and mirrors it,
// and the server, which applies it.
#ifndef SYNCNORM_KERNELS_ROUND_UPDATE_H_
#define SYNCNORM_KERNELS_ROUND_UPDATE_H_

#include <optional>

#include "absl/status/status.h"
#include "kernels/moments.h"

namespace syncnorm {

// The running-statistics rule of one round (RoundMomentum on the wire):
// mode and momentum, taken as they are (0 is 0).
struct RoundMomentum {
  MomentumMode mode = MomentumMode::kTorch;
  double momentum = 0.1;
};

// The momentum `rule` applies.
RoundMomentum MomentumOf(const RunningRule& rule);

// Whether two momenta move running statistics alike, bit for bit: the same
// mode and momentum, where kCumulative ignores the momentum, kTorch with 0
// is kDecay with 1 and kDecay with 0 is kTorch with 1.
bool SameMomentum(const RoundMomentum& a, const RoundMomentum& b);

// How one forward round updates a layer's running statistics, beyond its
// rule. Empty: the layer's rule, from its current statistics.
struct RoundUpdate {
  // This round's momentum; none: the layer's.
  std::optional<RoundMomentum> momentum;
  // Statistics that replace the current ones before the update (an
  // import: the trainer loaded, reset or wrote them); none: the current.
  std::optional<RunningStats> imported;

  bool empty() const { return !momentum.has_value() && !imported.has_value(); }
};

// Bit-for-bit equality: momenta by SameMomentum, imported statistics by
// their exact bits (every rank of a group must send the same update).
bool SameUpdate(const RoundUpdate& a, const RoundUpdate& b);

// OK when `update` fits a layer of `channels` channels under `rule`; else
// INVALID_ARGUMENT saying what to fix: an unknown mode, a momentum outside
// [0, 1], imported statistics of another size or not finite (var >= 0,
// 0 <= num_batches_tracked <= kMaxNumBatchesTracked), or any update for a layer
// without running statistics (rule.track false).
absl::Status ValidateRoundUpdate(const RoundUpdate& update,
                                 const RunningRule& rule, int channels);

// `rule` with the update's momentum, if it has one.
RunningRule RoundRule(const RunningRule& rule, const RoundUpdate& update);

// One forward round under `update`: stats become update.imported (if any),
// then ApplyRound(RoundRule(rule, update), global, stats). The server
// applies merged moments, the client the global statistics it was answered
// with: the same bits either way.
// REQUIRES: CheckUpdatable(RoundRule(rule, update), count).ok() and
// ValidateRoundUpdate(update, rule, channels).ok().
void ApplyRound(const RunningRule& rule, const RoundUpdate& update,
                const GlobalMoments& global, RunningStats& stats);
void ApplyRound(const RunningRule& rule, const RoundUpdate& update,
                const Moments& merged, RunningStats& stats);

}  // namespace syncnorm

#endif  // SYNCNORM_KERNELS_ROUND_UPDATE_H_
