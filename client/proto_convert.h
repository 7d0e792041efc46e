// The client's own conversions of wire messages, over wire/ (which holds
// those the server shares).
#ifndef SYNCNORM_CLIENT_PROTO_CONVERT_H_
#define SYNCNORM_CLIENT_PROTO_CONVERT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/forward_reply.h"
#include "grpcpp/support/status.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// A FORWARD contribution header without payload.
v1::Contribution MakeContribution(const std::string& job_id, int layer,
                                  int64_t step, int rank);

// A FORWARD round's result: global moments, version and missing ranks.
// REQUIRES: r.has_moments().
ForwardReply ForwardReplyFromProto(const v1::RoundResult& r);

absl::Status FromGrpcStatus(const grpc::Status& s);

// The result itself, or its in-band RoundError as a status
// (RoundErrorStatus: the message names the missing ranks, the reason rides
// along as the payload kRoundErrorReasonUrl).
absl::StatusOr<v1::RoundResult> RoundResultStatus(v1::RoundResult r);

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_PROTO_CONVERT_H_
