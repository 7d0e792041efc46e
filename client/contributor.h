// One contributor's long-lived Reduce stream to the aggregator.
#ifndef SYNCNORM_CLIENT_CONTRIBUTOR_H_
#define SYNCNORM_CLIENT_CONTRIBUTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client_clock.h"
#include "client/client_options.h"
#include "client/forward_reply.h"
#include "client/relay_fallback.h"
#include "grpcpp/channel.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"
#include "wire/round_error.h"  // kRoundErrorReasonUrl, for callers

namespace syncnorm {

// Sends one rank's contributions of a job over one bidirectional Reduce
// stream and waits for each round's result.
//
// The stream is opened on first use. When it breaks (server restart,
// network), the rounds in flight are resent on a new stream after a backoff,
// until ClientOptions::round_timeout; the server's idempotency makes the
// resend safe. A failed round (DEADLINE_EXCEEDED naming missing ranks, a bad
// contribution, ...) is returned as its status.
//
// No thread reads the stream on its own: a caller waiting for a result reads
// it itself (one reader at a time; a result for another caller is handed
// over), so the usual one-round-at-a-time caller pays no thread hand-off per
// round. A watchdog thread, which sleeps while every read is within its
// deadline, cancels the stream once when the reading caller's round timeout
// passes (and then sleeps until another read starts); the reader returns
// DEADLINE_EXCEEDED and the other callers resend on a new stream. So every
// call returns within about its round timeout, and the contributor serves
// the next round on a new stream.
//
// A relay's contributor (the channel reaches a relay) may have a fallback:
// a round whose stream broke, with no connection to the relay again within
// ClientOptions::connect_timeout, goes on to the fallback, and so do the
// later rounds while RelayFallback::RouteOf says so (and a round on
// probation that the relay does not answer within connect_timeout; see
// RelayFallback). Errors that are the
// round's own answer (in-band, or a stream the server ended with a status
// other than UNAVAILABLE, CANCELLED, UNKNOWN or INTERNAL) are returned.
//
// Thread-safe: several threads may run rounds at once (say, different
// layers); each waits for its own result.
class Contributor {
 public:
  // `clock` times round deadlines, backoff and the watchdog; null: the wall
  // clock. Not owned; it must outlive the contributor. `fallback`: where
  // rounds go when the relay behind `channel` is unreachable; null: none
  // (rounds wait for the server until the round timeout).
  Contributor(std::shared_ptr<grpc::Channel> channel, std::string job_id,
              int rank, const ClientOptions& options,
              const ClientClock* clock = nullptr,
              std::unique_ptr<RelayFallback> fallback = nullptr);
  ~Contributor();
  Contributor(const Contributor&) = delete;
  Contributor& operator=(const Contributor&) = delete;

  const std::string& job_id() const { return job_id_; }
  int rank() const { return rank_; }

  // Sends local moments (count 0 with zeros for an empty batch), with the
  // round's momentum and imported statistics if `update` has them, and
  // returns the group's global statistics.
  absl::StatusOr<ForwardReply> ReduceForward(int layer, int64_t step,
                                             const Moments& local,
                                             const RoundUpdate& update = {});

  // Sends local gradient sums for backward `backward` through the step's
  // forward (from 0; each index is its own round) and returns the group's
  // summed sums. INVALID_ARGUMENT for a negative index.
  absl::StatusOr<GradSums> ReduceBackward(int layer, int64_t step, int backward,
                                          const GradSums& local);

  // Sends any contribution and returns its result (errors as status),
  // within ClientOptions::round_timeout.
  absl::StatusOr<v1::RoundResult> Round(const v1::Contribution& c);

  // The same on this contributor's own stream, never the fallback, by
  // `deadline` (then DEADLINE_EXCEEDED).
  absl::StatusOr<v1::RoundResult> RoundUntil(const v1::Contribution& c,
                                             absl::Time deadline);

 private:
  // layer, step, phase, backward_index (0 for a FORWARD): a round as its
  // contribution names it and its result echoes it.
  using Key = std::tuple<int, int64_t, int, int>;
  struct Stream;
  struct Slot {
    bool done = false;
    v1::RoundResult result;
  };

  // RoundUntil(c, deadline) for a round that must end by `round_deadline`
  // (at or after `deadline`). With `unreachable` (may be null), it also
  // gives up when the stream broke and the channel is not READY again
  // within `unreachable_after`, or when `deadline` passes before
  // `round_deadline` without an answer: then sets *unreachable and returns
  // UNAVAILABLE.
  absl::StatusOr<v1::RoundResult> RoundOnStream(
      const v1::Contribution& c, absl::Time deadline, absl::Time round_deadline,
      absl::Duration unreachable_after, bool* unreachable)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits at most `bound` (and not past `deadline`) for the channel to be
  // READY; whether it is not, with time left before `deadline`.
  bool Unreachable(absl::Duration bound, absl::Time deadline) const;
  // The current stream, opening one if there is none or it broke.
  std::shared_ptr<Stream> CurrentStream() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the slot is done, the stream breaks, or the deadline; reads
  // the stream meanwhile whenever no other caller does.
  void AwaitSlot(const Slot& slot, const std::shared_ptr<Stream>& stream,
                 absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads one result (mu_ released meanwhile) and hands it to its slot;
  // marks the stream broken when the read fails.
  void ReadOne(Stream& stream, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the stream of a read that outlived its caller's deadline, once
  // per stream.
  void Watchdog() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a stream no round uses any more (the destructor's): half-closes
  // it and waits for the server to end it, cancelling it if that takes
  // more than a second.
  static void EndStream(Stream& stream);
  // A message of `phase` (FORWARD or BACKWARD) for the next round: a used
  // one when there is one (its repeated fields keep their capacity, so a
  // round allocates nothing to build it), else a new one.
  std::unique_ptr<v1::Contribution> TakeMessage(v1::Phase phase)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReturnMessage(std::unique_ptr<v1::Contribution> m)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Aggregator::Stub> stub_;
  const std::string job_id_;
  const int rank_;
  const ClientOptions options_;
  const RealClientClock real_clock_;
  const ClientClock* const clock_;
  const std::unique_ptr<RelayFallback> fallback_;  // null: none

  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);  // one writer at a time
  absl::Mutex mu_;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Slot*> slots_ ABSL_GUARDED_BY(mu_);
  // The read in progress (at most one, on the current stream): its stream
  // and its caller's deadline; null when none.
  Stream* read_stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time read_deadline_ ABSL_GUARDED_BY(mu_);
  // When the watchdog wakes next by itself.
  absl::Time watch_until_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Used messages, FORWARD and BACKWARD.
  std::vector<std::unique_ptr<v1::Contribution>> spare_[2] ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CONTRIBUTOR_H_
