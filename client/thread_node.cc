#include "client/thread_node.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace syncnorm {
namespace {

// "layer L step S", and the backward index of a backward round.
template <typename Key>
std::string RoundName(const Key& key) {
  return absl::StrCat("layer ", std::get<0>(key), " step ", std::get<1>(key),
                      std::get<2>(key) == 2
                          ? absl::StrCat(" backward ", std::get<3>(key))
                          : "");
}

}  // namespace

class ThreadNode::MemberGroup : public NodeGroup {
 public:
  MemberGroup(ThreadNode* node, int local_rank)
      : node_(node), local_rank_(local_rank) {}

  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& local) override {
    return SyncForwardWithUpdate(layer, step, local, RoundUpdate());
  }

  absl::StatusOr<ForwardReply> SyncForwardWithUpdate(
      int layer, int64_t step, const Moments& local,
      const RoundUpdate& update) override {
    ThreadNode* node = node_;
    return node->Exchange<ForwardPart, ForwardReply>(
        Key(layer, step, 1, 0), local_rank_, ForwardPart{local, update},
        [](ForwardPart& acc, const ForwardPart& part) {
          MergeMoments(acc.moments, part.moments);
          acc.disagree = acc.disagree || !SameUpdate(acc.update, part.update);
        },
        [node, layer,
         step](const ForwardPart& merged) -> absl::StatusOr<ForwardReply> {
          if (merged.disagree) {
            return absl::InvalidArgumentError(absl::StrCat(
                "the local ranks of this node changed layer ", layer,
                " differently before step ", step,
                ": every worker must have the same momentum and, after "
                "loading or resetting running statistics, the same ones"));
          }
          return node->upstream_->SyncForwardWithUpdate(
              layer, step, merged.moments, merged.update);
        });
  }

  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& local) override {
    ThreadNode* node = node_;
    return node->Exchange<GradSums, GradSums>(
        Key(layer, step, 2, backward), local_rank_, local,
        [](GradSums& acc, const GradSums& part) { AddGradSums(acc, part); },
        [node, layer, step, backward](const GradSums& summed) {
          return node->upstream_->SyncBackward(layer, step, backward, summed);
        });
  }

 private:
  ThreadNode* const node_;
  const int local_rank_;
};

ThreadNode::ThreadNode(int local_size, std::unique_ptr<NodeGroup> upstream,
                       absl::Duration timeout)
    : local_size_(local_size),
      upstream_(std::move(upstream)),
      timeout_(timeout) {}

std::unique_ptr<NodeGroup> ThreadNode::Member(int local_rank) {
  return std::make_unique<MemberGroup>(this, local_rank);
}

template <typename T, typename R, typename Fold, typename Send>
absl::StatusOr<R> ThreadNode::Exchange(Key key, int local_rank, const T& local,
                                       Fold fold, Send send) {
  if (local_rank < 0 || local_rank >= local_size_) {
    return absl::InvalidArgumentError(absl::StrCat("local rank ", local_rank,
                                                   " is outside this node's ",
                                                   local_size_, " workers"));
  }
  std::optional<T> merged;
  Round<T, R>* round;
  {
    absl::MutexLock lock(&mu_);
    round = &RoundsOf(local)[key];
    if (round->parts.empty()) {
      round->parts.resize(local_size_);
      round->left = local_size_;
    }
    if (round->parts[local_rank].has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("local rank ", local_rank,
                       " joined the same round twice (", RoundName(key), ")"));
    }
    round->parts[local_rank] = local;
    if (round->result.has_value()) {  // came after the round timed out
      absl::StatusOr<R> result = *round->result;
      if (--round->left == 0) RoundsOf(local).erase(key);
      return result;
    }
    if (++round->arrived == local_size_) {
      // The last arrival folds in local-rank order: the same bits on every
      // member, whatever order the threads came in.
      merged = std::move(*round->parts[0]);
      for (int r = 1; r < local_size_; ++r) fold(*merged, *round->parts[r]);
    }
  }
  if (merged.has_value()) {
    absl::StatusOr<R> result = send(*merged);  // no lock held over the RPC
    absl::MutexLock lock(&mu_);
    round->result = std::move(result);
  }
  absl::MutexLock lock(&mu_);
  // The timeout bounds the wait for peers only: once every member is in, the
  // upstream call (with its own deadline) decides the result for all.
  auto peers_in = [this, round]() {
    return round->result.has_value() || round->arrived == local_size_;
  };
  auto ready = [round]() { return round->result.has_value(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&peers_in), timeout_)) {
    std::vector<int> missing;
    for (int r = 0; r < local_size_; ++r) {
      if (!round->parts[r].has_value()) missing.push_back(r);
    }
    round->result = absl::DeadlineExceededError(
        absl::StrCat("local ranks [", absl::StrJoin(missing, ", "),
                     "] of this node did not reach ", RoundName(key),
                     " within ", absl::FormatDuration(timeout_)));
  }
  mu_.Await(absl::Condition(&ready));
  absl::StatusOr<R> result = *round->result;
  if (--round->left == 0) RoundsOf(local).erase(key);
  return result;
}

}  // namespace syncnorm
