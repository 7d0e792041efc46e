// The float64 (long double) reference of batch norm that every test holds
// the kernels, the layer and the service to: statistics, forward output,
// backward sums, input gradient and running statistics, written from their
// definitions (DESIGN.md), independently of the kernels and formulas.h.
//
// Plain C++, header only: no Abseil, gtest or CUDA, so that the CUDA checks
// (kernels/kernel_check.h) and the standalone device check built by nvcc
// alone use it too. Test-only.
#ifndef SYNCNORM_KERNELS_TESTING_BATCH_NORM_REFERENCE_H_
#define SYNCNORM_KERNELS_TESTING_BATCH_NORM_REFERENCE_H_

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/batch_norm_types.h"
#include "kernels/formulas.h"

namespace syncnorm::reference {

// long double: float64 at least, and x87's 64-bit significand on x86-64, so
// that the reference's own rounding stays far below every tolerance.
using Real = long double;
using Reals = std::vector<Real>;

template <typename T>
Reals ToReals(const std::vector<T>& v) {
  return Reals(v.begin(), v.end());
}

// A tensor's shape and layout: (N, C, spatial...), or (N, spatial..., C)
// when channels_last and of rank > 2; 2-D is (N, C) either way. The index
// math is written out here, not taken from the kernels' Geometry.
struct Layout {
  std::vector<int64_t> shape;
  bool channels_last = false;

  bool last() const { return channels_last && shape.size() > 2; }
  int64_t n() const { return shape[0]; }
  int64_t c() const { return last() ? shape.back() : shape[1]; }
  int64_t spatial() const {
    int64_t s = 1;
    const size_t end = last() ? shape.size() - 1 : shape.size();
    for (size_t i = last() ? 1 : 2; i < end; ++i) s *= shape[i];
    return s;
  }
  int64_t size() const { return n() * c() * spatial(); }
  // Flat offset of batch item b, channel ch, spatial position s.
  int64_t At(int64_t b, int64_t ch, int64_t s) const {
    return last() ? (b * spatial() + s) * c() + ch
                  : (b * c() + ch) * spatial() + s;
  }
  // The kernels' [outer, channels, inner] view, by hand.
  Geometry geometry() const {
    Geometry g;
    g.channels = c();
    g.outer = last() || shape.size() == 2 ? n() * spatial() : n();
    g.inner = last() || shape.size() == 2 ? 1 : spatial();
    return g;
  }
  // The shape and layout, e.g. "3x5x6x7_first".
  std::string Name() const {
    std::string s;
    for (size_t i = 0; i < shape.size(); ++i) {
      s += (i ? "x" : "") + std::to_string(shape[i]);
    }
    return s + (channels_last ? "_last" : "_first");
  }
};

inline std::ostream& operator<<(std::ostream& os, const Layout& l) {
  return os << l.Name();
}

// Calls fn(channel, flat offset) for every element: batch item by batch
// item, channel by channel, position by position.
template <typename Fn>
void ForEachElement(const Layout& l, Fn&& fn) {
  for (int64_t b = 0; b < l.n(); ++b) {
    for (int64_t ch = 0; ch < l.c(); ++ch) {
      for (int64_t s = 0; s < l.spatial(); ++s) fn(ch, l.At(b, ch, s));
    }
  }
}

// Per-channel count, mean and M2 (the sum of squared deviations from the
// mean), in two passes.
struct Stats {
  int64_t count = 0;
  Reals mean, m2;

  // The biased variance M2 / count; zeros for count 0.
  Reals Var() const {
    Reals var(m2.size(), 0);
    for (size_t c = 0; c < m2.size() && count > 0; ++c) var[c] = m2[c] / count;
    return var;
  }
};

// The statistics of the concatenated batch of several tensors (shards) of
// `channels` channels; xs[i] has layouts[i].
template <typename T>
Stats Moments(int64_t channels, const std::vector<Layout>& layouts,
              const std::vector<const std::vector<T>*>& xs) {
  Stats r{0, Reals(channels, 0), Reals(channels, 0)};
  for (size_t w = 0; w < layouts.size(); ++w) {
    r.count += layouts[w].n() * layouts[w].spatial();
    ForEachElement(layouts[w],
                   [&](int64_t ch, int64_t i) { r.mean[ch] += (*xs[w])[i]; });
  }
  if (r.count == 0) return r;
  for (Real& m : r.mean) m /= r.count;
  for (size_t w = 0; w < layouts.size(); ++w) {
    ForEachElement(layouts[w], [&](int64_t ch, int64_t i) {
      const Real d = (*xs[w])[i] - r.mean[ch];
      r.m2[ch] += d * d;
    });
  }
  return r;
}

template <typename T>
Stats Moments(const Layout& l, const std::vector<T>& x) {
  return Moments<T>(l.c(), {l}, {&x});
}

// Batch norm's per-channel normalization: (x - mean) * invstd * weight +
// bias.
struct Normalization {
  Reals mean, invstd;
  Reals weight;  // empty: no scale
  Reals bias;    // empty: no shift
};

// The normalization by `mean` and the biased `var`: invstd = 1 / sqrt(var +
// eps).
inline Normalization Normalize(const Reals& mean, const Reals& var, double eps,
                               Reals weight = {}, Reals bias = {}) {
  Normalization n{mean, Reals(var.size()), std::move(weight), std::move(bias)};
  for (size_t c = 0; c < var.size(); ++c) {
    n.invstd[c] = 1.0L / std::sqrt(var[c] + eps);
  }
  return n;
}

// The forward output: the normalization of x, plus z when given, then the
// ReLU when `relu`.
template <typename T>
Reals Forward(const Layout& l, const std::vector<T>& x, const Normalization& n,
              const std::vector<T>* z, bool relu) {
  Reals y(l.size());
  ForEachElement(l, [&](int64_t ch, int64_t i) {
    Real v = (static_cast<Real>(x[i]) - n.mean[ch]) * n.invstd[ch] *
             (n.weight.empty() ? 1.0L : n.weight[ch]);
    if (!n.bias.empty()) v += n.bias[ch];
    if (z != nullptr) v += (*z)[i];
    if (relu && v < 0) v = 0;
    y[i] = v;
  });
  return y;
}

// dy at offset i through the ReLU whose output is y: dy where y > 0, else
// 0; dy itself without y (no ReLU).
template <typename T, typename Y>
Real MaskedDy(const std::vector<T>& dy, const std::vector<Y>* y, int64_t i) {
  return (y == nullptr || (*y)[i] > 0) ? static_cast<Real>(dy[i]) : 0.0L;
}

// The sums of a backward round per channel: sum(dy') and
// sum(dy' * (x - mean)), dy' = MaskedDy, and the sums of their terms'
// magnitudes (the scale of their rounding errors).
struct GradSumsRef {
  Reals sum_dy, sum_dy_xmu;
  Reals abs_dy, abs_dy_xmu;
};

template <typename T, typename Y>
GradSumsRef BackwardSums(const Layout& l, const std::vector<T>& dy,
                         const std::vector<T>& x, const std::vector<Y>* y,
                         const Reals& mean) {
  GradSumsRef r{Reals(l.c(), 0), Reals(l.c(), 0), Reals(l.c(), 0),
                Reals(l.c(), 0)};
  ForEachElement(l, [&](int64_t ch, int64_t i) {
    const Real d = MaskedDy(dy, y, i);
    const Real t = d * (static_cast<Real>(x[i]) - mean[ch]);
    r.sum_dy[ch] += d;
    r.sum_dy_xmu[ch] += t;
    r.abs_dy[ch] += std::fabs(d);
    r.abs_dy_xmu[ch] += std::fabs(t);
  });
  return r;
}

// The input gradient weight * invstd * (dy' - mean_dy - (x - mean) *
// invstd^2 * mean_dy_xmu), weight 1 when n.weight is empty; mean_dy and
// mean_dy_xmu are the group's sums over its count (zeros: the statistics
// held constant, as when frozen).
template <typename T, typename Y>
Reals GradInput(const Layout& l, const std::vector<T>& dy,
                const std::vector<T>& x, const std::vector<Y>* y,
                const Normalization& n, const Reals& mean_dy,
                const Reals& mean_dy_xmu) {
  Reals gi(l.size());
  ForEachElement(l, [&](int64_t ch, int64_t i) {
    const Real invstd = n.invstd[ch];
    const Real w = n.weight.empty() ? 1.0L : n.weight[ch];
    const Real xmu = static_cast<Real>(x[i]) - n.mean[ch];
    gi[i] = w * invstd *
            (MaskedDy(dy, y, i) - mean_dy[ch] -
             xmu * invstd * invstd * mean_dy_xmu[ch]);
  });
  return gi;
}

// A layer's running statistics.
struct Running {
  int64_t num_batches_tracked = 0;
  Reals mean, var;
};

// One forward round's update of `r` by `batch` under a rule with its
// momentum resolved: kTorch (1 - m) * r + m * b, kDecay m * r + (1 - m) * b,
// kCumulative r + (b - r) / num_batches_tracked (after counting this
// batch); the batch's var unbiased (n / (n - 1)) unless `biased_var`. An
// empty batch changes nothing.
inline void UpdateRunning(MomentumMode mode, Real momentum, bool biased_var,
                          const Stats& batch, Running& r) {
  if (batch.count == 0) return;
  ++r.num_batches_tracked;
  const Reals var = batch.Var();
  const Real n = batch.count;
  for (size_t c = 0; c < r.mean.size(); ++c) {
    const Real values[2] = {batch.mean[c],
                            biased_var ? var[c] : var[c] * n / (n - 1)};
    Real* running[2] = {&r.mean[c], &r.var[c]};
    for (int k = 0; k < 2; ++k) {
      Real& v = *running[k];
      switch (mode) {
        case MomentumMode::kTorch:
          v = (1 - momentum) * v + momentum * values[k];
          break;
        case MomentumMode::kDecay:
          v = momentum * v + (1 - momentum) * values[k];
          break;
        case MomentumMode::kCumulative:
          v = v + (values[k] - v) / r.num_batches_tracked;
          break;
      }
    }
  }
}

}  // namespace syncnorm::reference

#endif  // SYNCNORM_KERNELS_TESTING_BATCH_NORM_REFERENCE_H_
