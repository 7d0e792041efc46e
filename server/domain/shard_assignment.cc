#include "server/domain/shard_assignment.h"

#include "absl/strings/str_cat.h"

namespace syncnorm {

absl::Status CheckShardAssignment(const ShardAssignment& a, int num_layers) {
  if (a.num_shards < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard.num_shards is ", a.num_shards,
        "; it must be positive (the length of the client's shard list), or "
        "the shard field left out for a job on one server"));
  }
  if (!a.sharded()) {
    if (a.shard != 0 || !a.owned_layers.empty()) {
      return absl::InvalidArgumentError(
          "shard: num_shards is 0 (not sharded) but shard or owned_layers "
          "is set; set num_shards to the length of the client's shard list");
    }
    return absl::OkStatus();
  }
  if (a.shard < 0 || a.shard >= a.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard.shard is ", a.shard, "; it must be within [0, ",
                     a.num_shards, ") (shard.num_shards)"));
  }
  for (size_t i = 0; i < a.owned_layers.size(); ++i) {
    const int layer = a.owned_layers[i];
    if (layer < 0 || layer >= num_layers ||
        (i > 0 && layer <= a.owned_layers[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard.owned_layers[", i, "] is ", layer,
          "; owned layers must be ascending, each once, within [0, ",
          num_layers, ")"));
    }
  }
  return absl::OkStatus();
}

bool operator==(const ShardAssignment& a, const ShardAssignment& b) {
  return a.shard == b.shard && a.num_shards == b.num_shards &&
         a.owned_layers == b.owned_layers;
}

}  // namespace syncnorm
