// The stale-synchronous rounds of LayerRendezvous (spec.staleness > 0).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/domain/layer_rendezvous.h"
#include "wire/rank_list.h"

namespace syncnorm {

void LayerRendezvous::ContributeStale(Contribution c, const Membership& members,
                                      RoundCallback done, absl::Time now,
                                      Deliveries& out, bool& applied) {
  const int g = layout_.GroupOf(c.rank);
  const int pos = layout_.IndexInGroup(c.rank);
  const int p = PhaseIndex(c.phase);
  StaleState& stale = groups_[g].stale;
  std::map<int64_t, StaleEntry>& mine = stale.entries[p][pos];
  const uint64_t fingerprint =
      ContributionFingerprint(c.payload, RoundUpdate());
  const RoundKey key(g, c.step, c.phase, 0);
  if (auto it = mine.find(c.step); it != mine.end()) {
    StaleEntry& e = it->second;
    if (e.fingerprint != fingerprint) {
      out.push_back(Failure(std::move(done), Conflict(c)));
    } else if (e.answer != nullptr) {
      out.push_back(Delivery{std::move(done), e.answer});
    } else {
      if (e.waiters.size() >= static_cast<size_t>(Round::kMaxWaitersPerRank)) {
        out.push_back(Failure(std::move(e.waiters.front()), Replaced(c)));
        e.waiters.erase(e.waiters.begin());
      }
      e.waiters.push_back(std::move(done));
      e.deadline = now + spec_.round_timeout;
      // Answerable already when its answer could not be stored before:
      // the retry gets it now, not at the next contribution.
      AnswerStale(g, members, now, out);
    }
    return;
  }
  if (c.step <= stale.latest[p][pos]) {
    out.push_back(Failure(
        std::move(done),
        absl::FailedPreconditionError(absl::StrCat(
            RoundLabel(key), ": rank ", c.rank, " sent step ",
            stale.latest[p][pos],
            " already, and an earlier step is no longer kept (or was not "
            "sent); a rank's steps must increase"))));
    return;
  }
  if (c.phase == Phase::kBackward) {
    const auto& forwards = stale.entries[PhaseIndex(Phase::kForward)][pos];
    auto f = forwards.find(c.step);
    if (f == forwards.end() || f->second.answer == nullptr) {
      out.push_back(
          Failure(std::move(done),
                  absl::FailedPreconditionError(absl::StrCat(
                      RoundLabel(key), ": rank ", c.rank,
                      " has no answered FORWARD of this step; send a step's "
                      "backward after its forward was answered"))));
      return;
    }
  }
  if (c.phase == Phase::kForward) {
    AddToSyncRound(g, c.rank, c.step, c.payload, members, now, out, applied);
  }
  StaleEntry& e = mine[c.step];
  e.payload = std::move(c.payload);
  e.fingerprint = fingerprint;
  e.waiters.push_back(std::move(done));
  e.deadline = now + spec_.round_timeout;
  e.arrival = now;
  stale.latest[p][pos] = c.step;
  AnswerStale(g, members, now, out);
  // Still waiting after everything that could be answered was: the clock
  // condition (or a backward's view) holds it.
  if (auto it = mine.find(c.step); it != mine.end() && !it->second.answer) {
    it->second.waited = true;
  }
}

void LayerRendezvous::AddToSyncRound(int group, int rank, int64_t step,
                                     const Payload& payload,
                                     const Membership& members, absl::Time now,
                                     Deliveries& out, bool& applied) {
  const RoundKey key(group, step, Phase::kForward, 0);
  // A step already applied (a contribution resent after a restart that
  // lost its answer but kept the step's merge) merges nothing again.
  if (step <=
      groups_[group].state.latest_completed[PhaseIndex(Phase::kForward)]) {
    return;
  }
  auto it = rounds_.find(key);
  if (it == rounds_.end()) {
    it = rounds_
             .try_emplace(key, layout_.Ranks(group), now + spec_.round_timeout)
             .first;
    if (!members.everyone()) SetRoles(it->second, step, members, out);
  }
  Round& round = it->second;
  RoundCallback none;
  RoundCallback evicted;
  const Round::AddResult added =
      round.Add(rank, payload, RoundUpdate(), std::move(none), now, &evicted);
  if (added == Round::AddResult::kAdded && round.complete()) {
    Complete(key, round, now, out, applied);
  }
}

std::optional<RoundOutcome> LayerRendezvous::StaleForward(
    int group, int64_t step, const Membership& members) const {
  const StaleState& stale = groups_[group].stale;
  const std::vector<int> ranks = layout_.Ranks(group);
  const int64_t oldest = step - spec_.staleness;
  // The clock condition: every member waited for has sent a step within
  // the bound (a rank removed later is waited for by no one). A member
  // that has sent nothing has not, even while s - tau is below step 0: an
  // answer is never one rank's batch because the others are yet to start.
  const int64_t needed = std::max<int64_t>(oldest, 0);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!members.IsMember(ranks[i], step) || members.Excused(ranks[i], step)) {
      continue;
    }
    if (stale.latest[0][i] < needed) return std::nullopt;
  }
  RoundOutcome o;
  Moments acc = Moments::Zero(config_.channels);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!members.IsMember(ranks[i], step)) continue;
    const std::map<int64_t, StaleEntry>& e = stale.entries[0][i];
    auto it = e.upper_bound(step);  // the latest at or before `step`
    if (it == e.begin()) continue;
    --it;
    if (it->first < oldest) continue;
    const Moments& m = std::get<Moments>(it->second.payload);
    if (absl::Status s = CheckMergeable(acc, m); !s.ok()) {
      o.status = Refused(
          RoundKey(group, step, Phase::kForward, 0),
          absl::InvalidArgumentError(absl::StrCat(
              "rank ", ranks[i], "'s count does not fit: ", s.message())));
      return o;
    }
    MergeMoments(acc, m);
    o.view.push_back(ViewEntry{ranks[i], it->first});
  }
  const RoundKey key(group, step, Phase::kForward, 0);
  o.status = Refused(key, CheckUpdatable(config_.rule, acc.count));
  if (!o.status.ok()) {
    o.reason = RoundErrorReason::kSingleValuePerChannel;
    o.view.clear();
    return o;
  }
  o.moments = Finalize(std::move(acc));
  o.status = Refused(key, CheckFiniteResult(o.moments));
  if (!o.status.ok()) {
    o.moments = GlobalMoments();
    o.view.clear();
    return o;
  }
  o.version = groups_[group].state.stats.num_batches_tracked;
  return o;
}

std::optional<RoundOutcome> LayerRendezvous::StaleBackward(int group, int pos,
                                                           int64_t step) const {
  const StaleState& stale = groups_[group].stale;
  RoundOutcome o;
  auto f = stale.entries[0][pos].find(step);
  if (f == stale.entries[0][pos].end() || f->second.answer == nullptr) {
    // Its forward fell out of the window while it waited (a rank that
    // sent its forwards far ahead of its backwards).
    o.status = absl::FailedPreconditionError(absl::StrCat(
        RoundLabel(RoundKey(group, step, Phase::kBackward, 0)),
        ": its FORWARD's answer is no longer kept (the slowest rank is more "
        "than 2 staleness steps and the recent rounds past it)"));
    return o;
  }
  const StaleEntry& forward = f->second;
  o.grad_sums.sum_dy.assign(config_.channels, 0.0);
  o.grad_sums.sum_dy_xmu.assign(config_.channels, 0.0);
  // Every (rank, step) of the forward's view, in its (rank) order.
  for (const ViewEntry& v : forward.answer->view) {
    const auto& theirs = stale.entries[1][layout_.IndexInGroup(v.rank)];
    auto it = theirs.find(v.step);
    if (it == theirs.end()) return std::nullopt;
    AddGradSums(o.grad_sums, std::get<GradSums>(it->second.payload));
  }
  o.view = forward.answer->view;
  o.version = forward.answer->version;
  o.status = Refused(RoundKey(group, step, Phase::kBackward, 0),
                     CheckFiniteResult(o.grad_sums));
  if (!o.status.ok()) {
    o.grad_sums = GradSums();
    o.view.clear();
  }
  return o;
}

void LayerRendezvous::AnswerStale(int group, const Membership& members,
                                  absl::Time now, Deliveries& out) {
  StaleState& stale = groups_[group].stale;
  // Forwards first (an answer there can make a backward answerable), each
  // phase by ascending step.
  for (Phase phase : {Phase::kForward, Phase::kBackward}) {
    const int p = PhaseIndex(phase);
    for (size_t pos = 0; pos < stale.entries[p].size(); ++pos) {
      for (auto& [step, entry] : stale.entries[p][pos]) {
        if (entry.answer != nullptr) continue;
        std::optional<RoundOutcome> answer =
            phase == Phase::kForward
                ? StaleForward(group, step, members)
                : StaleBackward(group, static_cast<int>(pos), step);
        if (!answer.has_value()) continue;
        GiveStaleAnswer(group, phase, static_cast<int>(pos), step, entry,
                        *std::move(answer), members, now, out);
      }
    }
  }
  // Not while the entries are walked above: it erases some.
  PruneStale(group, members);
}

int64_t LayerRendezvous::StaleHorizon(int group,
                                      const Membership& members) const {
  const StaleState& stale = groups_[group].stale;
  const std::vector<int> ranks = layout_.Ranks(group);
  // The slowest rank that has sent anything and still takes part bounds
  // what later answers may still read: views reach tau steps back, a
  // backward's view tau more, and retries the recent rounds. A rank that
  // left or was removed holds nothing back.
  int64_t slowest = INT64_MAX;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t latest = stale.latest[0][i];
    if (latest < 0 || !members.IsMember(ranks[i], latest + 1)) continue;
    slowest = std::min(slowest, latest);
  }
  if (slowest == INT64_MAX) return 0;
  return slowest - 2 * spec_.staleness - recent_capacity_;
}

void LayerRendezvous::GiveStaleAnswer(int group, Phase phase, int pos,
                                      int64_t step, StaleEntry& entry,
                                      RoundOutcome answer,
                                      const Membership& members, absl::Time now,
                                      Deliveries& out) {
  const int rank = layout_.Ranks(group)[pos];
  StaleState& stale = groups_[group].stale;
  if (!answer.status.ok()) {
    // A failed answer changes nothing and is not stored: kept here, its
    // retries get it while the window holds it.
    entry.answer = std::make_shared<const RoundOutcome>(std::move(answer));
    for (RoundCallback& done : entry.waiters) {
      out.push_back(Delivery{std::move(done), entry.answer});
    }
    entry.waiters.clear();
    return;
  }
  StoredStaleAnswer record;
  record.key = StaleKey{group, layer_, phase, step, rank};
  record.payload = entry.payload;
  record.fingerprint = entry.fingerprint;
  record.outcome = answer;
  // What falls out of the window goes in the same write.
  const int64_t horizon = StaleHorizon(group, members);
  std::vector<StaleKey> evicted;
  for (const StaleKey& k : stale.persisted) {
    if (k.step < horizon) evicted.push_back(k);
  }
  if (absl::Status s = store_->PutStaleAnswer(spec_.job_id, record, evicted);
      !s.ok()) {
    const absl::Status failed(
        s.code(), absl::StrCat(RoundLabel(RoundKey(group, step, phase, 0)),
                               ": the answer to rank ", rank,
                               " could not be stored: ", s.message()));
    for (RoundCallback& done : entry.waiters) {
      out.push_back(Failure(std::move(done), failed));
    }
    entry.waiters.clear();
    return;
  }
  stale.persisted.erase(
      std::remove_if(stale.persisted.begin(), stale.persisted.end(),
                     [&](const StaleKey& k) { return k.step < horizon; }),
      stale.persisted.end());
  stale.persisted.push_back(record.key);
  if (observer_ != nullptr) {
    StaleAnswerReport r;
    r.job_id = spec_.job_id;
    r.phase = phase;
    int64_t oldest = step;
    for (const ViewEntry& v : answer.view) oldest = std::min(oldest, v.step);
    r.staleness = step - oldest;
    r.waited = entry.waited;
    r.latency = now - entry.arrival;
    stale_reports_.push_back(r);
  }
  // The contributions an acknowledged answer merged are never withdrawn.
  for (const ViewEntry& v : answer.view) {
    auto& theirs =
        stale.entries[PhaseIndex(phase)][layout_.IndexInGroup(v.rank)];
    if (auto it = theirs.find(v.step); it != theirs.end()) {
      it->second.named = true;
    }
  }
  entry.answer = std::make_shared<const RoundOutcome>(std::move(answer));
  for (RoundCallback& done : entry.waiters) {
    out.push_back(Delivery{std::move(done), entry.answer});
  }
  entry.waiters.clear();
}

void LayerRendezvous::PruneStale(int group, const Membership& members) {
  // Below the horizon no later answer reads an entry: the answered ones
  // served their retries, and an unanswered one that no one waits for
  // (its callers timed out) would only be answered for no one.
  const int64_t horizon = StaleHorizon(group, members);
  StaleState& stale = groups_[group].stale;
  for (int p = 0; p < 2; ++p) {
    for (size_t pos = 0; pos < stale.entries[p].size(); ++pos) {
      auto& by_step = stale.entries[p][pos];
      for (auto it = by_step.begin();
           it != by_step.end() && it->first < horizon;) {
        if (it->second.answer == nullptr && !it->second.waiters.empty()) {
          ++it;
          continue;
        }
        stale.released[p][pos] = std::max(stale.released[p][pos], it->first);
        it = by_step.erase(it);
      }
    }
  }
}

void LayerRendezvous::ExpireStale(absl::Time now, Deliveries& out) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const int group = static_cast<int>(g);
    const int size = static_cast<int>(groups_[g].stale.entries[0].size());
    // Every failure is said before anything is withdrawn, so that each
    // names the ranks as they stood while it waited.
    for (int p = 0; p < 2; ++p) {
      for (int pos = 0; pos < size; ++pos) {
        FailLateStale(group, p, pos, now, out);
      }
    }
    for (int p = 0; p < 2; ++p) {
      for (int pos = 0; pos < size; ++pos)
        WithdrawLateStale(group, p, pos, now);
    }
  }
}

void LayerRendezvous::FailLateStale(int group, int p, int pos, absl::Time now,
                                    Deliveries& out) {
  for (auto& [step, entry] : groups_[group].stale.entries[p][pos]) {
    if (entry.answer != nullptr || entry.waiters.empty() ||
        entry.deadline > now) {
      continue;
    }
    const absl::Status late = StaleLate(group, p, pos, step);
    for (RoundCallback& done : entry.waiters) {
      out.push_back(Failure(std::move(done), late));
    }
    entry.waiters.clear();
  }
}

void LayerRendezvous::WithdrawLateStale(int group, int p, int pos,
                                        absl::Time now) {
  StaleState& stale = groups_[group].stale;
  auto& by_step = stale.entries[p][pos];
  bool withdrew = false;
  for (auto it = by_step.begin(); it != by_step.end();) {
    // Its callers were told it failed: unless an answer merged it, it is
    // withdrawn, so that what a rank far ahead sends and gives up on is
    // not kept until the slowest catches up.
    const StaleEntry& entry = it->second;
    if (entry.answer != nullptr || entry.deadline > now || entry.named) {
      ++it;
      continue;
    }
    it = by_step.erase(it);
    withdrew = true;
  }
  if (withdrew) {
    // The rank has sent what it still has here (a retry of a withdrawn
    // step beyond it is a new contribution), and never less than what the
    // window passed.
    stale.latest[p][pos] =
        std::max(stale.released[p][pos],
                 by_step.empty() ? int64_t{-1} : by_step.rbegin()->first);
  }
}

absl::Status LayerRendezvous::StaleLate(int group, int p, int pos,
                                        int64_t step) const {
  const StaleState& stale = groups_[group].stale;
  const Phase phase = p == 0 ? Phase::kForward : Phase::kBackward;
  const int64_t needed = std::max<int64_t>(step - spec_.staleness, 0);
  const std::vector<int> ranks = layout_.Ranks(group);
  std::vector<int> behind;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (stale.latest[p][i] < needed) behind.push_back(ranks[i]);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      RoundLabel(RoundKey(group, step, phase, 0)), ": rank ", ranks[pos],
      "'s contribution missed its ",
      absl::ToInt64Milliseconds(spec_.round_timeout),
      " ms deadline waiting for ranks ", RankList(behind), " to come within ",
      spec_.staleness,
      " steps; a retry waits again unless a later step of the rank is kept"));
}

void LayerRendezvous::DropStaleNonMembers(const Membership& members,
                                          Deliveries& out) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    StaleState& stale = groups_[g].stale;
    const std::vector<int> ranks = layout_.Ranks(static_cast<int>(g));
    for (int p = 0; p < 2; ++p) {
      for (size_t pos = 0; pos < stale.entries[p].size(); ++pos) {
        auto& by_step = stale.entries[p][pos];
        for (auto it = by_step.begin(); it != by_step.end();) {
          if (it->second.answer != nullptr ||
              members.IsMember(ranks[pos], it->first)) {
            ++it;
            continue;
          }
          for (RoundCallback& done : it->second.waiters) {
            out.push_back(Failure(std::move(done),
                                  NotMember(ranks[pos], it->first, members)));
          }
          it = by_step.erase(it);
        }
      }
    }
  }
}

void LayerRendezvous::LoadStale(absl::Span<const StoredStaleAnswer> answers,
                                const Membership& members, absl::Time now,
                                Deliveries& out) {
  Reports reports;
  {
    absl::MutexLock lock(&mu_);
    bool applied = false;
    for (const StoredStaleAnswer& a : answers) {
      const StaleKey& k = a.key;
      StaleState& stale = groups_[k.group].stale;
      const int pos = layout_.IndexInGroup(k.rank);
      const int p = PhaseIndex(k.phase);
      StaleEntry& e = stale.entries[p][pos][k.step];
      e.payload = a.payload;
      e.fingerprint = a.fingerprint_kind == kFingerprintKind
                          ? a.fingerprint
                          : ContributionFingerprint(a.payload, RoundUpdate());
      e.answer = std::make_shared<const RoundOutcome>(a.outcome);
      stale.latest[p][pos] = std::max(stale.latest[p][pos], k.step);
      stale.persisted.push_back(k);
      if (k.phase == Phase::kForward) {
        AddToSyncRound(k.group, k.rank, k.step, a.payload, members, now, out,
                       applied);
      }
    }
    reports.swap(reports_);
  }
  Notify(reports);
}

std::vector<std::vector<RoundCallback>> LayerRendezvous::TakeStaleWaiters() {
  std::vector<std::vector<RoundCallback>> out;
  for (GroupState& g : groups_) {
    for (auto& phase_entries : g.stale.entries) {
      for (auto& by_step : phase_entries) {
        for (auto& [step, entry] : by_step) {
          if (!entry.waiters.empty()) out.push_back(std::move(entry.waiters));
          entry.waiters.clear();
        }
      }
    }
  }
  return out;
}

}  // namespace syncnorm
