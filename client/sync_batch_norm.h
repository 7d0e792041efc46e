// SyncBatchNorm: a batch-norm layer whose training statistics are those of
// the global batch of every worker of its group.
#ifndef SYNCNORM_CLIENT_SYNC_BATCH_NORM_H_
#define SYNCNORM_CLIENT_SYNC_BATCH_NORM_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/node_group.h"
#include "client/sync_batch_norm_options.h"
#include "kernels/batch_norm.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"

namespace syncnorm {

// A tensor the caller owns: data, shape (batch first), element type and
// where it lives (host memory or the current CUDA device's memory).
struct TensorRef {
  void* data = nullptr;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
};

// One BatchNorm layer of a worker.
//
// Training forward: local moments (kernels) -> the group's global moments
// (NodeGroup, one round per step) -> normalize. The running statistics are
// kept by the aggregator and mirrored here by the same rule, so eval (plain
// batch norm with running statistics, no round) needs no service. In a
// stale-synchronous job (staleness > 0) an answer merges a view of recent
// steps while the aggregator applies each step's full merge later, so the
// layer does not mirror: running_stats() keep what was last set
// (running_stats_behind() says so) until the caller loads the aggregator's
// (AwaitRunningStats in client/running_stats.h, before eval). Backward
// syncs sum(dy) and sum(dy * (x - mean)) the same way, one round per
// backward: several backwards through one forward (autograd's
// retain_graph=True) are rounds 0, 1, ... of its step; grad_weight and
// grad_bias stay local, as in torch (the trainer averages gradients).
//
// Not thread-safe: one worker thread drives a layer.
class SyncBatchNorm {
 public:
  // layer: this layer's index in the job's LayerSpec list. group: how the
  // worker syncs; may be null for a layer only used in eval or frozen. pool:
  // CPU threads for the kernels; null runs them on the caller's thread.
  SyncBatchNorm(int layer, const SyncBatchNormOptions& options,
                NodeGroup* group, ThreadPool* pool);
  // The same with full kernel resources: context.pool for CPU tensors and
  // context.stream (a cudaStream_t) for CUDA tensors. context.device is
  // ignored: each call runs where its tensors live (TensorRef::device), and
  // all tensors of a call must live on the same device. For CUDA tensors
  // the layer's parameters, statistics and gradients stay on the host (see
  // kernels/batch_norm.h); Forward and Backward wait for the stream only
  // while they need the local statistics.
  SyncBatchNorm(int layer, const SyncBatchNormOptions& options,
                NodeGroup* group, const KernelContext& context);

  // Training mode (default) or eval.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  // y = BN(x) (+ z) (ReLU). In training (not frozen) this is one forward
  // round of the layer; the layer's step counter then advances. x, y and z
  // must stay alive and unchanged until Backward, which reads x (and y for
  // the ReLU mask); so y may alias x only when no Backward follows (eval).
  // INVALID_ARGUMENT for a wrong rank, channel count, dtype or shape; the
  // round's status (DEADLINE_EXCEEDED naming missing ranks, ...) on failure.
  absl::Status Forward(const TensorRef& x, const TensorRef& y,
                       const TensorRef* z = nullptr);

  // grad_input (and grad_z when the forward had z) from dy, for the last
  // training Forward; accumulates nothing: grad_weight() and grad_bias()
  // are overwritten with this backward's local values. May run several
  // times per Forward (one upstream gradient each): its round's backward
  // index is the number of this Forward's backward rounds that completed,
  // so a Backward whose round failed may be run again as the same round.
  absl::Status Backward(const TensorRef& dy, const TensorRef& grad_input,
                        const TensorRef* grad_z = nullptr);

  int num_features() const { return channels_; }
  // This layer's index in the job's LayerSpec list.
  int layer() const { return layer_; }
  // Forward rounds run so far; the step of the next round.
  int64_t step() const { return step_; }
  // Sets the step of the next round, e.g. S + 1 after the job was restored
  // to its checkpoint at step S (see client/running_stats.h).
  void set_step(int64_t step) { step_ = step; }
  std::vector<float>& weight() { return weight_; }
  std::vector<float>& bias() { return bias_; }
  const std::vector<double>& grad_weight() const { return grad_weight_; }
  const std::vector<double>& grad_bias() const { return grad_bias_; }
  const RunningStats& running_stats() const { return running_; }
  // Replaces the running statistics here only: with the aggregator's (say,
  // loaded by LoadRunningStats). INVALID_ARGUMENT for another channel count.
  absl::Status SetRunningStats(const RunningStats& stats);
  // Replaces the running statistics here and at the aggregator (torch's
  // load_state_dict or reset_running_stats): the next training forward
  // round carries them and the aggregator applies the round to them. Every
  // worker of the group must import the same values before that round, or
  // the round fails with INVALID_ARGUMENT (and the import waits for the
  // next). INVALID_ARGUMENT for another channel count or bad values.
  absl::Status ImportRunningStats(const RunningStats& stats);
  // The momentum of the next forward rounds, as torch and apex read it at
  // every forward: its rule and value (negative: the rule's default). A
  // round whose momentum is not the layer's (the options') sends it along;
  // every worker of the group must set the same.
  void set_momentum(MomentumMode mode, double momentum);
  // Wall time of the last forward and backward sync (0 without a round).
  absl::Duration last_forward_sync() const { return forward_sync_; }
  absl::Duration last_backward_sync() const { return backward_sync_; }
  // The ranks of the group (job ranks) that the layer's last forward round
  // did not count, ascending: the job's quorum policy completed the round
  // without them (see QuorumPolicy in aggregator.proto). This worker's own
  // rank is among them when its contribution came too late; its output
  // still uses the round's statistics. Empty when every rank was counted,
  // before the first round and after a failed round (whose status names
  // the missing ranks). A Forward without a round (eval, freeze) leaves it
  // as it was.
  const std::vector<int>& last_missing_ranks() const { return missing_ranks_; }
  // A stale-synchronous job: the (rank, step) of each contribution that the
  // layer's last forward round merged, in rank order (see
  // ForwardReply::view). Empty in synchronous jobs, before the first round
  // and after a failed one; a Forward without a round leaves it.
  const std::vector<ForwardReply::ViewEntry>& last_view() const {
    return view_;
  }
  // The aggregator's running-stats version that the last forward answer
  // reported (ForwardReply::version); 0 before the first round.
  int64_t last_version() const { return version_; }
  // True after a stale-synchronous round: running_stats() are not the
  // aggregator's (it applies every step's full merge once every member has
  // sent it, which this layer cannot mirror), until SetRunningStats loads
  // them (AwaitRunningStats, LoadRunningStats). False in synchronous jobs.
  bool running_stats_behind() const { return running_behind_; }

 private:
  // What Backward needs from the last training Forward.
  struct Saved {
    bool valid = false;
    bool synced = false;  // false: frozen statistics, no backward round
    const void* x = nullptr;
    const void* y = nullptr;  // ReLU mask source
    bool had_z = false;
    DType dtype = DType::kFloat32;
    Device device = Device::kCpu;
    Geometry geometry;
    int64_t step = 0;
    // Backward rounds of this forward that completed: the next one's index.
    int backwards = 0;
    int64_t global_count = 0;
    std::vector<double> mean, invstd;
  };

  absl::StatusOr<Geometry> Prepare(const TensorRef& x, const TensorRef& y,
                                   const TensorRef* z);
  void Allocate(int channels);
  // Fills saved_.mean/invstd from batch statistics (syncing if training).
  absl::Status BatchStatistics(const TensorRef& x, const Geometry& g,
                               bool sync);
  void RunningStatistics();
  // `error`, a local failure of the forward round `step` (backward: of the
  // saved forward's next backward round) that this worker takes part in,
  // after telling the node's other workers (NodeGroup::FailForward/
  // FailBackward) so that they fail it at once.
  absl::Status FailRound(bool backward, int64_t step,
                         const absl::Status& error);
  absl::Status CheckLike(const TensorRef& t, const TensorRef& like,
                         const char* what) const;
  // context_ with the device where `t` lives.
  KernelContext ContextFor(const TensorRef& t) const;

  // Constant after construction.
  const int layer_;
  const SyncBatchNormOptions options_;
  const RunningRule rule_;  // the job's (ToLayerSpec of options_)
  NodeGroup* const group_;
  const KernelContext context_;

  bool training_ = true;
  int channels_ = 0;
  int64_t step_ = 0;
  std::vector<float> weight_, bias_;
  std::vector<double> grad_weight_, grad_bias_;
  RunningStats running_;
  // What the next forward round sends beyond its moments: a momentum that
  // is not rule_'s, and whether running_ is to be imported.
  std::optional<RoundMomentum> momentum_;
  bool import_pending_ = false;
  Saved saved_;
  absl::Duration forward_sync_, backward_sync_;
  std::vector<int> missing_ranks_;             // of the last forward round
  std::vector<ForwardReply::ViewEntry> view_;  // of the last forward round
  int64_t version_ = 0;                        // of the last forward answer
  bool running_behind_ = false;                // running_ lags the aggregator's
};

}  // namespace syncnorm

#endif  // SYNCNORM_CLIENT_SYNC_BATCH_NORM_H_
