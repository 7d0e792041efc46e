// What the relay reads of a job's JobInfo: where a rank sits in its group,
// which ranks are members at a step, and the job's round policy.
#ifndef SYNCNORM_RELAY_JOB_VIEW_H_
#define SYNCNORM_RELAY_JOB_VIEW_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "wire/rank_set.h"

namespace syncnorm {

// A rank's place: its group, its position in the group (the index in the
// group's rank list) and its block of `block_positions` positions.
struct RankPlace {
  int group = 0;
  int position = 0;
  int block = 0;
};

// A job as one shard described it (GetJob), read for the relay's decisions.
// Immutable; thread-compatible.
class JobView {
 public:
  // INVALID_ARGUMENT naming what does not parse (a membership's runs, a
  // group list that does not partition the ranks).
  static absl::StatusOr<JobView> FromProto(const v1::JobInfo& info);

  // The place of `rank`; nullopt for a rank outside the job.
  // REQUIRES: block_positions a positive power of two.
  std::optional<RankPlace> Place(int rank, int block_positions) const;

  // The ranks of positions [first, first + count) of `group` that exist,
  // by position. REQUIRES: group valid.
  std::vector<int> PositionRanks(int group, int first, int count) const;

  // Whether `rank` is a member at `step` (the change in force then).
  bool IsMember(int rank, int64_t step) const;

  // Whether a change after `step` removed `rank`: a round of `step` that
  // still waits for it completes without it (UpdateMembership's remove).
  bool RemovedAfter(int rank, int64_t step) const;

  bool accepts_relay_blocks() const { return accepts_relay_blocks_; }
  int staleness() const { return staleness_; }
  int64_t next_step() const { return next_step_; }
  // The job's round timeout (resolved by the shard).
  absl::Duration round_timeout() const { return round_timeout_; }
  // The quorum's grace; nullopt without a quorum.
  std::optional<absl::Duration> quorum_grace() const { return quorum_grace_; }

 private:
  struct Change {
    int64_t step = 0;
    RankSet members;
    RankSet removed;
  };

  int world_size_ = 0;
  int group_size_ = 0;                    // 0: explicit groups_
  std::vector<std::vector<int>> groups_;  // group_size_ 0: by lowest rank
  std::vector<int> group_of_;             // explicit groups: rank -> group
  std::vector<int> position_of_;          // explicit groups: rank -> position
  std::vector<Change> changes_;           // oldest first; empty: everyone
  bool accepts_relay_blocks_ = false;
  int staleness_ = 0;
  int64_t next_step_ = 0;
  absl::Duration round_timeout_;
  std::optional<absl::Duration> quorum_grace_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_JOB_VIEW_H_
