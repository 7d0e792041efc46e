// The relay's calls to the aggregator shards: one channel per shard, the
// asynchronous API on the relay's RpcLoop queue (no thread waits on a
// call, and no thread of gRPC's callback API polls beside the loop's:
// server/rpc/rpc_loop.h), resends of what a shard could not take.
#ifndef SYNCNORM_RELAY_UPSTREAM_H_
#define SYNCNORM_RELAY_UPSTREAM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/security/credentials.h"
#include "relay/timer_queue.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

// The relay's calls to the shards since it started.
struct UpstreamCounters {
  // Calls by method (kReduceOnce, kGetJob): a contribution sent counts
  // once, however often it was resent.
  enum Method { kReduceOnce, kGetJob, kMethods };
  std::array<int64_t, kMethods> calls{};
  // Resends of a ReduceOnce after UNAVAILABLE.
  int64_t retries = 0;
  // Calls that ended in an error (after their resends), by method and
  // code; a TLS mismatch is FAILED_PRECONDITION.
  std::array<std::array<int64_t, 17>, kMethods> failures{};
};

// Thread-safe. Callbacks run on the thread that polls `cq` (the relay's
// RpcLoop) or the timer queue's, never inline in the call that starts
// them, and never under a lock of this class.
//
// A shard the relay cannot talk to for a TLS mismatch (relay_tls.h
// ClassifyConnectFailure; a closed connection after a probe showed the
// shard speaks TLS) fails its calls at once, FAILED_PRECONDITION naming
// the shard and the --upstream_tls* flags (UpstreamTlsMismatch), instead
// of resending them as for a shard that is down.
class Upstream {
 public:
  // Resends start after this and double up to kMaxBackoff.
  static constexpr absl::Duration kInitialBackoff = absl::Milliseconds(20);
  static constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
  // GetJob's deadline.
  static constexpr absl::Duration kGetJobTimeout = absl::Seconds(10);

  // A closed connection's probe (relay_tls.h) holds for this long.
  static constexpr absl::Duration kProbeValid = absl::Seconds(10);
  static constexpr absl::Duration kProbeTimeout = absl::Seconds(2);

  // `shards`: addresses in ordinal order (not empty); `parent`: a parent
  // relay's address, which then takes every Reduce (GetJob still goes to
  // the shards), or empty; `token`: sent as `authorization: Bearer` when
  // not empty; `credentials`: every channel's (relay_tls.h
  // MakeUpstreamCredentials), TLS ones when `tls`. The calls complete on
  // `cq`, whose tags are CqTags (server/rpc/rpc_loop.h) and which is
  // polled until Shutdown() returned. `timers` and `cq` outlive this.
  Upstream(std::vector<std::string> shards, const std::string& parent,
           std::string token,
           std::shared_ptr<grpc::ChannelCredentials> credentials,
           TimerQueue& timers, grpc::CompletionQueue* cq, bool tls = false);
  // Shutdown().
  ~Upstream();

  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

  int num_shards() const { return static_cast<int>(stubs_.size()); }

  // The shard's answer to one ReduceOnce: its status and, when OK, result.
  using ReduceDone = std::function<void(const grpc::Status&, v1::RoundResult)>;
  // Sends `c` to shard `shard`, or to the parent relay when there is one
  // (which sends it on to that shard), as ReduceOnce with no deadline of
  // its own, and
  // resends it while the shard is unreachable (UNAVAILABLE: not started,
  // or a connection that broke) until `deadline`: the shard's idempotency
  // makes a resend of the same contribution safe. `done` runs once.
  void Reduce(int shard, v1::Contribution c, absl::Time deadline,
              ReduceDone done) ABSL_LOCKS_EXCLUDED(mu_);

  using JobDone = std::function<void(absl::StatusOr<v1::JobInfo>)>;
  // GetJob of `job_id` on shard `shard`, within kGetJobTimeout.
  void GetJob(int shard, const std::string& job_id, JobDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the calls in flight and waits until their callbacks returned
  // (so `cq` must still be polled); later calls fail UNAVAILABLE.
  // Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  UpstreamCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ReduceCall;
  // What the relay knows of its TLS with one shard.
  struct ShardTls {
    bool probing = false;
    absl::Time probed_at = absl::InfinitePast();
    bool speaks_tls = false;  // the last probe's verdict
    bool logged = false;      // the mismatch was logged
  };

  // A failed call's status to `shard`: FAILED_PRECONDITION for a TLS
  // mismatch (UpstreamTlsMismatch), else nullopt (resend if UNAVAILABLE).
  // Starts a probe for a closed connection when none is fresh.
  std::optional<grpc::Status> Mismatch(int shard, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Probe(int shard) ABSL_LOCKS_EXCLUDED(mu_);
  void Failed(UpstreamCounters::Method method, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);

  void Attempt(std::shared_ptr<ReduceCall> call) ABSL_LOCKS_EXCLUDED(mu_);
  void Attempted(std::shared_ptr<ReduceCall> call, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Registers a call's context; false once shutting down.
  bool Begin(const std::shared_ptr<grpc::ClientContext>& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After the call's callback did all it does.
  void End(const std::shared_ptr<grpc::ClientContext>& context)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A context with the token and `deadline` (none when infinite).
  std::shared_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;

  // Constant after construction.
  const std::string authorization_;  // "Bearer <token>", or empty
  TimerQueue& timers_;
  grpc::CompletionQueue* const cq_;
  const bool tls_;
  const std::vector<std::string> addresses_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> stubs_;
  std::unique_ptr<v1::Aggregator::Stub> parent_stub_;  // null: none

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  UpstreamCounters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<ShardTls> shard_tls_ ABSL_GUARDED_BY(mu_);
  // Made at a shard's first probe.
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> probes_
      ABSL_GUARDED_BY(mu_);
  // Calls in flight (a resend waiting for its time is the timer queue's:
  // stop it before destroying this).
  // Shared, so that Shutdown may cancel one outside the lock (a cancel
  // may run the call's callback on its own thread).
  std::set<std::shared_ptr<grpc::ClientContext>> in_flight_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_RELAY_UPSTREAM_H_
