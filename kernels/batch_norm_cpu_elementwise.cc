// Forward and BackwardElementwise on the CPU. Each element is computed in
// double from per-channel coefficients prepared once, and rounded once to
// float. y may alias x (and grad_input or grad_z may alias dy): every element
// is read before it is written, so the pointers carry no __restrict.
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_partition.h"

namespace syncnorm {
namespace cpu {
namespace {

// Per-channel coefficients are indexed by element within a channels-last row
// (kLast) and fixed within a channels-first row.
template <bool kLast>
inline int64_t Channel(int64_t j) {
  return kLast ? j : 0;
}

// The fused ReLU; NaN passes through as in torch.
inline double Relu(double v) { return v < 0.0 ? 0.0 : v; }

// y = (x - mean) * scale + shift (+ z), ReLU'd if kRelu, over one row piece.
template <bool kLast, bool kResidual, bool kRelu>
void ForwardPiece(const float* x, const float* z, float* y, int64_t len,
                  const double* mean, const double* scale,
                  const double* shift) {
  for (int64_t j = 0; j < len; ++j) {
    const int64_t c = Channel<kLast>(j);
    double v = (static_cast<double>(x[j]) - mean[c]) * scale[c] + shift[c];
    if (kResidual) v += static_cast<double>(z[j]);
    if (kRelu) v = Relu(v);
    y[j] = static_cast<float>(v);
  }
}

using ForwardPieceFn = void (*)(const float*, const float*, float*, int64_t,
                                const double*, const double*, const double*);

template <bool kLast>
ForwardPieceFn PickForward(bool residual, bool relu) {
  if (residual) {
    return relu ? &ForwardPiece<kLast, true, true>
                : &ForwardPiece<kLast, true, false>;
  }
  return relu ? &ForwardPiece<kLast, false, true>
              : &ForwardPiece<kLast, false, false>;
}

// Per-channel coefficients of the backward elementwise formula:
// grad_input = a * (dy - mean_dy - (x - mean) * k), a = weight * invstd,
// k = invstd^2 * mean_dy_xmu.
struct BackwardCoefficients {
  const double* mean;
  const double* a;
  const double* mean_dy;
  const double* k;
};

template <bool kLast, bool kMask, bool kGradZ>
void BackwardPiece(const float* dy, const float* x, const float* y,
                   float* grad_input, float* grad_z, int64_t len,
                   const BackwardCoefficients& co) {
  for (int64_t j = 0; j < len; ++j) {
    const int64_t c = Channel<kLast>(j);
    double d = static_cast<double>(dy[j]);
    if (kMask) d = y[j] > 0.0f ? d : 0.0;
    const double xmu = static_cast<double>(x[j]) - co.mean[c];
    grad_input[j] =
        static_cast<float>(co.a[c] * (d - co.mean_dy[c] - xmu * co.k[c]));
    if (kGradZ) grad_z[j] = static_cast<float>(d);
  }
}

using BackwardPieceFn = void (*)(const float*, const float*, const float*,
                                 float*, float*, int64_t,
                                 const BackwardCoefficients&);

template <bool kLast>
BackwardPieceFn PickBackward(bool mask, bool grad_z) {
  if (mask) {
    return grad_z ? &BackwardPiece<kLast, true, true>
                  : &BackwardPiece<kLast, true, false>;
  }
  return grad_z ? &BackwardPiece<kLast, false, true>
                : &BackwardPiece<kLast, false, false>;
}

// `offset` elements past p, or nullptr for an absent optional tensor.
template <typename T>
T* Advance(T* p, int64_t offset) {
  return p == nullptr ? nullptr : p + offset;
}

}  // namespace

void ForwardF32(ThreadPool* pool, const Geometry& g, const ForwardArgs& args) {
  if (g.elements() == 0) return;
  std::vector<double> scale(g.channels), shift(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    scale[c] =
        args.invstd[c] *
        (args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]));
    shift[c] = args.bias == nullptr ? 0.0 : static_cast<double>(args.bias[c]);
  }
  const bool residual = args.z != nullptr;
  const ForwardPieceFn piece = g.inner == 1
                                   ? PickForward<true>(residual, args.relu)
                                   : PickForward<false>(residual, args.relu);
  const auto* x = static_cast<const float*>(args.x);
  const auto* z = static_cast<const float*>(args.z);
  auto* y = static_cast<float*>(args.y);
  const int64_t tasks = ElementwiseTasks(g);
  RunTasks(pool, tasks, [&](int64_t task) {
    ForEachRowPiece(g, PartRange(g.elements(), tasks, task),
                    [&](int64_t pos, int64_t len, int64_t c) {
                      piece(x + pos, Advance(z, pos), y + pos, len,
                            args.mean + c, scale.data() + c, shift.data() + c);
                    });
  });
}

void BackwardElementwiseF32(ThreadPool* pool, const Geometry& g,
                            const BackwardElementwiseArgs& args) {
  if (g.elements() == 0) return;
  std::vector<double> a(g.channels), k(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    const double invstd = args.invstd[c];
    const double w =
        args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]);
    a[c] = w * invstd;
    k[c] = invstd * invstd * args.mean_dy_xmu[c];
  }
  const BackwardPieceFn piece =
      g.inner == 1
          ? PickBackward<true>(args.y != nullptr, args.grad_z != nullptr)
          : PickBackward<false>(args.y != nullptr, args.grad_z != nullptr);
  const auto* dy = static_cast<const float*>(args.dy);
  const auto* x = static_cast<const float*>(args.x);
  const auto* y = static_cast<const float*>(args.y);
  auto* grad_input = static_cast<float*>(args.grad_input);
  auto* grad_z = static_cast<float*>(args.grad_z);
  const int64_t tasks = ElementwiseTasks(g);
  RunTasks(pool, tasks, [&](int64_t task) {
    ForEachRowPiece(g, PartRange(g.elements(), tasks, task),
                    [&](int64_t pos, int64_t len, int64_t c) {
                      const BackwardCoefficients co{args.mean + c, a.data() + c,
                                                    args.mean_dy + c,
                                                    k.data() + c};
                      piece(dy + pos, x + pos, Advance(y, pos),
                            grad_input + pos, Advance(grad_z, pos), len, co);
                    });
  });
}

}  // namespace cpu
}  // namespace syncnorm
