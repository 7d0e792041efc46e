#include "server/rpc/health_service.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/domain/bounded_text.h"
#include "server/rpc/grpc_status.h"

namespace syncnorm {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call: writes its service's status when it starts and on each
// change, one write at a time (a change during a write is written after it,
// the latest only), until the call is over or the service shuts down.
class HealthService::Watcher final : public LoopCall {
 public:
  static void Listen(HealthService* service, RpcLoop* loop) {
    new Watcher(service, loop);  // deletes itself
  }

  const std::string& service() const { return request_.service(); }

  // Writes `status` (now, or after the write in flight).
  void Send(Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    latest_ = status;
    if (finished_ || over_) return;
    if (writing_) {
      dirty_ = true;
      return;
    }
    WriteLocked();
  }

  // Ends the call (UNAVAILABLE) once what is being written is.
  void End() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    if (!writing_ && !dirty_) FinishLocked();
  }

 private:
  Watcher(HealthService* service, RpcLoop* loop)
      : LoopCall(loop), service_(service), writer_(&context()) {
    service_->RequestWatch(&context(), &request_, &writer_, loop->cq(),
                           loop->cq(), tag(kAccept));
  }

  void React(Kind kind, bool ok, bool /*cancelled*/) override {
    switch (kind) {
      case kAccept:
        Listen(service_, loop());
        service_->Enter(this);  // sends the status, or ends the call
        return;
      case kWrite: {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        if (!ok) broken_ = true;
        if (dirty_ && !broken_ && !over_) {
          WriteLocked();
        } else if (ending_ || over_ || broken_) {
          FinishLocked();
        }
        return;
      }
      case kDone: {
        service_->Leave(this);
        absl::MutexLock lock(&mu_);
        over_ = true;
        if (!writing_) FinishLocked();
        return;
      }
      case kRead:
      case kFinish:
      case kKinds:
        return;
    }
  }
  void Over() override {}

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    dirty_ = false;
    writing_ = true;
    response_.set_status(latest_);
    StartOp();
    writer_.Write(response_, tag(kWrite));
  }
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    StartOp(/*finish=*/true);
    // A call that is over, or whose write failed, has nobody to read
    // its status.
    writer_.Finish(over_ || broken_ ? grpc::Status::CANCELLED
                                    : ToGrpcStatus(absl::UnavailableError(
                                          "the server is shutting down")),
                   tag(kFinish));
  }

  HealthService* const service_;
  HealthCheckRequest request_;  // set when the call arrives
  grpc::ServerAsyncWriter<HealthCheckResponse> writer_;

  absl::Mutex mu_;
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  Status latest_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;   // latest_ not yet written
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // End() was called
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // a write failed
  bool over_ ABSL_GUARDED_BY(mu_) = false;    // the done tag came
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(std::vector<std::string> services) {
  serving_[""] = false;
  for (std::string& s : services) serving_[std::move(s)] = false;
}

HealthService::~HealthService() = default;

void HealthService::Listen(RpcLoop* loop) {
  loop_ = loop;
  check_ = std::make_unique<CheckCall::Method>();
  check_->request = CheckCall::Requester(
      this, &grpc::health::v1::Health::AsyncService::RequestCheck);
  check_->start = [this](CheckCall* call) { StartCheck(call); };
  CheckCall::Listen(loop, check_.get());
  Watcher::Listen(this, loop);
}

HealthService::Status HealthService::StatusLocked(
    const std::string& service) const {
  auto it = serving_.find(service);
  if (it == serving_.end()) return HealthCheckResponse::SERVICE_UNKNOWN;
  return it->second && !shut_down_ ? HealthCheckResponse::SERVING
                                   : HealthCheckResponse::NOT_SERVING;
}

void HealthService::StartCheck(CheckCall* call) {
  Status status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusLocked(call->request().service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    call->Finish(ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "unknown service '", BoundedText(call->request().service()),
        "'; ask for '' (the whole server)"))));
    return;
  }
  call->response()->set_status(status);
  call->Finish(grpc::Status::OK);
}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, s] : serving_) s = serving;
  for (Watcher* w : watchers_) w->Send(StatusLocked(w->service()));
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (Watcher* w : watchers_) {
    w->Send(StatusLocked(w->service()));
    w->End();
  }
}

void HealthService::Enter(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watcher->Send(StatusLocked(watcher->service()));
  if (shut_down_) {
    watcher->End();
    return;
  }
  watchers_.insert(watcher);
}

void HealthService::Leave(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

}  // namespace syncnorm
