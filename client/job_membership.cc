#include "client/job_membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace syncnorm {
namespace {

bool Contains(const google::protobuf::RepeatedField<int32_t>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

}  // namespace

bool IsMember(const v1::JobInfo& job, int rank) {
  return Contains(job.membership().members(), rank);
}

absl::StatusOr<int64_t> MemberSince(const v1::JobInfo& job, int rank) {
  if (rank < 0 || rank >= job.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside job '", job.job_id(),
                     "' of world_size ", job.world_size()));
  }
  const v1::Membership& m = job.membership();
  if (!IsMember(job, rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " is not a member of job '", job.job_id(), "' (members ",
        absl::StrJoin(m.members(), ","), ", version ", m.version(),
        "): join it first (UpdateMembership)"));
  }
  // Walk back over the changes that keep the rank a member; the earliest
  // of them made it one.
  if (m.history_size() == 0) return 0;  // as created
  int first = m.history_size();
  while (first > 0 && Contains(m.history(first - 1).members(), rank)) --first;
  if (first == m.history_size()) {
    return absl::InternalError(absl::StrCat(
        "job '", job.job_id(), "': the latest membership change (version ",
        m.history(first - 1).version(), ") does not have rank ", rank,
        " that its members have"));
  }
  const v1::MembershipChange& since = m.history(first);
  if (first == 0 && !Contains(since.joined(), rank)) return 0;
  return since.step();
}

}  // namespace syncnorm
