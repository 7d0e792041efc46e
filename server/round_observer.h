// A hook for watching rounds finish: latency, stragglers, quorum rounds and
// deadlines. The aggregator calls it; metrics and logs implement it.
#ifndef SYNCNORM_SERVER_ROUND_OBSERVER_H_
#define SYNCNORM_SERVER_ROUND_OBSERVER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/contribution.h"

namespace syncnorm {

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
};

// Ignores everything.
class NoopRoundObserver final : public RoundObserver {
 public:
  void OnRoundCompleted(const RoundReport&) override {}
  void OnDeadline(const RoundReport&) override {}
};

// Writes one structured line to stderr for every round that had
// stragglers, completed by quorum, failed, or missed its deadline, e.g.
//   syncnorm event=straggler job=j1 group=0 layer=3 step=17 phase=FORWARD
//   latency_ms=812 contributors=[0,1,2,3] stragglers=[2] missing=[]
// and nothing for rounds that completed in time. Thread-safe.
class LoggingRoundObserver final : public RoundObserver {
 public:
  void OnRoundCompleted(const RoundReport& report) override;
  void OnDeadline(const RoundReport& report) override;

  // The line logged for `report` under `event` (straggler, quorum,
  // round_failed, deadline); exposed for tests.
  static std::string Line(const char* event, const RoundReport& report);
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

 private:
  const std::vector<RoundObserver*> observers_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_ROUND_OBSERVER_H_
