#include "client/job_membership.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace syncnorm {

RankSet RanksOf(const google::protobuf::RepeatedField<int32_t>& list,
                const google::protobuf::RepeatedField<int32_t>& runs) {
  if (!runs.empty()) {
    absl::StatusOr<RankSet> set =
        RankSet::FromFlatRuns(absl::MakeConstSpan(runs.data(), runs.size()),
                              std::numeric_limits<int32_t>::max());
    if (set.ok()) return *std::move(set);
  }
  std::vector<int> ranks(list.begin(), list.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return RankSet::Of(ranks);
}

RankSet Members(const v1::Membership& m) {
  return RanksOf(m.members(), m.member_runs());
}
RankSet Members(const v1::MembershipChange& c) {
  return RanksOf(c.members(), c.member_runs());
}
RankSet Joined(const v1::MembershipChange& c) {
  return RanksOf(c.joined(), c.joined_runs());
}
RankSet Left(const v1::MembershipChange& c) {
  return RanksOf(c.left(), c.left_runs());
}
RankSet Removed(const v1::MembershipChange& c) {
  return RanksOf(c.removed(), c.removed_runs());
}

bool IsMember(const v1::JobInfo& job, int rank) {
  return Members(job.membership()).contains(rank);
}

absl::StatusOr<int64_t> MemberSince(const v1::JobInfo& job, int rank) {
  if (rank < 0 || rank >= job.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside job '", job.job_id(),
                     "' of world_size ", job.world_size()));
  }
  const v1::Membership& m = job.membership();
  if (!IsMember(job, rank)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is not a member of job '", job.job_id(),
                     "' (members ", RankList(Members(m)), ", version ",
                     m.version(), "): join it first (UpdateMembership)"));
  }
  // Walk back over the changes that keep the rank a member; the earliest
  // of them made it one.
  if (m.history_size() == 0) return 0;  // as created
  int first = m.history_size();
  while (first > 0 && Members(m.history(first - 1)).contains(rank)) --first;
  if (first == m.history_size()) {
    return absl::InternalError(absl::StrCat(
        "job '", job.job_id(), "': the latest membership change (version ",
        m.history(first - 1).version(), ") does not have rank ", rank,
        " that its members have"));
  }
  const v1::MembershipChange& since = m.history(first);
  if (first == 0 && !Joined(since).contains(rank)) return 0;
  return since.step();
}

}  // namespace syncnorm
