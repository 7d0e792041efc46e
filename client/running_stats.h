// Loading a job's running statistics from the aggregator into SyncBatchNorm
// layers: before eval, or to resume training after a restore.
#ifndef SYNCNORM_CLIENT_RUNNING_STATS_H_
#define SYNCNORM_CLIENT_RUNNING_STATS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/sync_batch_norm.h"

namespace syncnorm {

// Replaces each layer's running statistics (mean, var, num_batches_tracked)
// with the aggregator's for `group`: the latest, or those of the checkpoint
// at `checkpoint_step`. One call for all layers; on any error (NOT_FOUND
// for an unknown job or checkpoint, INVALID_ARGUMENT for a channel count
// that does not match a layer) no layer is changed.
absl::Status LoadRunningStats(
    Client& client, const std::string& job_id, int group,
    absl::Span<SyncBatchNorm* const> layers,
    std::optional<int64_t> checkpoint_step = std::nullopt);

// LoadRunningStats once the aggregator's statistics hold every step the
// layers have run: waits (at most `timeout`, default the client's
// rpc_timeout) until the job's committed step reaches the highest step any
// of the layers ran (step() - 1), then loads them. For a stale-synchronous
// job (staleness > 0), whose layers do not mirror the statistics
// (SyncBatchNorm::running_stats_behind): call it before eval or a
// checkpoint of the model; it waits for the slowest member to finish this
// worker's steps (at most staleness steps behind). Layers that have run no
// step load at once. DEADLINE_EXCEEDED naming the committed step when it
// is not reached in time; on any error no layer is changed.
absl::Status AwaitRunningStats(
    Client& client, const std::string& job_id, int group,
    absl::Span<SyncBatchNorm* const> layers,
    std::optional<absl::Duration> timeout = std::nullopt);

// Rolls the job back to its checkpoint at `step` (RestoreCheckpoint), loads
// the checkpoint's statistics into the layers and sets their next step to
// step + 1, so training resumes where the trainer's own step-`step`
// checkpoint left off. Call it from one worker before any resumes (a
// restore fails the rounds waiting at that moment); the others call
// LoadRunningStats(..., step) and set_step(step + 1) on their layers.
absl::Status ResumeFromCheckpoint(Client& client, const std::string& job_id,
                                  int group,
                                  absl::Span<SyncBatchNorm* const> layers,
                                  int64_t step);

// Makes `rank` a member of an elastic job and readies its layers to train
// from there: joins it at the job's next step (UpdateMembership; nothing
// is sent when it is a member already, as on a retry), waits until every
// step before its first is committed (at most `timeout`, default the
// client's rpc_timeout), loads the running statistics of its group into
// the layers and sets their next step to its first step, which it
// returns. The rank's first step is that of the change that made it a
// member (MemberSince in job_membership.h). DEADLINE_EXCEEDED when the
// steps before it are not committed in time (the members have not run
// them yet); the call's status otherwise. On error no layer is changed.
absl::StatusOr<int64_t> JoinJob(
    Client& client, const std::string& job_id, int rank,
    absl::Span<SyncBatchNorm* const> layers,
    std::optional<absl::Duration> timeout = std::nullopt);

// Takes `rank` out of the job gracefully after the rounds its layers have
// run: it leaves from the highest next step of the layers (it must have
// run every layer of the steps before it). Returns the job with its new
// membership; UpdateMembership's status on failure.
absl::StatusOr<v1::JobInfo> LeaveJob(Client& client, const std::string& job_id,
                                     int rank,
                                     absl::Span<SyncBatchNorm* const> layers);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_RUNNING_STATS_H_
