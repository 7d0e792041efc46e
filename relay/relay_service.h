// syncnorm.v1.Aggregator as a relay serves it: rounds (Reduce, ReduceOnce)
// go to the Relay; every other method is UNIMPLEMENTED, naming where to
// send it.
#ifndef SYNCNORM_RELAY_RELAY_SERVICE_H_
#define SYNCNORM_RELAY_RELAY_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "relay/relay.h"
#include "server/rpc/auth.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

namespace relay_service_internal {

// The generated service's callback methods, with Reduce raw: its stream
// reads and writes bytes, so that a block's answer, serialized once, goes
// to each of its ranks as the same bytes. (CallbackService, with Reduce's
// typed method swapped for the raw one.)
using A = v1::Aggregator;
using S0 = A::WithCallbackMethod_GetStatsHealth<A::Service>;
using S1 = A::WithCallbackMethod_UpdateMembership<S0>;
using S2 = A::WithCallbackMethod_RestoreBackup<S1>;
using S3 = A::WithCallbackMethod_ListBackups<S2>;
using S4 = A::WithCallbackMethod_Backup<S3>;
using S5 = A::WithCallbackMethod_SetRunningStats<S4>;
using S6 = A::WithCallbackMethod_ListJobs<S5>;
using S7 = A::WithCallbackMethod_RestoreCheckpoint<S6>;
using S8 = A::WithCallbackMethod_ListCheckpoints<S7>;
using S9 = A::WithCallbackMethod_Checkpoint<S8>;
using S10 = A::WithCallbackMethod_GetRunningStats<S9>;
using S11 = A::WithCallbackMethod_ReduceOnce<S10>;
using S12 = A::WithRawCallbackMethod_Reduce<S11>;
using S13 = A::WithCallbackMethod_DeleteJob<S12>;
using S14 = A::WithCallbackMethod_GetJob<S13>;
using Base = A::WithCallbackMethod_CreateJob<S14>;

}  // namespace relay_service_internal

// On gRPC's callback API: a Reduce stream's answers go out one write at a
// time, in the order its rounds answer. Thread-safe.
class RelayService final : public relay_service_internal::Base {
 public:
  // `relay` and `auth` (null: no token check) outlive the service.
  RelayService(Relay& relay, const Authenticator* auth)
      : relay_(relay), auth_(auth) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Reduce(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ReduceOnce(grpc::CallbackServerContext* context,
                                       const v1::Contribution* request,
                                       v1::RoundResult* response) override;

  // Not a relay's: UNIMPLEMENTED.
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const v1::CreateJobRequest*,
                                      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest*,
                                   v1::JobInfo*) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest*,
                                      v1::DeleteJobResponse*) override;
  grpc::ServerUnaryReactor* GetRunningStats(
      grpc::CallbackServerContext* context, const v1::GetRunningStatsRequest*,
      v1::RunningStats*) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const v1::CheckpointRequest*,
                                       v1::CheckpointInfo*) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest*,
      v1::ListCheckpointsResponse*) override;
  grpc::ServerUnaryReactor* RestoreCheckpoint(
      grpc::CallbackServerContext* context, const v1::RestoreCheckpointRequest*,
      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest*,
                                     v1::ListJobsResponse*) override;
  grpc::ServerUnaryReactor* SetRunningStats(
      grpc::CallbackServerContext* context, const v1::SetRunningStatsRequest*,
      v1::RunningStats*) override;
  grpc::ServerUnaryReactor* Backup(grpc::CallbackServerContext* context,
                                   const v1::BackupRequest*,
                                   v1::BackupInfo*) override;
  grpc::ServerUnaryReactor* ListBackups(grpc::CallbackServerContext* context,
                                        const v1::ListBackupsRequest*,
                                        v1::ListBackupsResponse*) override;
  grpc::ServerUnaryReactor* RestoreBackup(grpc::CallbackServerContext* context,
                                          const v1::RestoreBackupRequest*,
                                          v1::RestoreBackupResponse*) override;
  grpc::ServerUnaryReactor* UpdateMembership(
      grpc::CallbackServerContext* context, const v1::UpdateMembershipRequest*,
      v1::JobInfo*) override;
  grpc::ServerUnaryReactor* GetStatsHealth(grpc::CallbackServerContext* context,
                                           const v1::GetStatsHealthRequest*,
                                           v1::StatsHealth*) override;

 private:
  Relay& relay_;
  const Authenticator* const auth_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_RELAY_SERVICE_H_
