// A C ABI over the raw CUDA launchers for tests/gpu/bench.py (ctypes):
// pointers are torch CUDA tensors' data_ptr(), the stream is torch's
// current stream. Each returns 0 on success, else prints the error and
// returns the launcher's error code.
#include <cstdint>
#include <cstdio>

#include "kernels/batch_norm_cuda.h"

namespace {

int Done(const syncnorm::cuda::Result& r) {
  if (r.ok()) return 0;
  std::fprintf(stderr, "syncnorm: %s\n", r.message.c_str());
  return static_cast<int>(r.code);
}

syncnorm::Geometry G(int64_t outer, int64_t channels, int64_t inner) {
  syncnorm::Geometry g;
  g.outer = outer;
  g.channels = channels;
  g.inner = inner;
  return g;
}

}  // namespace

extern "C" {

int sn_moments(void* stream, int dtype, const void* x, int64_t outer,
               int64_t channels, int64_t inner, double* mean, double* m2) {
  return Done(syncnorm::cuda::LocalMoments(
      stream, static_cast<syncnorm::DType>(dtype), x,
      G(outer, channels, inner), mean, m2));
}

int sn_forward(void* stream, int dtype, const void* x, void* y,
               int64_t outer, int64_t channels, int64_t inner,
               const double* mean, const double* invstd, const float* weight,
               const float* bias) {
  syncnorm::ForwardArgs a;
  a.x = x;
  a.y = y;
  a.mean = mean;
  a.invstd = invstd;
  a.weight = weight;
  a.bias = bias;
  return Done(syncnorm::cuda::Forward(stream,
                                      static_cast<syncnorm::DType>(dtype),
                                      G(outer, channels, inner), a));
}

int sn_backward(void* stream, int dtype, const void* dy, const void* x,
                void* grad_input, int64_t outer, int64_t channels,
                int64_t inner, const double* mean, const double* invstd,
                const float* weight, double* sum_dy, double* sum_dy_xmu,
                int64_t count) {
  const syncnorm::Geometry g = G(outer, channels, inner);
  const auto dt = static_cast<syncnorm::DType>(dtype);
  syncnorm::BackwardReduceArgs r;
  r.dy = dy;
  r.x = x;
  r.mean = mean;
  r.invstd = invstd;
  int rc = Done(syncnorm::cuda::BackwardReduce(stream, dt, g, r, sum_dy,
                                               sum_dy_xmu));
  if (rc != 0) return rc;
  // One worker: the local sums are the global ones.
  for (int64_t c = 0; c < channels; ++c) {
    sum_dy[c] /= static_cast<double>(count);
    sum_dy_xmu[c] /= static_cast<double>(count);
  }
  syncnorm::BackwardElementwiseArgs e;
  e.dy = dy;
  e.x = x;
  e.mean = mean;
  e.invstd = invstd;
  e.weight = weight;
  e.mean_dy = sum_dy;
  e.mean_dy_xmu = sum_dy_xmu;
  e.grad_input = grad_input;
  return Done(syncnorm::cuda::BackwardElementwise(stream, dt, g, e));
}

}  // extern "C"
