// The server side of one Reduce stream.
#ifndef SYNCNORM_SERVER_RPC_REDUCE_REACTOR_H_
#define SYNCNORM_SERVER_RPC_REDUCE_REACTOR_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "server/domain/aggregator.h"
#include "server/domain/clock.h"
#include "server/domain/contribution.h"
#include "server/rpc/async_call.h"
#include "server/rpc/auth.h"
#include "server/rpc/call_observer.h"
#include "server/rpc/call_outcome.h"
#include "server/rpc/ref_counted_reactor.h"

namespace syncnorm {

class StreamSet;

// Reads contributions and hands each to the Aggregator; every outcome is
// queued as a RoundResult and written one at a time, in completion order.
// The stream carries serialized messages (the method is raw): it parses
// each Contribution itself, and writes a round's answer as the bytes
// EncodedResult made once for all of the round's streams.
// Failed rounds go in-band; the stream ends (OK) once the client half-closes
// and every result is written, or (CANCELLED) when the call is cancelled or a
// write fails.
//
// With an Authenticator, a stream whose `authorization` metadata holds no
// token in force ends at once (UNAUTHENTICATED), before it counts against
// StreamSet's limit. Each contribution is then checked against that token
// at the time it is read, so a revoked token stops working on open streams
// too; a refused one is answered in-band (RoundError UNAUTHENTICATED or
// PERMISSION_DENIED) and the stream stays usable.
//
// Limits: a stream beyond StreamSet's limit ends at once
// (RESOURCE_EXHAUSTED). A stream that reads, answers and writes nothing
// for StreamSet's idle timeout ends UNAVAILABLE (CloseIfIdle). A message over
// max_message_bytes is answered in-band (RoundError RESOURCE_EXHAUSTED naming
// --max_message_bytes; its job, layer, step and phase echoed) and goes no
// further; the stream stays usable. What one stream holds is bounded: while
// kMaxUnanswered contributions are unanswered or results unwritten, or they
// hold kHeldMessages x max_message_bytes (a client that sends without reading,
// or sends faster than its rounds complete), no more contributions are
// read. Close() (shutdown) ends the stream UNAVAILABLE once every
// contribution it read is answered and written. A message that is no
// syncnorm.v1.Contribution ends it INVALID_ARGUMENT the same way.
//
// Reads: the next read is posted once a contribution is with the
// aggregator, except on a stream that sends one contribution at a time
// (a training step's lock step): while its contribution waits for its
// round, the read is held back (StreamSet::Hold) and posted just after the
// answer's write, which then carries the read's flow-control update
// instead of a packet of its own (the waiting client is woken once, not
// twice). A held read is posted anyway after StreamSet::kHoldTick (a client
// may need its next message read before the answer can come); a stream
// that is found to send a contribution while another waits reads eagerly
// from then on.
//
// Observers: gRPC's interceptors skip Reduce calls (call_observer.h), so the
// reactor reports its call's messages and outcome (CallOutcome) to the
// observers it is given.
//
// Threads: its reactions run on the RpcLoop's thread, and so does the
// round a contribution completes (merge, log record, every stream's
// answer): nothing is handed to another thread on a round's path.
//
// Lifetime: deletes itself once gRPC is done with it (OnDone) and every
// aggregator callback it issued has fired (RefCountedReactor); StreamSet
// holds a reference while it closes the stream. Thread-safe.
class ReduceReactor final
    : public RefCountedReactor<
          BidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>> {
 public:
  static constexpr int kMaxUnanswered = 256;
  static constexpr int64_t kHeldMessages = 16;

  // `call` is the stream it serves. `aggregator` must outlive every
  // callback the reactor hands it; `auth` (null: no checks) and `streams`
  // (null: not counted) the reactor. `authorization` is the stream's
  // authorization metadata; `max_message_bytes` <= 0: no limit.
  // `observers` hear of its messages and outcome.
  ReduceReactor(BidiCall<grpc::ByteBuffer, grpc::ByteBuffer>* call,
                Aggregator* aggregator, const Authenticator* auth,
                std::string authorization, StreamSet* streams,
                int64_t max_message_bytes,
                std::vector<std::unique_ptr<CallObserver>> observers = {});

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // See the class comment; for StreamSet.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the stream (UNAVAILABLE, naming --stream_idle_timeout_ms) if it
  // holds no contribution or result and has read or written nothing since
  // `now - timeout`; true if it did.
  bool CloseIfIdle(absl::Time now, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Posts the read held back (see the class comment), if it still is; for
  // StreamSet, once the stream has been held a while.
  void ReleaseHeldRead() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ~ReduceReactor() override = default;

  // Queues the answer to `key`, a contribution that held `bytes`; called
  // by the aggregator exactly once per contribution, from any thread.
  void Answer(const Contribution& key, size_t bytes,
              const RoundOutcome& outcome) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the stream holds all it may (no more reads), and whether a
  // paused one holds little enough again (half) to read on.
  bool FullLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const {
    return clock_ != nullptr ? clock_->Now() : absl::Now();
  }
  // Holds back the next read, after OnReadDone handed the aggregator a
  // contribution, if the stream waits for that answer alone; true if it
  // did.
  bool HoldRead() ABSL_LOCKS_EXCLUDED(mu_);
  // Posts a read held back, once posting_read_ was set (which keeps the
  // stream from finishing meanwhile); returns what TakeFinish says after.
  std::optional<grpc::Status> PostHeldRead() ABSL_LOCKS_EXCLUDED(mu_);
  // Decides, under mu_, whether the stream may finish now; marks it so.
  std::optional<grpc::Status> TakeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finish, noted for the observers.
  void FinishWith(grpc::Status status);
  // StartWrite, counted for the observers.
  void Write(const grpc::ByteBuffer* result);
  // Ends the stream with `status` once what it read is answered and
  // written, reading nothing more.
  void CloseWith(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  Aggregator* const aggregator_;
  const Authenticator* const auth_;
  const std::string authorization_;  // a secret: never logged
  absl::Status refused_;  // why it was refused at its start, if it was
  // Null when refused or not counted. Set once, in the constructor, once
  // every other member is built: StreamSet's threads reach the stream as
  // soon as it is registered.
  StreamSet* streams_ = nullptr;
  // StreamSet's clock, which outlives the aggregator (and so every
  // callback); null: the wall clock. The StreamSet itself may be gone when
  // the aggregator answers at shutdown.
  const Clock* const clock_;
  const int64_t max_message_bytes_;  // <= 0: no limit
  // Constant after construction (the observers are thread-safe). outcome_
  // is null without observers.
  const std::vector<std::unique_ptr<CallObserver>> observers_;
  const std::unique_ptr<CallOutcome> outcome_;
  // Only the read path touches it, and only one read is outstanding.
  grpc::ByteBuffer request_;

  absl::Mutex mu_;
  // Results not yet written; the front is in flight while writing_.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // What the stream ends with once closing_ (shutdown, idle, a message
  // that is no Contribution).
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
  // When it last read, answered or wrote anything (StreamSet's clock).
  absl::Time last_active_ ABSL_GUARDED_BY(mu_);
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  // The next read waits for the answer (HoldRead); a thread is posting a
  // read held back, outside mu_; the stream sent a contribution while
  // another waited, or has no StreamSet to release a held read: no holds.
  bool read_held_ ABSL_GUARDED_BY(mu_) = false;
  bool posting_read_ ABSL_GUARDED_BY(mu_) = false;
  bool eager_reads_ ABSL_GUARDED_BY(mu_) = false;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // contributions not yet answered
  // Serialized bytes of the unanswered contributions and unwritten results.
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_REDUCE_REACTOR_H_
