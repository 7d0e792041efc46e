// One block round of a relay: an aligned block of a group's positions at
// one (job, layer, step, phase, backward index), the block's members at
// that step, and what they sent: each member's own contribution, or a
// child relay's block that merged an aligned sub-block of its positions.
#ifndef SYNCNORM_RELAY_BLOCK_ROUND_H_
#define SYNCNORM_RELAY_BLOCK_ROUND_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "relay/answers.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// A contribution the relay holds and whoever waits for its answer (more
// than one when a rank, or a child relay, resent it on another stream).
struct HeldContribution {
  v1::Contribution contribution;
  std::vector<AnswerFn> waiters;
};

// Thread-compatible: the relay's lock guards it.
class BlockRound {
 public:
  // `position_ranks`: the ranks of the block's positions that exist, by
  // position, from `first_position`; `members`: those that are members at
  // the step, by position (not empty).
  BlockRound(std::vector<int> position_ranks, std::vector<int> members,
             int first_position, int positions);

  // Holds `c` with `done` waiting for it: a member's own contribution, or
  // a child relay's block (c.relay) of an aligned sub-block within this
  // one whose ranks are exactly the sub-block's members here, with one
  // fingerprint each of the kind this relay computes. A resend of what is
  // held (the same bytes) waits with it: kHeld. Anything else (a member
  // already held or under a held block, a rank that is no member, a block
  // that does not fit) is left to the caller, for the shard to judge:
  // kRefused. Checks a block in O(its positions), whatever its runs say.
  enum class Added { kHeld, kRefused };
  Added Add(v1::Contribution& c, AnswerFn& done);

  // Every member has sent, itself or in a held block.
  bool complete() const { return covered_ == members_.size(); }

  // The block's one upstream contribution: rank the first member, the
  // members' payloads and held blocks merged by MergeTree in the shard's
  // order (a block at its subtree's node, as the shard takes it), the
  // update they agree on, and RelayBlock (a held block's fingerprints in
  // their place). FAILED_PRECONDITION saying why when the
  // block must go through unmerged instead: updates that differ, payloads
  // not of the phase's kind and one width, values not finite, a negative
  // count, a count that overflows. REQUIRES: complete().
  absl::StatusOr<v1::Contribution> Merge() const;

  // Moves out what the block holds, by rank (a held block's: its first
  // member's).
  std::map<int, HeldContribution> TakeHeld() { return std::move(held_); }

  // The key's fields of any held contribution. REQUIRES: something held.
  const v1::Contribution& AnyContribution() const {
    return held_.begin()->second.contribution;
  }

  const std::vector<int>& members() const { return members_; }

  // Forwarded: the merged block is with the shard; nothing more is held.
  bool forwarded() const { return forwarded_; }
  void set_forwarded() { forwarded_ = true; }

 private:
  const std::vector<int> position_ranks_;
  const std::vector<int> members_;
  // By position from first_position: whether its rank is a member.
  std::vector<bool> position_member_;
  // (rank, position) ascending: a rank's position in O(log B).
  std::vector<std::pair<int, int>> by_rank_;
  const int first_position_;
  const int positions_;
  // Whether a child relay's block fits (see Add); its first position
  // within this block and its number of positions (clipped to the
  // positions that exist) when it does.
  bool BlockFits(const v1::Contribution& c, int& offset, int& end) const;
  // A resend of what `held` holds (the same bytes but for round_age_ms,
  // which a child's resend says anew) waits with it.
  Added Resend(HeldContribution& held, const v1::Contribution& c,
               AnswerFn& done) const;

  std::map<int, HeldContribution> held_;  // by rank
  // By position from first_position: a member held, itself or in a block.
  std::vector<bool> position_held_;
  size_t covered_ = 0;  // members held
  bool forwarded_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_BLOCK_ROUND_H_
