#include "server/domain/layer_rendezvous.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/relayed_health.h"
#include "wire/rank_list.h"

namespace syncnorm {

LayerRendezvous::GroupState::GroupState(const LayerConfig& layer, int capacity)
    : phases{PhaseState(capacity), PhaseState(capacity)} {
  state.stats.mean = layer.initial_running_mean;
  state.stats.var = layer.initial_running_var;
}

namespace {

// " 2" (read "BACKWARD 2") for a later backward through a step's forward;
// nothing for the first, so that the messages of one backward per forward
// read as they always have.
std::string BackwardLabel(int backward) {
  return backward == 0 ? std::string() : absl::StrCat(" ", backward);
}

}  // namespace

LayerRendezvous::LayerRendezvous(const JobSpec& spec, const GroupLayout& groups,
                                 int layer, int recent_capacity,
                                 StateStore* store, RoundObserver* observer,
                                 absl::Duration straggler_threshold,
                                 StatsHealth* health)
    : spec_(spec),
      layout_(groups),
      layer_(layer),
      config_(spec.layers[layer]),
      recent_capacity_(recent_capacity),
      store_(store),
      observer_(observer),
      straggler_threshold_(straggler_threshold),
      health_(spec.staleness == 0 ? health : nullptr) {
  groups_.reserve(spec.num_groups());
  for (int g = 0; g < spec.num_groups(); ++g) {
    groups_.emplace_back(config_, recent_capacity);
    if (spec.staleness > 0) {
      const size_t n = layout_.Ranks(g).size();
      for (int p = 0; p < 2; ++p) {
        groups_.back().stale.entries[p].resize(n);
        groups_.back().stale.latest[p].assign(n, -1);
        groups_.back().stale.released[p].assign(n, -1);
      }
    }
  }
}

void LayerRendezvous::Load(const StoredLayer& stored) {
  absl::MutexLock lock(&mu_);
  GroupState& group = groups_[stored.slot.group];
  group.state = stored.slot.state;
  for (const StoredRound& r : stored.rounds) {
    PhaseState& phase = group.phases[PhaseIndex(r.phase)];
    if (phase.recent.Find(r.step, r.backward) != nullptr) continue;
    RecentRounds::Entry entry{r.step,
                              std::make_shared<const RoundOutcome>(r.outcome),
                              r.fingerprints,
                              nullptr,
                              r.fingerprint_kind,
                              r.backward};
    if (r.stats_after.has_value()) {
      entry.stats_after = std::make_shared<const RunningStats>(*r.stats_after);
    }
    phase.recent.Add(std::move(entry));
    // The store lists them by step.
    phase.persisted.push_back(RoundId{r.step, r.backward});
  }
}

void LayerRendezvous::Deliver(Deliveries& deliveries) {
  for (Delivery& d : deliveries) d.done(*d.outcome);
}

LayerRendezvous::Delivery LayerRendezvous::Failure(RoundCallback done,
                                                   absl::Status status) {
  auto outcome = std::make_shared<RoundOutcome>();
  outcome->status = std::move(status);
  return Delivery{std::move(done), std::move(outcome)};
}

std::string LayerRendezvous::RoundLabel(const RoundKey& key) const {
  const std::string group =
      spec_.num_groups() > 1 ? absl::StrCat(", group ", std::get<0>(key)) : "";
  return absl::StrCat("round (job ", BoundedText(spec_.job_id), group,
                      ", layer ", layer_, ", step ", std::get<1>(key), ", ",
                      PhaseName(std::get<2>(key)),
                      BackwardLabel(std::get<3>(key)), ")");
}

LayerRendezvous::PhaseState& LayerRendezvous::StateOf(const RoundKey& key) {
  return groups_[std::get<0>(key)].phases[PhaseIndex(std::get<2>(key))];
}

absl::Status LayerRendezvous::Superseded(const RoundKey& key,
                                         int64_t latest) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", std::get<1>(key), " of layer ", layer_, " (",
      PhaseName(std::get<2>(key)), ") is superseded: the layer has already ",
      "applied step ", latest, "; steps must increase"));
}

absl::Status LayerRendezvous::BeforeForward(const RoundKey& key,
                                            int64_t forward) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "step ", std::get<1>(key), " of layer ", layer_,
      " (BACKWARD) has no completed FORWARD round: the layer's forward "
      "rounds have completed up to step ",
      forward, "; send a step's backward after its forward"));
}

absl::Status LayerRendezvous::Conflict(const Contribution& c) const {
  return absl::AbortedError(absl::StrCat(
      "a different payload was already received for (job ",
      BoundedText(spec_.job_id), ", layer ", c.layer, ", step ", c.step, ", ",
      PhaseName(c.phase), BackwardLabel(c.backward), ", rank ", c.rank,
      "); a retry must resend the identical contribution"));
}

absl::Status LayerRendezvous::BlockError(const Contribution& c) const {
  const RelayBlock& b = *c.block;
  if (spec_.staleness > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", BoundedText(spec_.job_id),
        "' is stale-synchronous (staleness ", spec_.staleness,
        "): every rank's answer merges its own view, so no "
        "relay block serves it; a relay passes its contributions through"));
  }
  const bool power_of_two =
      b.positions > 0 && (b.positions & (b.positions - 1)) == 0;
  if (!power_of_two || b.first_position < 0 ||
      b.first_position % b.positions != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "relay block at positions [", b.first_position, ", ",
        int64_t{b.first_position} + b.positions,
        ") is not an aligned block: its size must be a power of two and its "
        "first position a multiple of it, so that it is a subtree of the "
        "round's merge"));
  }
  if (b.ranks.empty() || b.ranks.front() != c.rank ||
      b.fingerprints.size() != b.ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "relay block of rank ", c.rank, " merges ", b.ranks.size(),
        " ranks with ", b.fingerprints.size(),
        " fingerprints: it needs at least one rank, the contribution's rank "
        "first, and one fingerprint per rank"));
  }
  const int group = layout_.GroupOf(c.rank);
  for (size_t k = 0; k < b.ranks.size(); ++k) {
    const int rank = b.ranks[k];
    if (k > 0 && rank <= b.ranks[k - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "relay block of rank ", c.rank, ": its ranks must ascend, and rank ",
          rank, " follows rank ", b.ranks[k - 1]));
    }
    const bool in_group =
        rank < spec_.world_size && layout_.GroupOf(rank) == group;
    const int position = in_group ? layout_.IndexInGroup(rank) : -1;
    if (!in_group || position < b.first_position ||
        position - b.first_position >= b.positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "relay block at positions [", b.first_position, ", ",
          int64_t{b.first_position} + b.positions, ") of rank ", c.rank,
          "'s group names rank ", rank,
          ", which is not at one of those positions of that group"));
    }
  }
  return CheckRelayedHealth(c, config_.channels);
}

absl::Status LayerRendezvous::Replaced(const Contribution& c) const {
  return absl::AbortedError(absl::StrCat(
      "a newer retry of this contribution (job ", BoundedText(spec_.job_id),
      ", layer ", c.layer, ", step ", c.step, ", ", PhaseName(c.phase),
      BackwardLabel(c.backward), ", rank ", c.rank,
      ") took its place: at most ", Round::kMaxWaitersPerRank,
      " retries of one rank wait for a round, the newest ones get its "
      "result"));
}

absl::Status LayerRendezvous::NotMember(int rank, int64_t step,
                                        const Membership& members) const {
  const MembershipChange& at = members.At(step);
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " is not a member of job '", BoundedText(spec_.job_id),
      "' at step ", step, " (members from step ", at.step, ", version ",
      at.version, ": ", RankList(at.members),
      "); join it first (UpdateMembership), from the job's next_step"));
}

void LayerRendezvous::SetRoles(Round& round, int64_t step,
                               const Membership& members,
                               Deliveries& out) const {
  std::vector<RoundCallback> dropped;
  std::vector<RoundCallback> evicted;
  round.SetRoles(
      [&](int rank) {
        if (!members.IsMember(rank, step)) return Round::Role::kOutside;
        return members.Excused(rank, step) ? Round::Role::kExcused
                                           : Round::Role::kMember;
      },
      dropped, evicted);
  // A relay's block cannot lose one rank: its merge goes whole, and the
  // relay sends its ranks one by one (docs/relay.md).
  for (RoundCallback& done : evicted) {
    out.push_back(
        Failure(std::move(done),
                absl::AbortedError(absl::StrCat(
                    "a relay block of layer ", layer_, ", step ", step,
                    " was dropped: the members of its positions changed (job '",
                    BoundedText(spec_.job_id), "', membership version ",
                    members.version(),
                    "); send its ranks' contributions one by "
                    "one"))));
  }
  if (dropped.empty()) return;
  // Only a rank that has left can lose its contribution; say which.
  for (RoundCallback& done : dropped) {
    out.push_back(Failure(
        std::move(done),
        absl::FailedPreconditionError(absl::StrCat(
            "a contribution to layer ", layer_, ", step ", step,
            " was dropped: its rank is no member of job '",
            BoundedText(spec_.job_id), "' at that step any more (members: ",
            RankList(members.At(step).members), ", version ", members.version(),
            ")"))));
  }
}

bool LayerRendezvous::Rebalance(const Membership& members, absl::Time now,
                                Deliveries& out) {
  bool applied = false;
  Reports reports;
  std::vector<StaleAnswerReport> stale;
  {
    absl::MutexLock lock(&mu_);
    std::vector<RoundKey> keys;
    keys.reserve(rounds_.size());
    for (const auto& [key, round] : rounds_) keys.push_back(key);
    // Ascending steps: completing one fails the earlier ones it supersedes,
    // which are then gone from rounds_.
    for (const RoundKey& key : keys) {
      auto it = rounds_.find(key);
      if (it == rounds_.end()) continue;
      Round& round = it->second;
      SetRoles(round, std::get<1>(key), members, out);
      if (round.received() == 0) {
        rounds_.erase(it);  // its only contributors left
      } else if (round.complete() || QuorumReached(round, now)) {
        bool forward = false;
        Complete(key, round, now, out, forward);
        applied = applied || forward;
      }
    }
    if (spec_.staleness > 0) {
      // A removed or left rank no longer holds the clock back.
      DropStaleNonMembers(members, out);
      for (size_t g = 0; g < groups_.size(); ++g) {
        AnswerStale(static_cast<int>(g), members, now, out);
      }
    }
    reports.swap(reports_);
    stale.swap(stale_reports_);
  }
  Notify(reports, stale);
  return applied;
}

int64_t LayerRendezvous::NextStep() const {
  absl::MutexLock lock(&mu_);
  int64_t latest = -1;
  for (const GroupState& g : groups_) {
    latest =
        std::max(latest, g.state.latest_completed[PhaseIndex(Phase::kForward)]);
  }
  return latest + 1;
}

bool LayerRendezvous::Contribute(Contribution c, const Membership& members,
                                 RoundCallback done, absl::Time now,
                                 Deliveries& out) {
  bool applied = false;
  Reports reports;
  std::vector<StaleAnswerReport> stale;
  {
    absl::MutexLock lock(&mu_);
    ContributeLocked(std::move(c), members, std::move(done), now, out, applied);
    reports.swap(reports_);
    stale.swap(stale_reports_);
  }
  Notify(reports, stale);
  return applied;
}

void LayerRendezvous::ContributeLocked(Contribution c,
                                       const Membership& members,
                                       RoundCallback done, absl::Time now,
                                       Deliveries& out, bool& applied) {
  if (aborted_.has_value()) {
    out.push_back(Failure(std::move(done), *aborted_));
    return;
  }
  if (!members.everyone() && !members.IsMember(c.rank, c.step)) {
    out.push_back(Failure(std::move(done), NotMember(c.rank, c.step, members)));
    return;
  }
  if (c.block.has_value()) {
    if (absl::Status s = BlockError(c); !s.ok()) {
      out.push_back(Failure(std::move(done), std::move(s)));
      return;
    }
  }
  if (spec_.staleness > 0) {
    ContributeStale(std::move(c), members, std::move(done), now, out, applied);
    return;
  }
  // The layer's own momentum, sent anyway, is no momentum of the round's.
  if (c.update.momentum.has_value() &&
      SameMomentum(*c.update.momentum, MomentumOf(config_.rule))) {
    c.update.momentum.reset();
  }
  const RoundKey key(layout_.GroupOf(c.rank), c.step, c.phase, c.backward);
  if (auto it = rounds_.find(key); it != rounds_.end()) {
    AddToRound(key, it->second, std::move(c), std::move(done), now, out,
               applied);
    return;
  }
  const std::array<int64_t, 2>& latest =
      groups_[std::get<0>(key)].state.latest_completed;
  PhaseState& state = StateOf(key);
  if (const RecentRounds::Entry* e = state.recent.Find(c.step, c.backward)) {
    AnswerRetry(*e, c, std::move(done), out);
    return;
  }
  // Forward steps apply in order; a backward changes no state, so it only
  // needs its forward done (autograd runs a reused layer's backwards in
  // reverse).
  const int64_t forward = latest[PhaseIndex(Phase::kForward)];
  if (c.phase == Phase::kForward && c.step <= forward) {
    out.push_back(Failure(std::move(done), Superseded(key, forward)));
    return;
  }
  if (c.phase == Phase::kBackward && c.step > forward) {
    out.push_back(Failure(std::move(done), BeforeForward(key, forward)));
    return;
  }
  Round& r = rounds_
                 .try_emplace(key, layout_.Ranks(std::get<0>(key)),
                              now + spec_.round_timeout)
                 .first->second;
  if (!members.everyone()) SetRoles(r, c.step, members, out);
  AddToRound(key, r, std::move(c), std::move(done), now, out, applied);
}

void LayerRendezvous::AddToRound(const RoundKey& key, Round& round,
                                 Contribution c, RoundCallback done,
                                 absl::Time now, Deliveries& out,
                                 bool& applied) {
  RoundCallback evicted;
  Round::AddResult added;
  // A block's scores of its ranks' earlier rounds, tracked once it is
  // taken (a retry's are the same ones).
  std::vector<RankHealth> relayed;
  if (c.block.has_value() && health_ != nullptr) {
    relayed = std::move(c.block->health);
  }
  if (c.block.has_value()) {
    int conflict = -1;
    absl::StatusOr<Round::AddResult> block =
        round.AddBlock(*c.block, std::move(c.payload), c.update,
                       std::move(done), now, &evicted, &conflict);
    if (!block.ok()) {
      // Only the block is refused; the round goes on.
      out.push_back(Failure(
          std::move(done),
          absl::Status(
              block.status().code(),
              absl::StrCat(RoundLabel(key), ": ", block.status().message()))));
      // A round this block opened holds nothing.
      if (round.received() == 0 && round.waiters() == 0) rounds_.erase(key);
      return;
    }
    added = *block;
    if (added == Round::AddResult::kConflict) c.rank = conflict;
  } else {
    added = round.Add(c.rank, std::move(c.payload), std::move(c.update),
                      std::move(done), now, &evicted);
  }
  if (evicted != nullptr) {
    out.push_back(Failure(std::move(evicted), Replaced(c)));
  }
  if (added == Round::AddResult::kConflict) {
    // The round keeps going unharmed; only this contribution is refused.
    out.push_back(Failure(std::move(done), Conflict(c)));
    return;
  }
  if (c.round_age > absl::ZeroDuration()) {
    // A relay held the round this long: it began then, as its ranks see
    // it. Never more than a timeout back.
    round.Backdate(now - std::min(c.round_age, spec_.round_timeout));
  }
  if (added == Round::AddResult::kAdded &&
      (round.complete() || QuorumReached(round, now))) {
    Complete(key, round, now, out, applied);
  }
  if (added == Round::AddResult::kAdded && !relayed.empty()) {
    ObserveRelayed(std::get<0>(key), std::move(relayed), out);
  }
}

void LayerRendezvous::ObserveRelayed(int group, std::vector<RankHealth> scores,
                                     Deliveries& out) const {
  // After the round's answers, if the block completed it: off its path.
  auto shared =
      std::make_shared<const std::vector<RankHealth>>(std::move(scores));
  out.push_back(Delivery{
      [health = health_, group, layer = layer_, shared](const RoundOutcome&) {
        health->ObserveRelayed(group, layer, *shared);
      },
      NoOutcome()});
}

const std::shared_ptr<const RoundOutcome>& LayerRendezvous::NoOutcome() {
  static const std::shared_ptr<const RoundOutcome>* const kNone =
      new std::shared_ptr<const RoundOutcome>(
          std::make_shared<const RoundOutcome>());
  return *kNone;
}

bool LayerRendezvous::QuorumReached(const Round& round, absl::Time now) const {
  const QuorumPolicy& q = spec_.quorum;
  return q.enabled() &&
         round.received() >= std::min(q.min_ranks, round.members()) &&
         now >= round.started() + q.grace;
}

void LayerRendezvous::Report(const RoundKey& key, const Round& round,
                             const RoundOutcome& outcome, absl::Time now) {
  if (observer_ == nullptr) return;
  RoundReport r;
  r.job_id = spec_.job_id;
  r.group = std::get<0>(key);
  r.layer = layer_;
  r.step = std::get<1>(key);
  r.phase = std::get<2>(key);
  r.latency = now - round.started();
  r.status = outcome.status;
  r.contributors = round.PresentRanks();
  r.missing_ranks = round.MissingRanks();
  r.stragglers = round.Stragglers(straggler_threshold_);
  r.last_arrival = round.LastArrival();
  r.quorum = outcome.status.ok() && !round.complete();
  r.ended = now;
  reports_.push_back(std::move(r));
}

void LayerRendezvous::Notify(absl::Span<const RoundReport> reports,
                             absl::Span<const StaleAnswerReport> stale) const {
  for (const StaleAnswerReport& r : stale) observer_->OnStaleAnswer(r);
  for (const RoundReport& r : reports) {
    if (r.status.code() == absl::StatusCode::kDeadlineExceeded) {
      observer_->OnDeadline(r);
    } else {
      observer_->OnRoundCompleted(r);
    }
  }
}

void LayerRendezvous::AnswerRetry(const RecentRounds::Entry& entry,
                                  const Contribution& c, RoundCallback done,
                                  Deliveries& out) const {
  if (c.block.has_value()) {
    // Each merged rank is checked as its own retry would be; fingerprints
    // of another kind cannot be compared, as for a direct retry's payload
    // they would only be recomputed.
    for (size_t k = 0; k < c.block->ranks.size(); ++k) {
      const int rank = c.block->ranks[k];
      const std::optional<uint64_t>& sent =
          entry.fingerprints[layout_.IndexInGroup(rank)];
      if (sent.has_value() && entry.fingerprint_kind == kFingerprintKind &&
          *sent != c.block->fingerprints[k]) {
        Contribution named;
        named.layer = c.layer;
        named.step = c.step;
        named.phase = c.phase;
        named.backward = c.backward;
        named.rank = rank;
        out.push_back(Failure(std::move(done), Conflict(named)));
        return;
      }
    }
    out.push_back(Delivery{std::move(done), entry.outcome});
    return;
  }
  const std::optional<uint64_t>& sent =
      entry.fingerprints[layout_.IndexInGroup(c.rank)];
  if (sent.has_value() &&
      *sent != ContributionFingerprint(c.payload, c.update,
                                       entry.fingerprint_kind)) {
    out.push_back(Failure(std::move(done), Conflict(c)));
    return;
  }
  out.push_back(Delivery{std::move(done), entry.outcome});
}

void LayerRendezvous::Complete(const RoundKey& key, Round& round,
                               absl::Time now, Deliveries& out, bool& applied) {
  GroupState& group = groups_[std::get<0>(key)];
  const Phase phase = std::get<2>(key);
  // The next state is built aside and installed only once it is stored.
  LayerSlot next{std::get<0>(key), layer_, group.state};
  // What the store keeps of the round, built in place: its outcome is the
  // one delivered, and its statistics become the retry window's.
  StoredRound record;
  record.phase = phase;
  record.step = std::get<1>(key);
  record.backward = std::get<3>(key);
  RoundOutcome& outcome = record.outcome;
  if (phase == Phase::kForward) {
    ApplyForward(key, round, next.state, outcome);
    if (outcome.status.ok()) record.stats_after = next.state.stats;
  } else {
    outcome.grad_sums = round.SummedGradSums(config_.channels);
    outcome.status = Refused(key, CheckFiniteResult(outcome.grad_sums));
    if (!outcome.status.ok()) outcome.grad_sums = GradSums();
    const RecentRounds::Entry* forward =
        group.phases[PhaseIndex(Phase::kForward)].recent.Find(std::get<1>(key),
                                                              0);
    outcome.version = forward != nullptr && forward->outcome->status.ok()
                          ? forward->outcome->version
                          : group.state.stats.num_batches_tracked;
  }
  // A quorum round: these ranks were not counted (a late one is told so).
  outcome.missing_ranks = round.MissingRanks();
  if (!outcome.status.ok()) {
    Report(key, round, outcome, now);
    Finish(key, std::move(outcome), nullptr, round.TakeFingerprints(), out);
    return;
  }
  int64_t& latest = next.state.latest_completed[PhaseIndex(phase)];
  latest = std::max(latest, std::get<1>(key));
  // Stored, then kept in the retry window: taken from the round, not copied.
  record.fingerprints = round.TakeFingerprints();
  const absl::Status stored = Persist(key, next, record);
  if (!stored.ok()) {
    Drop(key,
         absl::Status(stored.code(),
                      absl::StrCat(RoundLabel(key),
                                   " failed and was not applied: its result "
                                   "could not be stored: ",
                                   stored.message())),
         out);
    return;
  }
  group.state = std::move(next.state);
  std::shared_ptr<const RunningStats> after;
  if (record.stats_after.has_value()) {
    after =
        std::make_shared<const RunningStats>(*std::move(record.stats_after));
  }
  Report(key, round, outcome, now);
  std::shared_ptr<HealthSample> sample;
  if (phase == Phase::kForward && health_ != nullptr) {
    // Taken before Finish forgets the round; scored after the answers.
    sample = std::make_shared<HealthSample>();
    sample->group = std::get<0>(key);
    sample->layer = layer_;
    sample->step = std::get<1>(key);
    sample->global = outcome.moments;
    round.TakeMoments(sample->ranks, sample->moments);
  }
  Finish(key, std::move(outcome), std::move(after),
         std::move(record.fingerprints), out);
  if (phase == Phase::kForward) FailSuperseded(key, out);
  if (sample != nullptr) {
    out.push_back(Delivery{[health = health_, sample](const RoundOutcome&) {
                             health->Observe(*sample);
                           },
                           NoOutcome()});
  }
  applied = phase == Phase::kForward;
}

void LayerRendezvous::ApplyForward(const RoundKey& key, Round& round,
                                   LayerState& next, RoundOutcome& outcome) {
  const absl::StatusOr<RoundUpdate> update = round.AgreedUpdate();
  if (!update.ok()) {
    outcome.status = absl::InvalidArgumentError(
        absl::StrCat(RoundLabel(key), " failed: ", update.status().message()));
    outcome.reason = RoundErrorReason::kRanksDisagree;
    return;
  }
  // Each check refuses a round whose result could not be used: every rank
  // gets the error and the running statistics stay as they were.
  absl::StatusOr<Moments> merged = round.MergedMoments(config_.channels);
  if (!merged.ok()) {
    outcome.status = Refused(key, merged.status());
    return;
  }
  const RunningRule rule = RoundRule(config_.rule, *update);
  outcome.status = Refused(key, CheckUpdatable(rule, merged->count));
  if (!outcome.status.ok()) {
    outcome.reason = RoundErrorReason::kSingleValuePerChannel;
    return;
  }
  // The round starts from the imported statistics, if it carries them.
  outcome.status = Refused(
      key, CheckUpdatable(
               rule, merged->count,
               update->imported.has_value() ? *update->imported : next.stats));
  if (!outcome.status.ok()) return;
  GlobalMoments global = Finalize(*std::move(merged));
  outcome.status = Refused(key, CheckFiniteResult(global));
  if (!outcome.status.ok()) return;
  ApplyRound(config_.rule, *update, global, next.stats);
  outcome.status = Refused(key, CheckFiniteResult(next.stats));
  if (!outcome.status.ok()) return;
  next.last_applied = std::get<1>(key);
  next.frozen = false;  // it runs rounds again
  outcome.moments = std::move(global);
  outcome.version = next.stats.num_batches_tracked;
}

absl::Status LayerRendezvous::Refused(const RoundKey& key,
                                      const absl::Status& why) const {
  if (why.ok()) return why;
  return absl::Status(why.code(),
                      absl::StrCat(RoundLabel(key), ": ", why.message(),
                                   "; the round was not applied"));
}

absl::Status LayerRendezvous::Persist(const RoundKey& key,
                                      const LayerSlot& next,
                                      const StoredRound& record) {
  PhaseState& phase = StateOf(key);
  // The store keeps the same window of rounds as memory: the newest ones.
  // Once the window is full, every round evicts one.
  absl::InlinedVector<RoundId, 4> evicted;
  while (phase.persisted.size() - evicted.size() >=
         static_cast<size_t>(recent_capacity_)) {
    evicted.push_back(phase.persisted[evicted.size()]);
  }
  const absl::Status s =
      store_->CommitRound(spec_.job_id, next, record, evicted);
  if (!s.ok()) return s;
  phase.persisted.erase(phase.persisted.begin(),
                        phase.persisted.begin() + evicted.size());
  phase.persisted.push_back(RoundId{std::get<1>(key), std::get<3>(key)});
  return absl::OkStatus();
}

void LayerRendezvous::FailSuperseded(const RoundKey& completed,
                                     Deliveries& out) {
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
    for (RoundCallback& done : it->second.TakeWaiters()) {
      out.push_back(Failure(std::move(done), status));
    }
    it = rounds_.erase(it);
  }
}

void LayerRendezvous::Finish(const RoundKey& key, RoundOutcome outcome,
                             std::shared_ptr<const RunningStats> after,
                             std::vector<std::optional<uint64_t>> fingerprints,
                             Deliveries& out) {
  auto it = rounds_.find(key);
  Round& round = it->second;
  // Every contributor and retry gets this one outcome.
  outcome.serial = NextOutcomeSerial();
  auto shared = std::make_shared<const RoundOutcome>(std::move(outcome));
  RecentRounds::Entry entry{std::get<1>(key), shared, std::move(fingerprints),
                            std::move(after)};
  entry.backward = std::get<3>(key);
  StateOf(key).recent.Add(std::move(entry));
  out.reserve(out.size() + round.waiters());
  round.TakeWaiters([&](RoundCallback&& done) {
    out.push_back(Delivery{std::move(done), shared});
  });
  rounds_.erase(it);
}

void LayerRendezvous::Drop(const RoundKey& key, const absl::Status& status,
                           Deliveries& out) {
  auto it = rounds_.find(key);
  for (RoundCallback& done : it->second.TakeWaiters()) {
    out.push_back(Failure(std::move(done), status));
  }
  rounds_.erase(it);
}

bool LayerRendezvous::Expire(absl::Time now, Deliveries& out) {
  bool applied = false;
  Reports reports;
  std::vector<StaleAnswerReport> stale;
  {
    absl::MutexLock lock(&mu_);
    std::vector<RoundKey> quorate;
    std::vector<RoundKey> overdue;
    for (const auto& [key, round] : rounds_) {
      if (QuorumReached(round, now)) {
        quorate.push_back(key);
      } else if (std::min(round.deadline(),
                          round.started() + spec_.round_timeout) <= now) {
        overdue.push_back(key);
      }
    }
    // Ascending steps: completing one fails the earlier ones it supersedes,
    // which are then gone from rounds_.
    for (const RoundKey& key : quorate) {
      auto it = rounds_.find(key);
      if (it == rounds_.end()) continue;
      bool forward = false;
      Complete(key, it->second, now, out, forward);
      applied = applied || forward;
    }
    for (const RoundKey& key : overdue) {
      auto it = rounds_.find(key);
      if (it == rounds_.end()) continue;
      RoundOutcome outcome;
      outcome.missing_ranks = it->second.MissingRanks();
      outcome.status = absl::DeadlineExceededError(absl::StrCat(
          RoundLabel(key), " missed its ",
          absl::ToInt64Milliseconds(spec_.round_timeout),
          " ms deadline waiting for ranks ", RankList(outcome.missing_ranks)));
      Report(key, it->second, outcome, now);
      Finish(key, std::move(outcome), nullptr, it->second.TakeFingerprints(),
             out);
    }
    if (spec_.staleness > 0) ExpireStale(now, out);
    reports.swap(reports_);
    stale.swap(stale_reports_);
  }
  Notify(reports, stale);
  return applied;
}

void LayerRendezvous::Abort(const absl::Status& status) {
  Deliveries out;
  {
    absl::MutexLock lock(&mu_);
    aborted_ = status;
    for (auto& [key, round] : rounds_) {
      for (RoundCallback& done : round.TakeWaiters()) {
        out.push_back(Failure(std::move(done), status));
      }
    }
    rounds_.clear();
    for (std::vector<RoundCallback>& waiters : TakeStaleWaiters()) {
      for (RoundCallback& done : waiters) {
        out.push_back(Failure(std::move(done), status));
      }
    }
  }
  Deliver(out);
}

int64_t LayerRendezvous::LastAppliedStep(int group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].state.last_applied;
}

LayerState LayerRendezvous::State(int group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].state;
}

absl::StatusOr<LayerState> LayerRendezvous::StateAt(int group,
                                                    int64_t step) const {
  absl::MutexLock lock(&mu_);
  const GroupState& g = groups_[group];
  if (g.state.last_applied <= step) return g.state;
  // The window holds the newest finished steps, so if it holds any forward
  // round at or before `step`, it holds every later one too: the newest of
  // those is the last one applied at or before `step`.
  const RecentRounds::Entry* best = nullptr;
  for (const RecentRounds::Entry& e :
       g.phases[PhaseIndex(Phase::kForward)].recent.entries()) {
    if (e.step <= step && e.stats_after != nullptr &&
        (best == nullptr || e.step > best->step)) {
      best = &e;
    }
  }
  if (best == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer ", layer_, " ('", BoundedText(config_.name), "') of group ",
        group, " has applied step ", g.state.last_applied,
        " and no longer knows its ", "statistics at step ", step, " (the last ",
        recent_capacity_, " rounds are kept); checkpoint a more recent step"));
  }
  LayerState s;
  s.stats = *best->stats_after;
  s.last_applied = best->step;
  s.latest_completed = {best->step, best->step};
  return s;
}

std::vector<RoundCallback> LayerRendezvous::Reset(
    absl::Span<const LayerState> per_group) {
  std::vector<RoundCallback> dropped;
  absl::MutexLock lock(&mu_);
  for (auto& [key, round] : rounds_) {
    for (RoundCallback& done : round.TakeWaiters()) {
      dropped.push_back(std::move(done));
    }
  }
  rounds_.clear();
  for (std::vector<RoundCallback>& waiters : TakeStaleWaiters()) {
    for (RoundCallback& done : waiters) dropped.push_back(std::move(done));
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].state = per_group[g];
    // The stale-synchronous window starts afresh with the steps after it,
    // as if every rank had just sent the restored step.
    StaleState& stale = groups_[g].stale;
    for (int p = 0; p < 2; ++p) {
      for (auto& by_step : stale.entries[p]) by_step.clear();
      std::fill(stale.latest[p].begin(), stale.latest[p].end(),
                per_group[g].last_applied);
      std::fill(stale.released[p].begin(), stale.released[p].end(),
                per_group[g].last_applied);
    }
    stale.persisted.clear();
    for (PhaseState& phase : groups_[g].phases) {
      phase.recent = RecentRounds(recent_capacity_);
      phase.persisted.clear();
    }
  }
  return dropped;
}

bool LayerRendezvous::Pristine() const {
  absl::MutexLock lock(&mu_);
  for (const GroupState& g : groups_) {
    const RunningStats& s = g.state.stats;
    if (g.state.last_applied != -1 || s.num_batches_tracked != 0 ||
        s.mean != config_.initial_running_mean ||
        s.var != config_.initial_running_var) {
      return false;
    }
  }
  return true;
}

void LayerRendezvous::SetStats(int group, const RunningStats& stats,
                               bool frozen) {
  absl::MutexLock lock(&mu_);
  groups_[group].state.stats = stats;
  groups_[group].state.frozen = frozen;
}

bool LayerRendezvous::Frozen(int group) const {
  absl::MutexLock lock(&mu_);
  return groups_[group].state.frozen;
}

}  // namespace syncnorm
