// The one mapping from the domain's absl::Status to gRPC's status.
#ifndef SYNCNORM_SERVER_RPC_GRPC_STATUS_H_
#define SYNCNORM_SERVER_RPC_GRPC_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace syncnorm {

// The longest message an error carries; a longer one is cut
// (BoundedText). With the details that repeat it (base64 in the
// grpc-status-details-bin trailer, 4/3 as large) an error's metadata stays
// well inside gRPC's default 8 KiB limit on what a client receives.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

// Same code (absl and gRPC share the canonical code numbers) and message,
// at most kMaxStatusMessageBytes of it. An error also carries them as a
// google.rpc.Status in its details (the grpc-status-details-bin trailer of
// gRPC's rich error model): gRPC's own errors (a connection that broke under a
// call, an unreachable server) never have details, so a client can tell an
// answer of the server from a failure to reach it, whatever the code
// (client/client_calls.cc).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_GRPC_STATUS_H_
