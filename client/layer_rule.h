// The running-statistics rule of a layer's options (client-internal).
#ifndef SYNCNORM_CLIENT_LAYER_RULE_H_
#define SYNCNORM_CLIENT_LAYER_RULE_H_

#include "client/sync_batch_norm_options.h"
#include "kernels/moments.h"

namespace syncnorm {

// The rule the aggregator applies for a layer created by ToLayerSpec with
// these options, resolved the same way, so the local mirror matches it.
RunningRule RuleOf(const SyncBatchNormOptions& options);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_LAYER_RULE_H_
