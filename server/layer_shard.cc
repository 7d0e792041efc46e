#include "server/layer_shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace syncnorm {

LayerShard::GroupState::GroupState(const LayerConfig& layer, int capacity)
    : phases{PhaseState(capacity), PhaseState(capacity)} {
  stats.mean = layer.initial_running_mean;
  stats.var = layer.initial_running_var;
}

LayerShard::LayerShard(const JobSpec& spec, int layer, int recent_capacity)
    : spec_(spec), layer_(layer), config_(spec.layers[layer]) {
  groups_.reserve(spec.num_groups());
  for (int g = 0; g < spec.num_groups(); ++g) {
    groups_.emplace_back(config_, recent_capacity);
  }
}

void LayerShard::Deliver(Deliveries& deliveries) {
  for (Delivery& d : deliveries) d.done(*d.outcome);
}

LayerShard::Delivery LayerShard::Failure(RoundCallback done,
                                         absl::Status status) {
  auto outcome = std::make_shared<RoundOutcome>();
  outcome->status = std::move(status);
  return Delivery{std::move(done), std::move(outcome)};
}

std::string LayerShard::RoundLabel(const RoundKey& key) const {
  const std::string group =
      spec_.num_groups() > 1 ? absl::StrCat(", group ", std::get<0>(key)) : "";
  return absl::StrCat("round (job ", spec_.job_id, group, ", layer ", layer_,
                      ", step ", std::get<1>(key), ", ",
                      PhaseName(std::get<2>(key)), ")");
}

LayerShard::PhaseState& LayerShard::StateOf(const RoundKey& key) {
  return groups_[std::get<0>(key)].phases[PhaseIndex(std::get<2>(key))];
}

absl::Status LayerShard::Superseded(const RoundKey& key, int64_t latest) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", std::get<1>(key), " of layer ", layer_, " (",
      PhaseName(std::get<2>(key)), ") is superseded: the layer has already ",
      "applied step ", latest, "; steps must increase"));
}

absl::Status LayerShard::Conflict(const Contribution& c) const {
  return absl::AbortedError(absl::StrCat(
      "a different payload was already received for (job ", c.job_id,
      ", layer ", c.layer, ", step ", c.step, ", ", PhaseName(c.phase),
      ", rank ", c.rank, "); a retry must resend the identical contribution"));
}

void LayerShard::Contribute(Contribution c, RoundCallback done,
                            absl::Time now) {
  Deliveries out;
  {
    absl::MutexLock lock(&mu_);
    ContributeLocked(std::move(c), std::move(done), now, out);
  }
  Deliver(out);
}

void LayerShard::ContributeLocked(Contribution c, RoundCallback done,
                                  absl::Time now, Deliveries& out) {
  if (aborted_.has_value()) {
    out.push_back(Failure(std::move(done), *aborted_));
    return;
  }
  const RoundKey key(c.rank / spec_.group_size, c.step, c.phase);
  if (auto it = rounds_.find(key); it != rounds_.end()) {
    AddToRound(key, *it->second, std::move(c), std::move(done), out);
    return;
  }
  PhaseState& state = StateOf(key);
  if (const RecentRounds::Entry* e = state.recent.Find(c.step)) {
    AnswerRetry(*e, c, std::move(done), out);
    return;
  }
  if (c.step <= state.latest_completed) {
    out.push_back(
        Failure(std::move(done), Superseded(key, state.latest_completed)));
    return;
  }
  auto round =
      std::make_unique<Round>(std::get<0>(key) * spec_.group_size,
                              spec_.group_size, now + spec_.round_timeout);
  Round& r = *rounds_.emplace(key, std::move(round)).first->second;
  AddToRound(key, r, std::move(c), std::move(done), out);
}

void LayerShard::AddToRound(const RoundKey& key, Round& round, Contribution c,
                            RoundCallback done, Deliveries& out) {
  const Round::AddResult added =
      round.Add(c.rank, std::move(c.payload), std::move(done));
  if (added == Round::AddResult::kConflict) {
    // The round keeps going unharmed; only this contribution is refused.
    out.push_back(Failure(std::move(done), Conflict(c)));
    return;
  }
  if (added == Round::AddResult::kAdded && round.complete()) {
    Complete(key, round, out);
  }
}

void LayerShard::AnswerRetry(const RecentRounds::Entry& entry,
                             const Contribution& c, RoundCallback done,
                             Deliveries& out) const {
  const std::optional<uint64_t>& sent =
      entry.fingerprints[c.rank % spec_.group_size];
  if (sent.has_value() && *sent != PayloadFingerprint(c.payload)) {
    out.push_back(Failure(std::move(done), Conflict(c)));
    return;
  }
  out.push_back(Delivery{std::move(done), entry.outcome});
}

void LayerShard::Complete(const RoundKey& key, Round& round, Deliveries& out) {
  RoundOutcome outcome;
  const Phase phase = std::get<2>(key);
  if (phase == Phase::kForward) {
    ApplyForward(key, round, outcome);
  } else {
    GroupState& group = groups_[std::get<0>(key)];
    outcome.grad_sums = round.SummedGradSums(config_.channels);
    const RecentRounds::Entry* forward =
        group.phases[PhaseIndex(Phase::kForward)].recent.Find(std::get<1>(key));
    outcome.version = forward != nullptr && forward->outcome->status.ok()
                          ? forward->outcome->version
                          : group.stats.num_batches_tracked;
  }
  const bool ok = outcome.status.ok();
  if (ok) {
    PhaseState& state = StateOf(key);
    state.latest_completed = std::max(state.latest_completed, std::get<1>(key));
  }
  Finish(key, std::move(outcome), out);
  if (ok) FailSuperseded(key, out);
}

void LayerShard::ApplyForward(const RoundKey& key, Round& round,
                              RoundOutcome& outcome) {
  GroupState& group = groups_[std::get<0>(key)];
  const Moments merged = round.MergedMoments(config_.channels);
  const absl::Status updatable = CheckUpdatable(config_.rule, merged.count);
  if (!updatable.ok()) {
    outcome.status = absl::FailedPreconditionError(
        absl::StrCat(RoundLabel(key), ": ", updatable.message()));
    return;
  }
  ApplyRound(config_.rule, merged, group.stats);
  group.last_applied = std::get<1>(key);
  outcome.moments = Finalize(merged);
  outcome.version = group.stats.num_batches_tracked;
}

void LayerShard::FailSuperseded(const RoundKey& completed, Deliveries& out) {
  // A later step of the same (group, phase) completed first: the earlier
  // round could only be applied out of order, so it fails instead.
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    const RoundKey& key = it->first;
    if (std::get<0>(key) != std::get<0>(completed) ||
        std::get<2>(key) != std::get<2>(completed) ||
        std::get<1>(key) >= std::get<1>(completed)) {
      ++it;
      continue;
    }
    const absl::Status status = Superseded(key, std::get<1>(completed));
    for (RoundCallback& done : it->second->TakeWaiters()) {
      out.push_back(Failure(std::move(done), status));
    }
    it = rounds_.erase(it);
  }
}

void LayerShard::Finish(const RoundKey& key, RoundOutcome outcome,
                        Deliveries& out) {
  auto it = rounds_.find(key);
  Round& round = *it->second;
  auto shared = std::make_shared<const RoundOutcome>(std::move(outcome));
  StateOf(key).recent.Add(
      RecentRounds::Entry{std::get<1>(key), shared, round.Fingerprints()});
  for (RoundCallback& done : round.TakeWaiters()) {
    out.push_back(Delivery{std::move(done), shared});
  }
  rounds_.erase(it);
}

void LayerShard::Expire(absl::Time now) {
  Deliveries out;
  {
    absl::MutexLock lock(&mu_);
    std::vector<RoundKey> overdue;
    for (const auto& [key, round] : rounds_) {
      if (round->deadline() <= now) overdue.push_back(key);
    }
    for (const RoundKey& key : overdue) {
      RoundOutcome outcome;
      outcome.missing_ranks = rounds_[key]->MissingRanks();
      outcome.status = absl::DeadlineExceededError(
          absl::StrCat(RoundLabel(key), " missed its ",
                       absl::ToInt64Milliseconds(spec_.round_timeout),
                       " ms deadline waiting for ranks [",
                       absl::StrJoin(outcome.missing_ranks, ", "), "]"));
      Finish(key, std::move(outcome), out);
    }
  }
  Deliver(out);
}

void LayerShard::Abort(const absl::Status& status) {
  Deliveries out;
  {
    absl::MutexLock lock(&mu_);
    aborted_ = status;
    for (auto& [key, round] : rounds_) {
      for (RoundCallback& done : round->TakeWaiters()) {
        out.push_back(Failure(std::move(done), status));
      }
    }
    rounds_.clear();
  }
  Deliver(out);
}

RunningStats LayerShard::Stats(int group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].stats;
}

int64_t LayerShard::LastAppliedStep(int group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].last_applied;
}

}  // namespace syncnorm
