// The in-process node group: several workers of one process (threads) that
// merge their moments before one contribution goes to the aggregator.
#ifndef SYNCNORM_CLIENT_THREAD_NODE_H_
#define SYNCNORM_CLIENT_THREAD_NODE_H_

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/node_group.h"

namespace syncnorm {

// local_size workers (threads) of one node. Each takes its handle with
// Member(local_rank) and calls the NodeGroup methods; the node folds the
// local moments in local-rank order (so every member gets the same bits
// whatever the arrival order), the thread that arrives last sends the node's
// contribution upstream, and every member gets the global result. Forward
// round updates (SyncForwardWithUpdate) must be the same on every member,
// or the round fails on every member with INVALID_ARGUMENT. A member
// that waits longer than `timeout` for its peers gets DEADLINE_EXCEEDED
// naming the local ranks that did not arrive.
//
// Thread-safe. The node must outlive its members.
class ThreadNode {
 public:
  ThreadNode(int local_size, std::unique_ptr<NodeGroup> upstream,
             absl::Duration timeout);

  int local_size() const { return local_size_; }

  // The NodeGroup of local rank r, 0 <= r < local_size.
  std::unique_ptr<NodeGroup> Member(int local_rank);

 private:
  class MemberGroup;
  // layer, step, phase, backward index (0 for a forward): backwards
  // through one forward are rounds of their own.
  using Key = std::tuple<int, int64_t, int, int>;

  // A member's forward share: its moments and its round update, which must
  // be every member's (`disagree` marks a fold that met another).
  struct ForwardPart {
    Moments moments;
    RoundUpdate update;
    bool disagree = false;
  };

  template <typename T, typename R>
  struct Round {
    std::vector<std::optional<T>> parts;
    int arrived = 0;
    int left = 0;  // members that have not taken the result yet
    std::optional<absl::StatusOr<R>> result;
  };

  template <typename T, typename R>
  using Rounds = std::map<Key, Round<T, R>>;

  // One round of the node: the phase's table is the one whose part type is T.
  template <typename T, typename R, typename Fold, typename Send>
  absl::StatusOr<R> Exchange(Key key, int local_rank, const T& local, Fold fold,
                             Send send) ABSL_LOCKS_EXCLUDED(mu_);

  // The open rounds of a phase, chosen by its part type.
  Rounds<ForwardPart, ForwardReply>& RoundsOf(const ForwardPart&)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return forward_;
  }
  Rounds<GradSums, GradSums>& RoundsOf(const GradSums&)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return backward_;
  }

  // Constant after construction.
  const int local_size_;
  const std::unique_ptr<NodeGroup> upstream_;
  const absl::Duration timeout_;

  absl::Mutex mu_;
  Rounds<ForwardPart, ForwardReply> forward_ ABSL_GUARDED_BY(mu_);
  Rounds<GradSums, GradSums> backward_ ABSL_GUARDED_BY(mu_);
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_THREAD_NODE_H_
