#include "client/client.h"

#include <chrono>

#include "client/proto_convert.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace syncnorm {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options) {
  grpc::ChannelArguments args;
  // Notice a dead server within seconds on an otherwise idle stream.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a server restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  return grpc::CreateCustomChannel(
      options.address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

Client::Client(const ClientOptions& options)
    : options_(options),
      channel_(MakeChannel(options)),
      stub_(v1::Aggregator::NewStub(channel_)) {}

template <typename Request, typename Response, typename Call>
absl::StatusOr<Response> Client::Unary(const Request& request, Call call,
                                       absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(timeout));
  Response response;
  grpc::Status status = (stub_.get()->*call)(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::JobInfo> Client::CreateJob(
    const v1::CreateJobRequest& request) {
  return Unary<v1::CreateJobRequest, v1::JobInfo>(
      request, &v1::Aggregator::Stub::CreateJob);
}

absl::StatusOr<v1::JobInfo> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::GetJobRequest, v1::JobInfo>(request,
                                               &v1::Aggregator::Stub::GetJob);
}

absl::Status Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::DeleteJobRequest, v1::DeleteJobResponse>(
             request, &v1::Aggregator::Stub::DeleteJob)
      .status();
}

absl::StatusOr<v1::RunningStats> Client::GetRunningStats(
    const v1::GetRunningStatsRequest& request) {
  return Unary<v1::GetRunningStatsRequest, v1::RunningStats>(
      request, &v1::Aggregator::Stub::GetRunningStats);
}

absl::StatusOr<std::vector<v1::JobInfo>> Client::ListJobs() {
  absl::StatusOr<v1::ListJobsResponse> r =
      Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
          v1::ListJobsRequest(), &v1::Aggregator::Stub::ListJobs);
  if (!r.ok()) return r.status();
  return std::vector<v1::JobInfo>(r->jobs().begin(), r->jobs().end());
}

absl::StatusOr<v1::CheckpointInfo> Client::Checkpoint(
    const std::string& job_id, int64_t step, const std::string& tag,
    std::optional<absl::Duration> timeout) {
  v1::CheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_tag(tag);
  return Unary<v1::CheckpointRequest, v1::CheckpointInfo>(
      request, &v1::Aggregator::Stub::Checkpoint,
      timeout.value_or(options_.rpc_timeout));
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> Client::ListCheckpoints(
    const std::string& job_id) {
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::ListCheckpointsResponse> r =
      Unary<v1::ListCheckpointsRequest, v1::ListCheckpointsResponse>(
          request, &v1::Aggregator::Stub::ListCheckpoints);
  if (!r.ok()) return r.status();
  return std::vector<v1::CheckpointInfo>(r->checkpoints().begin(),
                                         r->checkpoints().end());
}

absl::StatusOr<v1::JobInfo> Client::RestoreCheckpoint(const std::string& job_id,
                                                      int64_t step) {
  v1::RestoreCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  return Unary<v1::RestoreCheckpointRequest, v1::JobInfo>(
      request, &v1::Aggregator::Stub::RestoreCheckpoint);
}

absl::StatusOr<v1::RunningStats> Client::SetRunningStats(
    const v1::SetRunningStatsRequest& request) {
  return Unary<v1::SetRunningStatsRequest, v1::RunningStats>(
      request, &v1::Aggregator::Stub::SetRunningStats);
}

std::unique_ptr<Contributor> Client::NewContributor(const std::string& job_id,
                                                    int rank) const {
  return std::make_unique<Contributor>(channel_, job_id, rank, options_);
}

}  // namespace syncnorm
