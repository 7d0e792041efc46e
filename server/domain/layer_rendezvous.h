// The rendezvous of one layer of one job: its pending rounds, running
// statistics and recent outcomes, for every group, behind one mutex.
#ifndef SYNCNORM_SERVER_DOMAIN_LAYER_RENDEZVOUS_H_
#define SYNCNORM_SERVER_DOMAIN_LAYER_RENDEZVOUS_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"
#include "server/domain/group_layout.h"
#include "server/domain/job_spec.h"
#include "server/domain/membership.h"
#include "server/domain/recent_rounds.h"
#include "server/domain/round.h"
#include "server/domain/round_observer.h"
#include "server/domain/stats_health.h"
#include "server/store/state_store.h"

namespace syncnorm {

// One (job, layer) stripe of the aggregator. Thread-safe. Callbacks are
// always run after mu_ is released, on the calling thread (by Contribute's
// caller, through Deliver, so that it too can release its locks first).
//
// Durability: a completed round's new layer state and outcome are written
// to the store (one atomic write) before any contributor gets the result;
// if that write fails, the round fails for all and nothing is applied.
class LayerRendezvous {
 public:
  // `spec` (resolved), `groups` (its layout), `store` and `observer` (if
  // not null) must outlive the rendezvous. `recent_capacity` finished rounds
  // are kept per (group, phase) for retries. `observer` hears of every round
  // that ends, with its contributors that arrived more than
  // `straggler_threshold` after the first. `health` (if not null, and the
  // job synchronous) scores every forward round that completes, after its
  // answers: the last Delivery the round appends does it; and tracks the
  // scores a relay's block carries once the block is taken
  // (RelayBlock.health, checked with the block).
  // REQUIRES: 0 <= layer < spec.layers.size(), recent_capacity > 0.
  LayerRendezvous(const JobSpec& spec, const GroupLayout& groups, int layer,
                  int recent_capacity, StateStore* store,
                  RoundObserver* observer, absl::Duration straggler_threshold,
                  StatsHealth* health = nullptr);

  LayerRendezvous(const LayerRendezvous&) = delete;
  LayerRendezvous& operator=(const LayerRendezvous&) = delete;

  // Installs a (group, layer)'s stored state and rounds, found at startup.
  // REQUIRES: before any other call; stored.slot.layer is this layer and
  // its group in range (the store checks both).
  void Load(const StoredLayer& stored) ABSL_LOCKS_EXCLUDED(mu_);

  // A callback with the outcome it is owed.
  struct Delivery {
    RoundCallback done;
    std::shared_ptr<const RoundOutcome> outcome;
  };
  // Inline room for the answers to a small group's round: every round's
  // completion gathers its answers here.
  using Deliveries = absl::InlinedVector<Delivery, 8>;

  // Calls every callback with its outcome. REQUIRES: no aggregator lock held.
  static void Deliver(Deliveries& deliveries);

  // Installs this layer's stored stale-synchronous answers (after Load of
  // its layers): each answers its retries again, counts in later views,
  // and, when its step's running-statistics merge was not applied yet, is
  // in that merge again. A merge that is then complete is applied at once
  // (its answers go to `out`). REQUIRES: before serving; every key's layer
  // is this one.
  void LoadStale(absl::Span<const StoredStaleAnswer> answers,
                 const Membership& members, absl::Time now, Deliveries& out)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stale-synchronous rounds (spec.staleness tau > 0): a FORWARD of
  // (rank r, step s) is answered once every member of the group (at s)
  // has sent a FORWARD of a step >= s - tau (one that has sent none has
  // not, also while s - tau < 0), with the rank-order merge of
  // each member's latest FORWARD of a step within [s - tau, s] (the view,
  // RoundOutcome::view). A BACKWARD of (r, s) is answered with the
  // rank-order sum of the BACKWARDs of the (rank, step)s of the view of
  // r's FORWARD of s, once they have all arrived. Every answer is stored
  // before it is given (a retry gets it again). Each FORWARD also goes to
  // its step's synchronous round, which applies the running statistics
  // when every member's contribution of the step is in, in step order.
  // A rank's steps must increase per phase; its contributions are kept
  // for the steps after the slowest member's latest minus 2 tau minus the
  // recent rounds (older retries and backwards are FAILED_PRECONDITION).
  // A contribution still unanswered at its deadline fails with
  // DEADLINE_EXCEEDED and, unless an answer given merged it, is withdrawn:
  // it counts in no later answer, and its rank's latest step falls back to
  // the highest it still has kept, so that a retry is a new contribution.
  //
  // Adds `c` to its round; `done` is answered exactly once: when the round
  // completes or fails, at once for a retry of a finished round, or at once
  // with ABORTED (conflicting payload), FAILED_PRECONDITION (a superseded
  // FORWARD step, a BACKWARD before its FORWARD completed) or the status
  // given to Abort. BACKWARD rounds of completed forward steps are taken in
  // any order. The answers this call can give are appended to `out` for
  // the caller to Deliver. Returns true when this call completed a forward
  // round that was applied.
  // A rank that is no member of the job at c.step (`members`) is refused
  // with FAILED_PRECONDITION; a round waits for the members in force at its
  // step and not for ranks removed later.
  // c.job_id is not read (the spec's is). REQUIRES: c is validated against
  // the spec and c.layer is this layer.
  bool Contribute(Contribution c, const Membership& members, RoundCallback done,
                  absl::Time now, Deliveries& out) ABSL_LOCKS_EXCLUDED(mu_);

  // After a membership change: every pending round waits for the members
  // `members` has at its step. A rank no longer a member loses its
  // contribution (its callers get FAILED_PRECONDITION), and a round that no
  // longer waits for anyone completes. The answers go to `out`. Returns
  // true when a forward round was applied.
  bool Rebalance(const Membership& members, absl::Time now, Deliveries& out)
      ABSL_LOCKS_EXCLUDED(mu_);

  // One past the highest forward step any group has completed (0 before
  // any).
  int64_t NextStep() const ABSL_LOCKS_EXCLUDED(mu_);

  // Completes every round whose quorum grace period has passed with enough
  // ranks present (spec.quorum), then fails every round whose deadline is
  // at or before `now` with DEADLINE_EXCEEDED naming the missing ranks
  // (running stats untouched). The answers go to `out` for the caller to
  // Deliver. Returns true when a forward round was applied.
  bool Expire(absl::Time now, Deliveries& out) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every pending round with `status` and answers every later
  // contribution with it. REQUIRES: !status.ok().
  void Abort(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // The step of the last forward round `group` applied; -1 before any.
  int64_t LastAppliedStep(int group) const ABSL_LOCKS_EXCLUDED(mu_);

  // The state of `group` as of `step`: after the last forward round at or
  // before it. FAILED_PRECONDITION when the layer has moved on beyond the
  // rounds it remembers. REQUIRES: group in range.
  absl::StatusOr<LayerState> StateAt(int group, int64_t step) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The latest state of `group`. REQUIRES: group in range.
  LayerState State(int group) const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether no group has moved from the layer's initial statistics: no
  // forward round applied, no import, statistics as created.
  bool Pristine() const ABSL_LOCKS_EXCLUDED(mu_);

  // A restore: drops every pending round and replaces every group's state
  // (per_group[g]), forgetting the finished rounds. Returns the callbacks of
  // the dropped rounds, for the caller to fail once it holds no lock. The
  // caller has stored the new states. REQUIRES: one state per group.
  std::vector<RoundCallback> Reset(absl::Span<const LayerState> per_group)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces the running statistics of `group` (an import) and whether it
  // runs no rounds (LayerState::frozen); steps and finished rounds stay.
  // The caller has stored them.
  void SetStats(int group, const RunningStats& stats, bool frozen)
      ABSL_LOCKS_EXCLUDED(mu_);

  // LayerState::frozen of `group`: the committed step does not wait for it.
  bool Frozen(int group) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // (group, step, phase, backward)
  using RoundKey = std::tuple<int, int64_t, Phase, int>;

  struct PhaseState {
    explicit PhaseState(int capacity) : recent(capacity) {}
    RecentRounds recent;
    // This phase's rounds in the store, in the order they were stored
    // (ascending after a restart), the first to go first.
    std::deque<RoundId> persisted;
  };

  // A contribution of a job with staleness > 0, kept while answers may use
  // it (see Contribute).
  struct StaleEntry {
    Payload payload;
    uint64_t fingerprint = 0;
    // Null until answered; then given to every retry.
    std::shared_ptr<const RoundOutcome> answer;
    std::vector<RoundCallback> waiters;            // until answered
    absl::Time deadline = absl::InfiniteFuture();  // of the waiters
    absl::Time arrival = absl::InfinitePast();
    // Not answered when it arrived: it waited for the clock condition (or,
    // BACKWARD, for the contributions of its view).
    bool waited = false;
    // Named in the view of an answer given: kept until the window passes
    // it, even when its own waiters time out, so that every answer stays
    // the merge of the contributions it names.
    bool named = false;
  };
  struct StaleState {
    // [phase][position in the group]: the entries by step.
    std::array<std::vector<std::map<int64_t, StaleEntry>>, 2> entries;
    // [phase][position]: the highest step received and not withdrawn (see
    // ExpireStale); -1 before any.
    std::array<std::vector<int64_t>, 2> latest;
    // [phase][position]: the highest step whose entry the window passed
    // (PruneStale); latest never goes below it. -1 before any.
    std::array<std::vector<int64_t>, 2> released;
    // The answers in the store, in the order they were stored.
    std::deque<StaleKey> persisted;
  };

  struct GroupState {
    GroupState(const LayerConfig& layer, int capacity);
    LayerState state;
    std::array<PhaseState, 2> phases;  // FORWARD, BACKWARD
    StaleState stale;                  // sized when spec.staleness > 0
  };

  // Reports of the rounds that one call ends: mostly one, kept inline, for
  // every completed round makes one.
  using Reports = absl::InlinedVector<RoundReport, 2>;

  static Delivery Failure(RoundCallback done, absl::Status status);
  static int PhaseIndex(Phase phase) {
    return phase == Phase::kForward ? 0 : 1;
  }

  std::string RoundLabel(const RoundKey& key) const;
  PhaseState& StateOf(const RoundKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ContributeLocked(Contribution c, const Membership& members,
                        RoundCallback done, absl::Time now, Deliveries& out,
                        bool& applied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddToRound(const RoundKey& key, Round& round, Contribution c,
                  RoundCallback done, absl::Time now, Deliveries& out,
                  bool& applied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands a taken block's scores of its ranks (RelayBlock.health) to
  // health_ after the deliveries before it. REQUIRES: health_ not null.
  void ObserveRelayed(int group, std::vector<RankHealth> scores,
                      Deliveries& out) const;
  // An outcome for a delivery that answers nobody.
  static const std::shared_ptr<const RoundOutcome>& NoOutcome();
  // Whether the quorum policy lets `round` complete at `now` without the
  // ranks still missing.
  bool QuorumReached(const Round& round, absl::Time now) const;
  // The stale-synchronous path of ContributeLocked (spec_.staleness > 0).
  void ContributeStale(Contribution c, const Membership& members,
                       RoundCallback done, absl::Time now, Deliveries& out,
                       bool& applied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a FORWARD payload to its step's synchronous round (the running
  // statistics), completing it when every member's is in.
  void AddToSyncRound(int group, int rank, int64_t step, const Payload& payload,
                      const Membership& members, absl::Time now,
                      Deliveries& out, bool& applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers every waiting stale entry of `group` that can be answered now.
  void AnswerStale(int group, const Membership& members, absl::Time now,
                   Deliveries& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to the FORWARD of (group position `pos`, `step`) when the
  // clock condition holds; nullopt otherwise.
  std::optional<RoundOutcome> StaleForward(int group, int64_t step,
                                           const Membership& members) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The answer to the BACKWARD of (`pos`, `step`) once the backwards of its
  // forward view are in; nullopt otherwise.
  std::optional<RoundOutcome> StaleBackward(int group, int pos,
                                            int64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stores `answer` for `entry` of (group, phase, pos, step) and hands it
  // to its waiters; on a store error the waiters get it, and the entry
  // stays unanswered.
  void GiveStaleAnswer(int group, Phase phase, int pos, int64_t step,
                       StaleEntry& entry, RoundOutcome answer,
                       const Membership& members, absl::Time now,
                       Deliveries& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The oldest step of `group` whose entries are still kept: the slowest
  // rank still in `members` bounds it.
  int64_t StaleHorizon(int group, const Membership& members) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Forgets the entries of `group` older than its horizon (no answer reads
  // them any more) that no one waits for: answered ones, and unanswered
  // ones whose callers were failed.
  void PruneStale(int group, const Membership& members)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the waiters of unanswered stale entries past their deadline with
  // DEADLINE_EXCEEDED and withdraws those entries: forgotten as if never
  // sent (a retry is a new contribution), unless an answer names them.
  void ExpireStale(absl::Time now, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For the entries of (group, phase index p, position pos): fails the
  // waiters of the unanswered ones past their deadline; withdraws those
  // no answer names.
  void FailLateStale(int group, int p, int pos, absl::Time now, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WithdrawLateStale(int group, int p, int pos, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The DEADLINE_EXCEEDED of the entry of (group, p, pos, step).
  absl::Status StaleLate(int group, int p, int pos, int64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Moves out the callbacks of every unanswered stale entry.
  std::vector<std::vector<RoundCallback>> TakeStaleWaiters()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a membership change: drops the entries of ranks no longer
  // members at their step (their waiters get FAILED_PRECONDITION).
  void DropStaleNonMembers(const Membership& members, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Queues the observer's report of a round that ends at `now`.
  void Report(const RoundKey& key, const Round& round,
              const RoundOutcome& outcome, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `reports` (taken from reports_) to the observer: DEADLINE_EXCEEDED
  // ones to OnDeadline, the rest to OnRoundCompleted; then `stale` (taken
  // from stale_reports_). REQUIRES: mu_ not held.
  void Notify(absl::Span<const RoundReport> reports,
              absl::Span<const StaleAnswerReport> stale = {}) const;
  void AnswerRetry(const RecentRounds::Entry& entry, const Contribution& c,
                   RoundCallback done, Deliveries& out) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Complete(const RoundKey& key, Round& round, absl::Time now,
                Deliveries& out, bool& applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyForward(const RoundKey& key, Round& round, LayerState& next,
                    RoundOutcome& outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `record`, the round's result, and the layer's next state to
  // the store.
  absl::Status Persist(const RoundKey& key, const LayerSlot& next,
                       const StoredRound& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailSuperseded(const RoundKey& completed, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the outcome of a finished round with its `fingerprints` (taken
  // from it, Round::TakeFingerprints), hands the outcome to its waiters and
  // forgets the round.
  void Finish(const RoundKey& key, RoundOutcome outcome,
              std::shared_ptr<const RunningStats> after,
              std::vector<std::optional<uint64_t>> fingerprints,
              Deliveries& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails a round's waiters with `status` and forgets it, remembering
  // nothing (a retry starts the round afresh).
  void Drop(const RoundKey& key, const absl::Status& status, Deliveries& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `why` (OK stays OK) as the failure of the round `key`, said so.
  absl::Status Refused(const RoundKey& key, const absl::Status& why) const;
  absl::Status Superseded(const RoundKey& key, int64_t latest) const;
  absl::Status BeforeForward(const RoundKey& key, int64_t forward) const;
  absl::Status Conflict(const Contribution& c) const;
  absl::Status NotMember(int rank, int64_t step,
                         const Membership& members) const;
  // Gives every rank of `round` (of step `step`) its role under `members`;
  // the callbacks of ranks put outside are failed into `out`.
  void SetRoles(Round& round, int64_t step, const Membership& members,
                Deliveries& out) const;
  // What is wrong with c.block where the spec and layout tell (the ranks'
  // group and positions, the job's kind); OK if nothing. The members are
  // checked by the round.
  absl::Status BlockError(const Contribution& c) const;
  // For the waiter a retry evicted (Round::kMaxWaitersPerRank).
  absl::Status Replaced(const Contribution& c) const;

  // Constant after construction.
  const JobSpec& spec_;
  const GroupLayout& layout_;
  const int layer_;
  const LayerConfig& config_;
  const int recent_capacity_;
  StateStore* const store_;
  RoundObserver* const observer_;  // may be null
  const absl::Duration straggler_threshold_;
  StatsHealth* const health_;  // may be null

  mutable absl::Mutex mu_;
  // Each round lives in its map node (one allocation per round; a node
  // stays in place until erased).
  std::map<RoundKey, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<GroupState> groups_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> aborted_ ABSL_GUARDED_BY(mu_);
  // Reports of rounds that ended, handed to observer_ once mu_ is released.
  Reports reports_ ABSL_GUARDED_BY(mu_);
  // The same of stale-synchronous answers.
  std::vector<StaleAnswerReport> stale_reports_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_LAYER_RENDEZVOUS_H_
