// The one mapping from the domain's absl::Status to gRPC's status.
#ifndef SYNCNORM_SERVER_RPC_GRPC_STATUS_H_
#define SYNCNORM_SERVER_RPC_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace syncnorm {

// Same code (absl and gRPC share the canonical code numbers) and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_GRPC_STATUS_H_
