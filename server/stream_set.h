// The open Reduce streams of a service: their number (--max_streams) and
// their closing at shutdown.
#ifndef SYNCNORM_SERVER_STREAM_SET_H_
#define SYNCNORM_SERVER_STREAM_SET_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace syncnorm {

class ReduceReactor;

// Thread-safe.
class StreamSet {
 public:
  // max_streams <= 0: no limit.
  explicit StreamSet(int max_streams) : max_streams_(max_streams) {}

  // Registers an opening stream: OK, RESOURCE_EXHAUSTED at the limit
  // (naming --max_streams), UNAVAILABLE once CloseAll was called.
  absl::Status Add(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: `stream` was added, and is not removed yet.
  void Remove(ReduceReactor* stream) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks every open stream to end (UNAVAILABLE, "shutting down") once it
  // has answered every contribution it read; refuses new ones.
  void CloseAll() ABSL_LOCKS_EXCLUDED(mu_);

  int size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int max_streams_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<ReduceReactor*> open_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STREAM_SET_H_
