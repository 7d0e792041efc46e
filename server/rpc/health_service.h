// gRPC's standard health protocol (grpc.health.v1.Health), on the server's
// RpcLoop: what Kubernetes' gRPC probes, grpc-health-probe and gRPC's
// client-side health checking ask.
#ifndef SYNCNORM_SERVER_RPC_HEALTH_SERVICE_H_
#define SYNCNORM_SERVER_RPC_HEALTH_SERVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/rpc/async_call.h"
#include "server/rpc/rpc_loop.h"

namespace syncnorm {

// Serves what gRPC's default health service does, which is on the
// callback API (whose threads would poll beside the loop's): Check answers
// a known service's status (NOT_FOUND for another), Watch writes it at
// once and again on every change (SERVICE_UNKNOWN for an unknown service,
// until it becomes known) until the call ends. The known services are
// the server as a whole ("") and those named at construction, all
// NOT_SERVING until SetServing. Thread-safe.
class HealthService final : public grpc::health::v1::Health::AsyncService {
 public:
  explicit HealthService(std::vector<std::string> services);
  ~HealthService() override;

  // Posts a request for each method's first call on `loop`, which must
  // outlive the calls.
  void Listen(RpcLoop* loop);

  // Every known service SERVING, or NOT_SERVING.
  void SetServing(bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  // Shutdown: every service NOT_SERVING from now on (SetServing does
  // nothing more), and every Watch call ends (UNAVAILABLE) once that is
  // written, so that none holds the server's shutdown up.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Watcher;
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  using CheckCall = UnaryCall<grpc::health::v1::HealthCheckRequest,
                              grpc::health::v1::HealthCheckResponse>;

  void StartCheck(CheckCall* call) ABSL_LOCKS_EXCLUDED(mu_);
  Status StatusLocked(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Watch call starts (it is sent its status) / is over.
  void Enter(Watcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);
  void Leave(Watcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);

  RpcLoop* loop_ = nullptr;  // set by Listen
  std::unique_ptr<CheckCall::Method> check_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_HEALTH_SERVICE_H_
