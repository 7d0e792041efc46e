// One contributor's long-lived Reduce stream to the aggregator.
#ifndef SYNCNORM_CLIENT_CONTRIBUTOR_H_
#define SYNCNORM_CLIENT_CONTRIBUTOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client_options.h"
#include "grpcpp/channel.h"
#include "kernels/moments.h"
#include "syncnorm/v1/aggregator.grpc.pb.h"

namespace syncnorm {

// The answer to a forward round.
struct ForwardReply {
  GlobalMoments global;
  int64_t version = 0;  // the layer's running-stats version after the round
};

// Sends one rank's contributions of a job over one bidirectional Reduce
// stream and waits for each round's result.
//
// The stream is opened on first use. When it breaks (server restart,
// network), the rounds in flight are resent on a new stream after a backoff,
// until ClientOptions::round_timeout; the server's idempotency makes the
// resend safe. A failed round (DEADLINE_EXCEEDED naming missing ranks, a bad
// contribution, ...) is returned as its status.
//
// Thread-safe: several threads may run rounds at once (say, different
// layers); each waits for its own result.
class Contributor {
 public:
  Contributor(std::shared_ptr<grpc::Channel> channel, std::string job_id,
              int rank, const ClientOptions& options);
  ~Contributor();
  Contributor(const Contributor&) = delete;
  Contributor& operator=(const Contributor&) = delete;

  const std::string& job_id() const { return job_id_; }
  int rank() const { return rank_; }

  // Sends local moments (count 0 with zeros for an empty batch) and returns
  // the group's global statistics.
  absl::StatusOr<ForwardReply> ReduceForward(int layer, int64_t step,
                                             const Moments& local);

  // Sends local gradient sums and returns the group's summed sums.
  absl::StatusOr<GradSums> ReduceBackward(int layer, int64_t step,
                                          const GradSums& local);

  // Sends any contribution and returns its result (errors as status).
  absl::StatusOr<v1::RoundResult> Round(const v1::Contribution& c);

 private:
  using Key = std::tuple<int, int64_t, int>;  // layer, step, phase
  struct Stream;
  struct Slot {
    bool done = false;
    v1::RoundResult result;
  };

  // The current stream, opening one if there is none or it broke.
  std::shared_ptr<Stream> CurrentStream() ABSL_LOCKS_EXCLUDED(mu_);
  void ReadLoop(std::shared_ptr<Stream> stream);
  // Waits until the slot is done, the stream breaks, or the deadline.
  void AwaitSlot(const Slot& slot, const Stream& stream, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::unique_ptr<v1::Aggregator::Stub> stub_;
  const std::string job_id_;
  const int rank_;
  const ClientOptions options_;

  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);  // one writer at a time
  absl::Mutex mu_;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Slot*> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_CONTRIBUTOR_H_
