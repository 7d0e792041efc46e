#include "client/sync_batch_norm.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/layer_rule.h"

namespace syncnorm {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(int layer, const SyncBatchNormOptions& options,
                             NodeGroup* group, ThreadPool* pool)
    : layer_(layer),
      options_(options),
      rule_(RuleOf(options)),
      group_(group),
      context_{Device::kCpu, pool, nullptr} {
  if (options.num_features > 0) Allocate(options.num_features);
}

SyncBatchNorm::SyncBatchNorm(int layer, const SyncBatchNormOptions& options,
                             NodeGroup* group, const KernelContext& context)
    : layer_(layer),
      options_(options),
      rule_(RuleOf(options)),
      group_(group),
      context_{Device::kCpu, context.pool, context.stream} {
  if (options.num_features > 0) Allocate(options.num_features);
}

KernelContext SyncBatchNorm::ContextFor(const TensorRef& t) const {
  KernelContext ctx = context_;
  ctx.device = t.device;
  return ctx;
}

void SyncBatchNorm::Allocate(int channels) {
  channels_ = channels;
  weight_.assign(channels, options_.gamma_init);
  bias_.assign(channels, options_.beta_init);
  grad_weight_.assign(channels, 0.0);
  grad_bias_.assign(channels, 0.0);
  running_ = RunningStats::Initial(channels);
  if (options_.initial_running_mean.size() == static_cast<size_t>(channels)) {
    running_.mean = options_.initial_running_mean;
  }
  if (options_.initial_running_var.size() == static_cast<size_t>(channels)) {
    running_.var = options_.initial_running_var;
  }
}

absl::Status SyncBatchNorm::SetRunningStats(const RunningStats& stats) {
  if (stats.mean.size() != static_cast<size_t>(channels_) ||
      stats.var.size() != static_cast<size_t>(channels_)) {
    return absl::InvalidArgumentError(absl::StrCat("running statistics of ",
                                                   stats.mean.size(),
                                                   " channels for a layer "
                                                   "of ",
                                                   channels_));
  }
  running_ = stats;
  running_behind_ = false;
  return absl::OkStatus();
}

absl::Status SyncBatchNorm::ImportRunningStats(const RunningStats& stats) {
  RoundUpdate update;
  update.imported = stats;
  absl::Status s = ValidateRoundUpdate(update, rule_, channels_);
  if (!s.ok()) return s;
  running_ = stats;
  import_pending_ = true;
  return absl::OkStatus();
}

void SyncBatchNorm::set_momentum(MomentumMode mode, double momentum) {
  SyncBatchNormOptions o = options_;
  o.momentum_mode = mode;
  o.momentum = momentum;
  const RoundMomentum m = MomentumOf(RuleOf(o));
  if (SameMomentum(m, MomentumOf(rule_))) {
    momentum_.reset();
  } else {
    momentum_ = m;
  }
}

absl::Status SyncBatchNorm::CheckLike(const TensorRef& t, const TensorRef& like,
                                      const char* what) const {
  if (t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has no data"));
  }
  if (t.shape != like.shape || t.dtype != like.dtype ||
      t.device != like.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must have the input's shape ", ShapeString(like.shape),
        ", dtype and device; got shape ", ShapeString(t.shape)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Geometry> SyncBatchNorm::Prepare(const TensorRef& x,
                                                const TensorRef& y,
                                                const TensorRef* z) {
  if (x.data == nullptr && !x.shape.empty() && x.shape[0] != 0) {
    return absl::InvalidArgumentError("the input has no data");
  }
  absl::StatusOr<Geometry> g = MakeGeometry(x.shape, options_.channels_last);
  if (!g.ok()) return g.status();
  if (channels_ == 0) Allocate(static_cast<int>(g->channels));
  if (g->channels != channels_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", channels_,
        " channels (num_features) but the input of "
        "shape ",
        ShapeString(x.shape), " has ", g->channels,
        options_.channels_last ? " in its last dimension (channels_last)"
                               : " in dimension 1"));
  }
  if (g->elements() > 0) {
    absl::Status s = CheckLike(y, x, "the output");
    if (s.ok() && z != nullptr) s = CheckLike(*z, x, "the residual z");
    if (!s.ok()) return s;
  }
  return g;
}

void SyncBatchNorm::RunningStatistics() {
  saved_.mean = running_.mean;
  saved_.invstd.resize(channels_);
  for (int c = 0; c < channels_; ++c) {
    saved_.invstd[c] = InvStd(running_.var[c], options_.eps);
  }
}

absl::Status SyncBatchNorm::FailRound(bool backward, int64_t step,
                                      const absl::Status& error) {
  if (group_ == nullptr) return error;
  return backward ? group_->FailBackward(layer_, step, saved_.backwards, error)
                  : group_->FailForward(layer_, step, error);
}

absl::Status SyncBatchNorm::BatchStatistics(const TensorRef& x,
                                            const Geometry& g, bool sync) {
  Moments local;
  absl::Status s = LocalMoments(ContextFor(x), x.dtype, x.data, g, &local);
  if (!s.ok()) return sync ? FailRound(false, step_, s) : s;
  GlobalMoments global = Finalize(local);
  if (sync) {
    if (group_ == nullptr) {
      return absl::FailedPreconditionError(
          "this layer has no node group, so it cannot train; give it one or "
          "use eval or freeze");
    }
    RoundUpdate update;
    update.momentum = momentum_;
    if (import_pending_) update.imported = running_;
    const absl::Time start = absl::Now();
    missing_ranks_.clear();
    view_.clear();
    absl::StatusOr<ForwardReply> reply =
        group_->SyncForwardWithUpdate(layer_, step_, local, update);
    forward_sync_ = absl::Now() - start;
    if (!reply.ok()) return reply.status();
    global = std::move(reply->global);
    missing_ranks_ = std::move(reply->missing_ranks);
    view_ = std::move(reply->view);
    version_ = reply->version;
    if (view_.empty()) {
      ApplyRound(rule_, update, global, running_);
    } else {
      // A stale answer: the aggregator applies this step's full merge, not
      // the view's, once every member has sent it.
      running_behind_ = true;
    }
    import_pending_ = false;
  }
  saved_.global_count = global.count;
  saved_.mean = std::move(global.mean);
  saved_.invstd.resize(channels_);
  for (int c = 0; c < channels_; ++c) {
    saved_.invstd[c] = InvStd(global.var[c], options_.eps);
  }
  return absl::OkStatus();
}

absl::Status SyncBatchNorm::Forward(const TensorRef& x, const TensorRef& y,
                                    const TensorRef* z) {
  saved_.valid = false;
  // torch: batch statistics in training, and in eval without running stats.
  const bool use_running = options_.freeze || options_.use_global_stats ||
                           (!training_ && options_.track_running_stats);
  const bool sync = training_ && !use_running;
  absl::StatusOr<Geometry> g = Prepare(x, y, z);
  if (!g.ok()) return sync ? FailRound(false, step_, g.status()) : g.status();
  if (use_running) {
    RunningStatistics();
  } else {
    absl::Status s = BatchStatistics(x, *g, sync);
    if (!s.ok()) return s;
  }
  ForwardArgs args;
  args.x = x.data;
  args.y = y.data;
  args.z = z != nullptr ? z->data : nullptr;
  args.weight = options_.scale ? weight_.data() : nullptr;
  args.bias = options_.center ? bias_.data() : nullptr;
  args.mean = saved_.mean.data();
  args.invstd = saved_.invstd.data();
  args.relu = options_.fuse_relu;
  absl::Status s = syncnorm::Forward(ContextFor(x), x.dtype, *g, args);
  if (!s.ok()) return s;
  if (!training_) return absl::OkStatus();
  saved_.valid = true;
  saved_.synced = sync;
  saved_.x = x.data;
  saved_.y = options_.fuse_relu ? y.data : nullptr;
  saved_.had_z = z != nullptr;
  saved_.dtype = x.dtype;
  saved_.device = x.device;
  saved_.geometry = *g;
  saved_.step = step_;
  saved_.backwards = 0;
  if (sync) ++step_;
  return absl::OkStatus();
}

absl::Status SyncBatchNorm::Backward(const TensorRef& dy,
                                     const TensorRef& grad_input,
                                     const TensorRef* grad_z) {
  if (!saved_.valid) {
    return absl::FailedPreconditionError(
        "Backward needs a training Forward first");
  }
  // A failure before the backward round is the round's on every worker.
  auto fail = [&](const absl::Status& s) {
    return saved_.synced ? FailRound(true, saved_.step, s) : s;
  };
  absl::StatusOr<Geometry> g = MakeGeometry(dy.shape, options_.channels_last);
  if (!g.ok()) return fail(g.status());
  const Geometry& f = saved_.geometry;
  if (g->outer != f.outer || g->channels != f.channels || g->inner != f.inner) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("dy of shape ", ShapeString(dy.shape),
                     " does not match the shape of the forward's input")));
  }
  if (dy.dtype != saved_.dtype || dy.device != saved_.device) {
    return fail(absl::InvalidArgumentError(
        "dy must have the dtype and device of the forward's input"));
  }
  if (f.elements() > 0) {
    absl::Status s = CheckLike(grad_input, dy, "grad_input");
    if (s.ok() && saved_.had_z) {
      s = grad_z == nullptr ? absl::InvalidArgumentError(
                                  "the forward had z, so Backward needs grad_z")
                            : CheckLike(*grad_z, dy, "grad_z");
    }
    if (!s.ok()) return fail(s);
  }
  BackwardReduceArgs reduce;
  reduce.dy = dy.data;
  reduce.x = saved_.x;
  reduce.y = saved_.y;
  reduce.mean = saved_.mean.data();
  reduce.invstd = saved_.invstd.data();
  GradSums sums;
  absl::Status s =
      BackwardReduce(ContextFor(dy), dy.dtype, saved_.geometry, reduce, &sums,
                     grad_weight_.data(), grad_bias_.data());
  if (!s.ok()) return fail(s);
  if (options_.freeze) {  // MegEngine: gamma and beta are frozen too
    std::fill(grad_weight_.begin(), grad_weight_.end(), 0.0);
    std::fill(grad_bias_.begin(), grad_bias_.end(), 0.0);
  }
  std::vector<double> mean_dy(channels_, 0.0), mean_dy_xmu(channels_, 0.0);
  if (saved_.synced) {
    const absl::Time start = absl::Now();
    absl::StatusOr<GradSums> global =
        group_->SyncBackward(layer_, saved_.step, saved_.backwards, sums);
    backward_sync_ = absl::Now() - start;
    if (!global.ok()) return global.status();
    // The round is done; a failed one keeps its index for the rerun.
    ++saved_.backwards;
    // Global count 0: every batch was empty and there is nothing to scale.
    const double n = saved_.global_count > 0
                         ? static_cast<double>(saved_.global_count)
                         : 1.0;
    for (int c = 0; c < channels_; ++c) {
      mean_dy[c] = global->sum_dy[c] / n;
      mean_dy_xmu[c] = global->sum_dy_xmu[c] / n;
    }
  }
  BackwardElementwiseArgs args;
  args.dy = dy.data;
  args.x = saved_.x;
  args.y = saved_.y;
  args.mean = saved_.mean.data();
  args.invstd = saved_.invstd.data();
  args.weight = options_.scale ? weight_.data() : nullptr;
  args.mean_dy = mean_dy.data();
  args.mean_dy_xmu = mean_dy_xmu.data();
  args.grad_input = grad_input.data;
  args.grad_z = grad_z != nullptr ? grad_z->data : nullptr;
  return BackwardElementwise(ContextFor(dy), dy.dtype, saved_.geometry, args);
}

}  // namespace syncnorm
