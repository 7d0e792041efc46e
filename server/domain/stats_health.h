// Statistics health: what the aggregator sees of a job's statistics that
// no rank does. Every forward round holds every rank's moments of a
// layer; a rank whose moments disagree with its group's persistently has a
// broken data shard, a bad augmentation, a wrong input normalization or a
// corrupting accelerator. The rules and their false-alarm rate are in
// docs/semantics.md ("Statistics health").
#ifndef SYNCNORM_SERVER_DOMAIN_STATS_HEALTH_H_
#define SYNCNORM_SERVER_DOMAIN_STATS_HEALTH_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"
#include "server/domain/rank_score.h"

namespace syncnorm {

class RoundObserver;

// Values match the wire's HealthFlag.Kind.
enum class HealthKind : int {
  kMeanShift = 1,
  kVarianceRatio = 2,
  kStuckChannel = 3,
  kDeadChannel = 4,
};
inline constexpr int kNumHealthKinds = 4;

// "mean_shift", "variance_ratio", "stuck_channel", "dead_channel" (metric
// labels and log fields).
const char* HealthKindName(HealthKind kind);

struct HealthFlag {
  HealthKind kind = HealthKind::kMeanShift;
  int group = 0;
  int layer = 0;
  std::string layer_name;
  // -1 for a layer's flag (kDeadChannel).
  int rank = -1;
  // kStuckChannel, kDeadChannel: the lowest such channel; -1 otherwise.
  int channel = -1;
  // The first round of the run that raised it, and the latest seen.
  int64_t first_step = 0;
  int64_t last_step = 0;
  // See the wire's HealthFlag.score.
  double score = 0;
  bool active = true;
  int64_t cleared_step = -1;
};

// A flag raised or cleared, for observers (log lines, metrics).
struct StatsHealthReport {
  std::string job_id;
  HealthFlag flag;
  // true: raised; false: cleared.
  bool raised = true;
};

// One completed forward round's contributions, scored after its answers
// went out (off the round's critical path).
struct HealthSample {
  int group = 0;
  int layer = 0;
  int64_t step = 0;
  // Global ranks present, ascending, with what each sent.
  std::vector<int> ranks;
  std::vector<Moments> moments;
  // The merge of them (var biased).
  GlobalMoments global;
};

struct StatsHealthSnapshot {
  // In force first (by layer, group, rank, kind), then the most recently
  // cleared; at most `limit` (Snapshot).
  std::vector<HealthFlag> flags;
  int64_t flags_in_force = 0;
  // (rank, contributions refused for non-finite values), most first.
  std::vector<std::pair<int, int64_t>> refused;
  int64_t nonfinite_total = 0;
  int64_t rounds_scored = 0;
};

// The health of one job's statistics. Thread-safe: rounds of different
// layers are scored concurrently, each under this object's mutex.
//
// Memory: O(1) per (group, layer) and per (group, layer, rank) that has a
// flag or a run towards one (kMaxTracked at most; healthy ranks hold
// nothing), plus one count per rank with refused contributions and the
// kMaxCleared most recently cleared flags.
class StatsHealth {
 public:
  // A rank is scored against its group when it has a batch (n >= 1) and
  // some other rank does too. A score beyond kThreshold (standard normal
  // units) for kRun of the rank's consecutive scored rounds of a layer
  // raises a flag; kRun rounds within it clear the flag.
  static constexpr double kThreshold = kHealthThreshold;
  static constexpr int kRun = 3;
  // A stuck channel is flagged once the values seen stuck, sum of (n - 1)
  // over consecutive rounds, reach this (a continuous channel of a healthy
  // rank is never stuck; a ReLU channel is, with probability 2^-(n-1)).
  static constexpr int64_t kStuckEvidence = 32;
  // A dead channel is flagged after this many consecutive rounds.
  static constexpr int kDeadRun = 10;
  // Channels scored for the mean and variance (an evenly spaced subset of
  // larger layers), which bounds a round's scoring to O(W * 256).
  static constexpr int kMaxScoredChannels = ::syncnorm::kMaxScoredChannels;
  // Ranks set aside as outliers before the others are scored against the
  // rest, per round (the group's center is not pulled by them).
  static constexpr int kMaxOutliers = kMaxHealthOutliers;
  // Tracked (group, layer, rank)s at most; more are not scored into runs.
  static constexpr int kMaxTracked = 65536;
  static constexpr int kMaxCleared = 64;

  // `layer_names` by layer; `observer` (may be null) hears of every flag
  // raised and cleared, and must outlive this.
  StatsHealth(std::string job_id, std::vector<std::string> layer_names,
              RoundObserver* observer);

  // The flags in force are reported cleared (the job is gone), so that
  // gauges of flags in force do not keep them.
  ~StatsHealth();

  StatsHealth(const StatsHealth&) = delete;
  StatsHealth& operator=(const StatsHealth&) = delete;

  // Scores one round. REQUIRES: sample.moments[i] has the layer's channels.
  void Observe(const HealthSample& sample) ABSL_LOCKS_EXCLUDED(mu_);

  // Tracks the scores a relay computed for its block's ranks of `group`
  // (RelayBlock.health, checked by the caller), as Observe tracks the
  // ranks it scores itself: each rank's entries in step order, an entry of
  // a step the rank's runs have seen already skipped. A stuck channel is
  // the relay's lowest one, so a second stuck channel below the one
  // tracked restarts its evidence (Observe keeps the one tracked).
  void ObserveRelayed(int group, int layer,
                      const std::vector<RankHealth>& entries)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A contribution of `rank` refused for a non-finite value.
  void CountNonFinite(int rank) ABSL_LOCKS_EXCLUDED(mu_);

  // Flags in force and recent, at most `limit`; refusals of at most
  // `limit` ranks.
  StatsHealthSnapshot Snapshot(int limit) const ABSL_LOCKS_EXCLUDED(mu_);

  // The scores of one rank against the others of `sample` (for tests and
  // the documentation's figures): (mean shift, variance ratio) in standard
  // normal units, NaN where not scored. The same computation as Observe.
  static std::vector<std::pair<double, double>> Scores(
      const HealthSample& sample);

 private:
  struct RankRuns {
    // Per kind (mean shift, variance ratio): consecutive scored rounds
    // beyond, and within, the threshold; the step the run began.
    int beyond[2] = {0, 0};
    int within[2] = {0, 0};
    int64_t run_start[2] = {0, 0};
    double score[2] = {0, 0};
    bool on[2] = {false, false};
    int64_t first[2] = {0, 0};
    // The channel seen stuck in the latest rounds, with the values seen
    // stuck since (sum of n - 1) and the step it began.
    int stuck_channel = -1;
    int64_t stuck_evidence = 0;
    int64_t stuck_start = 0;
    bool stuck_on = false;
    int64_t stuck_first = 0;
    int64_t last_step = 0;
    bool Idle() const;
  };
  struct LayerRuns {
    int dead_channel = -1;
    int dead_run = 0;
    int dead_count = 0;
    int64_t dead_start = 0;
    bool dead_on = false;
    int64_t last_step = 0;
  };
  using RankKey = std::tuple<int, int, int>;  // layer, group, rank
  using LayerKey = std::pair<int, int>;       // layer, group

  // Every rank's scores in one round (Scores).
  static std::vector<RankScores> ScoreAll(const HealthSample& sample);
  void ScoreRanks(const HealthSample& sample,
                  std::vector<StatsHealthReport>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One rank's round, scored here or by a relay: its runs beyond and
  // within the threshold, and its stuck channel (-1: none) for a batch of
  // `count` >= 2.
  void Track(const RankKey& key, int64_t step, int64_t count,
             const RankScores& scores, int stuck,
             std::vector<StatsHealthReport>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrackStuck(const RankKey& key, RankRuns& runs, int64_t step,
                  int64_t count, int stuck, std::vector<StatsHealthReport>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckDead(const HealthSample& sample,
                 std::vector<StatsHealthReport>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The flag of `kind` (of a rank, or kDeadChannel of a layer) as its
  // runs hold it now.
  static HealthFlag RankFlag(const RankKey& key, const RankRuns& runs,
                             HealthKind kind);
  static HealthFlag DeadFlag(const LayerKey& key, const LayerRuns& runs);
  StatsHealthReport Report(const HealthFlag& flag, bool raised) const;
  const std::string& NameOf(int layer) const;
  void Cleared(HealthFlag flag, int64_t step,
               std::vector<StatsHealthReport>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  const std::vector<std::string> layer_names_;
  RoundObserver* const observer_;

  mutable absl::Mutex mu_;
  std::map<RankKey, RankRuns> ranks_ ABSL_GUARDED_BY(mu_);
  std::map<LayerKey, LayerRuns> layers_ ABSL_GUARDED_BY(mu_);
  std::deque<HealthFlag> cleared_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> nonfinite_ ABSL_GUARDED_BY(mu_);
  int64_t nonfinite_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rounds_scored_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_STATS_HEALTH_H_
