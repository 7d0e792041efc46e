#include "tests/testing/health.h"

#include <chrono>
#include <vector>

#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace syncnorm::testing {

absl::StatusOr<int> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service) {
  // HealthCheckRequest { string service = 1; } (short names only).
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                                    request_buffer, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("bad response");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse { ServingStatus status = 1; }: 0x08 <varint>, or
  // nothing at all for UNKNOWN (0).
  if (bytes.empty()) return 0;
  if (bytes.size() < 2 || bytes[0] != 0x08) {
    return absl::InternalError("unexpected health response encoding");
  }
  return static_cast<int>(bytes[1]);
}

}  // namespace syncnorm::testing
