// What a node group answers to a forward round.
#ifndef SYNCNORM_CLIENT_FORWARD_REPLY_H_
#define SYNCNORM_CLIENT_FORWARD_REPLY_H_

#include <cstdint>
#include <vector>

#include "kernels/moments.h"

namespace syncnorm {

// The answer to a forward round.
struct ForwardReply {
  // One member's contribution that a stale-synchronous answer merged
  // (RoundResult.view): its rank and the step it contributed at.
  struct ViewEntry {
    int rank = 0;
    int64_t step = 0;
    friend bool operator==(const ViewEntry& a, const ViewEntry& b) {
      return a.rank == b.rank && a.step == b.step;
    }
  };

  GlobalMoments global;
  // The layer's running-stats version: after the round in a synchronous
  // job; in a stale-synchronous job the aggregator's at answer time, which
  // lags (the statistics are applied once every member has sent a step).
  int64_t version = 0;
  // Ranks of the group whose contributions the round did not count,
  // ascending: a round the job's quorum policy completed without them
  // (RoundResult.missing_ranks). It names the receiver itself when its
  // contribution came too late. Empty when every rank was counted.
  std::vector<int> missing_ranks;
  // A job with staleness > 0: the (rank, step) of each member's
  // contribution that `global` merges, in rank order; never empty (the
  // receiver's own is in it). Empty in synchronous jobs.
  std::vector<ViewEntry> view;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_FORWARD_REPLY_H_
