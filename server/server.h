// The aggregator server: the Aggregator behind the gRPC service, plus health
// checking and reflection.
#ifndef SYNCNORM_SERVER_SERVER_H_
#define SYNCNORM_SERVER_SERVER_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/domain/aggregator.h"
#include "server/domain/clock.h"
#include "server/domain/round_observer.h"
#include "server/memory_trimmer.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/connection_guard.h"
#include "server/rpc/guard_interceptor.h"
#include "server/rpc/health_service.h"
#include "server/rpc/read_flood.h"
#include "server/rpc/reflection_service.h"
#include "server/rpc/rpc_loop.h"
#include "server/rpc/service.h"
#include "server/rpc/socket_closer.h"
#include "server/server_options.h"
#include "server/store/backup_root.h"
#include "server/store/state_store.h"

namespace syncnorm {

// Owns the clock, the state store, the Aggregator and the gRPC server.
// Start() once, then Shutdown() (from any thread) and Wait(). Thread-safe.
class Server {
 public:
  explicit Server(ServerOptions options);
  // Shuts down (no grace) if still running.
  ~Server();

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Opens the state store in options.data_dir and loads it (and the backup
  // folder, options.backup_dir, creating it if missing), then binds
  // options.listen and starts serving Aggregator, grpc.health.v1.Health
  // (SERVING) and reflection. INVALID_ARGUMENT for bad options, the store's
  // error when data_dir cannot be opened or holds corrupt state (naming the
  // folder and what to do), UNAVAILABLE when the address cannot be bound,
  // FAILED_PRECONDITION when called twice.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);

  // The bound port (useful with port 0); 0 before Start().
  int bound_port() const ABSL_LOCKS_EXCLUDED(mu_);
  // The bound port of options.metrics_listen; 0 without metrics.
  int metrics_port() const ABSL_LOCKS_EXCLUDED(mu_);

  // Marks health NOT_SERVING and refuses new rounds (UNAVAILABLE, "shutting
  // down"), while contributions to rounds in flight are still taken; waits
  // up to `grace` for those rounds to finish, then ends the Reduce streams
  // (UNAVAILABLE) once their answers are written, stops accepting calls,
  // and cancels what is still running when the grace is over. Blocks until
  // then. Idempotent; no-op before Start().
  void Shutdown(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the server has shut down; returns at once if never started.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Constant after construction.
  const ServerOptions options_;
  const std::unique_ptr<Clock> clock_;

  mutable absl::Mutex mu_;
  // Made by Start(). Declared before the gRPC server so that they outlive
  // it: the aggregator's destructor answers any round still waiting, and
  // the store outlives the aggregator.
  std::unique_ptr<StateStore> store_ ABSL_GUARDED_BY(mu_);
  // With options.backup_dir; reads the store, serves the service.
  std::unique_ptr<BackupRoot> backups_ ABSL_GUARDED_BY(mu_);
  // With options.metrics_listen; it watches the aggregator's rounds and the
  // gRPC server's calls, so it outlives both.
  std::unique_ptr<Metrics> metrics_ ABSL_GUARDED_BY(mu_);
  // The log lines of rounds, and what the aggregator tells of its rounds
  // (the log and the metrics); they outlive the aggregator.
  std::unique_ptr<LoggingRoundObserver> log_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FanoutRoundObserver> observers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Aggregator> aggregator_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Authenticator> auth_ ABSL_GUARDED_BY(mu_);
  // Told of each connection closed (below), so it outlives the closer.
  std::unique_ptr<MemoryTrimmer> trimmer_ ABSL_GUARDED_BY(mu_);
  // Closes the connections of abusive clients; they outlive the gRPC
  // server, whose calls report to them.
  std::unique_ptr<SocketCloser> closer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ConnectionGuard> guard_ ABSL_GUARDED_BY(mu_);
  // Closes the connection a too long pass of the loop's thread reads.
  std::unique_ptr<ReadFloodBreaker> read_flood_ ABSL_GUARDED_BY(mu_);
  // The guard's observers of the calls its interceptors skip (Reduce).
  std::unique_ptr<GuardInterceptorFactory> guard_calls_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AggregatorService> service_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ReflectionService> reflection_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HealthService> health_ ABSL_GUARDED_BY(mu_);
  // Serves every call; stopped once server_ is shut down, which ends them.
  std::unique_ptr<RpcLoop> loop_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  int bound_port_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_SERVER_H_
