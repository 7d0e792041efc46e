#include "client/running_stats.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "wire/convert.h"

namespace syncnorm {

absl::Status LoadRunningStats(Client& client, const std::string& job_id,
                              int group,
                              absl::Span<SyncBatchNorm* const> layers,
                              std::optional<int64_t> checkpoint_step) {
  v1::GetRunningStatsRequest request;
  request.set_job_id(job_id);
  request.set_group(group);
  if (checkpoint_step.has_value()) {
    request.set_checkpoint_step(*checkpoint_step);
    request.set_use_checkpoint(true);
  }
  for (const SyncBatchNorm* layer : layers) request.add_layers(layer->layer());
  absl::StatusOr<v1::RunningStats> stats = client.GetRunningStats(request);
  if (!stats.ok()) return stats.status();
  if (stats->layers_size() != static_cast<int>(layers.size())) {
    return absl::InternalError(absl::StrCat("the aggregator answered ",
                                            stats->layers_size(),
                                            " layers for ", layers.size()));
  }
  // All checked before any is changed.
  std::vector<RunningStats> loaded;
  for (size_t i = 0; i < layers.size(); ++i) {
    const v1::LayerStats& l = stats->layers(static_cast<int>(i));
    const int channels = layers[i]->num_features();
    if (l.running_mean_size() != channels || l.running_var_size() != channels) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layers[i]->layer(), " ('", l.name(), "') has ",
                       l.running_mean_size(),
                       " channels on the aggregator and ", channels, " here"));
    }
    loaded.push_back(FromProto(l));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (absl::Status s = layers[i]->SetRunningStats(loaded[i]); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ResumeFromCheckpoint(Client& client, const std::string& job_id,
                                  int group,
                                  absl::Span<SyncBatchNorm* const> layers,
                                  int64_t step) {
  absl::StatusOr<v1::JobInfo> restored = client.RestoreCheckpoint(job_id, step);
  if (!restored.ok()) return restored.status();
  absl::Status s = LoadRunningStats(client, job_id, group, layers, step);
  if (!s.ok()) return s;
  for (SyncBatchNorm* layer : layers) layer->set_step(step + 1);
  return absl::OkStatus();
}

}  // namespace syncnorm
