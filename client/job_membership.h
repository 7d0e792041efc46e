// A job's membership (JobInfo.membership): which ranks contribute from
// which step, as the aggregator reports it (see UpdateMembership in
// aggregator.proto).
#ifndef SYNCNORM_CLIENT_JOB_MEMBERSHIP_H_
#define SYNCNORM_CLIENT_JOB_MEMBERSHIP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "syncnorm/v1/aggregator.pb.h"
#include "wire/rank_set.h"

namespace syncnorm {

// One set of ranks of a Membership answer: its runs (`member_runs` and the
// like), or its rank list from a server that predates runs.
RankSet RanksOf(const google::protobuf::RepeatedField<int32_t>& list,
                const google::protobuf::RepeatedField<int32_t>& runs);

// The latest members, and a change's sets, each by RanksOf.
RankSet Members(const v1::Membership& m);
RankSet Members(const v1::MembershipChange& c);
RankSet Joined(const v1::MembershipChange& c);
RankSet Left(const v1::MembershipChange& c);
RankSet Removed(const v1::MembershipChange& c);

// Whether `rank` is among the job's latest members (those from the latest
// change's step on).
bool IsMember(const v1::JobInfo& job, int rank);

// The first step `rank` contributes to in its current time as a member:
// the step of the change that made it a member (joined, or back by a
// restore) and that no later change undid; 0 for a rank that has been a
// member since the oldest change the job keeps (which stands for every
// step before it) without joining there. A rank that joins starts its
// layers' step counters here (SyncBatchNorm::set_step). FAILED_PRECONDITION
// when `rank` is not among the latest members; INVALID_ARGUMENT when it is
// outside the job's world.
absl::StatusOr<int64_t> MemberSince(const v1::JobInfo& job, int rank);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_JOB_MEMBERSHIP_H_
