#include "server/job.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace syncnorm {

Job::Job(JobSpec spec, int recent_capacity) : spec_(std::move(spec)) {
  shards_.reserve(spec_.layers.size());
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    shards_.push_back(std::make_unique<LayerShard>(spec_, static_cast<int>(i),
                                                   recent_capacity));
  }
}

absl::Status Job::Validate(const Contribution& c) const {
  const int num_layers = static_cast<int>(spec_.layers.size());
  if (c.layer < 0 || c.layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", c.layer, " is out of range: job '", spec_.job_id, "' has ",
        num_layers, " layers (0..", num_layers - 1, ")"));
  }
  if (c.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step is ", c.step, "; steps are non-negative and increase per layer"));
  }
  if (c.rank < 0 || c.rank >= spec_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", c.rank, " is out of range: job '", spec_.job_id,
                     "' has world_size ", spec_.world_size, " (ranks 0..",
                     spec_.world_size - 1, ")"));
  }
  if (c.phase != Phase::kForward && c.phase != Phase::kBackward) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase ", static_cast<int>(c.phase),
                     " is not valid; set FORWARD "
                     "(with moments) or BACKWARD (with grad_sums)"));
  }
  return ValidatePayload(c);
}

absl::Status Job::ValidatePayload(const Contribution& c) const {
  const LayerConfig& layer = spec_.layers[c.layer];
  const std::string where =
      absl::StrCat("layer ", c.layer, " ('", layer.name, "'): ");
  if (c.phase == Phase::kForward) {
    const auto* m = std::get_if<Moments>(&c.payload);
    if (m == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a FORWARD contribution must carry moments"));
    }
    absl::Status s = ValidateMoments(*m, layer.channels);
    if (!s.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
    return absl::OkStatus();
  }
  const auto* g = std::get_if<GradSums>(&c.payload);
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "a BACKWARD contribution must carry grad_sums"));
  }
  absl::Status s = ValidateGradSums(*g, layer.channels);
  if (!s.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
  return absl::OkStatus();
}

void Job::Contribute(Contribution c, RoundCallback done, absl::Time now) {
  LayerShard& shard = *shards_[c.layer];
  shard.Contribute(std::move(c), std::move(done), now);
}

void Job::Expire(absl::Time now) {
  for (const auto& shard : shards_) shard->Expire(now);
}

void Job::Abort(const absl::Status& status) {
  for (const auto& shard : shards_) shard->Abort(status);
}

int64_t Job::CommittedStep() const {
  int64_t committed = INT64_MAX;
  for (const auto& shard : shards_) {
    for (int g = 0; g < spec_.num_groups(); ++g) {
      committed = std::min(committed, shard->LastAppliedStep(g));
    }
  }
  return committed;
}

JobSnapshot Job::Snapshot() const {
  return JobSnapshot{spec_, CommittedStep()};
}

absl::StatusOr<RunningStatsSnapshot> Job::Stats(absl::Span<const int> layers,
                                                int group) const {
  const int num_layers = static_cast<int>(spec_.layers.size());
  if (group < 0 || group >= spec_.num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", group, " is out of range: job '", spec_.job_id, "' has ",
        spec_.num_groups(), " groups (0..", spec_.num_groups() - 1, ")"));
  }
  std::vector<int> wanted(layers.begin(), layers.end());
  if (wanted.empty()) {
    for (int i = 0; i < num_layers; ++i) wanted.push_back(i);
  }
  RunningStatsSnapshot out;
  out.job_id = spec_.job_id;
  out.committed_step = CommittedStep();
  for (int layer : wanted) {
    if (layer < 0 || layer >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, " is out of range: job '", spec_.job_id, "' has ",
          num_layers, " layers (0..", num_layers - 1, ")"));
    }
    out.layers.push_back(LayerStatsSnapshot{
        layer, spec_.layers[layer].name, group, shards_[layer]->Stats(group)});
  }
  return out;
}

}  // namespace syncnorm
