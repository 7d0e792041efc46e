// Forward and BackwardElementwise on the CPU. Each element is computed in
// double from per-channel coefficients prepared once, and rounded once to
// the element type; the loops are in cpu_forward_loops.h and
// cpu_backward_loops.h. y may alias x (and grad_input or grad_z may alias
// dy): every element is read before it is written.
#include <cstdint>
#include <vector>

#include "kernels/batch_norm_cpu.h"
#include "kernels/cpu_backward_loops.h"
#include "kernels/cpu_forward_loops.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_partition.h"

namespace syncnorm {
namespace cpu {
namespace {

// `offset` elements past p, or nullptr for an absent optional tensor.
template <typename T>
T* Advance(T* p, int64_t offset) {
  return p == nullptr ? nullptr : p + offset;
}

}  // namespace

template <typename T>
void Forward(ThreadPool* pool, const Geometry& g, const ForwardArgs& args) {
  if (g.elements() == 0) return;
  std::vector<double> scale(g.channels), shift(g.channels);
  for (int64_t c = 0; c < g.channels; ++c) {
    scale[c] =
        args.invstd[c] *
        (args.weight == nullptr ? 1.0 : static_cast<double>(args.weight[c]));
    shift[c] = args.bias == nullptr ? 0.0 : static_cast<double>(args.bias[c]);
  }
  ForwardLoopOptions options;
  options.last = g.inner == 1;
  options.residual = args.z != nullptr;
  options.relu = args.relu;
  options.stream =
      static_cast<int64_t>(sizeof(T)) * g.elements() >= StreamingStoreBytes();
  const ForwardRowsFn<T> loop = PickForwardRows<T>(BestIsa(), options);
  const auto* x = static_cast<const T*>(args.x);
  const auto* z = static_cast<const T*>(args.z);
  auto* y = static_cast<T*>(args.y);
  const int64_t tasks = ElementwiseTasks(g);
  RunTasks(pool, tasks, [&](int64_t task) {
    ForEachRowRun(g, PartRange(g.elements(), tasks, task),
                  [&](int64_t pos, int64_t rows, int64_t len, int64_t c) {
                    loop(x + pos, Advance(z, pos), y + pos, rows, len,
                         args.mean + c, scale.data() + c, shift.data() + c);
                  });
    // The pool's hand-off orders ordinary stores; streaming ones need this.
    if (options.stream) StoreFence();
  });
}

template <typename T>
void BackwardElementwise(ThreadPool* pool, const Geometry& g,
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
  BackwardLoopOptions options;
  options.last = g.inner == 1;
  options.mask = args.y != nullptr;
  options.grad_z = args.grad_z != nullptr;
  const BackwardRowsFn<T> loop = PickBackwardRows<T>(BestIsa(), options);
  const auto* dy = static_cast<const T*>(args.dy);
  const auto* x = static_cast<const T*>(args.x);
  const auto* y = static_cast<const T*>(args.y);
  auto* grad_input = static_cast<T*>(args.grad_input);
  auto* grad_z = static_cast<T*>(args.grad_z);
  const int64_t tasks = ElementwiseTasks(g);
  RunTasks(pool, tasks, [&](int64_t task) {
    ForEachRowRun(g, PartRange(g.elements(), tasks, task),
                  [&](int64_t pos, int64_t rows, int64_t len, int64_t c) {
                    const BackwardCoefficients co{args.mean + c, a.data() + c,
                                                  args.mean_dy + c,
                                                  k.data() + c};
                    loop(dy + pos, x + pos, Advance(y, pos), grad_input + pos,
                         Advance(grad_z, pos), rows, len, co);
                  });
  });
}

#define SYNCNORM_INSTANTIATE(T)                                               \
  template void Forward<T>(ThreadPool*, const Geometry&, const ForwardArgs&); \
  template void BackwardElementwise<T>(ThreadPool*, const Geometry&,          \
                                       const BackwardElementwiseArgs&);
SYNCNORM_INSTANTIATE(float)
SYNCNORM_INSTANTIATE(Half)
SYNCNORM_INSTANTIATE(BFloat16)
#undef SYNCNORM_INSTANTIATE

}  // namespace cpu
}  // namespace syncnorm
