// Statistics health of the ranks a relay merges (docs/relay.md, "Statistics
// health"): the shard sees a block as one contribution, so the relay scores
// each of the block's ranks against the rest of its group, after the
// round's answer went out, and the scores go up with the block's next
// contribution of the layer (RelayBlock.health).
#ifndef SYNCNORM_RELAY_BLOCK_HEALTH_H_
#define SYNCNORM_RELAY_BLOCK_HEALTH_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "relay/block_round.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// The scores waiting to go up, per block of a layer. Thread-safe.
//
// Memory: at most kMaxRounds scored rounds per block, and kMaxEntries
// entries in all (about 100 bytes each: 25 MiB); past it the blocks
// scored least recently are forgotten. Normally a block holds one round,
// from its answer to its next contribution.
class BlockHealth {
 public:
  // Scored rounds kept per block while its rounds go through unmerged (the
  // shard takes at most this many per rank: kMaxRelayedHealthPerRank);
  // older ones are dropped.
  static constexpr int kMaxRounds = 4;
  static constexpr int64_t kMaxEntries = 1 << 18;

  // A block of a layer: (job, shard, layer, group, block).
  using BlockId = std::tuple<std::string, int, int, int, int>;

  // Scores each rank of `held` (by rank, what it sent; a child relay's
  // block is not a rank, and is skipped) in the FORWARD
  // round that `answer` (the shard's result, its global moments) ends,
  // against its group without it, and keeps the scores for `id`. Does
  // nothing for an answer without moments. A rank whose moments do not
  // fit the answer's channels, or with no batch, is not scored.
  void Score(const BlockId& id, const std::map<int, HeldContribution>& held,
             const v1::RoundResult& answer) ABSL_LOCKS_EXCLUDED(mu_);

  // Moves the scores kept for `id` into `c`'s RelayBlock.health: those of
  // the ranks it merges and of steps the shard takes with it (before a
  // FORWARD's step; up to a BACKWARD's). Others of its ranks stay for a
  // later contribution; those of ranks no longer in the block are dropped.
  // Appends to what `c` carries: a relay above relays has its children's
  // entries there already (BlockRound::Merge). REQUIRES: c.relay set.
  void Attach(const BlockId& id, v1::Contribution& c) ABSL_LOCKS_EXCLUDED(mu_);

  // Ranks scored, and entries sent up, since the relay started.
  int64_t ranks_scored() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t entries_sent() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    // By step, oldest first; one scored round's entries each (never
    // empty).
    std::deque<std::vector<v1::RankHealth>> rounds;
    int64_t last_scored = 0;  // its key in by_serial_
  };
  // Drops the block's oldest round.
  void PopOldest(Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a block and what it holds.
  void Erase(std::map<BlockId, Pending>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<BlockId, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // The blocks by their latest Score, least recent first.
  std::map<int64_t, BlockId> by_serial_ ABSL_GUARDED_BY(mu_);
  int64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t entries_held_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ranks_scored_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t entries_sent_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_BLOCK_HEALTH_H_
