// A job's running statistics as JSON keyed like a torch state_dict:
// "<layer>.running_mean", "<layer>.running_var" (lists of numbers) and
// "<layer>.num_batches_tracked" (an integer), where <layer> is the layer's
// name (its index when it has none).
#ifndef SYNCNORM_CLIENT_CTL_STATE_DICT_H_
#define SYNCNORM_CLIENT_CTL_STATE_DICT_H_

#include <string>

#include "absl/status/statusor.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm::ctl {

// The prefix of a layer's keys.
std::string LayerPrefix(const v1::LayerSpec& spec, int index);

// The JSON text of `stats` (one group), in layer order. Numbers are written
// with 17 significant digits, so reading them back gives the same bits.
std::string ExportStateDict(const v1::JobInfo& job,
                            const v1::RunningStats& stats);

// The request that imports `json` into `job`'s `group` (-1: every group).
// INVALID_ARGUMENT naming the problem for text that is not a JSON object, a
// key that matches no layer, a layer with one of mean/var missing, a wrong
// value count or type, or a file that matches no layer at all.
absl::StatusOr<v1::SetRunningStatsRequest> ImportStateDict(
    const v1::JobInfo& job, const std::string& json, int group);

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_STATE_DICT_H_
