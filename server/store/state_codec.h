// Encoding of the state store's values (server/store/state.proto) and their
// checks on the way back in.
#ifndef SYNCNORM_SERVER_STORE_STATE_CODEC_H_
#define SYNCNORM_SERVER_STORE_STATE_CODEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/domain/job_spec.h"
#include "server/store/state_store.h"

namespace syncnorm {

// The record format this build writes; newer ones are refused.
inline constexpr uint32_t kStateFormat = 1;
// The format of records that need membership (an elastic job's spec and
// membership): builds before it refuse them instead of waiting for every
// rank. This build reads formats 1..kNewestStateFormat.
inline constexpr uint32_t kMembershipFormat = 2;
// The format of membership records whose rank sets are runs of
// consecutive ranks (MembershipChange.member_runs): builds before it
// refuse them instead of reading no members.
inline constexpr uint32_t kMembershipRunsFormat = 3;
inline constexpr uint32_t kNewestStateFormat = kMembershipRunsFormat;

std::string EncodeJob(const JobSpec& spec);
// With `stats_in_round`, state.stats are left out: the caller writes them in
// the same batch as the stats_after of the forward round at
// state.last_applied (see LayerRecord in state.proto).
std::string EncodeLayer(const LayerState& state, bool stats_in_round = false);
std::string EncodeRound(const StoredRound& round);
std::string EncodeCheckpoint(const CheckpointData& checkpoint);
std::string EncodeMembership(const std::vector<MembershipChange>& changes);
std::string EncodeStaleAnswer(const StoredStaleAnswer& answer);

// Each decoder returns DATA_LOSS saying what is wrong when the bytes do not
// parse, carry a newer format, or do not fit the job's spec (channel
// counts, group and layer ranges, rank counts).
absl::StatusOr<JobSpec> DecodeJob(absl::string_view value);
// A record written with stats_in_round decodes with empty stats and sets
// *stats_in_round (DATA_LOSS when `stats_in_round` is null).
absl::StatusOr<LayerState> DecodeLayer(absl::string_view value,
                                       const LayerConfig& layer,
                                       bool* stats_in_round = nullptr);
// A round of (group, layer). REQUIRES: group and layer in range.
absl::StatusOr<StoredRound> DecodeRound(absl::string_view value,
                                        const JobSpec& spec, int group,
                                        int layer);
absl::StatusOr<CheckpointData> DecodeCheckpoint(absl::string_view value,
                                                const JobSpec& spec);
// An answer of (key), its payload and result of the layer's channels and
// its view of ranks of the key's group.
absl::StatusOr<StoredStaleAnswer> DecodeStaleAnswer(absl::string_view value,
                                                    const JobSpec& spec,
                                                    const StaleKey& key);
// Changes of ranks within the spec's world, versions and steps ascending.
absl::StatusOr<std::vector<MembershipChange>> DecodeMembership(
    absl::string_view value, const JobSpec& spec);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_STATE_CODEC_H_
