#include "server/service.h"

#include <vector>

#include "absl/status/status.h"
#include "server/grpc_status.h"
#include "server/proto_convert.h"
#include "server/reduce_once_reactor.h"
#include "server/reduce_reactor.h"

namespace syncnorm {
namespace {

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status CheckpointsUnimplemented() {
  return absl::UnimplementedError("checkpoints arrive with the state store");
}

}  // namespace

grpc::ServerUnaryReactor* AggregatorService::CreateJob(
    grpc::CallbackServerContext* context, const v1::CreateJobRequest* request,
    v1::JobInfo* response) {
  absl::StatusOr<JobSnapshot> job =
      aggregator_->CreateJob(JobSpecFromProto(*request));
  if (job.ok()) JobInfoToProto(*job, *response);
  return FinishWith(context, job.status());
}

grpc::ServerUnaryReactor* AggregatorService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::JobInfo* response) {
  absl::StatusOr<JobSnapshot> job = aggregator_->GetJob(request->job_id());
  if (job.ok()) JobInfoToProto(*job, *response);
  return FinishWith(context, job.status());
}

grpc::ServerUnaryReactor* AggregatorService::DeleteJob(
    grpc::CallbackServerContext* context, const v1::DeleteJobRequest* request,
    v1::DeleteJobResponse* response) {
  return FinishWith(context, aggregator_->DeleteJob(request->job_id()));
}

grpc::ServerBidiReactor<v1::Contribution, v1::RoundResult>*
AggregatorService::Reduce(grpc::CallbackServerContext* context) {
  return new ReduceReactor(aggregator_);  // deletes itself
}

grpc::ServerUnaryReactor* AggregatorService::ReduceOnce(
    grpc::CallbackServerContext* context, const v1::Contribution* request,
    v1::RoundResult* response) {
  return new ReduceOnceReactor(aggregator_, *request, response);  // ditto
}

grpc::ServerUnaryReactor* AggregatorService::GetRunningStats(
    grpc::CallbackServerContext* context,
    const v1::GetRunningStatsRequest* request, v1::RunningStats* response) {
  if (request->checkpoint_step() != 0) {
    return FinishWith(context,
                      absl::UnimplementedError(
                          "GetRunningStats of a checkpoint (checkpoint_step "
                          "!= 0): checkpoints arrive with the state store"));
  }
  const std::vector<int> layers(request->layers().begin(),
                                request->layers().end());
  absl::StatusOr<RunningStatsSnapshot> stats =
      aggregator_->GetRunningStats(request->job_id(), layers, request->group());
  if (stats.ok()) RunningStatsToProto(*stats, *response);
  return FinishWith(context, stats.status());
}

grpc::ServerUnaryReactor* AggregatorService::Checkpoint(
    grpc::CallbackServerContext* context, const v1::CheckpointRequest* request,
    v1::CheckpointInfo* response) {
  return FinishWith(context, CheckpointsUnimplemented());
}

grpc::ServerUnaryReactor* AggregatorService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return FinishWith(context, CheckpointsUnimplemented());
}

grpc::ServerUnaryReactor* AggregatorService::RestoreCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::RestoreCheckpointRequest* request, v1::JobInfo* response) {
  return FinishWith(context, CheckpointsUnimplemented());
}

}  // namespace syncnorm
