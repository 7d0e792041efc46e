#include "kernels/round_update.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace syncnorm {
namespace {

bool SameBits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// One form per update: kCumulative's momentum does not matter, and a
// momentum of 0 moves nothing (kTorch) or takes the batch (kDecay), which
// the other mode does with 1.
RoundMomentum Canonical(RoundMomentum m) {
  if (m.mode == MomentumMode::kCumulative) return {m.mode, 0.0};
  if (m.momentum == 0.0) {
    m.mode = m.mode == MomentumMode::kTorch ? MomentumMode::kDecay
                                            : MomentumMode::kTorch;
    m.momentum = 1.0;
  }
  return m;
}

absl::Status CheckValues(const std::vector<double>& v, int channels,
                         const char* field, bool non_negative) {
  if (v.size() != static_cast<size_t>(channels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("imported_stats.", field, " has ", v.size(),
                     " values but the layer has ", channels, " channels"));
  }
  for (int c = 0; c < channels; ++c) {
    if (!std::isfinite(v[c]) || (non_negative && v[c] < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "imported_stats.", field, "[", c, "] is ", v[c], "; it must be ",
          non_negative ? "finite and >= 0" : "finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

RoundMomentum MomentumOf(const RunningRule& rule) {
  return {rule.mode, rule.momentum};
}

bool SameMomentum(const RoundMomentum& a, const RoundMomentum& b) {
  const RoundMomentum x = Canonical(a);
  const RoundMomentum y = Canonical(b);
  return x.mode == y.mode && x.momentum == y.momentum;
}

bool SameUpdate(const RoundUpdate& a, const RoundUpdate& b) {
  if (a.momentum.has_value() != b.momentum.has_value() ||
      a.imported.has_value() != b.imported.has_value()) {
    return false;
  }
  if (a.momentum.has_value() && !SameMomentum(*a.momentum, *b.momentum)) {
    return false;
  }
  return !a.imported.has_value() ||
         (a.imported->num_batches_tracked == b.imported->num_batches_tracked &&
          SameBits(a.imported->mean, b.imported->mean) &&
          SameBits(a.imported->var, b.imported->var));
}

absl::Status ValidateRoundUpdate(const RoundUpdate& update,
                                 const RunningRule& rule, int channels) {
  if (update.empty()) return absl::OkStatus();
  if (!rule.track) {
    return absl::InvalidArgumentError(
        "the layer keeps no running statistics (no_running_stats), so a "
        "round cannot carry a momentum or imported_stats for it");
  }
  if (update.momentum.has_value()) {
    const RoundMomentum& m = *update.momentum;
    if (m.mode != MomentumMode::kTorch && m.mode != MomentumMode::kDecay &&
        m.mode != MomentumMode::kCumulative) {
      return absl::InvalidArgumentError(
          absl::StrCat("momentum.momentum_mode ", static_cast<int>(m.mode),
                       " is unknown; use MOMENTUM_TORCH, MOMENTUM_DECAY or "
                       "MOMENTUM_CUMULATIVE"));
    }
    if (!std::isfinite(m.momentum) || m.momentum < 0 || m.momentum > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "momentum.momentum is ", m.momentum, "; it must be within [0, 1]"));
    }
  }
  if (!update.imported.has_value()) return absl::OkStatus();
  const RunningStats& s = *update.imported;
  if (s.num_batches_tracked < 0 ||
      s.num_batches_tracked > kMaxNumBatchesTracked) {
    return absl::InvalidArgumentError(absl::StrCat(
        "imported_stats.num_batches_tracked is ", s.num_batches_tracked,
        "; it must be within [0, ", kMaxNumBatchesTracked, "] (2^53-1)"));
  }
  absl::Status status = CheckValues(s.mean, channels, "running_mean", false);
  if (status.ok()) status = CheckValues(s.var, channels, "running_var", true);
  return status;
}

RunningRule RoundRule(const RunningRule& rule, const RoundUpdate& update) {
  RunningRule out = rule;
  if (update.momentum.has_value()) {
    out.mode = update.momentum->mode;
    out.momentum = update.momentum->momentum;
  }
  return out;
}

void ApplyRound(const RunningRule& rule, const RoundUpdate& update,
                const GlobalMoments& global, RunningStats& stats) {
  if (update.imported.has_value()) stats = *update.imported;
  ApplyRound(RoundRule(rule, update), global, stats);
}

void ApplyRound(const RunningRule& rule, const RoundUpdate& update,
                const Moments& merged, RunningStats& stats) {
  ApplyRound(rule, update, Finalize(merged), stats);
}

}  // namespace syncnorm
