#include "client/sync_batch_norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/node_group.h"
#include "client/sync_batch_norm_options.h"
#include "client/thread_node.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moments.h"
#include "kernels/round_update.h"
#include "kernels/testing/batch_norm_reference.h"
#include "kernels/testing/expect_close.h"

namespace syncnorm {
namespace {

using reference::ExpectClose;
using reference::Normalization;
using ::testing::HasSubstr;
using LongVec = reference::Reals;

constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr double kOutputTol = 1e-6;    // fp32 outputs, relative to max |ref|
constexpr double kRunningTol = 1e-12;  // running statistics, relative
constexpr int kWorkers = 3;
constexpr int kSteps = 3;

// ---- the fake service -------------------------------------------------------

// Plays the aggregator for one node: a forward round is answered with the
// finalized merged moments and a version counter (and the set missing
// ranks, as a quorum round), a backward round with the summed sums. Records
// every call (a backward's (step, backward index), also of a round failed
// with FailBackward(layer, ...)); a set error fails the following rounds.
class FakeAggregator : public NodeGroup {
 public:
  // The node's way to fail a round; FailForward(status) below sets the
  // fake's own answer.
  using NodeGroup::FailForward;

  absl::StatusOr<ForwardReply> SyncForward(int layer, int64_t step,
                                           const Moments& merged) override {
    absl::MutexLock lock(&mu_);
    forward_counts_.push_back(merged.count);
    forward_steps_.push_back(step);
    if (!forward_error_.ok()) return forward_error_;
    ForwardReply reply;
    reply.global = Finalize(merged);
    reply.version = ++version_;
    reply.missing_ranks = missing_ranks_;
    reply.view = view_;
    return reply;
  }
  absl::StatusOr<ForwardReply> SyncForwardWithUpdate(
      int layer, int64_t step, const Moments& merged,
      const RoundUpdate& update) override {
    {
      absl::MutexLock lock(&mu_);
      updates_.push_back(update);
    }
    return SyncForward(layer, step, merged);
  }
  absl::StatusOr<GradSums> SyncBackward(int layer, int64_t step, int backward,
                                        const GradSums& summed) override {
    absl::MutexLock lock(&mu_);
    ++backward_calls_;
    backward_rounds_.push_back({step, backward});
    if (!backward_error_.ok()) return backward_error_;
    return summed;
  }
  absl::Status FailBackward(int layer, int64_t step, int backward,
                            const absl::Status& error) override {
    absl::MutexLock lock(&mu_);
    failed_backwards_.push_back({step, backward});
    return error;
  }

  void FailForward(absl::Status s) {
    absl::MutexLock lock(&mu_);
    forward_error_ = std::move(s);
  }
  void NameMissing(std::vector<int> ranks) {
    absl::MutexLock lock(&mu_);
    missing_ranks_ = std::move(ranks);
  }
  // Answers as a stale-synchronous job would: with this view (and the
  // version counter, which such a job does not advance per answer).
  void AnswerWithView(std::vector<ForwardReply::ViewEntry> view) {
    absl::MutexLock lock(&mu_);
    view_ = std::move(view);
  }
  void FailBackward(absl::Status s) {
    absl::MutexLock lock(&mu_);
    backward_error_ = std::move(s);
  }
  int forward_calls() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(forward_counts_.size());
  }
  std::vector<int64_t> forward_counts() {
    absl::MutexLock lock(&mu_);
    return forward_counts_;
  }
  std::vector<int64_t> forward_steps() {
    absl::MutexLock lock(&mu_);
    return forward_steps_;
  }
  int backward_calls() {
    absl::MutexLock lock(&mu_);
    return backward_calls_;
  }
  // (step, backward index) of each backward round, in call order.
  std::vector<std::pair<int64_t, int>> backward_rounds() {
    absl::MutexLock lock(&mu_);
    return backward_rounds_;
  }
  // (step, backward index) of each FailBackward(layer, ...).
  std::vector<std::pair<int64_t, int>> failed_backwards() {
    absl::MutexLock lock(&mu_);
    return failed_backwards_;
  }
  // The update of each forward round (SyncForwardWithUpdate).
  std::vector<RoundUpdate> updates() {
    absl::MutexLock lock(&mu_);
    return updates_;
  }

 private:
  absl::Mutex mu_;
  absl::Status forward_error_ ABSL_GUARDED_BY(mu_);
  absl::Status backward_error_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> forward_counts_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> forward_steps_ ABSL_GUARDED_BY(mu_);
  int backward_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<int64_t, int>> backward_rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int>> failed_backwards_ ABSL_GUARDED_BY(mu_);
  std::vector<RoundUpdate> updates_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> missing_ranks_ ABSL_GUARDED_BY(mu_);
  std::vector<ForwardReply::ViewEntry> view_ ABSL_GUARDED_BY(mu_);
};

// k in-process workers: a ThreadNode whose upstream is a FakeAggregator.
struct FakeService {
  explicit FakeService(int k) {
    auto upstream = std::make_unique<FakeAggregator>();
    aggregator = upstream.get();
    node =
        std::make_unique<ThreadNode>(k, std::move(upstream), absl::Seconds(10));
  }
  FakeAggregator* aggregator;
  std::unique_ptr<ThreadNode> node;
};

// Runs fn(worker) on k threads and joins them.
void RunWorkers(int k, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int w = 0; w < k; ++w) threads.emplace_back(fn, w);
  for (std::thread& t : threads) t.join();
}

// ---- tensors
// ------------------------------------------------------------------

// One worker's tensor shape; the reference's Layout does the index math.
struct Layout {
  int64_t batch = 0;
  int64_t channels = 0;
  std::vector<int64_t> spatial;
  bool channels_last = false;

  std::vector<int64_t> shape() const {
    std::vector<int64_t> s = {batch};
    if (!channels_last) s.push_back(channels);
    s.insert(s.end(), spatial.begin(), spatial.end());
    if (channels_last) s.push_back(channels);
    return s;
  }
  int64_t positions() const {
    int64_t p = 1;
    for (int64_t d : spatial) p *= d;
    return p;
  }
  int64_t size() const { return batch * channels * positions(); }
  reference::Layout AsReference() const { return {shape(), channels_last}; }
};

// Random data, never zero; channel ch has its own offset and spread.
std::vector<float> RandomTensor(const Layout& l, std::mt19937_64& rng,
                                double offset, double spread) {
  std::normal_distribution<double> unit(0.0, 1.0);
  std::vector<float> t(l.size());
  reference::ForEachElement(l.AsReference(), [&](int64_t ch, int64_t i) {
    double v = offset + 0.9 * ch - 1.1 + spread * (0.5 + ch % 3) * unit(rng);
    if (v == 0) v = 0.125;
    t[i] = static_cast<float>(v);
  });
  return t;
}

std::vector<double> RandomValues(int64_t n, std::mt19937_64& rng, double lo,
                                 double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

TensorRef Ref(std::vector<float>& data, const Layout& l) {
  TensorRef t;
  t.data = data.data();
  t.shape = l.shape();
  return t;
}

// ---- the float64 reference of plain batch norm -----------------------------

// Mean and M2 over the concatenation of the shards.
reference::Stats BatchStats(const std::vector<Layout>& layouts,
                            const std::vector<const std::vector<float>*>& xs,
                            int64_t channels) {
  std::vector<reference::Layout> refs;
  for (const Layout& l : layouts) refs.push_back(l.AsReference());
  return reference::Moments(channels, refs, xs);
}

// The affine parameters as the reference sees them.
struct RefAffine {
  LongVec gamma, beta;  // ones and zeros when the option is off
};

// Normalization by `mean` and the biased `var`, then the affine parameters.
Normalization NormOf(const LongVec& mean, const LongVec& var,
                     const RefAffine& a, double eps) {
  return reference::Normalize(mean, var, eps, a.gamma, a.beta);
}

struct RefOutputs {
  LongVec y, grad_input, grad_z, grad_weight, grad_bias;
};

// y of one shard.
LongVec RefForward(const Layout& l, const std::vector<float>& x,
                   const std::vector<float>* z, const Normalization& n,
                   bool relu) {
  return reference::Forward(l.AsReference(), x, n, z, relu);
}

// One shard's data.
struct Shard {
  Layout layout;
  std::vector<float> x, z, dy;
};

// Plain batch norm over the concatenated shards normalized by `n`: forward
// outputs and, for `global_backward`, the gradient of the loss sum(dy * y)
// through the batch statistics of the `count` values per channel;
// otherwise with the statistics held constant (frozen).
std::vector<RefOutputs> RefBatchNorm(const std::vector<Shard>& shards,
                                     const Normalization& n, int64_t count,
                                     bool residual, bool relu,
                                     bool global_backward) {
  const size_t channels = n.mean.size();
  std::vector<RefOutputs> out(shards.size());
  // The group's sums, then (global_backward) over its count; zeros: frozen.
  LongVec mean_dy(channels, 0), mean_dy_xmu(channels, 0);
  for (size_t w = 0; w < shards.size(); ++w) {
    const Shard& s = shards[w];
    const reference::Layout l = s.layout.AsReference();
    RefOutputs& o = out[w];
    o.y = reference::Forward(l, s.x, n, residual ? &s.z : nullptr, relu);
    const LongVec* mask = relu ? &o.y : nullptr;
    const reference::GradSumsRef sums =
        reference::BackwardSums(l, s.dy, s.x, mask, n.mean);
    o.grad_bias = sums.sum_dy;
    o.grad_weight.assign(channels, 0);
    for (size_t ch = 0; ch < channels; ++ch) {
      o.grad_weight[ch] = sums.sum_dy_xmu[ch] * n.invstd[ch];
      if (global_backward) {
        mean_dy[ch] += sums.sum_dy[ch];
        mean_dy_xmu[ch] += sums.sum_dy_xmu[ch];
      }
    }
    o.grad_z.assign(l.size(), 0);
    reference::ForEachElement(l, [&](int64_t, int64_t i) {
      o.grad_z[i] = reference::MaskedDy(s.dy, mask, i);
    });
  }
  for (size_t ch = 0; ch < channels && global_backward; ++ch) {
    mean_dy[ch] /= count;
    mean_dy_xmu[ch] /= count;
  }
  for (size_t w = 0; w < shards.size(); ++w) {
    const Shard& s = shards[w];
    RefOutputs& o = out[w];
    o.grad_input =
        reference::GradInput(s.layout.AsReference(), s.dy, s.x,
                             relu ? &o.y : nullptr, n, mean_dy, mean_dy_xmu);
  }
  return out;
}

// The running statistics after one round, by the options' rule (a negative
// momentum is the rule's default).
void RefUpdate(const SyncBatchNormOptions& o, const reference::Stats& batch,
               reference::Running& r) {
  if (!o.track_running_stats) return;
  const reference::Real default_m =
      o.momentum_mode == MomentumMode::kDecay ? 0.9L : 0.1L;
  reference::UpdateRunning(o.momentum_mode,
                           o.momentum < 0 ? default_m : o.momentum,
                           o.biased_running_var, batch, r);
}

std::vector<float> Poisoned(const Layout& l) {
  return std::vector<float>(l.size(), kNaNf);
}

// ---- the end-to-end cases
// ----------------------------------------------------------

struct Case {
  std::string name;
  std::vector<int64_t> spatial;  // dimensions after batch (and channel)
  bool channels_last = false;
  MomentumMode mode = MomentumMode::kTorch;
  double momentum = -1;
  bool biased = false;
  bool track = true;
  bool center = true;
  bool scale = true;
  bool residual = false;
  bool relu = false;
  bool infer_channels = false;  // num_features = 0
  bool initial_stats = false;   // random initial running statistics
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SyncBatchNormTest : public ::testing::TestWithParam<Case> {};

// What one worker's layer produced in one step.
struct WorkerStep {
  absl::Status forward, backward;
  std::vector<float> y, grad_input, grad_z;
  std::vector<double> grad_weight, grad_bias;
  RunningStats running;
  int64_t step = 0;
};

TEST_P(SyncBatchNormTest, MatchesPlainBatchNormOverTheWholeBatch) {
  const Case& c = GetParam();
  constexpr int64_t kChannels = 4;
  const int64_t batches[kWorkers] = {c.spatial.empty() ? 5 : 3, 0,
                                     c.spatial.empty() ? 6 : 2};
  std::mt19937_64 rng(std::hash<std::string>()(c.name));

  SyncBatchNormOptions options;
  options.num_features = c.infer_channels ? 0 : kChannels;
  options.eps = 1e-3;
  options.momentum_mode = c.mode;
  options.momentum = c.momentum;
  options.biased_running_var = c.biased;
  options.track_running_stats = c.track;
  options.center = c.center;
  options.scale = c.scale;
  options.fuse_relu = c.relu;
  options.channels_last = c.channels_last;
  options.gamma_init = 1.25f;
  options.beta_init = -0.375f;
  if (c.initial_stats) {
    options.initial_running_mean = RandomValues(kChannels, rng, -1, 1);
    options.initial_running_var = RandomValues(kChannels, rng, 0.5, 2);
  }
  // The trainer keeps gamma and beta equal on every worker.
  RefAffine affine;
  std::vector<float> gamma(kChannels, options.gamma_init);
  std::vector<float> beta(kChannels, options.beta_init);
  if (!c.infer_channels) {
    const std::vector<double> g = RandomValues(kChannels, rng, 0.5, 2);
    const std::vector<double> b = RandomValues(kChannels, rng, -1, 1);
    for (int64_t ch = 0; ch < kChannels; ++ch) {
      gamma[ch] = static_cast<float>(g[ch]);
      beta[ch] = static_cast<float>(b[ch]);
    }
  }
  for (int64_t ch = 0; ch < kChannels; ++ch) {
    affine.gamma.push_back(c.scale ? gamma[ch] : 1.0L);
    affine.beta.push_back(c.center ? beta[ch] : 0.0L);
  }

  // Every step's shards, then one eval batch per worker.
  std::vector<std::vector<Shard>> steps(kSteps + 1,
                                        std::vector<Shard>(kWorkers));
  for (auto& shards : steps) {
    for (int w = 0; w < kWorkers; ++w) {
      Shard& s = shards[w];
      s.layout = Layout{batches[w], kChannels, c.spatial, c.channels_last};
      s.x = RandomTensor(s.layout, rng, 2.5, 1.5);
      s.z = RandomTensor(s.layout, rng, 0.2, 0.8);
      s.dy = RandomTensor(s.layout, rng, 0.1, 1.0);
    }
  }

  FakeService service(kWorkers);
  std::vector<std::vector<WorkerStep>> got(kSteps + 1,
                                           std::vector<WorkerStep>(kWorkers));
  std::vector<int64_t> inferred(kWorkers);
  std::vector<absl::Status> eval_backward(kWorkers);
  RunWorkers(kWorkers, [&](int w) {
    std::unique_ptr<NodeGroup> member = service.node->Member(w);
    SyncBatchNorm layer(/*layer=*/2, options, member.get(), nullptr);
    if (!c.infer_channels) {
      layer.weight() = gamma;
      layer.bias() = beta;
    }
    for (int i = 0; i <= kSteps; ++i) {
      const bool eval = i == kSteps;
      layer.set_training(!eval);
      Shard& s = steps[i][w];
      WorkerStep& out = got[i][w];
      out.y = Poisoned(s.layout);
      out.grad_input = Poisoned(s.layout);
      out.grad_z = Poisoned(s.layout);
      TensorRef x = Ref(s.x, s.layout), z = Ref(s.z, s.layout);
      TensorRef y = Ref(out.y, s.layout);
      out.forward = layer.Forward(x, y, c.residual ? &z : nullptr);
      if (i == 0) inferred[w] = layer.num_features();
      if (!out.forward.ok()) return;
      TensorRef dy = Ref(s.dy, s.layout);
      TensorRef gi = Ref(out.grad_input, s.layout);
      TensorRef gz = Ref(out.grad_z, s.layout);
      out.backward = layer.Backward(dy, gi, c.residual ? &gz : nullptr);
      if (eval) eval_backward[w] = out.backward;
      if (!eval && !out.backward.ok()) return;
      out.grad_weight = layer.grad_weight();
      out.grad_bias = layer.grad_bias();
      out.running = layer.running_stats();
      out.step = layer.step();
    }
  });

  // Training steps against plain batch norm over the concatenated batch.
  reference::Running running;
  running.mean.assign(kChannels, 0);
  running.var.assign(kChannels, 1);
  if (c.initial_stats) {
    running.mean.assign(options.initial_running_mean.begin(),
                        options.initial_running_mean.end());
    running.var.assign(options.initial_running_var.begin(),
                       options.initial_running_var.end());
  }
  const reference::Running initial = running;
  std::vector<int64_t> want_counts;
  for (int i = 0; i < kSteps; ++i) {
    std::vector<Layout> layouts;
    std::vector<const std::vector<float>*> xs;
    for (const Shard& s : steps[i]) {
      layouts.push_back(s.layout);
      xs.push_back(&s.x);
    }
    const reference::Stats stats = BatchStats(layouts, xs, kChannels);
    want_counts.push_back(stats.count);
    RefUpdate(options, stats, running);
    const std::vector<RefOutputs> ref = RefBatchNorm(
        steps[i], NormOf(stats.mean, stats.Var(), affine, options.eps),
        stats.count, c.residual, c.relu, /*global_backward=*/true);
    for (int w = 0; w < kWorkers; ++w) {
      SCOPED_TRACE(testing::Message() << "step " << i << " worker " << w);
      const WorkerStep& out = got[i][w];
      ASSERT_TRUE(out.forward.ok()) << out.forward;
      ASSERT_TRUE(out.backward.ok()) << out.backward;
      ExpectClose(out.y, ref[w].y, kOutputTol, "y");
      ExpectClose(out.grad_input, ref[w].grad_input, kOutputTol, "grad_input");
      if (c.residual) {
        ExpectClose(out.grad_z, ref[w].grad_z, kOutputTol, "grad_z");
      }
      ExpectClose(out.grad_weight, ref[w].grad_weight, 1e-9, "grad_weight");
      ExpectClose(out.grad_bias, ref[w].grad_bias, 1e-9, "grad_bias");
      ExpectClose(out.running.mean, running.mean, kRunningTol, "running mean");
      ExpectClose(out.running.var, running.var, kRunningTol, "running var");
      EXPECT_EQ(out.running.num_batches_tracked, running.num_batches_tracked);
      EXPECT_EQ(out.step, i + 1);
    }
  }
  for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(inferred[w], kChannels);
  if (c.mode == MomentumMode::kTorch && c.momentum == 0) {
    // momentum 0: the statistics stay exactly where they started.
    for (int w = 0; w < kWorkers; ++w) {
      for (int64_t ch = 0; ch < kChannels; ++ch) {
        EXPECT_EQ(got[kSteps - 1][w].running.mean[ch],
                  static_cast<double>(initial.mean[ch]));
        EXPECT_EQ(got[kSteps - 1][w].running.var[ch],
                  static_cast<double>(initial.var[ch]));
      }
    }
  }
  // One forward and one backward round per step, each with the whole batch.
  EXPECT_EQ(service.aggregator->forward_counts(), want_counts);
  EXPECT_EQ(service.aggregator->forward_steps(),
            (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(service.aggregator->backward_calls(), kSteps);

  // Eval: plain batch norm with the running statistics (or, without them,
  // each worker's own batch statistics); no round, and nothing to backward.
  for (int w = 0; w < kWorkers; ++w) {
    SCOPED_TRACE(testing::Message() << "eval worker " << w);
    const Shard& s = steps[kSteps][w];
    const WorkerStep& out = got[kSteps][w];
    ASSERT_TRUE(out.forward.ok()) << out.forward;
    Normalization n = NormOf(running.mean, running.var, affine, options.eps);
    if (!c.track) {
      const reference::Stats batch = BatchStats({s.layout}, {&s.x}, kChannels);
      n = NormOf(batch.mean, batch.Var(), affine, options.eps);
    }
    ExpectClose(
        out.y,
        RefForward(s.layout, s.x, c.residual ? &s.z : nullptr, n, c.relu),
        kOutputTol, "eval y");
    EXPECT_EQ(eval_backward[w].code(), absl::StatusCode::kFailedPrecondition)
        << eval_backward[w];
  }
  EXPECT_EQ(service.aggregator->forward_calls(), kSteps);
  EXPECT_EQ(service.aggregator->backward_calls(), kSteps);
}

Case Make(std::string name, std::function<void(Case&)> edit) {
  Case c;
  c.name = std::move(name);
  c.spatial = {2, 3};
  edit(c);
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SyncBatchNormTest,
    ::testing::Values(
        Make("TorchDefault", [](Case&) {}),
        Make("TorchMomentum", [](Case& c) { c.momentum = 0.3; }),
        Make("TorchMomentumZeroKeepsStats",
             [](Case& c) {
               c.momentum = 0;
               c.initial_stats = true;
             }),
        Make("DecayDefault", [](Case& c) { c.mode = MomentumMode::kDecay; }),
        Make("DecayMomentumBiased",
             [](Case& c) {
               c.mode = MomentumMode::kDecay;
               c.momentum = 0.75;
               c.biased = true;
               c.initial_stats = true;
             }),
        Make("Cumulative",
             [](Case& c) {
               c.mode = MomentumMode::kCumulative;
               c.initial_stats = true;
             }),
        Make("CumulativeBiased",
             [](Case& c) {
               c.mode = MomentumMode::kCumulative;
               c.biased = true;
             }),
        Make("TorchBiased", [](Case& c) { c.biased = true; }),
        Make("CenterOnly", [](Case& c) { c.scale = false; }),
        Make("ScaleOnly", [](Case& c) { c.center = false; }),
        Make("NoAffine",
             [](Case& c) {
               c.center = false;
               c.scale = false;
             }),
        Make("ResidualRelu",
             [](Case& c) {
               c.residual = true;
               c.relu = true;
             }),
        Make("ReluOnly", [](Case& c) { c.relu = true; }),
        Make("ResidualOnly", [](Case& c) { c.residual = true; }),
        Make("ChannelsLastResidualRelu",
             [](Case& c) {
               c.channels_last = true;
               c.residual = true;
               c.relu = true;
             }),
        Make("TwoD", [](Case& c) { c.spatial = {}; }),
        Make("TwoDChannelsLast",
             [](Case& c) {
               c.spatial = {};
               c.channels_last = true;
             }),
        Make("FiveD",
             [](Case& c) {
               c.spatial = {2, 1, 3};
             }),
        Make("FiveDChannelsLastDecay",
             [](Case& c) {
               c.spatial = {2, 2, 1};
               c.channels_last = true;
               c.mode = MomentumMode::kDecay;
             }),
        Make("NoTrackingEvalUsesBatchStats",
             [](Case& c) {
               c.track = false;
               c.residual = true;
               c.relu = true;
             }),
        Make("InferredChannels", [](Case& c) { c.infer_channels = true; }),
        Make("InferredChannelsLast",
             [](Case& c) {
               c.infer_channels = true;
               c.channels_last = true;
               c.spatial = {3};
             })),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- freeze
// --------------------------------------------------------------------

// MXNet use_global_stats: running statistics, no round, gamma and beta
// learn; MegEngine freeze: the same, with gamma and beta frozen too.
class SyncBatchNormFreezeTest : public ::testing::TestWithParam<bool> {};

TEST_P(SyncBatchNormFreezeTest, NormalizesWithRunningStatsWithoutARound) {
  const bool megengine = GetParam();
  constexpr int64_t kChannels = 3;
  const int64_t batches[kWorkers] = {2, 0, 3};
  std::mt19937_64 rng(404);
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  options.freeze = megengine;
  options.use_global_stats = !megengine;
  options.fuse_relu = true;
  options.channels_last = true;
  options.initial_running_mean = RandomValues(kChannels, rng, -1, 3);
  options.initial_running_var = RandomValues(kChannels, rng, 0.5, 4);
  const std::vector<double> g = RandomValues(kChannels, rng, 0.5, 2);
  const std::vector<double> b = RandomValues(kChannels, rng, -1, 1);
  std::vector<float> gamma(g.begin(), g.end()), beta(b.begin(), b.end());
  RefAffine affine{LongVec(gamma.begin(), gamma.end()),
                   LongVec(beta.begin(), beta.end())};
  const Normalization frozen = NormOf(
      reference::ToReals(options.initial_running_mean),
      reference::ToReals(options.initial_running_var), affine, options.eps);

  std::vector<Shard> shards(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    shards[w].layout = Layout{batches[w], kChannels, {2, 3}, true};
    shards[w].x = RandomTensor(shards[w].layout, rng, 1.0, 1.5);
    shards[w].z = RandomTensor(shards[w].layout, rng, 0.2, 0.8);
    shards[w].dy = RandomTensor(shards[w].layout, rng, 0.1, 1.0);
  }
  FakeService service(kWorkers);
  std::vector<WorkerStep> got(kWorkers);
  RunWorkers(kWorkers, [&](int w) {
    std::unique_ptr<NodeGroup> member = service.node->Member(w);
    SyncBatchNorm layer(0, options, member.get(), nullptr);
    layer.weight() = gamma;
    layer.bias() = beta;
    Shard& s = shards[w];
    WorkerStep& out = got[w];
    out.y = Poisoned(s.layout);
    out.grad_input = Poisoned(s.layout);
    out.grad_z = Poisoned(s.layout);
    TensorRef x = Ref(s.x, s.layout), z = Ref(s.z, s.layout);
    TensorRef y = Ref(out.y, s.layout), dy = Ref(s.dy, s.layout);
    TensorRef gi = Ref(out.grad_input, s.layout);
    TensorRef gz = Ref(out.grad_z, s.layout);
    out.forward = layer.Forward(x, y, &z);
    if (out.forward.ok()) out.backward = layer.Backward(dy, gi, &gz);
    out.grad_weight = layer.grad_weight();
    out.grad_bias = layer.grad_bias();
    out.running = layer.running_stats();
    out.step = layer.step();
  });

  // grad_input = dy * invstd * gamma (after the ReLU mask): the statistics
  // are constants.
  const std::vector<RefOutputs> ref =
      RefBatchNorm(shards, frozen, /*count=*/0, /*residual=*/true,
                   /*relu=*/true, /*global_backward=*/false);
  for (int w = 0; w < kWorkers; ++w) {
    SCOPED_TRACE(testing::Message() << "worker " << w);
    const WorkerStep& out = got[w];
    ASSERT_TRUE(out.forward.ok()) << out.forward;
    ASSERT_TRUE(out.backward.ok()) << out.backward;
    ExpectClose(out.y, ref[w].y, kOutputTol, "y");
    ExpectClose(out.grad_input, ref[w].grad_input, kOutputTol, "grad_input");
    ExpectClose(out.grad_z, ref[w].grad_z, kOutputTol, "grad_z");
    if (megengine) {
      EXPECT_EQ(out.grad_weight, std::vector<double>(kChannels, 0.0));
      EXPECT_EQ(out.grad_bias, std::vector<double>(kChannels, 0.0));
    } else {
      ExpectClose(out.grad_weight, ref[w].grad_weight, 1e-9, "grad_weight");
      ExpectClose(out.grad_bias, ref[w].grad_bias, 1e-9, "grad_bias");
    }
    EXPECT_EQ(out.running.mean, options.initial_running_mean);
    EXPECT_EQ(out.running.var, options.initial_running_var);
    EXPECT_EQ(out.running.num_batches_tracked, 0);
    EXPECT_EQ(out.step, 0);
  }
  EXPECT_EQ(service.aggregator->forward_calls(), 0);
  EXPECT_EQ(service.aggregator->backward_calls(), 0);
}

INSTANTIATE_TEST_SUITE_P(FreezeAndUseGlobalStats, SyncBatchNormFreezeTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "MegEngineFreeze"
                                             : "MxnetUseGlobalStats";
                         });

// ---- errors
// ----------------------------------------------------------------------

// A one-worker layer whose group is the fake aggregator itself.
struct SoloFixture {
  explicit SoloFixture(int num_features) {
    options.num_features = num_features;
    layer = std::make_unique<SyncBatchNorm>(0, options, &aggregator, nullptr);
  }
  FakeAggregator aggregator;
  SyncBatchNormOptions options;
  std::unique_ptr<SyncBatchNorm> layer;
};

// last_missing_ranks: the last forward round's, kept over an eval forward,
// cleared by a round that counts every rank and by a failed round.
TEST(SyncBatchNormQuorumTest, LastMissingRanksFollowTheRounds) {
  SoloFixture f(/*num_features=*/2);
  std::mt19937_64 rng(11);
  Layout l{4, 2, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  EXPECT_TRUE(f.layer->last_missing_ranks().empty());
  f.aggregator.NameMissing({0, 3});
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_EQ(f.layer->last_missing_ranks(), (std::vector<int>{0, 3}));
  f.layer->set_training(false);
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_EQ(f.layer->last_missing_ranks(), (std::vector<int>{0, 3}))
      << "eval runs no round";
  f.layer->set_training(true);
  f.aggregator.NameMissing({});
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_TRUE(f.layer->last_missing_ranks().empty());
  f.aggregator.NameMissing({2});
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_EQ(f.layer->last_missing_ranks(), (std::vector<int>{2}));
  f.aggregator.FailForward(absl::DeadlineExceededError("ranks [1]"));
  EXPECT_FALSE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_TRUE(f.layer->last_missing_ranks().empty());
}

// ---- changes after construction ----------------------------------------

// The batch of `x` of channel c: mean and unbiased var, by the reference.
std::pair<double, double> BatchMeanVar(const std::vector<float>& x,
                                       const Layout& l, int c) {
  const reference::Stats s = reference::Moments(l.AsReference(), x);
  return {static_cast<double>(s.mean[c]),
          static_cast<double>(s.m2[c] / (s.count - 1))};
}

// A stale-synchronous answer (a view): the layer normalizes with it and
// exposes the view, but does not apply it to the running statistics (the
// aggregator applies each step's full merge instead); they stay as last
// set, flagged behind, until SetRunningStats loads the aggregator's. A
// synchronous answer afterwards mirrors again.
TEST(SyncBatchNormStaleTest, AViewIsNotAppliedToTheRunningStatistics) {
  SoloFixture f(/*num_features=*/2);
  std::mt19937_64 rng(12);
  Layout l{4, 2, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 3, 2), y = Poisoned(l);
  const RunningStats initial = f.layer->running_stats();
  EXPECT_FALSE(f.layer->running_stats_behind());
  EXPECT_TRUE(f.layer->last_view().empty());
  const std::vector<ForwardReply::ViewEntry> view = {{0, 0}, {1, 0}};
  f.aggregator.AnswerWithView(view);
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_EQ(f.layer->last_view(), view);
  EXPECT_EQ(f.layer->last_version(), 1);
  EXPECT_TRUE(f.layer->running_stats_behind());
  EXPECT_EQ(f.layer->running_stats().mean, initial.mean);
  EXPECT_EQ(f.layer->running_stats().var, initial.var);
  EXPECT_EQ(f.layer->running_stats().num_batches_tracked, 0);
  // Normalized with the answer's statistics all the same: this batch's.
  for (int c = 0; c < 2; ++c) {
    auto [mean, var] = BatchMeanVar(x, l, c);
    const double biased = var * (l.batch * 3 - 1) / (l.batch * 3);
    const float want =
        static_cast<float>((x[c * 3] - mean) / std::sqrt(biased + 1e-5));
    EXPECT_NEAR(y[c * 3], want, 1e-5) << "channel " << c;
  }
  // Loading the aggregator's statistics brings the layer up to date.
  RunningStats loaded{7, {0.5, -0.5}, {2.0, 3.0}};
  ASSERT_TRUE(f.layer->SetRunningStats(loaded).ok());
  EXPECT_FALSE(f.layer->running_stats_behind());
  // A synchronous answer (no view) is mirrored by the rule.
  f.aggregator.AnswerWithView({});
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_TRUE(f.layer->last_view().empty());
  EXPECT_FALSE(f.layer->running_stats_behind());
  EXPECT_EQ(f.layer->running_stats().num_batches_tracked, 8);
}

// torch and apex read momentum at every forward: a round with another
// momentum than the options' sends it and mirrors its update.
TEST(SyncBatchNormChangesTest, MomentumSetAfterConstructionIsTheRounds) {
  SoloFixture f(/*num_features=*/2);
  std::mt19937_64 rng(21);
  Layout l{5, 2, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 2, 1), y = Poisoned(l);
  f.layer->set_momentum(MomentumMode::kTorch, 1.0);  // apex's unit test
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  for (int c = 0; c < 2; ++c) {
    const auto [mean, var] = BatchMeanVar(x, l, c);
    EXPECT_NEAR(f.layer->running_stats().mean[c], mean, 1e-12);
    EXPECT_NEAR(f.layer->running_stats().var[c], var, 1e-12);
  }
  f.layer->set_momentum(MomentumMode::kTorch, -1);  // the options' again
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  const std::vector<RoundUpdate> sent = f.aggregator.updates();
  ASSERT_EQ(sent.size(), 2u);
  ASSERT_TRUE(sent[0].momentum.has_value());
  EXPECT_EQ(sent[0].momentum->mode, MomentumMode::kTorch);
  EXPECT_EQ(sent[0].momentum->momentum, 1.0);
  EXPECT_FALSE(sent[0].imported.has_value());
  EXPECT_TRUE(sent[1].empty());
}

// torch's load_state_dict / reset_running_stats: the next round carries
// the statistics and starts from them; a failed round keeps them pending.
TEST(SyncBatchNormChangesTest, ImportedStatisticsGoWithTheNextRound) {
  SoloFixture f(/*num_features=*/2);
  std::mt19937_64 rng(22);
  Layout l{4, 2, {2}, false};
  std::vector<float> x = RandomTensor(l, rng, -1, 2), y = Poisoned(l);
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  RunningStats loaded;
  loaded.num_batches_tracked = 7;
  loaded.mean = {0.5, -3};
  loaded.var = {2, 0.25};
  EXPECT_EQ(f.layer->ImportRunningStats(RunningStats::Initial(3)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(f.layer->ImportRunningStats(loaded).ok());
  EXPECT_EQ(f.layer->running_stats().mean, loaded.mean);
  f.aggregator.FailForward(absl::UnavailableError("down"));
  EXPECT_FALSE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  f.aggregator.FailForward(absl::OkStatus());
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  const std::vector<RoundUpdate> sent = f.aggregator.updates();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].empty());
  for (int i : {1, 2}) {
    ASSERT_TRUE(sent[i].imported.has_value()) << i;
    EXPECT_EQ(sent[i].imported->mean, loaded.mean);
    EXPECT_EQ(sent[i].imported->num_batches_tracked, 7);
  }
  const RunningStats& r = f.layer->running_stats();
  EXPECT_EQ(r.num_batches_tracked, 8);
  for (int c = 0; c < 2; ++c) {
    const auto [mean, var] = BatchMeanVar(x, l, c);
    EXPECT_NEAR(r.mean[c], 0.9 * loaded.mean[c] + 0.1 * mean, 1e-12);
    EXPECT_NEAR(r.var[c], 0.9 * loaded.var[c] + 0.1 * var, 1e-12);
  }
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_TRUE(f.aggregator.updates()[3].empty()) << "sent once";
}

// The workers of a node must change a layer alike.
TEST(SyncBatchNormChangesTest, WorkersOfANodeThatImportDifferentlyFail) {
  FakeService service(2);
  std::mt19937_64 rng(23);
  Layout l{3, 2, {}, false};
  std::vector<absl::Status> got(2);
  std::vector<std::vector<float>> xs = {RandomTensor(l, rng, 0, 1),
                                        RandomTensor(l, rng, 0, 1)};
  RunWorkers(2, [&](int w) {
    std::unique_ptr<NodeGroup> member = service.node->Member(w);
    SyncBatchNormOptions options;
    options.num_features = 2;
    SyncBatchNorm layer(0, options, member.get(), nullptr);
    if (w == 1) {
      ASSERT_TRUE(layer.ImportRunningStats(RunningStats::Initial(2)).ok());
    }
    std::vector<float> y = Poisoned(l);
    got[w] = layer.Forward(Ref(xs[w], l), Ref(y, l));
  });
  for (const absl::Status& s : got) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("changed layer 0 differently"));
  }
  EXPECT_EQ(service.aggregator->forward_calls(), 0);
}

TEST(SyncBatchNormErrorTest, InferredChannelsThenAWrongCount) {
  SoloFixture f(/*num_features=*/0);
  std::mt19937_64 rng(1);
  Layout l{4, 6, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  EXPECT_EQ(f.layer->num_features(), 0);
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  EXPECT_EQ(f.layer->num_features(), 6);
  EXPECT_EQ(f.layer->weight().size(), 6u);
  EXPECT_EQ(f.layer->running_stats().mean.size(), 6u);

  Layout wrong{4, 5, {3}, false};
  std::vector<float> x2 = RandomTensor(wrong, rng, 0, 1), y2 = Poisoned(wrong);
  absl::Status s = f.layer->Forward(Ref(x2, wrong), Ref(y2, wrong));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("expected 6 channels"));
  EXPECT_EQ(f.layer->step(), 1);
  EXPECT_EQ(f.aggregator.forward_calls(), 1);
}

TEST(SyncBatchNormErrorTest, WrongChannelCountIsInvalidArgument) {
  SoloFixture f(/*num_features=*/4);
  std::mt19937_64 rng(2);
  Layout l{3, 5, {2}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  absl::Status s = f.layer->Forward(Ref(x, l), Ref(y, l));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("expected 4 channels"));
  EXPECT_EQ(f.aggregator.forward_calls(), 0);
}

TEST(SyncBatchNormErrorTest, OutputOrResidualOfAnotherShape) {
  SoloFixture f(/*num_features=*/3);
  std::mt19937_64 rng(3);
  Layout l{4, 3, {2}, false}, other{4, 3, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1);
  std::vector<float> y_other = Poisoned(other), y = Poisoned(l);
  std::vector<float> z_other = RandomTensor(other, rng, 0, 1);
  absl::Status s = f.layer->Forward(Ref(x, l), Ref(y_other, other));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("output"));
  TensorRef z = Ref(z_other, other);
  s = f.layer->Forward(Ref(x, l), Ref(y, l), &z);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(f.layer->step(), 0);
  EXPECT_EQ(f.aggregator.forward_calls(), 0);
}

TEST(SyncBatchNormErrorTest, BackwardWithoutForwardIsFailedPrecondition) {
  SoloFixture f(/*num_features=*/3);
  std::mt19937_64 rng(4);
  Layout l{4, 3, {2}, false};
  std::vector<float> dy = RandomTensor(l, rng, 0, 1), gi = Poisoned(l);
  absl::Status s = f.layer->Backward(Ref(dy, l), Ref(gi, l));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(f.aggregator.backward_calls(), 0);
}

TEST(SyncBatchNormErrorTest, BackwardArgumentsOfTheWrongShape) {
  SoloFixture f(/*num_features=*/3);
  std::mt19937_64 rng(5);
  Layout l{4, 3, {2}, false}, other{4, 3, {3}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  std::vector<float> z = RandomTensor(l, rng, 0, 1);
  TensorRef zr = Ref(z, l);
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l), &zr).ok());

  std::vector<float> dy_other = RandomTensor(other, rng, 0, 1);
  std::vector<float> gi_other = Poisoned(other);
  std::vector<float> dy = RandomTensor(l, rng, 0, 1), gi = Poisoned(l);
  std::vector<float> gz = Poisoned(l);
  absl::Status s =
      f.layer->Backward(Ref(dy_other, other), Ref(gi_other, other));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("dy of shape"));
  TensorRef gzr = Ref(gz, l);
  s = f.layer->Backward(Ref(dy, l), Ref(gi_other, other), &gzr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = f.layer->Backward(Ref(dy, l), Ref(gi, l));  // the forward had z
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("grad_z"));
  EXPECT_EQ(f.aggregator.backward_calls(), 0);

  // The saved forward is still good for a correct Backward.
  s = f.layer->Backward(Ref(dy, l), Ref(gi, l), &gzr);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(f.aggregator.backward_calls(), 1);
  for (float v : gi) EXPECT_FALSE(std::isnan(v));
}

TEST(SyncBatchNormErrorTest, TrainingWithoutAGroupIsFailedPrecondition) {
  SyncBatchNormOptions options;
  options.num_features = 2;
  SyncBatchNorm layer(0, options, nullptr, nullptr);
  std::mt19937_64 rng(6);
  Layout l{3, 2, {}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  absl::Status s = layer.Forward(Ref(x, l), Ref(y, l));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(layer.step(), 0);
}

TEST(SyncBatchNormErrorTest, RoundFailurePropagatesAndKeepsTheStep) {
  constexpr int64_t kChannels = 2;
  const int64_t batches[kWorkers] = {3, 0, 2};
  std::mt19937_64 rng(7);
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  options.initial_running_mean = RandomValues(kChannels, rng, -1, 1);
  options.initial_running_var = RandomValues(kChannels, rng, 0.5, 2);
  std::vector<Shard> shards(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    shards[w].layout = Layout{batches[w], kChannels, {3}, false};
    shards[w].x = RandomTensor(shards[w].layout, rng, 1, 1);
    shards[w].dy = RandomTensor(shards[w].layout, rng, 0, 1);
  }
  const absl::Status deadline =
      absl::DeadlineExceededError("ranks [4, 5] did not reach the round");
  const absl::Status aborted = absl::AbortedError("the job was deleted");
  FakeService service(kWorkers);
  service.aggregator->FailForward(deadline);

  struct Result {
    absl::Status failed_forward, backward_after_failure, retried_forward,
        failed_backward;
    int64_t step_after_failure = -1, step_after_retry = -1;
    RunningStats running_after_failure;
  };
  std::vector<Result> got(kWorkers);
  // Workers wait here between phases so that the test can change the fake.
  absl::Mutex mu;
  int phase_done = 0;
  int phase = 0;
  auto barrier = [&](int w) {
    absl::MutexLock lock(&mu);
    const int my_phase = phase;
    if (++phase_done == kWorkers) {
      phase_done = 0;
      ++phase;
      if (phase == 1) service.aggregator->FailForward(absl::OkStatus());
      if (phase == 2) service.aggregator->FailBackward(aborted);
    }
    auto next = [&phase, my_phase]() { return phase != my_phase; };
    mu.Await(absl::Condition(&next));
  };
  RunWorkers(kWorkers, [&](int w) {
    std::unique_ptr<NodeGroup> member = service.node->Member(w);
    SyncBatchNorm layer(1, options, member.get(), nullptr);
    Shard& s = shards[w];
    std::vector<float> y = Poisoned(s.layout), gi = Poisoned(s.layout);
    TensorRef x = Ref(s.x, s.layout), yr = Ref(y, s.layout);
    TensorRef dy = Ref(s.dy, s.layout), gir = Ref(gi, s.layout);
    Result& r = got[w];
    r.failed_forward = layer.Forward(x, yr);
    r.step_after_failure = layer.step();
    r.running_after_failure = layer.running_stats();
    r.backward_after_failure = layer.Backward(dy, gir);
    barrier(w);
    r.retried_forward = layer.Forward(x, yr);
    r.step_after_retry = layer.step();
    barrier(w);
    r.failed_backward = layer.Backward(dy, gir);
  });

  for (int w = 0; w < kWorkers; ++w) {
    SCOPED_TRACE(testing::Message() << "worker " << w);
    const Result& r = got[w];
    EXPECT_EQ(r.failed_forward, deadline);
    EXPECT_EQ(r.step_after_failure, 0);
    EXPECT_EQ(r.running_after_failure.mean, options.initial_running_mean);
    EXPECT_EQ(r.running_after_failure.var, options.initial_running_var);
    EXPECT_EQ(r.running_after_failure.num_batches_tracked, 0);
    EXPECT_EQ(r.backward_after_failure.code(),
              absl::StatusCode::kFailedPrecondition)
        << r.backward_after_failure;
    EXPECT_TRUE(r.retried_forward.ok()) << r.retried_forward;
    EXPECT_EQ(r.step_after_retry, 1);
    EXPECT_EQ(r.failed_backward, aborted);
  }
  // The retry went out as the same step 0.
  EXPECT_EQ(service.aggregator->forward_steps(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(service.aggregator->backward_calls(), 1);
}

// ---- several backwards through one forward ----------------------------

// autograd's retain_graph=True: two backwards through one forward are
// backward rounds 0 and 1 of its step, each with its own upstream gradient,
// and each gives that gradient's plain batch-norm result; the next
// forward's first backward is round 0 of the next step.
TEST(SyncBatchNormBackwardsTest, EachBackwardThroughAForwardIsItsOwnRound) {
  constexpr int64_t kChannels = 3;
  constexpr int kBackwards = 2;
  const int64_t batches[kWorkers] = {3, 0, 2};
  std::mt19937_64 rng(31);
  SyncBatchNormOptions options;
  options.num_features = kChannels;
  options.fuse_relu = true;
  const std::vector<double> g = RandomValues(kChannels, rng, 0.5, 2);
  const std::vector<double> b = RandomValues(kChannels, rng, -1, 1);
  std::vector<float> gamma(g.begin(), g.end()), beta(b.begin(), b.end());
  RefAffine affine{LongVec(gamma.begin(), gamma.end()),
                   LongVec(beta.begin(), beta.end())};
  // shards[k]: the same inputs with the upstream gradient of backward k.
  std::vector<std::vector<Shard>> shards(kBackwards,
                                         std::vector<Shard>(kWorkers));
  for (int w = 0; w < kWorkers; ++w) {
    const Layout l{batches[w], kChannels, {2}, false};
    const std::vector<float> x = RandomTensor(l, rng, 1.5, 1.0);
    for (int k = 0; k < kBackwards; ++k) {
      shards[k][w].layout = l;
      shards[k][w].x = x;
      shards[k][w].dy = RandomTensor(l, rng, 0.3 - k, 1.0 + k);
    }
  }

  struct Result {
    absl::Status forward, next_forward;
    absl::Status backward[kBackwards], next_backward;
    std::vector<float> grad_input[kBackwards], next_grad_input;
    std::vector<double> grad_weight[kBackwards], grad_bias[kBackwards];
  };
  FakeService service(kWorkers);
  std::vector<Result> got(kWorkers);
  RunWorkers(kWorkers, [&](int w) {
    std::unique_ptr<NodeGroup> member = service.node->Member(w);
    SyncBatchNorm layer(4, options, member.get(), nullptr);
    layer.weight() = gamma;
    layer.bias() = beta;
    const Layout& l = shards[0][w].layout;
    Result& r = got[w];
    std::vector<float> y = Poisoned(l);
    r.forward = layer.Forward(Ref(shards[0][w].x, l), Ref(y, l));
    if (!r.forward.ok()) return;
    for (int k = 0; k < kBackwards; ++k) {
      r.grad_input[k] = Poisoned(l);
      r.backward[k] =
          layer.Backward(Ref(shards[k][w].dy, l), Ref(r.grad_input[k], l));
      r.grad_weight[k] = layer.grad_weight();
      r.grad_bias[k] = layer.grad_bias();
    }
    // The next step, backward once with the second gradient.
    std::vector<float> y2 = Poisoned(l);
    r.next_forward = layer.Forward(Ref(shards[0][w].x, l), Ref(y2, l));
    if (!r.next_forward.ok()) return;
    r.next_grad_input = Poisoned(l);
    r.next_backward =
        layer.Backward(Ref(shards[1][w].dy, l), Ref(r.next_grad_input, l));
  });

  std::vector<Layout> layouts;
  std::vector<const std::vector<float>*> xs;
  for (const Shard& sh : shards[0]) {
    layouts.push_back(sh.layout);
    xs.push_back(&sh.x);
  }
  const reference::Stats stats = BatchStats(layouts, xs, kChannels);
  const Normalization n = NormOf(stats.mean, stats.Var(), affine, options.eps);
  for (int k = 0; k < kBackwards; ++k) {
    const std::vector<RefOutputs> ref =
        RefBatchNorm(shards[k], n, stats.count, /*residual=*/false,
                     /*relu=*/true, /*global_backward=*/true);
    for (int w = 0; w < kWorkers; ++w) {
      SCOPED_TRACE(testing::Message() << "backward " << k << " worker " << w);
      const Result& r = got[w];
      ASSERT_TRUE(r.forward.ok()) << r.forward;
      ASSERT_TRUE(r.backward[k].ok()) << r.backward[k];
      ExpectClose(r.grad_input[k], ref[w].grad_input, kOutputTol, "grad_input");
      ExpectClose(r.grad_weight[k], ref[w].grad_weight, 1e-9, "grad_weight");
      ExpectClose(r.grad_bias[k], ref[w].grad_bias, 1e-9, "grad_bias");
      if (k == 1) {
        ASSERT_TRUE(r.next_forward.ok()) << r.next_forward;
        ASSERT_TRUE(r.next_backward.ok()) << r.next_backward;
        ExpectClose(r.next_grad_input, ref[w].grad_input, kOutputTol,
                    "next step's grad_input");
      }
    }
  }
  using Round = std::pair<int64_t, int>;  // step, backward index
  EXPECT_EQ(service.aggregator->backward_rounds(),
            (std::vector<Round>{{0, 0}, {0, 1}, {1, 0}}));
  EXPECT_EQ(service.aggregator->forward_steps(), (std::vector<int64_t>{0, 1}));
}

// Only a completed round advances the index: a Backward that failed, in its
// round or locally before it (telling the node with that index), is run
// again as the same round.
TEST(SyncBatchNormBackwardsTest, AFailedBackwardIsRunAgainWithItsIndex) {
  SoloFixture f(/*num_features=*/2);
  std::mt19937_64 rng(32);
  Layout l{4, 2, {3}, false}, other{4, 2, {2}, false};
  std::vector<float> x = RandomTensor(l, rng, 0, 1), y = Poisoned(l);
  std::vector<float> dy = RandomTensor(l, rng, 0, 1), gi = Poisoned(l);
  std::vector<float> dy_other = RandomTensor(other, rng, 0, 1);
  const absl::Status aborted = absl::AbortedError("round aborted");
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  ASSERT_TRUE(f.layer->Backward(Ref(dy, l), Ref(gi, l)).ok());  // round 0
  f.aggregator.FailBackward(aborted);
  EXPECT_EQ(f.layer->Backward(Ref(dy, l), Ref(gi, l)), aborted);  // 1 fails
  f.aggregator.FailBackward(absl::OkStatus());
  EXPECT_EQ(f.layer->Backward(Ref(dy_other, other), Ref(gi, l)).code(),
            absl::StatusCode::kInvalidArgument);  // fails 1 locally
  ASSERT_TRUE(f.layer->Backward(Ref(dy, l), Ref(gi, l)).ok());  // 1 again
  ASSERT_TRUE(f.layer->Backward(Ref(dy, l), Ref(gi, l)).ok());  // 2
  ASSERT_TRUE(f.layer->Forward(Ref(x, l), Ref(y, l)).ok());
  ASSERT_TRUE(f.layer->Backward(Ref(dy, l), Ref(gi, l)).ok());  // step 1: 0
  using Round = std::pair<int64_t, int>;  // step, backward index
  EXPECT_EQ(f.aggregator.backward_rounds(),
            (std::vector<Round>{{0, 0}, {0, 1}, {0, 1}, {0, 2}, {1, 0}}));
  EXPECT_EQ(f.aggregator.failed_backwards(), (std::vector<Round>{{0, 1}}));
}

}  // namespace
}  // namespace syncnorm
