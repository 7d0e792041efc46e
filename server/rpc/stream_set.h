// The admission of a service's Reduce streams: their number
// (--max_streams), the closing of idle ones (--stream_idle_timeout_ms) and
// of all at shutdown, and the release of the reads they hold back.
#ifndef SYNCNORM_SERVER_RPC_STREAM_SET_H_
#define SYNCNORM_SERVER_RPC_STREAM_SET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/domain/clock.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

class ReduceReactor;

// An admission counter (the shape in server/domain/limits.h) that also
// knows its streams, to close them. Thread-safe.
//
// Held reads: a stream whose one contribution waits for its round may hold
// back its next read until it answers (see ReduceReactor), so that the
// answer's write carries the flow-control update a pending read would send
// in a packet of its own. A client that needs its next message read before
// that answer can come (it pipelines its rounds) must not wait forever: a
// thread of the set posts every read held for kHoldTick or more (at most
// twice that), and the stream then reads eagerly once it sees pipelining.
// The thread sleeps while no read is held.
class StreamSet {
 public:
  static constexpr absl::Duration kHoldTick = absl::Milliseconds(5);

  // max_streams <= 0: no limit. With a positive idle_timeout a thread ends,
  // every idle_timeout / 4 (between 10 ms and 1 s), each stream that has
  // been idle that long by `clock` (see ReduceReactor::CloseIfIdle);
  // otherwise idle streams stay open. `clock` must outlive the set.
  StreamSet(int max_streams, absl::Duration idle_timeout, const Clock* clock);
  // Stops the threads. REQUIRES: no stream is open.
  ~StreamSet();

  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;

  // Registers an opening stream: OK (call Leave(stream) once gRPC is done
  // with it), RESOURCE_EXHAUSTED at the limit (naming --max_streams),
  // UNAVAILABLE once CloseAll was called.
  absl::Status Enter(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: a matching Enter(stream) returned OK.
  void Leave(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks every open stream to end (UNAVAILABLE, "shutting down") once it
  // has answered every contribution it read; refuses new ones.
  void CloseAll() ABSL_LOCKS_EXCLUDED(mu_);

  // Ends the streams idle for idle_timeout or longer now (what the thread
  // does); returns how many.
  int CloseIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // `stream` holds back its next read until Unhold(stream), or until the
  // set's thread calls stream->ReleaseHeldRead() at least kHoldTick later.
  // REQUIRES: the stream stays alive while held (a contribution of it waits
  // for its answer, whose path calls Unhold); it is not held already.
  void Hold(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(held_mu_);
  // Forgets `stream`'s held read, if the thread has not released it yet.
  void Unhold(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(held_mu_);

  int size() const ABSL_LOCKS_EXCLUDED(mu_);
  const Clock& clock() const { return *clock_; }

  // Tests: the streams held now.
  int held_for_test() const ABSL_LOCKS_EXCLUDED(held_mu_);
  // Tests: every set's thread calls `before` once it has taken streams
  // to release and before it releases them, and `after` once it has;
  // empty functions: nothing. Process-wide.
  using ReleaseHook = std::function<void(StreamSet&)>;
  static void SetReleaseHooksForTest(ReleaseHook before, ReleaseHook after);
  absl::Duration idle_timeout() const { return idle_timeout_; }

 private:
  // Constant after construction.
  const int max_streams_;
  const absl::Duration idle_timeout_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<ReduceReactor*> open_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;

  // Releases held reads every kHoldTick while any is held.
  void ReleaseLoop() ABSL_LOCKS_EXCLUDED(held_mu_);
  bool HeldOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(held_mu_) {
    return stop_ || !held_.empty();
  }

  // Taken under a held stream's own mutex, never with mu_.
  mutable absl::Mutex held_mu_;
  // Each held stream, with the tick it was held in.
  absl::flat_hash_map<ReduceReactor*, int64_t> held_ ABSL_GUARDED_BY(held_mu_);
  int64_t tick_ ABSL_GUARDED_BY(held_mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(held_mu_) = false;
  // Notified with stop_ set; the thread waits out a tick on it, not on
  // held_mu_, so that Hold and Unhold unlock with no waiter to check.
  absl::Notification stopping_;

  // Calls CloseIdle(); null without an idle timeout. Last, with the
  // releaser: started once the rest is built, stopped before any of it
  // goes.
  std::unique_ptr<PeriodicThread> sweeper_;
  std::thread releaser_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_STREAM_SET_H_
