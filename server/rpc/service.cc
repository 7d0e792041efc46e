#include "server/rpc/service.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/rpc/checkpoint_reactor.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/reduce_once_reactor.h"
#include "server/rpc/reduce_reactor.h"

namespace syncnorm {
namespace {

using AsyncAggregator = v1::Aggregator::AsyncService;

// The value of the call's `authorization` metadata; empty if none.
std::string AuthorizationOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

const Clock* OrWallClock(const Clock* clock) {
  static const RealClock* const kWallClock = new RealClock();
  return clock != nullptr ? clock : kWallClock;
}

// Listens for a unary method's calls on `loop`, served on its workers:
// `serve` answers each call, which finishes with the status it returns,
// its response filled when OK. `keep` holds the method for the calls'
// lifetime.
template <typename Base, typename Req, typename Resp>
void ListenOnWorkers(
    AggregatorService* service, RpcLoop* loop,
    void (Base::*request)(grpc::ServerContext*, Req*,
                          grpc::ServerAsyncResponseWriter<Resp>*,
                          grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                          void*),
    absl::Status (AggregatorService::*serve)(const grpc::ServerContextBase&,
                                             const Req&, Resp&),
    std::vector<std::shared_ptr<void>>& keep) {
  using Call = UnaryCall<Req, Resp>;
  auto method = std::make_shared<typename Call::Method>();
  method->request = Call::Requester(service, request);
  method->start = [service, loop, serve](Call* call) {
    loop->Post([service, serve, call] {
      call->Finish(ToGrpcStatus((service->*serve)(
          call->context(), call->request(), *call->response())));
    });
  };
  Call::Listen(loop, method.get());
  keep.push_back(std::move(method));
}

}  // namespace

// What each method's calls start with; they must outlive the calls.
struct AggregatorService::Methods {
  BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>::Method reduce;
  UnaryCall<v1::Contribution, v1::RoundResult>::Method reduce_once;
  UnaryCall<v1::CheckpointRequest, v1::CheckpointInfo>::Method checkpoint;
  // The rest, on the workers; held here for their lifetime only.
  std::vector<std::shared_ptr<void>> on_workers;
};

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

AggregatorService::~AggregatorService() = default;

void AggregatorService::Listen(RpcLoop* loop) {
  using ReduceCall = BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>;
  using ReduceOnceCall = UnaryCall<v1::Contribution, v1::RoundResult>;
  using CheckpointCall = UnaryCall<v1::CheckpointRequest, v1::CheckpointInfo>;
  methods_ = std::make_unique<Methods>();
  Methods& m = *methods_;
  m.reduce.request =
      ReduceCall::Requester(this, &AggregatorService::RequestReduce);
  m.reduce.start = [this](ReduceCall* call) { StartReduce(call); };
  m.reduce_once.request =
      ReduceOnceCall::Requester(this, &AsyncAggregator::RequestReduceOnce);
  m.reduce_once.start = [this](ReduceOnceCall* call) { StartReduceOnce(call); };
  m.checkpoint.request =
      CheckpointCall::Requester(this, &AsyncAggregator::RequestCheckpoint);
  m.checkpoint.start = [this](CheckpointCall* call) { StartCheckpoint(call); };
  ReduceCall::Listen(loop, &m.reduce);
  ReduceOnceCall::Listen(loop, &m.reduce_once);
  CheckpointCall::Listen(loop, &m.checkpoint);
  // The others, each by its request and its serving member.
  using S = AggregatorService;
  using A = AsyncAggregator;
  std::vector<std::shared_ptr<void>>& keep = m.on_workers;
  ListenOnWorkers(this, loop, &A::RequestCreateJob, &S::ServeCreateJob, keep);
  ListenOnWorkers(this, loop, &A::RequestGetJob, &S::ServeGetJob, keep);
  ListenOnWorkers(this, loop, &A::RequestDeleteJob, &S::ServeDeleteJob, keep);
  ListenOnWorkers(this, loop, &A::RequestGetRunningStats,
                  &S::ServeGetRunningStats, keep);
  ListenOnWorkers(this, loop, &A::RequestSetRunningStats,
                  &S::ServeSetRunningStats, keep);
  ListenOnWorkers(this, loop, &A::RequestListJobs, &S::ServeListJobs, keep);
  ListenOnWorkers(this, loop, &A::RequestGetStatsHealth,
                  &S::ServeGetStatsHealth, keep);
  ListenOnWorkers(this, loop, &A::RequestListCheckpoints,
                  &S::ServeListCheckpoints, keep);
  ListenOnWorkers(this, loop, &A::RequestRestoreCheckpoint,
                  &S::ServeRestoreCheckpoint, keep);
  ListenOnWorkers(this, loop, &A::RequestUpdateMembership,
                  &S::ServeUpdateMembership, keep);
  ListenOnWorkers(this, loop, &A::RequestBackup, &S::ServeBackup, keep);
  ListenOnWorkers(this, loop, &A::RequestListBackups, &S::ServeListBackups,
                  keep);
  ListenOnWorkers(this, loop, &A::RequestRestoreBackup, &S::ServeRestoreBackup,
                  keep);
}

absl::Status AggregatorService::AuthorizeJob(
    const grpc::ServerContextBase& context, absl::string_view job_id) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->AuthorizeJob(AuthorizationOf(context), job_id);
}

absl::Status AggregatorService::Admit(
    const grpc::ServerContextBase& context,
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
    const grpc::ServerContextBase& context) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->AuthorizeAdmin(AuthorizationOf(context));
}

absl::Status AggregatorService::AdmitAdmin(
    const grpc::ServerContextBase& context,
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
    const grpc::ServerContextBase& context,
    const google::protobuf::MessageLite& request, absl::string_view what,
    absl::string_view job_id, absl::string_view call) {
  if (absl::Status s = Admit(context, request, what, job_id); !s.ok()) {
    return s;
  }
  return waiting_->Enter(call);
}

absl::Status AggregatorService::ServeCreateJob(
    const grpc::ServerContextBase& context, const v1::CreateJobRequest& request,
    v1::JobInfo& response) {
  if (absl::Status s =
          Admit(context, request, "a CreateJob request", request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<JobSnapshot> job =
      aggregator_->CreateJob(JobSpecFromProto(request));
  if (job.ok()) JobInfoToProto(*job, response);
  return job.status();
}

absl::Status AggregatorService::ServeGetJob(
    const grpc::ServerContextBase& context, const v1::GetJobRequest& request,
    v1::JobInfo& response) {
  if (absl::Status s =
          Admit(context, request, "a GetJob request", request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<JobSnapshot> job = aggregator_->GetJob(request.job_id());
  if (job.ok()) JobInfoToProto(*job, response);
  return job.status();
}

absl::Status AggregatorService::ServeDeleteJob(
    const grpc::ServerContextBase& context, const v1::DeleteJobRequest& request,
    v1::DeleteJobResponse& /*response*/) {
  if (absl::Status s =
          Admit(context, request, "a DeleteJob request", request.job_id());
      !s.ok()) {
    return s;
  }
  return aggregator_->DeleteJob(request.job_id());
}

void AggregatorService::StartReduce(
    BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>* call) {
  // Reported here, not by interceptors (call_observer.h).
  std::vector<std::unique_ptr<CallObserver>> observers;
  observers.reserve(call_observers_.size());
  for (CallObserverFactory* f : call_observers_) {
    observers.push_back(f->CallStarted(
        call->context(), kSelfReportingMethod,
        grpc::experimental::ServerRpcInfo::Type::BIDI_STREAMING));
  }
  new ReduceReactor(call, aggregator_, auth_,
                    auth_ != nullptr ? AuthorizationOf(call->context()) : "",
                    &streams_, max_message_bytes_,
                    std::move(observers));  // deletes itself
}

void AggregatorService::StartReduceOnce(
    UnaryCall<v1::Contribution, v1::RoundResult>* call) {
  const v1::Contribution& request = call->request();
  // Refused before the aggregator sees the contribution: nothing of it is
  // kept.
  std::optional<RelayBlock> block;
  if (request.has_relay()) {
    absl::Status refused =
        auth_ != nullptr
            ? auth_->AuthorizeRelay(AuthorizationOf(call->context()),
                                    request.job_id())
            : absl::OkStatus();
    absl::StatusOr<RelayBlock> b = RelayBlockFromProto(request.relay());
    if (refused.ok() && !b.ok()) refused = b.status();
    if (!refused.ok()) {
      call->Finish(ToGrpcStatus(refused));
      return;
    }
    block = *std::move(b);
  }
  if (absl::Status denied =
          AdmitWaitingCall(call->context(), request, "a ReduceOnce request",
                           request.job_id(), "a new ReduceOnce call");
      !denied.ok()) {
    call->Finish(ToGrpcStatus(denied));
    return;
  }
  Contribution c = ContributionFromProto(v1::Contribution(request));
  c.block = std::move(block);
  // Only a relay's word moves the round's start back (a rank's would close
  // others' rounds early).
  if (c.round_age > absl::ZeroDuration() && auth_ != nullptr &&
      !c.block.has_value() &&
      !auth_->AuthorizeRelay(AuthorizationOf(call->context()), c.job_id).ok()) {
    c.round_age = absl::ZeroDuration();
  }
  new ReduceOnceReactor(call, aggregator_, std::move(c), call->response(),
                        waiting_);  // deletes itself
}

absl::Status AggregatorService::ServeGetRunningStats(
    const grpc::ServerContextBase& context,
    const v1::GetRunningStatsRequest& request, v1::RunningStats& response) {
  if (absl::Status s = Admit(context, request, "a GetRunningStats request",
                             request.job_id());
      !s.ok()) {
    return s;
  }
  const std::vector<int> layers(request.layers().begin(),
                                request.layers().end());
  std::optional<int64_t> checkpoint;
  if (request.checkpoint_step() != 0 || request.use_checkpoint()) {
    checkpoint = request.checkpoint_step();
  }
  absl::StatusOr<RunningStatsSnapshot> stats = aggregator_->GetRunningStats(
      request.job_id(), layers, request.group(), checkpoint);
  if (stats.ok()) RunningStatsToProto(*stats, response);
  return stats.status();
}

absl::Status AggregatorService::ServeGetStatsHealth(
    const grpc::ServerContextBase& context,
    const v1::GetStatsHealthRequest& request, v1::StatsHealth& response) {
  if (absl::Status s =
          Admit(context, request, "a GetStatsHealth request", request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::optional<StatsHealthSnapshot>> health =
      aggregator_->GetStatsHealth(request.job_id(), kMaxHealthListed);
  if (!health.ok()) return health.status();
  StatsHealthToProto(request.job_id(), *health, response);
  return absl::OkStatus();
}

absl::Status AggregatorService::ServeSetRunningStats(
    const grpc::ServerContextBase& context,
    const v1::SetRunningStatsRequest& request, v1::RunningStats& response) {
  if (absl::Status s = Admit(context, request, "a SetRunningStats request",
                             request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<LayerStatsSnapshot>> set =
      aggregator_->SetRunningStats(request.job_id(),
                                   LayerStatsFromProto(request));
  if (!set.ok()) return set.status();
  absl::StatusOr<JobSnapshot> job = aggregator_->GetJob(request.job_id());
  response.set_job_id(request.job_id());
  response.set_step(job.ok() ? job->committed_step : -1);
  for (const LayerStatsSnapshot& l : *set) {
    LayerStatsToProto(l, *response.add_layers());
  }
  return absl::OkStatus();
}

absl::Status AggregatorService::ServeListJobs(
    const grpc::ServerContextBase& context, const v1::ListJobsRequest& request,
    v1::ListJobsResponse& response) {
  if (absl::Status s = AdmitAdmin(context, request, "a ListJobs request");
      !s.ok()) {
    return s;
  }
  for (const JobSnapshot& job : aggregator_->ListJobs()) {
    JobInfoToProto(job, *response.add_jobs());
  }
  return absl::OkStatus();
}

void AggregatorService::StartCheckpoint(
    UnaryCall<v1::CheckpointRequest, v1::CheckpointInfo>* call) {
  const v1::CheckpointRequest& request = call->request();
  if (absl::Status denied =
          AdmitWaitingCall(call->context(), request, "a Checkpoint request",
                           request.job_id(), "a new Checkpoint call");
      !denied.ok()) {
    call->Finish(ToGrpcStatus(denied));
    return;
  }
  new CheckpointReactor(call, aggregator_, call->context(), request,
                        call->response(), waiting_);  // deletes itself
}

absl::Status AggregatorService::ServeListCheckpoints(
    const grpc::ServerContextBase& context,
    const v1::ListCheckpointsRequest& request,
    v1::ListCheckpointsResponse& response) {
  if (absl::Status s = Admit(context, request, "a ListCheckpoints request",
                             request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<CheckpointMeta>> list =
      aggregator_->ListCheckpoints(request.job_id());
  if (!list.ok()) return list.status();
  for (const CheckpointMeta& meta : *list) {
    CheckpointToProto(meta, *response.add_checkpoints());
  }
  return absl::OkStatus();
}

absl::Status AggregatorService::ServeRestoreCheckpoint(
    const grpc::ServerContextBase& context,
    const v1::RestoreCheckpointRequest& request, v1::JobInfo& response) {
  if (absl::Status s = Admit(context, request, "a RestoreCheckpoint request",
                             request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<JobSnapshot> job =
      aggregator_->RestoreCheckpoint(request.job_id(), request.step());
  if (job.ok()) JobInfoToProto(*job, response);
  return job.status();
}

absl::Status AggregatorService::ServeUpdateMembership(
    const grpc::ServerContextBase& context,
    const v1::UpdateMembershipRequest& request, v1::JobInfo& response) {
  if (absl::Status s = Admit(context, request, "an UpdateMembership request",
                             request.job_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<JobSnapshot> job = aggregator_->UpdateMembership(
      request.job_id(), MembershipRequestFromProto(request));
  if (job.ok()) JobInfoToProto(*job, response);
  return job.status();
}

absl::Status AggregatorService::AdmitBackupCall(
    const grpc::ServerContextBase& context,
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

absl::Status AggregatorService::ServeBackup(
    const grpc::ServerContextBase& context, const v1::BackupRequest& request,
    v1::BackupInfo& response) {
  if (absl::Status s = AdmitBackupCall(context, request, "a Backup request");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<BackupSummary> backup =
      backups_->Create(request.name(), request.shard(), request.job_id());
  if (backup.ok()) BackupToProto(*backup, response);
  return backup.status();
}

absl::Status AggregatorService::ServeListBackups(
    const grpc::ServerContextBase& context,
    const v1::ListBackupsRequest& request, v1::ListBackupsResponse& response) {
  if (absl::Status s =
          AdmitBackupCall(context, request, "a ListBackups request");
      !s.ok()) {
    return s;
  }
  for (const BackupSummary& backup : backups_->List(request.shard())) {
    BackupToProto(backup, *response.add_backups());
  }
  return absl::OkStatus();
}

absl::Status AggregatorService::ServeRestoreBackup(
    const grpc::ServerContextBase& context,
    const v1::RestoreBackupRequest& request,
    v1::RestoreBackupResponse& response) {
  if (absl::Status s =
          AdmitBackupCall(context, request, "a RestoreBackup request");
      !s.ok()) {
    return s;
  }
  return RestoreBackupAdmitted(request, response);
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
