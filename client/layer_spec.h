// The wire spec (syncnorm.v1.LayerSpec) of a SyncBatchNorm layer, for
// CreateJob.
#ifndef SYNCNORM_CLIENT_LAYER_SPEC_H_
#define SYNCNORM_CLIENT_LAYER_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/sync_batch_norm_options.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// The wire spec of a layer with these options, for CreateJob. REQUIRES a
// known channel count: num_features, or `channels` when that is 0.
// INVALID_ARGUMENT when neither is positive.
absl::StatusOr<v1::LayerSpec> ToLayerSpec(const SyncBatchNormOptions& options,
                                          const std::string& name,
                                          int channels = 0);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_LAYER_SPEC_H_
