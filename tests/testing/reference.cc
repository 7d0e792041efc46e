#include "tests/testing/reference.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/testing/batch_norm_reference.h"

namespace syncnorm::testing {
namespace {

// One group's tensor in (sample, channel, position) order.
struct Canon {
  int64_t n = 0;
  int channels = 0;
  int64_t p = 0;
  std::vector<double> v;
  double& at(int64_t s, int c, int64_t q) {
    return v[(s * channels + c) * p + q];
  }
  reference::Layout layout() const { return {{n, channels, p}, false}; }
};

double Round(double x) { return static_cast<double>(static_cast<float>(x)); }

struct LayerTape {
  Canon x, y;
  reference::Normalization norm;  // the batch's, with the layer's gamma, beta
};

LayerTape ForwardLayer(const StackConfig& config, int layer, Canon x,
                       reference::Running& running) {
  LayerTape t;
  const int C = x.channels;
  const reference::Stats stats = reference::Moments(x.layout(), x.v);
  reference::Reals gamma(C), beta(C);
  for (int c = 0; c < C; ++c) {
    gamma[c] = Gamma(config, layer, c);
    beta[c] = Beta(config, layer, c);
  }
  t.norm = reference::Normalize(stats.mean, stats.Var(), config.eps,
                                std::move(gamma), std::move(beta));
  reference::UpdateRunning(config.mode, config.momentum,
                           config.biased_running_var, stats, running);
  const std::vector<double>* no_z = nullptr;
  const reference::Reals y =
      reference::Forward(x.layout(), x.v, t.norm, no_z, config.fuse_relu);
  t.y = x;
  for (size_t i = 0; i < y.size(); ++i) t.y.v[i] = Round(y[i]);
  t.x = std::move(x);
  return t;
}

Canon BackwardLayer(const StackConfig& config, const LayerTape& t,
                    const Canon& dy) {
  const int C = dy.channels;
  const double count = static_cast<double>(dy.n * dy.p);
  const std::vector<double>* mask = config.fuse_relu ? &t.y.v : nullptr;
  const reference::GradSumsRef sums =
      reference::BackwardSums(dy.layout(), dy.v, t.x.v, mask, t.norm.mean);
  reference::Reals mean_dy(C, 0), mean_dy_xmu(C, 0);
  for (int c = 0; c < C && count > 0; ++c) {
    mean_dy[c] = sums.sum_dy[c] / count;
    mean_dy_xmu[c] = sums.sum_dy_xmu[c] / count;
  }
  const reference::Reals gi = reference::GradInput(
      dy.layout(), dy.v, t.x.v, mask, t.norm, mean_dy, mean_dy_xmu);
  Canon dx = dy;
  for (size_t i = 0; i < gi.size(); ++i) dx.v[i] = Round(gi[i]);
  return dx;
}

Canon Mix(const StackConfig& config, int layer, const Canon& in,
          bool transpose) {
  Canon out;
  out.n = in.n;
  out.p = in.p;
  out.channels =
      transpose ? config.channels[layer] : config.channels[layer + 1];
  out.v.assign(out.n * out.channels * out.p, 0.0);
  std::vector<double> w(out.channels * in.channels);
  for (int o = 0; o < out.channels; ++o)
    for (int i = 0; i < in.channels; ++i)
      w[o * in.channels + i] = transpose ? MixWeight(config, layer, i, o)
                                         : MixWeight(config, layer, o, i);
  for (int64_t s = 0; s < in.n; ++s) {
    for (int64_t q = 0; q < in.p; ++q) {
      for (int o = 0; o < out.channels; ++o) {
        double acc = 0;
        for (int i = 0; i < in.channels; ++i) {
          acc +=
              w[o * in.channels + i] * in.v[(s * in.channels + i) * in.p + q];
        }
        out.at(s, o, q) = Round(acc);
      }
    }
  }
  return out;
}

// Cuts one rank's samples out of its group's tensor, in the config layout.
std::vector<double> Slice(const StackConfig& config, const Canon& t,
                          int64_t first, int64_t n) {
  std::vector<double> out(n * t.channels * t.p);
  for (int64_t s = 0; s < n; ++s)
    for (int c = 0; c < t.channels; ++c)
      for (int64_t q = 0; q < t.p; ++q)
        out[Index(config, t.channels, s, c, q)] =
            t.v[((first + s) * t.channels + c) * t.p + q];
  return out;
}

}  // namespace

ReferenceResult RunReference(const StackConfig& config) {
  const int L = config.layers();
  const int k = config.ranks_per_group();
  const int groups = config.world_size / k;
  ReferenceResult r;
  std::vector<std::vector<reference::Running>> running(
      groups, std::vector<reference::Running>(L));
  for (int g = 0; g < groups; ++g) {
    for (int l = 0; l < L; ++l) {
      running[g][l].mean.assign(config.channels[l], 0.0);
      running[g][l].var.assign(config.channels[l], 1.0);
    }
  }
  r.y.assign(L, std::vector<std::vector<double>>(config.world_size));
  r.dx = r.y;
  for (int64_t step = 0; step < config.steps; ++step) {
    const std::vector<int> sizes = ShardSizes(config, step);
    for (int g = 0; g < groups; ++g) {
      const int first_rank = g * k;
      const int64_t base = ShardOffset(config, step, first_rank);
      Canon x;
      x.channels = config.channels[0];
      x.p = config.positions();
      for (int i = 0; i < k; ++i) x.n += sizes[first_rank + i];
      x.v.resize(x.n * x.channels * x.p);
      for (int64_t s = 0; s < x.n; ++s)
        for (int c = 0; c < x.channels; ++c)
          for (int64_t q = 0; q < x.p; ++q)
            x.at(s, c, q) = InputValue(config, step, base + s, c, q);
      std::vector<LayerTape> tape;
      for (int l = 0; l < L; ++l) {
        tape.push_back(ForwardLayer(config, l, std::move(x), running[g][l]));
        if (l + 1 < L) x = Mix(config, l, tape.back().y, false);
      }
      Canon dy = tape.back().y;
      for (int64_t s = 0; s < dy.n; ++s)
        for (int c = 0; c < dy.channels; ++c)
          for (int64_t q = 0; q < dy.p; ++q)
            dy.at(s, c, q) = LossGrad(config, step, base + s, c, q);
      std::vector<Canon> dxs(L);
      for (int l = L - 1; l >= 0; --l) {
        dxs[l] = BackwardLayer(config, tape[l], dy);
        if (l > 0) dy = Mix(config, l - 1, dxs[l], true);
      }
      if (step != config.steps - 1) continue;
      int64_t first = 0;
      for (int i = 0; i < k; ++i) {
        const int rank = first_rank + i;
        for (int l = 0; l < L; ++l) {
          r.y[l][rank] = Slice(config, tape[l].y, first, sizes[rank]);
          r.dx[l][rank] = Slice(config, dxs[l], first, sizes[rank]);
        }
        first += sizes[rank];
      }
    }
  }
  r.running.assign(groups, std::vector<ReferenceStats>(L));
  for (int g = 0; g < groups; ++g) {
    for (int l = 0; l < L; ++l) {
      const reference::Running& from = running[g][l];
      r.running[g][l] = ReferenceStats{
          from.num_batches_tracked,
          std::vector<double>(from.mean.begin(), from.mean.end()),
          std::vector<double>(from.var.begin(), from.var.end())};
    }
  }
  return r;
}

double RelativeError(const std::vector<double>& a,
                     const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  if (!(diff == diff)) return INFINITY;  // NaN
  return scale > 0 ? diff / scale : diff;
}

}  // namespace syncnorm::testing
