// Which aggregator shard holds each layer of a job: shard lists and
// rendezvous (highest-random-weight) hashing.
#ifndef SYNCNORM_CLIENT_SHARD_ROUTER_H_
#define SYNCNORM_CLIENT_SHARD_ROUTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace syncnorm {

// The shards named by a client address, in ordinal order:
//   "host:port"                       one aggregator;
//   "h0:50051,h1:50051,h2:50051"      shard i is the i-th entry;
//   "syncnorm-aggregator-{0..2}.syncnorm-aggregator.ns.svc:50051"
//                                     an entry with one "{A..B}" range
//                                     stands for B-A+1 entries, A first
//                                     (a StatefulSet's ordinal pod names).
// Entries may carry a gRPC scheme ("dns:///h0:50051"). INVALID_ARGUMENT for
// an empty list or entry, or a malformed range.
absl::StatusOr<std::vector<std::string>> ParseShardList(
    absl::string_view address);

// The rendezvous hash. A shard is known by its ordinal (its position in the
// list), never by its address, so that addresses may change (a pod
// rescheduled, a DNS name replaced by an IP) without moving any layer.
//
//   key(job, layer) = FNV-1a-64 over the bytes of job_id followed by the 4
//                     bytes of (uint32)layer, little-endian
//                     (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
//   score(key, i)   = mix(key ^ mix(i)),  i = the shard's ordinal (uint64)
//   mix(z)          = splitmix64's finalizer: z += 0x9e3779b97f4a7c15;
//                     z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
//                     z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//                     z ^ (z >> 31)                      (mod 2^64)
//
// (job, layer) goes to the shard with the highest score, the lowest
// ordinal on a tie. These functions are a contract: every client of a job
// must place its layers alike, so they never change (shard_router_test
// pins their values).
uint64_t ShardKey(absl::string_view job_id, int layer);
uint64_t RendezvousScore(uint64_t key, int shard);

// The ordinal of the shard of (job, layer) among `num_shards`.
// REQUIRES: num_shards >= 1.
int ShardOf(absl::string_view job_id, int layer, int num_shards);

// The layers 0..num_layers-1 of a job that shard `shard` holds, ascending.
std::vector<int> OwnedLayers(absl::string_view job_id, int num_layers,
                             int shard, int num_shards);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_SHARD_ROUTER_H_
