// The groups of a job as the aggregator forms them: consecutive blocks of
// group_size ranks, or explicit rank lists (JobInfo.groups).
#ifndef SYNCNORM_CLIENT_JOB_GROUPS_H_
#define SYNCNORM_CLIENT_JOB_GROUPS_H_

#include "absl/status/statusor.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// How many groups the job has (each keeps its own running statistics).
int NumGroups(const v1::JobInfo& job);

// The group of `rank` (the `group` of GetRunningStats and LoadRunningStats);
// INVALID_ARGUMENT when the rank is outside the job's world or in no group.
absl::StatusOr<int> GroupOf(const v1::JobInfo& job, int rank);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_JOB_GROUPS_H_
