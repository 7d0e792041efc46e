#include "client/contributor.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/proto_convert.h"
#include "grpcpp/client_context.h"
#include "wire/convert.h"

namespace syncnorm {

// One Reduce stream. Whoever finds no reader reads it (see Contributor).
struct Contributor::Stream {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Contribution, v1::RoundResult>>
      rw;
  bool reading = false;   // a caller is in rw->Read; guarded by mu_
  bool broken = false;    // Read failed and Finish ran; guarded by mu_
  bool finished = false;  // Finish ran; guarded by write_mu_
  // The watchdog cancelled it: a read outlived its caller's round timeout.
  bool cancelled = false;    // guarded by mu_
  absl::Status status;       // why it broke; guarded by mu_
  v1::RoundResult incoming;  // only the reading caller touches it
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
  return absl::StrCat(
      "(job ", c.job_id(), ", layer ", c.layer(), ", step ", c.step(), ", ",
      v1::Phase_Name(c.phase()),
      c.phase() == v1::BACKWARD
          ? absl::StrCat(", backward_index ", c.backward_index())
          : "",
      ", rank ", c.rank(), ")");
}

// The backward index names BACKWARD rounds only; a FORWARD's is 0.
template <typename M>
int BackwardIndexOf(const M& m) {
  return m.phase() == v1::BACKWARD ? m.backward_index() : 0;
}

}  // namespace

Contributor::Contributor(std::shared_ptr<grpc::Channel> channel,
                         std::string job_id, int rank,
                         const ClientOptions& options, const ClientClock* clock,
                         std::unique_ptr<RelayFallback> fallback)
    : channel_(std::move(channel)),
      stub_(v1::Aggregator::NewStub(channel_)),
      job_id_(std::move(job_id)),
      rank_(rank),
      options_(options),
      clock_(clock != nullptr ? clock : &real_clock_),
      fallback_(std::move(fallback)) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

Contributor::~Contributor() {
  std::shared_ptr<Stream> stream;
  bool unfinished = false;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stream = std::move(stream_);
    // No round is in flight, so nobody reads the stream.
    unfinished = stream != nullptr && !stream->broken;
  }
  watchdog_.join();
  if (unfinished) EndStream(*stream);
}

void Contributor::EndStream(Stream& stream) {
  // The clean end: half-close, and the server, having nothing left to
  // answer, ends the stream OK (its metrics count it so). Cancelled only
  // when the server does not end it within kEndGrace (unreachable, or still
  // holding a round this client gave up on).
  static constexpr absl::Duration kEndGrace = absl::Seconds(1);
  absl::Notification ended;
  std::thread canceller([&stream, &ended] {
    if (!ended.WaitForNotificationWithTimeout(kEndGrace)) {
      stream.context.TryCancel();
    }
  });
  stream.rw->WritesDone();
  while (stream.rw->Read(&stream.incoming)) {
  }
  stream.rw->Finish();
  ended.Notify();
  canceller.join();
}

std::shared_ptr<Contributor::Stream> Contributor::CurrentStream() {
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr && !stream_->broken) return stream_;
  // The broken one was finished by the caller that saw its read fail.
  // Fail fast while the server is unreachable: the caller's backoff loop,
  // not gRPC's wait-for-ready, bounds how long a round waits.
  auto fresh = std::make_shared<Stream>();
  fresh->context.set_wait_for_ready(false);
  fresh->rw = stub_->Reduce(&fresh->context);
  stream_ = fresh;
  return fresh;
}

void Contributor::ReadOne(Stream& stream, absl::Time deadline) {
  stream.reading = true;
  read_stream_ = &stream;
  read_deadline_ = deadline;
  mu_.Unlock();
  const bool ok = stream.rw->Read(&stream.incoming);
  grpc::Status status;
  if (!ok) {
    absl::MutexLock write_lock(&write_mu_);  // no Write during Finish
    status = stream.rw->Finish();
    stream.finished = true;
  }
  mu_.Lock();
  stream.reading = false;
  read_stream_ = nullptr;
  if (!ok) {
    stream.broken = true;
    stream.status = status.ok()
                        ? absl::UnavailableError("the server closed the stream")
                        : FromGrpcStatus(status);
    return;
  }
  const v1::RoundResult& r = stream.incoming;
  auto it =
      slots_.find(Key(r.layer(), r.step(), r.phase(), BackwardIndexOf(r)));
  if (it != slots_.end() && !it->second->done) {
    it->second->result.Swap(&stream.incoming);
    it->second->done = true;
  }
  stream.incoming.Clear();  // a result nobody waits for any more
}

void Contributor::AwaitSlot(const Slot& slot,
                            const std::shared_ptr<Stream>& stream,
                            absl::Time deadline) {
  const Stream& s = *stream;
  auto ready = [&slot, &s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slot.done || s.broken || !s.reading;
  };
  while (!slot.done && !s.broken && clock_->Now() < deadline) {
    if (!s.reading) {
      ReadOne(*stream, deadline);
    } else {
      clock_->AwaitWithDeadline(mu_, absl::Condition(&ready), deadline);
    }
  }
}

void Contributor::Watchdog() {
  absl::MutexLock lock(&mu_);
  // Sleeps until watch_until_, or until a read starts on a stream it has not
  // cancelled whose deadline is earlier; rounds that start one after another
  // have later and later deadlines, so it wakes about once per round
  // timeout, not per round. A cancelled stream's read ends by itself (its
  // reader needs mu_ for that), so after cancelling it waits for another
  // read instead of holding mu_ in a loop.
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (read_stream_ != nullptr && !read_stream_->cancelled &&
                         read_deadline_ < watch_until_);
  };
  while (!stopping_) {
    clock_->AwaitWithDeadline(mu_, absl::Condition(&wake), watch_until_);
    if (stopping_) break;
    const absl::Time now = clock_->Now();
    if (read_stream_ == nullptr || read_stream_->cancelled) {
      watch_until_ = absl::InfiniteFuture();
    } else if (read_deadline_ > now) {
      watch_until_ = read_deadline_;
    } else {
      // The reader's round is out of time and the server is silent: break
      // the stream; the reader returns, the other rounds resend.
      read_stream_->cancelled = true;
      read_stream_->context.TryCancel();
      watch_until_ = absl::InfiniteFuture();
    }
  }
}

std::unique_ptr<v1::Contribution> Contributor::TakeMessage(v1::Phase phase) {
  {
    absl::MutexLock lock(&mu_);
    auto& spare = spare_[phase == v1::FORWARD ? 0 : 1];
    if (!spare.empty()) {
      std::unique_ptr<v1::Contribution> m = std::move(spare.back());
      spare.pop_back();
      return m;
    }
  }
  auto m = std::make_unique<v1::Contribution>(
      MakeContribution(job_id_, 0, 0, rank_));
  m->set_phase(phase);
  return m;
}

void Contributor::ReturnMessage(std::unique_ptr<v1::Contribution> m) {
  absl::MutexLock lock(&mu_);
  spare_[m->phase() == v1::FORWARD ? 0 : 1].push_back(std::move(m));
}

absl::StatusOr<v1::RoundResult> Contributor::Round(const v1::Contribution& c) {
  const absl::Time deadline = clock_->Now() + options_.round_timeout;
  if (fallback_ == nullptr) return RoundUntil(c, deadline);
  const RelayFallback::Route route = fallback_->RouteOf(c.step());
  if (route == RelayFallback::Route::kShards) {
    return fallback_->Round(c, deadline);
  }
  const absl::Time answer_by =
      route == RelayFallback::Route::kProbation
          ? std::min(deadline, clock_->Now() + options_.connect_timeout)
          : deadline;
  bool unreachable = false;
  absl::StatusOr<v1::RoundResult> r = RoundOnStream(
      c, answer_by, deadline, options_.connect_timeout, &unreachable);
  if (!unreachable) return r;
  // The relay may have forwarded the round before it went (or may still
  // forward it): the shard answers whichever copy comes second as a retry
  // (its fingerprint matches).
  fallback_->RelayUnreachable(c.step());
  return fallback_->Round(c, deadline);
}

absl::StatusOr<v1::RoundResult> Contributor::RoundUntil(
    const v1::Contribution& c, absl::Time deadline) {
  return RoundOnStream(c, deadline, deadline, absl::InfiniteDuration(),
                       nullptr);
}

bool Contributor::Unreachable(absl::Duration bound, absl::Time deadline) const {
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
    return false;
  }
  clock_->AwaitReady(*channel_, std::min(clock_->Now() + bound, deadline));
  return channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY &&
         clock_->Now() < deadline;
}

absl::StatusOr<v1::RoundResult> Contributor::RoundOnStream(
    const v1::Contribution& c, absl::Time deadline, absl::Time round_deadline,
    absl::Duration unreachable_after, bool* unreachable) {
  const Key key(c.layer(), c.step(), c.phase(), BackwardIndexOf(c));
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
  bool broke = false;  // this pass's stream broke (not by the watchdog)
  for (;;) {
    std::shared_ptr<Stream> stream = CurrentStream();
    {
      absl::MutexLock write_lock(&write_mu_);
      // A failed write shows as a failed read, hence a broken stream.
      if (!stream->finished) stream->rw->Write(c);
    }
    {
      absl::MutexLock lock(&mu_);
      AwaitSlot(slot, stream, deadline);
      done = slot.done;
      // A server that shuts down refuses new rounds in-band (UNAVAILABLE):
      // resend after the backoff, on a new stream once it closed this one.
      if (done && slot.result.has_error() &&
          slot.result.error().code() == grpc::StatusCode::UNAVAILABLE &&
          clock_->Now() < deadline) {
        last = absl::UnavailableError(slot.result.error().message());
        slot.result.Clear();
        slot.done = done = false;
      }
      // A stream the watchdog cancelled says nothing about the server.
      broke = !done && stream->broken && !stream->cancelled;
      if (broke) last = stream->status;
      if (done || clock_->Now() >= deadline ||
          (!last.ok() && !Retryable(last))) {
        slots_.erase(key);
        break;
      }
    }
    // The stream broke and no connection comes up: the relay is gone.
    if (broke && unreachable != nullptr &&
        Unreachable(unreachable_after, deadline)) {
      absl::MutexLock lock(&mu_);
      slots_.erase(key);
      *unreachable = true;
      return absl::UnavailableError(absl::StrCat(
          "no connection within ", absl::FormatDuration(unreachable_after),
          " after the stream of round ", Describe(c),
          " broke: ", last.ToString()));
    }
    // While the connection is down, wait on the channel instead of sleeping:
    // its connection attempt is polled (the streams fail fast, so no call
    // of ours does that), and the resend goes out once it is up. A server
    // that refused the round over a working connection gets the whole
    // backoff.
    const absl::Time until = std::min(clock_->Now() + backoff, deadline);
    if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
      clock_->SleepFor(until - clock_->Now());
    } else {
      clock_->AwaitReady(*channel_, until);
    }
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
  if (done) return RoundResultStatus(std::move(slot.result));
  if (!last.ok() && !Retryable(last)) return last;
  if (unreachable != nullptr && deadline < round_deadline) {
    // On probation: the relay held the round past its answer time.
    *unreachable = true;
    return absl::UnavailableError(absl::StrCat(
        "no answer within ", absl::FormatDuration(unreachable_after),
        " for round ", Describe(c), " on probation"));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no result for round ", Describe(c), " within the client's ",
      absl::FormatDuration(options_.round_timeout), " round timeout",
      last.ok() ? ": the server sent none (a client round timeout above the "
                  "job's round_timeout_ms lets the server's error, which names "
                  "the missing ranks, come first)"
                : absl::StrCat("; last stream error: ", last.ToString())));
}

absl::StatusOr<ForwardReply> Contributor::ReduceForward(
    int layer, int64_t step, const Moments& local, const RoundUpdate& update) {
  std::unique_ptr<v1::Contribution> c = TakeMessage(v1::FORWARD);
  c->set_layer(layer);
  c->set_step(step);
  ToProto(local, *c->mutable_moments());
  ToProto(update, *c);
  absl::StatusOr<v1::RoundResult> r = Round(*c);
  auto give_back = absl::MakeCleanup([&] { ReturnMessage(std::move(c)); });
  if (!r.ok()) return r.status();
  if (!r->has_moments() || r->moments().mean_size() != local.channels() ||
      r->moments().var_size() != local.channels()) {
    return absl::InternalError(absl::StrCat(
        "the server answered round ", Describe(*c),
        " without global moments of ", local.channels(), " channels"));
  }
  return ForwardReplyFromProto(*r);
}

absl::StatusOr<GradSums> Contributor::ReduceBackward(int layer, int64_t step,
                                                     int backward,
                                                     const GradSums& local) {
  if (backward < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward index ", backward, " of layer ", layer, " step ", step,
        " is negative; the first backward through a forward is 0"));
  }
  std::unique_ptr<v1::Contribution> c = TakeMessage(v1::BACKWARD);
  c->set_layer(layer);
  c->set_step(step);
  c->set_backward_index(backward);  // always: the message may be a used one
  ToProto(local, *c->mutable_grad_sums());
  absl::StatusOr<v1::RoundResult> r = Round(*c);
  auto give_back = absl::MakeCleanup([&] { ReturnMessage(std::move(c)); });
  if (!r.ok()) return r.status();
  if (!r->has_grad_sums() || r->grad_sums().sum_dy_size() != local.channels() ||
      r->grad_sums().sum_dy_xmu_size() != local.channels()) {
    return absl::InternalError(absl::StrCat(
        "the server answered round ", Describe(*c),
        " without gradient sums of ", local.channels(), " channels"));
  }
  return FromProto(r->grad_sums());
}

}  // namespace syncnorm
