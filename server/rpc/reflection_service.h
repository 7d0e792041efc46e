// Server reflection (grpc.reflection.v1alpha), what generic clients (buf
// curl, grpcurl) use to list and describe the server's services.
#ifndef SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_
#define SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/server_context.h"
#include "server/rpc/async_call.h"
#include "server/rpc/rpc_loop.h"

namespace syncnorm {

// Answers from the generated descriptor pool (what the binary links), on
// the server's RpcLoop like its other services: no thread is held per
// call, and every call is counted as it arrives (see ConnectionGuard).
// gRPC's own reflection plugin is a sync-API service, which would start
// threads that poll beside the loop's. Answers each request in order with
// one response; a file comes with the files it imports, each sent once per
// stream. Thread-safe.
class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::AsyncService {
 public:
  // `services`: the fully-qualified names that list_services answers.
  explicit ReflectionService(std::vector<std::string> services);
  ~ReflectionService() override;

  // Posts the request for the first call on `loop`, which must outlive the
  // calls.
  void Listen(RpcLoop* loop);

 private:
  class Reactor;
  using Call = BidiCall<grpc::reflection::v1alpha::ServerReflectionRequest,
                        grpc::reflection::v1alpha::ServerReflectionResponse>;
  const std::vector<std::string> services_;
  std::unique_ptr<Call::Method> method_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REFLECTION_SERVICE_H_
