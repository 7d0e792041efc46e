// One pending round: the contributions of one (job, group, layer, step,
// phase), collected until every rank of the group has sent, the job's
// quorum policy lets it complete with the ranks present, or the deadline
// passes.
#ifndef SYNCNORM_SERVER_DOMAIN_ROUND_H_
#define SYNCNORM_SERVER_DOMAIN_ROUND_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "server/domain/contribution.h"
#include "server/domain/merge_tree.h"

namespace syncnorm {

// Collects payloads per rank and the callbacks of every contributor
// (including retries). Not thread-safe: its owner's mutex guards it.
//
// Memory: at most kMaxWaitersPerRank callbacks wait per rank; a retry
// beyond that evicts the oldest one of its rank (whose caller, a broken
// stream or a cancelled call, is most likely gone), so retries cannot grow
// a round without bound.
class Round {
 public:
  static constexpr int kMaxWaitersPerRank = 8;

  enum class AddResult {
    kAdded,      // first contribution of this rank
    kDuplicate,  // same payload again: the callback also gets the outcome
    kConflict,   // a different payload: refused, callback not kept
  };

  // A round of the group of `ranks` that expires at `deadline`.
  // REQUIRES: ranks ascending, distinct, not empty.
  Round(std::vector<int> ranks, absl::Time deadline);
  // A round of ranks [first_rank, first_rank + group_size).
  // REQUIRES: group_size > 0.
  Round(int first_rank, int group_size, absl::Time deadline);

  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  // Records `rank`'s payload, round update and callback; see AddResult: a
  // duplicate has the same payload and update. `done` is moved from only
  // when kept (kAdded, kDuplicate); on kConflict the caller still owns it.
  // `now` is when the payload arrived (kAdded). A kDuplicate that finds
  // kMaxWaitersPerRank callbacks of its rank waiting moves the oldest into
  // `*evicted` (left empty otherwise), which the caller must answer. An
  // empty `done` waits for nothing (a stale-synchronous job's round, whose
  // contributors are answered on their own).
  // REQUIRES: rank within the group; evicted not null.
  AddResult Add(int rank, Payload payload, RoundUpdate update,
                RoundCallback&& done, absl::Time now, RoundCallback* evicted);

  // Records a relay's block (docs/relay.md) as Add records one rank: its
  // merged payload stands for each of its ranks, which count as sent with
  // the block's fingerprints. INVALID_ARGUMENT when the block's positions
  // are not in the group or its ranks are not exactly its positions'
  // members. kDuplicate when every rank of it is recorded already;
  // kConflict, with `*conflict` the rank, when one was recorded with
  // another fingerprint. A rank that sent directly and is in the block is
  // then represented by the block alone (the same payload merged the same
  // way). `done` is kept as Add keeps it, answered with the round, or
  // failed when a membership change evicts the block (SetRoles).
  // REQUIRES: evicted and conflict not null; block.ranks not empty, each
  // with a fingerprint of kFingerprintKind.
  absl::StatusOr<AddResult> AddBlock(const RelayBlock& block, Payload payload,
                                     const RoundUpdate& update,
                                     RoundCallback&& done, absl::Time now,
                                     RoundCallback* evicted, int* conflict);

  // A rank's part in the round, when the job's members changed (all are
  // kMember otherwise).
  enum class Role {
    kMember,   // waited for
    kExcused,  // removed by a later change: not waited for, but missing
    kOutside,  // no member at the round's step: neither
  };
  // Gives each rank of the group its role (`role_of(rank)`). A rank put
  // kOutside loses what it sent; its callbacks are appended to `dropped`
  // for the caller to answer. A relay's block whose positions' members
  // changed is evicted whole (its ranks no longer sent): its callbacks go
  // to `evicted_blocks`.
  void SetRoles(absl::FunctionRef<Role(int rank)> role_of,
                std::vector<RoundCallback>& dropped,
                std::vector<RoundCallback>& evicted_blocks);

  // Every member has contributed.
  bool complete() const { return awaited_ == 0; }
  // Ranks that have contributed.
  int received() const { return static_cast<int>(received_); }
  // Ranks waited for or excused (every rank of the group unless the job's
  // members changed).
  int members() const { return members_; }
  absl::Time deadline() const { return deadline_; }
  // When the first payload arrived; InfiniteFuture before any.
  absl::Time first_arrival() const { return first_arrival_; }
  // When the round began: its first arrival, or earlier when a relay said
  // it had begun there earlier (Backdate). The quorum's grace and the
  // deadline run from it.
  absl::Time started() const { return std::min(first_arrival_, started_); }
  // A relay's contribution said the round had begun at `start`.
  void Backdate(absl::Time start) { started_ = std::min(started_, start); }

  // Global ranks (members or excused) that have not contributed,
  // ascending.
  std::vector<int> MissingRanks() const;
  // Global ranks that have contributed, ascending.
  std::vector<int> PresentRanks() const;
  // Ranks that arrived more than `threshold` after the first one, latest
  // first.
  std::vector<int> Stragglers(absl::Duration threshold) const;
  // How long after the first payload the latest one arrived.
  absl::Duration LastArrival() const;

  // The Chan merge of the moments present, in MergeTree's fixed order over
  // the group's positions, so the result does not depend on arrival order
  // (absent ranks are skipped: a quorum round); most of it was merged as
  // the payloads arrived. INVALID_ARGUMENT naming the rank when the counts
  // sum past INT64_MAX. Called once, when the round ends.
  // REQUIRES: FORWARD payloads.
  absl::StatusOr<Moments> MergedMoments(int channels);

  // The sum of the gradient sums present, in the same order; called once.
  // REQUIRES: BACKWARD.
  GradSums SummedGradSums(int channels);

  // The update every rank present sent; INVALID_ARGUMENT naming a rank
  // whose update differs from the lowest rank's.
  // REQUIRES: at least one rank present.
  absl::StatusOr<RoundUpdate> AgreedUpdate() const;

  // Per rank of the group: the fingerprint of its payload and update
  // (ContributionFingerprint, kFingerprintKind, computed when it was
  // added), or nullopt if absent.
  const std::vector<std::optional<uint64_t>>& Fingerprints() const;
  // Moves them out. REQUIRES: the round is finished; nothing reads
  // Fingerprints() afterwards.
  std::vector<std::optional<uint64_t>> TakeFingerprints();

  // Moves out the FORWARD payloads present, in rank order, with their
  // global ranks (statistics health). REQUIRES: the round is finished and
  // merged; nothing reads its payloads afterwards.
  void TakeMoments(std::vector<int>& ranks, std::vector<Moments>& moments);

  // Callbacks collected so far (retries included).
  size_t waiters() const { return waiters_.size(); }
  // Moves out every callback collected so far, oldest first: into a
  // vector, or one by one into `take` (which allocates nothing itself).
  std::vector<RoundCallback> TakeWaiters();
  void TakeWaiters(absl::FunctionRef<void(RoundCallback&&)> take);

 private:
  // The position of `rank` in ranks_.
  int IndexOf(int rank) const;
  // Keeps `done` as a waiter of position `index` (a block's: its first
  // member), evicting the oldest of the position's when it has
  // kMaxWaitersPerRank.
  void Wait(int index, bool block, RoundCallback&& done,
            RoundCallback* evicted);
  // The end of the positions [first, first + positions) within the group.
  int BlockEnd(int first, int positions) const;
  // Whether positions [first, end) would have members other than `ranks`
  // under the roles set.
  bool OtherMembers(int first, int end, absl::Span<const int> ranks) const;
  // Evicts the blocks whose positions' members changed (SetRoles).
  void EvictChangedBlocks(std::vector<RoundCallback>& evicted_blocks);

  const std::vector<int> ranks_;  // ascending
  const absl::Time deadline_;
  // What a rank of the group sent besides its payload (in tree_), by
  // position in ranks_: one allocation per round for all of it (the round
  // is on every message's path).
  struct Slot {
    bool sent = false;  // its payload is in tree_
    RoundUpdate update;
    absl::Time arrival = absl::InfiniteFuture();
    int waiting = 0;  // callbacks of this rank in waiters_
    Role role = Role::kMember;
    bool via_block = false;  // sent in a relay's block, not in tree_'s leaf
  };
  std::vector<Slot> slots_;
  MergeTree tree_;  // the payloads, merged as they arrive
  std::vector<std::optional<uint64_t>> fingerprints_;  // of payload and update
  absl::Time first_arrival_ = absl::InfiniteFuture();
  absl::Time started_ = absl::InfiniteFuture();  // Backdate's earliest
  size_t received_ = 0;
  size_t awaited_ = 0;  // members without a payload
  int members_ = 0;     // members and excused ranks
  struct Waiter {
    int index;  // position in ranks_
    RoundCallback done;
    bool block = false;  // a relay's, for its block at `index`
  };
  std::vector<Waiter> waiters_;  // oldest first; room for one per rank
  // The relay blocks taken: their positions [first, first + positions)
  // and the ranks merged.
  struct Block {
    int first;
    int positions;
    std::vector<int> ranks;
  };
  std::vector<Block> blocks_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_ROUND_H_
