#include "server/rpc/grpc_status.h"

#include <string>

namespace syncnorm {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // Both follow google.rpc.Code; anything outside it is UNKNOWN.
  const grpc::StatusCode grpc_code =
      code > 0 && code <= grpc::StatusCode::UNAUTHENTICATED
          ? static_cast<grpc::StatusCode>(code)
          : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

}  // namespace syncnorm
