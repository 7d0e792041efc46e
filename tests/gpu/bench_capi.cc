// A C ABI over the raw CUDA launchers for tests/gpu/bench.py (ctypes):
// pointers are torch CUDA tensors' data_ptr(), the stream is torch's
// current stream, per-channel arrays are host arrays the caller allocated
// once. Each returns 0 on success, else prints the error and returns the
// launcher's error code. No per-channel work is left to Python.
#include <cuda_runtime.h>

#include <cmath>
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

// The current device's L2 size in bytes, or -1.
int64_t sn_l2_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) !=
          cudaSuccess) {
    return -1;
  }
  return bytes;
}

int sn_moments(void* stream, int dtype, const void* x, int64_t outer,
               int64_t channels, int64_t inner, double* mean, double* m2) {
  return Done(
      syncnorm::cuda::LocalMoments(stream, static_cast<syncnorm::DType>(dtype),
                                   x, G(outer, channels, inner), mean, m2));
}

// y = BN(x) with x's own statistics, as a training forward of one worker:
// LocalMoments, invstd (host), Forward. mean and invstd are outputs [C].
int sn_train_forward(void* stream, int dtype, const void* x, void* y,
                     int64_t outer, int64_t channels, int64_t inner,
                     const float* weight, const float* bias, double eps,
                     double* mean, double* invstd) {
  const syncnorm::Geometry g = G(outer, channels, inner);
  const auto dt = static_cast<syncnorm::DType>(dtype);
  int rc = Done(syncnorm::cuda::LocalMoments(stream, dt, x, g, mean, invstd));
  if (rc != 0) return rc;
  const double n = static_cast<double>(outer * inner);
  for (int64_t c = 0; c < channels; ++c) {
    invstd[c] = 1.0 / std::sqrt(invstd[c] / n + eps);  // invstd held m2
  }
  syncnorm::ForwardArgs a;
  a.x = x;
  a.y = y;
  a.mean = mean;
  a.invstd = invstd;
  a.weight = weight;
  a.bias = bias;
  return Done(syncnorm::cuda::Forward(stream, dt, g, a));
}

// y = BN(x) with given statistics (eval): Forward alone; returns once
// queued.
int sn_forward(void* stream, int dtype, const void* x, void* y, int64_t outer,
               int64_t channels, int64_t inner, const double* mean,
               const double* invstd, const float* weight, const float* bias) {
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

// grad_input of one worker's training backward: BackwardReduce, the means
// of the sums over `count` values (host), BackwardElementwise. sum_dy and
// sum_dy_xmu are scratch [C].
int sn_backward(void* stream, int dtype, const void* dy, const void* x,
                void* grad_input, int64_t outer, int64_t channels,
                int64_t inner, const double* mean, const double* invstd,
                const float* weight, double* sum_dy, double* sum_dy_xmu) {
  const syncnorm::Geometry g = G(outer, channels, inner);
  const auto dt = static_cast<syncnorm::DType>(dtype);
  syncnorm::BackwardReduceArgs r;
  r.dy = dy;
  r.x = x;
  r.mean = mean;
  r.invstd = invstd;
  int rc = Done(
      syncnorm::cuda::BackwardReduce(stream, dt, g, r, sum_dy, sum_dy_xmu));
  if (rc != 0) return rc;
  const double n = static_cast<double>(outer * inner);
  for (int64_t c = 0; c < channels; ++c) {
    sum_dy[c] /= n;
    sum_dy_xmu[c] /= n;
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
