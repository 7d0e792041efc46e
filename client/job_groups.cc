#include "client/job_groups.h"

#include "absl/strings/str_cat.h"

namespace syncnorm {

int NumGroups(const v1::JobInfo& job) {
  if (job.groups_size() > 0) return job.groups_size();
  return job.group_size() > 0 ? job.world_size() / job.group_size() : 1;
}

absl::StatusOr<int> GroupOf(const v1::JobInfo& job, int rank) {
  if (rank < 0 || rank >= job.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside job '", job.job_id(),
                     "' of world_size ", job.world_size()));
  }
  if (job.groups_size() == 0) {
    return job.group_size() > 0 ? rank / job.group_size() : 0;
  }
  for (int g = 0; g < job.groups_size(); ++g) {
    for (int r : job.groups(g).ranks()) {
      if (r == rank) return g;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", rank, " is in no group of job '", job.job_id(), "'"));
}

}  // namespace syncnorm
