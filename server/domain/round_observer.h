// A hook for watching rounds finish: latency, stragglers, quorum rounds and
// deadlines. The aggregator calls it; metrics and logs implement it.
#ifndef SYNCNORM_SERVER_DOMAIN_ROUND_OBSERVER_H_
#define SYNCNORM_SERVER_DOMAIN_ROUND_OBSERVER_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/contribution.h"
#include "server/domain/log.h"

namespace syncnorm {

struct StatsHealthReport;  // server/domain/stats_health.h

// What happened to one round of one (job, group, layer, step, phase).
struct RoundReport {
  std::string job_id;
  int group = 0;
  int layer = 0;
  int64_t step = 0;
  Phase phase = Phase::kUnspecified;
  // From the round's first contribution to its end (completion or expiry).
  absl::Duration latency = absl::ZeroDuration();
  // OK for a completed round (its result was applied and sent); otherwise
  // why it failed (DEADLINE_EXCEEDED, or e.g. FAILED_PRECONDITION for a
  // global count of 1). Rounds dropped by a restore, a deleted job or a
  // failed store write are not reported.
  absl::Status status;
  // Global ranks whose contributions the round counted, ascending.
  std::vector<int> contributors;
  // Global ranks of the group that were not counted, ascending: the ranks
  // a quorum round completed without, or those a deadline waited for.
  std::vector<int> missing_ranks;
  // Contributors that arrived more than the straggler threshold after the
  // first one, latest first (the rank that held the round up comes first).
  // Empty for a round that completed within the threshold.
  std::vector<int> stragglers;
  // How long after the first contribution the latest counted one arrived.
  absl::Duration last_arrival = absl::ZeroDuration();
  // True when the job's quorum policy completed the round without
  // `missing_ranks`.
  bool quorum = false;
  // When the round ended, on the aggregator's clock.
  absl::Time ended = absl::UnixEpoch();
};

// One checkpoint cut (Job::Checkpoint once its step was committed).
struct CheckpointReport {
  std::string job_id;
  int64_t step = 0;
  // Taking the layers' statistics as of `step` and storing them.
  absl::Duration duration = absl::ZeroDuration();
  // (group, layer)s stored.
  int layers = 0;
  // OK, or the store's error (nothing was stored).
  absl::Status status;
};

// One change of an elastic job's members (Job::UpdateMembership).
struct MembershipReport {
  std::string job_id;
  int64_t version = 0;
  // The first step it applies to.
  int64_t step = 0;
  int members = 0;
  // Ranks that joined, left and were removed.
  int joined = 0;
  int left = 0;
  int removed = 0;
};

// One answer of a stale-synchronous job (staleness > 0).
struct StaleAnswerReport {
  std::string job_id;
  Phase phase = Phase::kForward;
  // The answer's step minus the oldest step of its view.
  int64_t staleness = 0;
  // Not answered when it arrived: the clock condition (or a backward's
  // view) held it.
  bool waited = false;
  // From its arrival to its answer.
  absl::Duration latency = absl::ZeroDuration();
};

// Receives a report for every round that ends. Implementations must be
// thread-safe and fast: calls come from the contributing and the reaper
// threads, concurrently for different layers, after the layer's lock is
// released and before the round's contributors are answered. They must not
// call back into the aggregator.
class RoundObserver {
 public:
  virtual ~RoundObserver() = default;

  // A round completed: with every rank of its group, or (report.quorum) by
  // the job's quorum policy with the ranks present. Also a round whose
  // merge failed (report.status not OK, e.g. a global count of 1).
  virtual void OnRoundCompleted(const RoundReport& report) = 0;

  // A round missed its deadline (DEADLINE_EXCEEDED naming
  // report.missing_ranks); nothing was applied.
  virtual void OnDeadline(const RoundReport& report) = 0;

  // A checkpoint was cut (or its store write failed). Called under the
  // job's checkpoint lock; the default ignores it.
  virtual void OnCheckpoint(const CheckpointReport& report) {}

  // A job's members changed (not called for a retry that changed nothing,
  // nor for a restore). Called with no lock of the job held; the default
  // ignores it.
  virtual void OnMembershipChange(const MembershipReport& report) {}

  // A stale-synchronous answer was given. Called as OnRoundCompleted is;
  // the default ignores it.
  virtual void OnStaleAnswer(const StaleAnswerReport& report) {}

  // Statistics health raised or cleared a flag (StatsHealth). Called with
  // no lock of the job held, after the round's answers went out; the
  // default ignores it.
  virtual void OnStatsHealth(const StatsHealthReport& report) {}

  // A contribution of `rank` was refused for a non-finite value (counted
  // by statistics health). The default ignores it.
  virtual void OnNonFinite(const std::string& job_id, int rank) {}

  // Time passes: called by the aggregator's reaper thread every reaper
  // period with its clock's time, and with InfiniteFuture() when the
  // aggregator stops (the last call). The default ignores it.
  virtual void OnTick(absl::Time now) {}
};

// Ignores everything.
class NoopRoundObserver final : public RoundObserver {
 public:
  void OnRoundCompleted(const RoundReport&) override {}
  void OnDeadline(const RoundReport&) override {}
};

// Writes the rounds that did not go as they should as log lines
// (server/domain/log.h), and nothing for rounds that completed in time:
// - a round that failed (event=round_failed, level=warn) or missed its
//   deadline (event=deadline, level=error): a line each, e.g.
//     ... level=error event=deadline job=j1 group=0 layer=3 step=17
//     phase=FORWARD latency_ms=30000 ... missing=[5] status=DEADLINE_EXCEEDED
// - a round with stragglers (event=straggler) or completed by the job's
//   quorum (event=quorum), level=warn: the first of a job in an interval
//   gets its own line at once; the job's others of that interval are
//   counted into one line when it ends (event=straggler_summary or
//   quorum_summary: the interval's rounds and layers, the first one's
//   included, first and last step, the ranks named, the largest
//   latency). So a job with one slow or absent rank writes two such lines
//   per interval, not one per layer, phase and step.
// Thread-safe.
class LoggingRoundObserver final : public RoundObserver {
 public:
  // The default of Options::interval, written here only: ServerOptions and
  // the server's flags name it.
  static constexpr absl::Duration kDefaultInterval = absl::Seconds(10);

  struct Options {
    // How long a job's straggler or quorum lines are counted into one;
    // zero: a line for every round. Default 10 s.
    absl::Duration interval = kDefaultInterval;
    // Where lines go; null: stderr. Must outlive the observer.
    LogSink* sink = nullptr;
  };

  LoggingRoundObserver() : LoggingRoundObserver(Options()) {}
  explicit LoggingRoundObserver(Options options);

  void OnRoundCompleted(const RoundReport& report) override;
  void OnDeadline(const RoundReport& report) override;
  // Writes the summary of every interval that ended at or before `now`.
  void OnTick(absl::Time now) override ABSL_LOCKS_EXCLUDED(mu_);
  // One line per flag raised (event=stats_health_flag, level=warn) and
  // cleared (event=stats_health_cleared, level=info).
  void OnStatsHealth(const StatsHealthReport& report) override;

  // The line logged for `report` under `event` (straggler, quorum,
  // round_failed, deadline), without its '\n'; exposed for tests.
  static std::string Line(const char* event, const RoundReport& report);

 private:
  enum Kind { kStraggler = 0, kQuorum = 1 };
  // A job's rounds of one kind since the first of an interval.
  struct Window {
    absl::Time end;
    int64_t rounds = 0;  // the first (which had its own line) included
    std::set<int> layers;
    int64_t first_step = 0;
    int64_t last_step = 0;
    std::set<int> ranks;  // stragglers, or missing ranks for kQuorum
    absl::Duration max_latency = absl::ZeroDuration();
  };
  using WindowKey = std::pair<std::string, Kind>;

  static void Write(LogSink& sink, const char* event, LogLevel level,
                    const RoundReport& report);
  // Its own line when it opens an interval, else counted into it.
  void Fold(Kind kind, const RoundReport& report) ABSL_LOCKS_EXCLUDED(mu_);
  // The interval's line, when it had more than its first round.
  void WriteSummary(const WindowKey& key, const Window& w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const absl::Duration interval_;
  LogSink& sink_;

  absl::Mutex mu_;
  // At most one per (job, kind) with a round in its last interval.
  std::map<WindowKey, Window> windows_ ABSL_GUARDED_BY(mu_);
};

// Calls each of `observers` in turn (e.g. logging and metrics). The
// observers must outlive it.
class FanoutRoundObserver final : public RoundObserver {
 public:
  explicit FanoutRoundObserver(std::vector<RoundObserver*> observers)
      : observers_(std::move(observers)) {}
  void OnRoundCompleted(const RoundReport& report) override {
    for (RoundObserver* o : observers_) o->OnRoundCompleted(report);
  }
  void OnDeadline(const RoundReport& report) override {
    for (RoundObserver* o : observers_) o->OnDeadline(report);
  }
  void OnCheckpoint(const CheckpointReport& report) override {
    for (RoundObserver* o : observers_) o->OnCheckpoint(report);
  }
  void OnMembershipChange(const MembershipReport& report) override {
    for (RoundObserver* o : observers_) o->OnMembershipChange(report);
  }
  void OnStaleAnswer(const StaleAnswerReport& report) override {
    for (RoundObserver* o : observers_) o->OnStaleAnswer(report);
  }
  void OnStatsHealth(const StatsHealthReport& report) override {
    for (RoundObserver* o : observers_) o->OnStatsHealth(report);
  }
  void OnNonFinite(const std::string& job_id, int rank) override {
    for (RoundObserver* o : observers_) o->OnNonFinite(job_id, rank);
  }
  void OnTick(absl::Time now) override {
    for (RoundObserver* o : observers_) o->OnTick(now);
  }

 private:
  const std::vector<RoundObserver*> observers_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_ROUND_OBSERVER_H_
