// The admission of a service's Reduce streams: their number
// (--max_streams), the closing of idle ones (--stream_idle_timeout_ms) and
// of all at shutdown.
#ifndef SYNCNORM_SERVER_RPC_STREAM_SET_H_
#define SYNCNORM_SERVER_RPC_STREAM_SET_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/clock.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

class ReduceReactor;

// An admission counter (the shape in server/domain/limits.h) that also
// knows its streams, to close them. Thread-safe.
class StreamSet {
 public:
  // max_streams <= 0: no limit. With a positive idle_timeout a thread ends,
  // every idle_timeout / 4 (between 10 ms and 1 s), each stream that has
  // been idle that long by `clock` (see ReduceReactor::CloseIfIdle);
  // otherwise idle streams stay open. `clock` must outlive the set.
  StreamSet(int max_streams, absl::Duration idle_timeout, const Clock* clock);
  // Stops the thread. REQUIRES: no stream is open.
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

  int size() const ABSL_LOCKS_EXCLUDED(mu_);
  const Clock& clock() const { return *clock_; }
  absl::Duration idle_timeout() const { return idle_timeout_; }

 private:
  // Constant after construction.
  const int max_streams_;
  const absl::Duration idle_timeout_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<ReduceReactor*> open_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Calls CloseIdle(); null without an idle timeout. Last: started once
  // the rest is built, stopped before any of it goes.
  std::unique_ptr<PeriodicThread> sweeper_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_STREAM_SET_H_
