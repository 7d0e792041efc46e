// The gRPC face of the Aggregator: syncnorm.v1.Aggregator on the
// asynchronous API, served by an RpcLoop. Translates protos to domain calls
// and back, nothing more.
#ifndef SYNCNORM_SERVER_RPC_SERVICE_H_
#define SYNCNORM_SERVER_RPC_SERVICE_H_

#include <memory>
#include <vector>

#include "grpcpp/server_context.h"
#include "server/domain/aggregator.h"
#include "server/domain/clock.h"
#include "server/domain/limits.h"
#include "server/rpc/async_call.h"
#include "server/rpc/auth.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/rpc_loop.h"
#include "server/rpc/stream_set.h"
#include "server/rpc/waiting_calls.h"
#include "server/store/backup_root.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

struct ServiceOptions {
  // Checks every call's bearer token; null: no authentication. Job-scoped
  // calls need a token for that job (or admin); ListJobs needs admin; the
  // Reduce stream checks each contribution (refusals in-band). Must outlive
  // the service.
  const Authenticator* auth = nullptr;
  // Open Reduce streams at most (--max_streams); <= 0: no limit.
  int max_streams = 0;
  // ReduceOnce and Checkpoint calls the server holds at most, from their
  // start until both gRPC and the aggregator are done with them (a
  // cancelled call's contribution or pending checkpoint is held until its
  // round or deadline ends) (--max_waiting_calls); one more is refused at
  // once, before the aggregator sees it. <= 0: no limit.
  int max_waiting_calls = 0;
  // Largest request message, each message of a stream included, by its
  // serialized size (--max_message_bytes); <= 0: no limit.
  int64_t max_message_bytes = 0;
  // Where Backup writes and RestoreBackup reads (--backup_dir); null: those
  // calls are FAILED_PRECONDITION. Must outlive the service.
  BackupRoot* backups = nullptr;
  // A Reduce stream that reads, answers and writes nothing for this long
  // ends UNAVAILABLE (--stream_idle_timeout_ms); <= 0: never.
  absl::Duration stream_idle_timeout = absl::ZeroDuration();
  // Tells the streams' idle time; null: the wall clock. Must outlive the
  // service.
  const Clock* clock = nullptr;
  // What observes the calls of kSelfReportingMethod (Reduce), which gRPC's
  // interceptors skip (call_observer.h): the connection guard, the
  // metrics. Each must outlive the service's calls.
  std::vector<CallObserverFactory*> call_observers;
};

// Every call is served by an RpcLoop: Reduce, ReduceOnce and Checkpoint on
// its thread (a call that waits holds no thread), the other calls on its
// workers, which may block on the state store. Listen() once the server is
// built. Thread-safe.
// Reduce is raw: its streams carry serialized messages (ReduceReactor).
class AggregatorService final : public v1::Aggregator::WithRawMethod_Reduce<
                                    v1::Aggregator::AsyncService> {
 public:
  // `aggregator` must outlive the service and every call it serves.
  explicit AggregatorService(Aggregator* aggregator,
                             ServiceOptions options = {});
  ~AggregatorService() override;

  // Posts a request for each method's first call on `loop`, which must
  // outlive the calls (grpc::Server::Shutdown ends them).
  void Listen(RpcLoop* loop);

  // Shutdown: ends every Reduce stream (UNAVAILABLE) once it has answered
  // what it read, and refuses new ones.
  void CloseStreams() { streams_.CloseAll(); }
  int open_streams() const { return streams_.size(); }
  // ReduceOnce and Checkpoint calls held now (--max_waiting_calls).
  int waiting_calls() const { return waiting_->size(); }

 private:
  struct Methods;

  // The calls. The unary ones fill `response` when they return OK.
  void StartReduce(BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>* call);
  void StartReduceOnce(UnaryCall<v1::Contribution, v1::RoundResult>* call);
  void StartCheckpoint(
      UnaryCall<v1::CheckpointRequest, v1::CheckpointInfo>* call);
  absl::Status ServeCreateJob(const grpc::ServerContextBase& context,
                              const v1::CreateJobRequest& request,
                              v1::JobInfo& response);
  absl::Status ServeGetJob(const grpc::ServerContextBase& context,
                           const v1::GetJobRequest& request,
                           v1::JobInfo& response);
  absl::Status ServeDeleteJob(const grpc::ServerContextBase& context,
                              const v1::DeleteJobRequest& request,
                              v1::DeleteJobResponse& response);
  absl::Status ServeGetRunningStats(const grpc::ServerContextBase& context,
                                    const v1::GetRunningStatsRequest& request,
                                    v1::RunningStats& response);
  absl::Status ServeListCheckpoints(const grpc::ServerContextBase& context,
                                    const v1::ListCheckpointsRequest& request,
                                    v1::ListCheckpointsResponse& response);
  absl::Status ServeUpdateMembership(const grpc::ServerContextBase& context,
                                     const v1::UpdateMembershipRequest& request,
                                     v1::JobInfo& response);
  absl::Status ServeRestoreCheckpoint(
      const grpc::ServerContextBase& context,
      const v1::RestoreCheckpointRequest& request, v1::JobInfo& response);
  absl::Status ServeListJobs(const grpc::ServerContextBase& context,
                             const v1::ListJobsRequest& request,
                             v1::ListJobsResponse& response);
  absl::Status ServeSetRunningStats(const grpc::ServerContextBase& context,
                                    const v1::SetRunningStatsRequest& request,
                                    v1::RunningStats& response);
  absl::Status ServeGetStatsHealth(const grpc::ServerContextBase& context,
                                   const v1::GetStatsHealthRequest& request,
                                   v1::StatsHealth& response);
  absl::Status ServeBackup(const grpc::ServerContextBase& context,
                           const v1::BackupRequest& request,
                           v1::BackupInfo& response);
  absl::Status ServeListBackups(const grpc::ServerContextBase& context,
                                const v1::ListBackupsRequest& request,
                                v1::ListBackupsResponse& response);
  absl::Status ServeRestoreBackup(const grpc::ServerContextBase& context,
                                  const v1::RestoreBackupRequest& request,
                                  v1::RestoreBackupResponse& response);

  // OK when the call may use `job_id`; UNAUTHENTICATED / PERMISSION_DENIED
  // otherwise. Always OK without an Authenticator.
  absl::Status AuthorizeJob(const grpc::ServerContextBase& context,
                            absl::string_view job_id) const;
  absl::Status AuthorizeAdmin(const grpc::ServerContextBase& context) const;

  // The admission of a call, before anything is done with its request: OK,
  // or the status the call is refused with. `what` names the request in
  // that status ("a GetJob request").
  //
  // A job's call: the request against --max_message_bytes, then
  // AuthorizeJob.
  absl::Status Admit(const grpc::ServerContextBase& context,
                     const google::protobuf::MessageLite& request,
                     absl::string_view what, absl::string_view job_id) const;
  // A server-wide call: the request against --max_message_bytes, then
  // AuthorizeAdmin.
  absl::Status AdmitAdmin(const grpc::ServerContextBase& context,
                          const google::protobuf::MessageLite& request,
                          absl::string_view what) const;
  // A backup call: AdmitAdmin, then FAILED_PRECONDITION without a backup
  // root.
  absl::Status AdmitBackupCall(const grpc::ServerContextBase& context,
                               const google::protobuf::MessageLite& request,
                               absl::string_view what) const;
  // A job's call that may wait (ReduceOnce, Checkpoint; `call` names it for
  // --max_waiting_calls): Admit, then WaitingCalls::Enter; once OK, its
  // reactor leaves waiting_.
  absl::Status AdmitWaitingCall(const grpc::ServerContextBase& context,
                                const google::protobuf::MessageLite& request,
                                absl::string_view what,
                                absl::string_view job_id,
                                absl::string_view call);

  // RestoreBackup once admitted: reads the backup's jobs and restores them;
  // fills `response` when OK.
  absl::Status RestoreBackupAdmitted(const v1::RestoreBackupRequest& request,
                                     v1::RestoreBackupResponse& response);

  Aggregator* const aggregator_;
  const Authenticator* const auth_;
  const int64_t max_message_bytes_;
  BackupRoot* const backups_;
  const std::vector<CallObserverFactory*> call_observers_;
  StreamSet streams_;
  // Shared with the reactors: a call leaves it when the aggregator has
  // answered it too, which may be after the service is gone (the
  // aggregator's destructor answers what still waits).
  const std::shared_ptr<WaitingCalls> waiting_;
  // Set by Listen: what each method's calls are started with.
  std::unique_ptr<Methods> methods_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_SERVICE_H_
