#include "client/layer_spec.h"

#include "absl/strings/str_cat.h"
#include "client/layer_rule.h"
#include "wire/convert.h"

namespace syncnorm {

absl::StatusOr<v1::LayerSpec> ToLayerSpec(const SyncBatchNormOptions& options,
                                          const std::string& name,
                                          int channels) {
  const int c = options.num_features > 0 ? options.num_features : channels;
  if (c <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer '", name, "' has num_features ", options.num_features,
        "; give the channel count so that the job can be created"));
  }
  v1::LayerSpec spec;
  spec.set_name(name);
  spec.set_num_features(c);
  ToProto(RuleOf(options), spec);
  spec.mutable_initial_running_mean()->Assign(
      options.initial_running_mean.begin(), options.initial_running_mean.end());
  spec.mutable_initial_running_var()->Assign(
      options.initial_running_var.begin(), options.initial_running_var.end());
  return spec;
}

}  // namespace syncnorm
