// One block round of a relay: an aligned block of a group's positions at
// one (job, layer, step, phase, backward index), the block's members at
// that step, and what they sent.
#ifndef SYNCNORM_RELAY_BLOCK_ROUND_H_
#define SYNCNORM_RELAY_BLOCK_ROUND_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "relay/answers.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// A contribution the relay holds and whoever waits for its answer (more
// than one when a rank resent it on another stream).
struct HeldContribution {
  v1::Contribution contribution;
  std::vector<AnswerFn> waiters;
};

// Thread-compatible: the relay's lock guards it.
class BlockRound {
 public:
  // `position_ranks`: the ranks of the block's positions that exist, by
  // position, from `first_position`; `members`: those that are members at
  // the step, by position (not empty); `first_arrival`: when the relay
  // got the round's first contribution, of this block or another.
  BlockRound(std::vector<int> position_ranks, std::vector<int> members,
             int first_position, int positions, absl::Time first_arrival);

  // Holds `c` of a member with `done` waiting for it. A resend of what the
  // rank already sent (the same bytes) waits with it: kHeld. Anything
  // else from a rank already held, or from a rank that is no member,
  // is left to the caller: kRefused.
  enum class Added { kHeld, kRefused };
  Added Add(v1::Contribution& c, AnswerFn& done);

  // Every member has sent.
  bool complete() const { return held_.size() == members_.size(); }

  // The block's one upstream contribution: rank the first member, the
  // members' payloads merged by MergeTree in the shard's order, the update
  // they agree on, and RelayBlock. FAILED_PRECONDITION saying why when the
  // block must go through unmerged instead: updates that differ, payloads
  // not of the phase's kind and one width, values not finite, a negative
  // count, a count that overflows. REQUIRES: complete().
  absl::StatusOr<v1::Contribution> Merge() const;

  // Moves out what the block holds, by rank.
  std::map<int, HeldContribution> TakeHeld() { return std::move(held_); }

  // The key's fields of any held contribution. REQUIRES: something held.
  const v1::Contribution& AnyContribution() const {
    return held_.begin()->second.contribution;
  }

  const std::vector<int>& members() const { return members_; }
  // The round's first arrival at this relay (as constructed).
  absl::Time first_arrival() const { return first_arrival_; }

  // Forwarded: the merged block is with the shard; nothing more is held.
  bool forwarded() const { return forwarded_; }
  void set_forwarded() { forwarded_ = true; }

 private:
  const std::vector<int> position_ranks_;
  const std::vector<int> members_;
  const int first_position_;
  const int positions_;
  const absl::Time first_arrival_;
  std::map<int, HeldContribution> held_;  // by rank
  bool forwarded_ = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_BLOCK_ROUND_H_
