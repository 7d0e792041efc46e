#include "relay/upstream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace syncnorm {

// One contribution on its way to a shard, across its resends.
struct Upstream::ReduceCall {
  int shard = 0;
  v1::Contribution request;
  absl::Time deadline;
  ReduceDone done;
  absl::Duration backoff = kInitialBackoff;
  // The current attempt's.
  std::shared_ptr<grpc::ClientContext> context;
  v1::RoundResult response;
};

namespace {

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  // As the client's channels (client/client.cc): notice a dead shard within
  // seconds, reconnect quickly, take a wide layer's messages.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20);
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace

Upstream::Upstream(std::vector<std::string> shards, const std::string& parent,
                   std::string token,
                   std::shared_ptr<grpc::ChannelCredentials> credentials,
                   TimerQueue& timers)
    : authorization_(token.empty() ? "" : absl::StrCat("Bearer ", token)),
      timers_(timers) {
  for (const std::string& address : shards) {
    channels_.push_back(MakeChannel(address, credentials));
    stubs_.push_back(v1::Aggregator::NewStub(channels_.back()));
  }
  if (!parent.empty()) {
    channels_.push_back(MakeChannel(parent, credentials));
    parent_stub_ = v1::Aggregator::NewStub(channels_.back());
  }
}

Upstream::~Upstream() { Shutdown(); }

std::shared_ptr<grpc::ClientContext> Upstream::NewContext(
    absl::Time deadline) const {
  auto context = std::make_shared<grpc::ClientContext>();
  if (!authorization_.empty()) {
    context->AddMetadata("authorization", authorization_);
  }
  if (deadline != absl::InfiniteFuture()) {
    context->set_deadline(absl::ToChronoTime(deadline));
  }
  return context;
}

bool Upstream::Begin(const std::shared_ptr<grpc::ClientContext>& context) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return false;
  in_flight_.insert(context);
  return true;
}

void Upstream::End(const std::shared_ptr<grpc::ClientContext>& context) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(context);
}

void Upstream::Reduce(int shard, v1::Contribution c, absl::Time deadline,
                      ReduceDone done) {
  auto call = std::make_shared<ReduceCall>();
  call->shard = shard;
  call->request = std::move(c);
  call->deadline = deadline;
  call->done = std::move(done);
  Attempt(std::move(call));
}

void Upstream::Attempt(std::shared_ptr<ReduceCall> call) {
  // No deadline on the call: the shard fails a round at the job's own
  // deadline, and a relay sets none the job did not set.
  call->context = NewContext(absl::InfiniteFuture());
  call->response.Clear();
  if (!Begin(call->context)) {
    // Off the caller's stack, as every callback.
    timers_.At(absl::Now(), [call] {
      call->done(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the relay is shutting down; resend"),
                 v1::RoundResult());
    });
    return;
  }
  grpc::ClientContext* context = call->context.get();
  v1::Aggregator::Stub& stub =
      parent_stub_ != nullptr ? *parent_stub_ : *stubs_[call->shard];
  stub.async()->ReduceOnce(
      context, &call->request, &call->response,
      [this, call](grpc::Status status) { Attempted(call, status); });
}

void Upstream::Attempted(std::shared_ptr<ReduceCall> call,
                         const grpc::Status& status) {
  const std::shared_ptr<grpc::ClientContext> context = call->context;
  const absl::Time now = absl::Now();
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = shutting_down_;
  }
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !stopping &&
      now + call->backoff < call->deadline) {
    const absl::Duration wait = call->backoff;
    call->backoff = std::min(2 * call->backoff, kMaxBackoff);
    timers_.At(now + wait, [this, call] { Attempt(call); });
  } else {
    call->done(status, std::move(call->response));
  }
  End(context);
}

void Upstream::GetJob(int shard, const std::string& job_id, JobDone done) {
  struct JobCall {
    std::shared_ptr<grpc::ClientContext> context;
    v1::GetJobRequest request;
    v1::JobInfo response;
    JobDone done;
  };
  auto call = std::make_shared<JobCall>();
  call->context = NewContext(absl::Now() + kGetJobTimeout);
  call->request.set_job_id(job_id);
  call->done = std::move(done);
  if (!Begin(call->context)) {
    timers_.At(absl::Now(), [call] {
      call->done(absl::UnavailableError("the relay is shutting down"));
    });
    return;
  }
  stubs_[shard]->async()->GetJob(
      call->context.get(), &call->request, &call->response,
      [this, call](grpc::Status status) {
        if (status.ok()) {
          call->done(std::move(call->response));
        } else {
          call->done(
              absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                           status.error_message()));
        }
        End(call->context);
      });
}

void Upstream::Shutdown() {
  std::set<std::shared_ptr<grpc::ClientContext>> cancel;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    cancel = in_flight_;
  }
  for (const auto& context : cancel) context->TryCancel();
  cancel.clear();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::set<std::shared_ptr<grpc::ClientContext>>* s) {
        return s->empty();
      },
      &in_flight_));
}

}  // namespace syncnorm
