#include "client/contributor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/proto_convert.h"
#include "grpcpp/client_context.h"

namespace syncnorm {

// One Reduce stream and the thread that reads its results.
struct Contributor::Stream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>>
      rw;
  std::thread reader;
  bool broken = false;  // guarded by Contributor::mu_
  absl::Status status;  // why it broke; guarded by Contributor::mu_
};

namespace {

// Stream failures worth a reconnect and resend: the server restarted, the
// connection dropped, or the server is shutting down.
bool Retryable(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

std::string Describe(const v1::Contribution& c) {
  return absl::StrCat("(job ", c.job_id(), ", layer ", c.layer(), ", step ",
                      c.step(), ", ", v1::Phase_Name(c.phase()), ", rank ",
                      c.rank(), ")");
}

}  // namespace

Contributor::Contributor(std::shared_ptr<grpc::Channel> channel,
                         std::string job_id, int rank,
                         const ClientOptions& options)
    : stub_(v1::Aggregator::NewStub(std::move(channel))),
      job_id_(std::move(job_id)),
      rank_(rank),
      options_(options) {}

Contributor::~Contributor() {
  std::shared_ptr<Stream> stream;
  {
    absl::MutexLock lock(&mu_);
    stream = std::move(stream_);
  }
  if (stream != nullptr) {
    stream->context.TryCancel();
    stream->reader.join();
  }
}

std::shared_ptr<Contributor::Stream> Contributor::CurrentStream() {
  std::shared_ptr<Stream> old;
  std::shared_ptr<Stream> current;
  {
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && !stream_->broken) return stream_;
    old = std::move(stream_);
    // Fail fast while the server is unreachable: the caller's backoff loop,
    // not gRPC's wait-for-ready, bounds how long a round waits.
    auto fresh = std::make_shared<Stream>();
    fresh->context.set_wait_for_ready(false);
    fresh->rw = stub_->Reduce(&fresh->context);
    fresh->reader = std::thread([this, fresh] { ReadLoop(fresh); });
    stream_ = fresh;
    current = fresh;
  }
  if (old != nullptr) old->reader.join();  // it has already seen the break
  return current;
}

void Contributor::ReadLoop(std::shared_ptr<Stream> stream) {
  v1::RoundResult result;
  while (stream->rw->Read(&result)) {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(Key(result.layer(), result.step(), result.phase()));
    if (it != slots_.end() && !it->second->done) {
      it->second->result = std::move(result);
      it->second->done = true;
    }
    result.Clear();
  }
  grpc::Status status = stream->rw->Finish();
  absl::MutexLock lock(&mu_);
  stream->broken = true;
  stream->status = status.ok()
                       ? absl::UnavailableError("the server closed the stream")
                       : FromGrpcStatus(status);
}

void Contributor::AwaitSlot(const Slot& slot, const Stream& stream,
                            absl::Time deadline) {
  auto ready = [&slot, &stream]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slot.done || stream.broken;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
}

absl::StatusOr<v1::RoundResult> Contributor::Round(const v1::Contribution& c) {
  const absl::Time deadline = absl::Now() + options_.round_timeout;
  const Key key(c.layer(), c.step(), c.phase());
  Slot slot;
  {
    absl::MutexLock lock(&mu_);
    if (!slots_.emplace(key, &slot).second) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", Describe(c), " is already in flight from this process"));
    }
  }
  absl::Duration backoff = options_.reconnect_backoff_initial;
  absl::Status last = absl::OkStatus();
  bool done = false;
  for (;;) {
    std::shared_ptr<Stream> stream = CurrentStream();
    {
      absl::MutexLock write_lock(&write_mu_);
      stream->rw->Write(c);  // a failed write shows as a broken stream
    }
    {
      absl::MutexLock lock(&mu_);
      AwaitSlot(slot, *stream, deadline);
      done = slot.done;
      if (!done && stream->broken) last = stream->status;
      if (done || absl::Now() >= deadline || (!last.ok() && !Retryable(last))) {
        slots_.erase(key);
        break;
      }
    }
    absl::SleepFor(std::min(backoff, deadline - absl::Now()));
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
  if (done) return RoundResultStatus(std::move(slot.result));
  if (!last.ok() && !Retryable(last)) return last;
  return absl::DeadlineExceededError(absl::StrCat(
      "no result for round ", Describe(c), " within the client's ",
      absl::FormatDuration(options_.round_timeout), " round timeout",
      last.ok() ? "" : absl::StrCat("; last stream error: ", last.ToString())));
}

absl::StatusOr<ForwardReply> Contributor::ReduceForward(int layer, int64_t step,
                                                        const Moments& local) {
  v1::Contribution c = MakeContribution(job_id_, layer, step, rank_);
  ToProto(local, c.mutable_moments());
  absl::StatusOr<v1::RoundResult> r = Round(c);
  if (!r.ok()) return r.status();
  if (!r->has_moments() ||
      r->moments().mean_size() != local.channels() ||
      r->moments().var_size() != local.channels()) {
    return absl::InternalError(absl::StrCat(
        "the server answered round ", Describe(c),
        " without global moments of ", local.channels(), " channels"));
  }
  ForwardReply reply;
  reply.global = FromProto(r->moments());
  reply.version = r->version();
  return reply;
}

absl::StatusOr<GradSums> Contributor::ReduceBackward(int layer, int64_t step,
                                                     const GradSums& local) {
  v1::Contribution c = MakeContribution(job_id_, layer, step, rank_);
  c.set_phase(v1::BACKWARD);
  ToProto(local, c.mutable_grad_sums());
  absl::StatusOr<v1::RoundResult> r = Round(c);
  if (!r.ok()) return r.status();
  if (!r->has_grad_sums() ||
      r->grad_sums().sum_dy_size() != local.channels() ||
      r->grad_sums().sum_dy_xmu_size() != local.channels()) {
    return absl::InternalError(absl::StrCat(
        "the server answered round ", Describe(c), " without gradient sums of ",
        local.channels(), " channels"));
  }
  return FromProto(r->grad_sums());
}

}  // namespace syncnorm
