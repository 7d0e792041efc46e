// How syncnormctl prints answers: protobuf's JSON (-o json), times and
// sizes for tables.
#ifndef SYNCNORM_CLIENT_CTL_OUTPUT_H_
#define SYNCNORM_CLIENT_CTL_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "wire/rank_set.h"

namespace syncnorm::ctl {

// `message` in protobuf's JSON mapping: field names as in the .proto,
// every field present (zeros and empty lists too), 64-bit integers as
// strings, doubles with all their digits; indented, with a newline.
std::string ProtoJson(const google::protobuf::Message& message);

// A JSON object of already-encoded members: {"key": <json>, ...}.
std::string JsonObject(
    const std::vector<std::pair<std::string, std::string>>& members);

// "2024-06-01 12:00:00" (UTC).
std::string FormatUtc(int64_t unix_ms);

// "12.3 KiB", "4.0 MiB", "512 B".
std::string FormatBytes(int64_t bytes);

// Ranks, ascending, with runs of three or more as ranges: "0-3,5,7,8";
// "-" for none.
std::string FormatRanks(const google::protobuf::RepeatedField<int32_t>& ranks);
std::string FormatRanks(const RankSet& ranks);

// "1", "1,2" of a list of shard ordinals.
std::string JoinShards(const google::protobuf::RepeatedField<int32_t>& shards);

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_OUTPUT_H_
