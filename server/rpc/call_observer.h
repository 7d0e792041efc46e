// What watches the server's calls (the connection guard, the gRPC metrics)
// hears of most calls from gRPC's interceptors. With any interceptor
// installed, gRPC runs its interception path on every batch of a call, which
// cost the Reduce stream's lock-step rounds 7% of their throughput
// (bench/RESULTS.md). So the interceptors' factories skip the calls of
// kSelfReportingMethod, and those calls report themselves through these.
#ifndef SYNCNORM_SERVER_RPC_CALL_OBSERVER_H_
#define SYNCNORM_SERVER_RPC_CALL_OBSERVER_H_

#include <memory>

#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/rpc/call_outcome.h"

namespace syncnorm {

// The method whose calls report themselves (ReduceReactor).
inline constexpr absl::string_view kSelfReportingMethod =
    "/syncnorm.v1.Aggregator/Reduce";

// Whether the call of `info` reports itself (its interceptors skip it).
inline bool IsSelfReporting(const grpc::experimental::ServerRpcInfo& info) {
  const char* method = info.method();
  return method != nullptr && method == kSelfReportingMethod;
}

// One call's observer. Thread-safe: messages of one call may be reported
// from several threads at once.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  virtual void MessageReceived() {}
  virtual void MessageSent() {}
  // The call is over, with CallOutcome's reading of how. Called once.
  virtual void Ended(const CallOutcome::Result& result) = 0;
};

// Starts an observer for each call that reports itself. Thread-safe.
class CallObserverFactory {
 public:
  virtual ~CallObserverFactory() = default;
  // `method` is "/package.Service/Method"; `context` is the call's.
  virtual std::unique_ptr<CallObserver> CallStarted(
      const grpc::ServerContextBase& context, absl::string_view method,
      grpc::experimental::ServerRpcInfo::Type type) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_CALL_OBSERVER_H_
