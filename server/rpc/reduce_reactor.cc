#include "server/rpc/reduce_reactor.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"  // SerializationTraits<proto>
#include "server/domain/limits.h"
#include "server/rpc/encoded_result.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/stream_set.h"
#include "syncnorm/v1/aggregator.pb.h"

namespace syncnorm {

// Invariants: gRPC's Start*/Finish are never called under mu_ (a reaction
// may run inline); a write is started only by the party that set writing_,
// and Finish only when !writing_, so no write is ever started after Finish.
// Outside a reaction, a read is posted only by the party that set
// posting_read_, and Finish waits for it in the same way. A held stream is
// in its StreamSet's held set only while read_held_.

namespace {

// A stream counts against --max_streams only once its caller is known:
// without a token in force it ends before it takes a slot.
StreamSet* Admit(const Authenticator* auth, const std::string& authorization,
                 StreamSet* streams, ReduceReactor* reactor,
                 absl::Status& refused) {
  if (auth != nullptr) {
    refused = auth->Authenticate(authorization);
    if (!refused.ok()) return nullptr;
  }
  if (streams == nullptr) return nullptr;
  refused = streams->Enter(reactor);
  return refused.ok() ? streams : nullptr;
}

const Clock* ClockOf(const StreamSet* streams) {
  return streams != nullptr ? &streams->clock() : nullptr;
}

}  // namespace

ReduceReactor::ReduceReactor(
    BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>* call, Aggregator* aggregator,
    const Authenticator* auth, std::string authorization, StreamSet* streams,
    int64_t max_message_bytes,
    std::vector<std::unique_ptr<CallObserver>> observers)
    : RefCountedReactor(1, call),  // gRPC's, until OnDone
      aggregator_(aggregator),
      auth_(auth),
      authorization_(std::move(authorization)),
      clock_(ClockOf(streams)),
      max_message_bytes_(max_message_bytes),
      observers_(std::move(observers)),
      outcome_(observers_.empty()
                   ? nullptr
                   : std::make_unique<CallOutcome>(&call->context())) {
  {
    absl::MutexLock lock(&mu_);
    last_active_ = Now();
  }
  // Last: from here on StreamSet's threads may reach this stream.
  streams_ = Admit(auth_, authorization_, streams, this, refused_);
  if (!refused_.ok()) {
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
    }
    FinishWith(ToGrpcStatus(refused_));
    return;
  }
  StartRead(&request_);
}

void ReduceReactor::FinishWith(grpc::Status status) {
  if (outcome_ != nullptr) outcome_->StatusSent(status.error_code());
  Finish(std::move(status));
}

void ReduceReactor::Write(const grpc::ByteBuffer* result) {
  for (const std::unique_ptr<CallObserver>& o : observers_) o->MessageSent();
  StartWrite(result);
}

bool ReduceReactor::FullLocked() const {
  return pending_ + queue_.size() >= static_cast<size_t>(kMaxUnanswered) ||
         (max_message_bytes_ > 0 &&
          held_bytes_ >= kHeldMessages * max_message_bytes_);
}

bool ReduceReactor::RoomLocked() const {
  return pending_ + queue_.size() < static_cast<size_t>(kMaxUnanswered / 2) &&
         (max_message_bytes_ <= 0 ||
          held_bytes_ < kHeldMessages * max_message_bytes_ / 2);
}

void ReduceReactor::OnReadDone(bool ok) {
  if (!ok) {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      finish = TakeFinish();
    }
    if (finish.has_value()) FinishWith(*std::move(finish));
    return;
  }
  for (const std::unique_ptr<CallObserver>& o : observers_) {
    o->MessageReceived();
  }
  const size_t bytes = request_.Length();
  v1::Contribution message;
  // Deserialize takes the bytes (request_ is left empty for the next read).
  if (!grpc::SerializationTraits<v1::Contribution>::Deserialize(&request_,
                                                                &message)
           .ok()) {
    CloseWith(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "a Reduce stream message of ", bytes,
        " bytes is no syncnorm.v1.Contribution; the stream ends here"))));
    return;
  }
  absl::Status refused =
      CheckMessageSize(bytes, "a Reduce stream message", max_message_bytes_);
  // An oversized payload goes no further than this check.
  if (!refused.ok()) message.clear_payload();
  std::optional<RelayBlock> block;
  if (refused.ok() && message.has_relay()) {
    absl::StatusOr<RelayBlock> b = RelayBlockFromProto(message.relay());
    if (b.ok()) {
      block = *std::move(b);
    } else {
      refused = b.status();
    }
  }
  Contribution c = ContributionFromProto(std::move(message));
  c.block = std::move(block);
  bool read_now = true;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // ended meanwhile (closed): the client resends
    last_active_ = Now();
    // Sent while another waits for its round: the client pipelines, and
    // may need its next message read before that answer can come.
    if (pending_ > 0) eager_reads_ = true;
    ++pending_;
    held_bytes_ += bytes;
    // A client that sends without reading its results, or faster than its
    // rounds complete, waits until the stream holds less.
    read_now = !FullLocked();
    read_paused_ = !read_now;
  }
  Ref();  // the aggregator callback's
  Contribution key;
  key.job_id = c.job_id;
  key.layer = c.layer;
  key.step = c.step;
  key.phase = c.phase;
  key.backward = c.backward;
  if (refused.ok() && auth_ != nullptr) {
    refused = c.block.has_value()
                  ? auth_->AuthorizeRelay(authorization_, c.job_id)
                  : auth_->AuthorizeJob(authorization_, c.job_id);
    // Only a relay's word moves the round's start back (a rank's would
    // close others' rounds early).
    if (refused.ok() && c.round_age > absl::ZeroDuration() &&
        !c.block.has_value() &&
        !auth_->AuthorizeRelay(authorization_, c.job_id).ok()) {
      c.round_age = absl::ZeroDuration();
    }
  }
  if (!refused.ok()) {
    RoundOutcome outcome;
    outcome.status = std::move(refused);
    Answer(key, bytes, outcome);
    Unref();
  } else {
    aggregator_->Contribute(std::move(c), [this, key = std::move(key),
                                           bytes](const RoundOutcome& outcome) {
      Answer(key, bytes, outcome);
      Unref();
    });
  }
  // The next read only now, once this contribution is with the aggregator:
  // the stream's messages reach it in the order they were sent (a read
  // posted earlier lets the next message's reaction run on another thread
  // and overtake this one). When this contribution completed its round,
  // the read also goes out after the answer's write, which then carries
  // the flow-control update with it; while it waits, the read may wait for
  // the answer too (HoldRead). Safe even after Finish or the answer's
  // Unref: this reaction holds the call open until it returns, and a read
  // on a finished call just fails.
  if (read_now && !HoldRead()) StartRead(&request_);
}

bool ReduceReactor::HoldRead() {
  if (streams_ == nullptr) return false;  // nothing would release it
  absl::MutexLock lock(&mu_);
  // Answered meanwhile (inline or on another thread), or ending: read now.
  if (eager_reads_ || pending_ == 0 || cancelled_ || finished_ || closing_) {
    return false;
  }
  read_held_ = true;
  streams_->Hold(this);
  return true;
}

std::optional<grpc::Status> ReduceReactor::PostHeldRead() {
  // Not a reaction, but posting_read_ keeps Finish from being called (and
  // so gRPC from being done with the call) until the read is posted.
  StartRead(&request_);
  absl::MutexLock lock(&mu_);
  posting_read_ = false;
  return TakeFinish();
}

void ReduceReactor::ReleaseHeldRead() {
  {
    absl::MutexLock lock(&mu_);
    if (!read_held_) return;  // the answer posted it
    read_held_ = false;
    // The hold this ends may be a later one than the set took to release
    // (the answer came, and the next contribution held the read again, in
    // between): that one is in the set again, and leaves it with this.
    streams_->Unhold(this);
    if (cancelled_ || finished_) return;
    posting_read_ = true;
  }
  std::optional<grpc::Status> finish = PostHeldRead();
  if (finish.has_value()) FinishWith(*std::move(finish));
}

void ReduceReactor::Answer(const Contribution& key, size_t bytes,
                           const RoundOutcome& outcome) {
  const grpc::ByteBuffer* next = nullptr;
  std::optional<grpc::Status> finish;
  bool post_read = false;
  {
    absl::MutexLock lock(&mu_);
    --pending_;
    held_bytes_ -= static_cast<int64_t>(bytes);
    last_active_ = Now();
    if (read_held_ && pending_ == 0) {
      read_held_ = false;
      streams_->Unhold(this);
      post_read = !cancelled_ && !finished_;
      posting_read_ = post_read;
    }
    if (!cancelled_ && !finished_) {
      queue_.push_back(EncodedResult(key, outcome));
      held_bytes_ += static_cast<int64_t>(queue_.back().Length());
      if (!writing_) {
        writing_ = true;
        next = &queue_.front();
      }
    }
    finish = TakeFinish();
  }
  if (next != nullptr) Write(next);
  // After the write, so the two leave in one packet.
  if (post_read) finish = PostHeldRead();
  if (finish.has_value()) FinishWith(*std::move(finish));
}

void ReduceReactor::OnWriteDone(bool ok) {
  const grpc::ByteBuffer* next = nullptr;
  std::optional<grpc::Status> finish;
  bool resume_reading = false;
  {
    absl::MutexLock lock(&mu_);
    held_bytes_ -= static_cast<int64_t>(queue_.front().Length());
    queue_.pop_front();
    last_active_ = Now();
    if (!ok) cancelled_ = true;  // the stream is broken
    if (cancelled_) {
      for (const grpc::ByteBuffer& r : queue_) {
        held_bytes_ -= static_cast<int64_t>(r.Length());
      }
      queue_.clear();
    }
    if (read_paused_ && !cancelled_ && RoomLocked()) {
      read_paused_ = false;
      resume_reading = true;
    }
    if (queue_.empty()) {
      writing_ = false;
      finish = TakeFinish();
    } else {
      next = &queue_.front();  // deque references survive push_back
    }
  }
  // As in OnReadDone, a reaction: safe even after Finish.
  if (resume_reading) StartRead(&request_);
  if (next != nullptr) Write(next);
  if (finish.has_value()) FinishWith(*std::move(finish));
}

void ReduceReactor::Close() {
  CloseWith(ToGrpcStatus(absl::UnavailableError(
      "the server is shutting down; reconnect to a running server and "
      "resend what is unanswered")));
}

void ReduceReactor::CloseWith(grpc::Status status) {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (!closing_) {
      closing_ = true;
      close_status_ = std::move(status);
    }
    finish = TakeFinish();
  }
  if (finish.has_value()) FinishWith(*std::move(finish));
}

bool ReduceReactor::CloseIfIdle(absl::Time now, absl::Duration timeout) {
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || finished_ || pending_ > 0 || !queue_.empty() ||
        now - last_active_ < timeout) {
      return false;
    }
    closing_ = true;
    close_status_ = ToGrpcStatus(absl::UnavailableError(
        absl::StrCat("the stream was idle for ",
                     absl::ToInt64Milliseconds(now - last_active_),
                     " ms, past the server's --stream_idle_timeout_ms=",
                     absl::ToInt64Milliseconds(timeout),
                     "; open a new stream to send more (the syncnorm "
                     "clients do so by themselves)")));
    finish = TakeFinish();
  }
  if (finish.has_value()) FinishWith(*std::move(finish));
  return true;
}

// Holds a reference while it runs. gRPC calls OnDone only after OnCancel
// has returned, but orders the two with an atomic inside libgrpc++; the
// reference orders our deletion after OnCancel in our own code, where
// ThreadSanitizer sees it too.
void ReduceReactor::OnCancel() {
  Ref();
  std::optional<grpc::Status> finish;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    finish = TakeFinish();
  }
  if (finish.has_value()) FinishWith(*std::move(finish));
  Unref();
}

std::optional<grpc::Status> ReduceReactor::TakeFinish() {
  if (finished_ || writing_ || posting_read_) return std::nullopt;
  std::optional<grpc::Status> finish;
  if (cancelled_) {
    finish = grpc::Status::CANCELLED;
  } else if (reads_done_ && pending_ == 0 && queue_.empty()) {
    finish = grpc::Status::OK;
  } else if (closing_ && pending_ == 0 && queue_.empty()) {
    finish = close_status_;
  }
  if (!finish.has_value()) return std::nullopt;
  finished_ = true;
  // A cancelled stream ends with its contribution unanswered. It forgets
  // its held read now: the StreamSet may be gone by the time the answer
  // comes (at shutdown).
  if (read_held_) {
    read_held_ = false;
    streams_->Unhold(this);
  }
  return finish;
}

void ReduceReactor::OnDone() {
  if (outcome_ != nullptr) {
    if (std::optional<CallOutcome::Result> r = outcome_->Done()) {
      for (const std::unique_ptr<CallObserver>& o : observers_) o->Ended(*r);
    }
  }
  if (streams_ != nullptr) streams_->Leave(this);
  Unref();
}

}  // namespace syncnorm
