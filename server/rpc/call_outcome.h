// How a server call ended, as far as the server can tell, from what gRPC's
// interception hooks show: the one reading that the metrics and the
// connection guard share.
#ifndef SYNCNORM_SERVER_RPC_CALL_OUTCOME_H_
#define SYNCNORM_SERVER_RPC_CALL_OUTCOME_H_

#include <chrono>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"

namespace syncnorm {

// The server context of every call the server serves (RpcLoop): each asks
// gRPC for a done tag (AsyncNotifyWhenDone), which makes IsCancelled()
// valid once the call is over, in its interceptors' POST_RECV_CLOSE hook
// too.
class LoopServerContext final : public grpc::ServerContext {};

// The outcome is the status the client got as far as the server can tell:
// the one the service sent, when it reached the client; for a call gRPC
// cut short (cancelled by the client, a broken connection, the transport's
// quota) DEADLINE_EXCEEDED if its deadline had passed (give or take
// kDeadlineSkew), else CANCELLED, never what the service may have sent
// meanwhile. gRPC tells whether a call was cut short only for callback-API
// calls and asynchronous-API calls with a done tag (LoopServerContext),
// which every call of the server is; a sync-API call would have the
// status its handler sent.
//
// An interceptor creates one per call and feeds it every batch, before
// Proceed(); a reactor that reports its own call (call_observer.h) creates
// one, notes each status it sends, and asks for the outcome in OnDone.
// Thread-safe: hooks of one call may run at once.
class CallOutcome {
 public:
  struct Result {
    grpc::StatusCode code;
    absl::Time end;  // when the status was sent; when it ended, if cut short
  };

  // A call the client cancelled this close to its deadline counts as past
  // it: the server's deadline is the client's plus the time the request took
  // to arrive (grpc-timeout is relative), so the client's cancellation at
  // its own deadline can reach the server a moment before the server's.
  static constexpr std::chrono::milliseconds kDeadlineSkew{250};

  explicit CallOutcome(grpc::experimental::ServerRpcInfo* info);
  // For a reactor's own call, a callback-API one or a LoopServerContext's.
  explicit CallOutcome(grpc::ServerContextBase* context);

  // The reactor sends this status (calls Finish).
  void StatusSent(grpc::StatusCode code) ABSL_LOCKS_EXCLUDED(mu_);
  // The outcome, from the reactor's OnDone (where gRPC knows whether the
  // call was cut short), at most once.
  std::optional<Result> Done() ABSL_LOCKS_EXCLUDED(mu_);

  // Notes what `methods` carries; the outcome when this batch ends the call
  // (POST_RECV_CLOSE), at most once.
  std::optional<Result> Observe(
      grpc::experimental::InterceptorBatchMethods* methods)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The outcome of a call that never reached its end (the server stopped
  // first): cut short. Nothing if it was given already.
  std::optional<Result> Abandon() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::optional<Result> Decide(bool cancelled) ABSL_LOCKS_EXCLUDED(mu_);

  // Valid until the interceptor that owns this is destroyed (the context
  // destroys its interceptors).
  grpc::ServerContextBase* const context_;
  // Only a callback-API call or one with a done tag may be asked
  // IsCancelled() in POST_RECV_CLOSE. For a sync-API call gRPC runs that
  // hook from inside its own check for cancellation, once the call's
  // completion queue is shut down; asking again re-enters the check, which
  // runs the hook again, without end.
  const bool knows_cancellation_;

  absl::Mutex mu_;
  std::optional<grpc::StatusCode> sent_code_ ABSL_GUARDED_BY(mu_);
  absl::Time sent_at_ ABSL_GUARDED_BY(mu_);
  bool decided_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_CALL_OUTCOME_H_
