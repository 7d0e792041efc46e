// Which layers of a job one aggregator shard holds, when a client spreads
// the job over several shards (CreateJobRequest.shard).
#ifndef SYNCNORM_SERVER_DOMAIN_SHARD_ASSIGNMENT_H_
#define SYNCNORM_SERVER_DOMAIN_SHARD_ASSIGNMENT_H_

#include <algorithm>
#include <vector>

#include "absl/status/status.h"

namespace syncnorm {

// The part of a job this shard serves. The default (num_shards 0) is the
// unsharded case: every layer.
struct ShardAssignment {
  // This shard's ordinal in the client's shard list, [0, num_shards).
  int shard = 0;
  // Shards the job is spread over; 0: not sharded (this server holds all).
  int num_shards = 0;
  // Layers held here, ascending, each once; may be empty. Unused when
  // num_shards is 0.
  std::vector<int> owned_layers;

  bool sharded() const { return num_shards > 0; }
  // Whether this shard holds `layer`.
  bool owns(int layer) const {
    return !sharded() ||
           std::binary_search(owned_layers.begin(), owned_layers.end(), layer);
  }
};

// OK for the unsharded default and for a valid assignment of a job of
// `num_layers` layers; INVALID_ARGUMENT saying what to fix otherwise.
absl::Status CheckShardAssignment(const ShardAssignment& a, int num_layers);

bool operator==(const ShardAssignment& a, const ShardAssignment& b);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_SHARD_ASSIGNMENT_H_
