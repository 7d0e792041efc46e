// Server reflection (grpc.reflection.v1alpha), what generic clients (buf
// curl, grpcurl) use to list and describe the server's services.
#ifndef SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_
#define SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_

#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace syncnorm {

// Answers from the generated descriptor pool (what the binary links) on
// gRPC's callback API, like the server's other services: no thread is held
// per call, and every call is counted as it arrives (see ConnectionGuard).
// gRPC's own reflection plugin is a sync-API service, which its metrics
// interceptor could not ask about cancellation and whose waiting calls
// nothing counted. Answers each request in order with one response; a file
// comes with the files it imports, each sent once per stream. Thread-safe.
class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::CallbackService {
 public:
  // `services`: the fully-qualified names that list_services answers.
  explicit ReflectionService(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::ServerBidiReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                          grpc::reflection::v1alpha::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  class Reactor;
  const std::vector<std::string> services_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_
