// Who contributes to a job, from which step on: the versioned history of
// an elastic job's members (UpdateMembership).
#ifndef SYNCNORM_SERVER_DOMAIN_MEMBERSHIP_H_
#define SYNCNORM_SERVER_DOMAIN_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wire/rank_set.h"

namespace syncnorm {

// One version of a job's members. Its rank sets are runs shared between
// copies, so that a change costs what it names (as runs), not what the
// job's width or its history holds.
struct MembershipChange {
  int64_t version = 0;
  // The first step it applies to (forward and backward rounds).
  int64_t step = 0;
  // Members from `step` on.
  RankSet members;
  // What changed; empty in version 0.
  RankSet joined;
  RankSet left;
  RankSet removed;
  // Made by a checkpoint restore (the checkpoint of step - 1).
  bool restored = false;
};

bool operator==(const MembershipChange& a, const MembershipChange& b);

// A request to change the members (UpdateMembershipRequest).
struct MembershipRequest {
  // 0: the job's next step.
  int64_t step = 0;
  std::vector<int> join;
  std::vector<int> leave;
  std::vector<int> remove;
};

// The changes a job keeps (at most kMaxHistory), oldest first; the oldest
// stands for every step before it too. A value type: the job swaps in a
// new one under its state lock.
class Membership {
 public:
  // Changes kept. Older ones are folded into the oldest kept once every
  // layer has moved past them (a round at an older step then sees the
  // oldest kept); a change that would need more is RESOURCE_EXHAUSTED.
  static constexpr int kMaxHistory = 64;

  // Version 0 from step 0: `members`, or every rank of `world_size` when
  // empty. REQUIRES: members ascending, distinct, within range.
  Membership(int world_size, absl::Span<const int> members);
  // A stored history of a job of `world_size` ranks. REQUIRES: not empty,
  // versions and steps ascending.
  static Membership FromHistory(int world_size,
                                std::vector<MembershipChange> history);

  const std::vector<MembershipChange>& history() const { return history_; }
  const MembershipChange& latest() const { return history_.back(); }
  // What the Apply that made this value changed, as its request named it
  // (its version and step, its members after it; joined, left and removed
  // by it alone): the latest change, unless Apply amended a change of the
  // same step. latest() where no Apply made it.
  const MembershipChange& applied() const {
    return applied_.has_value() ? *applied_ : latest();
  }
  int64_t version() const { return latest().version; }
  // Whether every rank has always been a member (no change ever made
  // anyone leave): the rounds' fast path.
  bool everyone() const { return everyone_; }

  // The change in force at `step`: the newest one whose step is at or
  // before it (or the oldest kept).
  const MembershipChange& At(int64_t step) const;
  // Whether `rank` is a member at `step`.
  bool IsMember(int rank, int64_t step) const;
  // Whether `rank`, a member at `step`, was removed (not left) by a later
  // change: rounds of `step` no longer wait for it.
  bool Excused(int rank, int64_t step) const;

  // The membership after `request`, with ranks in [0, world_size):
  // `next_step` is the first step the job has not completed anywhere and
  // `committed_step` the one every layer has. Returns *this (same version)
  // when nothing would change (a retry). INVALID_ARGUMENT for a rank out of
  // range or named twice, or no member left; FAILED_PRECONDITION for a step
  // before next_step or the latest change's step; RESOURCE_EXHAUSTED when
  // kMaxHistory changes are still ahead of committed_step.
  absl::StatusOr<Membership> Apply(const MembershipRequest& request,
                                   int world_size, int64_t next_step,
                                   int64_t committed_step,
                                   const std::string& job_id) const;

  // After a restore to the checkpoint of `step`: `members` again from
  // step + 1, as a new version; changes for later steps are dropped.
  Membership Restored(int64_t step, const RankSet& members,
                      int64_t committed_step) const;

 private:
  Membership() = default;
  void Fold(int64_t committed_step);
  void Index();
  // Whether `rank`, no member now, left at a step after `committed_step`
  // (it may still owe rounds before it) and was not removed since.
  bool OwesRounds(int rank, int64_t committed_step) const;

  int world_size_ = 0;
  std::vector<MembershipChange> history_;
  std::optional<MembershipChange> applied_;
  bool everyone_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_MEMBERSHIP_H_
