// Job: checkpoints, retention and restore.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/domain/bounded_text.h"
#include "server/domain/job.h"
#include "server/domain/log.h"

namespace syncnorm {

void Job::Checkpoint(int64_t step, std::string tag, absl::Time deadline,
                     CheckpointCallback done) {
  if (absl::Status s = CheckStep(step, "step"); !s.ok()) {
    done(s);
    return;
  }
  Answers answers;
  {
    absl::MutexLock lock(&admin_mu_);
    pending_.push_back(
        PendingCheckpoint{step, std::move(tag), deadline, std::move(done)});
    // Set before the committed step is read below, so that a round applied
    // meanwhile either is seen here or sees the flag and serves it.
    has_pending_.store(true);
    ServeReadyLocked(answers);
  }
  Answer(answers);
}

void Job::ServeReady() {
  Answers answers;
  {
    absl::MutexLock lock(&admin_mu_);
    ServeReadyLocked(answers);
  }
  Answer(answers);
}

void Job::ServeReadyLocked(Answers& out) {
  if (pending_.empty()) return;
  const int64_t committed = CommittedStep();
  std::vector<PendingCheckpoint> waiting;
  for (PendingCheckpoint& p : pending_) {
    if (p.step <= committed || checkpoints_.count(p.step) > 0) {
      out.emplace_back(std::move(p.done), CutLocked(p.step, p.tag));
    } else {
      waiting.push_back(std::move(p));
    }
  }
  pending_ = std::move(waiting);
  has_pending_.store(!pending_.empty());
}

void Job::Expire(absl::Time now) {
  LayerRendezvous::Deliveries out;
  {
    // Shared, like a contribution: a quorum round completed here is stored.
    absl::ReaderMutexLock lock(&state_mu_);
    if (!deleted_) {
      for (const auto& layer : rendezvous_) layer->Expire(now, out);
    }
  }
  LayerRendezvous::Deliver(out);
  if (!has_pending_.load()) return;
  Answers answers;
  {
    absl::MutexLock lock(&admin_mu_);
    ServeReadyLocked(answers);  // a fallback; rounds normally serve them
    std::vector<PendingCheckpoint> waiting;
    for (PendingCheckpoint& p : pending_) {
      if (p.deadline > now) {
        waiting.push_back(std::move(p));
        continue;
      }
      answers.emplace_back(
          std::move(p.done),
          absl::DeadlineExceededError(absl::StrCat(
              "checkpoint of job '", BoundedText(spec_.job_id), "' at step ",
              p.step, ": the step was not committed before the call's deadline",
              " (committed step ", ReportedCommittedStep(), "); ",
              Lagging(p.step))));
    }
    pending_ = std::move(waiting);
    has_pending_.store(!pending_.empty());
  }
  Answer(answers);
}

std::string Job::Lagging(int64_t step) const {
  std::vector<std::string> lag;
  int more = 0;
  for (size_t l = 0; l < rendezvous_.size(); ++l) {
    if (!spec_.shard.owns(static_cast<int>(l))) continue;
    for (int g = 0; g < spec_.num_groups(); ++g) {
      const int64_t applied = rendezvous_[l]->LastAppliedStep(g);
      if (applied >= step || rendezvous_[l]->Frozen(g)) continue;
      if (lag.size() == 8) {
        ++more;
        continue;
      }
      lag.push_back(absl::StrCat("layer ", l, " ('",
                                 BoundedText(spec_.layers[l].name),
                                 "') of group ", g, " at step ", applied));
    }
  }
  return absl::StrCat("lagging: ", absl::StrJoin(lag, ", "),
                      more > 0 ? absl::StrCat(" and ", more, " more") : "");
}

absl::StatusOr<CheckpointMeta> Job::CutLocked(int64_t step,
                                              const std::string& tag) {
  if (auto it = checkpoints_.find(step); it != checkpoints_.end()) {
    if (tag.empty() || tag == it->second.tag) return it->second;
    return absl::AlreadyExistsError(absl::StrCat(
        "job '", BoundedText(spec_.job_id),
        "' already has a checkpoint at step ", step, " tagged '",
        BoundedText(it->second.tag), "'; checkpoints are immutable"));
  }
  const absl::Time start = clock_->Now();
  CheckpointData data;
  data.meta.job_id = spec_.job_id;
  data.meta.step = step;
  data.meta.tag = tag;
  data.meta.created_unix_ms = absl::ToUnixMillis(start);
  {
    absl::ReaderMutexLock lock(&state_mu_);
    if (deleted_) {
      return absl::NotFoundError(
          absl::StrCat("job '", BoundedText(spec_.job_id), "' was deleted"));
    }
    // What a restore to this checkpoint puts back: the members training
    // resumes with.
    const std::shared_ptr<const Membership> members = Members();
    data.meta.members = members->At(step + 1).members.ranks();
    data.meta.membership_version = members->version();
    // Each layer's state as of `step` is fixed once applied, so cutting
    // them one by one while rounds go on still gives one consistent step.
    // A shard of a sharded job cuts the layers it owns.
    for (int g = 0; g < spec_.num_groups(); ++g) {
      for (size_t l = 0; l < rendezvous_.size(); ++l) {
        if (!spec_.shard.owns(static_cast<int>(l))) continue;
        absl::StatusOr<LayerState> s = rendezvous_[l]->StateAt(g, step);
        if (!s.ok()) return s.status();
        data.layers.push_back(LayerSlot{g, static_cast<int>(l), *std::move(s)});
      }
    }
  }
  const std::vector<int64_t> victims = RetentionVictimsLocked(data.meta);
  const absl::Status stored = store_->PutCheckpoint(data, victims);
  ReportCheckpoint(data, clock_->Now() - start, stored);
  if (!stored.ok()) return stored;
  for (int64_t v : victims) checkpoints_.erase(v);
  checkpoints_[step] = data.meta;
  return data.meta;
}

void Job::ReportCheckpoint(const CheckpointData& data, absl::Duration duration,
                           const absl::Status& status) const {
  const int layers = static_cast<int>(data.layers.size());
  if (options_.observer != nullptr) {
    options_.observer->OnCheckpoint(CheckpointReport{
        spec_.job_id, data.meta.step, duration, layers, status});
  }
  LogLine line(status.ok() ? "checkpoint" : "checkpoint_failed",
               status.ok() ? LogLevel::kInfo : LogLevel::kError);
  line.Add("job", BoundedText(spec_.job_id))
      .Add("step", data.meta.step)
      .Add("tag", BoundedText(data.meta.tag))
      .Add("layers", layers)
      .Add("duration_ms", absl::ToDoubleMilliseconds(duration));
  if (!status.ok()) line.Add("error", status.ToString());
}

std::vector<int64_t> Job::RetentionVictimsLocked(
    const CheckpointMeta& added) const {
  std::vector<int64_t> untagged;  // ascending: the map is ordered
  for (const auto& [step, meta] : checkpoints_) {
    if (meta.tag.empty()) untagged.push_back(step);
  }
  const int keep = options_.keep_checkpoints;
  const int total = static_cast<int>(untagged.size()) + (added.tag.empty());
  if (keep <= 0 || total <= keep) return {};
  untagged.resize(std::min<size_t>(untagged.size(), total - keep));
  return untagged;
}

std::vector<CheckpointMeta> Job::ListCheckpoints() const {
  absl::MutexLock lock(&admin_mu_);
  std::vector<CheckpointMeta> out;
  for (const auto& [step, meta] : checkpoints_) out.push_back(meta);
  return out;
}

absl::StatusOr<RunningStatsSnapshot> Job::CheckpointStats(
    int64_t step, absl::Span<const int> layers, int group) const {
  if (absl::Status s = CheckStep(step, "checkpoint_step"); !s.ok()) return s;
  absl::StatusOr<std::vector<int>> wanted = Wanted(layers, group);
  if (!wanted.ok()) return wanted.status();
  absl::StatusOr<CheckpointData> data =
      store_->GetCheckpoint(spec_.job_id, step);
  if (!data.ok()) return data.status();
  RunningStatsSnapshot out;
  out.job_id = spec_.job_id;
  out.committed_step = step;
  for (int layer : *wanted) {
    for (const LayerSlot& slot : data->layers) {
      if (slot.layer != layer || slot.group != group) continue;
      out.layers.push_back(LayerStatsSnapshot{layer, spec_.layers[layer].name,
                                              group, slot.state.stats,
                                              slot.state.frozen});
    }
  }
  return out;
}

absl::StatusOr<JobSnapshot> Job::Restore(int64_t step) {
  if (absl::Status s = CheckStep(step, "step"); !s.ok()) return s;
  std::vector<RoundCallback> dropped;
  absl::Status s = RestoreLocked(step, dropped);
  if (!s.ok()) return s;
  RoundOutcome failed;
  failed.status = absl::AbortedError(
      absl::StrCat("job '", BoundedText(spec_.job_id),
                   "' was restored to its checkpoint at step ", step,
                   " while this round waited; resume from step ", step + 1));
  for (RoundCallback& done : dropped) done(failed);
  return Snapshot();
}

absl::Status Job::RestoreLocked(int64_t step,
                                std::vector<RoundCallback>& dropped) {
  absl::MutexLock admin(&admin_mu_);
  if (checkpoints_.count(step) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "job '", BoundedText(spec_.job_id), "' has no checkpoint at step ",
        step, "; ListCheckpoints shows the steps it has"));
  }
  absl::StatusOr<CheckpointData> data =
      store_->GetCheckpoint(spec_.job_id, step);
  if (!data.ok()) return data.status();
  // per_layer[l][g]: the state every (group, layer) resumes from.
  std::vector<std::vector<LayerState>> per_layer(
      rendezvous_.size(), std::vector<LayerState>(spec_.num_groups()));
  for (LayerSlot& slot : data->layers) {
    slot.state.last_applied = step;
    slot.state.latest_completed = {step, step};
    per_layer[slot.layer][slot.group] = slot.state;
  }
  absl::WriterMutexLock lock(&state_mu_);
  if (deleted_) {
    return absl::NotFoundError(
        absl::StrCat("job '", BoundedText(spec_.job_id), "' was deleted"));
  }
  // The checkpoint's members come back from step + 1, as a new version (a
  // checkpoint from before membership existed: the initial members).
  const std::vector<int> ranks = data->meta.members.value_or(spec_.members);
  const RankSet members = ranks.empty()
                              ? RankSet::Range(0, spec_.world_size - 1)
                              : RankSet::Of(ranks);
  auto restored = std::make_shared<const Membership>(
      Members()->Restored(step, members, step));
  absl::Status s =
      store_->PutLayers(spec_.job_id, data->layers, true, &restored->history());
  if (!s.ok()) return s;
  {
    absl::MutexLock members_lock(&members_mu_);
    members_ = std::move(restored);
  }
  for (size_t l = 0; l < rendezvous_.size(); ++l) {
    if (!spec_.shard.owns(static_cast<int>(l))) continue;
    for (RoundCallback& done : rendezvous_[l]->Reset(per_layer[l])) {
      dropped.push_back(std::move(done));
    }
  }
  return absl::OkStatus();
}

}  // namespace syncnorm
