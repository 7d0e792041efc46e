// Where a relay's client sends the rounds its relay cannot take.
#ifndef SYNCNORM_CLIENT_RELAY_FALLBACK_H_
#define SYNCNORM_CLIENT_RELAY_FALLBACK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client_clock.h"
#include "client/client_options.h"
#include "grpcpp/channel.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

class Contributor;

// One rank's way around its relay (ClientOptions::relay_fallback): the
// rounds go to each layer's shard, each shard over a Contributor of its
// own (opened on first use), as a client without a relay sends them. The
// shard tells a rank's resend from a conflicting contribution whichever way
// the first copy came (directly, or inside a relay's merged block), so a
// round the relay may have forwarded before it died is answered, not
// counted twice.
//
// Once fallen back, the rank stays on the shards until a step of a later
// window of kStepsPerWindow steps finds the relay's channel READY: the
// ranks of a block, which lose their relay in the same round, then return
// in the same step, and the relay's block is complete again. A rank that
// returns a window before the rest of its block (its channel was READY
// sooner) would wait in the relay's incomplete block until the
// pass-through margin, round after round: so in the window it returns in,
// a round the relay does not answer within connect_timeout goes to the
// shard too (exact: the shard answers whichever copy comes second as a
// retry), and the rank waits on the shards for the next window. Meanwhile a
// thread of its own waits on the relay's channel, so that its connection
// attempts are polled and READY is seen as soon as the relay is back.
//
// Thread-safe.
class RelayFallback {
 public:
  // Steps are grouped in windows [k * kStepsPerWindow, (k+1) *
  // kStepsPerWindow); a rank on the shards looks at its relay at the first
  // round of each new window.
  static constexpr int64_t kStepsPerWindow = 8;

  // `relay` reaches the relay; `shards[i]` shard i, in ordinal order.
  // `clock` as Contributor's (null: the wall clock; not owned).
  // REQUIRES: shards not empty.
  RelayFallback(std::shared_ptr<grpc::Channel> relay,
                std::vector<std::shared_ptr<grpc::Channel>> shards,
                std::string job_id, int rank, const ClientOptions& options,
                const ClientClock* clock = nullptr);
  ~RelayFallback();
  RelayFallback(const RelayFallback&) = delete;
  RelayFallback& operator=(const RelayFallback&) = delete;

  // Where a round goes.
  enum class Route {
    kRelay,      // the relay, as long as it is reachable
    kShards,     // the layer's shard
    kProbation,  // the relay, which must answer within connect_timeout
  };

  // The route of a round of `step`: kShards after a fallback, until the
  // first round of a new window finds the relay READY; the rounds of that
  // window then are on probation, and those of later windows kRelay.
  Route RouteOf(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // Records that the relay could not take a round of `step` (unreachable,
  // or no answer on probation): the rounds go to the shards from now on,
  // as RouteOf says.
  void RelayUnreachable(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends `c` to the shard of its layer and returns its result, or its
  // error (DEADLINE_EXCEEDED at `deadline`), as Contributor::RoundUntil.
  absl::StatusOr<v1::RoundResult> Round(const v1::Contribution& c,
                                        absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The contributor of the shard that holds `layer`.
  Contributor& For(int layer) ABSL_LOCKS_EXCLUDED(mu_);
  // The prober's loop: while the rank is on the shards, waits for the
  // relay's channel to connect.
  void Probe() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  const std::shared_ptr<grpc::Channel> relay_;
  const std::vector<std::shared_ptr<grpc::Channel>> shards_;
  const std::string job_id_;
  const int rank_;
  const ClientOptions options_;
  const ClientClock* const clock_;

  absl::Mutex mu_;
  Route route_ ABSL_GUARDED_BY(mu_) = Route::kRelay;
  // The window of the step at which the route last changed.
  int64_t window_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // One per shard, null until first used; never replaced once made.
  std::vector<std::unique_ptr<Contributor>> contributors_ ABSL_GUARDED_BY(mu_);
  std::thread prober_ ABSL_GUARDED_BY(mu_);  // started at the first fallback
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_RELAY_FALLBACK_H_
