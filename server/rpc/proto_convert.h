// Translation between syncnorm.v1 messages and the domain types, over the
// conversions the client shares (wire/). No validation here: the domain
// validates and reports.
#ifndef SYNCNORM_SERVER_RPC_PROTO_CONVERT_H_
#define SYNCNORM_SERVER_RPC_PROTO_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/domain/aggregator.h"
#include "server/domain/contribution.h"
#include "server/domain/job.h"
#include "server/domain/job_spec.h"
#include "server/domain/stats_health.h"
#include "server/store/backup_root.h"
#include "server/store/state_store.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// The spec as requested (unresolved; enum values carried as they are).
JobSpec JobSpecFromProto(const v1::CreateJobRequest& request);

// A job's resolved spec and committed step.
void JobInfoToProto(const JobSnapshot& job, v1::JobInfo& info);

// The most ranks a Membership answer names as rank lists as well as runs
// (v1::Membership), over all its sets: about 256 KB.
inline constexpr int64_t kMaxListedRanks = 65536;

// A job's kept membership history (not empty): each set as runs, and as
// rank lists too while the answer names at most kMaxListedRanks ranks.
void MembershipToProto(const std::vector<MembershipChange>& history,
                       v1::Membership& m);

MembershipRequest MembershipRequestFromProto(
    const v1::UpdateMembershipRequest& request);

// The contribution, its payload moved out of `proto`. Its relay block is
// not read: see RelayBlockFromProto.
Contribution ContributionFromProto(v1::Contribution&& proto);

// A relay's block (Contribution.relay) with its ranks listed; INVALID_ARGUMENT
// saying what is wrong when the runs are not ascending (first, last) pairs,
// their ranks not one per fingerprint, the fingerprints of a kind this
// server does not compute, or a health entry with a score that is not
// finite or a negative stuck channel. Costs at most the message's own size.
absl::StatusOr<RelayBlock> RelayBlockFromProto(const v1::RelayBlock& proto);

// The result for `key` (its job, layer, step and phase are echoed); a failed
// outcome becomes RoundResult.error.
void RoundResultToProto(const Contribution& key, const RoundOutcome& outcome,
                        v1::RoundResult& result);

void RunningStatsToProto(const RunningStatsSnapshot& stats,
                         v1::RunningStats& proto);
void LayerStatsToProto(const LayerStatsSnapshot& layer, v1::LayerStats& out);

// The entries of an import, as sent (validated by the domain).
std::vector<LayerStatsSnapshot> LayerStatsFromProto(
    const v1::SetRunningStatsRequest& request);

// The flags and refusals a GetStatsHealth answer lists at most.
inline constexpr int kMaxHealthListed = 256;

// A job's statistics health; nullopt: the job turned it off.
void StatsHealthToProto(const std::string& job_id,
                        const std::optional<StatsHealthSnapshot>& health,
                        v1::StatsHealth& out);

void CheckpointToProto(const CheckpointMeta& meta, v1::CheckpointInfo& info);

void BackupToProto(const BackupSummary& backup, v1::BackupInfo& info);
void RestoreToProto(const JobRestore& restore, v1::RestoreBackupJob& job);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_PROTO_CONVERT_H_
