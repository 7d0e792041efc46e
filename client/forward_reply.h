// What a node group answers to a forward round.
#ifndef SYNCNORM_CLIENT_FORWARD_REPLY_H_
#define SYNCNORM_CLIENT_FORWARD_REPLY_H_

#include <cstdint>
#include <vector>

#include "kernels/moments.h"

namespace syncnorm {

// The answer to a forward round.
struct ForwardReply {
  GlobalMoments global;
  int64_t version = 0;  // the layer's running-stats version after the round
  // Ranks of the group whose contributions the round did not count,
  // ascending: a round the job's quorum policy completed without them
  // (RoundResult.missing_ranks). It names the receiver itself when its
  // contribution came too late. Empty when every rank was counted.
  std::vector<int> missing_ranks;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_FORWARD_REPLY_H_
