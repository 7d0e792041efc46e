#include "tests/testing/reference.h"

#include <algorithm>
#include <cmath>

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
};

double Round(double x) { return static_cast<double>(static_cast<float>(x)); }

struct LayerTape {
  Canon x, y;
  std::vector<double> mean, invstd;
};

void UpdateRunning(const StackConfig& config, int64_t n,
                   const std::vector<double>& mean,
                   const std::vector<double>& var, ReferenceStats& s) {
  if (n == 0) return;
  s.num_batches_tracked += 1;
  const double m = config.momentum;
  for (size_t c = 0; c < mean.size(); ++c) {
    // torch: unbiased = biased * n / (n - 1).
    const double v = config.biased_running_var
                         ? var[c]
                         : var[c] * static_cast<double>(n) / (n - 1);
    switch (config.mode) {
      case MomentumMode::kTorch:
        s.mean[c] = (1 - m) * s.mean[c] + m * mean[c];
        s.var[c] = (1 - m) * s.var[c] + m * v;
        break;
      case MomentumMode::kDecay:
        s.mean[c] = m * s.mean[c] + (1 - m) * mean[c];
        s.var[c] = m * s.var[c] + (1 - m) * v;
        break;
      case MomentumMode::kCumulative: {
        const double k = static_cast<double>(s.num_batches_tracked);
        s.mean[c] += (mean[c] - s.mean[c]) / k;
        s.var[c] += (v - s.var[c]) / k;
        break;
      }
    }
  }
}

LayerTape ForwardLayer(const StackConfig& config, int layer, Canon x,
                       ReferenceStats& running) {
  LayerTape t;
  const int C = x.channels;
  t.mean.assign(C, 0.0);
  t.invstd.assign(C, 0.0);
  std::vector<double> var(C, 0.0);
  const double count = static_cast<double>(x.n * x.p);
  for (int c = 0; c < C && x.n > 0; ++c) {
    double sum = 0;
    for (int64_t s = 0; s < x.n; ++s)
      for (int64_t q = 0; q < x.p; ++q) sum += x.at(s, c, q);
    const double mean = sum / count;
    double m2 = 0;
    for (int64_t s = 0; s < x.n; ++s)
      for (int64_t q = 0; q < x.p; ++q)
        m2 += (x.at(s, c, q) - mean) * (x.at(s, c, q) - mean);
    t.mean[c] = mean;
    var[c] = m2 / count;
    t.invstd[c] = 1.0 / std::sqrt(var[c] + config.eps);
  }
  UpdateRunning(config, static_cast<int64_t>(count), t.mean, var, running);
  t.y = x;
  for (int64_t s = 0; s < x.n; ++s) {
    for (int c = 0; c < C; ++c) {
      for (int64_t q = 0; q < x.p; ++q) {
        double v = (x.at(s, c, q) - t.mean[c]) * t.invstd[c] *
                       Gamma(config, layer, c) +
                   Beta(config, layer, c);
        if (config.fuse_relu) v = std::max(v, 0.0);
        t.y.at(s, c, q) = Round(v);
      }
    }
  }
  t.x = std::move(x);
  return t;
}

Canon BackwardLayer(const StackConfig& config, int layer, const LayerTape& t,
                    const Canon& dy) {
  Canon dx = dy;
  const int C = dy.channels;
  const double count = static_cast<double>(dy.n * dy.p);
  for (int c = 0; c < C && dy.n > 0; ++c) {
    auto masked = [&](int64_t s, int64_t q) {
      const double g = dy.v[(s * C + c) * dy.p + q];
      return config.fuse_relu && t.y.v[(s * C + c) * dy.p + q] <= 0 ? 0.0 : g;
    };
    double sum_dy = 0, sum_dy_xmu = 0;
    for (int64_t s = 0; s < dy.n; ++s) {
      for (int64_t q = 0; q < dy.p; ++q) {
        sum_dy += masked(s, q);
        sum_dy_xmu +=
            masked(s, q) * (t.x.v[(s * C + c) * dy.p + q] - t.mean[c]);
      }
    }
    const double k = Gamma(config, layer, c) * t.invstd[c];
    for (int64_t s = 0; s < dy.n; ++s) {
      for (int64_t q = 0; q < dy.p; ++q) {
        const double xmu = t.x.v[(s * C + c) * dy.p + q] - t.mean[c];
        dx.at(s, c, q) =
            Round(k * (masked(s, q) - sum_dy / count -
                       xmu * t.invstd[c] * t.invstd[c] * sum_dy_xmu / count));
      }
    }
  }
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
  r.running.assign(groups, std::vector<ReferenceStats>(L));
  for (int g = 0; g < groups; ++g) {
    for (int l = 0; l < L; ++l) {
      r.running[g][l].mean.assign(config.channels[l], 0.0);
      r.running[g][l].var.assign(config.channels[l], 1.0);
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
        tape.push_back(ForwardLayer(config, l, std::move(x), r.running[g][l]));
        if (l + 1 < L) x = Mix(config, l, tape.back().y, false);
      }
      Canon dy = tape.back().y;
      for (int64_t s = 0; s < dy.n; ++s)
        for (int c = 0; c < dy.channels; ++c)
          for (int64_t q = 0; q < dy.p; ++q)
            dy.at(s, c, q) = LossGrad(config, step, base + s, c, q);
      std::vector<Canon> dxs(L);
      for (int l = L - 1; l >= 0; --l) {
        dxs[l] = BackwardLayer(config, l, tape[l], dy);
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
