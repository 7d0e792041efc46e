// Conversions between the wire messages and the kernels' host types.
#ifndef SYNCNORM_CLIENT_PROTO_CONVERT_H_
#define SYNCNORM_CLIENT_PROTO_CONVERT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/contributor.h"
#include "grpcpp/support/status.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// A FORWARD contribution header without payload.
v1::Contribution MakeContribution(const std::string& job_id, int layer,
                                  int64_t step, int rank);

void ToProto(const Moments& m, v1::Moments* out);
// Sets (or clears) the contribution's momentum and imported_stats.
void ToProto(const RoundUpdate& u, v1::Contribution* out);
void ToProto(const GradSums& g, v1::GradSums* out);
GlobalMoments FromProto(const v1::GlobalMoments& m);
GradSums FromProto(const v1::GradSums& g);
// A FORWARD round's result: global moments, version and missing ranks.
// REQUIRES: r.has_moments().
ForwardReply ForwardReplyFromProto(const v1::RoundResult& r);

absl::Status FromGrpcStatus(const grpc::Status& s);

// The result itself, or its in-band RoundError as a status; the error's
// reason, if any, rides along as the status payload kRoundErrorReasonUrl.
absl::StatusOr<v1::RoundResult> RoundResultStatus(v1::RoundResult r);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_PROTO_CONVERT_H_
