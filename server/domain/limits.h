// What one server accepts at most, and the admission of rounds: how many
// may be in flight, and none new while the server shuts down. Knows
// nothing of gRPC.
#ifndef SYNCNORM_SERVER_DOMAIN_LIMITS_H_
#define SYNCNORM_SERVER_DOMAIN_LIMITS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/job_spec.h"

namespace syncnorm {

// Each limit is a flag of the server binary of the same name; exceeding one
// is RESOURCE_EXHAUSTED with a message naming it. Zero or less: no limit.
struct Limits {
  // Largest request message, by its serialized size. gRPC's transport
  // takes messages up to twice this (see ReceiveCeiling) so that the
  // service can refuse the ones above it with a message naming the flag.
  int64_t max_message_bytes = 64 << 20;
  // Jobs on the server.
  int max_jobs = 10000;
  // Layers of one job.
  int max_layers_per_job = 4096;
  // Channels (num_features) of one layer.
  int max_channels = 65536;
  // Contributors (world_size) of one job.
  int max_world_size = 65536;
  // Channels of one job summed over its layers, once per group: the
  // running statistics (and the retry window) a job keeps grow with it.
  int64_t max_channels_per_job = 1 << 22;
  // Rounds in flight (waiting for ranks) across the server.
  int max_pending_rounds = 100000;
  // Open Reduce streams.
  int max_streams = 10000;
  // ReduceOnce and Checkpoint calls in progress, each of which may wait
  // (for its round, for its step to be committed) holding its request.
  int max_waiting_calls = 10000;
};

// RESOURCE_EXHAUSTED "<what> exceeds the server's limit --<flag>=<limit>".
// `holder` names whose limit it is ("relay": a relay's own, so that a rank
// can tell it from a shard's refusal passed on).
absl::Status LimitExceeded(absl::string_view what, absl::string_view flag,
                           int64_t limit, absl::string_view holder = "server");

// A new job's spec against the per-job limits (layers, channels, world
// size, channels per job). OK or RESOURCE_EXHAUSTED naming the limit.
absl::Status CheckJobLimits(const JobSpec& spec, const Limits& limits);

// A received message of `bytes` (serialized) against `max_message_bytes`
// (<= 0: no limit): OK, or RESOURCE_EXHAUSTED naming --max_message_bytes,
// its value and `bytes`. `what` names the message, e.g. "a ReduceOnce
// request"; `holder` as LimitExceeded's.
absl::Status CheckMessageSize(size_t bytes, absl::string_view what,
                              int64_t max_message_bytes,
                              absl::string_view holder = "server");

// The receive limit for gRPC's transport: twice max_message_bytes (at most
// INT32_MAX), so that messages up to there reach CheckMessageSize and get
// its message; larger ones get the transport's own RESOURCE_EXHAUSTED
// ("Received message larger than max"). -1 (none) when max_message_bytes
// is not positive.
int ReceiveCeiling(const Limits& limits);

// --max_transport_bytes (what gRPC's transport may hold; see ServerOptions)
// against the limits: INVALID_ARGUMENT naming both flags when it is below
// ReceiveCeiling(limits), where gRPC would cut off with its own error
// messages that the service is meant to take or refuse naming
// --max_message_bytes; OK otherwise, or when either is not positive.
absl::Status CheckTransportBytes(int64_t max_transport_bytes,
                                 const Limits& limits);

// The server's admission counters share one shape: RoundAdmission (rounds
// in flight, --max_pending_rounds), WaitingCalls (ReduceOnce and Checkpoint
// calls, --max_waiting_calls) and StreamSet (Reduce streams,
// --max_streams). Enter(x) before x holds anything: OK, and then exactly
// one Leave once x is done (Leave(x) where the counter keeps x);
// RESOURCE_EXHAUSTED naming the flag (LimitExceeded) when x would pass the
// limit; UNAVAILABLE once the server takes no new ones (shutting down).
// size() is how many are in now. A limit <= 0 is none.

// The admission of rounds: counts the rounds in flight, by (job, group,
// layer, step, phase), from the contributions that wait for them. A
// contribution enters before it is handed to its round and leaves once it
// is answered. Thread-safe; the hot path takes one of several striped
// locks.
class RoundAdmission {
 public:
  struct Key {
    std::string job_id;
    int group = 0;
    int layer = 0;
    int64_t step = 0;
    int phase = 0;

    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.job_id, k.group, k.layer, k.step,
                        k.phase);
    }
    friend bool operator==(const Key& a, const Key& b) {
      return std::tie(a.job_id, a.group, a.layer, a.step, a.phase) ==
             std::tie(b.job_id, b.group, b.layer, b.step, b.phase);
    }
  };

  // max_rounds <= 0: no limit.
  explicit RoundAdmission(int max_rounds) : max_rounds_(max_rounds) {}

  // Admits a contribution to `key`'s round: OK (call Leave(key) once it is
  // answered); RESOURCE_EXHAUSTED when it would start a round beyond the
  // limit; UNAVAILABLE when it would start a round while draining. A
  // contribution to a round already in flight is always admitted.
  absl::Status Enter(const Key& key);
  // REQUIRES: a matching Enter(key) returned OK.
  void Leave(const Key& key);

  // From now on no new round is admitted.
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // Rounds in flight now.
  int64_t size() const { return rounds_.load(); }

  // Waits until no round is in flight or `deadline`; true when none is.
  bool AwaitIdle(absl::Time deadline) const;

 private:
  static constexpr int kStripes = 16;
  struct Stripe {
    absl::Mutex mu;
    absl::flat_hash_map<Key, int> waiting ABSL_GUARDED_BY(mu);
  };
  Stripe& StripeOf(const Key& key);

  const int max_rounds_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> rounds_{0};
  std::array<Stripe, kStripes> stripes_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_LIMITS_H_
