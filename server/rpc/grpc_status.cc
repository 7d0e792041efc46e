#include "server/rpc/grpc_status.h"

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/domain/bounded_text.h"

namespace syncnorm {
namespace {

// google.rpc.Status { int32 code = 1; string message = 2; } on the wire.
std::string RpcStatusBytes(int code, const std::string& message) {
  using google::protobuf::internal::WireFormatLite;
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    WireFormatLite::WriteInt32(1, code, &coded);
    if (!message.empty()) WireFormatLite::WriteString(2, message, &coded);
  }
  return out;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // Both follow google.rpc.Code; anything outside it is UNKNOWN.
  const grpc::StatusCode grpc_code =
      code > 0 && code <= grpc::StatusCode::UNAUTHENTICATED
          ? static_cast<grpc::StatusCode>(code)
          : grpc::StatusCode::UNKNOWN;
  // The domain keeps its messages short (rank lists and client-chosen
  // names are bounded where they are written); this is the last guard.
  std::string message = BoundedText(status.message(), kMaxStatusMessageBytes);
  std::string details = RpcStatusBytes(grpc_code, message);
  return grpc::Status(grpc_code, std::move(message), std::move(details));
}

}  // namespace syncnorm
