#include "client/sync_batch_norm_options.h"

#include "client/layer_rule.h"

namespace syncnorm {

RunningRule RuleOf(const SyncBatchNormOptions& options) {
  RunningRule rule;
  rule.mode = options.momentum_mode;
  rule.momentum = options.momentum < 0 ? DefaultMomentum(options.momentum_mode)
                                       : options.momentum;
  rule.biased_var = options.biased_running_var;
  rule.track = options.track_running_stats;
  // The wire reads momentum 0 as "the default" in every mode. Torch's
  // momentum 0 (running statistics never move) is decay with momentum 1, and
  // decay's momentum 0 (running statistics = the batch's) is torch with 1.
  if (rule.mode != MomentumMode::kCumulative && rule.momentum == 0.0) {
    rule.mode = rule.mode == MomentumMode::kTorch ? MomentumMode::kDecay
                                                  : MomentumMode::kTorch;
    rule.momentum = 1.0;
  }
  return rule;
}

}  // namespace syncnorm
