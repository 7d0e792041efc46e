#include "server/domain/job.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/log.h"
#include "wire/rank_list.h"

namespace syncnorm {
namespace {

// A request for a layer that another shard of a sharded job holds: the
// client's shard list differs from the one the job was created with.
absl::Status NotOwned(const JobSpec& spec, int layer) {
  return absl::FailedPreconditionError(absl::StrCat(
      "layer ", layer, " of job '", BoundedText(spec.job_id),
      "' is owned by another shard (this is shard ", spec.shard.shard, " of ",
      spec.shard.num_shards, "); check the client's shard list"));
}

// Whether a payload holds a NaN or an infinity (statistics health counts
// such contributions per rank).
bool HasNonFinite(const Payload& payload) {
  const auto bad = [](const std::vector<double>& v) {
    for (double x : v) {
      if (!std::isfinite(x)) return true;
    }
    return false;
  };
  if (const auto* m = std::get_if<Moments>(&payload)) {
    return bad(m->mean) || bad(m->m2);
  }
  if (const auto* g = std::get_if<GradSums>(&payload)) {
    return bad(g->sum_dy) || bad(g->sum_dy_xmu);
  }
  return false;
}

}  // namespace

Job::Job(JobSpec spec, JobOptions options, StateStore* store,
         const Clock* clock)
    : spec_(std::move(spec)),
      layout_(spec_),
      options_(options),
      store_(store),
      clock_(clock),
      members_(
          std::make_shared<const Membership>(spec_.world_size, spec_.members)) {
  if (spec_.stats_health) {
    std::vector<std::string> names;
    names.reserve(spec_.layers.size());
    for (const LayerConfig& layer : spec_.layers) names.push_back(layer.name);
    health_ = std::make_unique<StatsHealth>(spec_.job_id, std::move(names),
                                            options_.observer);
  }
  rendezvous_.reserve(spec_.layers.size());
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    rendezvous_.push_back(std::make_unique<LayerRendezvous>(
        spec_, layout_, static_cast<int>(i), options_.recent_rounds, store_,
        options_.observer, options_.straggler_threshold, health_.get()));
  }
}

void Job::Load(const StoredJob& stored) {
  for (const StoredLayer& layer : stored.layers) {
    rendezvous_[layer.slot.layer]->Load(layer);
  }
  if (!stored.membership.empty()) {
    absl::MutexLock lock(&members_mu_);
    members_ = std::make_shared<const Membership>(
        Membership::FromHistory(spec_.world_size, stored.membership));
  }
  if (!stored.stale.empty()) {
    // By layer: the store lists them so.
    LayerRendezvous::Deliveries out;
    const std::shared_ptr<const Membership> members = Members();
    absl::Span<const StoredStaleAnswer> all(stored.stale);
    size_t begin = 0;
    while (begin < all.size()) {
      size_t end = begin;
      while (end < all.size() && all[end].key.layer == all[begin].key.layer) {
        ++end;
      }
      rendezvous_[all[begin].key.layer]->LoadStale(
          all.subspan(begin, end - begin), *members, clock_->Now(), out);
      begin = end;
    }
    LayerRendezvous::Deliver(out);
  }
  absl::MutexLock lock(&admin_mu_);
  for (const CheckpointMeta& c : stored.checkpoints) checkpoints_[c.step] = c;
}

absl::Status Job::Validate(const Contribution& c) const {
  const int num_layers = static_cast<int>(spec_.layers.size());
  if (c.layer < 0 || c.layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", c.layer, " is out of range: job '", BoundedText(spec_.job_id),
        "' has ", num_layers, " layers (0..", num_layers - 1, ")"));
  }
  if (!spec_.shard.owns(c.layer)) return NotOwned(spec_, c.layer);
  if (absl::Status s = CheckStep(c.step, "step"); !s.ok()) return s;
  if (c.rank < 0 || c.rank >= spec_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", c.rank, " is out of range: job '", BoundedText(spec_.job_id),
        "' has world_size ", spec_.world_size, " (ranks 0..",
        spec_.world_size - 1, ")"));
  }
  if (c.phase != Phase::kForward && c.phase != Phase::kBackward) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase ", static_cast<int>(c.phase),
                     " is not valid; set FORWARD "
                     "(with moments) or BACKWARD (with grad_sums)"));
  }
  if (c.backward < 0 || (c.phase == Phase::kForward && c.backward != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward_index ", c.backward, " is not valid for a ",
        PhaseName(c.phase),
        " contribution: a BACKWARD names which backward through its step's "
        "forward it is, from 0; a FORWARD leaves it 0"));
  }
  if (c.round_age < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round_age_ms ", absl::ToInt64Milliseconds(c.round_age),
        " is negative; a relay sets how long the round had been open at it, "
        "at least 0, and a rank leaves it unset"));
  }
  if (c.backward != 0 && spec_.staleness > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward_index ", c.backward, ": job '", BoundedText(spec_.job_id),
        "' is stale-synchronous (staleness ", spec_.staleness,
        "), which syncs one backward per forward; sum the losses into one "
        "backward, or run the forward again for each"));
  }
  absl::Status s = ValidatePayload(c);
  if (!s.ok() && health_ != nullptr && HasNonFinite(c.payload)) {
    health_->CountNonFinite(c.rank);
  }
  return s;
}

absl::Status Job::ValidatePayload(const Contribution& c) const {
  const LayerConfig& layer = spec_.layers[c.layer];
  // The error prefix is built only on the error paths: validation runs for
  // every contribution, and a layer name past the inline string capacity
  // would cost an allocation each time.
  const auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", c.layer, " ('", BoundedText(layer.name), "'): ", what));
  };
  if (spec_.staleness > 0 && !c.update.empty()) {
    return error(
        "a stale-synchronous job (staleness > 0) takes no per-round "
        "momentum or imported_stats; set the layer's momentum in the job, "
        "and import statistics with SetRunningStats");
  }
  if (c.phase == Phase::kForward) {
    const auto* m = std::get_if<Moments>(&c.payload);
    if (m == nullptr) {
      return error("a FORWARD contribution must carry moments");
    }
    absl::Status s = ValidateMoments(*m, layer.channels);
    if (s.ok()) s = ValidateRoundUpdate(c.update, layer.rule, layer.channels);
    if (!s.ok()) return error(s.message());
    return absl::OkStatus();
  }
  if (!c.update.empty()) {
    return error(
        "a BACKWARD contribution carries no momentum or "
        "imported_stats; they go with the step's FORWARD");
  }
  const auto* g = std::get_if<GradSums>(&c.payload);
  if (g == nullptr) {
    return error("a BACKWARD contribution must carry grad_sums");
  }
  absl::Status s = ValidateGradSums(*g, layer.channels);
  if (!s.ok()) return error(s.message());
  return absl::OkStatus();
}

void Job::Contribute(Contribution c, RoundCallback done, absl::Time now) {
  LayerRendezvous& rendezvous = *rendezvous_[c.layer];
  bool applied = false;
  bool deleted = false;
  LayerRendezvous::Deliveries out;
  {
    absl::ReaderMutexLock lock(&state_mu_);
    // A deleted job's rounds must not store anything any more.
    deleted = deleted_;
    if (!deleted) {
      applied = rendezvous.Contribute(std::move(c), MembersHeld(),
                                      std::move(done), now, out);
    }
  }
  if (deleted) {
    RoundOutcome outcome;
    outcome.status = absl::AbortedError(
        absl::StrCat("job deleted: '", BoundedText(spec_.job_id),
                     "' was deleted; create the job again to continue"));
    done(outcome);
    return;
  }
  LayerRendezvous::Deliver(out);
  if (applied && has_pending_.load()) ServeReady();
}

void Job::Abort(const absl::Status& status) {
  Answers answers;
  {
    absl::MutexLock lock(&admin_mu_);
    for (PendingCheckpoint& p : pending_) {
      answers.emplace_back(std::move(p.done), status);
    }
    pending_.clear();
    has_pending_.store(false);
  }
  for (const auto& layer : rendezvous_) layer->Abort(status);
  Answer(answers);
}

absl::Status Job::Delete(const JobImage* successor) {
  absl::MutexLock admin(&admin_mu_);
  absl::WriterMutexLock lock(&state_mu_);
  if (absl::Status s = successor != nullptr ? store_->PutJobImage(*successor)
                                            : store_->DeleteJob(spec_.job_id);
      !s.ok()) {
    return s;
  }
  deleted_ = true;
  checkpoints_.clear();
  return absl::OkStatus();
}

bool Job::SameSpec(const JobSpec& other) const {
  JobSpec theirs = other;
  if (theirs.layers.size() == spec_.layers.size()) {
    for (size_t i = 0; i < spec_.layers.size(); ++i) {
      if (spec_.shard.owns(static_cast<int>(i)) && rendezvous_[i]->Pristine()) {
        continue;
      }
      theirs.layers[i].initial_running_mean =
          spec_.layers[i].initial_running_mean;
      theirs.layers[i].initial_running_var =
          spec_.layers[i].initial_running_var;
    }
  }
  return theirs == spec_;
}

std::shared_ptr<const Membership> Job::Members() const {
  absl::MutexLock lock(&members_mu_);
  return members_;
}

int64_t Job::CommittedStep() const {
  const std::shared_ptr<const Membership> members = Members();
  std::vector<std::vector<int>> ranks;  // of each group, when needed
  if (!members->everyone()) {
    for (int g = 0; g < spec_.num_groups(); ++g) {
      ranks.push_back(layout_.Ranks(g));
    }
  }
  int64_t committed = INT64_MAX;
  for (size_t l = 0; l < rendezvous_.size(); ++l) {
    if (!spec_.shard.owns(static_cast<int>(l))) continue;
    for (int g = 0; g < spec_.num_groups(); ++g) {
      // A layer that runs no rounds (frozen) holds nothing back.
      if (rendezvous_[l]->Frozen(g)) continue;
      const int64_t applied = rendezvous_[l]->LastAppliedStep(g);
      // A group whose ranks have all left waits for nothing: it does not
      // hold the job back.
      if (!ranks.empty() &&
          std::none_of(ranks[g].begin(), ranks[g].end(), [&](int r) {
            return members->IsMember(r, applied + 1);
          })) {
        continue;
      }
      committed = std::min(committed, applied);
    }
  }
  return committed;
}

int64_t Job::NextStep() const {
  int64_t next = 0;
  for (size_t l = 0; l < rendezvous_.size(); ++l) {
    if (!spec_.shard.owns(static_cast<int>(l))) continue;
    next = std::max(next, rendezvous_[l]->NextStep());
  }
  return next;
}

absl::StatusOr<JobSnapshot> Job::UpdateMembership(
    const MembershipRequest& request) {
  LayerRendezvous::Deliveries out;
  std::optional<MembershipReport> report;
  {
    absl::WriterMutexLock lock(&state_mu_);
    if (deleted_) {
      return absl::NotFoundError(
          absl::StrCat("job '", BoundedText(spec_.job_id), "' was deleted"));
    }
    const std::shared_ptr<const Membership> members = Members();
    absl::StatusOr<Membership> next = members->Apply(
        request, spec_.world_size, NextStep(), CommittedStep(), spec_.job_id);
    if (!next.ok()) return next.status();
    if (next->version() != members->version()) {
      if (absl::Status s = store_->PutMembership(spec_.job_id, next->history());
          !s.ok()) {
        return s;
      }
      auto changed = std::make_shared<const Membership>(*std::move(next));
      {
        absl::MutexLock members_lock(&members_mu_);
        members_ = changed;
      }
      const absl::Time now = clock_->Now();
      for (size_t l = 0; l < rendezvous_.size(); ++l) {
        if (!spec_.shard.owns(static_cast<int>(l))) continue;
        rendezvous_[l]->Rebalance(*changed, now, out);
      }
      // What this request changed: a change of the latest's step amends
      // it (Membership::Apply), and the log and metrics count each rank
      // once.
      const MembershipChange& applied = changed->applied();
      LogLine("membership_changed", LogLevel::kInfo)
          .Add("job", BoundedText(spec_.job_id))
          .Add("version", applied.version)
          .Add("step", applied.step)
          .Add("members", RankList(applied.members))
          .Add("joined", RankList(applied.joined))
          .Add("left", RankList(applied.left))
          .Add("removed", RankList(applied.removed));
      report = MembershipReport{spec_.job_id,
                                applied.version,
                                applied.step,
                                static_cast<int>(applied.members.size()),
                                static_cast<int>(applied.joined.size()),
                                static_cast<int>(applied.left.size()),
                                static_cast<int>(applied.removed.size())};
    }
  }
  if (report.has_value() && options_.observer != nullptr) {
    options_.observer->OnMembershipChange(*report);
  }
  LayerRendezvous::Deliver(out);
  // A group emptied, or a round completed, may commit a checkpoint's step.
  if (has_pending_.load()) ServeReady();
  return Snapshot();
}

int64_t Job::ReportedCommittedStep() const {
  const int64_t committed = CommittedStep();
  return committed == INT64_MAX ? -1 : committed;
}

JobSnapshot Job::Snapshot() const {
  return JobSnapshot{spec_, ReportedCommittedStep(), Members()->history(),
                     NextStep()};
}

absl::StatusOr<std::vector<int>> Job::Wanted(absl::Span<const int> layers,
                                             int group) const {
  const int num_layers = static_cast<int>(spec_.layers.size());
  if (group < 0 || group >= spec_.num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group, " is out of range: job '",
                     BoundedText(spec_.job_id), "' has ", spec_.num_groups(),
                     " groups (0..", spec_.num_groups() - 1, ")"));
  }
  std::vector<int> wanted(layers.begin(), layers.end());
  if (wanted.empty()) {
    for (int i = 0; i < num_layers; ++i) {
      if (spec_.shard.owns(i)) wanted.push_back(i);
    }
  }
  for (int layer : wanted) {
    if (layer < 0 || layer >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, " is out of range: job '", BoundedText(spec_.job_id),
          "' has ", num_layers, " layers (0..", num_layers - 1, ")"));
    }
    if (!spec_.shard.owns(layer)) return NotOwned(spec_, layer);
  }
  return wanted;
}

absl::StatusOr<RunningStatsSnapshot> Job::Stats(absl::Span<const int> layers,
                                                int group) const {
  absl::StatusOr<std::vector<int>> wanted = Wanted(layers, group);
  if (!wanted.ok()) return wanted.status();
  RunningStatsSnapshot out;
  out.job_id = spec_.job_id;
  out.committed_step = ReportedCommittedStep();
  for (int layer : *wanted) {
    LayerState state = rendezvous_[layer]->State(group);
    out.layers.push_back(LayerStatsSnapshot{layer, spec_.layers[layer].name,
                                            group, std::move(state.stats),
                                            state.frozen});
  }
  return out;
}

absl::Status Job::ValidateImport(const LayerStatsSnapshot& s) const {
  absl::StatusOr<std::vector<int>> wanted = Wanted({s.layer}, s.group);
  if (!wanted.ok()) return wanted.status();
  const LayerConfig& layer = spec_.layers[s.layer];
  const std::string where = absl::StrCat(
      "layer ", s.layer, " ('", BoundedText(layer.name), "'), group ", s.group);
  if (!s.name.empty() && s.name != layer.name) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the entry names layer '", BoundedText(s.name),
                     "'; match names to indices"));
  }
  if (s.stats.mean.size() != static_cast<size_t>(layer.channels) ||
      s.stats.var.size() != static_cast<size_t>(layer.channels)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected ", layer.channels,
                     " running_mean and running_var "
                     "values, got ",
                     s.stats.mean.size(), " and ", s.stats.var.size()));
  }
  if (s.stats.num_batches_tracked < 0 ||
      s.stats.num_batches_tracked > kMaxNumBatchesTracked) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": num_batches_tracked is ", s.stats.num_batches_tracked,
        "; it must be within [0, ", kMaxNumBatchesTracked, "] (2^53-1)"));
  }
  for (int c = 0; c < layer.channels; ++c) {
    if (!std::isfinite(s.stats.mean[c]) || !std::isfinite(s.stats.var[c]) ||
        s.stats.var[c] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": channel ", c, " has a non-finite mean or var, or var < 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerStatsSnapshot>> Job::SetStats(
    std::vector<LayerStatsSnapshot> layers) {
  if (layers.empty()) {
    return absl::InvalidArgumentError("no layers to set");
  }
  std::set<std::pair<int, int>> seen;
  for (LayerStatsSnapshot& s : layers) {
    if (absl::Status v = ValidateImport(s); !v.ok()) return v;
    if (!seen.emplace(s.layer, s.group).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", s.layer, " of group ", s.group, " is given twice"));
    }
    s.name = spec_.layers[s.layer].name;
  }
  absl::WriterMutexLock lock(&state_mu_);
  if (deleted_) {
    return absl::NotFoundError(
        absl::StrCat("job '", BoundedText(spec_.job_id), "' was deleted"));
  }
  std::vector<LayerSlot> slots;
  for (const LayerStatsSnapshot& s : layers) {
    LayerState state = rendezvous_[s.layer]->State(s.group);
    state.stats = s.stats;
    state.frozen = s.frozen;
    slots.push_back(LayerSlot{s.group, s.layer, std::move(state)});
  }
  if (absl::Status st = store_->PutLayers(spec_.job_id, slots, false);
      !st.ok()) {
    return st;
  }
  for (const LayerStatsSnapshot& s : layers) {
    rendezvous_[s.layer]->SetStats(s.group, s.stats, s.frozen);
  }
  return layers;
}

void Job::Answer(Answers& answers) {
  for (auto& [done, result] : answers) done(result);
}

}  // namespace syncnorm
