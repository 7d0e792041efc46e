#include "client/running_stats.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/job_groups.h"
#include "client/job_membership.h"
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

namespace {

// Waits until the job's committed step reaches `step` (polling its
// statistics, as a committed step is not pushed), until `deadline`.
// `why` ends the DEADLINE_EXCEEDED message.
absl::Status AwaitCommitted(Client& client, const std::string& job_id,
                            int group, int64_t step, absl::Time deadline,
                            absl::string_view why) {
  v1::GetRunningStatsRequest request;
  request.set_job_id(job_id);
  request.set_group(group);
  absl::Duration pause = absl::Milliseconds(5);
  for (;;) {
    absl::StatusOr<v1::RunningStats> stats = client.GetRunningStats(request);
    if (!stats.ok()) return stats.status();
    if (stats->step() >= step) return absl::OkStatus();
    if (absl::Now() + pause >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job '", job_id, "' has committed step ", stats->step(), "; ", why));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(200));
  }
}

}  // namespace

absl::Status AwaitRunningStats(Client& client, const std::string& job_id,
                               int group,
                               absl::Span<SyncBatchNorm* const> layers,
                               std::optional<absl::Duration> timeout) {
  const absl::Time deadline =
      absl::Now() + timeout.value_or(client.options().rpc_timeout);
  int64_t last = -1;  // the highest step any layer ran
  for (const SyncBatchNorm* layer : layers) {
    last = std::max(last, layer->step() - 1);
  }
  if (last >= 0) {
    if (absl::Status s = AwaitCommitted(
            client, job_id, group, last, deadline,
            absl::StrCat("the layers ran step ", last,
                         ", whose statistics wait for every member (is the "
                         "slowest training?)"));
        !s.ok()) {
      return s;
    }
  }
  return LoadRunningStats(client, job_id, group, layers);
}

absl::StatusOr<int64_t> JoinJob(Client& client, const std::string& job_id,
                                int rank,
                                absl::Span<SyncBatchNorm* const> layers,
                                std::optional<absl::Duration> timeout) {
  const absl::Time deadline =
      absl::Now() + timeout.value_or(client.options().rpc_timeout);
  absl::StatusOr<v1::JobInfo> job = client.GetJob(job_id);
  if (!job.ok()) return job.status();
  if (!IsMember(*job, rank)) {
    v1::UpdateMembershipRequest join;
    join.set_job_id(job_id);
    join.add_join(rank);
    job = client.UpdateMembership(join);
    if (!job.ok()) return job.status();
  }
  absl::StatusOr<int64_t> first = MemberSince(*job, rank);
  if (!first.ok()) return first.status();
  absl::StatusOr<int> group = GroupOf(*job, rank);
  if (!group.ok()) return group.status();
  // The statistics it starts from are those after every step before its
  // first, on every layer: a layer may still be finishing one.
  if (absl::Status s = AwaitCommitted(
          client, job_id, *group, *first - 1, deadline,
          absl::StrCat("a rank joining at step ", *first, " waits for step ",
                       *first - 1, " to load the statistics it starts from"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = LoadRunningStats(client, job_id, *group, layers);
      !s.ok()) {
    return s;
  }
  for (SyncBatchNorm* layer : layers) layer->set_step(*first);
  return *first;
}

absl::StatusOr<v1::JobInfo> LeaveJob(Client& client, const std::string& job_id,
                                     int rank,
                                     absl::Span<SyncBatchNorm* const> layers) {
  int64_t next = 0;
  for (const SyncBatchNorm* layer : layers) {
    next = std::max(next, layer->step());
  }
  v1::UpdateMembershipRequest leave;
  leave.set_job_id(job_id);
  leave.set_step(next);
  leave.add_leave(rank);
  return client.UpdateMembership(leave);
}

}  // namespace syncnorm
