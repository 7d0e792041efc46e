// The domain form of a job: who contributes, which layers, how rounds wait.
#ifndef SYNCNORM_SERVER_DOMAIN_JOB_SPEC_H_
#define SYNCNORM_SERVER_DOMAIN_JOB_SPEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/moments.h"
#include "server/domain/shard_assignment.h"

namespace syncnorm {

// The value of RunningRule::mode that means "not given" (the wire's
// MOMENTUM_MODE_UNSPECIFIED); ResolveJobSpec turns it into kTorch.
inline constexpr MomentumMode kMomentumModeUnspecified =
    static_cast<MomentumMode>(0);

// One BatchNorm layer of a job.
struct LayerConfig {
  // Human-readable name, e.g. "layer1.0.bn1". May be empty.
  std::string name;
  // Number of channels C; must be positive.
  int channels = 0;
  // Running-statistics rule. Before resolution, mode may be
  // kMomentumModeUnspecified and momentum 0 (the mode's default).
  RunningRule rule;
  // Initial running statistics: empty, or exactly `channels` finite values
  // (var >= 0). Resolution fills empty ones with zeros (mean) / ones (var).
  std::vector<double> initial_running_mean;
  std::vector<double> initial_running_var;
};

// When a round may complete without every rank of its group.
struct QuorumPolicy {
  // Ranks of a group that must be present; 0: off (every rank, or the
  // deadline). Within [0, group_size].
  int min_ranks = 0;
  // How long after a round's first contribution it waits for the rest
  // before completing with >= min_ranks present. >= 0 and below the job's
  // round timeout; must be 0 when min_ranks is 0.
  absl::Duration grace = absl::ZeroDuration();

  bool enabled() const { return min_ranks > 0; }
};

// A job as created by CreateJob.
struct JobSpec {
  // 1-128 characters of [A-Za-z0-9._-].
  std::string job_id;
  // Number of contributors W; ranks are 0..W-1. Positive.
  int world_size = 0;
  // Ranks per group when the groups are consecutive blocks; 0 before
  // resolution means one group of world_size (or the explicit `groups`).
  // Must divide world_size. 0 after resolution: explicit groups.
  int group_size = 0;
  // The groups as rank lists (torch process groups), when they are not
  // consecutive blocks: every rank in exactly one. Resolution sorts each
  // group and the groups by lowest rank (group g is groups[g]), and turns
  // consecutive blocks of one size into group_size (leaving this empty).
  std::vector<std::vector<int>> groups;
  // How long a round waits for missing ranks after its first contribution;
  // zero before resolution means the server default.
  absl::Duration round_timeout = absl::ZeroDuration();
  // At least one layer; a contribution's layer indexes this list.
  std::vector<LayerConfig> layers;
  // Off by default: a round waits for every rank until its deadline.
  QuorumPolicy quorum;
  // The layers this server holds when the job is spread over shards;
  // default: all of them.
  ShardAssignment shard;
  // The ranks that contribute from step 0 of an elastic job (its members
  // change later, see Membership); empty: every rank. Resolution sorts
  // them and empties a list of every rank.
  std::vector<int> members;
  // Bounded staleness tau of stale-synchronous rounds, within
  // [0, kMaxStaleness]; 0: synchronous (see LayerRendezvous).
  int staleness = 0;
  // Statistics health scores the job's forward rounds (StatsHealth); off
  // for a job whose ranks see differently distributed data by design.
  bool stats_health = true;

  int num_groups() const {
    if (!groups.empty()) return static_cast<int>(groups.size());
    return group_size > 0 ? world_size / group_size : 1;
  }
};

// The largest staleness bound a job may have: the steps of contributions
// the aggregator keeps per member grow with it.
inline constexpr int kMaxStaleness = 64;

// The ranks of group `g` of a resolved spec, ascending.
// REQUIRES: 0 <= g < spec.num_groups().
std::vector<int> GroupRanks(const JobSpec& spec, int g);

// The ranks of the smallest group of a resolved spec.
int SmallestGroupSize(const JobSpec& spec);

// The largest step a request may name (a contribution's, a checkpoint's, a
// restore's): 2^53 - 1, which every client holds exactly (in a float64 or a
// JavaScript Number too), and far below INT64_MAX, which the server uses
// for "no step".
inline constexpr int64_t kMaxStep = (int64_t{1} << 53) - 1;

// INVALID_ARGUMENT naming `field` unless 0 <= step <= kMaxStep.
absl::Status CheckStep(int64_t step, absl::string_view field);

// The longest round timeout a job may have: a round that waits longer for
// a rank is a hung job, and its contributions are held all that time.
inline constexpr absl::Duration kMaxRoundTimeout = absl::Hours(24);

// Validates `spec` and fills in every default: group_size 0 -> world_size
// (without groups; groups are sorted, consecutive blocks -> group_size),
// round_timeout 0 -> default_round_timeout, mode unspecified -> kTorch,
// momentum 0 -> DefaultMomentum(mode), empty initial stats -> zeros / ones.
// Returns INVALID_ARGUMENT naming the offending field and the fix otherwise.
// Resolving a resolved spec returns it unchanged.
// REQUIRES: default_round_timeout > 0.
// The longest layer name and checkpoint tag a new request may give, in
// bytes: far above a qualified module name (the Python client's layer
// names), far below what a client could otherwise make the server store
// and log. Checked on the requests that bring them (CheckNewNames,
// CheckTag), not on state loaded from the store.
inline constexpr size_t kMaxNameBytes = 1024;

// INVALID_ARGUMENT naming the layer when a layer name of `spec` is longer
// than kMaxNameBytes.
absl::Status CheckNewNames(const JobSpec& spec);

// INVALID_ARGUMENT when a checkpoint tag is longer than kMaxNameBytes.
absl::Status CheckTag(absl::string_view tag);

absl::StatusOr<JobSpec> ResolveJobSpec(JobSpec spec,
                                       absl::Duration default_round_timeout);

// Field-by-field equality; meaningful on resolved specs (the test for an
// idempotent CreateJob).
bool operator==(const LayerConfig& a, const LayerConfig& b);
bool operator!=(const LayerConfig& a, const LayerConfig& b);
bool operator==(const QuorumPolicy& a, const QuorumPolicy& b);
bool operator==(const JobSpec& a, const JobSpec& b);
bool operator!=(const JobSpec& a, const JobSpec& b);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_JOB_SPEC_H_
