#include "relay/upstream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/channel_args.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "relay/relay_tls.h"
#include "server/domain/log.h"
#include "server/rpc/rpc_loop.h"

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
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RoundResult>> reader;
  v1::RoundResult response;
  grpc::Status status;
};

namespace {

// A call's completion on the queue: runs `then` once, then is gone.
class ThenTag final : public CqTag {
 public:
  explicit ThenTag(std::function<void()> then) : then_(std::move(then)) {}
  void Run(bool /*ok*/) override {
    std::function<void()> then = std::move(then_);
    delete this;
    then();
  }

 private:
  std::function<void()> then_;
};

// Starts the unary call `reader` and runs `then` on the queue once its
// status is in `*status` (and, when OK, its response in `*response`).
template <typename Resp>
void FinishThen(grpc::ClientAsyncResponseReader<Resp>& reader, Resp* response,
                grpc::Status* status, std::function<void()> then) {
  reader.StartCall();
  reader.Finish(response, status, new ThenTag(std::move(then)));
}

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  // As the client's channels: notice a dead shard within seconds, reconnect
  // quickly, take a wide layer's messages.
  return grpc::CreateCustomChannel(address, credentials,
                                   RoundChannelArguments());
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

Upstream::Upstream(std::vector<std::string> shards, const std::string& parent,
                   std::string token,
                   std::shared_ptr<grpc::ChannelCredentials> credentials,
                   TimerQueue& timers, grpc::CompletionQueue* cq, bool tls)
    : authorization_(token.empty() ? "" : absl::StrCat("Bearer ", token)),
      timers_(timers),
      cq_(cq),
      tls_(tls),
      addresses_(shards),
      shard_tls_(shards.size()),
      probes_(shards.size()) {
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
  {
    absl::MutexLock lock(&mu_);
    ++counters_.calls[UpstreamCounters::kReduceOnce];
  }
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
  // The last attempt's reader lives in its call's arena, which goes with
  // its context: it goes first.
  call->reader.reset();
  call->context = NewContext(absl::InfiniteFuture());
  call->response.Clear();
  if (!Begin(call->context)) {
    // Off the caller's stack, as every callback.
    timers_.At(absl::Now(), [this, call] {
      const grpc::Status status(grpc::StatusCode::UNAVAILABLE,
                                "the relay is shutting down; resend");
      Failed(UpstreamCounters::kReduceOnce, status);
      call->done(status, v1::RoundResult());
    });
    return;
  }
  grpc::ClientContext* context = call->context.get();
  v1::Aggregator::Stub& stub =
      parent_stub_ != nullptr ? *parent_stub_ : *stubs_[call->shard];
  call->reader = stub.PrepareAsyncReduceOnce(context, call->request, cq_);
  FinishThen(*call->reader, &call->response, &call->status, [this, call] {
    const grpc::Status status = call->status;
    Attempted(call, status);
  });
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
  std::optional<grpc::Status> mismatch;
  // A shard's handshake only: through a parent relay the call's connection
  // is the parent's, which Mismatch would not probe (it is resent).
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !stopping &&
      parent_stub_ == nullptr) {
    mismatch = Mismatch(call->shard, status);
  }
  if (mismatch.has_value()) {
    // Resending would meet the same handshake: the ranks hear it now.
    Failed(UpstreamCounters::kReduceOnce, *mismatch);
    call->done(*mismatch, v1::RoundResult());
  } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
             !stopping && now + call->backoff < call->deadline) {
    const absl::Duration wait = call->backoff;
    call->backoff = std::min(2 * call->backoff, kMaxBackoff);
    {
      absl::MutexLock lock(&mu_);
      ++counters_.retries;
    }
    timers_.At(now + wait, [this, call] { Attempt(call); });
  } else {
    if (!status.ok()) Failed(UpstreamCounters::kReduceOnce, status);
    call->done(status, std::move(call->response));
  }
  End(context);
}

void Upstream::GetJob(int shard, const std::string& job_id, JobDone done) {
  struct JobCall {
    std::shared_ptr<grpc::ClientContext> context;
    v1::GetJobRequest request;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JobInfo>> reader;
    v1::JobInfo response;
    grpc::Status status;
    JobDone done;
  };
  {
    absl::MutexLock lock(&mu_);
    ++counters_.calls[UpstreamCounters::kGetJob];
  }
  auto call = std::make_shared<JobCall>();
  call->context = NewContext(absl::Now() + kGetJobTimeout);
  call->request.set_job_id(job_id);
  call->done = std::move(done);
  if (!Begin(call->context)) {
    timers_.At(absl::Now(), [this, call] {
      const absl::Status status =
          absl::UnavailableError("the relay is shutting down");
      Failed(UpstreamCounters::kGetJob, ToGrpc(status));
      call->done(status);
    });
    return;
  }
  call->reader = stubs_[shard]->PrepareAsyncGetJob(call->context.get(),
                                                   call->request, cq_);
  FinishThen(
      *call->reader, &call->response, &call->status, [this, call, shard] {
        grpc::Status status = call->status;
        if (status.ok()) {
          call->done(std::move(call->response));
        } else {
          if (std::optional<grpc::Status> mismatch = Mismatch(shard, status)) {
            status = *std::move(mismatch);
          }
          Failed(UpstreamCounters::kGetJob, status);
          call->done(
              absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                           status.error_message()));
        }
        End(call->context);
      });
}

std::optional<grpc::Status> Upstream::Mismatch(int shard,
                                               const grpc::Status& status) {
  const ConnectFailure kind = ClassifyConnectFailure(status);
  if (kind == ConnectFailure::kOther) return std::nullopt;
  const absl::Time now = absl::Now();
  bool probe = false;
  bool log = false;
  bool mismatch = false;
  {
    absl::MutexLock lock(&mu_);
    ShardTls& t = shard_tls_[shard];
    const bool fresh = now - t.probed_at < kProbeValid;
    if (kind == ConnectFailure::kHandshake) {
      mismatch = true;
    } else if (fresh) {
      mismatch = t.speaks_tls;
    } else if (!t.probing && !shutting_down_) {
      // A closed connection: a TLS shard dialed in plaintext (or one that
      // refused the relay's certificate), or a proxy whose shard is down.
      // Until a probe tells, it is resent as a shard that is down.
      t.probing = probe = true;
    }
    if (mismatch && !t.logged) t.logged = log = true;
  }
  if (probe) Probe(shard);
  if (!mismatch) return std::nullopt;
  grpc::Status out =
      UpstreamTlsMismatch(shard, addresses_[shard], tls_, kind, status);
  if (log) {
    LogLine("upstream_tls_mismatch", LogLevel::kError)
        .Add("shard", shard)
        .Add("address", addresses_[shard])
        .Add("error", out.error_message());
  }
  return out;
}

void Upstream::Probe(int shard) {
  struct ProbeCall {
    std::shared_ptr<grpc::ClientContext> context;
    v1::GetJobRequest request;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JobInfo>> reader;
    v1::JobInfo response;
    grpc::Status status;
  };
  auto call = std::make_shared<ProbeCall>();
  call->context = std::make_shared<grpc::ClientContext>();
  call->context->set_deadline(absl::ToChronoTime(absl::Now() + kProbeTimeout));
  v1::Aggregator::Stub* stub = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (probes_[shard] == nullptr) {
      probes_[shard] = v1::Aggregator::NewStub(grpc::CreateCustomChannel(
          addresses_[shard], TlsProbeCredentials(), grpc::ChannelArguments()));
    }
    stub = probes_[shard].get();
  }
  if (!Begin(call->context)) {
    absl::MutexLock lock(&mu_);
    shard_tls_[shard].probing = false;
    return;
  }
  // No token: a probe learns only whether the shard's side speaks TLS.
  call->reader =
      stub->PrepareAsyncGetJob(call->context.get(), call->request, cq_);
  FinishThen(*call->reader, &call->response, &call->status,
             [this, call, shard] {
               const bool tls = ProbeSawTls(call->status);
               {
                 absl::MutexLock lock(&mu_);
                 ShardTls& t = shard_tls_[shard];
                 t.probing = false;
                 t.probed_at = absl::Now();
                 t.speaks_tls = tls;
                 if (!tls) t.logged = false;
               }
               End(call->context);
             });
}

void Upstream::Failed(UpstreamCounters::Method method,
                      const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  absl::MutexLock lock(&mu_);
  if (code >= 0 && code < 17) ++counters_.failures[method][code];
}

UpstreamCounters Upstream::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
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
