// The client's source of time, injectable so tests control round deadlines,
// reconnect backoff and the watchdog.
#ifndef SYNCNORM_CLIENT_CLIENT_CLOCK_H_
#define SYNCNORM_CLIENT_CLIENT_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace syncnorm {

// Tells the time, sleeps and waits with a deadline, all in one time base.
// Implementations are thread-safe.
class ClientClock {
 public:
  virtual ~ClientClock() = default;

  virtual absl::Time Now() const = 0;

  // Returns after `d` of this clock's time has passed (at once for d <= 0).
  virtual void SleepFor(absl::Duration d) const = 0;

  // Like absl::Mutex::AwaitWithDeadline with `deadline` on this clock:
  // releases `mu` until `condition` holds or Now() >= deadline, reacquires
  // it, and returns whether `condition` holds.
  virtual bool AwaitWithDeadline(absl::Mutex& mu,
                                 const absl::Condition& condition,
                                 absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // Returns once `channel` is READY or Now() >= deadline, asking it to
  // connect. Unlike a sleep, the wait polls the channel's connection
  // attempt, which otherwise only gRPC's backup poller does (every 5 s)
  // while no call of this process waits on the channel.
  virtual void AwaitReady(grpc::Channel& channel,
                          absl::Time deadline) const = 0;
};

// The wall clock: absl::Now(), absl::SleepFor, absl::Mutex's own deadlines.
class RealClientClock final : public ClientClock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) const override { absl::SleepFor(d); }
  bool AwaitWithDeadline(absl::Mutex& mu, const absl::Condition& condition,
                         absl::Time deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu.AwaitWithDeadline(condition, deadline);
  }
  void AwaitReady(grpc::Channel& channel, absl::Time deadline) const override {
    grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
    while (state != GRPC_CHANNEL_READY &&
           channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      state = channel.GetState(/*try_to_connect=*/true);
    }
  }
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CLIENT_CLOCK_H_
