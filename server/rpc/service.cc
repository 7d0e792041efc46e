#include "server/rpc/service.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/rpc/checkpoint_reactor.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/reduce_once_reactor.h"
#include "server/rpc/reduce_reactor.h"

namespace syncnorm {
namespace {

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Answers a unary call at once: with `admitted` when the call was refused
// (see AggregatorService::Admit), else with the status `serve` returns,
// which has filled the response when OK.
template <typename Serve>
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 absl::Status admitted, Serve serve) {
  return FinishWith(context, admitted.ok() ? serve() : admitted);
}

// The value of the call's `authorization` metadata; empty if none.
std::string AuthorizationOf(const grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

const Clock* OrWallClock(const Clock* clock) {
  static const RealClock* const kWallClock = new RealClock();
  return clock != nullptr ? clock : kWallClock;
}

}  // namespace

AggregatorService::AggregatorService(Aggregator* aggregator,
                                     ServiceOptions options)
    : aggregator_(aggregator),
      auth_(options.auth),
      max_message_bytes_(options.max_message_bytes),
      backups_(options.backups),
      call_observers_(std::move(options.call_observers)),
      streams_(options.max_streams, options.stream_idle_timeout,
               OrWallClock(options.clock)),
      waiting_(std::make_shared<WaitingCalls>(options.max_waiting_calls)) {}

absl::Status AggregatorService::AuthorizeJob(
    const grpc::CallbackServerContext* context,
    absl::string_view job_id) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->AuthorizeJob(AuthorizationOf(context), job_id);
}

absl::Status AggregatorService::Admit(
    const grpc::CallbackServerContext* context,
    const google::protobuf::MessageLite& request, absl::string_view what,
    absl::string_view job_id) const {
  // Before any work: the message was parsed, but nothing else is done with
  // a message over the limit.
  if (absl::Status s =
          CheckMessageSize(request.ByteSizeLong(), what, max_message_bytes_);
      !s.ok()) {
    return s;
  }
  return AuthorizeJob(context, job_id);
}

absl::Status AggregatorService::AuthorizeAdmin(
    const grpc::CallbackServerContext* context) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->AuthorizeAdmin(AuthorizationOf(context));
}

absl::Status AggregatorService::AdmitAdmin(
    const grpc::CallbackServerContext* context,
    const google::protobuf::MessageLite& request,
    absl::string_view what) const {
  if (absl::Status s =
          CheckMessageSize(request.ByteSizeLong(), what, max_message_bytes_);
      !s.ok()) {
    return s;
  }
  return AuthorizeAdmin(context);
}

absl::Status AggregatorService::AdmitWaitingCall(
    const grpc::CallbackServerContext* context,
    const google::protobuf::MessageLite& request, absl::string_view what,
    absl::string_view job_id, absl::string_view call) {
  if (absl::Status s = Admit(context, request, what, job_id); !s.ok()) {
    return s;
  }
  return waiting_->Enter(call);
}

grpc::ServerUnaryReactor* AggregatorService::CreateJob(
    grpc::CallbackServerContext* context, const v1::CreateJobRequest* request,
    v1::JobInfo* response) {
  return Answer(
      context,
      Admit(context, *request, "a CreateJob request", request->job_id()), [&] {
        absl::StatusOr<JobSnapshot> job =
            aggregator_->CreateJob(JobSpecFromProto(*request));
        if (job.ok()) JobInfoToProto(*job, *response);
        return job.status();
      });
}

grpc::ServerUnaryReactor* AggregatorService::GetJob(
    grpc::CallbackServerContext* context, const v1::GetJobRequest* request,
    v1::JobInfo* response) {
  return Answer(context,
                Admit(context, *request, "a GetJob request", request->job_id()),
                [&] {
                  absl::StatusOr<JobSnapshot> job =
                      aggregator_->GetJob(request->job_id());
                  if (job.ok()) JobInfoToProto(*job, *response);
                  return job.status();
                });
}

grpc::ServerUnaryReactor* AggregatorService::DeleteJob(
    grpc::CallbackServerContext* context, const v1::DeleteJobRequest* request,
    v1::DeleteJobResponse* response) {
  return Answer(
      context,
      Admit(context, *request, "a DeleteJob request", request->job_id()),
      [&] { return aggregator_->DeleteJob(request->job_id()); });
}

grpc::ServerBidiReactor<v1::Contribution, v1::RoundResult>*
AggregatorService::Reduce(grpc::CallbackServerContext* context) {
  // Reported here, not by interceptors (call_observer.h).
  std::vector<std::unique_ptr<CallObserver>> observers;
  observers.reserve(call_observers_.size());
  for (CallObserverFactory* f : call_observers_) {
    observers.push_back(f->CallStarted(
        *context, kSelfReportingMethod,
        grpc::experimental::ServerRpcInfo::Type::BIDI_STREAMING));
  }
  return new ReduceReactor(aggregator_, auth_,
                           auth_ != nullptr ? AuthorizationOf(context) : "",
                           &streams_, max_message_bytes_, context,
                           std::move(observers));  // deletes itself
}

grpc::ServerUnaryReactor* AggregatorService::ReduceOnce(
    grpc::CallbackServerContext* context, const v1::Contribution* request,
    v1::RoundResult* response) {
  // Refused before the aggregator sees the contribution: nothing of it is
  // kept.
  if (absl::Status denied =
          AdmitWaitingCall(context, *request, "a ReduceOnce request",
                           request->job_id(), "a new ReduceOnce call");
      !denied.ok()) {
    return FinishWith(context, denied);
  }
  return new ReduceOnceReactor(aggregator_, *request, response,
                               waiting_);  // ditto
}

grpc::ServerUnaryReactor* AggregatorService::GetRunningStats(
    grpc::CallbackServerContext* context,
    const v1::GetRunningStatsRequest* request, v1::RunningStats* response) {
  return Answer(
      context,
      Admit(context, *request, "a GetRunningStats request", request->job_id()),
      [&] {
        const std::vector<int> layers(request->layers().begin(),
                                      request->layers().end());
        std::optional<int64_t> checkpoint;
        if (request->checkpoint_step() != 0 || request->use_checkpoint()) {
          checkpoint = request->checkpoint_step();
        }
        absl::StatusOr<RunningStatsSnapshot> stats =
            aggregator_->GetRunningStats(request->job_id(), layers,
                                         request->group(), checkpoint);
        if (stats.ok()) RunningStatsToProto(*stats, *response);
        return stats.status();
      });
}

grpc::ServerUnaryReactor* AggregatorService::SetRunningStats(
    grpc::CallbackServerContext* context,
    const v1::SetRunningStatsRequest* request, v1::RunningStats* response) {
  return Answer(
      context,
      Admit(context, *request, "a SetRunningStats request", request->job_id()),
      [&] {
        absl::StatusOr<std::vector<LayerStatsSnapshot>> set =
            aggregator_->SetRunningStats(request->job_id(),
                                         LayerStatsFromProto(*request));
        if (!set.ok()) return set.status();
        absl::StatusOr<JobSnapshot> job =
            aggregator_->GetJob(request->job_id());
        response->set_job_id(request->job_id());
        response->set_step(job.ok() ? job->committed_step : -1);
        for (const LayerStatsSnapshot& l : *set) {
          LayerStatsToProto(l, *response->add_layers());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AggregatorService::ListJobs(
    grpc::CallbackServerContext* context, const v1::ListJobsRequest* request,
    v1::ListJobsResponse* response) {
  return Answer(context, AdmitAdmin(context, *request, "a ListJobs request"),
                [&] {
                  for (const JobSnapshot& job : aggregator_->ListJobs()) {
                    JobInfoToProto(job, *response->add_jobs());
                  }
                  return absl::OkStatus();
                });
}

grpc::ServerUnaryReactor* AggregatorService::Checkpoint(
    grpc::CallbackServerContext* context, const v1::CheckpointRequest* request,
    v1::CheckpointInfo* response) {
  if (absl::Status denied =
          AdmitWaitingCall(context, *request, "a Checkpoint request",
                           request->job_id(), "a new Checkpoint call");
      !denied.ok()) {
    return FinishWith(context, denied);
  }
  return new CheckpointReactor(aggregator_, context, *request, response,
                               waiting_);  // deletes itself
}

grpc::ServerUnaryReactor* AggregatorService::ListCheckpoints(
    grpc::CallbackServerContext* context,
    const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return Answer(
      context,
      Admit(context, *request, "a ListCheckpoints request", request->job_id()),
      [&] {
        absl::StatusOr<std::vector<CheckpointMeta>> list =
            aggregator_->ListCheckpoints(request->job_id());
        if (!list.ok()) return list.status();
        for (const CheckpointMeta& meta : *list) {
          CheckpointToProto(meta, *response->add_checkpoints());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AggregatorService::RestoreCheckpoint(
    grpc::CallbackServerContext* context,
    const v1::RestoreCheckpointRequest* request, v1::JobInfo* response) {
  return Answer(context,
                Admit(context, *request, "a RestoreCheckpoint request",
                      request->job_id()),
                [&] {
                  absl::StatusOr<JobSnapshot> job =
                      aggregator_->RestoreCheckpoint(request->job_id(),
                                                     request->step());
                  if (job.ok()) JobInfoToProto(*job, *response);
                  return job.status();
                });
}

grpc::ServerUnaryReactor* AggregatorService::UpdateMembership(
    grpc::CallbackServerContext* context,
    const v1::UpdateMembershipRequest* request, v1::JobInfo* response) {
  return Answer(
      context,
      Admit(context, *request, "an UpdateMembership request",
            request->job_id()),
      [&] {
        absl::StatusOr<JobSnapshot> job = aggregator_->UpdateMembership(
            request->job_id(), MembershipRequestFromProto(*request));
        if (job.ok()) JobInfoToProto(*job, *response);
        return job.status();
      });
}

absl::Status AggregatorService::AdmitBackupCall(
    const grpc::CallbackServerContext* context,
    const google::protobuf::MessageLite& request,
    absl::string_view what) const {
  if (absl::Status s = AdmitAdmin(context, request, what); !s.ok()) return s;
  if (backups_ == nullptr) {
    return absl::FailedPreconditionError(
        "this aggregator has no --backup_dir: start it with "
        "--backup_dir=FOLDER, on another volume than --data_dir's");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AggregatorService::Backup(
    grpc::CallbackServerContext* context, const v1::BackupRequest* request,
    v1::BackupInfo* response) {
  return Answer(context, AdmitBackupCall(context, *request, "a Backup request"),
                [&] {
                  absl::StatusOr<BackupSummary> backup = backups_->Create(
                      request->name(), request->shard(), request->job_id());
                  if (backup.ok()) BackupToProto(*backup, *response);
                  return backup.status();
                });
}

grpc::ServerUnaryReactor* AggregatorService::ListBackups(
    grpc::CallbackServerContext* context, const v1::ListBackupsRequest* request,
    v1::ListBackupsResponse* response) {
  return Answer(
      context, AdmitBackupCall(context, *request, "a ListBackups request"),
      [&] {
        for (const BackupSummary& backup : backups_->List(request->shard())) {
          BackupToProto(backup, *response->add_backups());
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* AggregatorService::RestoreBackup(
    grpc::CallbackServerContext* context,
    const v1::RestoreBackupRequest* request,
    v1::RestoreBackupResponse* response) {
  return Answer(context,
                AdmitBackupCall(context, *request, "a RestoreBackup request"),
                [&] { return RestoreBackupAdmitted(*request, *response); });
}

absl::Status AggregatorService::RestoreBackupAdmitted(
    const v1::RestoreBackupRequest& request,
    v1::RestoreBackupResponse& response) {
  std::vector<JobRestore> left_out;
  absl::StatusOr<std::vector<JobImage>> images = backups_->Read(
      request.name(), request.shard(), request.job_id(), nullptr, &left_out);
  if (!images.ok()) return images.status();
  absl::StatusOr<std::vector<JobRestore>> restored = aggregator_->RestoreJobs(
      *std::move(images), request.replace(), request.name());
  if (!restored.ok()) return restored.status();
  response.set_name(request.name());
  for (const JobRestore& r : *restored) RestoreToProto(r, *response.add_jobs());
  for (const JobRestore& r : left_out) RestoreToProto(r, *response.add_jobs());
  return absl::OkStatus();
}

}  // namespace syncnorm
